"""Value: automatic differentiation on single numbers, small enough to read in one go.

Every arithmetic result remembers the op that made it and its inputs, so
an expression builds a graph as it runs. `backward()` visits that graph in
reverse topological order and applies the chain rule at every node:

    input.grad += (d node / d input) * node.grad

The local derivatives d node / d input of every op are in one table,
`LOCAL_GRADIENTS`, one line per op. A value used twice (fan-out) receives
the sum of both contributions, because of the `+=`. Leaves keep adding
across backward calls until you reset them with `zero_grad()`.

    >>> a, b = Value(2.0, label="a"), Value(-3.0, label="b")
    >>> loss = (a * b + a).relu()
    >>> loss.backward()
"""
from __future__ import annotations

import math
from dataclasses import dataclass


class Value:
    """A number with a gradient slot, and the op and inputs that made it."""

    def __init__(self, data: float, inputs: tuple["Value", ...] = (), op: str = "",
                 label: str = ""):
        self.data = float(data)
        self.grad = 0.0
        self.inputs = inputs
        self.op = op          # "" for a leaf (a number you made)
        self.label = label
        self.exponent = None  # only used by "**"

    def __repr__(self) -> str:
        name = f"{self.label}=" if self.label else ""
        return f"Value({name}{self.data:.6g}, grad={self.grad:.6g})"

    # ------------------------------------------------------------ the ops
    def __add__(self, other): return Value(self.data + _v(other).data, (self, _v(other)), "+")
    def __mul__(self, other): return Value(self.data * _v(other).data, (self, _v(other)), "*")
    def __sub__(self, other): return Value(self.data - _v(other).data, (self, _v(other)), "-")
    def __neg__(self): return Value(-self.data, (self,), "neg")
    def __radd__(self, other): return _v(other) + self
    def __rmul__(self, other): return _v(other) * self
    def __rsub__(self, other): return _v(other) - self
    def __rtruediv__(self, other): return _v(other) / self

    def __truediv__(self, other):
        other = _v(other)
        if other.data == 0:
            raise ZeroDivisionError(f"Value division: dividing {self.data} by a Value equal "
                                    f"to 0")
        return Value(self.data / other.data, (self, other), "/")

    def __pow__(self, exponent):
        if not isinstance(exponent, (int, float)):
            raise TypeError("Value ** p: the exponent must be a plain number")
        out = Value(self.data ** exponent, (self,), "**")
        out.exponent = exponent
        return out

    def relu(self): return Value(max(self.data, 0.0), (self,), "relu")
    def tanh(self): return Value(math.tanh(self.data), (self,), "tanh")
    def exp(self): return Value(math.exp(self.data), (self,), "exp")

    def log(self):
        if self.data <= 0:
            raise ValueError(f"Value.log: log of {self.data} is undefined (needs a positive "
                             f"number)")
        return Value(math.log(self.data), (self,), "log")

    # ---------------------------------------------------------- backward
    def backward(self) -> None:
        """Seed d self / d self = 1 and apply the chain rule backwards."""
        order = topological_order(self)
        for node in order:           # intermediate gradients belong to this pass only
            if node.inputs:
                node.grad = 0.0
        self.grad += 1.0
        for node in reversed(order):  # outputs before the inputs they came from
            if not node.inputs:
                continue
            for inp, local in zip(node.inputs, LOCAL_GRADIENTS[node.op](node, *node.inputs)):
                inp.grad += local * node.grad

    def zero_grad(self) -> None:
        """Reset this value's gradient to 0 (do it for each parameter before backward)."""
        self.grad = 0.0

    def graph(self) -> "Graph":
        """Nodes and edges of the graph that produced this value, for drawing."""
        order = topological_order(self)
        ids = {id(v): i for i, v in enumerate(order)}
        nodes = [GraphNode(ids[id(v)], v.label, v.op, v.data, v.grad) for v in order]
        edges = [(ids[id(i)], ids[id(v)]) for v in order for i in v.inputs]
        return Graph(nodes, edges)


# One line per op: (output, *inputs) -> d output / d each input.
LOCAL_GRADIENTS = {
    "+": lambda out, a, b: (1.0, 1.0),
    "-": lambda out, a, b: (1.0, -1.0),
    "*": lambda out, a, b: (b.data, a.data),
    "/": lambda out, a, b: (1.0 / b.data, -a.data / b.data ** 2),
    "neg": lambda out, a: (-1.0,),
    "**": lambda out, a: (out.exponent * a.data ** (out.exponent - 1),),
    "relu": lambda out, a: (1.0 if a.data > 0 else 0.0,),  # subgradient 0 at the kink
    "tanh": lambda out, a: (1.0 - out.data ** 2,),
    "exp": lambda out, a: (out.data,),
    "log": lambda out, a: (1.0 / a.data,),
}


def _v(x) -> Value:
    return x if isinstance(x, Value) else Value(x)


def topological_order(root: Value) -> list[Value]:
    """Every value root depends on, each listed after all of its inputs."""
    order, seen = [], {id(root)}
    stack = [(root, iter(root.inputs))]  # a depth-first walk, without recursion limits
    while stack:
        node, inputs = stack[-1]
        for inp in inputs:
            if id(inp) not in seen:
                seen.add(id(inp))
                stack.append((inp, iter(inp.inputs)))
                break
        else:               # all inputs placed: now the node itself
            stack.pop()
            order.append(node)
    return order


@dataclass
class GraphNode:
    id: int
    label: str
    op: str       # the op that produced it ("" for a leaf)
    data: float
    grad: float


@dataclass
class Graph:
    nodes: list[GraphNode]
    edges: list[tuple[int, int]]  # (input node id, output node id)
