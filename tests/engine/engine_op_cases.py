"""Every differentiable op as a test case: a function of Tensors and its inputs.

Shared by the gradcheck tests (hypothesis draws the shapes) and the PyTorch
cross-check (which needs the same function written in torch). Each case
builder takes a numpy Generator and a few shape choices, and returns an
OpCase. Inputs are kept away from kinks and poles (relu at 0, log and
division near 0), where a finite difference cannot agree with any
gradient.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from engine import F


@dataclass
class OpCase:
    name: str
    fn: Callable            # engine version: Tensors (and integer arrays) -> Tensor
    inputs: list            # float arrays are differentiated; integer arrays are not
    torch_fn: Callable | None = None  # the same maths in torch, or None


def away_from_zero(rng, shape, margin=0.1):
    x = rng.standard_normal(shape)
    return np.where(x >= 0, x + margin, x - margin)


def binary(rng, name, shape_a, shape_b):
    a = rng.standard_normal(shape_a)
    b = rng.standard_normal(shape_b)
    if name == "div":
        b = np.sign(away_from_zero(rng, shape_b)) * (1.0 + np.abs(b))  # |b| >= 1
    fns = {"add": (lambda x, y: x + y), "sub": (lambda x, y: x - y),
           "mul": (lambda x, y: x * y), "div": (lambda x, y: x / y)}
    return OpCase(name, fns[name], [a, b], fns[name])


def unary(rng, name, shape, p=2.0):
    x = rng.standard_normal(shape)
    import_torch = _torch()
    cases = {
        "neg": (lambda t: -t, x, lambda t: -t),
        "exp": (F.exp, x, lambda t: t.exp()),
        "log": (F.log, np.abs(x) + 0.5, lambda t: t.log()),
        "tanh": (F.tanh, x, lambda t: t.tanh()),
        "relu": (F.relu, away_from_zero(rng, shape), lambda t: t.relu()),
        "gelu": (F.gelu, 2 * x,
                 lambda t: import_torch.nn.functional.gelu(t, approximate="tanh")),
        "pow": (lambda t: t ** p, np.abs(x) + 0.5 if p != int(p) or p < 0 else x,
                lambda t: t ** p),
    }
    fn, data, torch_fn = cases[name]
    return OpCase(f"{name}" + (f"(p={p})" if name == "pow" else ""), fn, [data], torch_fn)


def reduction(rng, name, shape, axis, keepdims):
    x = rng.standard_normal(shape)

    def fn(t):
        return t.sum(axis=axis, keepdims=keepdims) if name == "sum" else \
            t.mean(axis=axis, keepdims=keepdims)

    def torch_fn(t):
        dims = tuple(range(t.ndim)) if axis is None else axis
        return t.sum(dim=dims, keepdim=keepdims) if name == "sum" else \
            t.mean(dim=dims, keepdim=keepdims)
    return OpCase(f"{name}(axis={axis}, keepdims={keepdims})", fn, [x], torch_fn)


def matmul(rng, shape_a, shape_b):
    return OpCase(f"matmul {shape_a} @ {shape_b}", lambda a, b: a @ b,
                  [rng.standard_normal(shape_a), rng.standard_normal(shape_b)],
                  lambda a, b: a @ b)


def softmax_like(rng, name, shape, axis):
    x = 2 * rng.standard_normal(shape)
    fn = (lambda t: F.softmax(t, axis=axis)) if name == "softmax" else \
        (lambda t: F.log_softmax(t, axis=axis))
    torch = _torch()
    torch_fn = (lambda t: torch.softmax(t, dim=axis)) if name == "softmax" else \
        (lambda t: torch.log_softmax(t, dim=axis))
    return OpCase(f"{name}(axis={axis})", fn, [x], torch_fn)


def cross_entropy(rng, lead_shape, V):
    logits = 2 * rng.standard_normal(tuple(lead_shape) + (V,))
    targets = rng.integers(0, V, size=tuple(lead_shape))
    torch = _torch()

    def torch_fn(lg, tg):
        return torch.nn.functional.cross_entropy(lg.reshape(-1, V), tg.reshape(-1))
    return OpCase("cross_entropy", F.cross_entropy, [logits, targets], torch_fn)


def layer_norm(rng, shape, affine=True):
    C = shape[-1]
    x = rng.standard_normal(shape) * 2 + 0.5
    torch = _torch()
    if not affine:
        return OpCase("layer_norm (no weight, bias)", lambda t: F.layer_norm(t, None, None),
                      [x], lambda t: torch.nn.functional.layer_norm(t, (C,), eps=1e-5))
    w, b = 1 + 0.5 * rng.standard_normal(C), rng.standard_normal(C)
    return OpCase("layer_norm", lambda t, w_, b_: F.layer_norm(t, w_, b_, 1e-5), [x, w, b],
                  lambda t, w_, b_: torch.nn.functional.layer_norm(t, (C,), w_, b_, 1e-5))


def embedding(rng, ids_shape, V, C):
    ids = rng.integers(0, V, size=ids_shape)
    table = rng.standard_normal((V, C))
    torch = _torch()
    return OpCase("embedding", F.embedding, [ids, table],
                  lambda i, t: torch.nn.functional.embedding(i, t))


def attention(rng, shape):
    q, k, v = (rng.standard_normal(shape) for _ in range(3))
    torch = _torch()
    return OpCase(f"causal_attention {shape}", F.causal_attention, [q, k, v],
                  lambda a, b, c: torch.nn.functional.scaled_dot_product_attention(
                      a, b, c, is_causal=True))


def dropout(rng, shape, p, seed):
    x = rng.standard_normal(shape)
    keep = np.random.default_rng(seed).random(shape) >= p  # the mask the rule draws
    return OpCase(f"dropout(p={p})", lambda t: F.dropout(t, p, seed), [x],
                  lambda t: t * _torch().tensor(keep) / (1 - p))


def indexing(rng, shape, index):
    x = rng.standard_normal(shape)
    return OpCase(f"getitem {index!r}", lambda t: t[index], [x], lambda t: t[index])


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None
