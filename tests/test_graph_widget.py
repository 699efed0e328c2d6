"""The graph drawing and the backward-step view, without a browser."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from engine.scalar import Value  # noqa: E402
from widgets.graph import GraphView, draw_graph, layout, topological_order  # noqa: E402


def minus_four():
    """L = 0.5 * (w*x - y)^2 at w=2, x=2, y=6 (dL/dw = -4)."""
    w, x, y = Value(2.0, label="w"), Value(2.0, label="x"), Value(6.0, label="y")
    u = w * x
    e = u - y
    L = 0.5 * e ** 2
    return L, {"w": w, "x": x, "y": y, "u": u, "e": e, "L": L}


def texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


class Node:
    """A learner's node as in lesson 02: inputs in .parents, op name in .op."""

    def __init__(self, data, parents=(), op=""):
        self.data, self.grad, self.parents, self.op = float(data), 0.0, tuple(parents), op

    def __mul__(self, other):
        return Node(self.data * other.data, (self, other), "*")

    def __add__(self, other):
        return Node(self.data + other.data, (self, other), "+")


def learner_backward(root):
    order = topological_order(root)
    root.grad = 1.0
    for n in reversed(order):
        if n.op == "+":
            for p in n.parents:
                p.grad += n.grad
        elif n.op == "*":
            a, b = n.parents
            a.grad += n.grad * b.data
            b.grad += n.grad * a.data


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_draw_graph_shows_values_gradients_and_ops():
    L, named = minus_four()
    L.backward()
    fig = draw_graph(L)
    shown = texts(fig)
    assert "w = 2\ngrad -4" in shown
    assert "x = 2\ngrad -4" in shown
    assert "y = 6\ngrad 2" in shown
    assert "4\ngrad -2" in shown            # u has no label: its value and gradient only
    for symbol in ("×", "−", "x²"):
        assert symbol in shown
    # one circle per operation, one box per value
    nodes = topological_order(L)
    assert len(nodes) == 8                  # w, x, u, y, e, e**2, the constant 0.5, L
    ops = sum(1 for n in nodes if n.inputs)
    assert sum(1 for t in shown if t in ("×", "−", "x²")) == ops


def test_draw_graph_before_backward_and_values_only():
    L, named = minus_four()
    shown = texts(draw_graph(L, names={"L": L}))
    assert "L = 2\ngrad 0" in shown
    assert all("grad" not in t for t in texts(draw_graph(L, show_grad=False)))


def test_names_override_labels_and_grads_override_node_gradients():
    L, named = minus_four()
    L.backward()
    shown = texts(draw_graph(L, names={"weight": named["w"]},
                             grads={id(named["w"]): None}))
    assert "weight = 2\ngrad –" in shown


def test_layout_puts_every_input_left_of_its_output():
    L, _ = minus_four()
    lay = layout(L)
    for n in lay.nodes:
        for p in n.inputs:
            assert lay.boxes[id(p)][0] < lay.boxes[id(n)][0]
            assert lay.boxes[id(p)][0] < lay.ops[id(n)][0] < lay.boxes[id(n)][0]
    # the target y is used only by the subtraction: it sits one column before it
    y = next(n for n in lay.nodes if n.label == "y")
    e = next(n for n in lay.nodes if n.op == "-")
    assert lay.ops[id(e)][0] - lay.boxes[id(y)][0] < lay.boxes[id(e)][0] - lay.ops[id(e)][0] + 1.5


def test_a_learners_node_class_draws_too():
    w = Node(3.0)
    u = w * w + w
    learner_backward(u)
    shown = texts(draw_graph(u, names={"w": w, "u": u}))
    assert "w = 3\ngrad 7" in shown and "u = 12\ngrad 1" in shown


def test_unknown_node_type_gets_an_actionable_error():
    class Bare:
        data, grad = 1.0, 0.0
    with pytest.raises(TypeError, match="inputs, parents"):
        draw_graph(Bare())


def test_topological_order_handles_deep_graphs_without_recursion():
    x = Value(1.0)
    y = x
    for _ in range(5000):
        y = y * 1.0
    order = topological_order(y)
    assert order[-1] is y and len(order) == 5000 * 2 + 1  # each step adds a constant leaf


def test_graph_view_steps_from_before_to_after_backward():
    L, named = minus_four()
    view = GraphView(L, names=named)
    assert view.step.value == 0 and view.step.max == len(topological_order(L))
    assert "Before backward" in view.label.value
    assert all(g == 0 for g in view.grads_at(0).values())
    # the last step shows the engine's own gradients
    after = view.grads_at(view.step.max)
    assert after[id(named["w"])] == -4 and after[id(named["y"])] == 2
    # step 1 visits the root: the seed
    view.step.value = 1
    assert "the seed, dL/dL = 1" in view.label.value
    shown = view.grads_at(1)
    assert shown[id(L)] == 1 and shown[id(named["w"])] is None  # not reached yet
    view.after_button.click()
    assert view.step.value == view.step.max and "Backward is done" in view.label.value
    view.before_button.click()
    assert view.step.value == 0


def test_graph_view_runs_backward_once_and_shows_a_fresh_picture_each_step():
    calls = []
    w = Node(3.0)
    u = w * w + w
    view = GraphView(u, names={"w": w, "u": u},
                     backward=lambda r: (calls.append(r), learner_backward(r)))
    assert calls == [u]
    for k in range(view.step.max + 1):
        view.step.value = k
        assert len(view.plot.outputs) == 1
        assert "image/png" in view.plot.outputs[0]["data"]
    assert calls == [u]
    assert w.grad == 7  # the view leaves the gradients of the real backward in place
    assert "w has its complete gradient 7" in view.label.value


def test_graph_view_prints_nothing_and_leaks_no_figures(capsys):
    L, named = minus_four()
    before = len(plt.get_fignums())
    view = GraphView(L, names=named)
    for k in list(range(view.step.max + 1)) + [0]:
        view.step.value = k
    assert len(plt.get_fignums()) == before
    assert capsys.readouterr().out == ""
