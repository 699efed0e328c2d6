"""The exercise checks of lesson 00: right answers pass, typical wrong answers
fail with the exercise's own message and a specific hint."""
from __future__ import annotations

import numpy as np
import pytest

from coursework import lesson00
from check_tools import fails_with


@pytest.fixture(autouse=True)
def _pieces_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path))


def nudge_and_restore(loss, theta, eps=1e-6):
    """Right in exact arithmetic: theta comes back within one rounding step."""
    grad = np.empty_like(theta)
    for i in range(theta.size):
        theta[i] += eps
        up = loss(theta)
        theta[i] -= 2 * eps
        down = loss(theta)
        theta[i] += eps
        grad[i] = (up - down) / (2 * eps)
    return grad


def save_and_reassign(loss, theta, eps=1e-6):
    grad = np.empty_like(theta)
    for i in range(theta.size):
        old = theta[i]
        theta[i] = old + eps
        up = loss(theta)
        theta[i] = old - eps
        down = loss(theta)
        theta[i] = old
        grad[i] = (up - down) / (2 * eps)
    return grad


def forgets_to_restore(loss, theta, eps=1e-6):
    grad = np.empty_like(theta)
    for i in range(theta.size):
        theta[i] += eps
        up = loss(theta)
        theta[i] -= 2 * eps
        down = loss(theta)
        grad[i] = (up - down) / (2 * eps)
    return grad


def test_nudge_and_restore_passes_and_explains_the_rounding(capsys):
    lesson00.check_central_difference(nudge_and_restore)
    out = capsys.readouterr().out
    assert "passed" in out and "rounding step" in out


def test_save_and_reassign_passes_without_a_note(capsys):
    lesson00.check_central_difference(save_and_reassign)
    out = capsys.readouterr().out
    assert "passed" in out and "rounding" not in out


def test_forgotten_restore_is_told_to_save_and_reassign():
    fails_with(lesson00.check_central_difference, forgets_to_restore,
               words=("theta was changed", "theta[0]", "assign it back"))


def relative_step(loss, theta, eps=1e-6):
    """A near miss: each parameter nudged by a share of its own value (zero at theta = 0)."""
    grad = np.empty_like(theta)
    for i in range(theta.size):
        old, step = theta[i], eps * theta[i]
        theta[i] = old + step
        up = loss(theta)
        theta[i] = old - step
        down = loss(theta)
        theta[i] = old
        with np.errstate(divide="ignore", invalid="ignore"):
            grad[i] = np.float64(up - down) / np.float64(2 * step)
    return grad


def not_a_number(loss, theta, eps=1e-6):
    for _ in range(theta.size):
        loss(theta), loss(theta)
    return np.full(theta.size, np.nan)


def test_a_gradient_that_is_not_a_number_is_never_passed():
    fails_with(lesson00.check_central_difference, relative_step,
               words=("entry 6", "nan", "theta[6] is 0", "eps itself"))
    fails_with(lesson00.check_central_difference, not_a_number, words=("entry 0", "nan"))


def test_a_central_difference_stored_in_float32_passes(capsys):
    def in_float32(loss, theta, eps=1e-6):
        return nudge_and_restore(loss, theta, eps).astype(np.float32)
    lesson00.check_central_difference(in_float32)
    assert "00.1 (central_difference_gradient) passed" in capsys.readouterr().out


@pytest.mark.parametrize("kind", [tuple, list, np.array])
def test_step_seconds_accepts_any_two_numbers(kind, capsys):
    lesson00.check_step_seconds(lambda n, t: kind([2 * n * t, 3 * t]))
    assert "passed" in capsys.readouterr().out


def test_step_seconds_rejects_one_number():
    fails_with(lesson00.check_step_seconds, lambda n, t: 2 * n * t, words=("two numbers",))


