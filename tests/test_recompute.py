"""engine.recompute: same gradients, lower measured peak, one recompute."""
from __future__ import annotations

import re

import numpy as np
import pytest

import engine
from engine import F, Tensor, memory, nn
from engine.recompute import (checkpoint, checkpoint_sequential, checkpointed, replay,
                               segment_size, segments)
from engine.gpt_config import GPTConfig, init_params


def rel_err(a, b) -> float:
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def small_gpt_data(n_layer=8, seed=0):
    cfg = GPTConfig(vocab_size=24, block_size=16, n_layer=n_layer, n_head=2, n_embd=16)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, cfg.vocab_size, (2, 16))
    targets = rng.integers(0, cfg.vocab_size, (2, 16))
    return cfg, init_params(cfg, seed=seed, dtype=np.float64), ids, targets


def gpt_step(cfg, params, ids, targets, policy):
    model = nn.GPT(cfg, params)
    with memory.record() as mem:
        with checkpointed(model, policy):
            loss = model(ids, targets)
        loss.backward()
    return loss.item(), model.grads(), mem


@pytest.fixture(scope="module")
def gpt8():
    cfg, params, ids, targets = small_gpt_data(n_layer=8)
    plain = gpt_step(cfg, params, ids, targets, "none")
    return cfg, params, ids, targets, plain


@pytest.mark.parametrize("policy", ["every", "sqrt", 3])
def test_checkpointed_gpt_gradients_equal_plain(gpt8, policy):
    cfg, params, ids, targets, (loss0, grads0, _) = gpt8
    loss, grads, _ = gpt_step(cfg, params, ids, targets, policy)
    assert loss == loss0
    for name in grads0:
        assert rel_err(grads[name], grads0[name]) <= 1e-12, name


def test_every_block_checkpointing_cuts_the_measured_peak_at_least_4x(gpt8):
    cfg, params, ids, targets, (_, _, plain) = gpt8
    _, _, every = gpt_step(cfg, params, ids, targets, "every")
    assert plain.peak_bytes >= 4 * every.peak_bytes, (plain.peak_bytes, every.peak_bytes)
    # the plain peak is what the engine's formula predicts
    assert plain.peak_bytes == nn.gpt_saved_bytes(cfg, 2, 16, np.float64)
    # the forward of the checkpointed model saved each block's input, nothing inside
    in_block = re.compile(r"h\d+\.")
    assert any(in_block.match(s.scope) for s in plain.saved)
    assert not [s for s in every.saved if in_block.match(s.scope)]
    assert any(s.scope.startswith("recompute h0/h0.") for s in every.saved)
    inputs = [s for s in every.saved if s.op == "checkpoint" and s.kind == "activation"]
    assert len(inputs) == cfg.n_layer and all(s.shape == (2, 16, 16) for s in inputs)


def test_measured_peak_equals_the_budget_model_with_full_recompute(gpt8):
    from engine import budget
    cfg, params, ids, targets, (_, _, plain) = gpt8
    _, _, every = gpt_step(cfg, init_params(cfg, seed=0), ids, targets, "every")  # fp32
    bc = budget.BudgetConfig(n_layer=cfg.n_layer, d_model=cfg.n_embd, n_head=cfg.n_head,
                             vocab_size=cfg.vocab_size, micro_batch=2, seq_len=16,
                             activation_model="engine", recompute="full")
    assert every.peak_bytes == budget.activations(bc).peak


def test_sqrt_policy_keeps_fewer_boundaries_but_recomputes_more_blocks_at_once(gpt8):
    cfg, params, ids, targets, (_, _, plain) = gpt8
    peaks = {p: gpt_step(cfg, params, ids, targets, p)[2].peak_bytes for p in ("every", "sqrt")}
    # a GPT block's insides are much larger than its input, so holding one
    # block's insides (every) beats holding sqrt(L) of them (sqrt)
    assert peaks["every"] < peaks["sqrt"] < plain.peak_bytes


def test_recompute_runs_the_segment_forward_exactly_once_more():
    calls = []
    w = Tensor(np.linspace(-1, 1, 12).reshape(3, 4), requires_grad=True)

    def segment(x):
        calls.append(engine.tensor.is_grad_enabled())
        return F.tanh(x @ w).sum(axis=1)

    x = Tensor(np.arange(6.0).reshape(2, 3) / 5, requires_grad=True)
    y = checkpoint(segment, x)
    assert calls == [False]            # the first forward records nothing
    (y * y).sum().backward()
    assert calls == [False, True]      # backward replayed it with recording on
    gx, gw = x.grad.copy(), w.grad.copy()
    x.zero_grad(), w.zero_grad()
    (segment(x) ** 2).sum().backward()
    assert rel_err(gx, x.grad) <= 1e-12 and rel_err(gw, w.grad) <= 1e-12


def test_timeline_shows_the_recompute_inside_backward(gpt8):
    cfg, params, ids, targets, _ = gpt8
    _, _, mem = gpt_step(cfg, params, ids, targets, "every")
    phases = [(p.phase, p.label) for p in mem.timeline]
    first_recompute = next(i for i, (ph, lab) in enumerate(phases) if "recompute" in lab)
    first_backward = next(i for i, (ph, _) in enumerate(phases) if ph == "backward")
    assert first_recompute > first_backward
    assert phases[first_recompute][0] == "forward"  # recorded forward ops, during backward


