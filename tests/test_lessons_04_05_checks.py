"""The exercise checks of lessons 04 and 05, fed right and typical wrong answers.

A check must pass a correct answer, fail a stub with the exercise's own "not
done yet" message, and fail each typical wrong answer with a hint that names
the mistake (asserted by matching a phrase of the hint).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest

from coursework import ExerciseError, lesson04
from case_tools import assert_each_slip_named
from check_tools import fails_with


def stub(*args, **kwargs):
    raise NotImplementedError()


# ---------------------------------------------------------------- 04.1
def partial_right(f, x, index, eps=1e-6):
    xp = x.copy()
    xp[index] += eps
    xm = x.copy()
    xm[index] -= eps
    return (f(xp) - f(xm)) / (2 * eps)


def partial_forward(f, x, index, eps=1e-6):
    xp = x.copy()
    xp[index] += eps
    return (f(xp) - f(x)) / eps


def partial_over_eps(f, x, index, eps=1e-6):
    return 2 * partial_right(f, x, index, eps)


def partial_in_place(f, x, index, eps=1e-6):
    x[index] += eps
    up = f(x)
    x[index] -= 2 * eps
    down = f(x)
    return (up - down) / (2 * eps)  # and x is left eps below where it was


def partial_fixed_eps(f, x, index, eps=1e-6):
    return partial_right(f, x, index, 1e-6)


def partial_all_moved(f, x, index, eps=1e-6):
    return (f(x + eps) - f(x - eps)) / (2 * eps)


def partial_nudge_and_restore(f, x, index, eps=1e-6):
    """Right in exact arithmetic; x can come back one rounding step off."""
    x[index] += eps
    up = f(x)
    x[index] -= 2 * eps
    down = f(x)
    x[index] += eps
    return (up - down) / (2 * eps)


def test_04_1_accepts_nudge_and_restore_and_explains_the_rounding(capsys):
    lesson04.check_numerical_partial(partial_nudge_and_restore)
    out = capsys.readouterr().out
    assert "passed" in out and "rounding step" in out


def test_04_1_fixed_eps_hint_shows_the_eps_value():
    with pytest.raises(ExerciseError) as err:
        lesson04.check_numerical_partial(partial_fixed_eps)
    assert "({eps" not in str(err.value) and "(0.001)" in str(err.value)


def test_04_1_passes_a_central_difference(capsys):
    lesson04.check_numerical_partial(partial_right)
    assert "Exercise 04.1 (numerical_partial) passed." in capsys.readouterr().out


@pytest.mark.parametrize("answer, phrase", [
    (stub, "not done yet"),
    (partial_forward, "one-sided"),
    (partial_over_eps, "divide by 2*eps, not by eps"),
    (partial_in_place, "x was changed"),
    (partial_in_place, "assign it back"),
    (partial_fixed_eps, "use the eps argument"),
    (partial_all_moved, "moved every element"),
    (lambda f, x, i, eps: np.zeros(3), "one number"),
])
def test_04_1_names_the_mistake(answer, phrase):
    with pytest.raises(ExerciseError, match="Exercise 04.1") as err:
        lesson04.check_numerical_partial(answer)
    assert phrase in str(err.value)


def test_04_1_a_wrong_slope_that_is_no_known_slip_gets_the_neutral_message():
    def three_points(f, x, index, eps):           # a mean of the two one-sided slopes, wrong
        return (partial_right(f, x, index, eps) + partial_forward(f, x, index, eps)) / 2
    with pytest.raises(ExerciseError) as err:
        lesson04.check_numerical_partial(three_points)
    message = str(err.value)
    assert "the central difference is" in message and " off)" in message
    assert "Hint" not in message and "(f(x+) - f(x-)) / (2*eps)" not in message


def test_04_1_runs_generated_points_and_steps():
    from coursework.lesson04 import partial
    cases = partial._partial_cases()
    assert len(cases) == 12 and len({eps for _, _, eps in cases}) == 6

    def story_point_only(f, x, index, eps):      # right only where the story's x is
        if x[0, 0] == 0.7:
            return partial_right(f, x, index, eps)
        return partial_forward(f, x, index, eps)
    with pytest.raises(ExerciseError, match="one-sided"):
        lesson04.check_numerical_partial(story_point_only)


# ---------------------------------------------------------------- 04.2
def errors_right(analytic, numeric, floor=1e-10):
    ab = np.abs(analytic - numeric)
    return ab / np.maximum(np.maximum(np.abs(analytic), np.abs(numeric)), floor), ab


def errors_no_floor(analytic, numeric, floor=1e-10):
    ab = np.abs(analytic - numeric)
    with np.errstate(all="ignore"):
        return ab / np.maximum(np.abs(analytic), np.abs(numeric)), ab


def errors_floor_zero_to_nan_free(analytic, numeric, floor=1e-10):
    # "fixed" the NaN by adding a tiny constant: still no real floor
    ab = np.abs(analytic - numeric)
    return ab / (np.maximum(np.abs(analytic), np.abs(numeric)) + 1e-300), ab


def errors_sum(analytic, numeric, floor=1e-10):
    ab = np.abs(analytic - numeric)
    return ab / np.maximum(np.abs(analytic) + np.abs(numeric), floor), ab


def errors_analytic_only(analytic, numeric, floor=1e-10):
    ab = np.abs(analytic - numeric)
    return ab / np.maximum(np.abs(analytic), floor), ab


def errors_signed(analytic, numeric, floor=1e-10):
    d = analytic - numeric
    return d / np.maximum(np.maximum(np.abs(analytic), np.abs(numeric)), floor), np.abs(d)


def test_04_2_passes_relative_error_with_floor(capsys):
    lesson04.check_gradient_errors(errors_right)
    assert "Exercise 04.2 (gradient_errors) passed." in capsys.readouterr().out


def errors_mean_of_magnitudes(analytic, numeric, floor=1e-10):
    ab = np.abs(analytic - numeric)
    return ab / np.maximum((np.abs(analytic) + np.abs(numeric)) / 2, floor), ab


def errors_root_of_squares(analytic, numeric, floor=1e-10):
    ab = np.abs(analytic - numeric)
    return ab / np.maximum(np.sqrt(analytic ** 2 + numeric ** 2), floor), ab


def errors_floor_added(analytic, numeric, floor=1e-10):
    ab = np.abs(analytic - numeric)
    return ab / (np.maximum(np.abs(analytic), np.abs(numeric)) + floor), ab


def errors_floor_ignored(analytic, numeric, floor=1e-10):
    ab = np.abs(analytic - numeric)
    return ab / np.maximum(np.maximum(np.abs(analytic), np.abs(numeric)), 1e-10), ab


def errors_maximum_of_three(analytic, numeric, floor=1e-10):
    ab = np.abs(analytic - numeric)
    return ab / np.maximum(np.abs(analytic), np.abs(numeric), floor), ab


def errors_written_differently(analytic, numeric, floor=1e-10):
    sizes = np.stack([np.abs(analytic), np.abs(numeric), np.full_like(analytic, floor)])
    ab = np.abs(numeric - analytic)
    return ab / sizes.max(axis=0), ab


def test_04_2_passes_an_answer_written_differently(capsys):
    lesson04.check_gradient_errors(errors_written_differently)
    assert "Exercise 04.2 (gradient_errors) passed." in capsys.readouterr().out


@pytest.mark.parametrize("answer, phrase", [
    (stub, "not done yet"),
    (errors_no_floor, "demand 3 is broken"),
    (errors_floor_zero_to_nan_free, "demand 3 is broken"),
    (errors_sum, "demand 2 is broken: gradients 1% apart"),
    (errors_root_of_squares, "demand 2 is broken: gradients 1% apart"),
    (errors_mean_of_magnitudes, "demand 2 is broken: a gradient missing entirely"),
    (errors_analytic_only, "demand 1 is broken"),
    (errors_floor_added, "demand 3 is broken for the floor you are given"),
    (errors_floor_ignored, "read the `floor` argument"),
    (errors_maximum_of_three, "a third positional argument is the array it writes"),
    (errors_signed, "absolute value"),
    (lambda a, n, floor=1e-10: np.abs(a - n), "pair (relative, absolute)"),
])
def test_04_2_names_the_mistake(answer, phrase):
    with pytest.raises(ExerciseError, match="Exercise 04.2") as err:
        lesson04.check_gradient_errors(answer)
    assert phrase in str(err.value)
    assert "max(|a|, |n|" not in str(err.value) and "np.maximum(np.maximum" not in str(err.value)


# ---------------------------------------------------------------- numpy's errors, one line
# An error numpy's C code raises on a line of the learner's function, from an array method
# or an operator, leaves no numpy frame in the traceback; it is named all the same.
def reshape_wrong(g):
    return g.reshape(3, 5)


def matmul_wrong(x, y):
    return x.T @ y


def broadcast_wrong(a, b):
    return a + b


def argmax_wrong_axis(a):
    return a.argmax(axis=3)


def truth_of_an_array(a):
    if a > 0:
        return a
    return -a


def index_past_the_end(a):
    return a[7]


@pytest.mark.parametrize("fn, args, words", [
    (reshape_wrong, (np.ones(4),), ["`return g.reshape(3, 5)`", "ValueError: cannot reshape"]),
    (matmul_wrong, (np.ones((3, 4)), np.ones((5, 2))),
     ["`return x.T @ y`", "mismatch in its core dimension", "in a @ b, the last dimension"]),
    (broadcast_wrong, (np.ones(3), np.ones(4)),
     ["`return a + b`", "could not be broadcast", "do not line up"]),
    (argmax_wrong_axis, (np.ones((2, 3)),), ["`return a.argmax(axis=3)`", "AxisError"]),
    (truth_of_an_array, (np.ones(3),), ["`if a > 0:`", "truth value of an array"]),
    (index_past_the_end, (np.ones(3),), ["`return a[7]`", "IndexError: index 7 is out of"]),
])
def test_numpy_error_on_an_array_method_or_operator_is_one_named_line(fn, args, words):
    from coursework import _core
    with pytest.raises(ExerciseError) as info:
        _core.attempt("99.9 (numpy)", fn, *args)
    message = str(info.value)
    assert "numpy stopped your function at" in message
    for word in words:
        assert word in message, (word, message)


def test_numpy_error_never_calls_a_learners_own_raise_numpys():
    """A learner's `raise ValueError(...)` stays the learner's error, even on a line that
    calls numpy or with a message that reads like numpy's."""
    from coursework import _core

    def own_check(g):
        raise ValueError(f"expected a (3, 5) gradient, got shape {np.shape(g)}")

    def own_copy_of_numpys_words(g):
        raise ValueError(
            "cannot reshape array of size 4 into shape (3,5)")

    def plain_python(g):
        return int("three")

    for fn in (own_check, own_copy_of_numpys_words, plain_python):
        with pytest.raises(ValueError) as info:
            _core.attempt("99.9 (numpy)", fn, np.ones(4))
        assert not isinstance(info.value, ExerciseError)
        assert _core.numpy_error(fn, info.value) is None


