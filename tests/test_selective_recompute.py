"""Selective recompute on the tape: only attention's probabilities are rebuilt,
the gradients do not change, and engine.budget's prediction equals what
engine.memory measures (saved bytes and peak, exactly)."""
from __future__ import annotations

import numpy as np
import pytest

import engine.budget as bm
from engine.budget import lab
from engine import memory
from engine.gpt_config import GPTConfig, init_params
from engine.nn import GPT
from engine.recompute import selective_recompute

CFG = GPTConfig(vocab_size=11, block_size=24, n_layer=2, n_head=2, n_embd=8)


def _run(selective: bool, dtype=np.float64):
    rng = np.random.default_rng(0)
    ids, targets = rng.integers(0, 11, (2, 24)), rng.integers(0, 11, (2, 24))
    model = GPT(CFG, init_params(CFG, 0, dtype))
    with memory.record() as mem:
        with selective_recompute(model, selective):
            loss = model(ids, targets)
        loss.backward()
    grads = np.concatenate([g.ravel() for g in model.grads().values()])
    return float(loss.data), grads, mem, model


def end_of_forward(mem) -> int:
    """Live activation bytes when the backward starts."""
    first = next(i for i, p in enumerate(mem.timeline) if p.phase == "backward")
    return mem.timeline[first - 1].live_bytes


def test_selective_recompute_keeps_the_gradients_and_drops_the_probabilities():
    loss, grads, mem, model = _run(False)
    sel_loss, sel_grads, sel_mem, _ = _run(True)
    assert sel_loss == loss and np.array_equal(sel_grads, grads)
    att_bytes = CFG.n_layer * 2 * CFG.n_head * 24 * 24 * 8        # L * B H T T float64
    assert end_of_forward(mem) - end_of_forward(sel_mem) == att_bytes
    rebuilt = [s for s in sel_mem.saved if s.slot == "att"]
    assert len(rebuilt) == CFG.n_layer                             # once per block, backward
    assert all(not b.recompute_attention for b in model.blocks)    # switched back on exit


@pytest.mark.parametrize("L, d, H, V, b, n", [
    (2, 16, 2, 11, 2, 24),      # probabilities smaller than the head: peak at the forward's end
    (1, 8, 4, 5, 1, 64),        # probabilities dominate: the peak is in the backward
    (2, 8, 2, 7, 1, 100),
    (3, 12, 3, 13, 3, 9),
])
def test_measured_selective_recompute_equals_the_prediction(L, d, H, V, b, n):
    cfg = bm.BudgetConfig(n_layer=L, d_model=d, n_head=H, vocab_size=V, micro_batch=b,
                         seq_len=n, activation_model="engine", recompute="selective")
    m = lab.measure(cfg, seed=L + n)
    assert m["measured_saved"] == m["predicted_saved"]
    assert m["measured_peak"] == m["predicted_peak"]
    plain = bm.activations(cfg.with_(recompute="none"))
    assert plain.saved - m["measured_saved"] == 4 * L * b * H * n * n
    assert "attention cores recomputed" in m["shape"]


def test_selective_recompute_needs_blocks_with_the_switch():
    with pytest.raises(TypeError, match="recompute_attention"):
        with selective_recompute(object()):
            pass
