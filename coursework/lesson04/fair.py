"""04.5: fair checks of a correct gradient, one that fails for a reason outside its
backward rule: a point within eps of relu's kink, a dropout mask drawn afresh in each
forward pass."""
from __future__ import annotations

import numpy as np

from .._core import ExerciseError, attempt, passed
from ._common import _W, _central

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