# ---------------------------------------------------------------- 04.3
class Spot(NamedTuple):
    index: tuple
    analytic: float
    numeric: float
    rel_err: float
    abs_err: float
    ok: bool


def make_spot_check(partial=partial_right, rule="or", draw="rng", errors=errors_right):
    def spot_check(f, x, analytic_grad, n_checks=6, eps=1e-6, rtol=1e-6, atol=1e-8, seed=0):
        if draw == "rng":
            flat = np.random.default_rng(seed).choice(x.size, min(n_checks, x.size), replace=False)
        elif draw == "first":
            flat = np.arange(min(n_checks, x.size))
        else:  # with replacement
            flat = np.random.default_rng(seed).integers(0, x.size, min(n_checks, x.size))
        rows = []
        for k in flat:
            index = tuple(int(i) for i in np.unravel_index(k, x.shape))
            a = float(analytic_grad[index])
            n = float(partial(f, x, index, eps))
            rel, ab = (float(v) for v in errors(np.array(a), np.array(n)))
            if rule == "or":
                ok = ab <= atol or rel <= rtol
            elif rule == "and":
                ok = ab <= atol and rel <= rtol
            elif rule == "absolute":
                ok = ab <= atol
            else:  # relative error alone
                ok = rel <= rtol
            rows.append(Spot(index, a, n, rel, ab, ok))
        return rows
    return spot_check


def test_04_3_passes_seeded_spot_checks(capsys):
    lesson04.check_spot_check(make_spot_check())
    assert "Exercise 04.3 (spot_check) passed." in capsys.readouterr().out


def test_04_3_accepts_plain_tuples():
    inner = make_spot_check()
    lesson04.check_spot_check(lambda *a: [tuple(r) for r in inner(*a)])


