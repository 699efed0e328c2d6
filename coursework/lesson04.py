"""Checks for lesson 04, "Gradient checking".

The exercises build a gradient checker from parts and put it to work:
04.1 the central difference of one element, 04.2 the relative and absolute
error with a floor, 04.3 spot checks on random indices, 04.4 the step eps
where truncation and rounding error balance, 04.5 fair checks of a correct
gradient (away from a kink, one dropout mask), 04.6 the local-to-global walk
that names the most local failing part of a network. Each check feeds the learner's
function cases where a typical wrong answer gives itself away (a forward
difference, a missing floor, relative error alone) and names it.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from engine.rules import Op

from . import _core
from ._core import ExerciseError, attempt, passed
from ._restore import check_restored
from .pieces import save_piece
# 04.6's network is built from two of lesson 05's suspect ops (the same classes, so a planted
# bug means the same in both lessons): softplus's "formula" forgets to divide by 1 + e^x;
# add_bias's "scale" halves the bias gradient, its "broadcast" takes one row of the batch.
from .lesson05 import _AddBias, _Softplus

EX_PARTIAL = "04.1 (numerical_partial)"
EX_ERRORS = "04.2 (gradient_errors)"
EX_SPOT = "04.3 (spot_check)"
EX_STEP = "04.4 (best_step)"

_W = np.array([[0.3, -1.2, 0.8, 2.0], [-0.5, 1.1, 0.05, -0.7], [1.4, 0.2, -0.9, 0.6]])


def _smooth(x):
    """A smooth function of a 3x4 array with curvature in every direction."""
    return float(np.sum(np.sin(x) * x ** 2 * _W) + 0.25 * np.sum(x * _W) ** 2)


def _smooth_grad(x):
    return (np.cos(x) * x ** 2 + 2 * x * np.sin(x)) * _W + 0.5 * np.sum(x * _W) * _W


def _x0():
    return np.array([[0.7, -0.4, 1.3, 0.2], [-2.1, 0.9, 0.0, 0.5], [1.7, -1.1, 0.35, -0.6]])


def _central(f, x, index, eps):
    xp, xm = x.copy(), x.copy()
    xp[index] += eps
    xm[index] -= eps
    return (f(xp) - f(xm)) / (2 * eps)


def _forward(f, x, index, eps):
    xp = x.copy()
    xp[index] += eps
    return (f(xp) - f(x)) / eps


def _backward(f, x, index, eps):
    xm = x.copy()
    xm[index] -= eps
    return (f(x) - f(xm)) / eps


def _as_float(exercise, value, what):
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ExerciseError(exercise, f"{what} should be a number, got {value!r}.") from None
    if arr.size != 1:
        raise ExerciseError(exercise, f"{what} should be one number, got an array of shape "
                                      f"{arr.shape}. Perturb a single element and return the "
                                      f"single slope.")
    return float(arr.reshape(()))


# ------------------------------------------------------------------ 04.1
def check_numerical_partial(numerical_partial) -> None:
    """Central difference of one element: both sides, divided by 2*eps,
    only x[index] moved, x left as found, the eps argument honoured."""
    x = _x0()
    roundoff_note = ""
    for eps in (1e-3, 1e-2):
        for index in [(0, 0), (1, 3), (2, 1), (1, 2)]:
            probe = x.copy()
            got = _as_float(EX_PARTIAL, attempt(EX_PARTIAL, numerical_partial,
                                                _smooth, probe, index, eps),
                            f"numerical_partial(f, x, {index}, eps={eps})")
            roundoff_note = check_restored(EX_PARTIAL, x, probe, eps, "x") or roundoff_note
            want = _central(_smooth, x, index, eps)
            if np.isclose(got, want, rtol=1e-9, atol=1e-12):
                continue
            true = _smooth_grad(x)[index]
            if np.isclose(got, _forward(_smooth, x, index, eps), rtol=1e-9, atol=1e-12) or \
                    np.isclose(got, _backward(_smooth, x, index, eps), rtol=1e-9, atol=1e-12):
                hint = ("this is a one-sided (forward or backward) difference: its error shrinks "
                        "only like eps. Evaluate f at x[index]+eps and at x[index]-eps and divide "
                        "the difference by 2*eps.")
            elif np.isclose(got, 2 * want, rtol=1e-9):
                hint = "it is twice the central difference: divide by 2*eps, not by eps."
            elif np.isclose(got, 0.5 * want, rtol=1e-9):
                hint = ("it is half the central difference: the two points are 2*eps apart, "
                        "so divide by 2*eps (not 4*eps).")
            elif np.isclose(got, -want, rtol=1e-9):
                hint = "the sign is flipped: compute f(x + eps) - f(x - eps), in that order."
            elif np.isclose(got, true, rtol=1e-5):
                hint = ("it is close to the true slope but not the central difference with the "
                        f"eps you were given ({eps:g}): use the eps argument, do not fix your own.")
            else:
                moved_all = (_smooth(x + eps) - _smooth(x - eps)) / (2 * eps)
                if np.isclose(got, moved_all, rtol=1e-9):
                    hint = ("you moved every element of x at once; that is the slope along "
                            "(1, 1, ..., 1). Move only x[index].")
                else:
                    hint = ("perturb only x[index], evaluate f on both sides, "
                            "(f(x+) - f(x-)) / (2*eps).")
            raise ExerciseError(EX_PARTIAL, f"numerical_partial(f, x, {index}, eps={eps}) "
                                            f"returned {got:.10g}; the central difference is "
                                            f"{want:.10g}. Hint: {hint}")
    save_piece("numerical_partial", numerical_partial, EX_PARTIAL)
    passed(EX_PARTIAL, "central difference, x left unchanged, eps honoured." + roundoff_note)


# ------------------------------------------------------------------ 04.2
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


# ------------------------------------------------------------------ 04.3
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


def check_spot_check(spot_check) -> None:
    """Random distinct indices from the seed; central differences; an element
    passes when its absolute error is below atol OR its relative error below rtol."""
    eps, rtol, atol = 1e-6, 1e-6, 1e-8
    x = _cube_x()
    g = _cube_grad(x)

    # 1. a correct gradient, 4 elements of 6
    probe = x.copy()
    rows = _rows(EX_SPOT, attempt(EX_SPOT, spot_check, _cube, probe, g.copy(), 4, eps,
                                  rtol, atol, 0), x)
    check_restored(EX_SPOT, x, probe, eps, "x")
    if len(rows) != 4:
        raise ExerciseError(EX_SPOT, f"asked for n_checks=4 elements, got {len(rows)} rows.")
    idx = [r[0] for r in rows]
    if len(set(idx)) != len(idx):
        raise ExerciseError(EX_SPOT, f"the indices {idx} repeat an element; draw without "
                                     f"replacement: rng.choice(x.size, n, replace=False).")
    for index, a, n, rel, ab, ok in rows:
        if not np.isclose(a, g[index], rtol=1e-12):
            raise ExerciseError(EX_SPOT, f"at {index} the analytic value is {a:.10g}, but "
                                         f"analytic_grad{list(index)} is {g[index]:.10g}.")
        want = _central(_cube, x, index, eps)
        if not np.isclose(n, want, rtol=1e-7, atol=1e-9):
            fwd = _forward(_cube, x, index, eps)
            hint = ("that is a forward difference; use the central one (your numerical_partial "
                    "from 04.1)." if np.isclose(n, fwd, rtol=1e-9) else
                    "compute it with numerical_partial(f, x, index, eps) from 04.1.")
            raise ExerciseError(EX_SPOT, f"at {index} the numerical value is {n:.10g}, the "
                                         f"central difference with eps={eps:g} is {want:.10g}. "
                                         f"Hint: {hint}")
        want_rel, want_abs = _errors(np.array(a), np.array(n), 1e-10)
        if not (np.isclose(rel, want_rel, rtol=1e-6, atol=1e-15)
                and np.isclose(ab, want_abs, rtol=1e-6, atol=1e-15)):
            raise ExerciseError(EX_SPOT, f"at {index} rel_err={rel:.3g}, abs_err={ab:.3g}; from "
                                         f"the two values they are {float(want_rel):.3g} and "
                                         f"{float(want_abs):.3g}. Use gradient_errors from 04.2.")
        if not ok:
            raise ExerciseError(EX_SPOT, f"at {index} the gradient is right (relative error "
                                         f"{rel:.1e} <= rtol {rtol:g}) but ok is False.")

    # 2. the seed decides, and it does decide
    again = _rows(EX_SPOT, attempt(EX_SPOT, spot_check, _cube, x.copy(), g.copy(), 4, eps,
                                   rtol, atol, 0), x)
    if [r[0] for r in again] != idx:
        raise ExerciseError(EX_SPOT, f"the same seed gave different indices ({idx} then "
                                     f"{[r[0] for r in again]}). Draw them with "
                                     f"np.random.default_rng(seed), not the global generator.")
    draws = {tuple(r[0] for r in _rows(EX_SPOT, attempt(EX_SPOT, spot_check, _cube, x.copy(),
                                                        g.copy(), 2, eps, rtol, atol, s), x))
             for s in range(6)}
    if len(draws) == 1:
        raise ExerciseError(EX_SPOT, f"six different seeds all checked the same elements "
                                     f"{next(iter(draws))}: draw the indices at random from the "
                                     f"seed, so repeated checks cover different elements.")

    # 3. near-zero gradients: relative error alone rejects a correct gradient
    xz = _tiny_x()
    gz = _tiny_grad(xz)
    rows = _rows(EX_SPOT, attempt(EX_SPOT, spot_check, _tiny, xz.copy(), gz, xz.size, eps,
                                  rtol, atol, 1), xz)
    if sorted(r[0] for r in rows) != sorted(np.ndindex(xz.shape)):
        raise ExerciseError(EX_SPOT, f"with n_checks equal to x.size ({xz.size}) every element "
                                     f"should be checked once; got {len(rows)} rows covering "
                                     f"{len(set(r[0] for r in rows))} elements.")
    for index, a, n, rel, ab, ok in rows:
        if not ok:
            if abs(a) < 1e-8:
                raise ExerciseError(
                    EX_SPOT, f"at {index} the analytic gradient is {a:.2e} and the numerical "
                             f"one {n:.2e}: the absolute error {ab:.1e} is below atol={atol:g}, "
                             f"yet ok is False (relative error {rel:.1e}). Near zero the "
                             f"rounding noise of the difference quotient, about u*|f|/eps = "
                             f"1e-10, is as large as the gradient itself, so relative error "
                             f"alone cannot judge it. Hint: an element passes when "
                             f"abs_err <= atol OR rel_err <= rtol.")
            raise ExerciseError(EX_SPOT, f"at {index} the gradient is right but ok is False "
                                         f"(rel {rel:.1e}, abs {ab:.1e}).")

    # 4. a wrong gradient at one element is flagged, and only there
    bad = (1, 2)
    wrong = gz.copy()
    wrong[bad] += 0.05
    rows = _rows(EX_SPOT, attempt(EX_SPOT, spot_check, _tiny, xz.copy(), wrong, xz.size, eps,
                                  rtol, atol, 2), xz)
    flagged = sorted(r[0] for r in rows if not r[5])
    if flagged != [bad]:
        raise ExerciseError(EX_SPOT, f"the analytic gradient was made wrong by 0.05 at {bad} only; "
                                     f"your check flags {flagged or 'nothing'}. An element fails "
                                     f"when abs_err > atol AND rel_err > rtol.")
    save_piece("spot_check", spot_check, EX_SPOT)
    passed(EX_SPOT, "seeded distinct indices, central differences, abs OR rel tolerance.")


# ------------------------------------------------------------------ 04.4
def check_best_step(best_step) -> None:
    """Minimise eps**2/6 + u/eps: eps* = (3u)**(1/3)."""
    for u in (2.0 ** -53, 2.0 ** -24, 1e-4):
        got = _as_float(EX_STEP, attempt(EX_STEP, best_step, u), f"best_step({u:g})")
        want = (3 * u) ** (1 / 3)
        if np.isclose(got, want, rtol=1e-6):
            continue
        if np.isclose(got, np.sqrt(u), rtol=1e-6) or np.isclose(got, 2 * np.sqrt(u), rtol=1e-6):
            hint = ("sqrt(u) balances a truncation error ~ eps (the forward difference). The "
                    "central difference's truncation error is ~ eps**2/6.")
        elif np.isclose(got, u ** (1 / 3), rtol=1e-6) or np.isclose(got, (6 * u) ** (1 / 3),
                                                                     rtol=1e-6):
            hint = ("right power, wrong constant: set the derivative of eps**2/6 + u/eps to zero: "
                    "eps/3 - u/eps**2 = 0.")
        elif np.isclose(got, u, rtol=1e-6):
            hint = ("a step of u itself is the worst choice: the rounding error u/eps is then 1. "
                    "Balance it against the truncation error eps**2/6.")
        else:
            hint = "minimise E(eps) = eps**2/6 + u/eps: set dE/deps = 0 and solve for eps."
        raise ExerciseError(EX_STEP, f"best_step({u:g}) returned {got:.6g}, expected {want:.6g}. "
                                     f"Hint: {hint}")
    e64, e32 = (3 * 2.0 ** -53) ** (1 / 3), (3 * 2.0 ** -24) ** (1 / 3)
    passed(EX_STEP, f"float64: eps* = {e64:.1e}, float32: eps* = {e32:.1e}.")


# ------------------------------------------------------------------ 04.5
EX_FAIR = "04.5 (away_from_kink, same_mask)"

#: Points a relu check might be handed: on the kink, within eps of it, a little
#: farther, and far away, of both signs.
_KINK_X = np.array([[0.0, 3e-7, -3e-7, -8e-6], [2.5e-5, 0.4, -1.3, 2e-3]])


def _relu_loss(values):
    return float(np.sum(np.maximum(values, 0.0) * _W[:2]))


def _relu_loss_grad(values):
    return np.where(values > 0, 1.0, 0.0) * _W[:2]


def _check_away_from_kink(away_from_kink) -> str:
    for eps in (1e-6, 1e-3):
        x = _KINK_X.copy()
        out = attempt(EX_FAIR, away_from_kink, x, eps)
        call = f"away_from_kink(x, eps={eps:g})"
        if not np.array_equal(x, _KINK_X):
            raise ExerciseError(EX_FAIR, f"{call} changed x itself: the caller still needs "
                                         f"the points as they were. Work on a copy "
                                         f"(x.copy()) and return it.")
        try:
            safe = np.asarray(out, dtype=float)
        except (TypeError, ValueError):
            safe = None
        if safe is None or safe.shape != x.shape:
            raise ExerciseError(EX_FAIR, f"{call} should return an array of x's shape "
                                         f"{x.shape}, got {out!r}. Move the points near the "
                                         f"kink; do not drop them.")
        gap = 10 * eps
        far = np.abs(x) >= gap
        if not np.array_equal(safe[far], x[far]):
            k = tuple(int(i) for i in np.argwhere(far & (safe != x))[0])
            raise ExerciseError(EX_FAIR, f"{call} moved x{list(k)} = {x[k]:g}, which is "
                                         f"already {abs(x[k]) / eps:.3g} eps from the kink, "
                                         f"to {safe[k]:g}. Hint: move only the points closer "
                                         f"than 10*eps (np.abs(x) < 10 * eps); shifting every "
                                         f"element (x + eps) checks other points than those "
                                         f"you meant.")
        if np.any(safe[x == 0] == 0):
            raise ExerciseError(EX_FAIR, f"{call} left an exact 0 on the kink. Hint: "
                                         f"np.sign(0) is 0, so sign(x) * gap keeps a zero at 0; "
                                         f"send it to one side (+10*eps).")
        flipped = ((x < 0) & (safe >= 0)) | ((x > 0) & (safe <= 0))
        if flipped.any():
            k = tuple(int(i) for i in np.argwhere(flipped)[0])
            raise ExerciseError(EX_FAIR, f"{call} moved x{list(k)} = {x[k]:g} to {safe[k]:g}, "
                                         f"across the kink. Hint: keep every point on its own "
                                         f"side (negative ones to -10*eps), so the check still "
                                         f"covers both branches of relu; np.abs or np.maximum "
                                         f"puts every point on the positive branch.")
        close_to = np.abs(safe) <= eps * (1 + 1e-9)
        if close_to.any():
            k = tuple(int(i) for i in np.argwhere(close_to)[0])
            scale = (" With eps=1e-3 the margin must grow with eps: compute it from the eps "
                     "argument." if eps > 1e-6 else "")
            raise ExerciseError(EX_FAIR, f"{call} left x{list(k)} at {safe[k]:g}, within eps "
                                         f"of the kink: x - eps and x + eps then lie on both "
                                         f"sides of 0 (or on it), and the central difference "
                                         f"averages the two slopes. Hint: move each point "
                                         f"farther than eps from 0 (10*eps).{scale}")
        numeric = np.array([_central(_relu_loss, safe, i, eps) for i in np.ndindex(x.shape)])
        if not np.allclose(numeric, _relu_loss_grad(safe).ravel(), rtol=1e-6, atol=1e-8):
            raise ExerciseError(EX_FAIR, f"{call}: relu's gradient still fails its check at "
                                         f"the points you returned. Hint: every point farther "
                                         f"than eps from 0, on its own side.")
    return "relu checked on both branches, away from the kink"


def _dropout_loss(values, rng):
    """A training-style loss: its dropout layer draws the mask's seed from a generator."""
    from engine import Tensor
    from engine import functional as F
    out = F.dropout(Tensor(values), p=0.5, seed=int(rng.integers(2 ** 31)))
    return float((out * Tensor(_W[:2, :3])).sum().data)


