"""engine.accumulation: K micro-batches with loss/K give the full-batch gradient."""
from __future__ import annotations

import numpy as np
import pytest

from engine import Tensor, memory, nn
from engine.accumulation import accumulate_gradients, grad_norm, split_batch
from engine.gpt_config import GPTConfig, init_params

B, T = 8, 12


@pytest.fixture(scope="module")
def setup():
    cfg = GPTConfig(vocab_size=20, block_size=T, n_layer=2, n_head=2, n_embd=16)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, (B, T))
    targets = rng.integers(0, cfg.vocab_size, (B, T))
    model = nn.GPT(cfg, init_params(cfg, seed=1, dtype=np.float64))
    params = model.parameters()
    loss = accumulate_gradients(params, lambda b: model(*b), [(ids, targets)])
    full = {k: p.grad.copy() for k, p in params.items()}
    return cfg, model, ids, targets, loss, full


def rel_err(a, b) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("K", [2, 4, 8])
def test_accumulated_gradient_equals_full_batch_gradient(setup, K):
    cfg, model, ids, targets, full_loss, full = setup
    loss = accumulate_gradients(model.parameters(), lambda b: model(*b),
                                split_batch(ids, targets, K))
    assert loss == pytest.approx(full_loss, rel=1e-13)
    for name, p in model.parameters().items():
        assert rel_err(p.grad, full[name]) <= 1e-12, name


@pytest.mark.parametrize("K", [2, 4])
def test_missing_division_by_k_gives_k_times_the_gradient(setup, K):
    cfg, model, ids, targets, _, full = setup
    params = model.parameters()
    accumulate_gradients(params, lambda b: model(*b), split_batch(ids, targets, K),
                         divide_by_k=False)
    full_norm = float(np.sqrt(sum(np.sum(g ** 2) for g in full.values())))
    assert grad_norm(params) / full_norm == pytest.approx(K, rel=1e-12)
    for name, p in params.items():
        assert rel_err(p.grad, K * full[name]) <= 1e-12, name


def test_accumulation_starts_from_zero_gradients(setup):
    cfg, model, ids, targets, _, full = setup
    params = model.parameters()
    for _ in range(2):   # a second call must not add onto the first one's gradients
        accumulate_gradients(params, lambda b: model(*b), split_batch(ids, targets, 4))
    for name, p in params.items():
        assert rel_err(p.grad, full[name]) <= 1e-12, name


def test_activation_peak_follows_the_micro_batch(setup):
    cfg, model, ids, targets, _, _ = setup
    peaks = {}
    for K in (1, 2, 4, 8):
        with memory.record() as mem:
            accumulate_gradients(model.parameters(), lambda b: model(*b),
                                 split_batch(ids, targets, K))
        peaks[K] = mem.peak_bytes
        # the tape never holds more than one micro-batch of b = B/K sequences
        assert peaks[K] == nn.gpt_saved_bytes(cfg, B // K, T, np.float64)
    assert peaks[1] == 2 * peaks[2] == 4 * peaks[4] == 8 * peaks[8]


def test_split_batch_checks_sizes():
    ids = np.arange(12).reshape(6, 2)
    parts = split_batch(ids, ids + 1, 3)
    assert [p[0].shape for p in parts] == [(2, 2)] * 3
    assert np.array_equal(np.concatenate([p[1] for p in parts]), ids + 1)
    with pytest.raises(ValueError, match=r"choose K among \[1, 2, 3, 6\]"):
        split_batch(ids, ids, 4)
    with pytest.raises(ValueError, match="targets have 5"):
        split_batch(ids, ids[:5], 2)


def test_loss_must_be_a_scalar_tensor():
    w = Tensor(np.ones(3), requires_grad=True)
    with pytest.raises(TypeError, match="scalar Tensor"):
        accumulate_gradients({"w": w}, lambda b: w * b, [2.0])
    with pytest.raises(ValueError, match="no micro-batches"):
        accumulate_gradients({"w": w}, lambda b: (w * b).sum(), [])
