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
    from engine.eps_sweep import sweep_both
    sweeps = sweep_both()
    for name, u in (("float64", 2.0 ** -53), ("float32", 2.0 ** -24)):
        best = (3 * u) ** (1 / 3)
        assert best / 10 <= sweeps[name].best_eps <= best * 10


# ================================================================ lesson 05
import engine  # noqa: E402
from engine import Tensor  # noqa: E402
from coursework import lesson05  # noqa: E402


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


def test_05_1_passes_a_real_search(capsys):
    lesson05.check_find_broken(find_broken_right)
    assert "Exercise 05.1 (find_broken) passed." in capsys.readouterr().out


@pytest.mark.parametrize("answer, phrase", [
    (stub, "not done yet"),
    (find_broken_positive_only, "both signs"),
    (find_broken_first_input_only, "check every input"),
    (find_broken_too_strict, "is correct"),
    (find_broken_memorised, "the lesson's answer for a different set"),
    (lambda suspects: "square", "list (or set) of suspect names"),
    (lambda suspects: ["relu"], "not one of the suspects"),
])
def test_05_1_names_the_mistake(answer, phrase):
    with pytest.raises(ExerciseError, match="Exercise 05.1") as err:
        lesson05.check_find_broken(answer)
    assert phrase in str(err.value)


def test_05_1_accepts_suspect_objects_as_well_as_names():
    lesson05.check_find_broken(lambda s: [s[n] for n in find_broken_right(s)])


RIGHT_VERDICTS = {"softplus": "ok", "square": "scale", "sigmoid": "sign",
                  "leaky_relu": "branch", "x_exp": "formula", "logsumexp": "ok",
                  "add_bias": "broadcast"}


def test_05_2_passes_the_right_verdicts(capsys):
    lesson05.check_verdicts(lambda: dict(RIGHT_VERDICTS))
    assert "Exercise 05.2 (verdicts) passed." in capsys.readouterr().out


@pytest.mark.parametrize("change, phrase", [
    ({"square": "sign"}, "exactly half the numerical one"),
    ({"leaky_relu": "formula"}, "agree for positive inputs"),
    ({"add_bias": "scale"}, "the gradient of x is right"),
    ({"softplus": "formula"}, "its check passes"),
    ({"x_exp": "scale"}, "ratio changes from element to element"),
    ({"square": "typo"}, "choose one of"),
])
def test_05_2_explains_a_wrong_verdict_with_the_evidence(change, phrase):
    with pytest.raises(ExerciseError, match="Exercise 05.2") as err:
        lesson05.check_verdicts(lambda: {**RIGHT_VERDICTS, **change})
    assert phrase in str(err.value)


def test_05_2_stub_and_missing_verdicts():
    with pytest.raises(ExerciseError, match="not done yet"):
        lesson05.check_verdicts(stub)
    partial = {k: v for k, v in RIGHT_VERDICTS.items() if k != "sigmoid"}
    with pytest.raises(ExerciseError, match="no verdict for \\['sigmoid'\\]"):
        lesson05.check_verdicts(lambda: partial)


def test_05_2_evidence_is_what_a_gradient_check_shows():
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


def test_05_3_passes_the_right_triage(capsys):
    lesson05.check_triage(lambda: {"A": 2, "B": 5, "C": 4, "D": 7, "E": 8})
    assert "Exercise 05.3 (triage) passed." in capsys.readouterr().out


@pytest.mark.parametrize("answers, phrase", [
    ({"A": 1}, "W1 takes part"),
    ({"E": 4}, "step 4 is on the list"),
    ({"D": 5}, "would not say where they come from"),
    ({"B": 9}, "comes last for a reason"),
    ({"E": 3}, "diagnose('right shape, plausible direction, wrong size')"),
    ({"C": "four"}, "not a step number"),
])
def test_05_3_names_the_mistake(answers, phrase):
    right = {"A": 2, "B": 5, "C": 4, "D": 7, "E": 8}
    with pytest.raises(ExerciseError, match="Exercise 05.3") as err:
        lesson05.check_triage(lambda: {**right, **answers})
    assert phrase in str(err.value)


@pytest.mark.parametrize("case, wrong", [("A", 1), ("D", 5), ("D", 6), ("E", 4), ("E", 9),
                                         ("B", 6), ("C", 9), ("E", 3)])
def test_05_3_hints_never_give_away_the_step(case, wrong):
    right = {"A": 2, "B": 5, "C": 4, "D": 7, "E": 8}
    with pytest.raises(ExerciseError) as err:
        lesson05.check_triage(lambda: {**right, case: wrong})
    hint = str(err.value).split("Hint:", 1)[1]
    step = right[case]
    assert f"step {step}" not in hint and f"by step" not in hint, hint


def test_05_3_mystery_a_is_step_2_by_the_steps_own_words():
    """Step 1 asks whether the parameter takes part; W1 does, so only step 2 fits A."""
    assert "takes part" in lesson05.STEPS[1] and ".data" in lesson05.STEPS[2]


def test_05_3_stub_and_missing():
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