@pytest.mark.parametrize("answer, phrase", [
    (stub, "not done yet"),
    (make_spot_check(rule="relative"), "relative error alone cannot judge"),
    (make_spot_check(rule="and"), "relative error alone cannot judge"),
    (make_spot_check(rule="absolute"), "judges by the absolute error alone"),
    (make_spot_check(partial=partial_forward), "forward difference"),
    (make_spot_check(draw="first"), "at random from the seed"),
    (make_spot_check(draw="replace"), "without replacement"),
    (make_spot_check(errors=errors_sum), "Use gradient_errors"),
    (lambda *a: {"ok": True}, "one row per checked element"),
])
def test_04_3_names_the_mistake(answer, phrase):
    with pytest.raises(ExerciseError, match="Exercise 04.3") as err:
        lesson04.check_spot_check(answer)
    assert phrase in str(err.value)


def test_04_3_the_near_zero_hint_does_not_hand_over_the_rule():
    for rule in ("relative", "and"):
        with pytest.raises(ExerciseError) as err:
            lesson04.check_spot_check(make_spot_check(rule=rule))
        assert "OR rel_err <= rtol" not in str(err.value)


def test_04_3_catches_a_checker_that_never_fails():
    def always_ok(*args):
        return [r._replace(ok=True) for r in make_spot_check()(*args)]
    with pytest.raises(ExerciseError, match="flags nothing"):
        lesson04.check_spot_check(always_ok)


# ---------------------------------------------------------------- 04.4
def test_04_4_passes_the_balance_point(capsys):
    lesson04.check_best_step(lambda u: (3 * u) ** (1 / 3))
    out = capsys.readouterr().out
    assert "Exercise 04.4 (best_step) passed." in out and "6.9e-06" in out and "5.6e-03" in out


@pytest.mark.parametrize("answer, phrase", [
    (stub, "not done yet"),
    (np.sqrt, "forward difference"),
    (lambda u: u ** (1 / 3), "dropped the constants"),
    (lambda u: (6 * u) ** (1 / 3), "where the two errors are equal"),
    (lambda u: u, "worst choice"),
])
def test_04_4_names_the_mistake(answer, phrase):
    with pytest.raises(ExerciseError, match="Exercise 04.4") as err:
        lesson04.check_best_step(answer)
    assert phrase in str(err.value)


def test_04_4_each_slip_is_named_by_its_reproduction():
    from coursework.lesson04 import step
    assert_each_slip_named(lesson04.check_best_step, step._step_cases(), step.STEP_SLIPS,
                           step.best_step_reference, same=lambda a, b: np.isclose(a, b, rtol=1e-6))


@pytest.mark.parametrize("answer", [
    lambda u: 1e-6,                                  # one step for every precision
    lambda u: (3 * u) ** 0.5,                        # the right constant, the wrong power
    lambda u: (3 * u) ** (1 / 3) if u > 1e-10 else 1e-5,   # right for coarse u only
])
def test_04_4_a_wrong_step_that_is_no_known_slip_gets_the_neutral_message(answer):
    with pytest.raises(ExerciseError) as err:
        lesson04.check_best_step(answer)
    message = str(err.value)
    assert "the minimum of E(eps)" in message and "times it" in message
    assert "Hint" not in message and "dE/deps" not in message and "eps/3" not in message


def test_04_4_no_message_holds_the_equation_one_step_from_the_answer():
    for answer in (np.sqrt, lambda u: u ** (1 / 3), lambda u: (6 * u) ** (1 / 3), lambda u: u,
                   lambda u: 1e-6):
        with pytest.raises(ExerciseError) as err:
            lesson04.check_best_step(answer)
        assert "eps/3 - u/eps**2" not in str(err.value) and "dE/deps = 0" not in str(err.value)


def test_04_4_answer_agrees_with_the_measured_sweep():
    from engine.eps_sweep import sweep_both
    sweeps = sweep_both()
    for name, u in (("float64", 2.0 ** -53), ("float32", 2.0 ** -24)):
        best = (3 * u) ** (1 / 3)
        assert best / 10 <= sweeps[name].best_eps <= best * 10


# ---------------------------------------------------------------- 04.5
def away_right(x, eps=1e-6):
    # written without a boolean index: one np.where over the whole array
    gap = 10 * eps
    side = np.where(x < 0, -1.0, 1.0)
    return np.where(np.abs(x) < gap, side * gap, x)


def away_wider(x, eps=1e-6):
    """A margin of 5 eps instead of 10: still farther than eps, still fair."""
    out = x.copy()
    near = np.abs(out) < 5 * eps
    out[near] = np.where(out[near] < 0, -5 * eps, 5 * eps)
    return out


def away_in_place(x, eps=1e-6):
    near = np.abs(x) < 10 * eps
    x[near] = np.where(x[near] < 0, -10 * eps, 10 * eps)
    return x


def away_shift_all(x, eps=1e-6):
    return x + 10 * eps


def away_sign(x, eps=1e-6):
    return np.where(np.abs(x) < 10 * eps, np.sign(x) * 10 * eps, x)


def away_abs(x, eps=1e-6):
    return np.where(np.abs(x) < 10 * eps, np.maximum(np.abs(x), 10 * eps), x)


def away_by_eps(x, eps=1e-6):
    return np.where(np.abs(x) < 10 * eps, np.where(x < 0, -eps, eps), x)


def away_fixed_gap(x, eps=1e-6):
    gap = 1e-5                                   # right for eps=1e-6 only
    return np.where(np.abs(x) < gap, np.where(x < 0, -gap, gap), x)


def away_dropped(x, eps=1e-6):
    return x[np.abs(x) >= 10 * eps]


def same_mask_right(loss, seed):
    def f(values):
        rng = np.random.default_rng(seed)        # a new generator on every call
        return loss(values, rng)
    return f


def same_mask_made_once(loss, seed):
    rng = np.random.default_rng(seed)
    return lambda values: loss(values, rng)


def same_mask_unseeded(loss, seed):
    return lambda values: loss(values, np.random.default_rng())


def same_mask_other_seed(loss, seed):
    return lambda values: loss(values, np.random.default_rng(seed + 1))


def same_mask_seed_seven(loss, seed):
    return lambda values: loss(values, np.random.default_rng(7))    # the demonstration's seed


def same_mask_first_loss_kept(loss, seed):
    """The right loss on every call, but the values' changes never reach it."""
    kept = []

    def f(values):
        if not kept:
            kept.append(loss(values, np.random.default_rng(seed)))
        return kept[0]
    return f


def test_04_5_unseeded_masks_are_never_named_a_slip():
    """An unseeded generator draws masks no reproduction can repeat: the check says where the
    losses differ, every time, and never names the generator made once (whose first draw
    an unseeded one matches one time in 64)."""
    for _ in range(60):
        with pytest.raises(ExerciseError) as info:
            lesson04.fair._check_same_mask(same_mask_unseeded)
        message = str(info.value)
        assert "calls of your function on the same values gave the losses" in message
        assert "Hint" not in message and "made once" not in message


