"""Tensor: an ndarray that records, on a tape, the operations made from it.

Define-by-run: every op on a tensor that requires a gradient appends one
node (an `engine.rules.Op`) to the graph as it runs, so a Python `if` simply
records the branch taken. `loss.backward()` walks the nodes in reverse
topological order and calls each one's VJP; where a tensor fed several ops
(fan-out), their gradients are summed. Leaf tensors (made by you, with
requires_grad=True) *accumulate* into `.grad` across backward calls until
`zero_grad()`.

What the tape keeps, and when it lets go:

* A node keeps the arrays its VJP needs (its "saved tensors") and links to
  the nodes of its inputs, never the input tensors themselves, so an
  intermediate result you drop is freed unless some VJP needs it.
* Backward frees each node's saved arrays right after its VJP ran. A second
  backward through the same nodes then raises; pass retain_graph=True to the
  first one to keep them.
* Every tensor has a version counter, bumped by in-place changes (`+=`,
  `x[i] = ...`, `zero_()`, ...). A node records the version of each tensor
  it saved; if it changed before backward, backward raises and names the op
  and the tensor. Writing into `.data` directly bypasses the counter.
* A plain ndarray passed to an op has no counter, so a node that needs one
  keeps a private copy (index arrays of `x[idx]` too): changing your array
  after the forward cannot change the gradient. The copy is saved memory.
* A result with an integer or boolean dtype (`x.astype(np.int64)`) has no
  gradient: it leaves the graph, as in PyTorch.

Modes: `no_grad()` records nothing (for evaluation and optimizer steps);
`detach()` returns a tensor sharing data but cut from the graph.
"""
from __future__ import annotations

import threading
import weakref
from contextlib import ContextDecorator, contextmanager

import numpy as np

from . import rules
from .rules import Op, ShapeError


# ------------------------------------------------------------------ global state
class _State(threading.local):
    def __init__(self):
        self.grad_enabled = True
        self.scopes: list[str] = []


_state = _State()
_observers: list = []
_node_counter = [0]


# ------------------------------------------------------------ tape observers
class TapeObserver:
    """Something that watches the tape: subclass it and override what you need.

    engine.memory (saved bytes per op) and engine.anomaly (NaN/Inf checks) are
    observers; so can your own tools be. Register with `add_observer` /
    `remove_observer`, or `with observe(obj):`. Observers are called in the
    order they were added.
    """

    def before_forward(self, op: Op) -> None:
        """Every op (recorded or not), before its forward runs."""

    def after_forward(self, op: Op, inputs: tuple, result: "Tensor", recorded: bool) -> None:
        """Every op, after its forward; `recorded` says whether it joined the tape."""

    def after_backward(self, node: Op, g, grads: tuple, released: bool) -> None:
        """Every node the backward visits, after its VJP ran (and, when
        `released`, after its saved arrays were dropped)."""


def add_observer(observer: TapeObserver) -> None:
    """Start calling `observer` on every op of the tape."""
    _observers.append(observer)


def remove_observer(observer: TapeObserver) -> None:
    """Stop calling `observer` (it must have been added)."""
    _observers.remove(observer)


@contextmanager
def observe(observer: TapeObserver):
    """`with observe(obj):` obj watches the tape inside the block."""
    add_observer(observer)
    try:
        yield observer
    finally:
        remove_observer(observer)


def is_grad_enabled() -> bool:
    return _state.grad_enabled


class set_grad_enabled(ContextDecorator):
    """Turn recording on or off inside a `with` block (or a decorated function)."""

    def __init__(self, enabled: bool):
        self.enabled = bool(enabled)
        self._previous: list[bool] = []

    def __enter__(self):
        self._previous.append(_state.grad_enabled)
        _state.grad_enabled = self.enabled
        return self

    def __exit__(self, *exc):
        _state.grad_enabled = self._previous.pop()


class no_grad(set_grad_enabled):
    """`with no_grad():` runs ops without recording them (results need no grad)."""

    def __init__(self):
        super().__init__(False)


class enable_grad(set_grad_enabled):
    """`with enable_grad():` records again inside a no_grad region."""

    def __init__(self):
        super().__init__(True)


@contextmanager
def name_scope(name: str):
    """Label the ops recorded inside, e.g. 'h0.attn', for memory reports."""
    _state.scopes.append(name)
    try:
        yield
    finally:
        _state.scopes.pop()


