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
import numba
from numba import njit, prange

from coursework import ExerciseError, lesson10
from coursework.pieces import pieces_dir


def stub(*args, **kwargs):
    raise NotImplementedError()


def expect(check, fn, exercise, phrase, **kwargs):
    with pytest.raises(ExerciseError) as info:
        check(fn, **kwargs)
    message = str(info.value)
    assert message.startswith(f"Exercise {exercise}"), message
    assert phrase in message, message
    return message


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
    assert "speed-up" in out and "(2048, 512)" in out
    saved = (pieces_dir() / "bias_gelu_forward.py").read_text()
    assert "def bias_gelu_right(x, b, out):" in saved and "prange(rows)" in saved


@njit(parallel=True)
def bias_gelu_math_tanh(x, b, out):   # right values, but tanh instead of the exp form
    k, a = 0.7978845608028654, 0.044715
    rows, cols = x.shape
    for i in prange(rows):
        for j in range(cols):
            u = x[i, j] + b[j]
            out[i, j] = 0.5 * u * (1.0 + math.tanh(k * (u + a * u * u * u)))
    return out


def test_10_1_reports_speed_against_numpy_the_trainer_and_the_roof(capsys):
    lesson10.check_bias_gelu(bias_gelu_right, repeats=1)
    out = capsys.readouterr().out
    assert "fits in cache" in out and "out of cache" in out
    assert "vectorised exp" in out and "copy bandwidth" in out
    assert "calls tanh" not in out


def test_10_1_math_tanh_kernel_is_not_passed_silently(capsys):
    """Several times the plain loop's time: refused where that is also 3x numpy's (two
    cores), else passed with a note; either way tanh is named."""
    try:
        lesson10.check_bias_gelu(bias_gelu_math_tanh, repeats=1)
    except ExerciseError as refused:
        assert "too slow" in str(refused) and "calls tanh" in str(refused)
    else:
        out = capsys.readouterr().out
        assert "passed" in out and "your kernel calls tanh" in out


@njit
def bias_gelu_serial(x, b, out):   # right values, one thread: no parallel=True
    k, a = 0.7978845608028654, 0.044715
    rows, cols = x.shape
    for i in prange(rows):
        for j in range(cols):
            u = x[i, j] + b[j]
            out[i, j] = 0.5 * u * (2.0 - 2.0 / (np.exp(2.0 * k * (u + a * u * u * u)) + 1.0))
    return out


@njit(parallel=True)
def bias_gelu_range(x, b, out):    # right values, parallel=True but the loops use range
    k, a = 0.7978845608028654, 0.044715
    rows, cols = x.shape
    for i in range(rows):
        for j in range(cols):
            u = x[i, j] + b[j]
            out[i, j] = 0.5 * u * (2.0 - 2.0 / (np.exp(2.0 * k * (u + a * u * u * u)) + 1.0))
    return out


@njit(parallel=True)
def bias_gelu_sigmoid(x, b, out):  # right, written differently: u * sigmoid(2z), shape unpacked late
    two_k = 2.0 * 0.7978845608028654
    for i in prange(x.shape[0]):
        for j in range(x.shape[1]):
            u = x[i, j] + b[j]
            out[i, j] = u / (1.0 + np.exp(-two_k * (u + 0.044715 * u ** 3)))
    return out


def test_10_1_passes_a_kernel_written_differently(capsys):
    lesson10.check_bias_gelu(bias_gelu_sigmoid, repeats=1)
    assert "Exercise 10.1 (bias_gelu_fused) passed." in capsys.readouterr().out


def test_10_1_verdict_names_the_learners_own_gap_and_flags_slower_than_numpy():
    lines = lesson10.bias_gelu_speed_verdict(
        {"yours": 0.852, "plain": 0.064, "numpy": 0.126, "trainer": 0.02}, calls_tanh=True)
    text = " ".join(lines)
    assert "13.3x the time of the lesson's plain fused loop" in text
    assert "your kernel calls tanh" in text
    assert "SLOWER THAN NUMPY" in text and "6.8x the unfused numpy time" in text
    assert "C library" not in text     # the exp is not the cause of this gap


def test_10_1_verdict_blames_the_scalar_exp_only_when_the_plain_loop_is_slow_too():
    lines = lesson10.bias_gelu_speed_verdict(
        {"yours": 0.066, "plain": 0.064, "numpy": 0.055, "trainer": 0.02}, calls_tanh=False)
    text = " ".join(lines)
    assert "plain fused loop" in text and "(1.2x)" in text and "scalar exp" in text
    assert "SLOWER THAN NUMPY" in text
    fast = lesson10.bias_gelu_speed_verdict(
        {"yours": 0.03, "plain": 0.03, "numpy": 0.12, "trainer": 0.02}, calls_tanh=False)
    assert fast == ["out of cache yours beats the unfused numpy version 4.0x: one pass over "
                    "memory instead of ten."]


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
    (bias_gelu_serial, "compiled without parallel=True, so numba runs it on one thread"),
    (bias_gelu_range, "loops use range, not prange"),
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


