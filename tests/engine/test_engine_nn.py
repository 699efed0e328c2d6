"""engine.nn: the layers and the reference GPT."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import F, Tensor
from engine.gpt_config import GPTConfig, init_params, param_shapes
from engine.nn import GPT, MLP, LayerNorm, Linear

CFG = GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=16)


def test_gpt_outputs_logits_or_the_loss():
    model = GPT(CFG, init_params(CFG, seed=0))
    rng = np.random.default_rng(0)
    ids, targets = rng.integers(0, 13, (3, 8)), rng.integers(0, 13, (3, 8))
    logits = model(ids)
    assert logits.shape == (3, 8, 13) and logits.dtype == np.float32
    loss = model(ids, targets)
    assert loss.shape == () and abs(loss.item() - np.log(13)) < 0.05  # small init: ~uniform
    assert set(model.params) == set(param_shapes(CFG))
    assert all(p.requires_grad and p.name == n for n, p in model.params.items())


def test_gpt_loss_equals_cross_entropy_of_its_logits_and_every_param_gets_a_gradient():
    model = GPT(CFG, init_params(CFG, seed=0, dtype=np.float64))
    rng = np.random.default_rng(1)
    ids, targets = rng.integers(0, 13, (2, 5)), rng.integers(0, 13, (2, 5))
    assert np.isclose(model(ids, targets).item(),
                      F.cross_entropy(model(ids), targets).item(), rtol=1e-14)
    model(ids, targets).backward()
    for name, g in model.grads().items():
        assert g is not None and g.shape == param_shapes(CFG)[name], name
    assert np.all(model.params["wpe"].grad[5:] == 0)  # positions beyond T=5 unused


def test_gpt_gradcheck_on_sampled_parameters():
    cfg = GPTConfig(vocab_size=7, block_size=4, n_layer=1, n_head=2, n_embd=8)
    params = init_params(cfg, seed=2, dtype=np.float64)
    rng = np.random.default_rng(0)
    params = {k: v + 0.2 * rng.standard_normal(v.shape) for k, v in params.items()}
    ids, targets = rng.integers(0, 7, (2, 4)), rng.integers(0, 7, (2, 4))
    names = ["wte", "h0.qkv_w", "h0.ln1_w", "h0.fc_b", "lnf_b"]

    def loss_of(*tensors):  # the checked parameters come in as Tensors, used as given
        return GPT(cfg, {**params, **dict(zip(names, tensors))})(ids, targets)
    report = engine.gradcheck(loss_of, [params[n] for n in names], samples=6, rtol=1e-6,
                              floor=1e-3)
    assert report.ok and report.max_rel_error < 1e-6


def test_gpt_learns_a_repeating_sequence():
    cfg = GPTConfig(vocab_size=5, block_size=8, n_layer=1, n_head=2, n_embd=16)
    model = GPT(cfg, init_params(cfg, seed=0, dtype=np.float64))
    seq = np.array([[0, 1, 2, 3, 4, 0, 1, 2, 3]] * 2)
    losses = []
    for _ in range(30):
        model.zero_grad()
        loss = model(seq[:, :-1], seq[:, 1:])
        loss.backward()
        losses.append(loss.item())
        with engine.no_grad():
            for p in model.params.values():
                p -= 0.5 * p.grad
    assert losses[-1] < 0.3 * losses[0]


def test_gpt_input_errors():
    model = GPT(CFG, init_params(CFG))
    with pytest.raises(ValueError, match=r"T=9 exceeds block_size=8"):
        model(np.zeros((1, 9), dtype=int))
    with pytest.raises(ValueError, match=r"ids must have shape \(B, T\).*ids\[None\]"):
        model(np.zeros(4, dtype=int))
    params = init_params(CFG)
    del params["h1.fc_w"]
    with pytest.raises(KeyError, match="h1.fc_w"):
        GPT(CFG, params)
    params = init_params(CFG)
    params["wpe"] = np.zeros((4, 16))
    with pytest.raises(ValueError, match=r"params\['wpe'\] has shape \(4, 16\).*\(8, 16\)"):
        GPT(CFG, params)


def test_layers():
    lin = Linear(3, 4, seed=1)
    assert lin(np.ones((2, 3))).shape == (2, 4)
    assert set(lin.parameters()) == {"linear.weight", "linear.bias"}
    ln = LayerNorm(4)
    y = ln(np.arange(8.0).reshape(2, 4))
    np.testing.assert_allclose(y.data.mean(axis=1), 0, atol=1e-12)
    mlp = MLP(3, 5, 2, activation="gelu")
    out = mlp(np.ones((4, 3)))
    assert out.shape == (4, 2)
    out.sum().backward()
    assert set(mlp.parameters()) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    assert all(p.grad is not None for p in mlp.parameters().values())
    mlp.zero_grad()
    assert all(p.grad is None for p in mlp.parameters().values())
    with pytest.raises(ValueError, match="activation 'sigmoid' is not one of"):
        MLP(3, 5, 2, activation="sigmoid")
    w, b = Tensor(np.eye(2), requires_grad=True), Tensor(np.ones(2), requires_grad=True)
    np.testing.assert_array_equal(Linear.from_tensors(w, b)(np.array([[1.0, 2.0]])).data,
                                  [[2.0, 3.0]])
