"""The eps-sweep widget and plot: a thin view over `engine.eps_sweep`.

The sweep itself (finite differences in float32/float64, the error curve, the
predicted best eps) lives in `engine.eps_sweep`; this module only draws it and
wires sliders to it, so the widget, the lesson and the tests read the same numbers.
"""
from __future__ import annotations

import numpy as np

from engine.eps_sweep import DEFAULT_X, METHODS, SMOOTH_FUNCTIONS, sweep_both


def plot_sweeps(sweeps, ax=None, marked_eps=None):
    """Draw error against eps for each SweepResult; return the figure."""
    import matplotlib.pyplot as plt
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
    else:
        fig = ax.figure
    colors = {"float32": "tab:orange", "float64": "tab:blue"}
    for name, s in sweeps.items():
        ax.loglog(s.eps, s.error, "o-", ms=3, color=colors.get(name), label=f"{name} ({s.method})")
        ax.plot([s.best_eps], [s.best_error], "*", ms=12, color=colors.get(name))
    if marked_eps is not None:
        ax.axvline(marked_eps, color="0.3", ls="--", lw=1)
    ax.set_xlabel("eps")
    ax.set_ylabel("worst relative error")
    ax.set_title("rounding error (left) vs truncation error (right)", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------- the widget
class EpsSweep:
    """Sliders over the eps sweep; `.ui` is the widget to display.

    * eps      : the step you would pick; the label says the error it gives in
                 each precision and which error dominates there;
    * decades  : the range of eps plotted, as powers of ten;
    * method   : central or forward differences;
    * function : one of SMOOTH_FUNCTIONS.

    The sweeps are computed by `eps_sweep` once per (function, method, range)
    and cached, so moving the eps slider only redraws.
    """

    def __init__(self, eps: float = 1e-6, decades=(-12, -1), method: str = "central",
                 function: str | None = None, x=None):
        import ipywidgets as w
        import matplotlib.pyplot as plt
        from widgets._figures import FigureOutput, PreviewVBox
        self.x = DEFAULT_X if x is None else np.asarray(x, dtype=np.float64)
        self._cache: dict = {}
        self._drawn_key = None
        self.eps = w.FloatLogSlider(value=eps, base=10, min=-14, max=0, step=0.25,
                                    description="eps", readout_format=".1e")
        self.decades = w.IntRangeSlider(value=tuple(decades), min=-14, max=0, step=1,
                                        description="log10 range")
        self.method = w.ToggleButtons(options=list(METHODS), value=method,
                                      description="difference")
        names = list(SMOOTH_FUNCTIONS)
        self.function = w.Dropdown(options=names, value=function or names[0],
                                   description="f(x) =")
        self.label = w.Label()
        # one figure for the widget's life: moving eps only moves the dashed line
        self.fig, self.ax = plt.subplots(figsize=(6.4, 3.8))
        plt.close(self.fig)  # shown through the Output widget only
        self.plot = FigureOutput(self.fig)
        for control in (self.eps, self.decades, self.method, self.function):
            control.observe(self._update, names="value")
        self._update()
        self.ui = PreviewVBox([self.function, self.method, self.decades, self.eps,
                               self.label, self.plot], preview=lambda: self.plot.png)

    def _repr_mimebundle_(self, **kwargs):
        return self.ui._repr_mimebundle_(**kwargs)

    def _key(self):
        lo, hi = self.decades.value
        return (self.function.value, self.method.value, lo, hi)

    def sweeps(self) -> dict:
        """The two SweepResults for the current controls (computed or cached)."""
        key = self._key()
        if key not in self._cache:
            f, grad = SMOOTH_FUNCTIONS[self.function.value]
            lo, hi = self.decades.value
            eps_values = np.logspace(hi, lo, 4 * (hi - lo) + 1)
            self._cache[key] = sweep_both(f, self.x, grad, eps_values, self.method.value)
        return self._cache[key]

    def summary(self) -> str:
        """One line: the error at the chosen eps in each precision, and its regime."""
        eps = self.eps.value
        parts = []
        for name, s in self.sweeps().items():
            parts.append(f"{name}: error {s.error_at(eps):.1e} ({s.regime(eps)}; "
                         f"best {s.best_error:.1e} at eps {s.best_eps:.0e})")
        return f"eps = {eps:.1e} | " + " | ".join(parts)

    def make_figure(self):
        """A new figure of the current state (for saving or printing)."""
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        plot_sweeps(self.sweeps(), ax=ax, marked_eps=self.eps.value)
        plt.close(fig)
        return fig

    def _update(self, change=None):
        self.label.value = self.summary()
        redraw = self._drawn_key != self._key()
        if redraw:  # new curves: redraw the axes
            self.ax.clear()
            plot_sweeps(self.sweeps(), ax=self.ax, marked_eps=self.eps.value)
            self._marker = self.ax.lines[-1]
            self._drawn_key = self._key()
        else:  # same curves: move the marker only
            self._marker.set_xdata([self.eps.value, self.eps.value])
        self.plot.show(moving=[self._marker], redraw=redraw)