def xent_with(shift=lambda l: l.max(axis=1, keepdims=True), read_target_late=False,
              add_shift_back=True):
    """The fused loss with one thing changed: the shift, when the target's logit is read,
    or the shift left out of the loss."""
    def xent(logits, targets):
        n = logits.shape[0]
        rows = np.arange(n)
        m = shift(logits)
        target = None if read_target_late else logits[rows, targets].copy()
        e = np.exp(logits - m)
        s = e.sum(axis=1, keepdims=True)
        logits[...] = e / s / n
        logits[rows, targets] -= 1.0 / n
        target = logits[rows, targets] if read_target_late else target
        return float(np.mean(np.log(s[:, 0]) + (m[:, 0] if add_shift_back else 0) - target))
    return xent


def xent_log_of_probability(logits, targets):
    n = logits.shape[0]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    rows = np.arange(n)
    losses = -np.log(p[rows, targets])
    logits[...] = p / n
    logits[rows, targets] -= 1.0 / n
    return float(losses.mean())


def xent_median(logits, targets):
    probe = logits.copy()
    xent_right(logits, targets)
    n = probe.shape[0]
    shifted = probe - probe.max(axis=1, keepdims=True)
    per_row = np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(n), targets]
    return float(np.median(per_row))


@njit(parallel=True)
def xent_numba_log_softmax(logits, targets):
    """Right, written differently: a compiled loop over rows, the log-softmax of the target."""
    n, v = logits.shape
    losses = np.empty(n)
    for i in prange(n):
        top = logits[i].max()
        total = 0.0
        for j in range(v):
            total += np.exp(logits[i, j] - top)
        log_total = np.log(total)
        losses[i] = log_total - (logits[i, targets[i]] - top)
        for j in range(v):
            logits[i, j] = np.exp(logits[i, j] - top - log_total) / n
        logits[i, targets[i]] -= 1.0 / n
    return losses.sum() / n


def test_10_2_passes_a_loss_written_differently(capsys):
    lesson10.check_softmax_cross_entropy(xent_numba_log_softmax)
    assert "Exercise 10.2 (softmax_cross_entropy_fused) passed." in capsys.readouterr().out


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
    (xent_with(shift=lambda l: np.full((l.shape[0], 1), l.max())),
     "a shift shared by the whole batch"),
    (xent_with(shift=lambda l: l[:, :1].copy()), "a shift below the row's largest logit"),
    (xent_log_of_probability, "the target's probability underflows to 0"),
    (xent_with(read_target_late=True), "read after the row had been overwritten"),
    (xent_with(add_shift_back=False), "never came back into the loss"),
    (xent_median, "the median of the row losses"),
])
def test_10_2_names_the_mistake(fn, phrase):
    message = expect(lesson10.check_softmax_cross_entropy, fn, "10.2", phrase)
    assert "log(sum" not in message and "exp(l - m)" not in message    # no formula handed over


# ------------------------------------------------------------------ 11.1
from coursework import lesson11  # noqa: E402


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


def scatter_skips_last_token(ids, g, vocab_size):
    d = np.zeros((vocab_size, g.shape[1]), g.dtype)
    for t in range(len(ids) - 1):
        d[ids[t]] += g[t]
    return d


def scatter_races_on_few_tokens(ids, g, vocab_size):
    """What a race does on 7 tokens: which repeated id loses an addition changes per call."""
    _calls["n"] += 1
    d = scatter_serial_numpy(ids, g, vocab_size)
    lost = [t for t in range(len(ids)) if np.sum(ids == ids[t]) > 1][_calls["n"] % 2]
    d[ids[lost]] -= g[lost]
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
    (scatter_skips_last_token, "Check that the loop visits every token"),
    (scatter_races_on_few_tokens, "differ from run to run"),
])
def test_11_1_names_the_mistake(fn, phrase):
    expect(lesson11.check_embedding_backward, fn, "11.1", phrase, repeats=2)


@njit(parallel=True)
def scatter_per_thread_tables(ids, g, vocab_size):
    """Race-free and repeatable, but one partial table per thread: the grouping of the
    sums, hence the bits, follows the thread count."""
    n, c = g.shape
    chunks = numba.get_num_threads()
    tables = np.zeros((chunks, vocab_size, c), g.dtype)
    size = (n + chunks - 1) // chunks
    for k in prange(chunks):
        for t in range(k * size, min(n, (k + 1) * size)):
            for j in range(c):
                tables[k, ids[t], j] += g[t, j]
    d = np.zeros((vocab_size, c), g.dtype)
    for k in range(chunks):
        d += tables[k]
    return d


@njit(parallel=True)
def scatter_fixed_chunks(ids, g, vocab_size):
    """Right, written differently: partial tables for 8 token chunks, whatever the thread
    count, added in chunk order."""
    n, c = g.shape
    tables = np.zeros((8, vocab_size, c), g.dtype)
    size = (n + 7) // 8
    for k in prange(8):
        for t in range(k * size, min(n, (k + 1) * size)):
            for j in range(c):
                tables[k, ids[t], j] += g[t, j]
    d = np.zeros((vocab_size, c), g.dtype)
    for k in range(8):
        d += tables[k]
    return d


