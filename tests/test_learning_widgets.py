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
from engine.budget import lab  # noqa: E402
from widgets.eps_sweep import EpsSweep  # noqa: E402
from widgets.memory_timeline import MemoryTimeline  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def timeline_run():
    return lab.measure(bm.preset("tiny", micro_batch=2))


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


def test_graph_view_labels_each_edge_with_the_gradient_it_carries():
    from engine.scalar import Value
    from widgets.graph import GraphView
    w, x = Value(2.0, label="w"), Value(3.0, label="x")
    u = w * x
    L = u * u + w  # u used twice, w reaches L along two paths
    view = GraphView(L)
    assert view.edge_grads_at(0) == {}
    at_end = view.edge_grads_at(view.step.max)
    uu = L.inputs[0]
    # L = uu + w: both edges carry dL/dL = 1; uu = u*u: each use of u carries u * 1 = 6
    assert at_end[(id(L), 0)] == 1.0 and at_end[(id(L), 1)] == 1.0
    assert at_end[(id(uu), 0)] == at_end[(id(uu), 1)] == u.data
    # u = w*x: to w goes x * du, to x goes w * du; a leaf's grad sums what its edges carried
    du = u.grad
    assert at_end[(id(u), 0)] == x.data * du and at_end[(id(u), 1)] == w.data * du
    assert w.grad == at_end[(id(u), 0)] + at_end[(id(L), 1)]
    view.step.value = 1  # only L visited: only its edges are labelled
    assert set(view.edge_grads_at(1)) == {(id(L), 0), (id(L), 1)}
    assert "green on the edges" in view.label.value
    assert base64.b64decode(view.ui._repr_mimebundle_()["image/png"]) == view.png
