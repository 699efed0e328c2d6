"""Every differentiable operation of the engine, forward and backward side by side.

An op is a small class with three methods that all work on plain ndarrays:

    forward(*inputs, **options) -> output   computes the value and calls
                                            self.save(...) for what the
                                            backward will need;
    vjp(g) -> one gradient per input        the vector-Jacobian product: given
                                            g = dL/d(output), return dL/d(input)
                                            (None for inputs that need none);
    jvp(*tangents) -> output tangent        forward mode: given the inputs'
                                            tangents (None = zero), return the
                                            output's.

`self.needs[i]` says whether input i needs a gradient (or carries a tangent),
so an op saves only what it will use. Everything passed to `self.save` is
what the tape keeps alive until the backward reaches the op: that is exactly
what `engine.memory` measures, so the save calls below are the activation
memory of the engine.

Conventions: broadcasting in the forward is a sum in the backward
(`unbroadcast`); dtypes follow the inputs (float32 in, float32 out); the hot
ops (layer norm, softmax, cross-entropy, GELU, attention, the embedding
gradient) call `engine.kernels`, which runs numba or the numpy oracle.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from . import kernels


class ShapeError(ValueError):
    """Shapes that do not fit an op. The message names the op and the shapes."""


# A rule can be swapped for a block of code, to run a VJP written elsewhere inside the
# tape (and compare it with the op's own): `with override_vjp("matmul", fn):` makes the
# backward call fn(op, g) instead of op.vjp(g) for every op of that name.
_VJP_OVERRIDES: dict[str, object] = {}


@contextmanager
def override_vjp(op_name: str, vjp):
    """Inside the block, the tape runs `vjp(op, g)` for the ops named `op_name`."""
    previous = _VJP_OVERRIDES.get(op_name)
    _VJP_OVERRIDES[op_name] = vjp
    try:
        yield
    finally:
        if previous is None:
            del _VJP_OVERRIDES[op_name]
        else:
            _VJP_OVERRIDES[op_name] = previous


def run_vjp(op: "Op", g):
    """The gradients of `op`'s inputs: its own rule, or the override for its name."""
    override = _VJP_OVERRIDES.get(op.name)
    return op.vjp(g) if override is None else override(op, g)


class Op:
    """Base class of a recorded operation (one node of the tape).

    An op subclass sets `name` and writes forward, vjp (and optionally jvp).
    The fields below the line are filled by the tape (`engine.tensor.apply`)
    when the op is recorded; they are declared here so a reader (and the
    memory recorder, the anomaly detector, the graph widget) knows what a node
    carries.
    """

    name = "op"
    # ---- node fields, set by the tape when it records the op
    node_id: int | None = None       # 1, 2, ... in recording order
    scope: str = ""                  # name_scope path, e.g. "h0/attn"
    parents: tuple = ()              # per input: producing node, leaf Tensor, or None
    input_meta: tuple = ()           # per input: (shape, dtype), to check gradients
    output_ref = None                # weakref to the output Tensor
    freed: bool = False              # True once backward released the saved arrays
    saved_versions: tuple = ()       # (slot, version box, version, label) per saved input
    created_at: str = "unknown location"  # the user's file:line (under detect_anomaly)

    def __init__(self, needs: tuple[bool, ...]):
        self.needs = needs
        self.saved_names: list[str] = []
        self.is_view = False  # True when the output shares memory with input 0

    def save(self, **values) -> None:
        """Keep values for the backward; they become attributes (self.x, ...).

        A plain ndarray input saved here is replaced by a private copy when
        the op is recorded (`engine.tensor.apply`), so the caller may reuse
        it; an array passed as an option rather than an input is the rule's
        to copy, as GetItem does with its index."""
        for key, value in values.items():
            setattr(self, key, value)
            if key not in self.saved_names:
                self.saved_names.append(key)

    def saved_arrays(self):
        """(slot name, array) for every saved value that is an ndarray, in saving order."""
        for key in self.saved_names:
            value = getattr(self, key)
            if isinstance(value, np.ndarray):
                yield key, value

    def forward(self, *inputs, **options):
        raise NotImplementedError

    def vjp(self, g):
        raise NotImplementedError

    def jvp(self, *tangents):
        raise NotImplementedError(
            f"forward mode (jvp) is not implemented for the op '{self.name}'")


