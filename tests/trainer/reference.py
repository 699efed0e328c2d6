"""Unfused numpy compositions the fused kernels must equal (float64 oracles),
and a central-difference check of a kernel's backward."""
from __future__ import annotations

import numpy as np

GELU_K = np.sqrt(2.0 / np.pi)
GELU_A = 0.044715


def layernorm(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    return (x - mean) * rstd * w + b, mean[..., 0], rstd[..., 0]


def gelu(u):
    return 0.5 * u * (1.0 + np.tanh(GELU_K * (u + GELU_A * u ** 3)))


def gelu_grad(u):
    t = np.tanh(GELU_K * (u + GELU_A * u ** 3))
    return 0.5 * (1 + t) + 0.5 * u * (1 - t * t) * GELU_K * (1 + 3 * GELU_A * u * u)


def split_heads(qkv, H):
    B, T, C3 = qkv.shape
    C = C3 // 3
    return [qkv[..., i * C:(i + 1) * C].reshape(B, T, H, C // H).transpose(0, 2, 1, 3)
            for i in range(3)]


def attention(qkv, H):
    """(out, probs) of causal attention, the textbook way: full T x T, masked."""
    q, k, v = split_heads(qkv, H)
    B, _, T, hs = q.shape
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hs)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3).reshape(B, T, H * hs), p


def attention_grad(dout, qkv, H):
    q, k, v = split_heads(qkv, H)
    _, p = attention(qkv, H)
    B, _, T, hs = q.shape
    g = dout.reshape(B, T, H, hs).transpose(0, 2, 1, 3)
    dv = p.transpose(0, 1, 3, 2) @ g
    dp = g @ v.transpose(0, 1, 3, 2)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True)) / np.sqrt(hs)
    merge = lambda a: a.transpose(0, 2, 1, 3).reshape(B, T, H * hs)  # noqa: E731
    return np.concatenate([merge(ds @ k), merge(ds.transpose(0, 1, 3, 2) @ q), merge(dv)], -1)


def crossentropy(logits, targets):
    z = logits - logits.max(-1, keepdims=True)
    lse = np.log(np.exp(z).sum(-1))
    losses = lse - z[np.arange(len(targets)), targets]
    p = np.exp(z - lse[:, None])
    p[np.arange(len(targets)), targets] -= 1
    return losses, p


def directional_check(loss_fn, x, analytic, rng, eps=1e-6, directions=3):
    """Largest relative gap between <analytic, d> and the central difference of
    loss_fn along random directions d (loss_fn: x -> float)."""
    worst = 0.0
    for _ in range(directions):
        d = rng.standard_normal(x.shape)
        numeric = (loss_fn(x + eps * d) - loss_fn(x - eps * d)) / (2 * eps)
        exact = float((analytic * d).sum())
        worst = max(worst, abs(numeric - exact) / max(abs(exact), 1e-8))
    return worst


def step_allocation_bytes(model, x, y) -> int:
    """Peak bytes numpy allocates in one forward + backward of `model` (after a
    first step, run here, has compiled the kernels and made any kept buffers):
    numpy reports its data allocations to tracemalloc."""
    import tracemalloc
    model.zero_grad()
    model.forward(x, y)
    model.backward()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        model.zero_grad()
        model.forward(x, y)
        model.backward()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