def test_11_1_passes_partial_tables_of_a_fixed_number_of_chunks(capsys):
    lesson11.check_embedding_backward(scatter_fixed_chunks, repeats=2)
    assert "Exercise 11.1 (embedding_backward) passed." in capsys.readouterr().out


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two numba threads")
def test_11_1_a_table_per_thread_is_told_to_fix_the_number_of_chunks():
    expect(lesson11.check_embedding_backward, scatter_per_thread_tables, "11.1",
           "a fixed number of token chunks, not one per thread", repeats=2)


@njit(parallel=True)
def scatter_racy(ids, g, vocab_size):
    d = np.zeros((vocab_size, g.shape[1]), g.dtype)
    for t in prange(ids.size):
        for j in range(g.shape[1]):
            d[ids[t], j] += g[t, j]
    return d


@njit(parallel=True)
def scatter_racy_by_row(ids, g, vocab_size):
    d = np.zeros((vocab_size, g.shape[1]), g.dtype)
    for t in prange(ids.size):
        row = ids[t]
        d[row] = d[row] + g[t]
    return d


def test_11_1_racy_threads_are_caught_whether_or_not_they_race():
    """A token-split prange kernel may or may not lose an update in one run; the check
    says it races either way, with one thread (where it cannot race) too."""
    RACE = ("updates were lost", "different bits", "threads give different",
            "differ from run to run", "a race")
    for fn in (scatter_racy, scatter_racy_by_row):
        with pytest.raises(ExerciseError) as err:
            lesson11.check_embedding_backward(fn, repeats=3)
        assert any(p in str(err.value) for p in RACE), str(err.value)
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        expect(lesson11.check_embedding_backward, scatter_racy, "11.1",
               "runs inside a prange over the tokens", repeats=2)
    finally:
        numba.set_num_threads(threads)


# ------------------------------------------------------------------ 11.2
def bytes_right(ids, vocab_size, width, value_bytes=4, id_bytes=8):
    rows = len(np.unique(ids))
    return vocab_size * width * value_bytes, rows * width * value_bytes + rows * id_bytes


def bytes_per_token(ids, vocab_size, width, value_bytes=4, id_bytes=8):
    return vocab_size * width * value_bytes, np.size(ids) * (width * value_bytes + id_bytes)


def bytes_no_ids(ids, vocab_size, width, value_bytes=4, id_bytes=8):
    return vocab_size * width * value_bytes, len(np.unique(ids)) * width * value_bytes


def bytes_dense_of_batch(ids, vocab_size, width, value_bytes=4, id_bytes=8):
    return np.size(ids) * width * value_bytes, bytes_right(ids, vocab_size, width,
                                                           value_bytes, id_bytes)[1]


def bytes_values_not_bytes(ids, vocab_size, width, value_bytes=4, id_bytes=8):
    return vocab_size * width, len(np.unique(ids)) * (width + 1)


def bytes_swapped(ids, vocab_size, width, value_bytes=4, id_bytes=8):
    return bytes_right(ids, vocab_size, width, value_bytes, id_bytes)[::-1]


def bytes_hardcoded_fp32(ids, vocab_size, width, value_bytes=4, id_bytes=8):
    return bytes_right(ids, vocab_size, width, 4, 8)


def test_11_2_passes(capsys):
    lesson11.check_gradient_bytes(bytes_right)
    assert "Exercise 11.2 (gradient_bytes) passed." in capsys.readouterr().out


def test_11_2_stub_says_not_done():
    expect(lesson11.check_gradient_bytes, stub, "11.2", "not done yet")


@pytest.mark.parametrize("fn, phrase", [
    (bytes_per_token, "repeated ids are summed into one row"),
    (bytes_no_ids, "add one id of id_bytes"),
    (bytes_dense_of_batch, "one row per token. The dense gradient has the table's shape"),
    (bytes_values_not_bytes, "counts values, not bytes"),
    (bytes_swapped, "swapped"),
    (bytes_hardcoded_fp32, "4 bytes per value whatever value_bytes says"),
])
def test_11_2_names_the_mistake(fn, phrase):
    expect(lesson11.check_gradient_bytes, fn, "11.2", phrase)


def test_11_2_row_sparse_gradient_is_the_dense_one_on_its_rows():
    ids = np.array([[5, 2], [5, 9]])
    g = np.arange(8.0).reshape(4, 2)
    rows, values = lesson11.row_sparse_gradient(ids, g)
    assert rows.tolist() == [2, 5, 9]
    assert np.array_equal(values, lesson11.scatter_add_reference(ids.ravel(), g, 10)[rows])
    assert rows.nbytes + values.nbytes == lesson11.gradient_bytes_reference(ids, 10, 2, 8, 8)[1]


# ------------------------------------------------------------------ 11.3
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


def test_11_3_passes(capsys):
    lesson11.check_decay_factors(decay_right)
    assert "Exercise 11.3 (decay_factors) passed." in capsys.readouterr().out