# ------------------------------------------------------------------ helpers
def unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum g over the axes that broadcasting added or stretched, giving `shape`.

    Forward, an input of shape (C,) is reused for every row of a (B, C)
    result; backward, every row's gradient flows into that one input, so the
    rows are summed. The same holds for size-1 axes that were stretched."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    if stretched:
        g = g.sum(axis=stretched, keepdims=True)
    return g


def _shape(x) -> tuple[int, ...]:
    return np.shape(x)


def _check_broadcast(op: str, a, b) -> None:
    try:
        np.broadcast_shapes(_shape(a), _shape(b))
    except ValueError:
        raise ShapeError(
            f"{op}: shapes {_shape(a)} and {_shape(b)} do not broadcast. Trailing axes must "
            f"be equal or 1 (numpy rules); reshape one operand, e.g. add a size-1 axis with "
            f".reshape(...)") from None


def _sum_terms(*terms):
    """Add the terms that are not None (a missing tangent is a zero)."""
    present = [t for t in terms if t is not None]
    if not present:
        return None
    total = present[0]
    for t in present[1:]:
        total = total + t
    return total


def _normalize_axes(axis, ndim: int, op: str) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if np.isscalar(axis) else tuple(axis)
    out = []
    for a in axes:
        a = int(a)
        if not -ndim <= a < max(ndim, 1):
            raise ShapeError(f"{op}: axis {a} is out of range for a tensor with {ndim} axes")
        out.append(a % ndim if ndim else 0)
    return tuple(sorted(set(out)))


# ============================================================ arithmetic
class Add(Op):
    """z = a + b.  dz/da = dz/db = 1: the gradient passes through, summed over
    broadcast axes."""
    name = "add"

    def forward(self, a, b):
        _check_broadcast(self.name, a, b)
        self.shapes = _shape(a), _shape(b)
        return np.add(a, b)

    def vjp(self, g):
        return (unbroadcast(g, self.shapes[0]) if self.needs[0] else None,
                unbroadcast(g, self.shapes[1]) if self.needs[1] else None)

    def jvp(self, ta, tb):
        return _sum_terms(ta, tb)


class Sub(Op):
    """z = a - b.  dz/da = 1, dz/db = -1."""
    name = "sub"

    def forward(self, a, b):
        _check_broadcast(self.name, a, b)
        self.shapes = _shape(a), _shape(b)
        return np.subtract(a, b)

    def vjp(self, g):
        return (unbroadcast(g, self.shapes[0]) if self.needs[0] else None,
                unbroadcast(-g, self.shapes[1]) if self.needs[1] else None)

    def jvp(self, ta, tb):
        return _sum_terms(ta, None if tb is None else -tb)


class Mul(Op):
    """z = a * b.  dz/da = b, dz/db = a: each input's gradient needs the *other*
    input, so that is what we save."""
    name = "mul"

    def forward(self, a, b):
        _check_broadcast(self.name, a, b)
        self.shapes = _shape(a), _shape(b)
        if self.needs[0]:
            self.save(b=b)
        if self.needs[1]:
            self.save(a=a)
        return np.multiply(a, b)

    def vjp(self, g):
        return (unbroadcast(g * self.b, self.shapes[0]) if self.needs[0] else None,
                unbroadcast(g * self.a, self.shapes[1]) if self.needs[1] else None)

    def jvp(self, ta, tb):
        return _sum_terms(None if ta is None else ta * self.b,
                          None if tb is None else self.a * tb)


class Div(Op):
    """z = a / b.  dz/da = 1/b, dz/db = -a/b^2."""
    name = "div"

    def forward(self, a, b):
        _check_broadcast(self.name, a, b)
        self.shapes = _shape(a), _shape(b)
        self.save(b=b)
        if self.needs[1]:
            self.save(a=a)
        return np.divide(a, b)

    def vjp(self, g):
        return (unbroadcast(g / self.b, self.shapes[0]) if self.needs[0] else None,
                unbroadcast(-g * self.a / (self.b * self.b), self.shapes[1])
                if self.needs[1] else None)

    def jvp(self, ta, tb):
        return _sum_terms(None if ta is None else ta / self.b,
                          None if tb is None else -tb * self.a / (self.b * self.b))


