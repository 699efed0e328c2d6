"""The exercise checks of lessons 10-13, fed right and typical wrong answers.

A check must pass a correct answer, fail a stub with the exercise's own "not
done yet" message, and fail each typical wrong answer with a hint that names
the mistake (asserted by matching a phrase of the hint). Pieces saved by
passing checks go to the temporary folder conftest.py sets up.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from numba import njit, prange

from engine.exercises import ExerciseError, lesson10
from engine.exercises._core import pieces_dir


def stub(*args, **kwargs):
    raise NotImplementedError()


def expect(check, fn, exercise, phrase, **kwargs):
    with pytest.raises(ExerciseError) as info:
        check(fn, **kwargs)
    message = str(info.value)
    assert message.startswith(f"Exercise {exercise}"), message
    assert phrase in message, message


# ------------------------------------------------------------------ 10.1
K, A = math.sqrt(2 / math.pi), 0.044715


@njit(parallel=True)
def bias_gelu_right(x, b, out):
    k, a = 0.7978845608028654, 0.044715
    rows, cols = x.shape
    for i in prange(rows):
        for j in range(cols):
            u = x[i, j] + b[j]
            t = 1.0 - 2.0 / (np.exp(2.0 * k * (u + a * u * u * u)) + 1.0)
            out[i, j] = 0.5 * u * (1.0 + t)
    return out


def _gelu(u):
    return 0.5 * u * (1 + np.tanh(K * (u + A * u ** 3)))


def bias_gelu_python(x, b, out):       # right values, but not compiled
    out[...] = _gelu(x + b)
    return out


def bias_gelu_no_bias(x, b, out):
    out[...] = _gelu(x)
    return out


def bias_gelu_bias_after(x, b, out):
    out[...] = _gelu(x) + b
    return out


def bias_gelu_erf(x, b, out):
    u = x + b
    out[...] = 0.5 * u * (1 + np.vectorize(math.erf)(u / math.sqrt(2)))
    return out


def bias_gelu_new_array(x, b, out):
    return _gelu(x + b)


def bias_gelu_returns_none(x, b, out):
    out[...] = _gelu(x + b)


def bias_gelu_overflows(x, b, out):
    u = x + b
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(2 * K * (u + A * u ** 3))
        out[...] = 0.5 * u * (1 + (e - 1) / (e + 1))
    return out


def test_10_1_passes_a_fused_numba_kernel_and_saves_it(capsys):
    lesson10.check_bias_gelu(bias_gelu_right, repeats=1)
    out = capsys.readouterr().out
    assert "Exercise 10.1 (bias_gelu_fused) passed." in out
    assert "speedup" in out and "(2048, 512)" in out
    saved = (pieces_dir() / "bias_gelu_forward.py").read_text()
    assert "def bias_gelu_right(x, b, out):" in saved and "prange(rows)" in saved


def test_10_1_stub_says_not_done():
    expect(lesson10.check_bias_gelu, stub, "10.1", "not done yet")


@pytest.mark.parametrize("fn, phrase", [
    (bias_gelu_no_bias, "bias was never added"),
    (bias_gelu_bias_after, "GELU(x) + b"),
    (bias_gelu_erf, "exact (erf) GELU"),
    (bias_gelu_new_array, "`out` was never written"),
    (bias_gelu_returns_none, "returned None"),
    (bias_gelu_overflows, "overflows"),
    (bias_gelu_python, "@njit(parallel=True)"),
])
def test_10_1_names_the_mistake(fn, phrase):
    expect(lesson10.check_bias_gelu, fn, "10.1", phrase, repeats=1)


# ------------------------------------------------------------------ 10.2
def xent_right(logits, targets):
    n = logits.shape[0]
    m = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - m)
    s = e.sum(axis=1, keepdims=True)
    rows = np.arange(n)
    losses = np.log(s[:, 0]) + m[:, 0] - logits[rows, targets]
    logits[...] = e / s / n
    logits[rows, targets] -= 1.0 / n
    return float(losses.mean())


def xent_sum(logits, targets):
    return xent_right(logits, targets) * logits.shape[0]


def xent_not_over_n(logits, targets):
    loss = xent_right(logits, targets)
    logits *= logits.shape[0]
    return loss


def xent_no_onehot(logits, targets):
    loss = xent_right(logits, targets)
    logits[np.arange(logits.shape[0]), targets] += 1.0 / logits.shape[0]
    return loss


def xent_probs(logits, targets):
    loss = xent_right(logits, targets)
    n = logits.shape[0]
    logits[np.arange(n), targets] += 1.0 / n
    logits *= n
    return loss


def xent_untouched(logits, targets):
    return xent_right(logits.copy(), targets)


def xent_no_max(logits, targets):
    n = logits.shape[0]
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(logits)
        s = e.sum(axis=1, keepdims=True)
        rows = np.arange(n)
        losses = np.log(s[:, 0]) - logits[rows, targets]
        logits[...] = e / s / n
    logits[rows, targets] -= 1.0 / n
    return float(losses.mean())


def test_10_2_passes_the_fused_loss_and_saves_it(capsys):
    lesson10.check_softmax_cross_entropy(xent_right)
    assert "Exercise 10.2 (softmax_cross_entropy_fused) passed." in capsys.readouterr().out
    assert "def xent_right(" in (pieces_dir() / "softmax_cross_entropy.py").read_text()


def test_10_2_stub_says_not_done():
    expect(lesson10.check_softmax_cross_entropy, stub, "10.2", "not done yet")


@pytest.mark.parametrize("fn, phrase", [
    (xent_sum, "sum of the row losses"),
    (xent_not_over_n, "divide every entry by N"),
    (xent_no_onehot, "subtract 1/N at each row's target"),
    (xent_probs, "holds the probabilities"),
    (xent_untouched, "still holds the logits"),
    (xent_no_max, "Subtract each row's maximum"),
])
def test_10_2_names_the_mistake(fn, phrase):
    expect(lesson10.check_softmax_cross_entropy, fn, "10.2", phrase)


# ------------------------------------------------------------------ 11.1
from engine.exercises import lesson11  # noqa: E402


@njit(parallel=True)
def scatter_right(ids, g, vocab_size):
    n, c = g.shape
    d = np.zeros((vocab_size, c), dtype=g.dtype)
    for j in prange(c):
        for t in range(n):
            d[ids[t], j] += g[t, j]
    return d


def scatter_serial_numpy(ids, g, vocab_size):
    d = np.zeros((vocab_size, g.shape[1]), g.dtype)
    np.add.at(d, ids, g)
    return d


def scatter_last_wins(ids, g, vocab_size):
    d = np.zeros((vocab_size, g.shape[1]), g.dtype)
    d[ids] = g
    return d


def scatter_buffered(ids, g, vocab_size):
    d = np.zeros((vocab_size, g.shape[1]), g.dtype)
    d[ids] += g
    return d


def scatter_empty(ids, g, vocab_size):
    d = np.empty((vocab_size, g.shape[1]), g.dtype)
    d[...] = 7.0
    np.add.at(d, ids, g)
    return d


def scatter_gather_shape(ids, g, vocab_size):
    return g.copy()


def scatter_transposed(ids, g, vocab_size):
    return scatter_serial_numpy(ids, g, vocab_size).T


def scatter_float64(ids, g, vocab_size):
    d = np.zeros((vocab_size, g.shape[1]))
    np.add.at(d, ids, g)
    return d


_calls = {"n": 0}


def scatter_order_changes(ids, g, vocab_size):
    """Right sums, but tokens added in an order that changes from call to call."""
    _calls["n"] += 1
    order = np.random.default_rng(_calls["n"]).permutation(len(ids))
    d = np.zeros((vocab_size, g.shape[1]), g.dtype)
    np.add.at(d, ids[order], g[order])
    return d


def scatter_loses_updates(ids, g, vocab_size):
    d = scatter_serial_numpy(ids, g, vocab_size)
    if len(ids) > 1000:                 # what a race does: some additions vanish
        d[ids[0]] -= g[0] * 50
    return d


def test_11_1_passes_column_blocks_and_saves_it(capsys):
    lesson11.check_embedding_backward(scatter_right, repeats=2)
    out = capsys.readouterr().out
    assert "Exercise 11.1 (embedding_backward) passed." in out
    assert "def scatter_right(" in (pieces_dir() / "embedding_backward.py").read_text()


def test_11_1_passes_np_add_at():
    lesson11.check_embedding_backward(scatter_serial_numpy, repeats=2)


def test_11_1_stub_says_not_done():
    expect(lesson11.check_embedding_backward, stub, "11.1", "not done yet")


@pytest.mark.parametrize("fn, phrase", [
    (scatter_last_wins, "repeated ids were dropped"),
    (scatter_buffered, "repeated ids were dropped"),
    (scatter_empty, "not np.empty"),
    (scatter_gather_shape, "the forward's output"),
    (scatter_transposed, "transposed"),
    (scatter_float64, "make the table with dtype=g.dtype"),
    (scatter_order_changes, "different bits"),
    (scatter_loses_updates, "updates were lost"),
])
def test_11_1_names_the_mistake(fn, phrase):
    expect(lesson11.check_embedding_backward, fn, "11.1", phrase, repeats=2)


def test_11_1_racy_threads_are_caught_when_they_race():
    """A token-split prange kernel may or may not race in one run; if its result
    is ever wrong or unrepeatable, the check must say so with the race hint."""
    @njit(parallel=True)
    def racy(ids, g, vocab_size):
        d = np.zeros((vocab_size, g.shape[1]), g.dtype)
        for t in prange(ids.size):
            for j in range(g.shape[1]):
                d[ids[t], j] += g[t, j]
        return d
    try:
        lesson11.check_embedding_backward(racy, repeats=3)
    except ExerciseError as err:
        assert any(p in str(err) for p in ("updates were lost", "different bits",
                                           "threads give different")), str(err)


# ------------------------------------------------------------------ 11.2
def decay_right(steps_seen, n_steps, lr, wd):
    return (1 - lr * wd) ** n_steps, (1 - lr * wd) ** len(steps_seen)


def decay_swapped(steps_seen, n_steps, lr, wd):
    return decay_right(steps_seen, n_steps, lr, wd)[::-1]


def decay_no_lr(steps_seen, n_steps, lr, wd):
    return (1 - wd) ** n_steps, (1 - wd) ** len(steps_seen)


def decay_linear(steps_seen, n_steps, lr, wd):
    return 1 - lr * wd * n_steps, 1 - lr * wd * len(steps_seen)


def decay_lazy_wrong(steps_seen, n_steps, lr, wd):
    return (1 - lr * wd) ** n_steps, (1 - lr * wd) ** (n_steps - len(steps_seen))


def test_11_2_passes(capsys):
    lesson11.check_decay_factors(decay_right)
    assert "Exercise 11.2 (decay_factors) passed." in capsys.readouterr().out


def test_11_2_stub_says_not_done():
    expect(lesson11.check_decay_factors, stub, "11.2", "not done yet")


@pytest.mark.parametrize("fn, phrase", [
    (decay_swapped, "swapped"),
    (decay_no_lr, "the learning rate scales the decay"),
    (decay_linear, "compounds"),
    (decay_lazy_wrong, "the lazy update decays the row on"),
])
def test_11_2_names_the_mistake(fn, phrase):
    expect(lesson11.check_decay_factors, fn, "11.2", phrase)
