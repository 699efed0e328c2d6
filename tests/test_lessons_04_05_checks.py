"""The exercise checks of lessons 04 and 05, fed right and typical wrong answers.

A check must pass a correct answer, fail a stub with the exercise's own "not
done yet" message, and fail each typical wrong answer with a hint that names
the mistake (asserted by matching a phrase of the hint).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest

from engine.exercises import ExerciseError, lesson04


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


def test_04_1_passes_a_central_difference(capsys):
    lesson04.check_numerical_partial(partial_right)
    assert "Exercise 04.1 (numerical_partial) passed." in capsys.readouterr().out


@pytest.mark.parametrize("answer, phrase", [
    (stub, "not done yet"),
    (partial_forward, "one-sided"),
    (partial_over_eps, "divide by 2*eps, not by eps"),
    (partial_in_place, "x was changed"),
    (partial_fixed_eps, "use the eps argument"),
    (partial_all_moved, "moved every element"),
    (lambda f, x, i, eps: np.zeros(3), "one number"),
])
def test_04_1_names_the_mistake(answer, phrase):
    with pytest.raises(ExerciseError, match="Exercise 04.1") as err:
        lesson04.check_numerical_partial(answer)
    assert phrase in str(err.value)


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


@pytest.mark.parametrize("answer, phrase", [
    (stub, "not done yet"),
    (errors_no_floor, "no floor"),
    (errors_floor_zero_to_nan_free, "there is no floor"),
    (errors_sum, "|a| + |n|"),
    (errors_analytic_only, "one gradient only"),
    (errors_signed, "absolute value"),
    (lambda a, n, floor=1e-10: np.abs(a - n), "pair (relative, absolute)"),
])
def test_04_2_names_the_mistake(answer, phrase):
    with pytest.raises(ExerciseError, match="Exercise 04.2") as err:
        lesson04.check_gradient_errors(answer)
    assert phrase in str(err.value)


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
    (lambda u: u ** (1 / 3), "wrong constant"),
    (lambda u: u, "worst choice"),
    (lambda u: 1e-6, "set dE/deps = 0"),
])
def test_04_4_names_the_mistake(answer, phrase):
    with pytest.raises(ExerciseError, match="Exercise 04.4") as err:
        lesson04.check_best_step(answer)
    assert phrase in str(err.value)


def test_04_4_answer_agrees_with_the_measured_sweep():
    from widgets.gradcheck_plot import sweep_both
    sweeps = sweep_both()
    for name, u in (("float64", 2.0 ** -53), ("float32", 2.0 ** -24)):
        best = (3 * u) ** (1 / 3)
        assert best / 10 <= sweeps[name].best_eps <= best * 10
