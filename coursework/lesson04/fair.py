"""04.5: fair checks of a correct gradient, one that fails for a reason outside its
backward rule: a point within eps of relu's kink, a dropout mask drawn afresh in each
forward pass.

Both run over the lesson's hand-picked cases and seeded generated ones (`_cases`): a slip
is named only when its reproduction gives the learner's answer on every case the answer
gets wrong; otherwise the message says which entry (or which call) differs, and by how
much, on which case."""
from __future__ import annotations

import numpy as np

from .._cases import Case, Slip, array_difference, raise_first_difference
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


# ------------------------------------------------------------------ away_from_kink
def away_from_kink_reference(x, eps):
    """The lesson's answer: every element closer than 10*eps to 0 moved out to +-10*eps, on
    its own side (0 to +10*eps)."""
    gap = 10 * eps
    safe = np.array(x, dtype=float)
    near = np.abs(safe) < gap
    safe[near] = np.where(safe[near] < 0, -gap, gap)
    return safe


def _kink_cases() -> list[Case]:
    """The lesson's points at eps 1e-6 and 1e-3, then 4 seeded 3x4 arrays, each with a
    point on the kink, points within eps, between eps and 10*eps, a little farther and far
    away, of random signs, at an eps from 1e-6 to 1e-3 (log-uniform)."""
    cases = [Case((_KINK_X, eps), f"away_from_kink(x, eps={eps:g}) on the lesson's points")
             for eps in (1e-6, 1e-3)]
    rng = np.random.default_rng(45)
    for k in range(4):
        eps = float(10.0 ** rng.uniform(-6, -3))
        kinds = rng.permutation([0, 1, 1, 2, 2, 2, 3, 3, 4, 4, 4, 4])
        low = np.array([0.0, 0.0, 1.0, 10.0])[np.minimum(kinds, 3)] * eps
        high = np.array([0.0, 1.0, 10.0, 100.0])[np.minimum(kinds, 3)] * eps
        size = np.where(kinds == 4, np.abs(rng.normal(size=12)) + 0.1,
                        rng.uniform(low, high))
        x = (size * rng.choice([-1.0, 1.0], size=12)).reshape(3, 4) + 0.0   # no -0.0
        cases.append(Case((x, eps), f"away_from_kink(x, eps={eps:.3g}) on generated "
                                    f"points #{k + 1} (seed 45)"))
    return cases


def _unfair(x, eps, out):
    """The entries of `out` a fair relu check cannot use in place of `x`: a point 10*eps or
    more from the kink that moved, a point on the other side of the kink (or on it), a
    point within eps of it, or one that is not finite."""
    out = np.asarray(out, dtype=float)
    with np.errstate(invalid="ignore"):
        moved_far = (np.abs(x) >= 10 * eps) & (out != x)
        wrong_side = ((x < 0) & ~(out < 0)) | ((x > 0) & ~(out > 0)) | (out == 0)
        too_close = ~(np.abs(out) > eps * (1 + 1e-9))
    return moved_far | wrong_side | too_close | ~np.isfinite(out)


def _moved(x, eps, to):
    """x with the points closer than 10*eps to the kink replaced by `to(those points, gap)`."""
    gap = 10 * eps
    out = np.array(x, dtype=float)
    near = np.abs(out) < gap
    out[near] = to(out[near], gap)
    return out


SHIFTED = ("you shifted every element, also the points already 10*eps or more from the "
           "kink: move only the points closer than 10*eps; shifting every element checks "
           "other points than those you meant.")


def _fixed_margin(case: Case, got, want) -> str:
    return (f"your margin is 1e-5 whatever eps is, which is 10*eps for eps=1e-6 only; here "
            f"eps={case.args[1]:g}, and the margin must grow with eps.")


KINK_SLIPS = [
    Slip(lambda x, eps: x + 10 * eps, SHIFTED),
    Slip(lambda x, eps: x + eps, SHIFTED),
    Slip(lambda x, eps: _moved(x, eps, lambda v, gap: np.sign(v) * gap),
         "np.sign(0) is 0, so sign(x) * gap leaves the point on the kink where it was."),
    Slip(lambda x, eps: _moved(x, eps, lambda v, gap: np.maximum(np.abs(v), gap)),
         "every point you moved lands on the positive side, the negative ones across the "
         "kink (np.abs and np.maximum lose the sign): the check then no longer covers both "
         "branches of relu."),
    Slip(lambda x, eps: _moved(x, eps, lambda v, gap: np.where(v < 0, -gap / 10, gap / 10)),
         "you moved the near points to +-eps, still within eps of the kink (on its edge): "
         "x - eps or x + eps then lands on 0, where relu's two slopes meet. A fair point lies "
         "farther than eps from 0."),
    Slip(lambda x, eps: away_from_kink_reference(x, 1e-6), _fixed_margin),
]