def test_04_5_passes_both_fixes(capsys):
    lesson04.check_fair_checks(away_right, same_mask_right)
    out = capsys.readouterr().out
    assert "Exercise 04.5 (away_from_kink, same_mask) passed." in out
    assert "both branches" in out and "same mask" in out


def test_04_5_accepts_any_margin_beyond_eps():
    lesson04.check_fair_checks(away_wider, same_mask_right)


@pytest.mark.parametrize("away, same, words", [
    (stub, same_mask_right, ["Exercise 04.5", "not done yet"]),
    (away_right, stub, ["Exercise 04.5", "not done yet"]),
    (away_in_place, same_mask_right, ["changed x itself", "x.copy()"]),
    (away_shift_all, same_mask_right, ["move only the points closer than 10*eps"]),
    (away_sign, same_mask_right, ["np.sign(0) is 0"]),
    (away_abs, same_mask_right, ["across the kink", "both branches"]),
    (away_by_eps, same_mask_right, ["within eps of the kink", "farther than eps"]),
    (away_fixed_gap, same_mask_right, ["eps=0.001", "margin must grow with eps"]),
    (away_dropped, same_mask_right, ["every point of x comes back"]),
    (away_right, same_mask_made_once, ["a generator made once", "advanced by every call"]),
    (away_right, same_mask_seed_seven, ["the mask of seed 7", "whatever the seed argument"]),
    (away_right, same_mask_unseeded, ["calls of your function on the same values gave"]),
    (away_right, same_mask_other_seed, ["every call of your function gives the loss"]),
    (away_right, lambda loss, seed: loss, ["a checker calls f(values), one argument"]),
    (away_right, lambda loss, seed: 0.5, ["should return a function"]),
])
def test_04_5_names_the_mistake(away, same, words):
    fails_with(lesson04.check_fair_checks, away, same, words=["Exercise 04.5", *words])


def test_04_5_each_kink_slip_is_named_by_its_reproduction():
    fair = lesson04.fair
    assert_each_slip_named(lambda away: lesson04.check_fair_checks(away, same_mask_right),
                           fair._kink_cases(), fair.KINK_SLIPS, fair.away_from_kink_reference,
                           same=fair._same_points)


@pytest.mark.parametrize("away, slip", [
    (away_shift_all, 0), (away_sign, 2), (away_abs, 3), (away_by_eps, 4), (away_fixed_gap, 5),
])
def test_04_5_a_kink_slip_written_by_hand_gets_its_reproductions_name(away, slip):
    fair = lesson04.fair
    for case in fair._kink_cases():
        assert np.allclose(away(case.args[0].copy(), case.args[1]),
                           fair.KINK_SLIPS[slip].reproduce(*case.args), rtol=1e-12, atol=0)
    hint = fair.KINK_SLIPS[slip].hint
    message = fails_with(lesson04.check_fair_checks, away, same_mask_right)
    assert (hint if isinstance(hint, str) else "margin must grow with eps") in message


@pytest.mark.parametrize("same, slip", [(same_mask_made_once, 0), (same_mask_seed_seven, 1)])
def test_04_5_each_mask_slip_is_named_by_its_reproduction(same, slip):
    """The reproduction gives, call for call, what a checker sees through the learner's
    function written as that slip; that function gets the slip's hint."""
    fair = lesson04.fair
    for case in fair._mask_cases():
        loss, seed, values = case.args
        got = fair._mask_answer(same(loss, seed), values)
        assert fair._same_mask_answer(got, fair.MASK_SLIPS[slip].reproduce(*case.args))
    message = fails_with(lesson04.check_fair_checks, away_right, same)
    assert fair.MASK_SLIPS[slip].hint in message


def away_times_ten(x, eps=1e-6):
    return np.where(np.abs(x) < 10 * eps, 10 * x, x)      # 0 stays on the kink


def away_half_eps(x, eps=1e-6):
    return np.where(np.abs(x) < 10 * eps, np.where(x < 0, -eps / 2, eps / 2), x)


@pytest.mark.parametrize("away, same, words", [
    (away_times_ten, same_mask_right, ["x[0, 0] = 0 came back as 0", "the lesson's answer has 1e-05",
                                       "cannot use 1 of the 8 points"]),
    (away_half_eps, same_mask_right, ["on the lesson's points", "came back as 5e-07"]),
    (away_right, same_mask_unseeded, ["same_mask(loss, seed=11)", "where the backward pass "
                                      "under check has"]),
    (away_right, same_mask_other_seed, ["every call of your function gives the loss",
                                        "off)"]),
    (away_right, same_mask_first_loss_kept, ["central differences through your function",
                                             "is 0.0 where the reference has"]),
])
def test_04_5_a_wrong_answer_that_is_no_known_slip_gets_the_neutral_message(away, same, words):
    message = fails_with(lesson04.check_fair_checks, away, same, words=["Exercise 04.5", *words])
    assert "Hint" not in message
    # and no message hands over a line of the answer
    assert "default_rng(seed)" not in message and "np.abs(x) < 10" not in message


def test_04_5_a_right_answer_written_differently_passes_every_case(capsys):
    def away_by_steps(x, eps=1e-6):
        out = np.array(x, dtype=float)
        for i in np.ndindex(out.shape):
            if abs(out[i]) < 10 * eps:
                out[i] = -10 * eps if out[i] < 0 else 10 * eps
        return out

    def same_mask_by_class(loss, seed):
        class Fixed:
            def __call__(self, values):
                return loss(values, np.random.default_rng(seed))
        return Fixed()

    lesson04.check_fair_checks(away_by_steps, same_mask_by_class)
    out = capsys.readouterr().out
    assert "Exercise 04.5 (away_from_kink, same_mask) passed." in out
    assert "the lesson's 2 and 4 generated" in out and "the lesson's and 3 generated" in out


def test_04_5_the_untouched_stubs_say_not_done_yet():
    for away, same in ((stub, same_mask_right), (away_right, stub), (stub, stub)):
        message = fails_with(lesson04.check_fair_checks, away, same,
                             words=["Exercise 04.5", "not done yet"])
        assert "Hint" not in message


def test_04_5_the_unfair_checks_fail_a_right_gradient():
    """The lesson's claim: at the kink, and with a mask drawn afresh, a correct gradient
    fails its check; after the fixes it passes."""
    from coursework.slots import engine_spot_check
    x = lesson04.fair._KINK_X
    right = lesson04.fair._relu_loss_grad
    for points, passes in ((x, False), (away_right(x), True)):
        rows = engine_spot_check(lesson04.fair._relu_loss, points, right(points), n_checks=x.size)
        assert all(r.ok for r in rows) is passes


