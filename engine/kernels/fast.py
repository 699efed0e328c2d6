"""numba versions of the hot kernels; same names and signatures as reference.py.

Written as plain loops so each one reads like its formula, with the outer
loop over rows (or over batch*head) run in parallel by `prange`. Sums
accumulate in float64 locals even for float32 arrays. Parallel loops never
write to the same element from two iterations, so results do not depend
on the number of threads. Everything is compiled on first use and cached
on disk (`cache=True`), so later runs start quickly.
"""
from __future__ import annotations

import math

import numpy as np

from ..constants import GELU_A, GELU_K
from ..fast_math import exp
# numba_config sets the threading layer and the OpenMP wait policy (once, for
# both kernel folders) before numba starts its threads.
from ..numba_config import TAPE_FASTMATH as FAST
from ..numba_config import njit, prange

# exp is engine.fast_math's: vectorised in float32, np.exp in float64.
# FAST lets LLVM reorder sums (so dot products and row sums use SIMD) and fuse
# multiply-adds. Not "nnan"/"ninf": -inf starts the row maxima, and NaN must
# stay visible to detect_anomaly. The embedding gradient keeps strict order.


# ------------------------------------------------------------------ layer norm
@njit(cache=True, parallel=True, fastmath=FAST)
def layer_norm_xhat_forward(x, w, b, eps):
    N, C = x.shape
    out = np.empty_like(x)
    xhat = np.empty_like(x)
    rstd = np.empty(N, dtype=x.dtype)
    for i in prange(N):
        mean = 0.0
        for j in range(C):
            mean += x[i, j]
        mean /= C
        var = 0.0
        for j in range(C):
            d = x[i, j] - mean
            var += d * d
        r = 1.0 / math.sqrt(var / C + eps)
        rstd[i] = r
        for j in range(C):
            xh = (x[i, j] - mean) * r
            xhat[i, j] = xh
            out[i, j] = xh * w[j] + b[j]
    return out, xhat, rstd


@njit(cache=True, parallel=True, fastmath=FAST)
def _layer_norm_dx(g, xhat, rstd, w):
    N, C = g.shape
    dx = np.empty_like(g)
    for i in prange(N):
        s1 = 0.0  # mean of g*w
        s2 = 0.0  # mean of g*w*xhat
        for j in range(C):
            gw = g[i, j] * w[j]
            s1 += gw
            s2 += gw * xhat[i, j]
        s1 /= C
        s2 /= C
        for j in range(C):
            dx[i, j] = rstd[i] * (g[i, j] * w[j] - s1 - xhat[i, j] * s2)
    return dx


@njit(cache=True)
def _column_sums(g, xhat):
    """dw = sum over rows of g*xhat, db = sum of g, one row after another."""
    N, C = g.shape
    dw = np.zeros(C)
    db = np.zeros(C)
    for i in range(N):
        for j in range(C):
            dw[j] += g[i, j] * xhat[i, j]
            db[j] += g[i, j]
    return dw.astype(g.dtype), db.astype(g.dtype)


def layer_norm_xhat_backward(g, xhat, rstd, w):
    dx = _layer_norm_dx(g, xhat, rstd, w)
    dw, db = _column_sums(g, xhat)
    return dx, dw, db


# --------------------------------------------------------- softmax and friends
@njit(cache=True, fastmath=FAST)
def _softmax_row(x, out):
    """out[:] = softmax(x) for one row, shifted by its max so exp never
    overflows; returns (max, sum of shifted exps), the pieces of log-sum-exp."""
    m = -np.inf
    for j in range(x.shape[0]):
        m = max(m, x[j])
    total = 0.0
    for j in range(x.shape[0]):
        e = exp(x[j] - m)
        out[j] = e
        total += e
    inv = 1.0 / total
    for j in range(x.shape[0]):
        out[j] *= inv
    return m, total


@njit(cache=True, parallel=True, fastmath=FAST)
def softmax_forward(x):
    N, V = x.shape
    out = np.empty_like(x)
    for i in prange(N):
        _softmax_row(x[i], out[i])
    return out


@njit(cache=True, parallel=True, fastmath=FAST)
def softmax_backward(g, y):
    N, V = g.shape
    dx = np.empty_like(g)
    for i in prange(N):
        dot = 0.0
        for j in range(V):
            dot += g[i, j] * y[i, j]
        for j in range(V):
            dx[i, j] = y[i, j] * (g[i, j] - dot)
    return dx


@njit(cache=True, parallel=True, fastmath=FAST)
def log_softmax_forward(x):
    N, V = x.shape
    out = np.empty_like(x)
    for i in prange(N):
        m = -np.inf
        for j in range(V):
            m = max(m, x[i, j])
        total = 0.0
        for j in range(V):
            total += exp(x[i, j] - m)
        lse = m + math.log(total)
        for j in range(V):
            out[i, j] = x[i, j] - lse
    return out


@njit(cache=True, parallel=True, fastmath=FAST)
def log_softmax_backward(g, y):
    N, V = g.shape
    dx = np.empty_like(g)
    for i in prange(N):
        total = 0.0
        for j in range(V):
            total += g[i, j]
        for j in range(V):
            dx[i, j] = g[i, j] - exp(y[i, j]) * total
    return dx


