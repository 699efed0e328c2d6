"""numba kernels equal their numpy oracle (float64, 1e-12 relative), and the
embedding scatter-add is bitwise reproducible across runs and thread counts."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine
from engine import kernels
from engine.kernels import reference

fast = pytest.importorskip("engine.kernels.fast")
SETTINGS = settings(max_examples=8, deadline=None, derandomize=True)


def assert_same(got, want, what, scale=None):
    """Equal to 1e-12 of the largest value (or of `scale`, the size of the terms
    that were summed, where an output is a small difference of large terms)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, what
    scale = max(np.abs(want).max(initial=0.0), scale or 0.0, 1e-300)
    assert np.abs(got - want).max(initial=0.0) <= 1e-12 * scale, \
        f"{what}: max difference {np.abs(got - want).max():.3g} (scale {scale:.3g})"


def both(name, *args):
    return getattr(fast, name)(*args), getattr(reference, name)(*args)


def pairs(name, *args, scale=None):
    got, want = both(name, *args)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"{name} output {i}", scale)


rows = st.integers(1, 9)
cols = st.integers(1, 40)
seeds = st.integers(0, 2**31 - 1)


@SETTINGS
@given(N=rows, C=st.integers(2, 40), seed=seeds)
def test_layer_norm(N, C, seed):
    rng = np.random.default_rng(seed)
    x, w, b, g = (3 * rng.standard_normal((N, C)) + 1, rng.standard_normal(C),
                  rng.standard_normal(C), rng.standard_normal((N, C)))
    pairs("layer_norm_xhat_forward", x, w, b, 1e-5)
    _, xhat, rstd = reference.layer_norm_xhat_forward(x, w, b, 1e-5)
    # dx = rstd (g w - mean(g w) - xhat mean(g w xhat)) can cancel to almost 0
    pairs("layer_norm_xhat_backward", g, xhat, rstd, w, scale=np.abs(rstd[:, None] * g * w).max())


@SETTINGS
@given(N=rows, V=cols, seed=seeds)
def test_softmax_log_softmax_cross_entropy(N, V, seed):
    rng = np.random.default_rng(seed)
    x, g = 4 * rng.standard_normal((N, V)), rng.standard_normal((N, V))
    targets = rng.integers(0, V, N)
    pairs("softmax_forward", x)
    y = reference.softmax_forward(x)
    pairs("softmax_backward", g, y, scale=np.abs(y * g).max())
    pairs("log_softmax_forward", x)
    pairs("log_softmax_backward", g, reference.log_softmax_forward(x))
    pairs("cross_entropy_forward", x, targets)
    pairs("cross_entropy_backward", reference.softmax_forward(x), targets, 0.37)


def test_softmax_survives_huge_logits():
    x = np.array([[1000.0, 0.0, -1000.0], [-5e5, -5e5, -5e5]])
    pairs("softmax_forward", x)
    losses, _ = fast.cross_entropy_forward(x, np.array([2, 0]))
    assert np.all(np.isfinite(losses)) and np.isclose(losses[0], 2000.0)


@SETTINGS
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple), seed=seeds)
def test_gelu(shape, seed):
    rng = np.random.default_rng(seed)
    x, g = 2 * rng.standard_normal(shape), rng.standard_normal(shape)  # |x| < ~8
    pairs("gelu_forward", x)
    pairs("gelu_backward", g, x)


def test_gelu_far_tails_are_finite_and_right():
    x = np.array([-60.0, -30.0, 30.0, 60.0])
    y = fast.gelu_forward(x)
    assert np.all(np.isfinite(y)) and np.allclose(y, [0, 0, 30, 60], atol=1e-12)
    assert np.all(np.isfinite(fast.gelu_backward(np.ones(4), x)))


@SETTINGS
@given(BH=st.integers(1, 5), T=st.integers(1, 9), D=st.integers(1, 8), seed=seeds)
def test_causal_attention(BH, T, D, seed):
    rng = np.random.default_rng(seed)
    q, k, v, g = (rng.standard_normal((BH, T, D)) for _ in range(4))
    scale = 1.0 / np.sqrt(D)
    pairs("attention_probs_forward", q, k, v, scale)
    _, att = reference.attention_probs_forward(q, k, v, scale)
    assert np.all(np.triu(att[0], k=1) == 0)  # no position sees the future
    terms = np.abs(g).max() * max(np.abs(v).max(), 1.0) * max(np.abs(q).max(), np.abs(k).max())
    pairs("attention_probs_backward", g, q, k, v, att, scale, scale=terms)


@SETTINGS
@given(N=st.integers(1, 60), V=st.integers(1, 10), C=st.integers(1, 40), seed=seeds)
def test_embedding_scatter_add_equals_np_add_at_bit_for_bit(N, V, C, seed):
    rng = np.random.default_rng(seed)
    ids, g = rng.integers(0, V, N), rng.standard_normal((N, C))
    got, want = both("embedding_table_grad", ids, g, V)
    assert np.array_equal(got, want)


def test_embedding_backward_is_bitwise_identical_across_runs_and_thread_counts():
    import numba
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, 4096)
    ids[::3] = 7  # many repeats of one id: the case where unordered adds would differ
    for dtype in (np.float32, np.float64):
        g = rng.standard_normal((4096, 72)).astype(dtype) * 10.0 ** rng.integers(-6, 6, (4096, 1))
        results = []
        before = numba.get_num_threads()
        try:
            for threads in sorted({1, 2, numba.config.NUMBA_NUM_THREADS}):
                numba.set_num_threads(threads)
                for _ in range(2):
                    results.append(fast.embedding_table_grad(ids, g, 50))
        finally:
            numba.set_num_threads(before)
        results.append(reference.embedding_table_grad(ids, g, 50))
        for r in results[1:]:
            assert r.tobytes() == results[0].tobytes()


def test_the_embedding_op_gives_the_same_bits_through_the_tape_in_both_modes():
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 30, (8, 64))
    table = rng.standard_normal((30, 32)).astype(np.float32)
    grads = []
    for mode in ("numpy", "numba", "numba"):
        t = engine.Tensor(table, requires_grad=True)
        with kernels.use(mode):
            (engine.F.embedding(ids, t) * 1.5).sum().backward()
        grads.append(t.grad.tobytes())
    assert grads[0] == grads[1] == grads[2]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpt_gradients_agree_between_numba_and_numpy_kernels(dtype):
    from engine.gpt_config import GPTConfig, init_params
    cfg = GPTConfig(vocab_size=17, block_size=32, n_layer=2, n_head=4, n_embd=32)
    params = init_params(cfg, seed=3, dtype=dtype)
    ids = np.random.default_rng(0).integers(0, 17, (4, 32))
    grads = {}
    for mode in ("numpy", "numba"):
        model = engine.nn.GPT(cfg, params)
        with kernels.use(mode):
            model(ids[:, :-1], ids[:, 1:]).backward()
        grads[mode] = model.grads()
    tol = 1e-12 if dtype == np.float64 else 2e-4
    for name, g in grads["numpy"].items():
        scale = np.abs(g).max()
        assert np.abs(grads["numba"][name] - g).max() <= tol * scale, name


def test_kernel_mode_switch_is_validated_and_restored():
    with pytest.raises(ValueError, match="choose one of"):
        kernels.use("gpu")
    before = kernels.mode()
    with kernels.use("numba"):
        assert kernels.mode() == "numba"
    assert kernels.mode() == before
