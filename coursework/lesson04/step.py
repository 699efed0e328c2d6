"""04.4: the step eps where the truncation and the rounding error of a central
difference balance."""
from __future__ import annotations

import numpy as np

from .._cases import Case, Slip, close_within, compare_over_cases
from .._core import passed
from ._common import _as_float

EX_STEP = "04.4 (best_step)"


def best_step_reference(u: float) -> float:
    """The eps minimising E(eps) = eps**2/6 + u/eps."""
    return (3 * u) ** (1 / 3)


def _step_cases() -> list[Case]:
    """float64's and float32's unit roundoff and a coarse 1e-4, then seeded random u from
    1e-20 to 1e-2 (log-uniform)."""
    rng = np.random.default_rng(44)
    us = [2.0 ** -53, 2.0 ** -24, 1e-4] + [float(10.0 ** rng.uniform(-20, -2)) for _ in range(6)]
    return [Case((u,), f"best_step({u:g})") for u in us]


FORWARD_DIFFERENCE = ("sqrt(u) is the balance point of a truncation error ~ eps, the forward "
                      "difference's; the central difference's truncation error is ~ eps**2/6, "
                      "so its best step sits elsewhere.")

STEP_SLIPS = [
    Slip(lambda u: np.sqrt(u), FORWARD_DIFFERENCE),
    Slip(lambda u: 2 * np.sqrt(u), FORWARD_DIFFERENCE),
    Slip(lambda u: u ** (1 / 3), "right power, but you dropped the constants of the error "
                                 "model: the 1/6 of the truncation term moves the minimum."),
    Slip(lambda u: (6 * u) ** (1 / 3), "that is where the two errors are equal (eps**2/6 = "
                                       "u/eps); the sum is smallest where it stops falling, "
                                       "which is a different eps."),
    Slip(lambda u: u, "a step of u itself is the worst choice: the rounding error u/eps is "
                      "then 1."),
]


def _step_apart(got: float, want: float, case: Case) -> str:
    return (f"you return {got:.6g}, the minimum of E(eps) = eps**2/6 + u/eps is at {want:.6g} "
            f"(yours is {got / want:.4g} times it)")


def check_best_step(best_step) -> None:
    """best_step(u) = the eps minimising eps**2/6 + u/eps, for the unit roundoffs of the
    story and seeded random ones."""
    compare_over_cases(EX_STEP, best_step, best_step_reference, _step_cases(),
                       slips=STEP_SLIPS, same=close_within(1e-6),
                       read=lambda value, case: _as_float(EX_STEP, value, case.label),
                       difference=_step_apart)
    e64, e32 = best_step_reference(2.0 ** -53), best_step_reference(2.0 ** -24)
    passed(EX_STEP, f"float64: eps* = {e64:.1e}, float32: eps* = {e32:.1e}.")
