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


@pytest.mark.parametrize("kind", [tuple, list, np.array])
def test_step_seconds_accepts_any_two_numbers(kind, capsys):
    lesson00.check_step_seconds(lambda n, t: kind([2 * n * t, 3 * t]))
    assert "passed" in capsys.readouterr().out


def test_step_seconds_rejects_one_number():
    fails_with(lesson00.check_step_seconds, lambda n, t: 2 * n * t, words=("two numbers",))