def test_11_3_stub_says_not_done():
    expect(lesson11.check_decay_factors, stub, "11.3", "not done yet")


@pytest.mark.parametrize("fn, phrase", [
    (decay_swapped, "swapped"),
    (decay_no_lr, "the learning rate scales the decay"),
    (decay_linear, "compounds"),
    (decay_lazy_wrong, "the steps on which the token is *not* seen"),
])
def test_11_3_names_the_mistake(fn, phrase):
    expect(lesson11.check_decay_factors, fn, "11.3", phrase)


def decay_counting(dense_steps, lazy_steps, dtype=float):
    """A decay_factors that counts the decays its own way (and rounds in `dtype`)."""
    def decay_factors(steps_seen, n_steps, lr, wd):
        shrink = dtype(1 - lr * wd)
        return (float(shrink ** dense_steps(n_steps, steps_seen)),
                float(shrink ** lazy_steps(n_steps, steps_seen)))
    return decay_factors


def every_step(n, seen):
    return n


def seen_steps(n, seen):
    return len(seen)


@pytest.mark.parametrize("fn", [
    lambda seen, n, lr, wd: (math.exp(n * math.log1p(-lr * wd)),
                             math.exp(len(seen) * math.log1p(-lr * wd))),
    lambda seen, n, lr, wd: (math.prod([1 - lr * wd] * n), math.prod([1 - lr * wd] * len(seen))),
    lambda seen, n, lr, wd: tuple(np.float64(1 - lr * wd) ** np.array([n, len(set(seen))])),
])
def test_11_3_right_answers_written_differently_pass(fn, capsys):
    lesson11.check_decay_factors(fn)
    assert "11.3 (decay_factors) passed" in capsys.readouterr().out


@pytest.mark.parametrize("fn, phrase", [
    (decay_counting(lambda n, seen: n - 1, seen_steps), "one decay too few"),
    (decay_counting(lambda n, seen: n + 1, seen_steps), "one decay too many"),
    (decay_counting(every_step, lambda n, seen: len(seen) + 1), "one decay too many"),
    (decay_counting(every_step, lambda n, seen: max(seen) + 1), "up to the token's last"),
    (decay_counting(every_step, lambda n, seen: max(seen)), "up to the token's last"),
    (decay_counting(every_step, seen_steps, dtype=np.float32), "float32"),
])
def test_11_3_near_misses_are_named_without_the_rule(fn, phrase):
    message = expect(lesson11.check_decay_factors, fn, "11.3", phrase)
    assert "**" not in message


@pytest.mark.parametrize("fn, phrase", [
    (lambda ids, V, w, vb, ib: (V * w * vb, len(set(ids)) * (w * vb + ib)),
     "count the distinct ids over all of its elements"),
    (lambda ids, V, w, vb, ib: (V * w * vb, np.unique(ids).size * w * vb + ids.size * ib),
     "one id per token"),
])
def test_11_2_near_misses_are_named(fn, phrase):
    expect(lesson11.check_gradient_bytes, fn, "11.2", phrase)


def test_11_2_passes_a_count_written_differently(capsys):
    lesson11.check_gradient_bytes(lambda ids, V, w, vb, ib: (
        V * w * vb, len(set(np.ravel(ids).tolist())) * (w * vb + ib)))
    assert "11.2 (gradient_bytes) passed" in capsys.readouterr().out


# ------------------------------------------------------------------ 12.1
from coursework import lesson12  # noqa: E402


def clip_right(grads, max_norm):
    norm = float(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads.values())))
    if norm > max_norm:
        for g in grads.values():
            g *= max_norm / norm
    return norm


def clip_torch_style(grads, max_norm):     # max_norm / (norm + 1e-6), as torch does
    norm = float(np.sqrt(sum(np.sum(g ** 2) for g in grads.values())))
    scale = min(1.0, max_norm / (norm + 1e-6))
    for g in grads.values():
        g *= scale
    return norm


def clip_per_tensor(grads, max_norm):
    norm = float(np.sqrt(sum(np.sum(g ** 2) for g in grads.values())))
    for g in grads.values():
        n = np.linalg.norm(g)
        if n > max_norm:
            g *= max_norm / n
    return norm


def clip_returns_after(grads, max_norm):
    clip_right(grads, max_norm)
    return float(np.sqrt(sum(np.sum(g ** 2) for g in grads.values())))


def clip_sum_of_norms(grads, max_norm):
    norm = sum(float(np.linalg.norm(g)) for g in grads.values())
    if norm > max_norm:
        for g in grads.values():
            g *= max_norm / norm
    return norm


def clip_always(grads, max_norm):
    norm = float(np.sqrt(sum(np.sum(g ** 2) for g in grads.values())))
    for g in grads.values():
        g *= max_norm / norm
    return norm


def clip_not_in_place(grads, max_norm):
    norm = float(np.sqrt(sum(np.sum(g ** 2) for g in grads.values())))
    {k: g * max_norm / norm for k, g in grads.items()}
    return norm