# ------------------------------------------------------------------ 00.2, the prediction
def test_step_seconds_right_prediction_written_another_way_passes(capsys):
    lesson00.check_step_seconds(lambda n, t: (n * (t + t), t + 2 * t))
    assert "Exercise 00.2 (step_seconds) passed." in capsys.readouterr().out


@pytest.mark.parametrize("answer, words", [
    (lambda n, t: (n * t, 3 * t), ("forward difference", "two per parameter")),
    (lambda n, t: ((2 * n + 1) * t, 3 * t), ("one forward pass too many", "never at theta itself")),
    (lambda n, t: (3 * n * t, 3 * t), ("three forward passes per parameter", "twice per")),
    (lambda n, t: (4 * n * t, 3 * t), ("Count the loss calls",)),
    (lambda n, t: (2 * n * t, 3 * n * t), ("grows with the number of parameters",
                                           "every parameter at once")),
    (lambda n, t: (2 * n * t, t), ("backward pass is not free", "d_W2 = h.T @ d_pred")),
    (lambda n, t: (2 * n * t, 2 * t), ("forward pass is not free", "add the one forward pass")),
    (lambda n, t: (2 * n * t, 2.5 * t), ("first layer owes no gradient", "middle of a deep")),
    (lambda n, t: (2 * n * t, 4 * t), ("how many products",)),
])
def test_step_seconds_typical_wrong_predictions_get_their_hint(answer, words):
    fails_with(lesson00.check_step_seconds, answer, words=("Exercise 00.2",) + words)


def test_step_seconds_stub_is_not_done_yet():
    def stub(n, t):
        raise NotImplementedError()
    fails_with(lesson00.check_step_seconds, stub, words=("Exercise 00.2", "not done yet"))


# ------------------------------------------- the 00.1 piece where lesson 01 runs it
def _write_piece(folder, name, source, function, exercise="00.1"):
    import json
    (folder / f"{name}.py").write_text(source)
    (folder / "index.json").write_text(json.dumps({name: {"function": function,
                                                          "exercise": exercise}}))


def test_a_passed_00_1_is_the_central_difference_lesson_01_runs(tmp_path):
    from coursework import pieces, slots
    fn, owner = pieces.central_difference()
    assert fn is slots.engine_central_difference and owner == "the engine's, because not written yet"
    slots.check("central_difference_gradient", slots.engine_central_difference)
    lesson00.check_central_difference(save_and_reassign)
    fn, owner = pieces.central_difference()
    assert owner == "yours (00.1)" and fn is not slots.engine_central_difference
    # lesson 01's use: the two weight gradients of its network, 24 and 4
    loss = lambda t: (t[1] * max(t[0] * 2.0, 0.0) - 1.0) ** 2  # noqa: E731
    assert np.allclose(fn(loss, np.array([0.5, 3.0])), [24.0, 4.0], rtol=1e-6)


@pytest.mark.parametrize("body, why", [
    ("    return np.array([(loss(theta + eps * e) - loss(theta)) / eps\n"
     "                     for e in np.eye(theta.size)])\n",
     "differs from the exact one"),
    ("    g = np.empty_like(theta)\n"
     "    for i in range(theta.size):\n"
     "        theta[i] += eps\n"
     "        up = loss(theta)\n"
     "        theta[i] -= 2 * eps\n"
     "        g[i] = (up - loss(theta)) / (2 * eps)\n"
     "    return g\n",
     "left theta changed"),
    ("    return None\n", "returned None"),
])
def test_a_broken_00_1_piece_falls_back_to_the_engines_with_the_reason(tmp_path, body, why):
    from coursework import pieces, slots
    _write_piece(tmp_path, "central_difference_gradient",
                 "def central_difference_gradient(loss, theta, eps=1e-6):\n" + body,
                 "central_difference_gradient")
    fn, owner = pieces.central_difference()
    assert fn is slots.engine_central_difference
    assert owner.startswith("the engine's, because yours was skipped: ") and why in owner, owner
