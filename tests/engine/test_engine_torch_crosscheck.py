"""Each op's value and gradients equal torch.autograd's (float64).

PyTorch is only a cross-check, never a dependency: without it these tests
are skipped and the reason is printed in the pytest summary.
"""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import kernels

import engine_op_cases as cases

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the cross-check "
                                            "against torch.autograd is skipped")


def run_engine(case):
    ts = [engine.Tensor(x, requires_grad=np.issubdtype(np.asarray(x).dtype, np.floating))
          if np.issubdtype(np.asarray(x).dtype, np.floating) else x for x in case.inputs]
    out = case.fn(*ts)
    seed = np.random.default_rng(99).standard_normal(out.shape)
    out.backward(seed)
    return out.data, [t.grad if isinstance(t, engine.Tensor) else None for t in ts], seed


def run_torch(case, seed):
    ts = [torch.tensor(x, requires_grad=np.issubdtype(np.asarray(x).dtype, np.floating))
          for x in case.inputs]
    out = case.torch_fn(*ts)
    out.backward(torch.tensor(seed))
    return out.detach().numpy(), [t.grad.numpy() if t.grad is not None else None for t in ts]


def build_cases():
    rng = np.random.default_rng(0)
    out = []
    for op in ("add", "sub", "mul", "div"):
        out += [cases.binary(rng, op, (2, 3, 4), (3, 1)), cases.binary(rng, op, (1, 4), (3, 1)),
                cases.binary(rng, op, (), (2, 2))]
    for op in ("neg", "exp", "log", "tanh", "relu", "gelu"):
        out.append(cases.unary(rng, op, (3, 5)))
    out += [cases.unary(rng, "pow", (4,), p=p) for p in (2, 3, 0.5, -1.5)]
    for op in ("sum", "mean"):
        out += [cases.reduction(rng, op, (2, 3, 4), axis, keep)
                for axis in (None, 1, (0, 2)) for keep in (False, True)]
    out += [cases.matmul(rng, a, b) for a, b in [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)),
                                                 ((2, 1, 3, 4), (5, 4, 2)), ((4,), (4, 2)),
                                                 ((2, 3, 4), (4,)), ((4,), (4,))]]
    out += [cases.softmax_like(rng, op, (3, 4, 5), axis)
            for op in ("softmax", "log_softmax") for axis in (-1, 1)]
    out += [cases.cross_entropy(rng, (6,), 7), cases.cross_entropy(rng, (2, 5), 3)]
    out += [cases.layer_norm(rng, (2, 3, 8)), cases.layer_norm(rng, (4, 6), affine=False)]
    out += [cases.embedding(rng, (3, 5), 4, 6)]
    out += [cases.attention(rng, (2, 3, 6, 4)), cases.attention(rng, (1, 1, 1, 3))]
    out += [cases.dropout(rng, (4, 5), 0.3, seed=7)]
    out += [cases.indexing(rng, (4, 5), idx)  # (torch has no negative steps)
            for idx in (np.s_[1:3], np.s_[1:, 2], (np.array([0, 3, 0]),))]
    return out


CASES = build_cases()


@pytest.mark.parametrize("mode", ["numpy", "numba"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_matches_torch_autograd(case, mode):
    with kernels.use(mode):
        value, grads, seed = run_engine(case)
    t_value, t_grads = run_torch(case, seed)
    np.testing.assert_allclose(value, t_value, rtol=1e-10, atol=1e-12,
                               err_msg=f"{case.name}: forward differs from torch")
    for i, (g, tg) in enumerate(zip(grads, t_grads)):
        if tg is None:
            continue
        assert g is not None, f"{case.name}: input {i} got no gradient, torch has one"
        np.testing.assert_allclose(g, tg, rtol=1e-9, atol=1e-12,
                                   err_msg=f"{case.name}: gradient of input {i} differs")


def test_gpt_gradients_match_a_torch_transcription():
    """The reference GPT, written again in torch from the same weights."""
    from engine.gpt_config import GPTConfig, init_params
    F = torch.nn.functional
    cfg = GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=16)
    rng = np.random.default_rng(0)
    params = {k: v + 0.1 * rng.standard_normal(v.shape)
              for k, v in init_params(cfg, seed=1, dtype=np.float64).items()}
    ids, targets = rng.integers(0, 13, (3, 7)), rng.integers(0, 13, (3, 7))
    model = engine.nn.GPT(cfg, params)
    loss = model(ids, targets)
    loss.backward()

    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    B, T = ids.shape
    C, H = cfg.n_embd, cfg.n_head
    x = tp["wte"][torch.tensor(ids)] + tp["wpe"][:T]
    for i in range(cfg.n_layer):
        def p(n):
            return tp[f"h{i}.{n}"]
        h = F.layer_norm(x, (C,), p("ln1_w"), p("ln1_b"), 1e-5)
        qkv = h @ p("qkv_w") + p("qkv_b")
        q, k, v = (qkv[..., j * C:(j + 1) * C].reshape(B, T, H, C // H).transpose(1, 2)
                   for j in range(3))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + y.transpose(1, 2).reshape(B, T, C) @ p("proj_w") + p("proj_b")
        h = F.layer_norm(x, (C,), p("ln2_w"), p("ln2_b"), 1e-5)
        x = x + F.gelu(h @ p("fc_w") + p("fc_b"), approximate="tanh") @ p("fcproj_w") \
            + p("fcproj_b")
    x = F.layer_norm(x, (C,), tp["lnf_w"], tp["lnf_b"], 1e-5)
    t_loss = F.cross_entropy((x @ tp["wte"].T).reshape(-1, 13), torch.tensor(targets).reshape(-1))
    t_loss.backward()
    assert abs(loss.item() - t_loss.item()) < 1e-12
    for name, t in tp.items():
        np.testing.assert_allclose(model.params[name].grad, t.grad.numpy(), rtol=1e-9,
                                   atol=1e-12, err_msg=name)
