"""The fused GPT: gradients equal the reference tape engine's, checkpointing and
thread replicas change nothing but the bits they must, a step allocates no
arrays, and the kernel registry swaps in other code and says whose it is."""
from __future__ import annotations

import time

import numpy as np
import pytest

from engine.trainer import model as G
from engine.gpt_config import GPTConfig, init_params
from engine.trainer.parallel import ThreadReplicas

from .reference import step_allocation_bytes

CFG = GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8)


def batch(seed, B=4, cfg=CFG):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, cfg.vocab_size, (B, cfg.block_size)),
            rng.integers(0, cfg.vocab_size, (B, cfg.block_size)))


def grads_of(model, x, y, **kw):
    model.zero_grad()
    loss = model.forward(x, y, **kw)
    model.backward()
    return loss, {k: v.copy() for k, v in model.named_grads().items()}


def test_one_step_gradients_equal_the_reference_engine():
    nn = pytest.importorskip("engine.nn", reason="engine.nn (the reference GPT) is missing")
    params = init_params(CFG, seed=3, dtype=np.float64)
    x, y = batch(0)
    loss, grads = grads_of(G.FusedGPT(CFG, 4, params=params, dtype=np.float64), x, y)
    ref = nn.GPT(CFG, params)
    ref_loss = ref(x, y)
    ref_loss.backward()
    assert loss == pytest.approx(float(ref_loss.data), rel=1e-12)
    for name, g in grads.items():
        want = ref.params[name].grad
        err = np.abs(g - want).max() / np.abs(want).max()
        assert err < 1e-10, f"{name}: relative difference {err:.2e}"


def test_logits_without_targets_and_loss_agree():
    params = init_params(CFG, seed=1, dtype=np.float64)
    m = G.FusedGPT(CFG, 4, params=params, dtype=np.float64)
    x, y = batch(1)
    logits = m.forward(x).copy()
    z = logits.reshape(-1, CFG.vocab_size)
    z = z - z.max(1, keepdims=True)
    want = np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(z.shape[0]), y.reshape(-1)])
    assert m.loss(x, y) == pytest.approx(want, rel=1e-12)
    with pytest.raises(RuntimeError, match="call forward\\(ids, targets\\) first"):
        m.backward()


def test_checkpointing_recomputes_the_same_bits():
    params = init_params(CFG, seed=2)
    x, y = batch(2)
    plain = grads_of(G.FusedGPT(CFG, 4, params=params), x, y)
    ckpt_model = G.FusedGPT(CFG, 4, params=params, checkpointing=True)
    ckpt = grads_of(ckpt_model, x, y)
    assert plain[0] == ckpt[0]
    assert all(np.array_equal(plain[1][k], ckpt[1][k]) for k in plain[1])
    full = G.FusedGPT(CFG, 4, params=params)
    assert ckpt_model.acts.saved_nbytes() < full.acts.saved_nbytes()


def test_loss_scale_scales_the_gradient_and_accumulation_adds():
    params = init_params(CFG, seed=4, dtype=np.float64)
    m = G.FusedGPT(CFG, 4, params=params, dtype=np.float64)
    x, y = batch(4)
    _, once = grads_of(m, x, y)
    m.zero_grad()
    for _ in range(2):                       # two micro-batches of loss / 2 = one of loss
        m.forward(x, y, loss_scale=0.5)
        m.backward()
    for k, g in m.named_grads().items():
        np.testing.assert_allclose(g, once[k], rtol=1e-12, atol=1e-15)


def test_thread_replicas_equal_one_model_with_the_whole_batch():
    params = init_params(CFG, seed=5, dtype=np.float64)
    x, y = batch(5)
    loss, want = grads_of(G.FusedGPT(CFG, 4, params=params, dtype=np.float64), x, y)
    reps = ThreadReplicas(CFG, 4, 2, params=params, dtype=np.float64)
    try:
        reps.zero_grad()
        rep_loss, _, _ = reps.forward_backward(x, y)
        assert rep_loss == pytest.approx(loss, rel=1e-13)
        for k, g in reps.grads.views.items():
            np.testing.assert_allclose(g, want[k], rtol=1e-11, atol=1e-14)
        assert reps.loss(x, y) == pytest.approx(loss, rel=1e-13)
    finally:
        reps.close()


