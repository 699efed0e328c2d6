"""The numpy versions of the hot kernels: short, vectorised, and the oracle.

Each function here has a twin with the same name and signature in
`engine.kernels.fast` (numba). The tests hold the twins equal to these in
float64, so when a fast kernel and this file disagree, this file is right.

Shapes: the row-wise ops (layer norm, softmax, cross-entropy) take 2-D arrays
(rows, features); attention takes (batch*heads, T, head_size); the embedding
gradient takes flat ids (N,) and an upstream gradient (N, C).
"""
from __future__ import annotations

import numpy as np

# The tanh form of GELU: 0.5 x (1 + tanh(K (x + A x^3))). Plain Python floats,
# so float32 arrays stay float32 (a numpy float64 scalar would promote them).
from ..constants import GELU_A, GELU_K  # one copy for every kernel


# ------------------------------------------------------------------ layer norm
def layer_norm_xhat_forward(x, w, b, eps):
    """y = xhat * w + b with xhat = (x - mean) / sqrt(var + eps), per row.

    Returns y, xhat and rstd = 1/sqrt(var + eps): the two the backward needs."""
    mean = x.mean(axis=1, keepdims=True)
    xc = x - mean
    var = (xc * xc).mean(axis=1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = xc * rstd
    return xhat * w + b, xhat, rstd[:, 0]


def layer_norm_xhat_backward(g, xhat, rstd, w):
    """dx = rstd * (g w - mean(g w) - xhat * mean(g w xhat)); dw, db summed over rows."""
    gw = g * w
    dx = rstd[:, None] * (gw - gw.mean(axis=1, keepdims=True)
                          - xhat * (gw * xhat).mean(axis=1, keepdims=True))
    return dx, (g * xhat).sum(axis=0), g.sum(axis=0)


# --------------------------------------------------------- softmax and friends
def softmax_forward(x):
    """Row-wise softmax; subtracting the row max keeps exp() from overflowing."""
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def softmax_backward(g, y):
    """dx = y * (g - sum(g * y)): the Jacobian diag(y) - y y^T applied to g."""
    return y * (g - (g * y).sum(axis=1, keepdims=True))


def log_softmax_forward(x):
    shifted = x - x.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def log_softmax_backward(g, y):
    """y = log softmax(x): dx = g - softmax(x) * sum(g) with softmax(x) = exp(y)."""
    return g - np.exp(y) * g.sum(axis=1, keepdims=True)


def cross_entropy_forward(logits, targets):
    """Per-row loss -log softmax(logits)[target], and the probabilities.

    Returns (losses (N,), probs (N, V)); the caller takes the mean."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    total = e.sum(axis=1, keepdims=True)
    rows = np.arange(logits.shape[0])
    losses = np.log(total[:, 0]) - shifted[rows, targets]
    return losses, e / total


def cross_entropy_backward(probs, targets, scale):
    """d(scale * sum of losses)/dlogits = scale * (probs - onehot(targets))."""
    d = probs * scale
    d[np.arange(probs.shape[0]), targets] -= scale
    return d


# ----------------------------------------------------------------------- GELU
def gelu_forward(x):
    # x * x * x rather than x ** 3: numpy's float32 power is many times slower.
    return 0.5 * x * (1.0 + np.tanh(GELU_K * (x + GELU_A * (x * x * x))))


def gelu_backward(g, x):
    t = np.tanh(GELU_K * (x + GELU_A * (x * x * x)))
    du = GELU_K * (1.0 + 3.0 * GELU_A * x * x)
    return g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)


# ----------------------------------------------------------- causal attention
def attention_probs_forward(q, k, v, scale):
    """out = softmax(mask(q k^T * scale)) v per (batch*head); returns out, att."""
    T = q.shape[1]
    scores = np.matmul(q, k.transpose(0, 2, 1)) * scale
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    scores[:, future] = -np.inf
    att = np.exp(scores - scores.max(axis=2, keepdims=True))
    att /= att.sum(axis=2, keepdims=True)
    return np.matmul(att, v), att


def attention_probs_backward(g, q, k, v, att, scale):
    """Back through out = att v, att = softmax(s), s = q k^T * scale."""
    dv = np.matmul(att.transpose(0, 2, 1), g)
    datt = np.matmul(g, v.transpose(0, 2, 1))
    ds = att * (datt - (datt * att).sum(axis=2, keepdims=True)) * scale  # masked: att = 0
    dq = np.matmul(ds, k)
    dk = np.matmul(ds.transpose(0, 2, 1), q)
    return dq, dk, dv


# ------------------------------------------------------------------ embedding
def embedding_table_grad(ids, g, vocab_size):
    """Scatter-add: row ids[n] of the table gets g[n], in the order n = 0, 1, ...

    np.add.at adds repeated ids one after another (unlike `d[ids] += g`,
    which keeps only one of them), so the result is exact and deterministic."""
    d = np.zeros((vocab_size, g.shape[1]), dtype=g.dtype)
    np.add.at(d, ids, g)
    return d
