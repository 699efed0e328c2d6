"""04.2: the relative and absolute error of a gradient, with a floor; a missing floor,
a sum or a single gradient in the denominator is named."""
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
        raise ExerciseError(EX_ERRORS, f"absolute error {ab} should be |a - n| = {want_abs}.")
    if not np.all(np.isfinite(rel)):
        bad = int(np.flatnonzero(~np.isfinite(rel))[0])
        raise ExerciseError(
            EX_ERRORS, f"relative error is {rel[bad]} where the analytic gradient is {_A[bad]} and "
                       f"the numerical one {_N[bad]}: 0/0 with no floor. Hint: divide by "
                       f"max(|a|, |n|, floor), so near-zero gradients give a finite number.")
    if np.allclose(rel, want_rel, rtol=1e-9, atol=0):
        save_piece("gradient_errors", gradient_errors, EX_ERRORS)
        passed(EX_ERRORS, f"relative error with floor {floor:g}, absolute error alongside.")
        return
    with np.errstate(all="ignore"):
        no_floor = want_abs / np.maximum(np.abs(_A), np.abs(_N))
        sum_den = want_abs / np.maximum(np.abs(_A) + np.abs(_N), floor)
        a_only = want_abs / np.maximum(np.abs(_A), floor)
        n_only = want_abs / np.maximum(np.abs(_N), floor)
    k = int(np.argmax(np.abs(rel - want_rel)))
    if np.isclose(rel[3], 1.0) or np.allclose(rel, np.nan_to_num(no_floor, nan=0.0)):
        hint = (f"the gradients {_A[3]:g} (analytic) and {_N[3]:g} (numerical) differ by only "
                f"{want_abs[3]:g} but your relative error is {rel[3]:.3g}: there is no floor. "
                f"Divide by max(|a|, |n|, floor).")
    elif np.allclose(rel, sum_den, rtol=1e-9):
        hint = "you divide by |a| + |n|; use the larger of the two: max(|a|, |n|, floor)."
    elif np.allclose(rel, a_only, rtol=1e-9) or np.allclose(rel, n_only, rtol=1e-9):
        hint = ("you divide by one gradient only; use the larger of the two, max(|a|, |n|, "
                "floor), so the error does not depend on which one you call the reference.")
    else:
        hint = "rel = |a - n| / max(|a|, |n|, floor), element by element (np.maximum)."
    raise ExerciseError(EX_ERRORS, f"relative error at element {k} (analytic {_A[k]:g}, numerical "
                                   f"{_N[k]:g}) is {rel[k]:.6g}, expected {want_rel[k]:.6g}. "
                                   f"Hint: {hint}")