class Neg(Op):
    """z = -a.  dz/da = -1."""
    name = "neg"

    def forward(self, a):
        return np.negative(a)

    def vjp(self, g):
        return (-g,)

    def jvp(self, ta):
        return -ta


class Pow(Op):
    """z = a ** p for a constant number p.  dz/da = p a^(p-1).

    For p = 0, z = 1 everywhere and the derivative is 0 everywhere; the
    formula would give 0 * 0^-1 = NaN at a = 0, so that case is written out
    (and saves nothing)."""
    name = "pow"

    def forward(self, a, p):
        if np.ndim(p) != 0:
            raise TypeError(f"pow: the exponent must be one number, got an array of shape "
                            f"{np.shape(p)}; for a tensor exponent write F.exp(b * F.log(a))")
        self.p = p.item() if isinstance(p, (np.ndarray, np.generic)) else p
        if self.p != 0:
            self.save(a=a)
        return np.power(a, self.p)

    def _slope(self, like):
        if self.p == 0:
            return np.zeros_like(like)
        return self.p * np.power(self.a, self.p - 1)

    def vjp(self, g):
        return (g * self._slope(g),)

    def jvp(self, ta):
        return ta * self._slope(ta)


# ======================================================= elementwise maths
class Exp(Op):
    """z = e^a.  dz/da = e^a = z: the backward reuses the saved output."""
    name = "exp"

    def forward(self, a):
        out = np.exp(a)
        self.save(out=out)
        return out

    def vjp(self, g):
        return (g * self.out,)

    def jvp(self, ta):
        return ta * self.out


class Log(Op):
    """z = ln a.  dz/da = 1/a."""
    name = "log"

    def forward(self, a):
        self.save(a=a)
        return np.log(a)

    def vjp(self, g):
        return (g / self.a,)

    def jvp(self, ta):
        return ta / self.a


class Tanh(Op):
    """z = tanh a.  dz/da = 1 - z^2: again the output is enough."""
    name = "tanh"

    def forward(self, a):
        out = np.tanh(a)
        self.save(out=out)
        return out

    def vjp(self, g):
        return (g * (1.0 - self.out * self.out),)

    def jvp(self, ta):
        return ta * (1.0 - self.out * self.out)


class Relu(Op):
    """z = max(a, 0).  dz/da = 1 where a > 0, else 0.

    At a = 0 the function has a kink; we use the subgradient 0 there (as
    PyTorch does). A finite-difference check exactly at 0 sees slope 1/2, so
    gradient checks keep their points away from the kink."""
    name = "relu"

    def forward(self, a):
        out = np.maximum(a, 0)
        self.save(out=out)
        return out

    def vjp(self, g):
        return (g * (self.out > 0),)

    def jvp(self, ta):
        return ta * (self.out > 0)


class Gelu(Op):
    """GELU, tanh form: z = 0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3))).
    The backward needs the input a (the pre-activation)."""
    name = "gelu"

    def forward(self, a):
        self.save(a=a)
        return kernels.gelu_forward(a)

    def vjp(self, g):
        return (kernels.gelu_backward(g, self.a),)

    def jvp(self, ta):
        return kernels.gelu_backward(ta, self.a)  # elementwise: J is diagonal


class Cast(Op):
    """z = a converted to another dtype. The gradient converts back.

    A cast to an integer or boolean dtype has no gradient: the tape does not
    record it (`engine.tensor.apply` drops every integer result from the
    graph), so the result does not require grad."""
    name = "cast"

    def forward(self, a, dtype):
        self.in_dtype, self.out_dtype = a.dtype, np.dtype(dtype)
        return a.astype(dtype)

    def vjp(self, g):
        return (g.astype(self.in_dtype),)

    def jvp(self, ta):
        return ta.astype(self.out_dtype)