def _check_same_mask(same_mask) -> str:
    from engine import Tensor
    from engine import functional as F
    seed = 11
    h = np.array([[0.5, -1.0, 2.0], [1.5, 0.3, -0.7]])
    mask_seed = int(np.random.default_rng(seed).integers(2 ** 31))
    ht = Tensor(h.copy(), requires_grad=True)
    (F.dropout(ht, p=0.5, seed=mask_seed) * Tensor(_W[:2, :3])).sum().backward()
    f = attempt(EX_FAIR, same_mask, _dropout_loss, seed)
    if not callable(f):
        raise ExerciseError(EX_FAIR, f"same_mask(loss, seed) should return a function of the "
                                     f"values, got {type(f).__name__}.")
    # Six mask entries, two outcomes each: two fresh masks agree one time in 64. With eight
    # calls, unseeded masks all agree once in 64^7 (about 4 x 10^12) tries, and only a
    # generator made once from the seed repeats its draws in order: `seeded`, whose first
    # loss is the one every call should give.
    calls = 8
    made_once = np.random.default_rng(seed)
    seeded = [_dropout_loss(h, made_once) for _ in range(calls)]
    want = seeded[0]
    try:
        values = [attempt(EX_FAIR, f, h.copy()) for _ in range(calls)]
    except TypeError as err:
        raise ExerciseError(EX_FAIR, f"calling the function same_mask returned with the values "
                                     f"alone failed ({err}). Hint: a checker calls f(values), "
                                     f"one argument; f makes the generator and calls "
                                     f"loss(values, rng) itself.") from None
    try:
        values = [float(v) for v in values]
    except (TypeError, ValueError):
        raise ExerciseError(EX_FAIR, f"the function same_mask returns should give the loss, "
                                     f"one number; got {values[0]!r}.") from None
    if len(set(values)) > 1:
        if values == seeded:
            hint = ("the first call is right, the next ones are not: a generator made once, "
                    "outside the function, is advanced by every call, so each forward pass "
                    "draws a new mask. Make a fresh np.random.default_rng(seed) inside the "
                    "function, on every call.")
        else:
            hint = ("every forward pass draws its own mask, so the difference quotient "
                    "measures the change of the mask. Make a fresh np.random.default_rng(seed) "
                    "on every call.")
        raise ExerciseError(EX_FAIR, f"{calls} calls on the same values gave the losses "
                                     f"{[round(v, 6) for v in values]}. Hint: {hint}")
    numeric = np.array([_central(f, h, i, 1e-6) for i in np.ndindex(h.shape)]).reshape(h.shape)
    if not np.allclose(values[0], want, rtol=1e-12) or \
            not np.allclose(numeric, ht.grad, rtol=1e-6, atol=1e-8):
        raise ExerciseError(EX_FAIR, f"every call now sees the same mask, but not the mask of "
                                     f"the backward pass being checked (seed {seed}): the "
                                     f"numerical gradient {np.round(numeric.ravel(), 3)} is "
                                     f"not the engine's {np.round(ht.grad.ravel(), 3)}. Hint: "
                                     f"call loss(values, np.random.default_rng(seed)) with the "
                                     f"seed you were given.")
    return "dropout checked with the same mask in every forward pass"


