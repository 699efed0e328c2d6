"""A live view of a training run: loss and gradient norm, speed, MFU, where the time goes.

The dashboard computes nothing about the model. It is a callback: the trainer
(`engine.train.train(callback=...)`, or a hand-written loop) calls it with one
record per optimizer step, the dict `engine.train` documents:

    step, loss, tokens_per_s, step_time, grad_norm, lr,
    phases {loss, backward, optimizer, evaluation}   (seconds, optional)
    val_loss                                          (only on evaluation steps)
    time_left                                         (seconds, optional)
    mfu                                               (model FLOPs utilisation, a
                                                       fraction, optional)

and the dashboard writes what it was given into widget models, during the run:
a progress bar with the steps done and left and the time left (`.progress`,
`.progress_text`), a status line (`.status.value`: smoothed tokens/s, ms per
step, the loss, the gradient norm, the MFU), and a figure (`.plot`, an
ipywidgets Image whose PNG is replaced in place). Each assignment to a widget
model is sent to the browser at once, as a comm message, while the cell still
runs; nothing is ever printed (a notebook that shows the dashboard replays
under nbval). `finish(reason=...)` says plainly whether the run reached its
last step or stopped early, and why. The figure is redrawn every
`redraw_every` steps, on evaluation steps and by `finish()`; drawing costs
tens of milliseconds, so redrawing every step would slow a fast trainer
measurably.

    dash = TrainerDashboard(total_steps=300)
    display(dash)                         # or dash.ui
    result = train(config, callback=dash)
    dash.finish()                         # or dash.finish(reason="stopped by hand")
"""
from __future__ import annotations

import html
import io

PHASES = ("loss", "backward", "optimizer", "evaluation")
PHASE_COLORS = {"loss": "#4c72b0", "backward": "#c44e52", "optimizer": "#55a868",
                "evaluation": "#ccb974"}
SMOOTHING = 0.2   # weight of the newest step in the moving averages of speed and step time
FONT = "font-size: 15px; line-height: 1.5"
FIGURE_FONT_SIZE = 11


