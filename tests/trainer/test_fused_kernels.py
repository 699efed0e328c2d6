"""Each fused kernel equals its unfused reference composition (float64, 1e-10
relative), its backward passes a central-difference check, and the float32
versions used for training stay close to float64."""
from __future__ import annotations

import numpy as np
import pytest

import engine.trainer.kernels as F
from . import reference as ref

RTOL = 1e-10


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


@pytest.fixture
def rng():
    return np.random.default_rng(8)


# ------------------------------------------------------------------ layer norm
def test_layernorm_forward_equals_reference(rng):
    x = rng.standard_normal((3, 5, 24)) * 3 + 1
    w, b = rng.standard_normal(24), rng.standard_normal(24)
    out, mean, rstd = F.layernorm_forward(x, w, b)
    want, want_mean, want_rstd = ref.layernorm(x, w, b)
    assert rel(out, want) < RTOL and rel(mean, want_mean) < RTOL and rel(rstd, want_rstd) < RTOL


def test_layernorm_backward_equals_reference_and_adds_into_dx(rng):
    x = rng.standard_normal((37, 16))
    w, b = rng.standard_normal(16), rng.standard_normal(16)
    dout = rng.standard_normal((37, 16))
    _, mean, rstd = F.layernorm_forward(x, w, b)
    start = rng.standard_normal((37, 16))
    dx, dw, db = F.layernorm_backward(dout, x, w, mean, rstd, dx=start.copy())
    # reference: the unfused three-pass formula
    xhat = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)
    g = dout * w
    want_dx = (g - g.mean(1, keepdims=True) - xhat * (g * xhat).mean(1, keepdims=True)) \
        / np.sqrt(x.var(1, keepdims=True) + 1e-5)
    assert rel(dx - start, want_dx) < RTOL
    assert rel(dw, (dout * xhat).sum(0)) < RTOL and rel(db, dout.sum(0)) < RTOL
    loss = lambda xx: float((ref.layernorm(xx, w, b)[0] * dout).sum())  # noqa: E731
    assert ref.directional_check(loss, x, dx - start, rng) < 1e-6


# ------------------------------------------------------------------ bias + GELU
def test_bias_gelu_forward_and_backward_equal_reference(rng):
    h = rng.standard_normal((50, 40)) * 2
    bias = rng.standard_normal(40)
    out = F.bias_gelu_forward(h, bias)
    assert rel(out, ref.gelu(h + bias)) < RTOL
    dout = rng.standard_normal(h.shape)
    dh, dbias = F.bias_gelu_backward(dout, h, bias)
    want = dout * ref.gelu_grad(h + bias)
    assert rel(dh, want) < RTOL and rel(dbias, want.sum(0)) < RTOL
    loss = lambda hh: float((ref.gelu(hh + bias) * dout).sum())  # noqa: E731
    assert ref.directional_check(loss, h, dh, rng) < 1e-6