def test_12_1_passes_and_saves(capsys):
    lesson12.check_clip_global_norm(clip_right)
    assert "Exercise 12.1 (clip_global_norm) passed." in capsys.readouterr().out
    assert "def clip_right(" in (pieces_dir() / "clip_global_norm.py").read_text()


def test_12_1_accepts_the_torch_epsilon():
    lesson12.check_clip_global_norm(clip_torch_style)


def test_12_1_stub_says_not_done():
    expect(lesson12.check_clip_global_norm, stub, "12.1", "not done yet")


@pytest.mark.parametrize("fn, phrase", [
    (clip_per_tensor, "clipped to max_norm on its own"),
    (clip_returns_after, "the norm after clipping"),
    (clip_sum_of_norms, "sum of the tensors' norms"),
    (clip_always, "Clipping only ever shrinks"),
    (clip_not_in_place, "in place"),
])
def test_12_1_names_the_mistake(fn, phrase):
    message = expect(lesson12.check_clip_global_norm, fn, "12.1", phrase)
    assert "sqrt(" not in message and "min(1" not in message and "/ global_norm" not in message


# ------------------------------------------------------------------ 12.2
@njit(parallel=True)
def adamw_right(p, g, m, v, step, lr, beta1, beta2, eps, weight_decay):
    bias1 = 1.0 - beta1 ** step
    bias2 = 1.0 - beta2 ** step
    for i in prange(p.size):
        m[i] = beta1 * m[i] + (1.0 - beta1) * g[i]
        v[i] = beta2 * v[i] + (1.0 - beta2) * g[i] * g[i]
        p[i] = p[i] * (1.0 - lr * weight_decay) - lr * (m[i] / bias1) / (
            np.sqrt(v[i] / bias2) + eps)


def adamw_forgets_state(p, g, m, v, step, lr, b1, b2, eps, wd):
    m2, v2 = m.copy(), v.copy()
    lesson12.adamw_reference(p, g, m2, v2, step, lr, b1, b2, eps, wd)


def adamw_no_update(p, g, m, v, step, lr, b1, b2, eps, wd):
    lesson12.adamw_reference(p.copy(), g, m, v, step, lr, b1, b2, eps, wd)


def test_12_2_passes_and_saves(capsys):
    lesson12.check_adamw_step(adamw_right, repeats=1)
    out = capsys.readouterr().out
    assert "Exercise 12.2 (adamw_step) passed." in out and "speedup" in out
    assert "def adamw_right(" in (pieces_dir() / "adamw_step.py").read_text()


def test_12_2_stub_says_not_done():
    expect(lesson12.check_adamw_step, stub, "12.2", "not done yet")


@pytest.mark.parametrize("index, phrase", [
    (0, "L2 regularisation"), (1, "bias correction is missing"), (2, "off by one step"),
    (3, "the step before this one"), (4, "eps is inside the square root"),
    (5, "after the Adam step"), (6, "no weight decay"), (7, "not scaled by the learning rate"),
])
def test_12_2_names_the_mistake(index, phrase):
    wrong, _ = lesson12._variants()[index]
    expect(lesson12.check_adamw_step, wrong, "12.2", phrase, repeats=1)


def test_12_2_hints_name_the_slip_without_the_update_rule():
    for wrong, hint in lesson12._variants():
        assert "sqrt(" not in hint and "**" not in hint and "p *=" not in hint, hint


def adamw_torch_style(p, g, m, v, step, lr, beta1, beta2, eps, weight_decay):
    """torch's own arrangement: a step size with the first correction folded in, the
    square root of v divided by the square root of the second correction."""
    p *= 1.0 - lr * weight_decay
    m *= beta1
    m += (1.0 - beta1) * g
    v *= beta2
    v += (1.0 - beta2) * g * g
    step_size = lr / (1.0 - beta1 ** step)
    denom = np.sqrt(v) / math.sqrt(1.0 - beta2 ** step) + eps
    p -= step_size * m / denom


def test_12_2_passes_torchs_arrangement_of_the_same_update(capsys):
    lesson12.check_adamw_step(adamw_torch_style, repeats=1)
    assert "Exercise 12.2 (adamw_step) passed." in capsys.readouterr().out


def test_12_2_state_and_in_place():
    expect(lesson12.check_adamw_step, adamw_forgets_state, "12.2", "moments m and v", repeats=1)
    expect(lesson12.check_adamw_step, adamw_no_update, "12.2", "did not change", repeats=1)


# ------------------------------------------------- 12: lesson 09's pieces
def test_mixed_precision_pieces_fall_back_to_the_engine_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path))   # a folder of its own
    chosen = lesson12.mixed_precision_pieces()
    assert set(chosen) == {"to_bf16", "update_scale", "master_weight_step"}
    for name, (fn, owner) in chosen.items():
        assert owner == "the engine's, because not written yet", (name, owner)
    assert chosen["update_scale"][0] is lesson12.engine_update_scale


def test_the_engine_versions_pass_the_lesson_09_checks(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path))   # a folder of its own
    from coursework import lesson09
    lesson09.check_update_scale(lesson12.engine_update_scale)
    lesson09.check_master_weight_step(lesson12.engine_master_weight_step)
    lesson09.check_to_bf16(lesson12.PRECISION_PIECES["to_bf16"][1])
    assert capsys.readouterr().out.count("passed") == 3


