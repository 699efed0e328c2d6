"""The eps sweep: how the error of a finite-difference gradient depends on eps.

A finite difference divides a small change of the loss by the small step that
caused it. Two errors pull in opposite directions as the step eps shrinks:

* truncation error: the difference quotient is the average slope over an
  interval of width 2*eps (central) or eps (forward), not the slope at the
  point. Taylor's theorem gives about eps**2 * |f'''| / 6 for the central
  difference and eps * |f''| / 2 for the forward one: it falls as eps falls.
* rounding error: f(x + eps) and f(x - eps) are each rounded to the working
  precision, an error of about u * |f| where u is the unit roundoff (2**-24
  for float32, 2**-53 for float64). Their difference keeps that error and the
  division by 2*eps magnifies it: about u * |f| / eps, which grows as eps falls.

The sum is U-shaped in eps. Setting its derivative to zero gives the bottom of
the valley (`predicted_best_eps`):

    central:  eps* = (3 u |f| / |f'''|) ** (1/3)   ~ 7e-6 (float64), 6e-3 (float32)
    forward:  eps* = 2 (u |f| / |f''|) ** (1/2)    ~ 2e-8 (float64), 5e-4 (float32)

for a function whose value and derivatives are of order one.

`eps_sweep` measures the curve; `widgets.eps_sweep.EpsSweep` is the
notebook widget over it. Everything the widget shows comes from these pure
functions, so the lesson's plot, the widget and the tests read the same numbers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .gradcheck import relative_error

#: The relative error's floor in a sweep: far below any gradient of the lesson's
#: functions, so the curve shows the error itself down to the smallest eps.
FLOOR = 1e-12

#: The unit roundoff u of each precision: half the gap between 1 and the next
#: representable number, so a correctly rounded result is within a factor
#: (1 + u) of the exact one.
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "float64": 2.0 ** -53}

#: The sweep of the lesson: 1e-1 down to 1e-12, four points per decade.
DEFAULT_EPS = np.logspace(-1, -12, 45)

METHODS = ("central", "forward")


def _dtype_name(dtype) -> str:
    name = np.dtype(dtype).name
    if name not in UNIT_ROUNDOFF:
        raise ValueError(f"eps_sweep: dtype must be float32 or float64, got {name}. "
                         f"Pass np.float32 or np.float64.")
    return name


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"eps_sweep: method must be one of {METHODS}, got {method!r}.")


def finite_difference(f: Callable[[np.ndarray], float], x, eps: float, dtype=np.float64,
                      method: str = "central") -> np.ndarray:
    """The numerical gradient of the scalar function `f` at `x`, every element.

    `x` is rounded to `dtype`, each perturbed copy is formed in `dtype`
    (so a step smaller than the spacing of the numbers near x is lost, as it
    would be in a real check), and `f` is evaluated in `dtype`. The quotient is
    formed in float64 with the nominal step, which is what a checker does.
    Returns a float64 array shaped like `x`.
    """
    _check_method(method)
    dt = np.dtype(_dtype_name(dtype))
    x = np.array(x, dtype=dt)
    grad = np.empty(x.shape, dtype=np.float64)
    step = dt.type(eps)
    f0 = float(f(x)) if method == "forward" else None
    for i in np.ndindex(x.shape):
        xp = x.copy()
        xp[i] = x[i] + step
        if method == "central":
            xm = x.copy()
            xm[i] = x[i] - step
            grad[i] = (float(f(xp)) - float(f(xm))) / (2.0 * eps)
        else:
            grad[i] = (float(f(xp)) - f0) / eps
    return grad


@dataclass(frozen=True)
class SweepResult:
    """The measured error of a finite-difference gradient at each eps."""
    eps: np.ndarray       # the steps tried
    error: np.ndarray     # worst-element relative error at each step
    dtype: str            # "float32" or "float64"
    method: str           # "central" or "forward"

    @property
    def best_index(self) -> int:
        return int(np.argmin(self.error))

    @property
    def best_eps(self) -> float:
        return float(self.eps[self.best_index])

    @property
    def best_error(self) -> float:
        return float(self.error[self.best_index])

    def error_at(self, eps: float) -> float:
        """The error at the swept step nearest to `eps` (nearest on a log scale)."""
        k = int(np.argmin(np.abs(np.log10(self.eps) - np.log10(eps))))
        return float(self.error[k])

    def regime(self, eps: float, valley_factor: float = 10.0) -> str:
        """'valley' within `valley_factor` of the best error, else which error
        dominates: 'truncation' right of the best eps, 'rounding' left of it."""
        if self.error_at(eps) <= valley_factor * self.best_error:
            return "valley"
        return "truncation" if eps > self.best_eps else "rounding"


def eps_sweep(f: Callable[[np.ndarray], float], x, grad, eps_values=None,
              dtype=np.float64, method: str = "central") -> SweepResult:
    """Measure the error of the numerical gradient of `f` at `x` for each eps.

    f          : scalar function of an array; it must compute in its input's dtype
                 (numpy ufuncs do).
    x          : the point (any shape); it is rounded to `dtype` first.
    grad       : the exact gradient, either an array shaped like x or a callable
                 evaluated in float64 at the rounded point.
    eps_values : the steps to try (default `DEFAULT_EPS`, 1e-1 to 1e-12).
    Returns a `SweepResult`; its error is the worst element's relative error.
    """
    name = _dtype_name(dtype)
    _check_method(method)
    eps_values = np.asarray(DEFAULT_EPS if eps_values is None else eps_values, dtype=np.float64)
    if eps_values.ndim != 1 or eps_values.size == 0 or np.any(eps_values <= 0):
        raise ValueError("eps_sweep: eps_values must be a non-empty 1-d list of positive "
                         f"steps, got {eps_values!r}.")
    x_rounded = np.array(x, dtype=name)
    exact = grad(x_rounded.astype(np.float64)) if callable(grad) else np.asarray(grad, float)
    if exact.shape != x_rounded.shape:
        raise ValueError(f"eps_sweep: the exact gradient has shape {exact.shape} but x has "
                         f"shape {x_rounded.shape}; they must match.")
    errors = np.array([
        relative_error(exact, finite_difference(f, x_rounded, e, name, method), FLOOR).max()
        for e in eps_values])
    return SweepResult(eps=eps_values, error=errors, dtype=name, method=method)


def predicted_best_eps(dtype, method: str = "central", f_scale: float = 1.0,
                       derivative_scale: float = 1.0) -> float:
    """The eps where the truncation and rounding estimates balance.

    f_scale          : |f| near x (sets the rounding error u*|f|).
    derivative_scale : |f'''| for the central difference, |f''| for the forward one.
    """
    _check_method(method)
    u = UNIT_ROUNDOFF[_dtype_name(dtype)]
    if method == "central":
        return (3.0 * u * f_scale / derivative_scale) ** (1.0 / 3.0)
    return 2.0 * (u * f_scale / derivative_scale) ** 0.5


# --------------------------------------------------------------- test functions
def _sin_exp(x):
    return np.sum(np.sin(x) * np.exp(x / 2))


def _sin_exp_grad(x):
    return np.exp(x / 2) * (np.cos(x) + 0.5 * np.sin(x))


def _log_cosh(x):
    return np.sum(np.log(np.cosh(x)) + 0.5 * x)


def _log_cosh_grad(x):
    return np.tanh(x) + 0.5


def _softplus_sq(x):
    return np.sum(np.log1p(np.exp(x)) ** 2)


def _softplus_sq_grad(x):
    return 2 * np.log1p(np.exp(x)) / (1 + np.exp(-x))


#: Smooth test functions with their exact gradients: name -> (f, grad).
SMOOTH_FUNCTIONS = {
    "sum(sin(x) * exp(x/2))": (_sin_exp, _sin_exp_grad),
    "sum(log(cosh(x)) + x/2)": (_log_cosh, _log_cosh_grad),
    "sum(softplus(x)**2)": (_softplus_sq, _softplus_sq_grad),
}

#: The point of the lesson's sweep: six values in [-1, 1], fixed by a seed.
DEFAULT_X = np.random.default_rng(0).uniform(-1.0, 1.0, 6)


def sweep_both(f=None, x=None, grad=None, eps_values=None, method="central"):
    """The sweep in float32 and float64: {"float32": SweepResult, "float64": ...}.
    With no f, the first of SMOOTH_FUNCTIONS at DEFAULT_X."""
    if f is None:
        f, grad = next(iter(SMOOTH_FUNCTIONS.values()))
    x = DEFAULT_X if x is None else x
    return {name: eps_sweep(f, x, grad, eps_values, name, method) for name in UNIT_ROUNDOFF}