# ---------------------------------------------------------------- 04.6
import engine  # noqa: E402


def report_of(part):
    return engine.gradcheck(part.fn, part.inputs, eps=1e-5, raise_on_failure=False)


def localize_right(parts):
    # written differently: rank the parts by level, then take the first failing one
    rank = {"op": 0, "layer": 1, "network": 2}
    ranked = sorted(parts, key=lambda name: rank[parts[name].level])   # stable: dict order
    failing = [name for name in ranked if not report_of(parts[name]).ok]
    return failing[0] if failing else None


def localize_top_down(parts):
    for level in ("network", "layer", "op"):
        for name, part in parts.items():
            if part.level == level and not report_of(part).ok:
                return name
    return None


def localize_dict_order(parts):
    return next((name for name, part in parts.items() if not report_of(part).ok), None)


def localize_layers_first(parts):
    for level in ("layer", "op", "network"):
        for name, part in parts.items():
            if part.level == level and not report_of(part).ok:
                return name
    return None


def localize_ops_only(parts):
    return next((name for name, part in parts.items()
                 if part.level == "op" and not report_of(part).ok), None)


def localize_report(parts):
    for level in ("op", "layer", "network"):
        for part in parts.values():
            if part.level == level:
                report = report_of(part)
                if not report.ok:
                    return report
    return None


def localize_raises(parts):
    for level in ("op", "layer", "network"):
        for name, part in parts.items():
            if part.level == level:
                engine.gradcheck(part.fn, part.inputs, eps=1e-5)
    return None


def localize_always_softplus(parts):
    return "softplus"


def localize_all_failing(parts):
    return [name for name in parts if not report_of(parts[name]).ok]


def test_04_6_passes_a_local_to_global_walk(capsys):
    lesson04.check_localize(localize_right)
    assert "Exercise 04.6 (localize) passed." in capsys.readouterr().out


def test_04_6_the_cases_are_what_the_lesson_says():
    """The lesson's network: softplus, hidden and the network fail; the variants: add_bias,
    then a bug only the hidden layer's batch shows, then nothing."""
    failing = []
    for what, bugs, order in lesson04.localize._LOCAL_CASES:
        parts = lesson04.network_parts(bugs, order)
        failing.append(sorted(n for n, p in parts.items() if not lesson04.check_part(p).ok))
    assert failing == [["hidden", "network", "softplus"], ["add_bias", "hidden", "network"],
                       ["hidden", "network"], []]
    assert [localize_right(lesson04.network_parts(b, o)) for _, b, o in
            lesson04.localize._LOCAL_CASES] == ["softplus", "add_bias", "hidden", None]
    # the lesson's own dict lists the network first
    assert list(lesson04.network_parts())[0] == "network"


@pytest.mark.parametrize("answer, words", [
    (stub, ["not done yet"]),
    (localize_top_down, ["the end-to-end check only says something is wrong"]),
    (localize_dict_order, ["first failing part in the order the dict lists them"]),
    (localize_layers_first, ["you checked the layers before the ops"]),
    (localize_ops_only, ["every op passes on its own here", "you stopped after the ops"]),
    (localize_report, ["returned a report", "return the part's name"]),
    (localize_raises, ["raised on a failing check", "raise_on_failure=False"]),
    (localize_always_softplus, ["'softplus' (op, passes its check)"]),
    (localize_all_failing, ["return one name"]),
])
def test_04_6_names_the_mistake(answer, words):
    fails_with(lesson04.check_localize, answer, words=["Exercise 04.6", *words])


def test_04_6_a_layer_named_when_its_op_fails(monkeypatch):
    # parts listed network first, so a layers-first walk is not the dict's order
    monkeypatch.setattr(lesson04.localize, "_LOCAL_CASES", lesson04.localize._LOCAL_CASES[1:2])
    fails_with(lesson04.check_localize, localize_layers_first,
               words=["you returned 'hidden' (layer, fails its check)",
                      "'add_bias' (op, fails its check)", "you checked the layers before"])


def test_04_6_none_when_nothing_fails():
    def never_none(parts):
        return localize_right(parts) or "network"
    message = fails_with(lesson04.check_localize, never_none,
                         words=["the network with no bug", "every part passes its check here"])
    assert "Hint" not in message


def localize_ops_then_network(parts):
    for level in ("op", "network"):
        for name, part in parts.items():
            if part.level == level and not report_of(part).ok:
                return name
    return None


def localize_last_failing_op_first(parts):
    """Within a level, the last failing part in the dict's order: right whenever one part
    of a level fails, wrong where two ops fail at once."""
    for level in ("op", "layer", "network"):
        failing = [n for n, p in parts.items() if p.level == level and not report_of(p).ok]
        if failing:
            return failing[-1]
    return None


def test_04_6_each_slip_is_named_by_its_reproduction():
    import operator
    from coursework.lesson04 import localize
    assert_each_slip_named(lesson04.check_localize, localize._local_cases(),
                           localize.LOCAL_SLIPS, localize.localize_reference, same=operator.eq)


@pytest.mark.parametrize("answer, slip", [
    (localize_ops_then_network, 0), (localize_top_down, 1), (localize_dict_order, 2),
    (localize_layers_first, 3), (localize_ops_only, 4),
])
def test_04_6_a_slip_written_by_hand_gets_its_reproductions_name(answer, slip):
    from coursework.lesson04 import localize
    reproduce = localize.LOCAL_SLIPS[slip].reproduce
    assert all(answer(dict(case.args[0])) == reproduce(*case.args)
               for case in localize._local_cases())
    fails_with(lesson04.check_localize, answer, words=[localize.LOCAL_SLIPS[slip].hint])


@pytest.mark.parametrize("answer, words", [
    (localize_last_failing_op_first, ["generated network #1 (seed 47)",
                                      "you returned 'add_bias' (op, fails its check)",
                                      "the most local failing part is 'softplus'"]),
    (localize_always_softplus, ["halved: you returned 'softplus' (op, passes its check)"]),
])
def test_04_6_a_wrong_answer_that_is_no_known_slip_gets_the_neutral_message(answer, words):
    message = fails_with(lesson04.check_localize, answer, words=["Exercise 04.6", *words])
    assert "Hint" not in message


def test_04_6_a_right_answer_written_differently_passes_every_case(capsys):
    def localize_by_sets(parts):
        verdicts = {name: report_of(part).ok for name, part in parts.items()}
        for level in lesson04.LEVELS:
            bad = [name for name in parts if parts[name].level == level and not verdicts[name]]
            if bad:
                return bad[0]
        return None

    lesson04.check_localize(localize_by_sets)
    out = capsys.readouterr().out
    assert "Exercise 04.6 (localize) passed." in out and "the lesson's 4 and 5 generated" in out


