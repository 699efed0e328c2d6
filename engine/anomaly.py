"""detect_anomaly(): stop at the first op whose output or gradient is NaN or Inf.

A NaN spreads: once one op makes it, every op after it passes it on, and
the loss only tells you *that* something broke. Inside
`with engine.detect_anomaly():` every op's output is checked as the forward
runs, and every gradient as the backward runs; the first non-finite one
raises an AnomalyError naming the op, where your code called it, and
whether its inputs were already non-finite (then the culprit is upstream,
for example in the data). The checks cost a pass over every array, so use
this to debug, not to train.
"""
from __future__ import annotations

import sys

import numpy as np

from .tensor import Tensor, TapeObserver, observe, op_label

# Frames of modules in these packages are the library's own; the first frame
# outside them is where the user's code called the op.
LIBRARY_PACKAGES = ("engine",)


class AnomalyError(FloatingPointError):
    """Raised inside detect_anomaly(); .op is the op's name, .phase 'forward' or 'backward'."""

    def __init__(self, message: str, op: str, phase: str):
        super().__init__(message)
        self.op, self.phase = op, phase


class _AnomalyObserver(TapeObserver):
    def before_forward(self, op) -> None:
        op.created_at = where_called()

    def after_forward(self, op, inputs, result, recorded) -> None:
        note_forward(op, inputs, result.data)

    def after_backward(self, node, g, grads, released) -> None:
        note_backward(node, g, grads)


class detect_anomaly:
    """Context manager: check every op's output and gradient for NaN/Inf."""

    def __enter__(self):
        self._watch = observe(_AnomalyObserver())
        self._watch.__enter__()
        return self

    def __exit__(self, *exc):
        self._watch.__exit__(*exc)


def is_library_frame(frame) -> bool:
    """True when the frame runs code of a module in LIBRARY_PACKAGES."""
    module = frame.f_globals.get("__name__", "")
    return any(module == p or module.startswith(p + ".") for p in LIBRARY_PACKAGES)


def where_called() -> str:
    """file:line of the first caller outside the library (the user's code)."""
    frame = sys._getframe(1)
    while frame is not None:
        if not is_library_frame(frame):
            return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "unknown location"


def _problem(a) -> str | None:
    """'NaN' or 'Inf' if the float array a holds one, else None."""
    a = np.asarray(a)
    if a.dtype.kind not in "fc" or np.isfinite(a).all():
        return None
    return "NaN" if np.isnan(a).any() else "Inf"


def _name(op) -> str:
    return op_label(op) if op.node_id is not None else op.name


def note_forward(op, inputs, out) -> None:
    bad = _problem(out)
    if bad is None:
        return
    where = op.created_at
    upstream = []
    for i, x in enumerate(inputs):
        data = x.data if isinstance(x, Tensor) else x
        p = _problem(data) if isinstance(data, np.ndarray) else None
        if p:
            label = getattr(x, "name", None) or f"input {i}"
            upstream.append(f"{label} already contained {p}")
    cause = ("; ".join(upstream) + ", so the problem is upstream of this op (check your "
             "data and parameters)") if upstream else \
        "its inputs were all finite, so this op made it (look for log of 0 or a negative " \
        "number, division by 0, exp of a large number, sqrt of a negative)"
    raise AnomalyError(f"detect_anomaly: the forward of {_name(op)} produced {bad} in its "
                       f"output of shape {np.shape(out)}, called at {where}. {cause}.",
                       op.name, "forward")


def note_backward(op, g, grads) -> None:
    for i, gi in enumerate(grads):
        if gi is None:
            continue
        bad = _problem(gi)
        if bad:
            incoming = _problem(g)
            cause = (f"the gradient arriving at it already held {incoming}" if incoming else
                     "the gradient arriving at it was finite, so its VJP made it (for "
                     "example 1/x at x = 0 in log, or a huge exp)")
            raise AnomalyError(
                f"detect_anomaly: the backward of {_name(op)} produced {bad} in the gradient "
                f"of its input {i} (shape {np.shape(gi)}); the op was called at "
                f"{op.created_at}. {cause}.",
                op.name, "backward")