# ------------------------------------------------------------------- the tensor
def root_buffer(a: np.ndarray) -> np.ndarray:
    """The array that owns the memory behind a view."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class Tensor:
    """An array with an optional gradient. See the module docstring for the tape.

    Tensor(array, requires_grad=False, name=None, dtype=None) copies `array`
    (like torch.tensor), so later changes to your array cannot reach the
    graph. Python floats become float64; float32 stays float32.
    """

    __array_ufunc__ = None  # make `ndarray + Tensor` call Tensor.__radd__

    def __init__(self, array, requires_grad: bool = False, name: str | None = None,
                 dtype=None):
        data = np.array(array.data if isinstance(array, Tensor) else array,
                        dtype=dtype, copy=True)
        if requires_grad and not np.issubdtype(data.dtype, np.floating):
            raise TypeError(
                f"Tensor: only floating-point tensors can require a gradient, got dtype "
                f"{data.dtype}. Pass dtype=np.float64 (or float32), or leave "
                f"requires_grad=False for integer ids and targets")
        self._init(data, requires_grad, name)

    def _init(self, data, requires_grad, name=None):
        self.data: np.ndarray = data
        self.grad: np.ndarray | None = None
        self.requires_grad = bool(requires_grad)
        self.name = name
        self._node: Op | None = None  # the op that made this tensor (None for leaves)
        self._version = [0]          # shared with views of the same memory
        self._tangent = None         # forward-mode tangent (engine.jvp)
        self._retains_grad = False

    @classmethod
    def _from_op(cls, data, requires_grad):
        t = cls.__new__(cls)
        t._init(data, requires_grad)
        return t

    # ---------------------------------------------------------------- basics
    shape = property(lambda self: self.data.shape)
    ndim = property(lambda self: self.data.ndim)
    dtype = property(lambda self: self.data.dtype)
    size = property(lambda self: self.data.size)
    is_leaf = property(lambda self: self._node is None)
    version = property(lambda self: self._version[0])

    def __len__(self):
        return len(self.data)

    def __repr__(self):
        extra = ", requires_grad=True" if self.requires_grad else ""
        if self._node is not None:
            extra += f", op={self._node.name}"
        if self.name:
            extra += f", name={self.name!r}"
        body = np.array2string(self.data, precision=4, threshold=20, prefix="Tensor(")
        return f"Tensor({body}, dtype={self.dtype}{extra})"

    def numpy(self) -> np.ndarray:
        return self.data

    def item(self) -> float:
        return self.data.item()

    def __float__(self) -> float:
        return float(self.data)

    # Comparisons give plain boolean arrays: masks and conditions, not graph nodes.
    def __lt__(self, other): return self.data < _data(other)
    def __le__(self, other): return self.data <= _data(other)
    def __gt__(self, other): return self.data > _data(other)
    def __ge__(self, other): return self.data >= _data(other)

    def detach(self) -> "Tensor":
        """The same data (shared memory, shared version counter), cut from the graph."""
        t = Tensor._from_op(self.data, False)
        t._version = self._version
        return t

    def zero_grad(self) -> None:
        """Forget the accumulated gradient (sets .grad to None)."""
        self.grad = None

    def retain_grad(self) -> "Tensor":
        """Also store the gradient of this non-leaf tensor in .grad during backward."""
        self._retains_grad = True
        return self

    def _accumulate(self, g: np.ndarray) -> None:
        if self.grad is None:
            self.grad = np.array(g, dtype=self.dtype, copy=True)
        else:
            self.grad += g

    # ----------------------------------------------------------- operators
    def __add__(self, other): return apply(rules.Add, self, other)
    def __radd__(self, other): return apply(rules.Add, other, self)
    def __sub__(self, other): return apply(rules.Sub, self, other)
    def __rsub__(self, other): return apply(rules.Sub, other, self)
    def __mul__(self, other): return apply(rules.Mul, self, other)
    def __rmul__(self, other): return apply(rules.Mul, other, self)
    def __truediv__(self, other): return apply(rules.Div, self, other)
    def __rtruediv__(self, other): return apply(rules.Div, other, self)
    def __neg__(self): return apply(rules.Neg, self)
    def __matmul__(self, other): return apply(rules.MatMul, self, other)
    def __rmatmul__(self, other): return apply(rules.MatMul, other, self)

    def __pow__(self, p):
        if isinstance(p, Tensor) or np.ndim(p) != 0:
            raise TypeError("pow: the exponent must be a Python number; for a tensor "
                            "exponent write F.exp(b * F.log(a))")
        return apply(rules.Pow, self, p=p)

    def __rpow__(self, base):
        raise TypeError(f"pow: a number raised to a tensor ({base!r} ** tensor) is not an "
                        f"op here; write F.exp(x * np.log({base!r})) instead")

    def __getitem__(self, index):
        return apply(rules.GetItem, self, index=_plain_index(index))

    def exp(self): return apply(rules.Exp, self)
    def log(self): return apply(rules.Log, self)
    def tanh(self): return apply(rules.Tanh, self)
    def relu(self): return apply(rules.Relu, self)

    def sum(self, axis=None, keepdims=False):
        return apply(rules.Sum, self, axis=axis, keepdims=keepdims)

    def mean(self, axis=None, keepdims=False):
        return apply(rules.Mean, self, axis=axis, keepdims=keepdims)

    def reshape(self, *shape):
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        return apply(rules.Reshape, self, shape=shape)

    def permute(self, *axes):
        """Reorder all axes (numpy's transpose(axes), torch's permute)."""
        if len(axes) == 1 and not isinstance(axes[0], (int, np.integer)):
            axes = tuple(axes[0])
        return apply(rules.Transpose, self, axes=tuple(int(a) % max(self.ndim, 1)
                                                       for a in axes))

    def transpose(self, *axes):
        """transpose() reverses the axes; transpose(i, j) swaps axes i and j (as
        in PyTorch); a full permutation of all axes is accepted too."""
        if len(axes) == 1 and not isinstance(axes[0], (int, np.integer)):
            axes = tuple(axes[0])
        if not axes:
            return self.permute(tuple(reversed(range(self.ndim))))
        if len(axes) == 2:
            i, j = (int(a) % self.ndim for a in axes)
            order = list(range(self.ndim))
            order[i], order[j] = order[j], order[i]
            return self.permute(order)
        return self.permute(axes)

    @property
    def T(self):
        return self.transpose()

    def astype(self, dtype):
        return apply(rules.Cast, self, dtype=dtype)

    # ------------------------------------------------------------- in place
    # In-place changes are not recorded: they change the data and bump the
    # version counter, so a node that saved this tensor can notice.
    def _inplace(self, what: str, fn) -> "Tensor":
        if self.requires_grad and _state.grad_enabled:
            raise RuntimeError(
                f"in-place {what} on a tensor that requires grad{self._label()} is not "
                f"recorded on the tape, so its gradient would be wrong. Write it out of "
                f"place (x = x + y), or, for an optimizer step, do it inside "
                f"`with engine.no_grad():`")
        fn()
        self._version[0] += 1
        return self

    def _label(self):
        return f" ('{self.name}')" if self.name else ""

    def __iadd__(self, other):
        return self._inplace("+=", lambda: np.add(self.data, _data(other), out=self.data,
                                                  casting="unsafe"))

    def __isub__(self, other):
        return self._inplace("-=", lambda: np.subtract(self.data, _data(other),
                                                       out=self.data, casting="unsafe"))

    def __imul__(self, other):
        return self._inplace("*=", lambda: np.multiply(self.data, _data(other),
                                                       out=self.data, casting="unsafe"))

    def __itruediv__(self, other):
        return self._inplace("/=", lambda: np.divide(self.data, _data(other),
                                                     out=self.data, casting="unsafe"))

    def __setitem__(self, index, value):
        def write():
            self.data[_plain_index(index)] = _data(value)
        self._inplace("assignment x[...] = ...", write)

    def zero_(self):
        return self._inplace("zero_()", lambda: self.data.fill(0))

    def fill_(self, value):
        return self._inplace("fill_()", lambda: self.data.fill(value))

    def copy_(self, other):
        return self._inplace("copy_()", lambda: np.copyto(self.data, _data(other),
                                                          casting="unsafe"))

    # ------------------------------------------------------------- backward
    def backward(self, grad=None, retain_graph: bool = False) -> None:
        """Fill .grad of every leaf this tensor depends on (accumulating).

        grad: dL/d(self); may be omitted for a single-element tensor (then 1).
        retain_graph: keep the saved tensors so backward can run again."""
        if not self.requires_grad:
            raise RuntimeError(
                f"backward: this tensor{self._label()} does not require grad, so there is "
                f"nothing to differentiate. Create the inputs with requires_grad=True, and "
                f"check the forward did not run under no_grad() or through detach() or a "
                f"plain ndarray")
        if grad is None:
            if self.size != 1:
                raise RuntimeError(
                    f"backward: grad can be omitted only for a single-number output, but "
                    f"this tensor has shape {self.shape}. Reduce it first (.sum() or "
                    f".mean()) or pass grad= an array of shape {self.shape}")
            seed = np.ones(self.shape, dtype=self.dtype)
        else:
            seed = np.asarray(grad.data if isinstance(grad, Tensor) else grad,
                              dtype=self.dtype)
            if seed.shape != self.shape:
                raise ShapeError(f"backward: grad has shape {seed.shape} but the tensor has "
                                 f"shape {self.shape}; they must match")
        if self._node is None:
            self._accumulate(seed)
            return
        run_backward(self._node, seed, retain_graph)


def _data(x):
    return x.data if isinstance(x, Tensor) else x


def _plain_index(index):
    """Indices may contain tensors (of ints or bools): use their arrays."""
    if isinstance(index, tuple):
        return tuple(_data(i) for i in index)
    return _data(index)


# ---------------------------------------------------------------- recording
def _leaf_or_node(x):
    """What a node links to for input x: the producing node, the leaf tensor, or None."""
    if not isinstance(x, Tensor) or not x.requires_grad:
        return None
    return x if x._node is None else x._node


def apply(op_class, *inputs, **options) -> Tensor:
    """Run one op on tensors (or constants), record it if needed, return the result.

    This is the only place where graph nodes are made; `engine.functional`
    and the Tensor operators all come through here. An op of your own (a
    subclass of engine.rules.Op) can be run the same way."""
    grad_on = _state.grad_enabled
    arrays = [x.data if isinstance(x, Tensor) else x for x in inputs]
    tracked = [isinstance(x, Tensor) and x.requires_grad and grad_on for x in inputs]
    has_tangent = [isinstance(x, Tensor) and x._tangent is not None for x in inputs]
    op = op_class(tuple(t or h for t, h in zip(tracked, has_tangent)))
    observers = list(_observers)
    for observer in observers:
        observer.before_forward(op)
    out = op.forward(*arrays, **options)
    if not isinstance(out, np.ndarray):
        out = np.asarray(out)
    if not np.issubdtype(out.dtype, np.floating):
        # Integer or boolean results (a cast to int, say) have no gradient: they leave the graph.
        tracked = [False] * len(inputs)
        has_tangent = [False] * len(inputs)
    if op.is_view and not isinstance(inputs[0], Tensor):
        out = out.copy()  # a view of the caller's array would let their later writes in
        op.is_view = False
    result = Tensor._from_op(out, any(tracked))
    if op.is_view:
        result._version = inputs[0]._version
    if any(has_tangent):
        tangent = op.jvp(*[x._tangent if isinstance(x, Tensor) else None for x in inputs])
        if tangent is not None:
            tangent = np.broadcast_to(np.asarray(tangent, dtype=out.dtype), out.shape)
        result._tangent = tangent
    if any(tracked):
        _node_counter[0] += 1
        op.node_id = _node_counter[0]
        op.scope = "/".join(_state.scopes)
        op.parents = tuple(_leaf_or_node(x) if t else None for x, t in zip(inputs, tracked))
        op.input_meta = tuple((np.shape(a), getattr(a, "dtype", None)) for a in arrays)
        op.output_ref = weakref.ref(result)
        op.freed = False
        _snapshot_caller_arrays(op, inputs)
        op.saved_versions = _saved_versions(op, inputs, result)
        result._node = op
    for observer in observers:
        observer.after_forward(op, inputs, result, any(tracked))
    return result


def _snapshot_caller_arrays(op, inputs) -> None:
    """Replace each saved array that is (a view of) a plain ndarray the caller passed
    in by a private copy.

    A Tensor's memory is guarded by its version counter; a plain array has no
    counter, and the caller may reuse it after the forward (a batch buffer, a
    mask), which would silently change the gradient. The copy is what the tape
    keeps, so engine.memory counts it."""
    caller = {id(root_buffer(x)) for x in inputs if isinstance(x, np.ndarray)}
    if not caller:
        return
    guarded = {id(root_buffer(x.data)) for x in inputs if isinstance(x, Tensor)}
    copies = {}  # one copy per array, even when two slots saved it
    for key, value in op.saved_arrays():
        memory = id(root_buffer(value))
        if memory in caller and memory not in guarded:
            if id(value) not in copies:
                copies[id(value)] = value.copy()
            setattr(op, key, copies[id(value)])


def _saved_versions(op, inputs, result):
    """For each saved array that is (a view of) an input's or the output's memory:
    (slot name, that tensor's version box, its version now, a label for errors)."""
    links = []
    for key, value in op.saved_arrays():
        memory = root_buffer(value)
        candidates = [(i, x) for i, x in enumerate(inputs) if isinstance(x, Tensor)]
        exact = [(i, x) for i, x in candidates if x.data is value]
        shared = [(i, x) for i, x in candidates if root_buffer(x.data) is memory]
        if exact or shared:
            i, x = (exact or shared)[0]
            label = f"'{x.name}'" if x.name else f"its input {i}"
            links.append((key, x._version, x._version[0], label))
        elif root_buffer(result.data) is memory:
            links.append((key, result._version, result._version[0], "its output"))
    return links


def op_label(op) -> str:
    where = f"{op.scope}/" if getattr(op, "scope", "") else ""
    node = "?" if op.node_id is None else op.node_id
    return f"{where}{op.name} (node #{node})"


# ----------------------------------------------------------------- backward
def topological_order(root: Op) -> list[Op]:
    """Nodes reachable from root, each after all the nodes it depends on."""
    order, seen = [], {id(root)}
    stack = [(root, iter(root.parents))]
    while stack:
        node, parents = stack[-1]
        for p in parents:
            if isinstance(p, Op) and id(p) not in seen:
                seen.add(id(p))
                stack.append((p, iter(p.parents)))
                break
        else:
            stack.pop()
            order.append(node)
    return order


def _check_saved(node: Op) -> None:
    if node.freed:
        raise RuntimeError(
            f"backward through {op_label(node)} a second time: its saved tensors "
            f"({', '.join(node.saved_names)}) were freed by the first backward. Pass "
            f"retain_graph=True to the first .backward() if you need to call it twice, "
            f"or run the forward again")
    for key, box, version, label in node.saved_versions:
        if box[0] != version:
            value = getattr(node, key)
            raise RuntimeError(
                f"backward: {op_label(node)} saved {label} (as '{key}', shape {value.shape}, "
                f"{value.dtype}) for its gradient, but that tensor was modified in place "
                f"afterwards (version {version} when saved, now {box[0]}), so the gradient "
                f"would use the wrong values. Replace the in-place change with an "
                f"out-of-place one (x = x + 1 instead of x += 1), or make it after backward")


def _release(node: Op) -> None:
    for key in node.saved_names:
        if hasattr(node, key):
            delattr(node, key)
    node.freed = bool(node.saved_names)


def run_backward(root: Op, seed: np.ndarray, retain_graph: bool = False) -> None:
    order = topological_order(root)
    pending = {id(root): seed}  # gradient of each node's output, summed over its uses
    for node in reversed(order):
        g = pending.pop(id(node), None)
        if g is None:
            continue
        out = node.output_ref()
        if out is not None and out._retains_grad:
            out._accumulate(g)
        _check_saved(node)
        grads = rules.run_vjp(node, g)
        if len(grads) != len(node.parents):
            raise RuntimeError(f"the VJP of {op_label(node)} returned {len(grads)} "
                               f"gradients for {len(node.parents)} inputs")
        for parent, (shape, dtype), gi in zip(node.parents, node.input_meta, grads):
            if parent is None or gi is None:
                continue
            gi = np.asarray(gi)
            if gi.shape != shape:
                raise ShapeError(
                    f"the VJP of {op_label(node)} returned a gradient of shape {gi.shape} "
                    f"for an input of shape {shape}. A gradient has its input's shape; "
                    f"if the input was broadcast, sum over the broadcast axes")
            if dtype is not None and gi.dtype != dtype:
                gi = gi.astype(dtype)
            if isinstance(parent, Tensor):
                parent._accumulate(gi)
            else:
                key = id(parent)
                pending[key] = gi if key not in pending else pending[key] + gi
        if not retain_graph:
            _release(node)
        for observer in list(_observers):
            observer.after_backward(node, g, grads, released=not retain_graph)