# ============================================================== reductions
class Sum(Op):
    """z = sum of a over `axis`.  Every summed element gets the same gradient:
    the backward broadcasts g back to a's shape."""
    name = "sum"

    def forward(self, a, axis=None, keepdims=False):
        self.in_shape = a.shape
        self.axes = _normalize_axes(axis, a.ndim, self.name)
        self.keepdims = keepdims
        return np.sum(a, axis=self.axes, keepdims=keepdims)

    def _expand(self, g):
        if not self.keepdims:
            g = np.expand_dims(g, self.axes)
        return np.broadcast_to(g, self.in_shape)

    def vjp(self, g):
        return (self._expand(g),)

    def jvp(self, ta):
        return np.sum(ta, axis=self.axes, keepdims=self.keepdims)


class Mean(Sum):
    """z = mean of a over `axis` = sum / n.  dz/da = 1/n for every element."""
    name = "mean"

    def forward(self, a, axis=None, keepdims=False):
        total = super().forward(a, axis, keepdims)
        self.count = int(np.prod([a.shape[i] for i in self.axes]))
        if self.count == 0:
            raise ShapeError(f"mean: the axes {self.axes} of shape {a.shape} hold no "
                             f"elements, so the mean is undefined; use sum() instead")
        return total / self.count

    def vjp(self, g):
        return (self._expand(g / self.count),)

    def jvp(self, ta):
        return np.sum(ta, axis=self.axes, keepdims=self.keepdims) / self.count


# ===================================================== shapes and indexing
class Reshape(Op):
    """Same numbers, new shape: the gradient is reshaped back. Nothing saved."""
    name = "reshape"

    def forward(self, a, shape):
        self.in_shape = a.shape
        try:
            out = a.reshape(shape)
        except ValueError:
            raise ShapeError(f"reshape: cannot reshape {a.shape} ({a.size} elements) into "
                             f"{tuple(shape)}; the number of elements must stay the same") \
                from None
        self.out_shape = out.shape
        self.is_view = np.may_share_memory(out, a)
        return out

    def vjp(self, g):
        return (g.reshape(self.in_shape),)

    def jvp(self, ta):
        return ta.reshape(self.out_shape)


class Transpose(Op):
    """Permute axes: the gradient is permuted back with the inverse permutation."""
    name = "transpose"

    def forward(self, a, axes):
        if sorted(axes) != list(range(a.ndim)):
            raise ShapeError(f"transpose: {tuple(axes)} is not a permutation of the "
                             f"{a.ndim} axes of a tensor of shape {a.shape}")
        self.axes = tuple(axes)
        self.inverse = tuple(np.argsort(axes))
        self.is_view = True
        return np.transpose(a, self.axes)

    def vjp(self, g):
        return (np.transpose(g, self.inverse),)

    def jvp(self, ta):
        return np.transpose(ta, self.axes)


def _is_advanced(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, (list, np.ndarray)) for p in parts)


class GetItem(Op):
    """z = a[index] (slices, integers, integer or boolean arrays).

    Backward: a zero array of a's shape receives g at the indexed places.
    Integer-array indices may repeat a position, so those use np.add.at,
    which adds the repeats instead of keeping only one.
    Saves a private copy of each index array (`index0`, ...): the caller's
    array, or an index Tensor, may change after the forward."""
    name = "getitem"

    def forward(self, a, index):
        self.in_shape = a.shape
        self.advanced = _is_advanced(index)
        try:
            out = a[index]
        except IndexError as exc:
            raise IndexError(f"getitem: index {index!r} does not fit a tensor of shape "
                             f"{a.shape}: {exc}") from None
        self.is_view = not self.advanced
        self.is_tuple = isinstance(index, tuple)
        # (saved, part) per index part: slices, integers and None are immutable
        self.parts = []
        for i, part in enumerate(index if self.is_tuple else (index,)):
            if isinstance(part, (list, np.ndarray)) and any(self.needs):
                self.save(**{f"index{i}": np.array(part)})
                self.parts.append((True, f"index{i}"))
            else:
                self.parts.append((False, part))
        return out

    def _index(self):
        parts = tuple(getattr(self, p) if saved else p for saved, p in self.parts)
        return parts if self.is_tuple else parts[0]

    def vjp(self, g):
        grad = np.zeros(self.in_shape, dtype=g.dtype)
        if self.advanced:
            np.add.at(grad, self._index(), g)
        else:
            grad[self._index()] = g
        return (grad,)

    def jvp(self, ta):
        return ta[self._index()]


