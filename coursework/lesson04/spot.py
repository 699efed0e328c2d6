"""04.3: spot checks on random indices, drawn from a seed; an element passes when its
absolute error is below atol OR its relative error below rtol."""
from __future__ import annotations

import numpy as np

from .._core import ExerciseError, attempt, passed
from .._restore import check_restored
from ..pieces import save_piece
from ._common import _central, _forward
from .errors import _errors

EX_SPOT = "04.3 (spot_check)"


def _cube(x):
    return float(np.sum(x ** 3) + 0.5 * np.sum(np.sin(x)))


def _cube_grad(x):
    return 3 * x ** 2 + 0.5 * np.cos(x)


def _cube_x():
    return np.array([[0.4, -1.3, 0.9], [1.1, -0.2, 0.6]])


_TINY = np.array([[1.0, 1e-9, 0.7, 3e-10], [2e-9, -0.8, 1.3, 1e-10]])


def _tiny_x():
    return np.array([[0.0, 1.5, -0.5, 0.9], [0.8, 0.1, -1.2, 0.3]])


def _tiny(x):
    """Four elements with ordinary gradients and four with gradients near 1e-10,
    below the rounding noise u*|f|/eps ~ 1e-10 of a central difference."""
    return float(np.sum(_TINY * np.sin(x)) + 2.0)


def _tiny_grad(x):
    return _TINY * np.cos(x)


def _rows(exercise, out, x):
    """Read the learner's report as a list of (index, analytic, numeric, rel, abs, ok)."""
    if out is None or isinstance(out, (str, bytes, dict)) or not hasattr(out, "__len__"):
        raise ExerciseError(exercise, f"return a list with one row per checked element "
                                      f"(a Spot(index, analytic, numeric, rel_err, abs_err, ok)), "
                                      f"got {type(out).__name__}.")
    rows = []
    for r in out:
        try:
            if hasattr(r, "_fields") or not isinstance(r, (tuple, list)):
                vals = (r.index, r.analytic, r.numeric, r.rel_err, r.abs_err, r.ok)
            else:
                vals = tuple(r)
                if len(vals) != 6:
                    raise ValueError
        except (AttributeError, TypeError, ValueError):
            raise ExerciseError(exercise, f"each row should be Spot(index, analytic, numeric, "
                                          f"rel_err, abs_err, ok); got {r!r}.") from None
        index = vals[0]
        index = tuple(int(i) for i in np.atleast_1d(index))
        if len(index) != x.ndim or any(not 0 <= i < n for i, n in zip(index, x.shape)):
            raise ExerciseError(exercise, f"index {vals[0]!r} is not an element of an array of "
                                          f"shape {x.shape}; use a tuple like np.unravel_index "
                                          f"gives.")
        rows.append((index,) + tuple(float(v) for v in vals[1:5]) + (bool(vals[5]),))
    return rows


#: The step and the tolerances every call of the learner's spot_check is given.
_EPS, _RTOL, _ATOL = 1e-6, 1e-6, 1e-8


def _spot(spot_check, f, x, g, n_checks, seed):
    """The rows of the learner's report on f at x (x and g handed over as copies)."""
    return _rows(EX_SPOT, attempt(EX_SPOT, spot_check, f, x.copy(), g.copy(), n_checks, _EPS,
                                  _RTOL, _ATOL, seed), x)


def _check_row(index, a, n, rel, ab, ok, x, g) -> None:
    """One row of a correct gradient's report: the two values, their errors, ok."""
    if not np.isclose(a, g[index], rtol=1e-12):
        raise ExerciseError(EX_SPOT, f"at {index} the analytic value is {a:.10g}, but "
                                     f"analytic_grad{list(index)} is {g[index]:.10g}.")
    want = _central(_cube, x, index, _EPS)
    if not np.isclose(n, want, rtol=1e-7, atol=1e-9):
        fwd = _forward(_cube, x, index, _EPS)
        hint = ("that is a forward difference; use the central one (your numerical_partial "
                "from 04.1)." if np.isclose(n, fwd, rtol=1e-9) else
                "compute it with numerical_partial(f, x, index, eps) from 04.1.")
        raise ExerciseError(EX_SPOT, f"at {index} the numerical value is {n:.10g}, the "
                                     f"central difference with eps={_EPS:g} is {want:.10g}. "
                                     f"Hint: {hint}")
    want_rel, want_abs = _errors(np.array(a), np.array(n), 1e-10)
    if not (np.isclose(rel, want_rel, rtol=1e-6, atol=1e-15)
            and np.isclose(ab, want_abs, rtol=1e-6, atol=1e-15)):
        raise ExerciseError(EX_SPOT, f"at {index} rel_err={rel:.3g}, abs_err={ab:.3g}; from "
                                     f"the two values they are {float(want_rel):.3g} and "
                                     f"{float(want_abs):.3g}. Use gradient_errors from 04.2.")
    if not ok:
        raise ExerciseError(EX_SPOT, f"at {index} the gradient is right (relative error "
                                     f"{rel:.1e} <= rtol {_RTOL:g}) but ok is False.")