def update_scale_mine(scale, good_steps, finite, growth_interval):
    if finite:
        good_steps += 1
        return (scale * 2, 0, True) if good_steps == growth_interval else (scale, good_steps, True)
    return scale / 2, 0, False


def test_mixed_precision_pieces_run_the_learners_saved_piece(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path))   # a folder of its own
    from coursework import lesson09
    lesson09.check_update_scale(update_scale_mine)
    fn, owner = lesson12.mixed_precision_pieces()["update_scale"]
    assert owner == "yours (09.3)" and fn.__name__ == "update_scale_mine"
    assert fn(8.0, 0, False, 3) == (4.0, 0, False)


def test_a_piece_that_does_not_load_falls_back_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path))   # a folder of its own
    import json
    folder = pieces_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "master_weight_step.py").write_text("def master_weight_step(:\n")
    index = folder / "index.json"
    entries = json.loads(index.read_text()) if index.exists() else {}
    entries["master_weight_step"] = {"function": "master_weight_step", "exercise": "09.2"}
    index.write_text(json.dumps(entries))
    fn, owner = lesson12.mixed_precision_pieces()["master_weight_step"]
    assert fn is lesson12.engine_master_weight_step
    assert owner.startswith("the engine's, because yours does not load: SyntaxError")


# ------------------------------------------------------------------ 12.3
def norms_right(group_norms, spike_factor=10.0):
    total = np.zeros(len(next(iter(group_norms.values()))))
    for norms in group_norms.values():
        total += np.asarray(norms) ** 2
    total = np.sqrt(total)
    spikes = [t for t in range(1, len(total)) if total[t] / np.median(total[:t]) > spike_factor]
    return list(total), spikes, [k for k, v in group_norms.items() if max(v) == 0 == min(v)]


def _norms_with(global_=None, spikes=None, frozen=None):
    def fn(group_norms, spike_factor=10.0):
        total, s, f = norms_right(group_norms, spike_factor)
        return (global_(group_norms, total) if global_ else total,
                spikes(total) if spikes else s, frozen(group_norms) if frozen else f)
    return fn


norms_sum = _norms_with(global_=lambda g, t: np.sum([v for v in g.values()], axis=0))
norms_squared = _norms_with(global_=lambda g, t: np.asarray(t) ** 2)
norms_vs_previous = _norms_with(spikes=lambda t: [i for i in range(1, len(t))
                                                  if t[i] > 10 * t[i - 1]])
norms_one_late = _norms_with(spikes=lambda t: [i + 1 for i in range(1, len(t))
                                               if t[i] > 10 * np.median(t[:i])])
norms_none = _norms_with(spikes=lambda t: [])
norms_tolerance = _norms_with(frozen=lambda g: [k for k, v in g.items() if max(v) < 1e-6])
norms_any_zero = _norms_with(frozen=lambda g: [k for k, v in g.items() if min(v) == 0.0])
norms_mean = _norms_with(spikes=lambda t: [i for i in range(1, len(t))
                                           if t[i] > 10 * np.mean(t[:i])])
norms_whole_log = _norms_with(spikes=lambda t: [i for i in range(1, len(t))
                                                if t[i] > 10 * np.median(t)])
norms_last_zero = _norms_with(frozen=lambda g: [k for k, v in g.items() if v[-1] == 0.0])
norms_first_zero = _norms_with(frozen=lambda g: [k for k, v in g.items() if v[0] == 0.0])


def norms_written_differently(group_norms, spike_factor=10.0):
    """Right, another way: a running loop over steps, a numpy array of norms, tuples."""
    names = list(group_norms)
    table = np.array([group_norms[k] for k in names], dtype=np.float64)
    total = np.linalg.norm(table, axis=0)
    spikes = tuple(t for t in range(len(total))
                   if t > 0 and total[t] / spike_factor > np.median(total[:t]))
    frozen = tuple(k for k, row in zip(names, table) if (row == 0).all())
    return total, spikes, frozen


def test_12_3_passes(capsys):
    lesson12.check_summarize_norms(norms_right)
    assert "Exercise 12.3 (summarize_norms) passed." in capsys.readouterr().out


def test_12_3_passes_an_answer_written_differently(capsys):
    lesson12.check_summarize_norms(norms_written_differently)
    assert "and right on 6 more logs" in capsys.readouterr().out


def test_12_3_stub_says_not_done():
    expect(lesson12.check_summarize_norms, stub, "12.3", "not done yet")


@pytest.mark.parametrize("fn, phrase", [
    (norms_sum, "sum of the groups' norms"),
    (norms_squared, "squared norm"),
    (norms_vs_previous, "median of all the steps before it"),
    (norms_one_late, "whose own norm jumped"),
    (norms_none, "times the median of the steps before it"),
    (norms_tolerance, "tiny norms (1e-07), not zero ones"),
    (norms_any_zero, "zero at step 5 only"),
    (norms_mean, "mean of the earlier steps, not their median"),
    (norms_whole_log, "median of the whole log, later steps included"),
    (norms_last_zero, "'late' is zero at its last step only"),
    (norms_first_zero, "'early' is zero at its first step only"),
])
def test_12_3_names_the_mistake(fn, phrase):
    expect(lesson12.check_summarize_norms, fn, "12.3", phrase)


