"""Checks for lesson 00, "Why backprop"."""
from __future__ import annotations

import numpy as np

from ._core import ExerciseError, attempt, passed
from ._restore import check_restored
from .pieces import save_piece

EX_FD = "00.1 (central_difference_gradient)"
EX_COST = "00.2 (step_seconds)"


def _test_function():
    """A smooth function of 7 parameters whose gradient we know exactly."""
    a = np.array([0.3, -1.2, 0.8, 2.0, -0.5, 1.1, 0.05])

    def f(theta):
        return float(np.sum(np.sin(theta) * theta**2) + 0.5 * (theta @ a) ** 2)

    def grad(theta):
        return np.sin(theta) * 2 * theta + np.cos(theta) * theta**2 + (theta @ a) * a

    theta = np.array([0.7, -0.4, 1.3, 0.2, -2.1, 0.9, 0.0])
    return f, grad, theta


def check_central_difference(central_difference_gradient) -> None:
    """The learner's checker must be central, divide by 2*eps, leave theta
    as it found it, and call the loss exactly twice per parameter."""
    f, grad, theta = _test_function()
    calls = [0]

    def counted(t):
        calls[0] += 1
        return f(t)

    probe = theta.copy()
    eps = 1e-5
    got = attempt(EX_FD, central_difference_gradient, counted, probe, eps)
    got = np.asarray(got, dtype=float)
    want = grad(theta)
    if got.shape != theta.shape:
        raise ExerciseError(EX_FD, f"the gradient has shape {got.shape}, but theta has shape "
                                   f"{theta.shape}. Return one partial derivative per parameter.")
    roundoff_note = check_restored(EX_FD, theta, probe, eps, "theta")
    forward = np.array([(f(theta + eps * e) - f(theta)) / eps for e in np.eye(theta.size)])
    scale = np.maximum(np.abs(want), 1e-8)
    rel = np.max(np.abs(got - want) / scale)
    if not np.all(np.isfinite(got)):
        i = int(np.argmax(~np.isfinite(got)))
        why = (f"theta[{i}] is 0 there, so a step that is a share of the parameter's value "
               f"is no step at all: nudge every parameter by eps itself" if theta[i] == 0 else
               "a difference divided by a step that came out as zero or overflowed")
        raise ExerciseError(EX_FD, f"entry {i} of your gradient is {got[i]}; {why}.")
    if rel > 1e-7:
        if np.allclose(got, forward, rtol=1e-9, atol=1e-12):
            hint = ("this is the forward difference (f(theta+eps) - f(theta)) / eps: its error "
                    "shrinks only like eps. Evaluate at theta+eps and theta-eps and divide by 2*eps.")
        elif np.allclose(got, 2 * want, rtol=1e-6):
            hint = "every entry is twice the gradient: divide by 2*eps, not by eps."
        elif np.allclose(got, 0.5 * want, rtol=1e-6):
            hint = "every entry is half the gradient: the distance between theta+eps and theta-eps is 2*eps."
        elif np.allclose(got, -want, rtol=1e-6):
            hint = "the sign is flipped: compute f(theta + eps) - f(theta - eps)."
        else:
            i = int(np.argmax(np.abs(got - want) / scale))
            hint = (f"entry {i} is {got[i]:.6g}, the true derivative is {want[i]:.6g}. Nudge one "
                    f"parameter at a time, both ways, and divide the difference by 2*eps.")
        raise ExerciseError(EX_FD, f"relative error {rel:.2e} is too large; {hint}")
    if calls[0] not in (2 * theta.size, 2 * theta.size + 1):
        raise ExerciseError(EX_FD, f"the gradient is right but the loss was called {calls[0]} "
                                   f"times for {theta.size} parameters; a central difference "
                                   f"needs exactly 2 calls per parameter.")
    save_piece("central_difference_gradient", central_difference_gradient, EX_FD)
    passed(EX_FD, f"max relative error {rel:.0e} with eps={eps:g}, {calls[0]} loss evaluations."
                  + roundoff_note)


