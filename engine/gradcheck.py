"""gradcheck: compare backward's gradients with central differences.

For an input element x_i the numerical derivative is

    (L(x_i + eps) - L(x_i - eps)) / (2 eps)

computed with the forward only, so it shares nothing with the VJP being
checked. Each element is judged by

    absolute error  |analytic - numeric|
    relative error  |analytic - numeric| / max(|analytic|, |numeric|, floor)

The floor keeps the relative error meaningful when both numbers are near
zero (there a tiny absolute difference would otherwise look huge). An
element passes when its relative error is at most rtol or its absolute
error at most atol.

Details that make the check trustworthy: everything runs in float64 by
default (a difference of two nearly equal losses loses half the digits in
float32); a non-scalar output is reduced to L = sum(out * R) with a fixed
random R, which checks the VJP for a generic upstream gradient; random ops
must be seeded so both evaluations see the same function; kinks (relu at 0)
are avoided by the caller. For big inputs, `samples=k` checks k random
elements per input instead of all.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .tensor import Tensor, no_grad


class GradcheckError(AssertionError):
    """Raised by gradcheck when an element fails; .report holds the details."""

    def __init__(self, report: "GradcheckReport"):
        super().__init__(str(report))
        self.report = report


@dataclass
class GradcheckReport:
    ok: bool
    worst_input: int          # which input holds the worst element
    worst_name: str           # its name (the tensor's name, or "input k")
    worst_index: tuple        # the element's index in that input
    analytic: float           # backward's value there
    numeric: float            # the central difference there
    abs_error: float
    rel_error: float
    max_abs_error: float      # over every checked element
    max_rel_error: float
    checked: int              # how many elements were compared
    eps: float
    rtol: float
    atol: float
    floor: float
    per_input: list = field(default_factory=list)  # dicts: name, checked, max errors

    def __str__(self) -> str:
        verdict = "passed" if self.ok else "FAILED"
        return (f"gradcheck {verdict}: {self.checked} elements checked (eps={self.eps:g}, "
                f"rtol={self.rtol:g}, atol={self.atol:g}, floor={self.floor:g}); worst element "
                f"{self.worst_name}{list(self.worst_index)}: backward {self.analytic:.10g}, "
                f"numerical {self.numeric:.10g}, abs error {self.abs_error:.3g}, rel error "
                f"{self.rel_error:.3g}")


def relative_error(analytic, numeric, floor: float = 1e-8):
    """|a - n| / max(|a|, |n|, floor), element by element.

    The floor keeps the ratio finite where both gradients are zero; without it
    0/0 gives NaN, and a tiny gradient gives a huge ratio for a harmless
    absolute difference."""
    a, n = np.asarray(analytic, dtype=np.float64), np.asarray(numeric, dtype=np.float64)
    return np.abs(a - n) / np.maximum(np.maximum(np.abs(a), np.abs(n)), floor)


def _checked_arguments(inputs, wrt, dtype) -> tuple[list, list[int]]:
    """fn's arguments (a fresh Tensor in `dtype` per floating input; integer inputs as
    given) and the indices of the inputs whose gradients are checked."""
    args, checked_inputs = [], []
    for i, x in enumerate(inputs):
        data = x.data if isinstance(x, Tensor) else np.asarray(x)
        if not np.issubdtype(data.dtype, np.floating):
            args.append(x)
            continue
        wants = wrt is None or i in wrt
        name = (x.name if isinstance(x, Tensor) else None) or f"input {i}"
        if wants and data.size == 0:
            label = f"'{x.name}'" if isinstance(x, Tensor) and x.name else name
            raise ValueError(
                f"gradcheck: {label} has shape {data.shape}, no elements, so there is "
                f"nothing to check. Pass a non-empty input, or leave this one out of the "
                f"check with wrt=[...] (the indices of the inputs to check)")
        args.append(Tensor(data, requires_grad=wants, dtype=dtype, name=name))
        if wants:
            checked_inputs.append(i)
    if not checked_inputs:
        raise ValueError("gradcheck: no floating-point input to check; pass the inputs as "
                         "float arrays (integer ids and targets are not differentiable)")
    return args, checked_inputs


def gradcheck(fn, inputs, eps: float = 1e-6, rtol: float = 1e-6, atol: float = 1e-10,
              floor: float = 1e-8, samples: int | None = None, seed: int = 0,
              dtype=np.float64, wrt=None, raise_on_failure: bool = True) -> GradcheckReport:
    """Check the gradients of fn(*inputs) against central differences.

    fn: takes Tensors (one per input), returns a Tensor.
    inputs: arrays or Tensors. Floating inputs are copied to `dtype`; integer
        inputs (ids, targets) are passed through unchanged.
    wrt: indices of the inputs to check (default: every floating input); the
        others are held fixed.
    samples: None checks every element; k checks k random elements per input.
    raise_on_failure: raise GradcheckError (carrying the report) on failure;
        if False, return the report either way.
    """
    if samples is not None and (isinstance(samples, bool) or not isinstance(
            samples, (int, np.integer)) or samples < 1):
        raise ValueError(f"gradcheck: samples={samples!r} must be a whole number, at least 1 "
                         f"(elements checked per input), or None to check every element")
    rng = np.random.default_rng(seed)
    args, checked_inputs = _checked_arguments(inputs, wrt, dtype)
    out = fn(*args)
    if not isinstance(out, Tensor):
        raise TypeError(f"gradcheck: fn must return a Tensor, got {type(out).__name__}")
    if out.size == 0:
        raise ValueError(f"gradcheck: fn returned a tensor of shape {out.shape}, which holds "
                         f"no elements, so every gradient is trivially zero and nothing would "
                         f"be compared; check the function (a slice past the end?)")
    # A fixed random upstream gradient makes one scalar L = sum(out * R).
    R = None if out.size == 1 else rng.standard_normal(out.shape).astype(dtype)

    def scalar_loss() -> float:
        with no_grad():
            y = fn(*args).data
        return float(y.sum() if R is None else (y.astype(np.float64) * R).sum())

    for i in checked_inputs:
        args[i].zero_grad()
    out.backward(None if R is None else R)

    rows, per_input = [], []
    for i in checked_inputs:
        t = args[i]
        analytic = t.grad if t.grad is not None else np.zeros_like(t.data)
        flat = np.arange(t.size)
        if samples is not None and samples < t.size:
            flat = rng.choice(t.size, size=samples, replace=False)
        worst = (0.0, 0.0)
        for k in flat:
            idx = np.unravel_index(k, t.shape) if t.ndim else ()
            original = t.data[idx].copy()
            t.data[idx] = original + eps
            plus = scalar_loss()
            t.data[idx] = original - eps
            minus = scalar_loss()
            t.data[idx] = original
            numeric = (plus - minus) / (2 * eps)
            a = float(analytic[idx])
            abs_err = abs(a - numeric)
            rel_err = float(relative_error(a, numeric, floor))
            rows.append((i, t.name, tuple(int(j) for j in idx), a, numeric, abs_err, rel_err))
            worst = (max(worst[0], abs_err), max(worst[1], rel_err))
        per_input.append({"input": i, "name": t.name, "checked": len(flat),
                          "max_abs_error": worst[0], "max_rel_error": worst[1]})

    def failing(row):
        return not (row[6] <= rtol or row[5] <= atol)

    # The worst element: a failing one if any, the one with the largest relative error.
    worst = max(rows, key=lambda r: (failing(r), r[6], r[5]))
    report = GradcheckReport(
        ok=not any(failing(r) for r in rows), worst_input=worst[0], worst_name=worst[1],
        worst_index=worst[2], analytic=worst[3], numeric=worst[4], abs_error=worst[5],
        rel_error=worst[6], max_abs_error=max(r[5] for r in rows),
        max_rel_error=max(r[6] for r in rows), checked=len(rows), eps=eps, rtol=rtol,
        atol=atol, floor=floor, per_input=per_input)
    if not report.ok and raise_on_failure:
        raise GradcheckError(report)
    return report