def test_04_6_the_untouched_stub_says_not_done_yet():
    message = fails_with(lesson04.check_localize, stub, words=["Exercise 04.6", "not done yet"])
    assert "Hint" not in message


# ---------------------------------------------------------------- the notebook
import importlib  # noqa: E402
import re  # noqa: E402

from IPython.core.interactiveshell import InteractiveShell  # noqa: E402

from coursework import _core  # noqa: E402
from notebook_tools import (ROOT, build_course, cell_errors, cell_stdout,  # noqa: E402
                            run_judging_unfinished_exercises)


def _exercise_functions(stem):
    """The functions a lesson's exercise cells ask for, and the lesson's check ids."""
    source = (ROOT / "course" / "source" / f"{stem}.py").read_text()
    found = set()
    for kind, cell in build_course.parse_cells(source):
        for chunk in re.split(r"^(?=def |class )", cell, flags=re.M):
            name = re.match(r"def (\w+)", chunk)
            if kind == "code" and name and "### BEGIN SOLUTION" in chunk:
                found.add(name.group(1))
    return found, build_course.check_ids(source)


@pytest.mark.parametrize("stem, module", [("04_gradient_checking", "lesson04"),
                                          ("07_training_step_budget", "lesson07")])
def test_every_exercise_function_is_named_with_its_exercise(stem, module):
    table = importlib.import_module(f"coursework.{module}").EXERCISE_FUNCTIONS
    functions, checks = _exercise_functions(stem)
    assert set(table) == functions
    for name, exercise in table.items():
        assert exercise.split()[0] in checks and name in exercise, (name, exercise)


@pytest.fixture()
def shell():
    shell = InteractiveShell.instance()
    yield shell
    shell.set_custom_exc((), None)


def test_an_unfinished_exercise_is_named_in_one_line(shell, capsys):
    lesson04.name_unfinished_exercises()            # outside IPython: nothing happens
    _core.name_unfinished_exercises(lesson04.EXERCISE_FUNCTIONS, shell=shell)
    assert not shell.run_cell("rows = spot_check(1)").success
    never_ran = capsys.readouterr().out
    shell.run_cell("def localize(parts):\n    raise NotImplementedError()")
    assert not shell.run_cell("print('verdicts'); localize({})").success
    stub = capsys.readouterr().out
    assert not shell.run_cell("some_other_name").success
    other = capsys.readouterr().out
    assert never_ran.count("\n") == 1 and "UnfinishedExercise" in never_ran
    assert "finish exercise 04.3 (spot_check) first" in never_ran and "has not run" in never_ran
    assert stub.splitlines()[0] == "verdicts" and len(stub.splitlines()) == 2
    assert "finish exercise 04.6 (localize) first" in stub and "still the stub" in stub
    assert "NameError" in other and "some_other_name" in other and "finish" not in other


def test_a_stub_error_from_elsewhere_is_left_alone(shell):
    """Only a NotImplementedError raised in the notebook's own exercise function is named."""
    def localize(parts):
        raise NotImplementedError()
    try:
        localize({})
    except NotImplementedError as error:
        assert _core.unfinished_exercise(error, lesson04.EXERCISE_FUNCTIONS, {}) is None
        named = _core.unfinished_exercise(error, lesson04.EXERCISE_FUNCTIONS,
                                          localize.__globals__)
        assert named is not None and named.exercise == "04.6 (localize)"


def test_lesson_04_demonstrations_run_without_the_exercises(tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path / "pieces"))
    cells = run_judging_unfinished_exercises("04_gradient_checking",
                                             lesson04.EXERCISE_FUNCTIONS)
    by_text = {key: next(c for c in cells if key in c.source)
               for key in ("def relu_sum", "fresh_seed = ", "EpsSweep(", "lesson04.check_part")}
    for key in ("def relu_sum", "fresh_seed = ", "EpsSweep("):
        assert not cell_errors(by_text[key]), key
    assert "softplus" in cell_stdout(by_text["lesson04.check_part"])      # the verdicts came first


# ================================================================ lesson 05
import engine  # noqa: E402
from engine import Tensor  # noqa: E402
from coursework import lesson05  # noqa: E402


# ---------------------------------------------------------------- 05.1
RIGHT_OUTCOMES = {**dict.fromkeys("adf", "raises"), "c": "wrong", **dict.fromkeys("beg", "right")}


def test_05_1_the_outcomes_are_what_the_engine_does():
    """The check's answers are measured: each snippet run on the engine."""
    for letter in lesson05.IN_PLACE_SNIPPETS:
        assert lesson05.snippet_outcome(letter)[0] == lesson05.IN_PLACE_TRUTH[letter], letter
    assert lesson05.IN_PLACE_TRUTH == RIGHT_OUTCOMES


def test_05_1_a_raising_snippet_names_the_op_but_no_node_number():
    outcome, seen = lesson05.snippet_outcome("f")
    assert outcome == "raises" and "tanh saved its output" in seen and "#" not in seen


def test_05_1_passes_the_right_outcomes(capsys):
    lesson05.check_in_place(lambda: dict(RIGHT_OUTCOMES))
    out = capsys.readouterr().out
    assert "Exercise 05.1 (in_place_outcomes) passed." in out and "1 silently wrong" in out


@pytest.mark.parametrize("change, words", [
    ({"a": "right"}, ["snippet a", "mul saves x"]),
    ({"b": "raises"}, ["snippet b", "saves nothing"]),
    ({"c": "raises"}, ["snippet c", "goes around the version counter"]),
    ({"c": "right"}, ["snippet c", "multiplies by the changed x"]),
    ({"d": "right"}, ["snippet d", "is a view", "version counter"]),
    ({"e": "raises"}, ["snippet e", "saved exp(x)"]),
    ({"f": "right"}, ["snippet f", "saves its output", "does not hide"]),
    ({"g": "wrong"}, ["snippet g", "private copy"]),
    ({"b": "raises", "g": "raises"}, ["2 outcome(s) to revisit", "snippet b"]),
    ({"a": "error"}, ["choose one of"]),
    ({"h": "right"}, ["'h' is not a snippet"]),
])
def test_05_1_names_the_mistake(change, words):
    fails_with(lesson05.check_in_place, lambda: {**RIGHT_OUTCOMES, **change},
               words=["Exercise 05.1", *words])


