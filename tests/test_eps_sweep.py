"""The eps sweep of lesson 04: the U-shaped error curve, measured.

The claims the lesson makes, and where the expected numbers come from
(u = unit roundoff, 2**-24 for float32 and 2**-53 for float64; the test
functions have |f|, |f''|, |f'''| of order one on [-1, 1]):

* central differences: truncation ~ eps**2 |f'''| / 6, rounding ~ u |f| / eps,
  balanced at eps* = (3u)**(1/3): 6.9e-6 in float64 and 5.6e-3 in float32;
* forward differences: truncation ~ eps |f''| / 2, balanced at eps* = 2 sqrt(u):
  2.1e-8 in float64 and 4.9e-4 in float32.

The rounding error of a real function evaluation is a few u rather than one,
and the curve near its bottom is noisy, so the measured minimum is asserted to
lie within a factor 10 of eps* (one decade either way): that still separates
the two precisions (three decades apart) and the two methods cleanly.
"""
import numpy as np
import pytest

from engine.eps_sweep import (DEFAULT_EPS, DEFAULT_X, SMOOTH_FUNCTIONS, eps_sweep,
                              finite_difference, predicted_best_eps, relative_error, sweep_both)
from widgets.eps_sweep import EpsSweep

FUNCTIONS = list(SMOOTH_FUNCTIONS)


@pytest.fixture(scope="module")
def sweeps():
    """Every (function, method) -> {"float32": SweepResult, "float64": SweepResult}."""
    out = {}
    for name, (f, grad) in SMOOTH_FUNCTIONS.items():
        for method in ("central", "forward"):
            out[name, method] = sweep_both(f, DEFAULT_X, grad, DEFAULT_EPS, method)
    return out