def _sum_in_replica_order(reps):
    """The replicas' gradients added one after the other, as one thread would."""
    total = reps.replicas[0].grads.flat.copy()
    for m in reps.replicas[1:]:
        total += m.grads.flat
    return total


def test_replica_gradients_summed_during_the_backward_equal_a_sum_afterwards():
    x, y = batch(6)
    reps = ThreadReplicas(CFG, 4, 2, params=init_params(CFG, seed=6, dtype=np.float32))
    try:
        reps.zero_grad()
        reps.forward_backward(x, y, last=False)      # no sum during the backward...
        after = _sum_in_replica_order(reps)           # ...one serial sum afterwards
        reps.zero_grad()
        reps.forward_backward(x, y)                   # bucket by bucket, during it
        assert np.array_equal(reps.grads.flat, after), "the same bits, whoever sums"
        assert np.any(after != 0)
    finally:
        reps.close()


def test_a_bucket_is_cut_into_up_to_one_piece_per_replica():
    from engine.trainer.parallel import sum_pieces
    cut = sum_pieces([(0, 100), (100, 103), (103, 160)], 4, min_piece=10)
    assert cut == [[(0, 25), (25, 50), (50, 75), (75, 100)], [(100, 103)],
                   [(103, 117), (117, 131), (131, 145), (145, 160)]]
    assert sum_pieces([(0, 30)], 8, min_piece=10) == [[(0, 10), (10, 20), (20, 30)]]
    assert sum_pieces([(0, 30)], 1, min_piece=1) == [[(0, 30)]]


def test_pieces_summed_by_any_threads_give_the_bits_of_one_serial_sum(monkeypatch):
    """Four replicas, buckets cut into small pieces that the idle replicas share:
    every element is still added in replica order."""
    from engine.trainer import parallel
    monkeypatch.setattr(parallel, "MIN_PIECE", 16)
    x, y = batch(7)
    reps = ThreadReplicas(CFG, 4, 4, params=init_params(CFG, seed=7, dtype=np.float32))
    try:
        assert max(len(p) for p in reps.pieces) == 4
        reps.zero_grad()
        reps.forward_backward(x, y, last=False)
        serial = _sum_in_replica_order(reps)
        for _ in range(3):
            reps.zero_grad()
            reps.forward_backward(x, y)
            assert np.array_equal(reps.grads.flat, serial)
        assert np.any(serial != 0)
    finally:
        reps.close()


def test_the_last_sum_leaves_every_replica_zero_and_zero_grad_zeroes_the_rest():
    """The sum of a last micro-batch clears each replica's gradient bucket by bucket,
    so the next zero_grad has nothing to do; after a micro-batch that is not the
    last, zero_grad still zeroes them, and accumulation still adds up."""
    x, y = batch(8)
    reps = ThreadReplicas(CFG, 4, 2, params=init_params(CFG, seed=8, dtype=np.float32))
    replicas_zero = lambda: all(not np.any(m.grads.flat) for m in reps.replicas)  # noqa: E731
    try:
        reps.zero_grad()
        reps.forward_backward(x, y, last=False)       # accumulating: nothing summed yet
        assert not replicas_zero()
        reps.zero_grad()
        assert replicas_zero()
        reps.forward_backward(x, y)
        once = reps.grads.flat.copy()
        assert np.any(once != 0) and replicas_zero()
        reps.zero_grad()
        reps.forward_backward(x, y, last=False)       # two micro-batches: twice the sum
        reps.forward_backward(x, y)
        np.testing.assert_allclose(reps.grads.flat, 2 * once, rtol=1e-5, atol=1e-9)
        assert replicas_zero()
    finally:
        reps.close()


def test_a_replica_that_fails_does_not_leave_the_others_waiting():
    x, y = batch(7)
    reps = ThreadReplicas(CFG, 4, 2)
    broken = reps.replicas[1]

    def fail(*args, **kwargs):
        raise RuntimeError("replica 1 broke")
    broken.forward_backward = fail
    try:
        with pytest.raises(RuntimeError, match="replica 1 broke"):
            reps.forward_backward(x, y)               # returns instead of waiting forever
    finally:
        reps.close()