def test_05_1_stub_missing_and_not_a_dict():
    fails_with(lesson05.check_in_place, stub, words=["Exercise 05.1", "not done yet"])
    fails_with(lesson05.check_in_place, lambda: {"a": "raises"},
               words=["no outcome for snippet(s) b, c, d, e, f, g"])
    fails_with(lesson05.check_in_place, lambda: ["raises"] * 7, words=["return a dict"])


def find_broken_right(suspects, seed=0):
    rng = np.random.default_rng(seed)
    broken = []
    for name, s in suspects.items():
        inputs = [rng.normal(size=shape) for shape in s.shapes]
        if not engine.gradcheck(s.fn, inputs, raise_on_failure=False).ok:
            broken.append(name)
    return broken


def find_broken_positive_only(suspects, seed=0):
    rng = np.random.default_rng(seed)
    return [n for n, s in suspects.items()
            if not engine.gradcheck(s.fn, [np.abs(rng.normal(size=sh)) + 0.1 for sh in s.shapes],
                                    raise_on_failure=False).ok]


def find_broken_first_input_only(suspects, seed=0):
    rng = np.random.default_rng(seed)
    broken = []
    for name, s in suspects.items():
        inputs = [rng.normal(size=sh) for sh in s.shapes]
        if not engine.gradcheck(s.fn, inputs, wrt=[0], raise_on_failure=False).ok:
            broken.append(name)
    return broken


def find_broken_too_strict(suspects, seed=0):
    rng = np.random.default_rng(seed)
    return [n for n, s in suspects.items()
            if not engine.gradcheck(s.fn, [rng.normal(size=sh) for sh in s.shapes],
                                    rtol=1e-14, atol=0.0, raise_on_failure=False).ok]


def find_broken_memorised(suspects, seed=0):
    return ["square", "sigmoid", "leaky_relu", "x_exp", "add_bias"]


def test_05_2_passes_a_real_search(capsys):
    lesson05.check_find_broken(find_broken_right)
    assert "Exercise 05.2 (find_broken) passed." in capsys.readouterr().out


@pytest.mark.parametrize("answer, phrase", [
    (stub, "not done yet"),
    (find_broken_positive_only, "both signs"),
    (find_broken_first_input_only, "check every input"),
    (find_broken_too_strict, "is correct"),
    (find_broken_memorised, "the lesson's answer for a different set"),
    (lambda suspects: "square", "list (or set) of suspect names"),
    (lambda suspects: ["relu"], "not one of the suspects"),
])
def test_05_2_names_the_mistake(answer, phrase):
    with pytest.raises(ExerciseError, match="Exercise 05.2") as err:
        lesson05.check_find_broken(answer)
    assert phrase in str(err.value)


def find_broken_with(spot_check, views="all", n_checks=None):
    """The lesson's way: a spot check (04.3's calling convention) on every scalar view."""
    def find_broken(suspects, seed=0):
        rng = np.random.default_rng(seed)
        broken = []
        for name, s in suspects.items():
            arrays = [rng.normal(size=shape) for shape in s.shapes]
            triples = lesson05.scalar_views(s, arrays)
            for f, x, grad in (triples if views == "all" else triples[:1]):
                rows = spot_check(f, x, grad, n_checks=n_checks or x.size)
                if not all(r.ok for r in rows):
                    broken.append(name)
                    break
        return broken
    return find_broken


def test_05_2_passes_with_either_checker(capsys):
    """Whose spot_check runs (the engine's, or one written as in 04.3) changes nothing."""
    from coursework.slots import engine_spot_check
    for checker in (engine_spot_check, make_spot_check()):
        lesson05.check_find_broken(find_broken_with(checker))
        assert "Exercise 05.2 (find_broken) passed." in capsys.readouterr().out


def test_05_2_a_spot_check_on_the_first_input_only_misses_the_bias():
    from coursework.slots import engine_spot_check
    fails_with(lesson05.check_find_broken, find_broken_with(engine_spot_check, views="first"),
               words=["Exercise 05.2", "add_bias", "check every input"])


def test_05_2_scalar_views_give_the_gradients_gradcheck_checks():
    for name, s in lesson05.suspects(dict.fromkeys(lesson05.LESSON_BUGS)).items():
        arrays = [np.random.default_rng(1).normal(size=shape) for shape in s.shapes]
        for f, x, grad in lesson05.scalar_views(s, arrays):
            assert grad.shape == x.shape
            k = (0,) * x.ndim
            up, down = x.copy(), x.copy()
            up[k] += 1e-6
            down[k] -= 1e-6
            assert np.isclose((f(up) - f(down)) / 2e-6, grad[k], rtol=1e-6, atol=1e-9), name


def test_05_3_the_plotted_values_do_not_depend_on_whose_checker_ran():
    for name, s in lesson05.suspects().items():
        engines = lesson05.numeric_and_analytic(s)
        yours = lesson05.numeric_and_analytic(s, make_spot_check())
        for (x1, a1, n1), (x2, a2, n2) in zip(engines, yours):
            np.testing.assert_array_equal(x1, x2)
            np.testing.assert_array_equal(a1, a2)
            np.testing.assert_allclose(n1, n2, rtol=1e-9, atol=1e-12)


def test_05_2_accepts_suspect_objects_as_well_as_names():
    lesson05.check_find_broken(lambda s: [s[n] for n in find_broken_right(s)])


RIGHT_VERDICTS = {"softplus": "ok", "square": "scale", "sigmoid": "sign",
                  "leaky_relu": "branch", "x_exp": "formula", "logsumexp": "ok",
                  "add_bias": "broadcast"}


def test_05_3_passes_the_right_verdicts(capsys):
    lesson05.check_verdicts(lambda: dict(RIGHT_VERDICTS))
    assert "Exercise 05.3 (verdicts) passed." in capsys.readouterr().out


@pytest.mark.parametrize("change, phrase", [
    ({"square": "sign"}, "exactly half the numerical one"),
    ({"leaky_relu": "formula"}, "agree for positive inputs"),
    ({"add_bias": "scale"}, "the gradient of x is right"),
    ({"softplus": "formula"}, "its check passes"),
    ({"x_exp": "scale"}, "ratio changes from element to element"),
    ({"square": "typo"}, "choose one of"),
])
def test_05_3_explains_a_wrong_verdict_with_the_evidence(change, phrase):
    with pytest.raises(ExerciseError, match="Exercise 05.3") as err:
        lesson05.check_verdicts(lambda: {**RIGHT_VERDICTS, **change})
    assert phrase in str(err.value)