# ================================================================= matmul
class MatMul(Op):
    """z = a @ b, with numpy's rules: batched over leading axes, broadcast.

    dz/da: g @ b^T;  dz/db: a^T @ g  (two matmuls, each the size of the
    forward one; the shapes check themselves). Batch axes that were
    broadcast are summed, like any broadcast."""
    name = "matmul"

    def forward(self, a, b):
        if a.ndim == 0 or b.ndim == 0:
            raise ShapeError(f"matmul: needs tensors with at least one axis, got shapes "
                             f"{a.shape} and {b.shape}; use * for a scalar product")
        k_a, k_b = a.shape[-1], b.shape[0] if b.ndim == 1 else b.shape[-2]
        if k_a != k_b:
            raise ShapeError(
                f"matmul: shapes {a.shape} and {b.shape} do not fit: the last axis of the "
                f"first ({k_a}) must equal the {'only' if b.ndim == 1 else 'second-to-last'} "
                f"axis of the second ({k_b}). Check which operand needs a transpose (.T)")
        self.shapes = a.shape, b.shape
        if self.needs[0]:
            self.save(b=b)
        if self.needs[1]:
            self.save(a=a)
        if b.ndim == 2 and a.ndim > 2:
            # (…, K) @ (K, N): one big 2-D product instead of a loop over batches.
            return (a.reshape(-1, k_a) @ b).reshape(a.shape[:-1] + (b.shape[1],))
        return np.matmul(a, b)

    def vjp(self, g):
        (sa, sb), ga, gb = self.shapes, None, None
        if self.needs[0]:
            b = self.b
            if len(sb) == 1:                      # a @ v: z[..., i] = sum_k a[..., i, k] v[k]
                ga = g[..., None] * b
            elif len(sa) == 1:                    # v @ B: treat v as a row
                ga = np.matmul(g[..., None, :], np.swapaxes(b, -1, -2))[..., 0, :]
            else:
                ga = np.matmul(g, np.swapaxes(b, -1, -2))
            ga = unbroadcast(ga, sa)
        if self.needs[1]:
            a = self.a
            if len(sb) == 2 and len(sa) >= 2:     # weights of a linear layer: one 2-D product
                gb = a.reshape(-1, sa[-1]).T @ g.reshape(-1, sb[-1])
            elif len(sb) == 1:
                gb = unbroadcast(np.matmul(np.swapaxes(a, -1, -2), g[..., None])[..., 0], sb) \
                    if len(sa) > 1 else g * a
            elif len(sa) == 1:
                gb = unbroadcast(a[:, None] * g[..., None, :], sb)
            else:
                gb = unbroadcast(np.matmul(np.swapaxes(a, -1, -2), g), sb)
        return ga, gb

    def jvp(self, ta, tb):
        return _sum_terms(None if ta is None else np.matmul(ta, self.b),
                          None if tb is None else np.matmul(self.a, tb))


# ============================================================ softmax & loss
def _refuse_empty(op: str, what: str, shape: tuple) -> None:
    """Normalising ops (softmax, layer norm, attention) need at least one element."""
    if 0 in shape:
        empty = ", ".join(f"axis {i}" for i, n in enumerate(shape) if n == 0)
        raise ShapeError(
            f"{op}: {what} shape {shape}, which holds no elements ({empty} has length 0), "
            f"so there is nothing to normalise. An empty batch, a sequence of length 0 or a "
            f"slice past the end usually causes this: check the shape of what you pass in")