def test_dropout_with_a_seed_recomputes_the_same_mask():
    rng = np.random.default_rng(4)
    w = Tensor(rng.normal(size=(5, 5)), requires_grad=True)

    def segment(x):
        return F.dropout(F.relu(x @ w), 0.5, seed=7)

    x0 = rng.normal(size=(3, 5))
    x = Tensor(x0, requires_grad=True)
    checkpoint(segment, x).sum().backward()
    gx, gw = x.grad.copy(), w.grad.copy()
    x2 = Tensor(x0, requires_grad=True)
    w.zero_grad()
    segment(x2).sum().backward()
    assert np.array_equal(gx, x2.grad) and np.array_equal(gw, w.grad)


def test_in_place_change_of_a_checkpointed_input_is_caught():
    w = Tensor(np.ones((2, 2)), requires_grad=True)
    h = Tensor(np.ones((2, 2)), requires_grad=True) * 1.0   # a non-leaf we may change
    y = checkpoint(lambda t: t @ w, h)
    with engine.no_grad():
        h += 1.0
    with pytest.raises(RuntimeError, match="modified in place"):
        y.sum().backward()


def test_constant_inputs_pass_through():
    table = Tensor(np.arange(12.0).reshape(4, 3), requires_grad=True)
    ids = np.array([[0, 2], [3, 3]])
    y = checkpoint(lambda t, i: F.embedding(i, t) * 2.0, table, ids)
    y.sum().backward()
    want = np.zeros((4, 3))
    np.add.at(want, ids.ravel(), 2.0)
    assert np.array_equal(table.grad, want)


def test_checkpoint_sequential_matches_running_the_blocks():
    rng = np.random.default_rng(5)
    layers = [nn.Linear(6, 6, seed=i) for i in range(5)]
    x0 = rng.normal(size=(4, 6))
    results = {}
    for policy in ("none", "every", 2, "sqrt"):
        for layer in layers:
            layer.zero_grad()
        x = Tensor(x0, requires_grad=True)
        out = checkpoint_sequential([lambda t, f=layer: F.tanh(f(t)) for layer in layers],
                                    x, policy)
        (out ** 2).sum().backward()
        results[policy] = [x.grad] + [layer.weight.grad.copy() for layer in layers]
    for policy in ("every", 2, "sqrt"):
        for got, want in zip(results[policy], results["none"]):
            assert rel_err(got, want) <= 1e-12


def test_segments_train_even_when_their_input_needs_no_gradient():
    cfg, params, _, _ = small_gpt_data(n_layer=3)
    model = nn.GPT(cfg, params)
    x0 = np.random.default_rng(6).normal(size=(2, 16, 16))   # data: needs no gradient
    grads = {}
    for policy in ("none", "every", 2):
        model.zero_grad()
        # the plain reference lets x0 require grad (the parameters' gradients
        # do not depend on that); the checkpointed runs get plain data
        x = Tensor(x0, requires_grad=policy == "none")
        out = checkpoint_sequential(model.blocks, x, policy)
        (out * out).mean().backward()
        grads[policy] = {k: p.grad for k, p in model.parameters().items()
                         if k.startswith("h")}
    assert all(g is not None for g in grads["every"].values())
    for policy in ("every", 2):
        for name, g in grads["none"].items():
            assert rel_err(grads[policy][name], g) <= 1e-12, (policy, name)


def test_a_replay_of_your_own_plugs_in(gpt8):
    cfg, params, ids, targets, (_, grads0, _) = gpt8
    calls = []

    def my_replay(fn, saved_input, grad_output):
        calls.append(saved_input.shape)
        return replay(fn, saved_input, grad_output)

    model = nn.GPT(cfg, params)
    with checkpointed(model, "every", replay_fn=my_replay):
        loss = model(ids, targets)
    loss.backward()
    assert len(calls) == cfg.n_layer
    for name, g in model.grads().items():
        assert rel_err(g, grads0[name]) <= 1e-12, name
    with pytest.raises(ValueError, match="one-input"):
        checkpoint(lambda a, b: a + b, Tensor(np.ones(2)), Tensor(np.ones(2)), replay_fn=replay)


def test_policies():
    assert segment_size(16, "every") == 1 and segment_size(16, "sqrt") == 4
    assert segment_size(8, "sqrt") == 3 and segment_size(8, 4) == 4
    assert segment_size(8, "none") == 0 and segments(8, "none") == []
    assert segments(8, 3) == [range(0, 3), range(3, 6), range(6, 8)]
    for bad in ("often", 0, -2, 1.5, True):
        with pytest.raises(ValueError, match="checkpoint policy"):
            segment_size(8, bad)


def test_checkpointed_restores_the_blocks_even_after_an_error():
    cfg, params, ids, targets = small_gpt_data(n_layer=2)
    model = nn.GPT(cfg, params)
    blocks = model.blocks
    with pytest.raises(ValueError):
        with checkpointed(model, "every"):
            assert model.blocks is not blocks
            model(np.zeros((1, cfg.block_size + 1), dtype=int))
    assert model.blocks is blocks
    with pytest.raises(TypeError, match="no `blocks`"):
        with checkpointed(object()):
            pass


def test_a_segment_must_return_one_tensor():
    x = Tensor(np.ones(3), requires_grad=True)
    with pytest.raises(TypeError, match="one Tensor"):
        checkpoint(lambda t: (t, t), x)
    with pytest.raises(TypeError, match="function"):
        checkpoint(x, x)
