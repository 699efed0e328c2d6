"""Exercise 10.1 judged on speed: a kernel far slower than numpy and than the lesson's
plain loop is refused, the refusal names the cause seen in the code, and a refused kernel
is not saved as the learner's piece (so lesson 13 never runs it as "yours").

The refusal rule is tested on given times; one end-to-end test times a kernel that starts
its threads once per row for real and checks that the verdict follows the times measured
(a busy machine can bring it close to the plain loop, so the verdict itself is not assumed).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from numba import njit, prange

from check_tools import fails_with, fixed_times
from coursework import ExerciseError, lesson10, lesson10_speed
from coursework.pieces import pieces_dir


@njit(parallel=True)
def threads_per_row(x, b, out):
    k, a = 0.7978845608028654, 0.044715
    rows, cols = x.shape
    for i in range(rows):
        for j in prange(cols):
            u = x[i, j] + b[j]
            t = 1.0 - 2.0 / (np.exp(2.0 * k * (u + a * u * u * u)) + 1.0)
            out[i, j] = 0.5 * u * (1.0 + t)
    return out


def row_temporaries(x, b, out):
    k, a = 0.7978845608028654, 0.044715
    for i in prange(x.shape[0]):
        u = x[i] + b
        out[i] = 0.5 * u * (1.0 + np.tanh(k * (u + a * u ** 3)))
    return out


def columns_in_prange(x, b, out):
    for j in prange(x.shape[1]):
        for i in range(x.shape[0]):
            out[i, j] = x[i, j] + b[j]
    return out


def serial(x, b, out):
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = x[i, j] + b[j]
    return out


def elementwise(x, b, out):
    for i in prange(x.shape[0]):
        for j in range(x.shape[1]):
            u = x[i, j] + b[j]
            out[i, j] = 0.5 * u * (2.0 - 2.0 / (math.exp(1.6 * u) + 1.0))
    return out


@pytest.mark.parametrize("fn, phrase", [
    (threads_per_row, "threads started per row"),
    (row_temporaries, "temporaries"),
    (row_temporaries, "calls tanh"),
    (columns_in_prange, "prange runs over the columns"),
    (serial, "a serial loop"),
])
def test_10_1_names_the_cause_it_sees_in_the_code(fn, phrase):
    assert any(phrase in cause for cause in lesson10_speed.slow_causes(fn))


def test_10_1_sees_no_cause_in_a_kernel_written_as_asked():
    assert lesson10_speed.slow_causes(elementwise) == []
    assert lesson10_speed.slow_causes(lesson10_speed.plain_fused_loop) == []


def _times(yours_in, yours_out, numpy=(1.0, 30.0), plain=(4.0, 60.0)):
    return {"in cache": {"yours": yours_in, "numpy": numpy[0], "plain": plain[0]},
            "out of cache": {"yours": yours_out, "numpy": numpy[1], "plain": plain[1]}}


def test_10_1_refuses_beyond_both_stated_factors_in_either_regime():
    # two cores: the plain loop itself is 4x numpy in cache, 2x out of it
    assert lesson10_speed.refusal(_times(4.5, 62.0), [], 5) is None
    assert lesson10_speed.refusal(_times(8.0, 140.0), [], 5) is None     # 2x, 2.3x plain
    out = lesson10_speed.refusal(_times(4.5, 300.0), ["threads started per row: x"], 5)
    assert "out of cache" in out and "10.0x" in out and "threads started per row" in out
    assert "more than 3x numpy's time and more than 2.5x the plain loop's" in out
    assert "not saved" in out
    # many cores: the plain loop beats numpy, and 28x numpy is refused in cache
    many = _times(1320.0, 100.0, numpy=(47.0, 300.0), plain=(10.0, 100.0))
    assert lesson10_speed.refusal(many, [], 5).startswith("the values are right")
    assert "I see none of the usual causes" in lesson10_speed.refusal(many, [], 5)


def test_10_1_fastest_of_interleaved_runs_ignores_one_slow_run():
    calls = {"n": 0}

    def sometimes_slow():
        calls["n"] += 1
        if calls["n"] == 3:
            sum(range(2_000_000))

    best = lesson10_speed.fastest_interleaved({"k": sometimes_slow, "numpy": lambda: None}, 4)
    assert calls["n"] == 5 and best["k"] < 0.01


def test_10_1_refuses_a_kernel_that_starts_its_threads_per_row_and_does_not_save_it(
        monkeypatch):
    path = pieces_dir() / "bias_gelu_forward.py"
    path.unlink(missing_ok=True)
    monkeypatch.setattr(lesson10, "measure", fixed_times(yours_ms=150.0))
    message = fails_with(lesson10.check_bias_gelu, threads_per_row, 1,
                         words=("Exercise 10.1", "too slow", "threads started per row"))
    assert "np.exp" not in message and "1 - 2 /" not in message
    assert not path.exists()


def test_10_1_on_real_times_refuses_exactly_when_its_own_measurements_break_the_limits():
    """End to end on this machine: the kernel that starts its threads per row is timed for
    real (about 5x the plain loop on two quiet cores, 25x or more with more cores, but
    close to the plain loop on a machine busy with other work); whatever the times, the
    check refuses it exactly when the times it measured last break both limits, and
    saves it only when it passes."""
    path = pieces_dir() / "bias_gelu_forward.py"
    path.unlink(missing_ok=True)
    seen = []

    def measured(*args, **kwargs):
        seen.append(lesson10_speed.measure(*args, **kwargs))
        return seen[-1]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lesson10, "measure", measured)
        try:
            lesson10.check_bias_gelu(threads_per_row, 1)
        except ExerciseError as refused:
            assert lesson10_speed.too_slow(seen[-1]) is not None and len(seen) == 2
            assert "threads started per row" in str(refused) and not path.exists()
        else:
            assert lesson10_speed.too_slow(seen[-1]) is None and path.exists()