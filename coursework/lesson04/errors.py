"""04.2: the relative and absolute error of a gradient, with a floor. A wrong denominator
is judged by the lesson's three demands, each probed on pairs built for it, and the hint
names the demand it breaks and the pair that shows it, never the formula:

1. swapping the analytic and numerical gradient leaves the error alone;
2. the error reads as the fraction of the gradient that is wrong: 1% off gives 0.01, a
   gradient missing entirely (0 against a nonzero value) gives exactly 1;
3. a floor is the smallest denominator: two zeros, or a difference too small to measure,
   give a finite, small error, and the floor changes nothing above itself.
"""
from __future__ import annotations

import numpy as np

from .._core import ExerciseError, attempt, passed
from ..pieces import save_piece

EX_ERRORS = "04.2 (gradient_errors)"

_A = np.array([3.0, -2.0, 0.0, 1e-14, 1e3, -5e-7, 0.0])
_N = np.array([3.0000003, -1.0, 0.0, 0.0, 1e3 + 1e-5, -5.2e-7, 2e-13])


def _errors(a, n, floor):
    abs_err = np.abs(a - n)
    return abs_err / np.maximum(np.maximum(np.abs(a), np.abs(n)), floor), abs_err


def _relative(gradient_errors, a, n, floor):
    out = attempt(EX_ERRORS, gradient_errors, np.array(a, dtype=float),
                  np.array(n, dtype=float), floor)
    with np.errstate(all="ignore"):
        return np.asarray(out[0], dtype=float)


def _broken_demand(gradient_errors, floor) -> str | None:
    """The first of the three demands the learner's denominator breaks, with the pair that
    shows it; None when the probes find none."""
    def show(v):
        return np.array2string(np.asarray(v), precision=4, separator=", ")

    forward, swapped = (_relative(gradient_errors, _A, _N, floor),
                        _relative(gradient_errors, _N, _A, floor))
    if not np.allclose(forward, swapped, rtol=1e-9, atol=0, equal_nan=True):
        k = int(np.argmax(~np.isclose(forward, swapped, rtol=1e-9, atol=0)))
        return (f"demand 1 is broken: swapping the two gradients changes the error (analytic "
                f"{_A[k]:g}, numerical {_N[k]:g} gives {forward[k]:.4g}; the other way round "
                f"{swapped[k]:.4g}). The denominator favours one of the two.")
    one_percent = _relative(gradient_errors, [1.0, 1e3, -2.0], [1.01, 1.01e3, -1.98], floor)
    if not np.all(np.abs(one_percent - 0.01) <= 1.5e-4):
        return (f"demand 2 is broken: gradients 1% apart (1 and 1.01, 1000 and 1010, -2 and "
                f"-1.98) give {show(one_percent)}, not about 0.01. The error must read as the "
                f"fraction of the gradient that is wrong.")
    missing = _relative(gradient_errors, [3.0, 0.0], [0.0, -1e3], floor)
    if not np.allclose(missing, 1.0, rtol=1e-9, atol=0):
        return (f"demand 2 is broken: a gradient missing entirely (3 against 0, 0 against "
                f"-1000) gives {show(missing)}, where all of it is wrong, exactly 1. Near 1% "
                f"your denominator looks right; far apart it is not the size of the gradient.")
    tiny = _relative(gradient_errors, [0.0, 1e-14], [0.0, 0.0], floor)
    if not (np.all(np.isfinite(tiny)) and tiny[0] == 0.0 and tiny[1] <= 1e-14 / floor * 1.0001):
        return (f"demand 3 is broken: two exact zeros, and 1e-14 against 0, give "
                f"{show(tiny)}: a NaN, or a large error for a difference no one could "
                f"measure. A floor keeps the denominator from going below it.")
    given = _relative(gradient_errors, [1e-3, 1.0], [0.0, 1.01], 0.5)
    if not np.allclose(given, [1e-3 / 0.5, 0.01 / 1.01], rtol=1e-9, atol=0):
        return (f"demand 3 is broken for the floor you are given: with floor=0.5, the pairs "
                f"(0.001, 0) and (1, 1.01) give {show(given)}. Below the floor the denominator "
                f"is the floor itself (read the `floor` argument); above it the floor must "
                f"change nothing.")
    return None


def check_gradient_errors(gradient_errors) -> None:
    """rel = |a - n| / max(|a|, |n|, floor) and abs = |a - n|, element-wise."""
    floor = 1e-10
    out = attempt(EX_ERRORS, gradient_errors, _A.copy(), _N.copy(), floor)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ExerciseError(EX_ERRORS, f"return the pair (relative, absolute), got {type(out).__name__}"
                                       f"{'' if not hasattr(out, '__len__') else f' of length {len(out)}'}.")
    with np.errstate(all="ignore"):
        rel, ab = (np.asarray(v, dtype=float) for v in out)
    want_rel, want_abs = _errors(_A, _N, floor)
    for name, got in (("relative", rel), ("absolute", ab)):
        if got.shape != _A.shape:
            raise ExerciseError(EX_ERRORS, f"the {name} error has shape {got.shape}; expected one "
                                           f"value per element, shape {_A.shape}.")
    if np.any(rel < 0) or np.any(ab < 0):
        raise ExerciseError(EX_ERRORS, "an error came out negative: take the absolute value "
                                       "|a - n| (np.abs) before dividing.")
    if not np.allclose(ab, want_abs, rtol=1e-12, atol=0):
        k = int(np.argmax(np.where(np.isclose(ab, want_abs, rtol=1e-12, atol=0), 0, 1)))
        raise ExerciseError(EX_ERRORS, f"the absolute error differs at element {k} (analytic "
                                       f"{_A[k]:g}, numerical {_N[k]:g}): yours is {ab[k]:.6g}, "
                                       f"the reference's {want_abs[k]:.6g}.")
    broken = _broken_demand(gradient_errors, floor)
    if broken is None and np.allclose(rel, want_rel, rtol=1e-9, atol=0):
        save_piece("gradient_errors", gradient_errors, EX_ERRORS)
        passed(EX_ERRORS, f"relative error with floor {floor:g}, absolute error alongside.")
        return
    if broken is None:
        k = int(np.nanargmax(np.where(np.isfinite(rel), np.abs(rel - want_rel), np.inf)))
        broken = (f"no demand is broken on the check's probes, yet at element {k} (analytic "
                  f"{_A[k]:g}, numerical {_N[k]:g}) your relative error is {rel[k]:.6g}, "
                  f"expected {want_rel[k]:.6g}. Work out by hand what each demand asks of "
                  f"the denominator for that pair.")
    raise ExerciseError(EX_ERRORS, broken)