@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_central_difference_error_is_u_shaped(sweeps, name, dtype):
    s = sweeps[name, "central"][dtype]
    k = s.best_index
    assert 0 < k < len(s.eps) - 1, f"the minimum sits at an end of the sweep: eps={s.best_eps}"
    # both ends are far above the valley: truncation on the right, rounding on the left
    assert s.error[0] > 30 * s.best_error, (s.error[0], s.best_error)   # eps = 1e-1
    assert s.error[-1] > 30 * s.best_error, (s.error[-1], s.best_error)  # eps = 1e-12
    # and the truncation side falls steadily toward the valley
    right = s.error[:k + 1]
    assert np.all(np.diff(right[: max(2, k // 2)]) < 0)


@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("dtype, lo, hi", [("float64", 1e-7, 1e-4), ("float32", 1e-3, 1e-1)])
def test_best_eps_of_central_difference_is_where_theory_puts_it(sweeps, name, dtype, lo, hi):
    s = sweeps[name, "central"][dtype]
    predicted = predicted_best_eps(dtype, "central")
    assert lo <= s.best_eps <= hi, f"{dtype}: best eps {s.best_eps:.1e} outside [{lo}, {hi}]"
    assert predicted / 10 <= s.best_eps <= predicted * 10, (s.best_eps, predicted)


@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_best_eps_of_forward_difference_is_where_theory_puts_it(sweeps, name, dtype):
    s = sweeps[name, "forward"][dtype]
    predicted = predicted_best_eps(dtype, "forward")
    assert predicted / 10 <= s.best_eps <= predicted * 10, (s.best_eps, predicted)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_float64_valley_is_far_deeper_than_float32(sweeps, name):
    both = sweeps[name, "central"]
    # best errors scale like u**(2/3): (2**29)**(2/3) ~ 6.5e5 apart; demand 1e4
    assert both["float64"].best_error * 1e4 < both["float32"].best_error
    assert both["float64"].best_error < 1e-9
    assert both["float32"].best_error < 1e-3


@pytest.mark.parametrize("name", FUNCTIONS)
def test_forward_difference_is_worse_than_central(sweeps, name):
    # best error ~ u**(1/2) for forward, u**(2/3) for central
    central = sweeps[name, "central"]["float64"]
    forward = sweeps[name, "forward"]["float64"]
    assert forward.best_error > 100 * central.best_error


@pytest.mark.parametrize("method, order", [("central", 2.0), ("forward", 1.0)])
def test_truncation_error_falls_like_eps_to_the_order(sweeps, method, order):
    s = sweeps[FUNCTIONS[0], method]["float64"]
    big = (s.eps <= 1e-1) & (s.eps >= 10 ** -2.5)  # rounding is negligible here
    slope = np.polyfit(np.log10(s.eps[big]), np.log10(s.error[big]), 1)[0]
    assert abs(slope - order) < 0.2, f"{method}: slope {slope:.2f}, expected {order}"


def test_float64_rounding_error_grows_as_eps_shrinks(sweeps):
    s = sweeps[FUNCTIONS[0], "central"]["float64"]
    # u |f| / eps: four decades of eps should cost roughly four decades of error
    assert s.error_at(1e-12) > 100 * s.error_at(1e-8)


def test_float32_step_below_the_spacing_of_x_is_lost(sweeps):
    s = sweeps[FUNCTIONS[0], "central"]["float32"]
    # near |x| ~ 0.1..1 the float32 spacing is ~1e-8..1e-7: x + 1e-10 == x,
    # the numerical gradient is exactly 0 and the relative error exactly 1
    assert s.error_at(1e-10) == 1.0
    x = np.float32(DEFAULT_X[0])
    assert x + np.float32(1e-10) == x


def test_regimes_name_the_dominant_error(sweeps):
    s = sweeps[FUNCTIONS[0], "central"]["float64"]
    assert s.regime(1e-1) == "truncation"
    assert s.regime(1e-12) == "rounding"
    assert s.regime(s.best_eps) == "valley"


def test_finite_difference_is_exact_for_a_quadratic_and_leaves_x_alone():
    x = np.array([[0.5, -1.5], [2.0, 0.25]])
    before = x.copy()
    g = finite_difference(lambda a: np.sum(3 * a ** 2 + a), x, 1e-3, np.float64, "central")
    np.testing.assert_allclose(g, 6 * before + 1, rtol=1e-9)
    np.testing.assert_array_equal(x, before)
    assert g.shape == x.shape and g.dtype == np.float64
    g_fwd = finite_difference(lambda a: np.sum(3 * a ** 2 + a), x, 1e-3, np.float64, "forward")
    np.testing.assert_allclose(g_fwd, 6 * before + 1 + 3e-3, rtol=1e-9)  # + eps f''/2


def test_relative_error_has_a_floor():
    r = relative_error(np.array([0.0, 1e-20, 2.0]), np.array([0.0, 0.0, 1.0]), floor=1e-12)
    assert np.all(np.isfinite(r))
    np.testing.assert_allclose(r, [0.0, 1e-8, 0.5])


def test_the_sweep_and_gradcheck_share_one_relative_error():
    from engine.gradcheck import relative_error as gradchecks
    assert relative_error is gradchecks


def test_eps_sweep_rejects_bad_arguments_with_a_clear_message():
    f, g = SMOOTH_FUNCTIONS[FUNCTIONS[0]]
    with pytest.raises(ValueError, match="float32 or float64"):
        eps_sweep(f, DEFAULT_X, g, dtype=np.float16)
    with pytest.raises(ValueError, match="method"):
        eps_sweep(f, DEFAULT_X, g, method="backward")
    with pytest.raises(ValueError, match="shape"):
        eps_sweep(f, DEFAULT_X, np.zeros(3))
    with pytest.raises(ValueError, match="positive"):
        eps_sweep(f, DEFAULT_X, g, eps_values=[1e-3, 0.0])


def test_widget_reports_the_numbers_of_the_pure_function():
    widget = EpsSweep(eps=1e-6)
    ref = sweep_both()
    text = widget.label.value
    assert "float32" in text and "float64" in text
    assert f"{ref['float64'].error_at(1e-6):.1e}" in text
    assert len(widget.plot.outputs) == 1

    widget.eps.value = 1e-10
    assert "rounding" in widget.label.value
    assert f"{ref['float64'].error_at(1e-10):.1e}" in widget.label.value

    widget.method.value = "forward"
    fwd = sweep_both(method="forward")
    assert f"best {fwd['float64'].best_error:.1e}" in widget.label.value

    widget.decades.value = (-8, -2)
    s = widget.sweeps()["float64"]
    assert np.isclose(s.eps.max(), 1e-2) and np.isclose(s.eps.min(), 1e-8)
    assert len(widget.plot.outputs) == 1  # redrawn, not appended