def test_12_3_rejects_a_dict():
    expect(lesson12.check_summarize_norms, lambda g, f=10.0: {"global": 1}, "12.3",
           "return three things")


# ------------------------------------------------------------------ 12.4
def buckets_right(backward_ms, bucket_bytes, link):
    out, clock, link_free = [], 0.0, 0.0
    for ms, size in zip(backward_ms, bucket_bytes):
        clock += ms
        begin = clock if clock > link_free else link_free
        link_free = begin + size / link
        out.append([begin, link_free])
    return out


def buckets_after_backward(backward_ms, bucket_bytes, link):
    return buckets_right([sum(backward_ms)] + [0] * (len(backward_ms) - 1), bucket_bytes, link)


def buckets_overlapping(backward_ms, bucket_bytes, link):
    ready = np.cumsum(backward_ms)
    return [(r, r + b / link) for r, b in zip(ready, bucket_bytes)]


def buckets_not_cumulative(backward_ms, bucket_bytes, link):
    out, free = [], 0.0
    for ms, size in zip(backward_ms, bucket_bytes):
        begin = max(ms, free)
        free = begin + size / link
        out.append((begin, free))
    return out


def buckets_before_ready(backward_ms, bucket_bytes, link):
    out, free = [], backward_ms[0]
    for size in bucket_bytes:
        out.append((free, free + size / link))
        free += size / link
    return out


def buckets_times_link(backward_ms, bucket_bytes, link):
    return buckets_right(backward_ms, bucket_bytes, 1 / link)


def test_12_4_passes(capsys):
    lesson12.check_bucket_schedule(buckets_right)
    assert "Exercise 12.4 (bucket_schedule) passed." in capsys.readouterr().out


def test_12_4_stub_says_not_done():
    expect(lesson12.check_bucket_schedule, stub, "12.4", "not done yet")


@pytest.mark.parametrize("fn, phrase", [
    (buckets_after_backward, "no overlap"),
    (buckets_overlapping, "one link carries one bucket at a time"),
    (buckets_not_cumulative, "the backward *up to it* is done"),
    (buckets_before_ready, "before its backward had produced it"),
    (buckets_times_link, "lasts the wrong time"),
])
def test_12_4_names_the_mistake(fn, phrase):
    expect(lesson12.check_bucket_schedule, fn, "12.4", phrase)


def schedule_ready_when(ready_of, seconds_of=lambda size, link: size / link,
                        out_type=list):
    """A bucket_schedule whose bucket i is ready at ready_of(ends of the backward, i)."""
    def bucket_schedule(backward_ms, bucket_bytes, link):
        ends = np.concatenate([[0.0], np.cumsum(backward_ms)])     # ends[i + 1]: bucket i
        out, free = [], 0.0
        for i, size in enumerate(bucket_bytes):
            begin = max(ready_of(ends, i), free)
            free = begin + seconds_of(size, link)
            out.append((begin, free))
        return out_type(out)
    return bucket_schedule


@pytest.mark.parametrize("fn", [
    schedule_ready_when(lambda ends, i: ends[i + 1]),
    schedule_ready_when(lambda ends, i: ends[i + 1], out_type=np.array),
    schedule_ready_when(lambda ends, i: ends[i + 1],
                        out_type=lambda pairs: np.array(pairs, dtype=np.float32)),
])
def test_12_4_right_answers_written_differently_pass(fn, capsys):
    lesson12.check_bucket_schedule(fn)
    assert "12.4 (bucket_schedule) passed" in capsys.readouterr().out


@pytest.mark.parametrize("fn, phrase", [
    (schedule_ready_when(lambda ends, i: ends[i]), "when its backward begins"),
    (schedule_ready_when(lambda ends, i: ends[min(i + 2, len(ends) - 1)]),
     "waits for the backward of bucket 1"),
    (schedule_ready_when(lambda ends, i: ends[i + 1], lambda size, link: size * link),
     "lasts the wrong time"),
    (schedule_ready_when(lambda ends, i: ends[i + 1] + 1.0), "waits longer than it has to"),
])
def test_12_4_near_misses_are_named_without_the_rule(fn, phrase):
    message = expect(lesson12.check_bucket_schedule, fn, "12.4", phrase)
    assert "max(" not in message and "sum(" not in message


def test_12_4_wants_pairs():
    expect(lesson12.check_bucket_schedule, lambda b, s, l: [1.0, 2.0], "12.4",
           "one (start_ms, end_ms) pair per bucket")


# ------------------------------------------------------------------ 12.5
RIGHT = {"A": "missing_div_k", "B": "attention_scores", "C": "unordered_scatter",
         "D": "bf16_swallowed", "E": "activations", "F": "fp16_overflow"}


