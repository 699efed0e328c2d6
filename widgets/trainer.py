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

A hand-written loop can be stopped by the learner. Its **stop** button is a click the
kernel only reads between two statements that wait, so the loop awaits
`dash.keep_going()` once a step (a top-level `await` in a notebook cell lets the
kernel take the click in); `dash.running()` around the loop ends the run cleanly on
the button or on Kernel > Interrupt ("stopped by you at step N", no traceback):

    dash.show()                           # keeps the final picture in the saved notebook
    with dash.running():
        for step in range(300):
            if not await dash.keep_going():
                break
            ...                           # one step, then dash(record)
"""
from __future__ import annotations

import asyncio
import contextlib
import html
import io
import time

PHASES = ("loss", "backward", "optimizer", "evaluation")
PHASE_COLORS = {"loss": "#4c72b0", "backward": "#c44e52", "optimizer": "#55a868",
                "evaluation": "#ccb974"}
SMOOTHING = 0.2   # weight of the newest step in the moving average of the speed
MAX_RISE = 0.05   # the most the time-left estimate may rise from one step to the next
MIN_BAR_PERCENT = 2.0   # a phase bar is drawn at least this wide, so none is invisible
FONT = "font-size: 15px; line-height: 1.5"
FIGURE_FONT_SIZE = 11


class TrainerDashboard:
    """Loss (training and validation), gradient norm, tokens/s, MFU and the time per
    phase, live, with a stop button.

    total_steps: for the progress text (None if unknown). redraw_every: redraw
    the figure every this many steps. reference_loss: a horizontal line on the
    loss plot (e.g. the unigram entropy of the corpus), with its label. clock: the
    seconds the time-left estimate reads (time.monotonic; a test hands its own).
    """

    def __init__(self, total_steps: int | None = None, redraw_every: int = 10,
                 reference_loss: float | None = None,
                 reference_label: str = "unigram entropy", title: str = "Training",
                 clock=time.monotonic):
        import ipywidgets as w
        if redraw_every < 1:
            raise ValueError(f"TrainerDashboard: redraw_every must be at least 1, got "
                             f"{redraw_every}")
        self.total_steps = total_steps
        self.redraw_every = int(redraw_every)
        self.reference_loss = reference_loss
        self.reference_label = reference_label
        self.clock = clock
        from widgets._figures import PreviewVBox
        self.records: list[dict] = []
        self.redraws = 0
        self.png = b""
        self.stopped_early: str | None = None   # why, once finish() found it stopped early
        self.stop_requested = False             # the stop button was clicked
        self._smooth_speed: float | None = None
        self._arrivals: list[tuple[int, float]] = []   # (step, clock) of each record
        self._display = None
        self._estimate: tuple[int, float] | None = None   # (step, seconds left) after it
        self.title = w.HTML(f"<b style='font-size: 17px'>{html.escape(title)}</b>")
        self.progress = w.FloatProgress(value=0, min=0, max=float(total_steps or 1),
                                        bar_style="info", layout=w.Layout(width="420px"))
        self.progress_text = w.HTML(self._progress_html())
        self.stop_button = w.Button(description="stop", icon="stop", button_style="danger",
                                    tooltip="end the run after the step in progress",
                                    layout=w.Layout(width="90px"))
        self.stop_button.on_click(lambda _button: self.request_stop())
        self.status = w.HTML(self._status_html(), style={"font_size": "15px"})
        self.plot = w.Image(format="png", layout=w.Layout(min_height="330px"))
        self.ui = PreviewVBox([self.title,
                               w.HBox([self.progress, self.stop_button, self.progress_text]),
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
        self._arrivals.append((int(record["step"]), float(self.clock())))
        self._update_estimate()
        speed = record.get("tokens_per_s")
        if speed:
            old = self._smooth_speed
            self._smooth_speed = (float(speed) if old is None else
                                  SMOOTHING * float(speed) + (1 - SMOOTHING) * old)
        self.records[-1]["smoothed_tokens_per_s"] = self._smooth_speed
        self.progress.value = float(record["step"]) if self.total_steps else 0.0
        self.progress_text.value = self._progress_html()
        self.status.value = self._status_html()
        step = int(record["step"])
        if "val_loss" in record or step % self.redraw_every == 0 or step == self.total_steps:
            self.redraw()

    # ------------------------------------------------------------ stopping
    def request_stop(self) -> None:
        """What the stop button does: the loop's next `keep_going()` says no."""
        self.stop_requested = True
        self.stop_button.disabled = True
        self.stop_button.description = "stopping"

    async def keep_going(self) -> bool:
        """Await it once a step: the kernel reads the browser's messages meanwhile (a
        click of stop), then says whether to run another step."""
        await asyncio.sleep(0.002)
        return not self.stop_requested

    @contextlib.contextmanager
    def running(self):
        """Around the training loop: finish() when it ends, saying "stopped by you at
        step N" after the stop button or Kernel > Interrupt (which is caught: the cell
        goes on after the loop, with no traceback). Other errors pass through."""
        try:
            yield self
        except (KeyboardInterrupt, asyncio.CancelledError):
            # Kernel > Interrupt: a KeyboardInterrupt in a plain cell; in a cell that
            # awaits (keep_going), the kernel cancels the cell's task instead
            self.stop_requested = True
        finally:
            self.stop_button.disabled = True
            self.finish(reason=f"stopped by you at step {self.last_step()}"
                        if self.stop_requested else None)

    def last_step(self) -> int:
        return int(self.records[-1]["step"]) if self.records else 0

    # ------------------------------------------------------------ display
    def show(self) -> None:
        """Display the dashboard so that finish() can leave its final picture in the saved
        notebook in place of the widget's text form. (Returns nothing, so a cell ending in
        `dashboard.show()` shows the dashboard alone.)"""
        from IPython.display import display
        self._display = display(self.ui, display_id=True)

    def finish(self, reason: str | None = None) -> None:
        """Draw the final state (call after the run, whatever step it stopped at).

        A run that ended before `total_steps` is shown as stopped early, with
        `reason` (say "the 300 s time limit") or, without one, the step it reached."""
        last = self.last_step()
        if self.total_steps and last < self.total_steps:
            self.stopped_early = reason or "the loop ended before its last step"
            self.progress.bar_style = "warning"
        else:
            self.progress.bar_style = "success"
        self.stop_button.disabled = True
        self.progress_text.value = self._progress_html(done=True)
        self.status.value = self._status_html(done=True)
        self.redraw()
        if self._display is not None:   # the saved output: the picture of the final state
            self._display.update(self.ui)

    # ------------------------------------------------------------ progress
    def time_left(self) -> float | None:
        """Seconds to the last step: the trainer's estimate if the record has one, else
        the dashboard's own (see _update_estimate), which moves little from one step to
        the next."""
        if not self.records:
            return None
        last = self.records[-1]
        if last.get("time_left") is not None:
            return float(last["time_left"])
        return self._estimate[1] if self._estimate else None

    def _update_estimate(self) -> None:
        """After each record: the steps still to run at the run's average pace since its
        first record (wall time, evaluations included). A rise is let through at most
        MAX_RISE a step, so one slow step or evaluation does not make the estimate jump."""
        last = self.records[-1]
        if not self.total_steps:
            return
        steps_left = max(self.total_steps - int(last["step"]), 0)
        (first_step, first_t), (last_step, last_t) = self._arrivals[0], self._arrivals[-1]
        if last_step > first_step and last_t > first_t:
            raw = steps_left * (last_t - first_t) / (last_step - first_step)
        elif last.get("step_time"):
            raw = steps_left * float(last["step_time"])
        else:
            return
        if self._estimate and self._estimate[0] < last_step:
            raw = min(raw, self._estimate[1] * (1 + MAX_RISE))
        self._estimate = (last_step, raw)

    def progress_line(self, done: bool = False) -> str:
        """The line beside the progress bar, as plain text."""
        step = self.last_step()
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
            "smoothed_tokens_per_s": [x.get("smoothed_tokens_per_s") for x in r],
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
        # the status line's number, drawn: the same moving average, step by step
        speed = [(st, v) for st, v in zip(s["step"], s["smoothed_tokens_per_s"]) if v]
        if speed:
            ax_speed.plot([a for a, _ in speed], [b for _, b in speed], color="C2", lw=1)
        ax_speed.set_xlabel("step")
        ax_speed.set_title("tokens per second (smoothed)")
        ax_speed.grid(True, alpha=0.3)
        draw_phase_bars(ax_phase, s["phases"])
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