def _slow_before_the_embeddings(replica, seconds):
    """Make replica run behind at the end of its backward (it sleeps before the
    embeddings' backward), so the other sums most buckets alone."""
    own = replica._k

    def k(name, *args, **kwargs):
        if name == "embedding_backward":
            time.sleep(seconds)
        return own(name, *args, **kwargs)
    replica._k = k


@pytest.mark.parametrize("slow", [0, 1])
def test_the_sum_has_the_same_bits_whichever_replica_runs_behind(slow):
    x, y = batch(8)
    reps = ThreadReplicas(CFG, 4, 2, params=init_params(CFG, seed=8, dtype=np.float32))
    try:
        reps.zero_grad()
        reps.forward_backward(x, y)
        on_time = reps.grads.flat.copy()
        _slow_before_the_embeddings(reps.replicas[slow], 0.3)
        reps.zero_grad()
        reps.forward_backward(x, y)
        assert np.array_equal(reps.grads.flat, on_time), "the same bits, whoever summed"
    finally:
        reps.close()


def test_a_training_step_allocates_no_arrays():
    """After the first step, forward + backward create no numpy arrays: every
    buffer was laid out when the model was built (numpy reports its data
    allocations to tracemalloc)."""
    cfg = GPTConfig(vocab_size=30, block_size=32, n_layer=2, n_head=4, n_embd=32)
    m = G.FusedGPT(cfg, 8)
    x, y = batch(6, 8, cfg)
    peak = step_allocation_bytes(m, x, y)
    activations = m.acts.saved_nbytes()
    assert peak < 64 * 1024, f"a step allocated {peak} bytes (activations: {activations})"


def test_a_plugged_pure_kernel_runs_and_is_reported():
    def my_bias_gelu(h, bias):               # a learner's pure numpy version
        u = h + bias
        return 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3)))

    params = init_params(CFG, seed=7, dtype=np.float64)
    x, y = batch(7)
    want = grads_of(G.FusedGPT(CFG, 4, params=params, dtype=np.float64), x, y)
    G.use_kernel("bias_gelu_forward", my_bias_gelu, owner="learner")
    try:
        assert G.kernel_owners()["bias_gelu_forward"] == "learner"
        got = grads_of(G.FusedGPT(CFG, 4, params=params, dtype=np.float64), x, y)
    finally:
        G.reset_kernels()
    assert G.kernel_owners()["bias_gelu_forward"] == "engine"
    assert got[0] == pytest.approx(want[0], rel=1e-12)
    for k in want[1]:
        np.testing.assert_allclose(got[1][k], want[1][k], rtol=1e-9, atol=1e-13)
    with pytest.raises(KeyError, match="no kernel named 'gelu'"):
        G.use_kernel("gelu", my_bias_gelu)


@pytest.mark.parametrize("replaced", ["bias_gelu_backward", "bias_gelu_forward",
                                      "both"])
def test_gelus_output_comes_back_for_the_weight_gradient_whoever_owns_the_kernels(replaced):
    """The model keeps no GELU output: the engine's backward writes it again,
    and when either GELU kernel is a replacement the registered forward runs
    again instead. The gradients are the same either way, and the learner's
    kernels are the ones that ran."""
    calls = []

    def my_forward(h, bias):
        calls.append("forward")
        u = h + bias
        return 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3)))

    def my_backward(dout, h, bias):
        calls.append("backward")
        u = h + bias
        t = np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3))
        slope = 0.5 * (1 + t) + 0.5 * u * (1 - t * t) * np.sqrt(2 / np.pi) * (
            1 + 3 * 0.044715 * u * u)
        dh = dout * slope
        return dh, dh.sum(axis=0)

    params = init_params(CFG, seed=3, dtype=np.float64)
    x, y = batch(5)
    model = G.FusedGPT(CFG, 4, params=params, dtype=np.float64)
    assert not hasattr(model.acts.layer(0), "gelu")            # not kept per block
    want = grads_of(model, x, y)
    if replaced in ("bias_gelu_backward", "both"):
        G.use_kernel("bias_gelu_backward", my_backward, owner="learner")
    if replaced in ("bias_gelu_forward", "both"):
        G.use_kernel("bias_gelu_forward", my_forward, owner="learner")
    try:
        got = grads_of(G.FusedGPT(CFG, 4, params=params, dtype=np.float64), x, y)
    finally:
        G.reset_kernels()
    # a replaced forward runs twice a block: in the forward, and again in the backward
    assert calls.count("forward") == (0 if replaced == "bias_gelu_backward" else 2 * CFG.n_layer)
    assert calls.count("backward") == (0 if replaced == "bias_gelu_forward" else CFG.n_layer)
    assert got[0] == pytest.approx(want[0], rel=1e-12)
    for k in want[1]:
        np.testing.assert_allclose(got[1][k], want[1][k], rtol=1e-9, atol=1e-13)