def _softmax_axis(op: str, x: np.ndarray, axis) -> int:
    """The axis to normalise, checked: one integer in range, on a non-empty input."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{op}: axis must be one integer (the axis to normalise), got "
                        f"{axis!r}; the classes are usually the last axis, axis=-1")
    if x.ndim == 0:
        raise ShapeError(f"{op}: the input is a single number (shape ()), so it has no axis "
                         f"to normalise; give it one, e.g. x.reshape(1)")
    if not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"{op}: axis {axis} is out of range for a tensor of shape {x.shape} "
                         f"(valid: {-x.ndim}..{x.ndim - 1}); the classes are usually the last "
                         f"axis, axis=-1")
    _refuse_empty(op, "the input has", x.shape)
    return int(axis)


def _rows(a, axis):
    """View `a` with `axis` moved last and flattened to 2-D rows (for kernels)."""
    moved = np.moveaxis(a, axis, -1)
    return moved.reshape(-1, moved.shape[-1]), moved.shape


def _unrows(a2, moved_shape, axis):
    return np.moveaxis(a2.reshape(moved_shape), -1, axis)


class _AlongAxis(Op):
    """An op on whole rows along `axis` (softmax, log-softmax): the rows are moved
    last for the row kernels `kernels.<kernel>_forward` and `_backward`, then back.
    Saves its output, which is all either backward needs."""
    kernel = ""

    def forward(self, x, axis=-1):
        self.axis = axis = _softmax_axis(self.name, x, axis)
        x2, self.moved = _rows(x, axis)
        out = _unrows(getattr(kernels, f"{self.kernel}_forward")(x2), self.moved, axis)
        self.save(out=out)
        return out

    def vjp(self, g):
        g2, _ = _rows(g, self.axis)
        y2, _ = _rows(self.out, self.axis)
        dx = getattr(kernels, f"{self.kernel}_backward")(g2, y2)
        return (_unrows(dx, self.moved, self.axis),)


class Softmax(_AlongAxis):
    """y = exp(x) / sum(exp(x)) along `axis`.  VJP: y * (g - sum(g * y)).
    Saves its output y."""
    name = "softmax"
    kernel = "softmax"

    def jvp(self, t):  # the softmax Jacobian is symmetric, so J t = J^T t
        return self.vjp(t)[0]


class LogSoftmax(_AlongAxis):
    """y = x - log(sum(exp(x))) along `axis`.  VJP: g - exp(y) * sum(g)."""
    name = "log_softmax"
    kernel = "log_softmax"

    def jvp(self, t):  # J t = t - sum(softmax * t)
        p = np.exp(self.out)
        return t - (p * t).sum(axis=self.axis, keepdims=True)


def _as_index_array(op: str, what: str, values, size: int | None = None) -> np.ndarray:
    """Integer ids or targets as a fresh int64 array, with errors a person can act on.

    A copy, so a later change to the caller's array cannot change the graph."""
    arr = np.asarray(values)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(
            f"{op}: {what} must be integers (class or token indices), got dtype {arr.dtype}"
            f" with shape {arr.shape}. Convert them with .astype(np.int64)"
            + (" (and check you did not pass the probabilities or one-hot rows)"
               if np.issubdtype(arr.dtype, np.floating) else ""))
    arr = np.array(arr, dtype=np.int64, copy=True)
    if size is not None and arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= size:
            bad = lo if lo < 0 else hi
            raise IndexError(f"{op}: {what} contain {bad}, outside the valid range "
                             f"0..{size - 1} (there are {size} rows/classes)")
    return arr


