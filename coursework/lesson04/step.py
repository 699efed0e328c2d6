"""04.4: the step eps where the truncation and the rounding error of a central
difference balance."""
from __future__ import annotations

import numpy as np

from .._core import ExerciseError, attempt, passed
from ._common import _as_float

EX_STEP = "04.4 (best_step)"


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
