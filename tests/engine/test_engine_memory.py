"""engine.memory measures the tape; the closed forms of engine/nn.py's docstring
must equal the measurement exactly, for several shapes and both float dtypes."""
from __future__ import annotations

import json

import numpy as np
import pytest

import engine
from engine import F, Tensor
from engine.gpt_config import GPTConfig, init_params
from engine.nn import GPT, MLP, Block, block_saved_bytes, gpt_saved_bytes


@pytest.mark.parametrize("activation", ["relu", "tanh", "gelu"])
@pytest.mark.parametrize("B, n_in, n_hidden, n_out, dtype", [
    (1, 1, 1, 1, np.float64), (4, 3, 7, 2, np.float64), (32, 16, 64, 10, np.float32),
    (5, 8, 3, 8, np.float32)])
def test_mlp_saved_bytes_equal_the_closed_form(B, n_in, n_hidden, n_out, dtype, activation):
    mlp = MLP(n_in, n_hidden, n_out, activation=activation, dtype=dtype)
    x = np.random.default_rng(0).standard_normal((B, n_in)).astype(dtype)
    with engine.memory.record() as mem:
        out = mlp(x).sum()     # sum saves nothing, so the loss adds no bytes
        out.backward()
    expected = MLP.saved_bytes(B, n_in, n_hidden, activation, dtype)
    assert mem.saved_bytes == expected == mem.peak_bytes
    assert mem.timeline[-1].live_bytes == 0


def test_relu_and_the_next_matmul_share_one_buffer():
    with engine.memory.record() as mem:
        MLP(4, 6, 2)(np.ones((3, 4)))
    relu_out = [s for s in mem.saved if s.op == "relu"][0]
    fc2_in = [s for s in mem.saved if s.scope == "fc2" and s.kind == "activation"][0]
    assert relu_out.counted_bytes == 3 * 6 * 8 and fc2_in.counted_bytes == 0
    assert [s.kind for s in mem.saved if s.scope == "fc2"].count("parameter") == 1


def block_input(B, T, C, dtype):
    return Tensor(np.random.default_rng(1).standard_normal((B, T, C)), requires_grad=True,
                  dtype=dtype)


@pytest.mark.parametrize("B, T, C, H, dtype", [
    (1, 1, 4, 1, np.float64), (2, 5, 8, 2, np.float64), (3, 8, 16, 4, np.float32),
    (2, 16, 12, 3, np.float32), (4, 7, 32, 8, np.float32)])
def test_one_gpt_block_saves_exactly_the_documented_tensors(B, T, C, H, dtype):
    cfg = GPTConfig(vocab_size=5, block_size=max(T, 1), n_layer=1, n_head=H, n_embd=C)
    params = {k: Tensor(v, requires_grad=True, name=k)
              for k, v in init_params(cfg, seed=0, dtype=dtype).items()}
    x = block_input(B, T, C, dtype)
    with engine.memory.record() as mem:
        y = Block(cfg, params, 0)(x)
        y.sum().backward()
    assert mem.saved_bytes == block_saved_bytes(B, T, C, H, dtype)
    activations = [s for s in mem.saved if s.kind == "activation"]
    assert len(activations) == 13                                   # entries
    assert sum(1 for s in activations if s.counted_bytes) == 11     # buffers
    att = [s for s in activations if s.slot == "att"][0]
    assert att.shape == (B, H, T, T)
    assert mem.timeline[-1].live_bytes == 0


@pytest.mark.parametrize("with_targets", [True, False])
@pytest.mark.parametrize("V, T, L, H, C, B, dtype", [
    (11, 8, 2, 2, 16, 3, np.float64), (7, 4, 1, 1, 8, 1, np.float32),
    (29, 16, 3, 4, 32, 2, np.float32)])
def test_the_whole_gpt_matches_gpt_saved_bytes(V, T, L, H, C, B, dtype, with_targets):
    cfg = GPTConfig(vocab_size=V, block_size=T, n_layer=L, n_head=H, n_embd=C)
    model = GPT(cfg, init_params(cfg, seed=0, dtype=dtype))
    rng = np.random.default_rng(0)
    ids, targets = rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))
    with engine.memory.record() as mem:
        model(ids, targets if with_targets else None)
    assert mem.saved_bytes == gpt_saved_bytes(cfg, B, T, dtype, with_targets)
    assert mem.peak_bytes == mem.saved_bytes
    # ids and targets given as views of one array cost no more than separate arrays
    batch = rng.integers(0, V, (B, T + 1))
    with engine.memory.record() as mem2:
        model(batch[:, :-1], batch[:, 1:] if with_targets else None)
    assert mem2.saved_bytes == mem.saved_bytes


def test_timeline_rises_through_the_forward_and_falls_to_zero_in_the_backward():
    cfg = GPTConfig(vocab_size=9, block_size=6, n_layer=2, n_head=2, n_embd=8)
    model = GPT(cfg, init_params(cfg))
    ids = np.random.default_rng(0).integers(0, 9, (2, 6))
    with engine.memory.record() as mem:
        loss = model(ids, ids)
        loss.backward()
    fwd = [p.live_bytes for p in mem.timeline if p.phase == "forward"]
    bwd = [p.live_bytes for p in mem.timeline if p.phase == "backward"]
    assert fwd == sorted(fwd) and bwd == sorted(bwd, reverse=True)
    assert fwd[-1] == mem.peak_bytes == mem.saved_bytes and bwd[-1] == 0
    assert len(bwd) == len(fwd)  # every recorded node ran its VJP once
    # the first block's attention buffer is freed only after its VJP ran
    labels = [p.label for p in mem.timeline if p.phase == "backward"]
    assert labels.index("h0.attn/causal_attention") > labels.index("h1.attn/causal_attention")


def test_retain_graph_keeps_the_saved_bytes_alive():
    w = Tensor(np.ones((4, 4)), requires_grad=True)
    with engine.memory.record() as mem:
        loss = F.tanh(Tensor(np.ones((8, 4))) @ w).sum()
        loss.backward(retain_graph=True)
    assert mem.timeline[-1].live_bytes == mem.peak_bytes == (8 * 4 + 8 * 4) * 8


def test_report_table_and_dict():
    with engine.memory.record() as mem:
        MLP(3, 5, 2)(np.ones((2, 3)))
    table = mem.table()
    assert "fc1/matmul" in table and "relu" in table and "not counted" in table
    assert f"activation bytes saved: {mem.saved_bytes:,}" in table
    data = json.loads(json.dumps(mem.to_dict()))
    assert data["saved_bytes"] == mem.saved_bytes == (2 * 3 + 2 * 5) * 8
    assert {"op", "slot", "shape", "dtype", "nbytes", "kind"} <= set(data["saved"][0])


def test_nothing_is_recorded_outside_the_context_or_under_no_grad():
    w = Tensor(np.ones(3), requires_grad=True)
    with engine.memory.record() as mem:
        with engine.no_grad():
            F.exp(w)
    assert mem.saved == [] and mem.saved_bytes == 0
    F.exp(w)
    assert mem.saved == []


def test_layer_norm_without_weight_saves_only_xhat_and_rstd():
    x = Tensor(np.ones((4, 6)) + np.arange(6.0), requires_grad=True)
    with engine.memory.record() as mem:
        F.layer_norm(x, None, None)
    assert [s.slot for s in mem.saved] == ["xhat", "rstd"]
    assert mem.saved_bytes == (4 * 6 + 4) * 8
