"""A live view of a training run: loss curves, tokens per second, where the time goes.

The dashboard computes nothing about the model. It is a callback: the trainer
(`engine.train.train(callback=...)`, or a hand-written loop) calls it with one
record per optimizer step, the dict `engine.train` documents:

    step, loss, tokens_per_s, step_time, grad_norm, lr,
    phases {loss, backward, optimizer, evaluation}   (seconds, optional)
    val_loss                                          (only on evaluation steps)
    time_left                                         (seconds, optional)

and the dashboard writes what it was given into widget models: a status line
(`.status.value`), and a figure (`.plot`, an Output whose outputs are reset
and refilled, never printed into), so a notebook that shows it replays under
nbval. The figure is redrawn every `redraw_every` steps, on evaluation steps
and by `finish()`; drawing costs tens of milliseconds, so redrawing every
step would slow a fast trainer measurably.

    dash = TrainerDashboard(total_steps=300)
    display(dash)                         # or dash.ui
    result = train(config, callback=dash)
    dash.finish()
"""
from __future__ import annotations

import html
import io

PHASES = ("loss", "backward", "optimizer", "evaluation")
PHASE_COLORS = {"loss": "#4c72b0", "backward": "#c44e52", "optimizer": "#55a868",
                "evaluation": "#ccb974"}


class TrainerDashboard:
    """Loss (training and validation), tokens/s and the time per phase, live.

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
        self.records: list[dict] = []
        self.redraws = 0
        self.title = w.HTML(f"<b>{html.escape(title)}</b>")
        self.status = w.HTML(self._status_html())
        self.plot = w.Output()
        self.ui = w.VBox([self.title, self.status, self.plot])

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
        self.status.value = self._status_html()
        step = int(record["step"])
        if "val_loss" in record or step % self.redraw_every == 0 or step == self.total_steps:
            self.redraw()

    def finish(self) -> None:
        """Draw the final state (call after the run, whatever step it stopped at)."""
        self.status.value = self._status_html(done=True)
        self.redraw()

    # ------------------------------------------------------------ views
    def series(self) -> dict[str, list]:
        """The recorded numbers, column by column (what the figure draws)."""
        r = self.records
        val = [(x["step"], x["val_loss"]) for x in r if "val_loss" in x]
        return {
            "step": [x["step"] for x in r],
            "loss": [x["loss"] for x in r],
            "tokens_per_s": [x.get("tokens_per_s") for x in r],
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
        if last.get("tokens_per_s"):
            parts.append(f"{last['tokens_per_s']:,.0f} tokens/s")
        if last.get("step_time"):
            parts.append(f"{last['step_time'] * 1e3:.0f} ms/step")
        if last.get("grad_norm") is not None:
            parts.append(f"grad norm {last['grad_norm']:.3f}")
        if last.get("time_left") is not None and last["time_left"] > 0:
            parts.append(f"about {last['time_left']:.0f} s left")
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
        from matplotlib.figure import Figure
        s = self.series()
        fig = Figure(figsize=(11, 3.2))
        ax_loss, ax_speed, ax_phase = fig.subplots(1, 3, gridspec_kw={"width_ratios": [3, 2, 2]})
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
        ax_loss.legend(fontsize=8)
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
        """Replace the figure in the Output widget (a PNG; no printing)."""
        from IPython.display import Image
        fig = self.make_figure()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=80)
        self.plot.outputs = ()
        self.plot.append_display_data(Image(data=buf.getvalue(), format="png"))
        self.redraws += 1

    def _repr_mimebundle_(self, **kwargs):
        return self.ui._repr_mimebundle_(**kwargs)
