"""What the plotting widgets share: one figure redrawn in place, and a picture of it
in the saved notebook.

* `FigureOutput`: an Output of fixed height showing one matplotlib figure. `show()`
  renders the figure to PNG and replaces the Output's content in a single model
  update, so the cell never collapses between two pictures; the widget updates its
  artists and calls `show()` again instead of building a new figure.
* `PreviewVBox`: a VBox whose notebook output also carries a PNG of its current
  picture. A live JupyterLab draws the widget; where the widget cannot be drawn (an
  untrusted notebook in a fresh clone, GitHub, nbconvert) the picture is shown
  instead of the `VBox(children=...` text. nbval does not compare PNGs.
"""
from __future__ import annotations

import base64
import io

import ipywidgets as w
import numpy as np

DPI = 100


def _canvas_png(canvas) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(np.asarray(canvas.buffer_rgba())).save(buf, format="png", compress_level=1)
    return buf.getvalue()


class FigureOutput(w.Output):
    """An Output that shows `fig`, sized to it, and redraws it in place.

    `show(moving=[artists])` draws the figure once without the moving artists and
    keeps that background; `show(moving=..., redraw=False)` then only pastes the
    background and draws the moving artists (a marker line moved by a slider),
    which is what keeps a slider move well under the cost of a full redraw."""

    def __init__(self, fig, **kwargs):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        fig.set_dpi(DPI)
        self.canvas = FigureCanvasAgg(fig)
        height = int(round(fig.get_figheight() * DPI)) + 8
        super().__init__(layout=w.Layout(height=f"{height}px", overflow="hidden"), **kwargs)
        self.fig = fig
        self.png = b""
        self._background = None

    def show(self, moving=(), redraw: bool = True) -> None:
        if redraw or self._background is None:
            for artist in moving:
                artist.set_animated(True)  # left out of the background
            self.canvas.draw()
            self._background = self.canvas.copy_from_bbox(self.fig.bbox)
        else:
            self.canvas.restore_region(self._background)
        for artist in moving:
            artist.axes.draw_artist(artist)
        self.png = _canvas_png(self.canvas)
        self.outputs = ({"output_type": "display_data", "metadata": {},
                         "data": {"image/png": base64.b64encode(self.png).decode("ascii"),
                                  "text/plain": repr(self.fig)}},)


class _Preview:
    """A box whose display also carries `preview()` (PNG bytes) as image/png, so a
    notebook saved without the widgets' state still shows a picture of it."""

    def __init__(self, children, preview, **kwargs):
        super().__init__(children, **kwargs)
        self._preview = preview

    def __repr__(self):  # its text form stays that of the box it is
        box = type(self).__mro__[2].__name__
        return box + super().__repr__()[len(type(self).__name__):]

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        png = self._preview()
        if bundle is not None and png:
            bundle["image/png"] = base64.b64encode(png).decode("ascii")
        return bundle


class PreviewVBox(_Preview, w.VBox):
    """A VBox with a picture of itself for saved notebooks (see _Preview)."""


class PreviewHBox(_Preview, w.HBox):
    """An HBox with a picture of itself for saved notebooks (see _Preview)."""