def draw_phase_bars(ax, phases: dict[str, float], title: str = "where the time goes") -> None:
    """One horizontal bar per phase with time, its share of the total written beside it.
    A bar is drawn at least MIN_BAR_PERCENT wide, so a phase of 0.4% is still seen (its
    label tells the true share)."""
    total = sum(phases.values())
    ax.set_title(title)
    if total <= 0:
        return
    names = [p for p in PHASES if phases.get(p, 0) > 0] + \
        [p for p in phases if p not in PHASES and phases[p] > 0]
    shares = [100 * phases[p] / total for p in names]
    ax.barh(names, [max(v, MIN_BAR_PERCENT) for v in shares],
            color=[PHASE_COLORS.get(p, "gray") for p in names])
    for y, share in enumerate(shares):
        ax.text(max(share, MIN_BAR_PERCENT) + 1.5, y, f"{share:.0f}%" if share >= 1 else
                f"{share:.1f}%", va="center", fontsize=FIGURE_FONT_SIZE - 1)
    ax.set_xlim(0, max(max(shares), MIN_BAR_PERCENT) * 1.25 + 4)
    ax.invert_yaxis()
    ax.set_xlabel("% of the run's time")


def _seconds(t: float) -> str:
    """90 -> '1 min 30 s', 42 -> '42 s'; over a minute, to 5 s (the estimate's grain)."""
    t = int(round(t))
    if t >= 60:
        t = 5 * int(round(t / 5))
        return f"{t // 60} min {t % 60:02d} s"
    return f"{t} s"