def test_wrong_batch_shape_is_named():
    m = G.FusedGPT(CFG, 4)
    with pytest.raises(ValueError, match=r"laid out for \(B, T\) = \(4, 8\)"):
        m.forward(np.zeros((2, 8), np.int64))


def test_learner_style_crossentropy_and_scatter_add_plug_in():
    """Lesson 10's loss piece (fn(logits, targets) -> mean, gradient in place) and
    lesson 11's scatter-add (fn(ids, dx, V) -> table gradient) run the model."""
    def my_crossentropy(logits, targets):
        z = logits - logits.max(1, keepdims=True)
        p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
        n = len(targets)
        mean = float(-np.log(p[np.arange(n), targets]).mean())
        p[np.arange(n), targets] -= 1
        logits[...] = p / n
        return mean

    def my_scatter_add(ids, dx, vocab_size):
        out = np.zeros((vocab_size, dx.shape[1]), dx.dtype)
        np.add.at(out, ids, dx)
        return out

    params = init_params(CFG, seed=8, dtype=np.float64)
    x, y = batch(8)
    want = grads_of(G.FusedGPT(CFG, 4, params=params, dtype=np.float64), x, y, loss_scale=0.5)
    G.use_kernel("crossentropy_softmax", my_crossentropy, owner="you (10.2)")
    G.use_kernel("embedding_backward", my_scatter_add, owner="you (11.1)")
    try:
        got = grads_of(G.FusedGPT(CFG, 4, params=params, dtype=np.float64), x, y, loss_scale=0.5)
        owners = G.kernel_owners()
    finally:
        G.reset_kernels()
    assert owners["crossentropy_softmax"] == "you (10.2)"
    assert owners["embedding_backward"] == "you (11.1)"
    assert got[0] == pytest.approx(want[0], rel=1e-12)
    for k in want[1]:
        np.testing.assert_allclose(got[1][k], want[1][k], rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize("replicas", [1, 2])
def test_replicas_run_their_kernels_on_one_thread_and_a_single_model_on_all(replicas):
    """The thread plan reaches the kernels: each of several replicas sees one numba
    thread (so it takes the one-thread builds), a single model the caller's threads;
    between replicas (the optimizer) the caller keeps its own count."""
    import numba
    from engine.trainer.kernels import bias_grad
    from engine.trainer.kernels.threads import restore_threads, set_threads
    info = set_threads(2, blas=1)
    if numba.get_num_threads() < 2:
        restore_threads(info)
        pytest.skip("numba has one thread here (NUMBA_NUM_THREADS=1)")
    seen = []

    def watching_bias_grad(dout, *, dbias):
        seen.append(numba.get_num_threads())
        return bias_grad(dout, dbias=dbias)

    G.use_kernel("bias_grad", watching_bias_grad, owner="test", pure=False)
    try:
        x = np.random.default_rng(0).integers(0, 13, (4, 8))
        reps = ThreadReplicas(CFG, 4, replicas, params=init_params(CFG, 0))
        reps.forward_backward(x, x)
        reps.close()
        assert seen and set(seen) == ({1} if replicas > 1 else {2})
        assert numba.get_num_threads() == 2
    finally:
        G.reset_kernels("bias_grad")
        restore_threads(info)
