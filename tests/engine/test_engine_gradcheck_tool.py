"""engine.gradcheck itself: it must catch a wrong rule, point at the element,
and behave as its flags say."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import F
from engine.rules import Op
from engine.tensor import apply


class WrongAtOneElement(Op):
    """y = x^2, with a VJP that is wrong at flat index 4 only."""
    name = "broken_square"

    def forward(self, x):
        self.save(x=x)
        return x * x

    def vjp(self, g):
        grad = 2 * self.x * g
        grad.reshape(-1)[4] *= 1.01
        return (grad,)


def test_a_wrong_rule_fails_and_the_report_points_at_the_element():
    x = np.linspace(0.5, 2.0, 12).reshape(3, 4)
    with pytest.raises(engine.GradcheckError) as err:
        engine.gradcheck(lambda t: apply(WrongAtOneElement, t), [x])
    report = err.value.report
    assert not report.ok and report.worst_index == (1, 0) and report.worst_input == 0
    assert report.rel_error == pytest.approx(0.01 / 1.01, rel=1e-4)  # |1.01a - a| / 1.01a
    assert report.abs_error == pytest.approx(abs(report.analytic - report.numeric))
    assert "FAILED" in str(err.value) and "[1, 0]" in str(err.value)


def test_return_instead_of_raise():
    x = np.linspace(0.5, 2.0, 12).reshape(3, 4)
    report = engine.gradcheck(lambda t: apply(WrongAtOneElement, t), [x],
                              raise_on_failure=False)
    assert not report.ok and report.checked == 12


def test_a_correct_op_passes_with_tiny_errors():
    rng = np.random.default_rng(0)
    report = engine.gradcheck(lambda a, b: F.tanh(a @ b), [rng.standard_normal((3, 4)),
                                                          rng.standard_normal((4, 2))])
    assert report.ok and report.checked == 12 + 8 and report.max_rel_error < 1e-7
    assert [p["checked"] for p in report.per_input] == [12, 8]


def test_sampling_checks_k_elements_per_input():
    rng = np.random.default_rng(0)
    report = engine.gradcheck(lambda a: F.exp(a).sum(), [rng.standard_normal((20, 30))],
                              samples=7)
    assert report.ok and report.checked == 7


def test_the_floor_keeps_exact_zeros_from_looking_like_failures():
    x = np.array([-1.0, -2.0, 0.5])   # relu: exact zero gradient at the negatives
    report = engine.gradcheck(lambda t: F.relu(t).sum(), [x], atol=0.0)
    assert report.ok
    no_floor = engine.gradcheck(lambda t: F.relu(t) * 1.0, [x], atol=0.0, floor=1e-300,
                                raise_on_failure=False)
    assert no_floor.max_rel_error <= 1.0  # an exact 0 against 0 is 0/0 floored, not NaN


def test_the_relu_kink_shows_as_a_mismatch():
    report = engine.gradcheck(lambda t: F.relu(t).sum(), [np.array([0.0])],
                              raise_on_failure=False)
    assert not report.ok and report.analytic == 0.0 and report.numeric == pytest.approx(0.5)


def test_integer_inputs_pass_through_and_named_tensors_name_the_worst():
    rng = np.random.default_rng(0)
    logits = engine.Tensor(rng.standard_normal((4, 5)), name="logits")
    report = engine.gradcheck(F.cross_entropy, [logits, np.array([0, 1, 2, 4])])
    assert report.ok and report.worst_name == "logits"


def test_needs_a_float_input():
    with pytest.raises(ValueError, match="no floating-point input"):
        engine.gradcheck(lambda i: i, [np.array([1, 2])])


def test_float32_checks_are_much_less_accurate():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(6)
    r64 = engine.gradcheck(lambda t: F.tanh(t), [x], eps=1e-6)
    r32 = engine.gradcheck(lambda t: F.tanh(t), [x], eps=1e-3, dtype=np.float32,
                           raise_on_failure=False)
    assert r32.max_rel_error > 100 * r64.max_rel_error


def test_wrt_holds_the_other_inputs_fixed():
    rng = np.random.default_rng(0)
    report = engine.gradcheck(lambda a, b: a * b, [rng.standard_normal(3),
                                                   rng.standard_normal(3)], wrt=[1])
    assert report.checked == 3 and [p["input"] for p in report.per_input] == [1]