def check_fair_checks(away_from_kink, same_mask) -> None:
    """04.5: a correct gradient that fails its check for a reason outside the backward rule:
    a point within eps of relu's kink, a dropout mask drawn afresh in each forward pass."""
    kinks = _check_away_from_kink(away_from_kink)
    masks = _check_same_mask(same_mask)
    passed(EX_FAIR, f"{kinks}; {masks}.")


# ------------------------------------------------------------------ 04.6
EX_LOCAL = "04.6 (localize)"

#: The levels of a part, from the most local to the most global.
LEVELS = ("op", "layer", "network")


class Part(NamedTuple):
    """One part of a network under check: `fn(*tensors)` on tensors made from `inputs`."""
    level: str
    fn: Callable
    inputs: list

    def __repr__(self):
        shapes = ", ".join(str(np.shape(a)) for a in self.inputs)
        return f"Part({self.level!r}, inputs of shapes {shapes})"


def network_parts(bugs: dict | None = None, order=None) -> dict:
    """The lesson's small network as named parts {name: Part}, listed network first.

    Ops: matmul, add_bias, softplus (the last two written here, as `engine.rules.Op`
    subclasses), cross_entropy. Layers: hidden = softplus(add_bias(x @ W1, b1)) and
    head = h @ W2 + b2. The network: cross_entropy(head(hidden(x))). `bugs` plants a wrong
    VJP ({"softplus": "formula"} or {"add_bias": "scale" or "broadcast"}); with no argument,
    the lesson's bug. `order` lists the names in another order (the same parts)."""
    from engine import functional as F
    from engine.tensor import apply
    bugs = {"softplus": "formula"} if bugs is None else bugs
    softplus_op = type("Softplus", (_Softplus,), {"bug": bugs.get("softplus")})
    add_bias_op = type("AddBias", (_AddBias,), {"bug": bugs.get("add_bias")})
    rng = np.random.default_rng(6)
    x, targets = rng.normal(size=(4, 3)), np.array([0, 3, 1, 2])
    W1, b1 = rng.normal(size=(3, 5)), rng.normal(size=5)
    W2, b2 = rng.normal(size=(5, 4)) / 2, rng.normal(size=4)
    h = rng.normal(size=(4, 5))

    def softplus(a):
        return apply(softplus_op, a)

    def add_bias(a, b):
        return apply(add_bias_op, a, b)

    def hidden(a, W, b):
        return softplus(add_bias(a @ W, b))

    def head(a, W, b):
        return a @ W + b

    def network(a, W1, b1, W2, b2):
        return F.cross_entropy(head(hidden(a, W1, b1), W2, b2), targets)

    parts = {
        "network": Part("network", network, [x, W1, b1, W2, b2]),
        "hidden": Part("layer", hidden, [x, W1, b1]),
        "head": Part("layer", head, [h, W2, b2]),
        "matmul": Part("op", lambda a, b: a @ b, [x, W1]),
        # checked on one row: there taking row 0 and summing the rows agree
        "add_bias": Part("op", add_bias, [x[:1] @ W1, b1]),
        "softplus": Part("op", softplus, [rng.normal(size=(4, 5))]),
        "cross_entropy": Part("op", lambda z: F.cross_entropy(z, targets),
                              [rng.normal(size=(4, 4))]),
    }
    if order is not None:
        parts = {name: parts[name] for name in order}
    return parts


