"""04.1: the central difference of one element; a forward difference, a wrong divisor,
a flipped sign, an eps of one's own or every element moved at once is named."""
from __future__ import annotations

import numpy as np

from .._core import ExerciseError, attempt, passed
from .._restore import check_restored
from ..pieces import save_piece
from ._common import _W, _as_float, _backward, _central, _forward

EX_PARTIAL = "04.1 (numerical_partial)"


def _smooth(x):
    """A smooth function of a 3x4 array with curvature in every direction."""
    return float(np.sum(np.sin(x) * x ** 2 * _W) + 0.25 * np.sum(x * _W) ** 2)


def _smooth_grad(x):
    return (np.cos(x) * x ** 2 + 2 * x * np.sin(x)) * _W + 0.5 * np.sum(x * _W) * _W


def _x0():
    return np.array([[0.7, -0.4, 1.3, 0.2], [-2.1, 0.9, 0.0, 0.5], [1.7, -1.1, 0.35, -0.6]])


def _partial_cases():
    """(x, index, eps): the story's point at four elements and two steps, then seeded random
    points, elements and steps."""
    cases = [(_x0(), index, eps) for eps in (1e-3, 1e-2)
             for index in [(0, 0), (1, 3), (2, 1), (1, 2)]]
    rng = np.random.default_rng(41)
    for _ in range(4):
        index = (int(rng.integers(0, 3)), int(rng.integers(0, 4)))
        cases.append((rng.uniform(-2, 2, size=(3, 4)), index, float(10 ** rng.uniform(-4, -2))))
    return cases


def check_numerical_partial(numerical_partial) -> None:
    """Central difference of one element: both sides, divided by 2*eps,
    only x[index] moved, x left as found, the eps argument honoured."""
    roundoff_note = ""
    for x, index, eps in _partial_cases():
        probe = x.copy()
        got = _as_float(EX_PARTIAL, attempt(EX_PARTIAL, numerical_partial,
                                            _smooth, probe, index, eps),
                        f"numerical_partial(f, x, {index}, eps={eps})")
        roundoff_note = check_restored(EX_PARTIAL, x, probe, eps, "x") or roundoff_note
        want = _central(_smooth, x, index, eps)
        if np.isclose(got, want, rtol=1e-9, atol=1e-12):
            continue
        true = _smooth_grad(x)[index]
        if np.isclose(got, _forward(_smooth, x, index, eps), rtol=1e-9, atol=1e-12) or \
                np.isclose(got, _backward(_smooth, x, index, eps), rtol=1e-9, atol=1e-12):
            hint = ("this is a one-sided (forward or backward) difference: it looks at one "
                    "side of x[index] only, and its error shrinks only like eps.")
        elif np.isclose(got, 2 * want, rtol=1e-9):
            hint = "it is twice the central difference: divide by 2*eps, not by eps."
        elif np.isclose(got, 0.5 * want, rtol=1e-9):
            hint = ("it is half the central difference: the two points are 2*eps apart, "
                    "so divide by 2*eps (not 4*eps).")
        elif np.isclose(got, -want, rtol=1e-9):
            hint = "the sign is flipped: compute f(x + eps) - f(x - eps), in that order."
        elif np.isclose(got, true, rtol=1e-5):
            hint = ("it is close to the true slope but not the central difference with the "
                    f"eps you were given ({eps:g}): use the eps argument, do not fix your own.")
        else:
            moved_all = (_smooth(x + eps) - _smooth(x - eps)) / (2 * eps)
            if np.isclose(got, moved_all, rtol=1e-9):
                hint = ("you moved every element of x at once; that is the slope along "
                        "(1, 1, ..., 1). Move only x[index].")
            else:
                hint = None
        raise ExerciseError(EX_PARTIAL, f"numerical_partial(f, x, {index}, eps={eps}) "
                                        f"returned {got:.10g}; the central difference is "
                                        f"{want:.10g} (yours is {got - want:+.3g} off)."
                                        + (f" Hint: {hint}" if hint else ""))
    save_piece("numerical_partial", numerical_partial, EX_PARTIAL)
    passed(EX_PARTIAL, "central difference, x left unchanged, eps honoured." + roundoff_note)