def check_step_seconds(step_seconds) -> None:
    """The prediction of exercise 00.2. Central differences: 2 forward passes per
    parameter. Backprop: one forward plus a backward that costs about two forwards
    (a layer's weight gradient and input gradient, each a product as big as its
    forward one)."""
    for n, t in [(7_000_000_000, 0.1), (1000, 0.002)]:
        got = attempt(EX_COST, step_seconds, n, t)
        if not (isinstance(got, (tuple, list, np.ndarray)) and len(got) == 2):
            raise ExerciseError(EX_COST, f"return two numbers, (finite_difference_seconds, "
                                         f"backprop_seconds), got {got!r}")
        fd, bp = (float(x) for x in got)
        if np.isclose(fd, n * t) or np.isclose(fd, (n + 1) * t):
            raise ExerciseError(EX_COST, f"finite differences: {fd:.4g} s counts one loss "
                                         f"evaluation per parameter (forward difference); the "
                                         f"central difference needs two per parameter.")
        if np.isclose(fd, (2 * n + 1) * t, rtol=1e-12):
            raise ExerciseError(EX_COST, f"finite differences: {fd:.4g} s is one forward pass "
                                         f"too many. The central difference evaluates the loss "
                                         f"at theta + eps and theta - eps, never at theta itself: "
                                         f"2 per parameter.")
        if np.isclose(fd, 3 * n * t, rtol=1e-9):
            raise ExerciseError(EX_COST, f"finite differences: {fd:.4g} s is three forward "
                                         f"passes per parameter, backprop's price paid once per "
                                         f"parameter. The central difference evaluates the loss "
                                         f"twice per parameter, at theta + eps and theta - eps.")
        if not np.isclose(fd, 2 * n * t, rtol=1e-9):
            raise ExerciseError(EX_COST, f"finite differences for {n} parameters at {t} s per "
                                         f"forward pass: you have {fd:.4g} s. Count the loss "
                                         f"calls of your central_difference_gradient: how many "
                                         f"per parameter?")
        if np.isclose(bp, 3 * n * t, rtol=1e-9) or np.isclose(bp, 2 * n * t, rtol=1e-9):
            raise ExerciseError(EX_COST, f"backprop: {bp:.4g} s grows with the number of "
                                         f"parameters, but one forward and one backward pass "
                                         f"give the gradient of every parameter at once. Price "
                                         f"those passes for the whole network, not per "
                                         f"parameter.")
        if np.isclose(bp, t):
            raise ExerciseError(EX_COST, "backprop: one forward pass is right, but the backward "
                                         "pass is not free. Price it by its matrix products: "
                                         "d_W2 = h.T @ d_pred and d_h = d_pred @ W2.T are each "
                                         "as big as the forward's h @ W2.")
        if np.isclose(bp, 2 * t):
            raise ExerciseError(EX_COST, "backprop: the backward pass is worth two forward "
                                         "passes, but the forward pass is not free: add the one "
                                         "forward pass that backprop runs first.")
        if np.isclose(bp, 2.5 * t):
            raise ExerciseError(EX_COST, "backprop: that counts the products of this two-layer "
                                         "network, whose first layer owes no gradient to its "
                                         "input x (it is data). Price a layer in the middle of a "
                                         "deep network: its weight's gradient and its input's "
                                         "gradient, two products per forward one.")
        if not np.isclose(bp, 3 * t, rtol=1e-9):
            raise ExerciseError(EX_COST, f"backprop at {t} s per forward: you have {bp:.4g} s. "
                                         f"One forward pass, then a backward pass: per layer, "
                                         f"how many products as big as the forward one?")
    passed(EX_COST, "2P forward passes against 3: the next cells count and time them.")


# ------------------------------------------------------------------ the notebook
#: Each exercise function of the lesson, and its exercise.
EXERCISE_FUNCTIONS = {"central_difference_gradient": EX_FD, "step_seconds": EX_COST}


def name_unfinished_exercises() -> None:
    """In the notebook, a cell that needs an unfinished exercise of this lesson says which."""
    from . import _core
    _core.name_unfinished_exercises(EXERCISE_FUNCTIONS)