def test_gelu_backward_may_overwrite_its_input_gradient(rng):
    """The model writes dh over dout (same buffer): element-wise, so it is safe."""
    h, bias = rng.standard_normal((9, 8)), rng.standard_normal(8)
    dout = rng.standard_normal((9, 8))
    want, _ = F.bias_gelu_backward(dout.copy(), h, bias)
    buf = dout.copy()
    F.bias_gelu_backward(buf, h, bias, dh=buf, dbias=np.zeros(8))
    assert np.array_equal(buf, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_backward_writes_the_forwards_output_bit_for_bit(rng, dtype):
    """Given out=, the backward also writes gelu(h + bias), which the model then
    need not keep from the forward: the same bits as the forward's, and dh and
    dbias as without it."""
    h = (rng.standard_normal((37, 24)) * 3).astype(dtype)
    bias = rng.standard_normal(24).astype(dtype)
    dout = rng.standard_normal(h.shape).astype(dtype)
    forward = F.bias_gelu_forward(h, bias)
    want_dh, want_dbias = F.bias_gelu_backward(dout, h, bias)
    out = np.full_like(h, np.nan)
    dh, dbias = F.bias_gelu_backward(dout, h, bias, out=out)
    assert np.array_equal(out, forward)
    assert np.array_equal(dh, want_dh) and np.array_equal(dbias, want_dbias)
    with pytest.raises(ValueError, match="output out must be a C-contiguous array"):
        F.bias_gelu_backward(dout, h, bias, out=np.empty((37, 23), dtype))


# Pre-activations far below zero: from about -10.3 down (in float32) the sigmoid
# inside GELU would be a subnormal number, which CPUs compute many times slower.
VERY_NEGATIVE = [-1e4, -200.0, -50.0, -20.0, -10.4, -10.3, -10.2, -9.0]


def test_gelus_float32_sigmoid_never_becomes_subnormal():
    from engine.trainer.kernels.gelu import GELU_A, GELU_K, _sigmoid_2z
    f = np.float32
    one, k2, a = f(1), f(-2 * GELU_K), f(GELU_A)
    for u in VERY_NEGATIVE + [-1e30, -1.0, 0.0, 3.0]:
        s = _sigmoid_2z(f(u), one, k2, a)
        assert np.finfo(f).tiny <= s <= 1, (u, s)
    assert _sigmoid_2z(f(1e4), one, k2, a) == 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_far_below_zero_still_equals_reference(rng, dtype):
    """Where the sigmoid is held at the smallest normal number, GELU's output and
    gradient stay within 1e-25 of the reference's, which are zero there (its
    1 + tanh(z) rounds to zero), as the exact values are (below 4e-27 here)."""
    h = np.array([VERY_NEGATIVE[1:]] * 3, dtype)
    bias = np.zeros(h.shape[1], dtype)
    dout = rng.standard_normal(h.shape).astype(dtype)
    out = F.bias_gelu_forward(h, bias)
    dh, dbias = F.bias_gelu_backward(dout, h, bias)
    u = h.astype(np.float64)
    assert np.abs(out - ref.gelu(u)).max() < 1e-25
    assert np.abs(dh - dout * ref.gelu_grad(u)).max() < 1e-25
    assert np.isfinite(dbias).all()


# ------------------------------------------------------------------ attention
# T = 150: blocks of query rows (attention.ROW_BLOCK = 32: four of 32, then 22)
@pytest.mark.parametrize("B,T,H,C", [(2, 7, 2, 6), (1, 33, 3, 12), (2, 16, 4, 32),
                                     (1, 150, 2, 8)])
def test_attention_equals_masked_softmax_reference(rng, attention_build, B, T, H, C):
    qkv = rng.standard_normal((B, T, 3 * C))
    out, probs = F.attention_forward(qkv, H)
    want, want_p = ref.attention(qkv, H)
    assert rel(out, want) < RTOL and rel(probs, want_p) < RTOL
    assert np.all(np.triu(probs, 1) == 0), "the masked half must stay exactly zero"
    dout = rng.standard_normal(out.shape)
    dqkv = F.attention_backward(dout, qkv, probs)
    assert rel(dqkv, ref.attention_grad(dout, qkv, H)) < RTOL
    loss = lambda z: float((ref.attention(z, H)[0] * dout).sum())  # noqa: E731
    assert ref.directional_check(loss, qkv, dqkv, rng) < 1e-6


def test_attention_never_touches_probs_right_of_a_rows_block(rng, attention_build):
    """P's entries right of each block of query rows are neither written by the
    forward nor read by the backward: a buffer full of NaN there gives the same
    bits, and the NaN stay."""
    from engine.trainer.kernels.attention import ROW_BLOCK
    B, T, H, C = 1, 150, 2, 8                       # blocks of 32 rows: four, then 22
    qkv = rng.standard_normal((B, T, 3 * C))
    dout = rng.standard_normal((B, T, C))
    out, probs = F.attention_forward(qkv, H)
    junk = np.full_like(probs, np.nan)
    out2, probs2 = F.attention_forward(qkv, H, probs=junk)
    assert np.array_equal(out2, out)
    right = np.zeros((T, T), bool)
    for r0 in range(0, T, ROW_BLOCK):
        right[r0:r0 + ROW_BLOCK, min(r0 + ROW_BLOCK, T):] = True
    assert np.isnan(probs2[:, :, right]).all() and not np.isnan(probs2[:, :, ~right]).any()
    assert np.array_equal(probs2[:, :, ~right], probs[:, :, ~right])
    assert np.array_equal(F.attention_backward(dout, qkv, probs2),
                          F.attention_backward(dout, qkv, probs))


def test_attention_builds_agree_and_the_thread_count_picks_one(rng, monkeypatch):
    """The replicas (one numba thread each) run the pairs one by one; more
    threads, in parallel. Both kernels compute each pair with the same code
    either way: the same bits. Each build repeats its bits."""
    import numba
    from engine.trainer.kernels import threads
    qkv = rng.standard_normal((2, 96, 3 * 32)).astype(np.float32)
    dout = rng.standard_normal((2, 96, 32)).astype(np.float32)
    runs = {}
    for one_thread in (True, False):
        monkeypatch.setattr(threads, "single_threaded", lambda: one_thread)
        out, probs = F.attention_forward(qkv, 4)
        fout, lse = F.flash_attention_forward(qkv, 4)
        runs[one_thread] = (out, probs, F.attention_backward(dout, qkv, probs), fout, lse,
                            F.flash_attention_backward(dout, qkv, fout, lse))
        assert np.array_equal(F.attention_forward(qkv, 4)[0], out), "a build repeats its bits"
    for serial, parallel in zip(runs[True], runs[False]):
        assert np.array_equal(serial, parallel)
    monkeypatch.undo()
    previous = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        assert threads.single_threaded()
    finally:
        numba.set_num_threads(previous)


# ------------------------------------------------------------------ cross-entropy
def test_crossentropy_turns_logits_into_their_gradient(rng):
    logits = rng.standard_normal((20, 13)) * 4
    targets = rng.integers(0, 13, 20)
    want_losses, want_grad = ref.crossentropy(logits, targets)
    buf = logits.copy()
    mean, losses = F.crossentropy_softmax(buf, targets, 0.25)
    assert rel(losses, want_losses) < RTOL
    assert abs(mean - want_losses.mean()) < 1e-12
    assert rel(buf, 0.25 * want_grad) < RTOL
    loss = lambda z: 0.25 * float(ref.crossentropy(z, targets)[0].sum())  # noqa: E731
    assert ref.directional_check(loss, logits, buf, rng) < 1e-6
    untouched = logits.copy()
    eval_mean, _ = F.crossentropy_loss(untouched, targets)
    assert eval_mean == pytest.approx(want_losses.mean(), rel=1e-12)
    assert np.array_equal(untouched, logits)


def test_crossentropy_rejects_targets_out_of_range(rng):
    with pytest.raises(ValueError, match=r"targets must lie in \[0, 5\)"):
        F.crossentropy_softmax(rng.standard_normal((3, 5)), np.array([0, 5, 1]))


# ------------------------------------------------------------------ embedding
def test_embedding_forward_and_scatter_add_backward(rng):
    V, T, C = 11, 6, 20
    ids = rng.integers(0, V, (3, T))
    ids[0, :4] = 7                                    # repeated ids must all be added
    wte, wpe = rng.standard_normal((V, C)), rng.standard_normal((T + 2, C))
    x = F.embedding_forward(ids, wte, wpe)
    assert rel(x, wte[ids] + wpe[:T]) < RTOL
    dx = rng.standard_normal(x.shape)
    dwte, dwpe = F.embedding_backward(ids, dx, V)
    want = np.zeros((V, C))
    np.add.at(want, ids.reshape(-1), dx.reshape(-1, C))
    assert rel(dwte, want) < RTOL and rel(dwpe, dx.sum(0)) < RTOL
    assert np.all(dwte[np.setdiff1d(np.arange(V), ids)] == 0), "untouched rows stay zero"


def test_scatter_add_is_bitwise_the_same_on_any_thread_count(rng):
    import numba
    ids = rng.integers(0, 5, (8, 64))                 # few ids: many collisions
    dx = rng.standard_normal((8, 64, 48)).astype(np.float32)
    results = []
    for n in sorted({1, numba.config.NUMBA_NUM_THREADS}):
        numba.set_num_threads(n)
        try:
            results.append(F.embedding_backward(ids, dx, 5)[0])
        finally:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    results.append(F.embedding_backward(ids, dx, 5)[0])
    assert all(np.array_equal(results[0], r) for r in results[1:])


# ------------------------------------------------------------------ residual, bias, linear
def test_residual_bias_add_and_bias_grad(rng):
    x, y, b = rng.standard_normal((30, 9)), rng.standard_normal((30, 9)), rng.standard_normal(9)
    assert rel(F.residual_bias_add(x, y, b), x + y + b) < RTOL
    start = rng.standard_normal(9)
    assert rel(F.bias_grad(y, dbias=start.copy()), start + y.sum(0)) < RTOL


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_transposes_are_flags_and_accumulate_adds(rng, dtype):
    a = rng.standard_normal((23, 17)).astype(dtype)
    b = rng.standard_normal((17, 9)).astype(dtype)
    c = rng.standard_normal((23, 9)).astype(dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    out = np.empty((23, 9), dtype)
    assert rel(F.gemm(a, b, out), a @ b) < tol
    dw = np.ones((17, 9), dtype)
    F.gemm(a, c, dw, trans_a=True, accumulate=True)
    assert rel(dw, 1 + a.T @ c) < tol
    dx = np.empty((23, 17), dtype)
    assert rel(F.gemm(c, b, dx, trans_b=True), c @ b.T) < tol
    with pytest.raises(ValueError, match="op\\(a\\) is \\(23, 17\\)"):
        F.gemm(a, a, out)


def test_linear_forward_backward(rng):
    x, w, b = rng.standard_normal((12, 5)), rng.standard_normal((5, 7)), rng.standard_normal(7)
    assert rel(F.linear_forward(x, w, b), x @ w + b) < RTOL
    dy = rng.standard_normal((12, 7))
    dx, dw, db = F.linear_backward(dy, x, w)
    assert rel(dx, dy @ w.T) < RTOL and rel(dw, x.T @ dy) < RTOL and rel(db, dy.sum(0)) < RTOL


# ------------------------------------------------------------------ optimizer
def test_adamw_matches_the_textbook_update_with_per_segment_decay(rng):
    p = rng.standard_normal(50)
    g = rng.standard_normal(50)
    m, v = np.zeros(50), np.zeros(50)
    items = F.work_items([(0, 30, 0.1), (30, 50, 0.0)])
    want_p, want_m, want_v = p.copy(), m.copy(), v.copy()
    for step in (1, 2):
        F.adamw_update(p, g, m, v, items, lr=1e-2, step=step, beta1=0.9, beta2=0.99,
                       grad_scale=0.5)
        gs = 0.5 * g
        want_m = 0.9 * want_m + 0.1 * gs
        want_v = 0.99 * want_v + 0.01 * gs * gs
        decay = np.where(np.arange(50) < 30, 0.1, 0.0)
        want_p *= 1 - 1e-2 * decay
        want_p -= 1e-2 / (1 - 0.9 ** step) * want_m / (
            np.sqrt(want_v) / np.sqrt(1 - 0.99 ** step) + 1e-8)
    assert rel(p, want_p) < RTOL and rel(m, want_m) < RTOL and rel(v, want_v) < RTOL


def test_global_norm_and_clip_scale(rng):
    g = rng.standard_normal(1000)
    assert F.global_norm(g) == pytest.approx(np.linalg.norm(g), rel=1e-12)
    assert F.clip_scale(10.0, 1.0) == pytest.approx(0.1, rel=1e-6)
    assert F.clip_scale(0.5, 1.0) == 1.0
    assert F.clip_scale(float("nan"), 1.0) == 1.0


# ------------------------------------------------------------------ float32 path
def test_float32_kernels_stay_close_to_float64(rng):
    """Training runs float32 with a polynomial exp: within a few ulps of float64."""
    qkv = rng.standard_normal((2, 20, 48))
    out64, p64 = F.attention_forward(qkv, 4)
    out32, p32 = F.attention_forward(qkv.astype(np.float32), 4)
    assert rel(out32, out64) < 1e-5 and rel(p32, p64) < 1e-5
    h, b = rng.standard_normal((64, 32)) * 3, rng.standard_normal(32)
    assert rel(F.bias_gelu_forward(h.astype(np.float32), b.astype(np.float32)),
               F.bias_gelu_forward(h, b)) < 1e-5
    z = rng.standard_normal((16, 30)) * 5
    t = rng.integers(0, 30, 16)
    m64, _ = F.crossentropy_loss(z, t)
    m32, _ = F.crossentropy_loss(z.astype(np.float32), t)
    assert m32 == pytest.approx(m64, rel=1e-5)


def test_mixed_dtypes_get_a_clear_error(rng):
    with pytest.raises(TypeError, match="mix dtypes"):
        F.layernorm_forward(rng.standard_normal((2, 4)).astype(np.float32),
                            np.ones(4), np.zeros(4))


# ------------------------------------------------------------------ lane reductions, builds
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 7, 15, 16, 17, 33, 100, 128])
def test_lane_reductions_equal_numpy_at_any_length(rng, n, dtype):
    from engine.trainer.kernels.cpu.lanes import row_dot, row_max, row_sum
    a, b = rng.standard_normal(n + 3).astype(dtype), rng.standard_normal(n + 3).astype(dtype)
    a[n:] = b[n:] = 1e6                                # past n: must not be read
    tol = (1e-5 if dtype == np.float32 else 1e-12) * n
    assert abs(row_sum(a, n) - a[:n].sum()) < tol
    assert abs(row_dot(a, b, n) - a[:n] @ b[:n]) < tol
    assert row_max(a, n) == a[:n].max()
    # a strided view (a column) goes element by element into the same lanes
    column = rng.standard_normal((n + 3, 3)).astype(dtype)[:, 1]
    packed = np.ascontiguousarray(column)
    assert row_sum(column, n) == row_sum(packed, n)
    assert row_dot(column, a, n) == row_dot(packed, a, n) == row_dot(a, packed, n)
    assert row_max(column, n) == row_max(packed, n) == packed[:n].max()