def check_part(part: Part):
    """The engine's gradient check of one part (eps=1e-5, as the lesson's layer check)."""
    import engine
    return engine.gradcheck(part.fn, part.inputs, eps=1e-5, raise_on_failure=False)


def _most_local_failure(parts: dict, failing: dict):
    for level in LEVELS:
        for name, part in parts.items():
            if part.level == level and failing[name]:
                return name
    return None


#: The cases 04.6 hands the learner's function: the lesson's bug, listed layers first (so
#: a walk in the dict's order stops at a layer), a bug in another op, a bug that no op's own
#: check sees (the layer's batch), and no bug at all.
_LOCAL_CASES = (
    ("the lesson's network, its parts listed layers first", None,
     ("hidden", "head", "network", "matmul", "add_bias", "softplus", "cross_entropy")),
    ("the network with add_bias's bias gradient halved", {"add_bias": "scale"}, None),
    ("the network with a bug that only shows on a batch of rows", {"add_bias": "broadcast"},
     ("softplus", "network", "head", "cross_entropy", "hidden", "matmul", "add_bias")),
    ("the network with no bug", {}, None),
)


def check_localize(localize) -> None:
    """04.6: walk the parts from local to global; the name of the most local failing part
    (None if every part passes), for the lesson's network and three hidden variants."""
    from engine.gradcheck import GradcheckError, GradcheckReport
    for what, bugs, order in _LOCAL_CASES:
        parts = network_parts(bugs, order)
        failing = {name: not check_part(p).ok for name, p in parts.items()}
        want = _most_local_failure(parts, failing)
        try:
            got = attempt(EX_LOCAL, localize, dict(parts))
        except GradcheckError as err:
            raise ExerciseError(EX_LOCAL, f"for {what}, your function raised on a failing "
                                          f"check ({str(err).split(';')[0]}). Hint: call "
                                          f"engine.gradcheck(..., raise_on_failure=False) and "
                                          f"read report.ok, so one failure does not stop the "
                                          f"walk before you know which part is the most "
                                          f"local.") from None
        if isinstance(got, GradcheckReport) or (isinstance(got, (tuple, list)) and any(
                isinstance(v, GradcheckReport) for v in got)):
            raise ExerciseError(EX_LOCAL, f"for {what}, your function returned a report "
                                          f"({type(got).__name__}); return the part's name, "
                                          f"the key of `parts` (a str), or None.")
        if got is not None and not isinstance(got, str):
            raise ExerciseError(EX_LOCAL, f"for {what}, your function returned {got!r}; "
                                          f"return one name, a key of `parts`, or None.")
        if got == want:
            continue
        if got is not None and got not in parts:
            raise ExerciseError(EX_LOCAL, f"for {what}, {got!r} is not one of the parts "
                                          f"{sorted(parts)}.")
        first_in_dict = next((n for n in parts if failing[n]), None)
        if want is None:
            hint = (f"every part passes its check here, yet you returned {got!r}. Hint: "
                    f"return None when no check fails, and judge each part by report.ok "
                    f"(with eps=1e-5: a much larger step's truncation error can fail a "
                    f"correct part).")
        elif got is None:
            hint = ("you returned None, but a check fails. Hint: "
                    + ("every op passes on its own here; the layer "
                       f"{want!r} is the first to fail: check the layers after the ops, then "
                       f"the network." if parts[want].level == "layer" else
                       "run engine.gradcheck on every part, and read report.ok."))
        elif got == first_in_dict and parts[got].level != "network":
            because = (f" It fails because one of its ops does: {want!r} fails on its own."
                       if parts[want].level == "op" else "")
            hint = (f"{got!r} is the first failing part in the order the dict lists them, "
                    f"but the dict's order is not the local-to-global order.{because} Hint: "
                    f"walk the levels in order, {', '.join(LEVELS)}, and within each level "
                    f"the parts of that level.")
        elif parts[got].level == "network":
            hint = (f"the end-to-end check only says something is wrong somewhere; it does "
                    f"not say where. Here {want!r} ({parts[want].level}) fails too. Hint: "
                    f"check the ops first, then the layers, then the network, and return the "
                    f"first failure.")
        elif parts[got].level == "layer" and parts[want].level == "op":
            hint = (f"the layer {got!r} fails because one of its ops does: {want!r} fails on "
                    f"its own. Hint: check every op before any layer; the most local failure "
                    f"is the one that points at its cause.")
        elif not failing[got]:
            hint = (f"{got!r} passes its check. Hint: return a part whose report is not ok, "
                    f"the first in local-to-global order.")
        else:
            hint = (f"walk the levels in order, {', '.join(LEVELS)}, and return the first "
                    f"failing part.")
        raise ExerciseError(EX_LOCAL, f"for {what}, you returned {got!r}; the most local "
                                      f"failing part is {want!r}. {hint}")
    passed(EX_LOCAL, "ops, then layers, then the network: the first failure names the op, "
                     "the layer where only the batch shows a bug, or None.")


# ------------------------------------------------------------------ the notebook
#: Each exercise function of the lesson, and its exercise.
EXERCISE_FUNCTIONS = {"numerical_partial": EX_PARTIAL, "gradient_errors": EX_ERRORS,
                      "spot_check": EX_SPOT, "best_step": EX_STEP, "away_from_kink": EX_FAIR,
                      "same_mask": EX_FAIR, "localize": EX_LOCAL}


def name_unfinished_exercises() -> None:
    """In the notebook, a cell that needs an unfinished exercise of this lesson says which."""
    _core.name_unfinished_exercises(EXERCISE_FUNCTIONS)