@njit(cache=True, parallel=True, fastmath=FAST)
def cross_entropy_forward(logits, targets):
    N, V = logits.shape
    probs = np.empty_like(logits)
    losses = np.empty(N, dtype=logits.dtype)
    for i in prange(N):
        m, total = _softmax_row(logits[i], probs[i])
        losses[i] = math.log(total) + m - logits[i, targets[i]]
    return losses, probs


@njit(cache=True, parallel=True)
def cross_entropy_backward(probs, targets, scale):
    N, V = probs.shape
    d = np.empty_like(probs)
    for i in prange(N):
        for j in range(V):
            d[i, j] = probs[i, j] * scale
        d[i, targets[i]] -= scale
    return d


# ----------------------------------------------------------------------- GELU
# tanh(u) = 1 - 2 / (1 + e^{2u}), so 0.5 (1 + tanh(u)) = 1 / (1 + e^{-2u}):
# GELU = x * sigmoid(2u), one exp per element and no slow tanh.
@njit(cache=True, parallel=True, fastmath=FAST)
def gelu_forward(x):
    flat = x.ravel()
    out = np.empty_like(flat)
    for i in prange(flat.size):
        v = flat[i]
        u = GELU_K * (v + GELU_A * v * v * v)
        out[i] = v / (1.0 + exp(-2.0 * u))
    return out.reshape(x.shape)


@njit(cache=True, parallel=True, fastmath=FAST)
def gelu_backward(g, x):
    gf = g.ravel()
    xf = x.ravel()
    out = np.empty_like(gf)
    for i in prange(xf.size):
        v = xf[i]
        u = GELU_K * (v + GELU_A * v * v * v)
        s = 1.0 / (1.0 + exp(-2.0 * u))          # 0.5 (1 + tanh u)
        du = GELU_K * (1.0 + 3.0 * GELU_A * v * v)
        # d/dv [v s] = s + v * ds/du * du/dv, with ds/du = 2 s (1 - s)
        out[i] = gf[i] * (s + v * 2.0 * s * (1.0 - s) * du)
    return out.reshape(g.shape)


# ----------------------------------------------------------- causal attention
@njit(cache=True, parallel=True, fastmath=FAST)
def attention_probs_forward(q, k, v, scale):
    """Only the causal half (s <= t) is computed; the rest of att stays 0."""
    BH, T, D = q.shape
    out = np.zeros_like(q)
    att = np.zeros((BH, T, T), dtype=q.dtype)
    for bh in prange(BH):
        for t in range(T):
            m = -np.inf
            for s in range(t + 1):
                acc = 0.0
                for d in range(D):
                    acc += q[bh, t, d] * k[bh, s, d]
                acc *= scale
                att[bh, t, s] = acc
                m = max(m, acc)
            total = 0.0
            for s in range(t + 1):
                e = exp(att[bh, t, s] - m)
                att[bh, t, s] = e
                total += e
            inv = 1.0 / total
            for s in range(t + 1):
                a = att[bh, t, s] * inv
                att[bh, t, s] = a
                for d in range(D):
                    out[bh, t, d] += a * v[bh, s, d]
    return out, att


@njit(cache=True, parallel=True, fastmath=FAST)
def attention_probs_backward(g, q, k, v, att, scale):
    """One (batch, head) per parallel iteration: no two iterations share an output."""
    BH, T, D = q.shape
    dq = np.zeros_like(q)
    dk = np.zeros_like(k)
    dv = np.zeros_like(v)
    for bh in prange(BH):
        datt = np.empty(T)
        for t in range(T):
            dot = 0.0
            for s in range(t + 1):
                acc = 0.0
                for d in range(D):
                    acc += g[bh, t, d] * v[bh, s, d]
                datt[s] = acc
                dot += acc * att[bh, t, s]
            for s in range(t + 1):
                a = att[bh, t, s]
                ds = a * (datt[s] - dot) * scale
                for d in range(D):
                    dq[bh, t, d] += ds * k[bh, s, d]
                    dk[bh, s, d] += ds * q[bh, t, d]
                    dv[bh, s, d] += a * g[bh, t, d]
    return dq, dk, dv


# ------------------------------------------------------------------ embedding
EMBED_COLUMNS = 16  # columns per parallel chunk


@njit(cache=True, parallel=True)
def embedding_table_grad(ids, g, vocab_size):
    """Scatter-add, parallel over column chunks: within a chunk the tokens are
    added in order n = 0, 1, ..., exactly as np.add.at does, so the result
    is bitwise the same as the oracle for any number of threads."""
    N, C = g.shape
    d = np.zeros((vocab_size, C), dtype=g.dtype)
    chunks = (C + EMBED_COLUMNS - 1) // EMBED_COLUMNS
    for c in prange(chunks):
        lo = c * EMBED_COLUMNS
        hi = min(C, lo + EMBED_COLUMNS)
        for n in range(N):
            row = ids[n]
            for j in range(lo, hi):
                d[row, j] += g[n, j]
    return d
