"""Lesson 02's slot: the scalar engine's backward, run on `ScalarNode`."""
from __future__ import annotations

import numpy as np

from engine.scalar import Value

from .core import SlotError


class ScalarNode:
    """A scalar of a recorded computation, in the convention of lesson 02's `Node`: the
    value `.data`, the gradient `.grad`, the inputs `.parents` and the op name `.op`
    ("+", "-", "*", "square", "relu"). These are the nodes the slot of lesson 02's walk
    hands a piece. `.inputs` is `.parents` under the name `engine.scalar` uses, so
    `engine.scalar.topological_order` can count a graph of either kind."""

    def __init__(self, data, parents=(), op=""):
        self.data = float(data)
        self.grad = 0.0
        self.parents = tuple(parents)
        self.op = op

    @property
    def inputs(self):
        return self.parents

    def __add__(self, other):
        other = _scalar_node(other)
        return ScalarNode(self.data + other.data, (self, other), "+")

    def __sub__(self, other):
        other = _scalar_node(other)
        return ScalarNode(self.data - other.data, (self, other), "-")

    def __mul__(self, other):
        other = _scalar_node(other)
        return ScalarNode(self.data * other.data, (self, other), "*")

    def __radd__(self, other):
        return _scalar_node(other) + self

    def __rsub__(self, other):
        return _scalar_node(other) - self

    def __rmul__(self, other):
        return _scalar_node(other) * self

    def square(self):
        return ScalarNode(self.data ** 2, (self,), "square")

    def relu(self):
        return ScalarNode(self.data if self.data > 0 else 0.0, (self,), "relu")


def _scalar_node(value):
    return value if isinstance(value, ScalarNode) else ScalarNode(value)


def _scalar_case(leaf, square):
    """A graph with every op of lesson 02, a ReLU on and one off, and fan-out; the leaves
    (a, b, c) and the root. `leaf` makes a leaf, `square(v)` squares a value."""
    a, b, c = leaf(1.5), leaf(-2.0), leaf(0.5)
    h = a * b + c                       # -2.5: the first ReLU is off
    s = square(a - c) * b + h.relu() * a + (a * c).relu()
    return (a, b, c), s * a + square(b)


def _check_scalar_backward(fn):
    # Where lesson 03 runs it: `fn(root)` on a graph of ScalarNodes, with the walk's own
    # rules (its default); compared with engine.scalar on the same graph, run twice.
    (va, vb, vc), vroot = _scalar_case(Value, lambda v: v ** 2)
    vroot.backward()
    want = [va.grad, vb.grad, vc.grad]
    leaves, root = _scalar_case(ScalarNode, ScalarNode.square)
    for times in (1, 2):
        fn(root)
        got = [leaf.grad for leaf in leaves]
        if not np.allclose(got, [times * w for w in want], rtol=1e-12, atol=1e-12):
            shown = ", ".join(f"{g:.6g}" for g in got)
            raise SlotError(f"after backward #{times} on a graph of +, -, *, square and relu "
                            f"with a shared input the leaves hold ({shown}); engine.scalar "
                            f"gives ({', '.join(f'{times * w:.6g}' for w in want)})")


CONTRACTS = {"scalar_backward": _check_scalar_backward}
