"""Lesson 00's slot: the central-difference gradient."""
from __future__ import annotations

import numpy as np

from engine.eps_sweep import finite_difference

from .core import SlotError


def engine_central_difference(loss, theta, eps=1e-6):
    """The engine's central difference (`engine.eps_sweep.finite_difference`), with the
    calling convention of exercise 00.1: loss(theta) -> float, theta a float64 vector."""
    return finite_difference(loss, theta, eps, method="central")


def _check_central_difference(fn):
    # Where lesson 01 runs it: a smooth loss of a float64 vector, with an exact gradient;
    # theta must come back as it was, after two loss evaluations per parameter.
    a = np.array([0.4, -1.1, 0.7])
    theta = np.array([0.9, -0.3, 1.6])
    calls = [0]

    def loss(t):
        calls[0] += 1
        return float(np.sum(np.cos(t) * t) + 0.5 * (t @ a) ** 2)

    want = np.cos(theta) - np.sin(theta) * theta + (theta @ a) * a
    probe = theta.copy()
    got = fn(loss, probe, 1e-5)
    if got is None:
        raise SlotError("returned None instead of the gradient")
    if not np.allclose(probe, theta, rtol=0, atol=1e-12):
        raise SlotError("left theta changed: put each nudged parameter back")
    if np.shape(got) != theta.shape or not np.allclose(got, want, rtol=1e-7, atol=1e-9):
        raise SlotError("on a smooth loss of 3 parameters the gradient differs from the "
                        "exact one by more than a central difference's error")
    if calls[0] not in (2 * theta.size, 2 * theta.size + 1):
        raise SlotError(f"called the loss {calls[0]} times for {theta.size} parameters; a "
                        f"central difference needs 2 per parameter")


CONTRACTS = {"central_difference_gradient": _check_central_difference}
