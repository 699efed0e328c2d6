"""The plotting widgets redraw in place and carry a picture for a saved notebook.

A slider move keeps the widget's one figure and its one-output Output (of fixed
height, so the cell never collapses between two pictures), changes the picture,
and the widget's notebook output holds a PNG next to the live view."""
from __future__ import annotations

import base64

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from engine import budget as bm  # noqa: E402
from widgets.eps_sweep import EpsSweep  # noqa: E402
from widgets.memory_timeline import MemoryTimeline  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def timeline_run():
    return bm.measure(bm.preset("tiny", micro_batch=2))


def _shown_png(widget) -> bytes:
    (output,) = widget.plot.outputs
    return base64.b64decode(output["data"]["image/png"])


def _assert_moves_in_place(widget, move):
    fig, height, before = widget.fig, widget.plot.layout.height, _shown_png(widget)
    move()
    after = _shown_png(widget)
    assert widget.fig is fig, "a slider move built a new figure"
    assert widget.plot.layout.height == height and height.endswith("px")
    assert after.startswith(PNG_MAGIC) and after != before, "the picture did not change"
    assert after == widget.plot.png


def test_eps_sweep_moves_its_marker_in_place():
    widget = EpsSweep(eps=1e-6)
    _assert_moves_in_place(widget, lambda: setattr(widget.eps, "value", 1e-10))
    _assert_moves_in_place(widget, lambda: setattr(widget.method, "value", "forward"))


def test_memory_timeline_moves_its_marker_in_place(timeline_run):
    widget = MemoryTimeline(timeline_run["timeline"])
    _assert_moves_in_place(widget, lambda: setattr(widget.step, "value", 3))


@pytest.mark.parametrize("make", [lambda run: EpsSweep(), lambda run: MemoryTimeline(run["timeline"])],
                         ids=["eps_sweep", "memory_timeline"])
def test_saved_output_carries_a_picture_of_the_widget(make, timeline_run):
    widget = make(timeline_run)
    bundle = widget.ui._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"].startswith("VBox(")
    assert base64.b64decode(bundle["image/png"]) == widget.plot.png