def _where_kink_differs(got, want, case: Case) -> str:
    x, eps = case.args
    bad = _unfair(x, eps, got)
    k = tuple(int(i) for i in np.argwhere(bad)[0])
    return (f"x{list(k)} = {x[k]:g} came back as {got[k]:g}, where the lesson's answer has "
            f"{want[k]:g} (off by {got[k] - want[k]:+.3g}); a fair check at eps={eps:g} "
            f"cannot use {int(bad.sum())} of the {x.size} points you returned")


def _learner_points(away_from_kink, case: Case):
    x, eps = case.args
    given = x.copy()
    out = attempt(EX_FAIR, away_from_kink, given, eps)
    call = f"away_from_kink(x, eps={eps:g})"
    if not np.array_equal(given, x):
        raise ExerciseError(EX_FAIR, f"{call} changed x itself: the caller still needs the "
                                     f"points as they were. Work on a copy (x.copy()) and "
                                     f"return it.")
    try:
        safe = np.asarray(out, dtype=float)
    except (TypeError, ValueError):
        safe = None
    if safe is None or safe.shape != x.shape:
        raise ExerciseError(EX_FAIR, f"{call} should return an array of x's shape {x.shape}, "
                                     f"got {out!r}: every point of x comes back, moved or "
                                     f"not.")
    return safe


def _check_away_from_kink(away_from_kink) -> str:
    cases = _kink_cases()
    answers = [_learner_points(away_from_kink, case) for case in cases]
    # Any fair answer is right (a margin of 5*eps too); an unfair one is compared with the
    # lesson's answer, and slips are matched on those cases only.
    wants = [answer if not _unfair(*case.args, answer).any()
             else away_from_kink_reference(*case.args) for case, answer in zip(cases, answers)]
    raise_first_difference(EX_FAIR, cases, answers, wants, slips=KINK_SLIPS,
                           same=_same_points, difference=_where_kink_differs)
    return (f"relu checked on both branches, away from the kink, on {len(cases)} sets of "
            f"points (the lesson's 2 and {len(cases) - 2} generated)")


def _same_points(got, want) -> bool:
    a, b = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=1e-12, atol=0.0))


# ------------------------------------------------------------------ same_mask
_CALLS = 8


class _DropoutLoss:
    """A training-style loss, loss(values, rng): its dropout layer draws the mask's seed from
    the generator, then weighs the kept values."""

    def __init__(self, weights):
        self.weights = weights

    def __call__(self, values, rng):
        from engine import Tensor
        from engine import functional as F
        if not isinstance(rng, np.random.Generator):  # e.g. the legacy RandomState
            raise ExerciseError(EX_FAIR, f"the loss was handed a {type(rng).__name__} as its "
                                         f"generator; it draws its mask with rng.integers, a "
                                         f"method of numpy's Generator, which "
                                         f"{type(rng).__name__} does not have.")
        out = F.dropout(Tensor(values), p=0.5, seed=int(rng.integers(2 ** 31)))
        return float((out * Tensor(self.weights)).sum().data)


_dropout_loss = _DropoutLoss(_W[:2, :3])
_MASK_VALUES = np.array([[0.5, -1.0, 2.0], [1.5, 0.3, -0.7]])


def _mask_cases() -> list[Case]:
    """The lesson's values and seed 11, then 3 seeded losses (weights and values of shapes
    2x3, 3x4 and 1x5) with seeded seeds."""
    cases = [Case((_dropout_loss, 11, _MASK_VALUES), "same_mask(loss, seed=11) on the "
                                                     "lesson's 2x3 values")]
    rng = np.random.default_rng(46)
    for k, shape in enumerate(((2, 3), (3, 4), (1, 5))):
        seed = int(rng.integers(1000))
        loss = _DropoutLoss(rng.normal(size=shape))
        cases.append(Case((loss, seed, rng.normal(size=shape)),
                          f"same_mask(loss, seed={seed}) on generated {shape[0]}x{shape[1]} "
                          f"values #{k + 1} (seed 46)"))
    return cases


