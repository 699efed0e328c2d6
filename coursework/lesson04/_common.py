"""What several of lesson 04's checks share: the weights of the test functions, the
difference quotients a learner's answer is compared with, and reading one number back."""
from __future__ import annotations

import numpy as np

from .._core import ExerciseError

_W = np.array([[0.3, -1.2, 0.8, 2.0], [-0.5, 1.1, 0.05, -0.7], [1.4, 0.2, -0.9, 0.6]])


def _central(f, x, index, eps):
    xp, xm = x.copy(), x.copy()
    xp[index] += eps
    xm[index] -= eps
    return (f(xp) - f(xm)) / (2 * eps)


def _forward(f, x, index, eps):
    xp = x.copy()
    xp[index] += eps
    return (f(xp) - f(x)) / eps


def _backward(f, x, index, eps):
    xm = x.copy()
    xm[index] -= eps
    return (f(x) - f(xm)) / eps


def _as_float(exercise, value, what):
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ExerciseError(exercise, f"{what} should be a number, got {value!r}.") from None
    if arr.size != 1:
        raise ExerciseError(exercise, f"{what} should be one number, got an array of shape "
                                      f"{arr.shape}. Perturb a single element and return the "
                                      f"single slope.")
    return float(arr.reshape(()))