def test_12_5_passes_and_prints_first_moves(capsys):
    lesson12.check_diagnose(lambda: dict(RIGHT))
    out = capsys.readouterr().out
    assert "Exercise 12.5 (diagnose) passed." in out and "fp32 master weights" in out


def test_12_5_stub_says_not_done():
    expect(lesson12.check_diagnose, stub, "12.5", "not done yet")


@pytest.mark.parametrize("answer, phrase", [
    ({**RIGHT, "A": "activations", "E": "missing_div_k"}, "run A"),
    ({**RIGHT, "B": "activations", "E": "attention_scores"}, "N squared"),
    ({**RIGHT, "D": "fp16_overflow", "F": "bf16_swallowed"}, "bf16's spacing"),
    ({k: v for k, v in RIGHT.items() if k != "C"}, "no diagnosis for run(s) C"),
    ({**RIGHT, "C": "race"}, "not one of the causes"),
])
def test_12_5_names_the_wrong_run(answer, phrase):
    expect(lesson12.check_diagnose, lambda: answer, "12.5", phrase)


def test_12_5_rejects_a_list():
    expect(lesson12.check_diagnose, lambda: list(RIGHT.values()), "12.5", "return a dict")


# ------------------------------------------------------------------ 13.1
from coursework import lesson13  # noqa: E402


def test_trainer_pieces_load_with_their_numba_decorator():
    """A saved @njit kernel loads (load_piece alone gives it only numpy's name)."""
    from coursework.pieces import piece_for_slot
    lesson11.check_embedding_backward(scatter_right, repeats=1)
    piece, why = piece_for_slot("embedding_backward")
    assert why is None
    ids = np.array([1, 0, 1])
    g = np.arange(6, dtype=np.float64).reshape(3, 2)
    assert np.array_equal(piece(ids, g, 3), [[2, 3], [4, 6], [0, 0]])
    owners = {name: piece_for_slot(name)[1] or "yours" for name in lesson13.TRAINER_PIECES}
    assert owners["embedding_backward"] == "yours"
    assert set(owners) == set(lesson13.TRAINER_PIECES)


def test_10_1_tanh_in_a_comment_or_docstring_is_not_a_call():
    def kernel(x, b, out):
        """GELU, tanh form: tanh(z) = 1 - 2 / (exp(2 z) + 1)."""
        t = 1.0 - 2.0 / (np.exp(2.0 * x) + 1.0)   # tanh(z) by exp
        return t
    assert not lesson10.calls(kernel, "tanh")
    assert lesson10.calls(bias_gelu_math_tanh, "tanh")


# ------------------------------------------- the learner's gradient checker
def _code_cell(lesson_glob, marker):
    from notebook_tools import ROOT
    source = next((ROOT / "course" / "source").glob(lesson_glob)).read_text()
    found = [c for c in source.split("\n# %%") if marker in c and not c.startswith(" [markdown]")]
    assert len(found) == 1, marker
    return found[0].split("\n", 1)[1]


def _run_cell(cell, namespace):
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(cell, namespace)
    return out.getvalue()


def _xent_numpy(logits, targets):          # 10.2's contract, written in numpy
    loss, grad = lesson10.softmax_cross_entropy_reference(logits, targets)
    logits[...] = grad
    return loss


@pytest.mark.parametrize("owner", ["yours (04.3)", "the engine's, because not written yet"])
def test_lessons_10_and_11_print_the_same_checked_lines_whoever_checks(owner, monkeypatch,
                                                                        tmp_path):
    """The compared cells of lessons 10 and 11 print the same whether the learner's 04.3
    spot_check (saved from the lesson 04 solution) or the engine's checked the gradients;
    only the nbval-ignored cell before them names the owner."""
    from coursework.pieces import gradient_checker
    from test_pieces_end_to_end import save_solution_pieces
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path / "pieces"))
    if owner.startswith("yours"):
        save_solution_pieces(["spot_check"], tmp_path)
    spot_check, who = gradient_checker()
    assert who == owner
    ns = {"np": np, "spot_check": spot_check, "embedding_backward":
          lesson11.scatter_add_reference, "softmax_cross_entropy_fused": _xent_numpy}
    out = _run_cell(_code_cell("11_*.py", "ids_check = np.array"), ns)
    assert out == ("20 elements of the (10, 3) table checked in float64: every one agrees "
                   "with central differences: True\n")
    out = _run_cell(_code_cell("10_*.py", "logits_check = np.random"), ns)
    assert out == ("your softmax + cross-entropy gradient: 10 elements checked in float64, "
                   "all agree with central differences: True\n")


def test_a_wrong_scatter_add_fails_the_lessons_gradient_check(monkeypatch, tmp_path):
    from coursework.pieces import gradient_checker
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path))

    def last_write_wins(ids, g, vocab_size):
        d = np.zeros((vocab_size, g.shape[1]))
        d[ids] = g
        return d

    ns = {"np": np, "spot_check": gradient_checker()[0], "embedding_backward": last_write_wins}
    with pytest.raises(AssertionError):
        _run_cell(_code_cell("11_*.py", "ids_check = np.array"), ns)