class CrossEntropy(Op):
    """loss = mean over tokens of -log softmax(logits)[target].

    logits (..., V) and integer targets (...). Computed through the
    log-sum-exp with the row max subtracted, so large logits do not overflow.
    Saves the probabilities and the targets; the VJP is
    (probs - onehot(targets)) * g / N."""
    name = "cross_entropy"

    def forward(self, logits, targets):
        if logits.ndim < 1:
            raise ShapeError("cross_entropy: logits need a class axis, got a scalar")
        V = logits.shape[-1]
        targets = _as_index_array(self.name, "targets", targets, V)
        if targets.shape != logits.shape[:-1]:
            raise ShapeError(
                f"cross_entropy: logits of shape {logits.shape} need targets of shape "
                f"{logits.shape[:-1]} (one class index per row), got {targets.shape}")
        self.in_shape = logits.shape
        self.count = targets.size
        if self.count == 0:
            raise ShapeError(f"cross_entropy: no targets (logits of shape {logits.shape})")
        losses, probs = kernels.cross_entropy_forward(logits.reshape(-1, V), targets.reshape(-1))
        self.save(probs=probs, targets=targets.reshape(-1))
        return np.asarray(losses.mean(), dtype=logits.dtype)

    def vjp(self, g):
        d = kernels.cross_entropy_backward(self.probs, self.targets, float(g) / self.count)
        return (d.reshape(self.in_shape), None)

    def jvp(self, t, _):
        t2 = t.reshape(self.probs.shape)
        picked = t2[np.arange(self.count), self.targets]
        return np.asarray(((self.probs * t2).sum(axis=1) - picked).mean(), dtype=t.dtype)