class TrainerDashboard:
    """Loss (training and validation), gradient norm, tokens/s, MFU and the time per
    phase, live.

    total_steps: for the progress text (None if unknown). redraw_every: redraw
    the figure every this many steps. reference_loss: a horizontal line on the
    loss plot (e.g. the unigram entropy of the corpus), with its label.
    """

    def __init__(self, total_steps: int | None = None, redraw_every: int = 10,
                 reference_loss: float | None = None,
                 reference_label: str = "unigram entropy", title: str = "Training"):
        import ipywidgets as w
        if redraw_every < 1:
            raise ValueError(f"TrainerDashboard: redraw_every must be at least 1, got "
                             f"{redraw_every}")
        self.total_steps = total_steps
        self.redraw_every = int(redraw_every)
        self.reference_loss = reference_loss
        self.reference_label = reference_label
        from widgets._figures import PreviewVBox
        self.records: list[dict] = []
        self.redraws = 0
        self.png = b""
        self.stopped_early: str | None = None   # why, once finish() found it stopped early
        self._smooth_speed: float | None = None
        self._smooth_step_time: float | None = None
        self.title = w.HTML(f"<b style='font-size: 17px'>{html.escape(title)}</b>")
        self.progress = w.FloatProgress(value=0, min=0, max=float(total_steps or 1),
                                        bar_style="info", layout=w.Layout(width="420px"))
        self.progress_text = w.HTML(self._progress_html())
        self.status = w.HTML(self._status_html(), style={"font_size": "15px"})
        self.plot = w.Image(format="png", layout=w.Layout(min_height="330px"))
        self.ui = PreviewVBox([self.title, w.HBox([self.progress, self.progress_text]),
                               self.status, self.plot], preview=lambda: self.png)

    # ------------------------------------------------------------ callback
    def __call__(self, record: dict) -> None:
        """Take one step's record (the trainer's callback). Returns None: never
        asks the trainer to stop."""
        self.update(record)

    def update(self, record: dict) -> None:
        for key in ("step", "loss"):
            if key not in record:
                raise KeyError(f"TrainerDashboard: a record needs {key!r}; got keys "
                               f"{sorted(record)}")
        self.records.append(dict(record))
        self._smooth("_smooth_speed", record.get("tokens_per_s"))
        self._smooth("_smooth_step_time", record.get("step_time"))
        self.progress.value = float(record["step"]) if self.total_steps else 0.0
        self.progress_text.value = self._progress_html()
        self.status.value = self._status_html()
        step = int(record["step"])
        if "val_loss" in record or step % self.redraw_every == 0 or step == self.total_steps:
            self.redraw()

    def _smooth(self, attr: str, value) -> None:
        if value:
            old = getattr(self, attr)
            setattr(self, attr, value if old is None else
                    SMOOTHING * float(value) + (1 - SMOOTHING) * old)

    def finish(self, reason: str | None = None) -> None:
        """Draw the final state (call after the run, whatever step it stopped at).

        A run that ended before `total_steps` is shown as stopped early, with
        `reason` (say "the 300 s time limit") or, without one, the step it reached."""
        last = self.records[-1]["step"] if self.records else 0
        if self.total_steps and last < self.total_steps:
            self.stopped_early = reason or "the loop ended before its last step"
            self.progress.bar_style = "warning"
        else:
            self.progress.bar_style = "success"
        self.progress_text.value = self._progress_html(done=True)
        self.status.value = self._status_html(done=True)
        self.redraw()

    def time_left(self) -> float | None:
        """Seconds to the last step: the trainer's estimate if the record has one,
        else the smoothed step time times the steps still to run."""
        if not self.records:
            return None
        last = self.records[-1]
        if last.get("time_left") is not None:
            return float(last["time_left"])
        if self.total_steps and self._smooth_step_time:
            return max(self.total_steps - int(last["step"]), 0) * self._smooth_step_time
        return None

    def progress_line(self, done: bool = False) -> str:
        """The line beside the progress bar, as plain text."""
        step = self.records[-1]["step"] if self.records else 0
        of = f" of {self.total_steps}" if self.total_steps else ""
        if done and self.stopped_early:
            return f"stopped early at step {step}{of}: {self.stopped_early}"
        if done:
            return f"finished: step {step}{of}"
        if not self.total_steps:
            return f"step {step}"
        left = self.time_left()
        return (f"step {step}{of} ({step / self.total_steps:.0%}), "
                f"{max(self.total_steps - int(step), 0)} steps left"
                + (f", about {_seconds(left)} left" if left else ""))

    def _progress_html(self, done: bool = False) -> str:
        color = "#b35900" if done and self.stopped_early else "inherit"
        weight = "bold" if done else "normal"
        return (f"<span style='{FONT}; color: {color}; font-weight: {weight}'>"
                f"{html.escape(self.progress_line(done))}</span>")

    # ------------------------------------------------------------ views
    def series(self) -> dict[str, list]:
        """The recorded numbers, column by column (what the figure draws)."""
        r = self.records
        val = [(x["step"], x["val_loss"]) for x in r if "val_loss" in x]
        return {
            "step": [x["step"] for x in r],
            "loss": [x["loss"] for x in r],
            "tokens_per_s": [x.get("tokens_per_s") for x in r],
            "grad_norm": [x.get("grad_norm") for x in r],
            "val_step": [s for s, _ in val],
            "val_loss": [v for _, v in val],
            "phases": {p: sum(x.get("phases", {}).get(p, 0.0) for x in r) for p in PHASES},
        }

    def summary(self) -> str:
        """The status line as plain text."""
        if not self.records:
            return "waiting for the first step"
        last = self.records[-1]
        s = self.series()
        parts = [f"step {last['step']}" + (f"/{self.total_steps}" if self.total_steps else ""),
                 f"loss {last['loss']:.4f}"]
        if s["val_loss"]:
            parts.append(f"validation {s['val_loss'][-1]:.4f} (step {s['val_step'][-1]})")
        if self._smooth_speed:
            parts.append(f"{self._smooth_speed:,.0f} tokens/s (smoothed)")
        if last.get("step_time"):
            parts.append(f"{last['step_time'] * 1e3:.0f} ms/step")
        if last.get("grad_norm") is not None:
            parts.append(f"grad norm {last['grad_norm']:.3f}")
        if last.get("mfu") is not None:
            parts.append(f"MFU {last['mfu']:.0%}")
        total = sum(s["phases"].values())
        if total > 0:
            parts.append("time in " + ", ".join(f"{p} {v / total:.0%}"
                                                 for p, v in s["phases"].items() if v > 0))
        return " | ".join(parts)

    def _status_html(self, done: bool = False) -> str:
        text = html.escape(self.summary())
        return f"<code>{'done: ' if done and self.records else ''}{text}</code>"

    def make_figure(self):
        """A matplotlib Figure of the run so far (not registered with pyplot)."""
        import matplotlib
        from matplotlib.figure import Figure
        with matplotlib.rc_context({"font.size": FIGURE_FONT_SIZE}):
            return self._draw(Figure(figsize=(13, 3.4)))

    def _draw(self, fig):
        s = self.series()
        ax_loss, ax_norm, ax_speed, ax_phase = fig.subplots(
            1, 4, gridspec_kw={"width_ratios": [3, 2, 2, 2]})
        ax_loss.plot(s["step"], s["loss"], color="C0", lw=1, label="training (batch)")
        if s["val_step"]:
            ax_loss.plot(s["val_step"], s["val_loss"], "o-", color="C3", label="validation")
        if self.reference_loss is not None:
            ax_loss.axhline(self.reference_loss, color="gray", ls=":",
                            label=self.reference_label)
        ax_loss.set_xlabel("step")
        ax_loss.set_ylabel("cross-entropy (nats)")
        ax_loss.set_title("loss")
        ax_loss.grid(True, alpha=0.3)
        ax_loss.legend(fontsize=FIGURE_FONT_SIZE - 1)
        norms = [(st, v) for st, v in zip(s["step"], s["grad_norm"]) if v is not None]
        if norms:
            ax_norm.plot([a for a, _ in norms], [b for _, b in norms], color="C1", lw=1)
        ax_norm.set_xlabel("step")
        ax_norm.set_title("gradient norm (before clipping)")
        ax_norm.grid(True, alpha=0.3)
        speed = [(st, v) for st, v in zip(s["step"], s["tokens_per_s"]) if v]
        if speed:
            ax_speed.plot([a for a, _ in speed], [b for _, b in speed], color="C2", lw=1)
        ax_speed.set_xlabel("step")
        ax_speed.set_title("tokens per second")
        ax_speed.grid(True, alpha=0.3)
        total = sum(s["phases"].values())
        if total > 0:
            names = [p for p in PHASES if s["phases"][p] > 0]
            ax_phase.barh(names, [s["phases"][p] / total * 100 for p in names],
                          color=[PHASE_COLORS[p] for p in names])
            ax_phase.invert_yaxis()
            ax_phase.set_xlabel("% of the run's time")
        ax_phase.set_title("where the time goes")
        fig.tight_layout()
        return fig

    def redraw(self) -> None:
        """Replace the picture in the Image widget: one model update with the PNG's
        bytes, sent to the browser as it happens; the image keeps its place and size,
        so the cell never collapses; no printing."""
        fig = self.make_figure()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90)
        self.png = buf.getvalue()
        self.plot.value = self.png
        self.redraws += 1

    def _repr_mimebundle_(self, **kwargs):
        return self.ui._repr_mimebundle_(**kwargs)


def _seconds(t: float) -> str:
    """90 -> '1 min 30 s', 42 -> '42 s'."""
    t = int(round(t))
    return f"{t // 60} min {t % 60:02d} s" if t >= 60 else f"{t} s"
