"""The live activation bytes of the tape, step by step, through forward and backward.

`engine.memory.record()` notes, after every recorded op (forward) and after
every node's VJP (backward), how many activation bytes the tape holds. This
module draws that timeline; the slider walks it one step at a time and the
label names the op and the bytes live after it. Nothing is computed here:
every number is the recorder's.
"""
from __future__ import annotations

PHASE_COLORS = {"forward": "#4c72b0", "backward": "#c44e52"}


def timeline_points(recorder) -> list[tuple[str, str, int]]:
    """(phase, label, live bytes) for each point of a recorder's timeline
    (a MemoryRecorder, or the list `engine.budget.lab.measure` returns)."""
    points = getattr(recorder, "timeline", recorder)
    if isinstance(points, dict):
        points = points["timeline"]
    out = []
    for p in points:
        if isinstance(p, tuple):
            out.append(p)
        else:
            out.append((p.phase, p.label, p.live_bytes))
    return out


def plot_timeline(points, ax=None, marked: int | None = None, predicted: int | None = None):
    """Step plot of live bytes (MB): forward in blue, backward in red, the
    peak marked; `predicted` draws a formula's peak as a dashed line."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.2))
    mb = [b / 1e6 for _, _, b in points]
    steps = list(range(len(mb)))
    phases = [ph for ph, _, _ in points]
    for phase, color in PHASE_COLORS.items():
        # a step belongs to the phase of the op that ends it; "start" opens the forward
        mask = [ph == phase or (phase == "forward" and ph == "start")
                or (i + 1 < len(phases) and phases[i + 1] == phase)
                for i, ph in enumerate(phases)]
        ax.fill_between(steps, mb, where=mask, step="post", alpha=0.35, color=color,
                        label=phase)
    ax.step(range(len(mb)), mb, where="post", color="k", lw=0.8)
    top = max(range(len(mb)), key=mb.__getitem__)
    ax.annotate(f"peak {mb[top]:.3g} MB\n({points[top][1]})", (top, mb[top]),
                xytext=(8, -24), textcoords="offset points", fontsize=8)
    if predicted is not None:
        ax.axhline(predicted / 1e6, color="0.3", ls="--", lw=1, label="predicted peak")
    if marked is not None:
        ax.axvline(marked, color="0.5", lw=1)
    ax.set_xlabel("step of the tape (ops in the forward, VJPs in the backward)")
    ax.set_ylabel("live activation MB")
    ax.legend(fontsize=8, loc="upper right")
    return ax


class MemoryTimeline:
    """`MemoryTimeline(recorder, predicted_peak=None)`; `.ui` to display.

    The slider picks a step; the label says which op ran and the live bytes
    after it; the plot marks the step."""

    def __init__(self, recorder, predicted_peak: int | None = None):
        import ipywidgets as w
        import matplotlib.pyplot as plt
        from widgets._figures import FigureOutput, PreviewVBox
        self.points = timeline_points(recorder)
        if len(self.points) < 2:
            raise ValueError("MemoryTimeline: the recorder's timeline is empty; record a "
                             "forward and backward inside `with engine.memory.record() as mem:`")
        self.predicted_peak = predicted_peak
        self.step = w.IntSlider(value=len(self.points) // 2, min=0, max=len(self.points) - 1,
                                description="step", continuous_update=False,
                                layout=w.Layout(width="600px"))
        self.label = w.Label()
        self.label.add_class("memory-timeline-label")
        # the timeline is drawn once; a step move only moves the marker line
        self.fig, ax = plt.subplots(figsize=(7, 3.2))
        plot_timeline(self.points, ax=ax, marked=self.step.value, predicted=self.predicted_peak)
        self._marker = ax.lines[-1]
        self.fig.tight_layout()
        plt.close(self.fig)  # shown through the Output widget only
        self.plot = FigureOutput(self.fig)
        self.plot.add_class("memory-timeline-plot")
        self.step.observe(self._update, names="value")
        self._update()
        self.ui = PreviewVBox([self.step, self.label, self.plot], preview=lambda: self.plot.png)

    def _repr_mimebundle_(self, **kwargs):
        return self.ui._repr_mimebundle_(**kwargs)

    def describe(self, i: int) -> str:
        phase, label, live = self.points[i]
        where = f"after {label}" if label else "before the forward"
        return f"step {i} ({phase}) {where}: {live:,} bytes live"

    def _update(self, change=None):
        self.label.value = self.describe(self.step.value)
        self._marker.set_xdata([self.step.value, self.step.value])
        self.plot.show(moving=[self._marker], redraw=change is None)