def _mask_answer(f, values, call=lambda f, v: f(v)):
    """What a checker sees through f: the losses of _CALLS calls on the same values, then
    the central differences of every element (eps 1e-6), in that order of calls."""
    losses = tuple(call(f, values.copy()) for _ in range(_CALLS))
    numeric = np.array([_central(lambda v: call(f, v), values, i, 1e-6)
                        for i in np.ndindex(values.shape)]).reshape(values.shape)
    return losses, numeric


def same_mask_reference(loss, seed, values):
    """The losses every call should give (the mask a generator made from `seed` draws
    first) and the engine's gradient through that mask."""
    from engine import Tensor
    from engine import functional as F
    mask_seed = int(np.random.default_rng(seed).integers(2 ** 31))
    t = Tensor(values.copy(), requires_grad=True)
    (F.dropout(t, p=0.5, seed=mask_seed) * Tensor(loss.weights)).sum().backward()
    return (loss(values, np.random.default_rng(seed)),) * _CALLS, t.grad


def _made_once(loss, seed):
    rng = np.random.default_rng(seed)
    return lambda values: loss(values, rng)


MASK_SLIPS = [
    Slip(lambda loss, seed, values: _mask_answer(_made_once(loss, seed), values),
         "the first call is right, the next ones are not: a generator made once, outside "
         "the function, is advanced by every call, so each forward pass draws a new mask."),
    Slip(lambda loss, seed, values: _mask_answer(
        lambda v: loss(v, np.random.default_rng(7)), values),
         "every call sees one mask, the mask of seed 7, the lesson's demonstration, "
         "whatever the seed argument says."),
]


def _same_mask_answer(got, want) -> bool:
    (losses, numeric), (want_losses, want_grad) = got, want
    return (np.allclose(losses, want_losses, rtol=1e-12, atol=0.0)
            and np.shape(numeric) == np.shape(want_grad)
            and bool(np.allclose(numeric, want_grad, rtol=1e-6, atol=1e-8)))


def _where_mask_differs(got, want, case: Case) -> str:
    (losses, numeric), (want_losses, want_grad) = got, want
    if not np.allclose(losses, losses[0], rtol=1e-12, atol=0.0):
        return (f"{_CALLS} calls of your function on the same values gave the losses "
                f"{[round(v, 6) for v in losses]}, where the backward pass under check has "
                f"{want_losses[0]:.6g} on every call")
    if not np.allclose(losses[0], want_losses[0], rtol=1e-12, atol=0.0):
        return (f"every call of your function gives the loss {losses[0]:.6g}, where the "
                f"backward pass under check has {want_losses[0]:.6g} (yours is "
                f"{losses[0] - want_losses[0]:+.3g} off)")
    return (f"the central differences through your function differ from the engine's "
            f"gradient: {array_difference(numeric, want_grad)}")


def _call_f(f, values):
    try:
        value = attempt(EX_FAIR, f, values)
    except TypeError as err:
        raise ExerciseError(EX_FAIR, f"calling the function same_mask returned with the "
                                     f"values alone failed ({err}): a checker calls f(values), "
                                     f"one argument.") from None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ExerciseError(EX_FAIR, f"the function same_mask returns should give the loss, "
                                     f"one number; got {value!r}.") from None


def _learner_masks(same_mask, case: Case):
    loss, seed, values = case.args
    f = attempt(EX_FAIR, same_mask, loss, seed)
    if not callable(f):
        raise ExerciseError(EX_FAIR, f"same_mask(loss, seed) should return a function of the "
                                     f"values, got {type(f).__name__}.")
    return _mask_answer(f, values, call=_call_f)


def _check_same_mask(same_mask) -> str:
    # Six mask entries or more, two outcomes each: two fresh masks agree one time in 64 at
    # most. Over eight calls on each of four cases, unseeded masks match a generator made
    # once in fewer than one try in 64^31, so that slip is named only where it was made.
    cases = _mask_cases()
    answers = [_learner_masks(same_mask, case) for case in cases]
    raise_first_difference(EX_FAIR, cases, answers,
                           [same_mask_reference(*case.args) for case in cases],
                           slips=MASK_SLIPS, same=_same_mask_answer,
                           difference=_where_mask_differs)
    return (f"dropout checked with the same mask in every forward pass, for {len(cases)} "
            f"seeds (the lesson's and {len(cases) - 1} generated)")


def check_fair_checks(away_from_kink, same_mask) -> None:
    """04.5: a correct gradient that fails its check for a reason outside the backward rule:
    a point within eps of relu's kink, a dropout mask drawn afresh in each forward pass."""
    kinks = _check_away_from_kink(away_from_kink)
    masks = _check_same_mask(same_mask)
    passed(EX_FAIR, f"{kinks}; {masks}.")