def test_05_3_stub_and_missing_verdicts():
    with pytest.raises(ExerciseError, match="not done yet"):
        lesson05.check_verdicts(stub)
    partial = {k: v for k, v in RIGHT_VERDICTS.items() if k != "sigmoid"}
    with pytest.raises(ExerciseError, match="no verdict for \\['sigmoid'\\]"):
        lesson05.check_verdicts(lambda: partial)


def test_05_3_evidence_is_what_a_gradient_check_shows():
    """The hints state facts about the lesson's suspects; measure each one."""
    for name, s in lesson05.suspects().items():
        (x, a, n), *rest = lesson05.numeric_and_analytic(s)
        bug = lesson05.LESSON_BUGS[name]
        if bug is None:
            np.testing.assert_allclose(a, n, rtol=1e-6, atol=1e-9)
        elif bug == "scale":
            np.testing.assert_allclose(a, 0.5 * n, rtol=1e-6)
        elif bug == "sign":
            np.testing.assert_allclose(a, -n, rtol=1e-6)
        elif bug == "branch":
            np.testing.assert_allclose(a[x > 0], n[x > 0], rtol=1e-6)
            assert np.all(np.abs(a[x < 0] - n[x < 0]) > 1e-3)
        elif bug == "broadcast":
            np.testing.assert_allclose(a, n, rtol=1e-6)          # x is right
            xb, ab, nb = rest[0]
            assert not np.allclose(ab, nb, rtol=1e-3)             # the bias is not
        elif bug == "formula":
            ratio = a / n
            assert np.ptp(ratio) > 0.1 and not np.allclose(a, n, rtol=1e-3)


def test_05_4_passes_the_right_triage(capsys):
    lesson05.check_triage(lambda: {"A": 2, "B": 5, "C": 4, "D": 7, "E": 8})
    assert "Exercise 05.4 (triage) passed." in capsys.readouterr().out


@pytest.mark.parametrize("answers, phrase", [
    ({"A": 1}, "W1 takes part"),
    ({"E": 4}, "nothing accumulates"),
    ({"B": 6}, "overflows float64 as well"),
    ({"E": 9}, "right gradient of the loss as written"),
    ({"D": 5}, "would not say where they come from"),
    ({"B": 9}, "comes last for a reason"),
    ({"E": 3}, "diagnose('right shape, plausible direction, wrong size')"),
    ({"C": "four"}, "not a step number"),
])
def test_05_4_names_the_mistake(answers, phrase):
    right = {"A": 2, "B": 5, "C": 4, "D": 7, "E": 8}
    with pytest.raises(ExerciseError, match="Exercise 05.4") as err:
        lesson05.check_triage(lambda: {**right, **answers})
    assert phrase in str(err.value)


@pytest.mark.parametrize("case, wrong", [("A", 1), ("D", 5), ("D", 6), ("E", 4), ("E", 9),
                                         ("B", 6), ("C", 9), ("E", 3)])
def test_05_4_hints_never_give_away_the_step(case, wrong):
    right = {"A": 2, "B": 5, "C": 4, "D": 7, "E": 8}
    with pytest.raises(ExerciseError) as err:
        lesson05.check_triage(lambda: {**right, case: wrong})
    hint = str(err.value).split("Hint:", 1)[1]
    step = right[case]
    assert f"step {step}" not in hint and f"by step" not in hint, hint
    assert f"({step})" not in hint, hint          # not the one step left of a list


def test_05_4_mystery_a_is_step_2_by_the_steps_own_words():
    """Step 1 asks whether the parameter takes part; W1 does, so only step 2 fits A."""
    assert "takes part" in lesson05.STEPS[1] and ".data" in lesson05.STEPS[2]


def test_05_4_stub_and_missing():
    with pytest.raises(ExerciseError, match="not done yet"):
        lesson05.check_triage(stub)
    with pytest.raises(ExerciseError, match="no step for mystery D, E"):
        lesson05.check_triage(lambda: {"A": 2, "B": 5, "C": 4})


def test_diagnose_finds_a_row_by_a_word_and_lists_steps_in_order():
    text = lesson05.diagnose("NaN")
    assert text.startswith("symptom: grad contains NaN or Inf")
    assert text.index("  5. ") < text.index("  6. ")
    with pytest.raises(KeyError, match="matches 0 symptoms"):
        lesson05.diagnose("segfault")
    with pytest.raises(KeyError, match="matches 2 symptoms"):
        lesson05.diagnose("eps")
    for symptom, (causes, steps) in lesson05.SYMPTOMS.items():
        assert set(steps) <= set(lesson05.STEPS), symptom
    for case, (symptom, step, why) in lesson05.MYSTERIES.items():
        assert symptom in lesson05.SYMPTOMS and step in lesson05.SYMPTOMS[symptom][1], case


def test_lesson_05_claims_about_the_engine():
    # the naive softmax overflows, and detect_anomaly blames exp in the forward
    w = Tensor(np.array([[1.0, -2.0, 0.5], [0.3, 0.2, -0.1]]), requires_grad=True)
    feats = Tensor(np.array([[1.0, 0.0], [0.0, 3000.0]]))
    with np.errstate(all="ignore"):
        with pytest.raises(engine.AnomalyError) as err:
            with engine.detect_anomaly():
                z = feats @ w
                e = engine.F.exp(z)
                (e / e.sum(axis=-1, keepdims=True)).sum().backward()
    assert err.value.op == "exp" and err.value.phase == "forward"
    # the square-batch broadcast bug passes gradcheck, yet its gradient differs
    x4, s0 = np.arange(16.0).reshape(4, 4) / 8, np.array([1.0, 2.0, 3.0, 4.0])
    right = engine.gradcheck(lambda x, s: ((x * s) ** 2).sum(), [x4, s0])
    wrong = engine.gradcheck(lambda x, s: ((x * s.reshape(-1, 1)) ** 2).sum(), [x4, s0])
    assert right.ok and wrong.ok
    g_right, g_wrong = Tensor(s0, requires_grad=True), Tensor(s0, requires_grad=True)
    ((Tensor(x4) * g_right) ** 2).sum().backward()
    ((Tensor(x4) * g_wrong.reshape(-1, 1)) ** 2).sum().backward()
    assert not np.allclose(g_right.grad, g_wrong.grad)


def same_mask_legacy_generator(loss, seed):
    return lambda values: loss(values, np.random.RandomState(seed))


def test_04_5_a_legacy_generator_is_named_not_a_traceback_through_the_check():
    """numpy's RandomState has no `integers`: the loss the check hands out says which
    generator it was given instead of failing inside the checker with AttributeError."""
    message = fails_with(lesson04.check_fair_checks, away_right, same_mask_legacy_generator)
    assert "handed a RandomState" in message and "Generator" in message