def test_lane_sum_order_is_the_written_one():
    # 1 followed by 2**-24 thirty-one times, in float32: left to right, every small
    # number rounds away against the 1; in lanes, lane k sums a[k] and a[k + 16],
    # then the sixteen partials are combined pairwise, and most of them survive.
    from engine.trainer.kernels.cpu.lanes import LANES, row_sum
    assert LANES == 16
    a = np.array([1.0] + [2.0 ** -24] * 31, np.float32)
    sequential = np.float32(0)
    for v in a:
        sequential = np.float32(sequential + v)
    p = a[:16] + a[16:]
    while p.size > 1:                                  # ((p0 + p1) + (p2 + p3)) + ...
        p = p[0::2] + p[1::2]
    assert sequential == np.float32(1.0) and p[0] > sequential
    assert row_sum(a, 32) == p[0]


def test_serial_and_parallel_builds_give_the_same_bits(rng):
    import numba
    from engine.numba_config import ParallelKernel
    assert isinstance(F.layernorm.layernorm_backward_kernel, ParallelKernel)
    x = rng.standard_normal((96, 40)).astype(np.float32)
    dout = rng.standard_normal((96, 40)).astype(np.float32)
    w, b = rng.standard_normal(40).astype(np.float32), rng.standard_normal(40).astype(np.float32)
    results = []
    for n in sorted({1, numba.config.NUMBA_NUM_THREADS}):
        numba.set_num_threads(n)
        try:
            out, mean, rstd = F.layernorm_forward(x, w, b)
            results.append((out, *F.layernorm_backward(dout, x, w, mean, rstd),
                            F.bias_grad(dout)))
        finally:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    assert all(np.array_equal(a, b) for a, b in zip(results[0], results[-1]))
