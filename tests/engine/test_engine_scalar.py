"""engine.scalar.Value: the lesson numbers, fan-out, accumulation, the graph."""
from __future__ import annotations

import math

import pytest

from engine.scalar import LOCAL_GRADIENTS, Value, topological_order


def test_two_layer_example():
    x, w1, w2, y = Value(2.0), Value(0.5), Value(3.0), Value(1.0)
    z1 = w1 * x
    a1 = z1.relu()
    z2 = w2 * a1
    loss = (z2 - y) ** 2
    loss.backward()
    assert (z1.data, a1.data, z2.data, loss.data) == (1.0, 1.0, 3.0, 4.0)
    assert (z2.grad, w2.grad, a1.grad, z1.grad, w1.grad) == (4.0, 4.0, 12.0, 12.0, 24.0)


def test_shared_parameter_gets_the_sum_of_both_paths():
    w = Value(3.0, label="w")
    path1, path2 = w * 2.0, w * w        # d/dw: 2 and 2w = 6
    (path1 + path2).backward()
    assert w.grad == 8.0


def test_backward_accumulates_into_leaves_until_zeroed():
    a, b = Value(2.0), Value(-3.0)
    loss = a * b + a
    loss.backward()
    assert (a.grad, b.grad) == (-2.0, 2.0)
    loss.backward()                      # again, without zeroing: doubled
    assert (a.grad, b.grad) == (-4.0, 4.0)
    a.zero_grad(), b.zero_grad()
    loss.backward()
    assert (a.grad, b.grad) == (-2.0, 2.0)


@pytest.mark.parametrize("make, x0", [
    (lambda x: x + 2.5, 1.3), (lambda x: 2.5 - x, 1.3), (lambda x: x * x * 3, 1.3),
    (lambda x: 1.0 / x, 1.3), (lambda x: x / 4.0, 1.3), (lambda x: -x, 1.3),
    (lambda x: x ** 3, 1.3), (lambda x: x ** -0.5, 1.3), (lambda x: x.relu(), 1.3),
    (lambda x: x.relu(), -1.3), (lambda x: x.tanh(), 0.4), (lambda x: x.exp(), 0.4),
    (lambda x: x.log(), 0.4), (lambda x: (x * 2).tanh() * x.exp() - x.log(), 0.7),
])
def test_every_local_rule_against_a_central_difference(make, x0):
    x = Value(x0)
    make(x).backward()
    h = 1e-6
    numeric = (make(Value(x0 + h)).data - make(Value(x0 - h)).data) / (2 * h)
    assert math.isclose(x.grad, numeric, rel_tol=1e-7, abs_tol=1e-9)


def test_relu_uses_subgradient_zero_at_the_kink():
    x = Value(0.0)
    x.relu().backward()
    assert x.grad == 0.0


def test_every_op_has_a_rule():
    assert set(LOCAL_GRADIENTS) == {"+", "-", "*", "/", "neg", "**", "relu", "tanh", "exp", "log"}


def test_topological_order_puts_inputs_first_and_handles_deep_graphs():
    x = Value(1.0)
    y = x
    for _ in range(5000):                # deeper than Python's recursion limit
        y = y + 1.0
    order = topological_order(y)
    assert order[-1] is y and order.index(x) < order.index(y)
    y.backward()
    assert x.grad == 1.0


def test_graph_lists_nodes_and_edges_for_drawing():
    a, b = Value(2.0, label="a"), Value(-3.0, label="b")
    c = a * b
    c.label = "c"
    loss = c + a
    loss.label = "L"
    loss.backward()
    g = loss.graph()
    by_label = {n.label: n for n in g.nodes}
    assert set(by_label) == {"a", "b", "c", "L"}
    assert by_label["c"].op == "*" and by_label["a"].op == ""
    assert by_label["a"].grad == -2.0 and by_label["L"].data == -4.0
    ids = {n.label: n.id for n in g.nodes}
    assert sorted(g.edges) == sorted([(ids["a"], ids["c"]), (ids["b"], ids["c"]),
                                      (ids["c"], ids["L"]), (ids["a"], ids["L"])])


def test_errors_are_explained():
    with pytest.raises(ValueError, match="log of -1.0"):
        Value(-1.0).log()
    with pytest.raises(ZeroDivisionError, match="dividing 1.0"):
        Value(1.0) / Value(0.0)
    with pytest.raises(TypeError, match="exponent must be a plain number"):
        Value(2.0) ** Value(2.0)
