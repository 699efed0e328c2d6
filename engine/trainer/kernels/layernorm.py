"""LayerNorm over the last axis: forward, and a backward that reads each row once.

    forward   xhat = (x - mean) * rstd,  rstd = 1 / sqrt(var + eps)
              out  = xhat * w + b                      saves mean and rstd (2 numbers a row)
    backward  g    = dout * w
              dx   = rstd * (g - mean(g) - xhat * mean(g * xhat))
              dw  += sum over rows of dout * xhat,  db += sum over rows of dout

The backward needs two row reductions (mean(g), mean(g xhat)). One sweep
over the row, while it sits in L1, writes g and g * xhat into two row-sized
scratch arrays and adds the row's share of dw and db into a per-chunk
partial sum; the two means are then lane sums (`cpu.lanes.row_sum`), so no
loop carries a running scalar sum and every loop vectorises without
fast-math. The forward does the same: the centred row goes into `out`
first, and its sum of squares is a lane dot product. `xhat` is recomputed
from x, mean and rstd instead of being stored: one multiply-add per element is
cheaper than writing and re-reading a (rows, C) array.

dx is *added into* its buffer: in a pre-LN block the LayerNorm's input is the
residual stream, whose gradient already holds the skip connection's share.
"""
from __future__ import annotations

import numpy as np

from ._buffers import float_dtype, output, rows
from .cpu.lanes import row_dot, row_sum
from ...numba_config import REDUCE_CHUNKS, parallel_kernel, prange


@parallel_kernel
def layernorm_forward_kernel(x, w, b, eps, out, mean, rstd):
    N, C = x.shape
    one, width = x.dtype.type(1), x.dtype.type(C)
    for n in prange(N):
        row, o = x[n], out[n]
        mu = row_sum(row, C) / width
        for c in range(C):                   # the centred row, kept in out for now
            o[c] = row[c] - mu
        r = one / np.sqrt(row_dot(o, o, C) / width + eps)
        for c in range(C):
            o[c] = o[c] * r * w[c] + b[c]
        mean[n] = mu
        rstd[n] = r


@parallel_kernel
def layernorm_backward_kernel(dout, x, w, mean, rstd, dx, dw, db):
    N, C = x.shape
    width = x.dtype.type(C)
    chunk = (N + REDUCE_CHUNKS - 1) // REDUCE_CHUNKS
    dw_part = np.zeros((REDUCE_CHUNKS, C), x.dtype)
    db_part = np.zeros((REDUCE_CHUNKS, C), x.dtype)
    for k in prange(REDUCE_CHUNKS):
        g = np.empty(C, x.dtype)                 # one row of dout * w, then of it * xhat
        gx = np.empty(C, x.dtype)
        for n in range(k * chunk, min(N, (k + 1) * chunk)):
            mu, r = mean[n], rstd[n]
            for c in range(C):                   # no running sum here: this loop vectorises
                xhat = (x[n, c] - mu) * r
                g[c] = dout[n, c] * w[c]
                gx[c] = g[c] * xhat
                dw_part[k, c] += dout[n, c] * xhat
                db_part[k, c] += dout[n, c]
            mean_g = row_sum(g, C) / width
            mean_gx = row_sum(gx, C) / width
            for c in range(C):
                xhat = (x[n, c] - mu) * r
                dx[n, c] += r * (g[c] - mean_g - xhat * mean_gx)
    for k in range(REDUCE_CHUNKS):           # fixed order: same bits on any thread count
        for c in range(C):
            dw[c] += dw_part[k, c]
            db[c] += db_part[k, c]


def layernorm_forward(x, w, b, eps=1e-5, *, out=None, mean=None, rstd=None):
    """LayerNorm of the rows of x (any leading shape). Returns (out, mean, rstd)."""
    name = "layernorm_forward"
    dtype = float_dtype(name, x, w, b)
    C = w.shape[0]
    x2 = rows(name, "x", x, C)
    out = output(name, "out", out, x.shape, dtype)
    mean = output(name, "mean", mean, x.shape[:-1], dtype)
    rstd = output(name, "rstd", rstd, x.shape[:-1], dtype)
    layernorm_forward_kernel(x2, w, b, dtype.type(eps), out.reshape(x2.shape),
                             mean.reshape(-1), rstd.reshape(-1))
    return out, mean, rstd


def layernorm_backward(dout, x, w, mean, rstd, *, dx=None, dw=None, db=None):
    """Gradients of LayerNorm; dx, dw and db are all *added into*. Returns (dx, dw, db)."""
    name = "layernorm_backward"
    dtype = float_dtype(name, dout, x, w, mean, rstd)
    C = w.shape[0]
    x2 = rows(name, "x", x, C)
    dout2 = rows(name, "dout", dout, C)
    if dout2.shape != x2.shape:
        raise ValueError(f"{name}: dout has shape {dout.shape}, x has {x.shape}; they must match")
    dx = output(name, "dx", dx, x.shape, dtype)
    dw = output(name, "dw", dw, (C,), dtype)
    db = output(name, "db", db, (C,), dtype)
    layernorm_backward_kernel(dout2, x2, w, mean.reshape(-1), rstd.reshape(-1),
                              dx.reshape(x2.shape), dw, db)
    return dx, dw, db