def _check_correct_gradient(spot_check) -> list:
    """A correct gradient, 4 elements of 6: distinct indices, every row right, x restored.
    Returns the indices seed 0 drew."""
    x = _cube_x()
    g = _cube_grad(x)
    probe = x.copy()
    rows = _rows(EX_SPOT, attempt(EX_SPOT, spot_check, _cube, probe, g.copy(), 4, _EPS,
                                  _RTOL, _ATOL, 0), x)
    check_restored(EX_SPOT, x, probe, _EPS, "x")
    if len(rows) != 4:
        raise ExerciseError(EX_SPOT, f"asked for n_checks=4 elements, got {len(rows)} rows.")
    idx = [r[0] for r in rows]
    if len(set(idx)) != len(idx):
        raise ExerciseError(EX_SPOT, f"the indices {idx} repeat an element; draw without "
                                     f"replacement: rng.choice(x.size, n, replace=False).")
    for row in rows:
        _check_row(*row, x, g)
    return idx


def _check_seeded(spot_check, idx: list) -> None:
    """The seed decides the indices, and it does decide: the same seed draws `idx` again,
    six seeds do not all draw the same elements."""
    x = _cube_x()
    g = _cube_grad(x)
    again = _spot(spot_check, _cube, x, g, 4, 0)
    if [r[0] for r in again] != idx:
        raise ExerciseError(EX_SPOT, f"the same seed gave different indices ({idx} then "
                                     f"{[r[0] for r in again]}). Draw them with "
                                     f"np.random.default_rng(seed), not the global generator.")
    draws = {tuple(r[0] for r in _spot(spot_check, _cube, x, g, 2, s)) for s in range(6)}
    if len(draws) == 1:
        raise ExerciseError(EX_SPOT, f"six different seeds all checked the same elements "
                                     f"{next(iter(draws))}: draw the indices at random from the "
                                     f"seed, so repeated checks cover different elements.")


def _check_near_zero(spot_check) -> None:
    """Near-zero gradients, every element checked: relative error alone would reject
    this correct gradient."""
    xz = _tiny_x()
    rows = _spot(spot_check, _tiny, xz, _tiny_grad(xz), xz.size, 1)
    if sorted(r[0] for r in rows) != sorted(np.ndindex(xz.shape)):
        raise ExerciseError(EX_SPOT, f"with n_checks equal to x.size ({xz.size}) every element "
                                     f"should be checked once; got {len(rows)} rows covering "
                                     f"{len(set(r[0] for r in rows))} elements.")
    for index, a, n, rel, ab, ok in rows:
        if not ok:
            if abs(a) < 1e-8:
                raise ExerciseError(
                    EX_SPOT, f"at {index} the analytic gradient is {a:.2e} and the numerical "
                             f"one {n:.2e}: the absolute error {ab:.1e} is below atol={_ATOL:g}, "
                             f"yet ok is False (relative error {rel:.1e}). Near zero the "
                             f"rounding noise of the difference quotient, about u*|f|/eps = "
                             f"1e-10, is as large as the gradient itself, so relative error "
                             f"alone cannot judge it: atol is there for elements like "
                             f"this one.")
            raise ExerciseError(EX_SPOT, f"at {index} the gradient is right but ok is False "
                                         f"(rel {rel:.1e}, abs {ab:.1e}).")


def _large(x):
    """The cube scaled by 1e4: gradients near 1e4, where a central difference's rounding
    noise (about u*|f|/eps ~ 1e-6) exceeds atol while the relative error stays ~1e-10."""
    return 1e4 * _cube(x)


def _check_large_gradient(spot_check) -> None:
    """Large, correct gradients: absolute error alone would reject them."""
    x = _cube_x()
    rows = _spot(spot_check, _large, x, 1e4 * _cube_grad(x), x.size, 3)
    for index, a, n, rel, ab, ok in rows:
        if not ok and rel <= _RTOL:
            raise ExerciseError(EX_SPOT, f"at {index} the gradient is {a:.4g} and right to a "
                                         f"relative error of {rel:.1e}, within rtol={_RTOL:g}, "
                                         f"yet ok is False: its absolute error {ab:.1e} is above "
                                         f"atol={_ATOL:g}, as rounding makes it for any large "
                                         f"gradient. Your rule judges by the absolute error "
                                         f"alone (or by both); either small error is enough.")


def _check_one_wrong_element(spot_check) -> None:
    """A gradient made wrong at one element is flagged there, and only there."""
    xz = _tiny_x()
    bad = (1, 2)
    wrong = _tiny_grad(xz)
    wrong[bad] += 0.05
    rows = _spot(spot_check, _tiny, xz, wrong, xz.size, 2)
    flagged = sorted(r[0] for r in rows if not r[5])
    if flagged != [bad]:
        raise ExerciseError(EX_SPOT, f"the analytic gradient was made wrong by 0.05 at {bad} only; "
                                     f"your check flags {flagged or 'nothing'}. An element fails "
                                     f"when abs_err > atol AND rel_err > rtol.")


def check_spot_check(spot_check) -> None:
    """Random distinct indices from the seed; central differences; an element
    passes when its absolute error is below atol OR its relative error below rtol."""
    idx = _check_correct_gradient(spot_check)
    _check_seeded(spot_check, idx)
    _check_near_zero(spot_check)
    _check_large_gradient(spot_check)
    _check_one_wrong_element(spot_check)
    save_piece("spot_check", spot_check, EX_SPOT)
    passed(EX_SPOT, "seeded distinct indices, central differences, abs OR rel tolerance.")