# ============================================================== layer norm
class LayerNorm(Op):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the last axis.

    Saves xhat (the normalised x, x's shape), rstd = 1/sqrt(var + eps) (one
    number per row) and, when x needs a gradient, a reference to weight.
    VJP: dx = rstd * (g w - mean(g w) - xhat * mean(g w xhat)),
    dweight = sum of g * xhat, dbias = sum of g (over all rows)."""
    name = "layer_norm"

    def forward(self, x, weight, bias, eps=1e-5):
        if x.ndim == 0:
            raise ShapeError("layer_norm: x is a single number (shape ()); layer norm "
                             "normalises the last axis, so x needs at least one axis")
        _refuse_empty(self.name, "the input x has", x.shape)
        C = x.shape[-1]
        for what, p in (("weight", weight), ("bias", bias)):
            if p is not None and _shape(p) != (C,):
                raise ShapeError(f"layer_norm: {what} has shape {_shape(p)} but x has shape "
                                 f"{x.shape}; {what} must have shape ({C},), one value per "
                                 f"feature of the last axis")
        self.has_weight, self.has_bias = weight is not None, bias is not None
        w = weight if weight is not None else np.ones(C, dtype=x.dtype)
        b = bias if bias is not None else np.zeros(C, dtype=x.dtype)
        out, xhat, rstd = kernels.layer_norm_xhat_forward(x.reshape(-1, C), w, b, eps)
        self.save(xhat=xhat.reshape(x.shape), rstd=rstd.reshape(x.shape[:-1]))
        if self.needs[0] and weight is not None:
            self.save(weight=weight)
        return out.reshape(x.shape)

    def _weight(self, like):
        return self.weight if self.has_weight else np.ones(like.shape[-1], dtype=like.dtype)

    def vjp(self, g):
        C = g.shape[-1]
        # weight was saved only if dx is wanted; dw and db never need it
        w = self._weight(g) if self.needs[0] else np.ones(C, dtype=g.dtype)
        dx, dw, db = kernels.layer_norm_xhat_backward(g.reshape(-1, C), self.xhat.reshape(-1, C),
                                                 self.rstd.reshape(-1), w)
        return (dx.reshape(g.shape) if self.needs[0] else None,
                dw if self.needs[1] else None,
                db if self.needs[2] else None)

    def jvp(self, tx, tw, tb):
        xhat, rstd = self.xhat, self.rstd[..., None]
        out = None
        if tx is not None:
            dxhat = rstd * (tx - tx.mean(axis=-1, keepdims=True)
                            - xhat * (tx * xhat).mean(axis=-1, keepdims=True))
            out = dxhat * self._weight(tx)
        return _sum_terms(out, None if tw is None else xhat * tw, tb)


# =============================================================== embedding
class Embedding(Op):
    """out[..., :] = table[ids[...], :] (a gather).

    Backward is the transpose of a gather, a scatter-add: row v of the
    table's gradient is the sum of g over the positions whose id is v, added
    in position order, so the result is bitwise the same every run and for
    any number of threads. Rows no id touched get exactly zero.
    Saves the ids (a private int64 copy)."""
    name = "embedding"

    def forward(self, ids, table):
        if table.ndim != 2:
            raise ShapeError(f"embedding: the table must be 2-D (vocab, dim), got shape "
                             f"{table.shape}")
        ids = _as_index_array(self.name, "ids", ids, table.shape[0])
        self.table_shape = table.shape
        self.save(ids=ids)
        return table[ids]

    def vjp(self, g):
        V, C = self.table_shape
        return (None, kernels.embedding_table_grad(self.ids.reshape(-1), g.reshape(-1, C), V))

    def jvp(self, _, ttable):
        return ttable[self.ids]


# ======================================================== causal attention
class CausalAttention(Op):
    """out = softmax(q k^T / sqrt(D), future masked) v, for every head.

    q, k, v: (..., T, D), e.g. (B, H, T, D); every leading axis (batch,
    heads) is independent. Position t attends to positions 0..t only.
    Saves q, k, v (the inputs, as given) and the attention probabilities
    att (..., T, T): the T x T term of activation memory.
    VJP: dv = att^T g; datt = g v^T; ds = att * (datt - rowsum(datt * att));
    dq = ds k / sqrt(D); dk = ds^T q / sqrt(D)."""
    name = "causal_attention"

    def forward(self, q, k, v):
        if not (q.shape == k.shape == v.shape) or q.ndim < 2:
            raise ShapeError(
                f"causal_attention: q, k and v must have the same shape (..., T, D), e.g. "
                f"(batch, heads, T, head_size); got q {q.shape}, k {k.shape}, v {v.shape}")
        _refuse_empty(self.name, "q, k and v have", q.shape)
        self.shape = q.shape
        T, D = q.shape[-2:]
        self.scale = 1.0 / np.sqrt(D)
        flat = (-1, T, D)
        out, att = kernels.attention_probs_forward(q.reshape(flat), k.reshape(flat),
                                             v.reshape(flat), self.scale)
        self.save(q=q, k=k, v=v, att=att.reshape(q.shape[:-1] + (T,)))
        return out.reshape(q.shape)

    def vjp(self, g):
        T, D = self.shape[-2:]
        flat = (-1, T, D)
        dq, dk, dv = kernels.attention_probs_backward(
            g.reshape(flat), self.q.reshape(flat), self.k.reshape(flat),
            self.v.reshape(flat), self.att.reshape(-1, T, T), self.scale)
        return tuple(d.reshape(self.shape) if need else None
                     for d, need in zip((dq, dk, dv), self.needs))

    def jvp(self, tq, tk, tv):
        att, sc = self.att, self.scale
        kT = np.swapaxes(self.k, -1, -2)
        ds = _sum_terms(None if tq is None else np.matmul(tq, kT) * sc,
                        None if tk is None else np.matmul(self.q, np.swapaxes(tk, -1, -2)) * sc)
        out = None
        if ds is not None:
            datt = att * (ds - (ds * att).sum(axis=-1, keepdims=True))  # masked: att = 0
            out = np.matmul(datt, self.v)
        return _sum_terms(out, None if tv is None else np.matmul(att, tv))


# ================================================================= dropout
class Dropout(Op):
    """out = x * mask / (1 - p), mask[i] = 1 with probability 1 - p.

    The mask comes from numpy's generator seeded with `seed`, so the same
    seed gives the same mask: gradient checks and reruns are deterministic.
    Saves the boolean mask (1 byte per element)."""
    name = "dropout"

    def forward(self, x, p, seed):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout: p={p} must be in [0, 1) (the probability of "
                             f"zeroing an element)")
        if seed is None or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"dropout: seed must be an integer (got {seed!r}); a fixed "
                            f"seed makes the mask, and so the gradient, reproducible")
        self.keep_scale = 1.0 / (1.0 - p)
        mask = np.random.default_rng(int(seed)).random(x.shape) >= p
        self.save(mask=mask)
        return x * mask * np.asarray(self.keep_scale, dtype=x.dtype)

    def vjp(self, g):
        return (g * self.mask * np.asarray(self.keep_scale, dtype=g.dtype),)

    def jvp(self, t):
        return t * self.mask * np.asarray(self.keep_scale, dtype=t.dtype)
