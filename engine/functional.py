"""The engine's ops as functions (imported as `engine.F` too), PyTorch-style.

Each function runs one rule of `engine.rules` through the tape; read that
module for the forward and the VJP of each. Inputs may be Tensors or
arrays; ids and targets are integer arrays (or integer Tensors).
"""
from __future__ import annotations

from . import rules
from .tensor import Tensor, apply

__all__ = ["matmul", "add", "sub", "mul", "div", "neg", "pow", "exp", "log", "tanh", "relu",
           "gelu", "softmax", "log_softmax", "cross_entropy", "layer_norm", "embedding",
           "causal_attention", "dropout", "sum", "mean", "reshape", "transpose", "linear",
           "apply"]


def matmul(a, b) -> Tensor:
    """a @ b with numpy's batching and broadcasting rules."""
    return apply(rules.MatMul, a, b)


def add(a, b) -> Tensor:
    return apply(rules.Add, a, b)


def sub(a, b) -> Tensor:
    return apply(rules.Sub, a, b)


def mul(a, b) -> Tensor:
    return apply(rules.Mul, a, b)


def div(a, b) -> Tensor:
    return apply(rules.Div, a, b)


def neg(a) -> Tensor:
    return apply(rules.Neg, a)


def pow(a, p) -> Tensor:  # noqa: A001 (mirrors the operator's name)
    return apply(rules.Pow, a, p=p)


def exp(x) -> Tensor:
    return apply(rules.Exp, x)


def log(x) -> Tensor:
    return apply(rules.Log, x)


def tanh(x) -> Tensor:
    return apply(rules.Tanh, x)


def relu(x) -> Tensor:
    """max(x, 0); the gradient at exactly 0 is 0 (a subgradient)."""
    return apply(rules.Relu, x)


def gelu(x) -> Tensor:
    """GELU in its tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return apply(rules.Gelu, x)


def softmax(x, axis: int = -1) -> Tensor:
    return apply(rules.Softmax, x, axis=axis)


def log_softmax(x, axis: int = -1) -> Tensor:
    return apply(rules.LogSoftmax, x, axis=axis)


def cross_entropy(logits, targets) -> Tensor:
    """Mean over rows of -log softmax(logits)[target]; logits (..., V), integer targets (...)."""
    return apply(rules.CrossEntropy, logits, targets)


def layer_norm(x, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """Normalise the last axis to mean 0, variance 1, then scale by weight, shift by bias."""
    return apply(rules.LayerNorm, x, weight, bias, eps=eps)


def embedding(ids, table) -> Tensor:
    """table[ids]: rows of a (vocab, dim) table for integer ids of any shape."""
    return apply(rules.Embedding, ids, table)


def causal_attention(q, k, v) -> Tensor:
    """Causal scaled dot-product attention on (..., T, D) tensors, e.g. (B, H, T, D)."""
    return apply(rules.CausalAttention, q, k, v)


def dropout(x, p: float, seed: int) -> Tensor:
    """Zero each element with probability p (mask from `seed`), scale the rest by 1/(1-p)."""
    if p == 0.0:
        return x if isinstance(x, Tensor) else Tensor(x)
    return apply(rules.Dropout, x, p=p, seed=seed)


def sum(x, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    return apply(rules.Sum, x, axis=axis, keepdims=keepdims)


def mean(x, axis=None, keepdims: bool = False) -> Tensor:
    return apply(rules.Mean, x, axis=axis, keepdims=keepdims)


def reshape(x, shape) -> Tensor:
    return apply(rules.Reshape, x, shape=tuple(shape))


def transpose(x, axes=None) -> Tensor:
    """Permute axes (reverse them when axes is None), like numpy.transpose."""
    x = x if isinstance(x, Tensor) else Tensor(x)
    return x.permute(axes) if axes is not None else x.T


def linear(x, weight, bias=None) -> Tensor:
    """x @ weight + bias with weight stored (in, out), as in engine.gpt_config."""
    y = matmul(x, weight)
    return y if bias is None else y + bias
