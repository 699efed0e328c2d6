"""Forward mode: push a tangent through the same ops, alongside the values.

    out, tangent = engine.jvp(fn, inputs, tangents)

computes fn(*inputs) and the directional derivative J(inputs) @ tangents in
one forward pass, using each rule's `jvp` (engine/rules.py). One pass gives
the derivative of *every output* along *one input direction*: cheap when
there are few inputs and many outputs. Reverse mode (backward) is the
opposite trade: one pass gives the derivative of *one output* with respect
to *every input*, which is why a loss (one number, many parameters) is
differentiated backwards.
"""
from __future__ import annotations

import numpy as np

from .tensor import Tensor, no_grad


def jvp(fn, inputs, tangents):
    """Return (fn(*inputs), the output's tangent) as ndarrays.

    inputs: a sequence of arrays or Tensors; tangents: one array per input
    (same shape; None for an input held fixed). The tape is not used, so no
    memory is kept for backward. If fn returns a tuple, both results are tuples."""
    inputs, tangents = list(inputs), list(tangents)
    if len(inputs) != len(tangents):
        raise ValueError(f"jvp: {len(inputs)} inputs but {len(tangents)} tangents; give one "
                         f"tangent per input (None to hold an input fixed)")
    wrapped = []
    for i, (x, t) in enumerate(zip(inputs, tangents)):
        x = x if isinstance(x, Tensor) else Tensor(x)
        primal = Tensor._from_op(x.data, False)  # a fresh handle: the caller's tensor is untouched
        primal.name = x.name
        if t is not None:
            t = np.asarray(t.data if isinstance(t, Tensor) else t, dtype=x.dtype)
            if t.shape != x.shape:
                raise ValueError(f"jvp: tangent {i} has shape {t.shape} but input {i} has "
                                 f"shape {x.shape}")
            primal._tangent = t
        wrapped.append(primal)
    with no_grad():
        out = fn(*wrapped)

    def split(y):
        if not isinstance(y, Tensor):
            raise TypeError(f"jvp: fn must return Tensors, got {type(y).__name__}")
        tangent = y._tangent if y._tangent is not None else np.zeros_like(y.data)
        return y.data, np.array(tangent)

    if isinstance(out, tuple):
        pairs = [split(y) for y in out]
        return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    return split(out)
