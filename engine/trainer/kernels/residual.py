"""Residual adds and bias gradients.

    forward   out = x + y + bias         (x: the residual stream, y: a projection's
                                          bias-free output; one pass instead of two)
    backward  dx = dout and dy = dout    (an add passes its gradient to both inputs:
                                          nothing to compute, the same buffer is read)
              dbias += sum over rows of dout

`bias_grad` is the column sum that every bias needs in the backward. Rows
are summed in fixed chunks, then the chunks in order, so the bits do not
depend on the number of threads.
"""
from __future__ import annotations

import numpy as np

from ._buffers import float_dtype, output, rows
from ...numba_config import REDUCE_CHUNKS, parallel_kernel, prange


@parallel_kernel
def residual_bias_add_kernel(x, y, bias, out):
    N, C = x.shape
    for n in prange(N):
        for c in range(C):
            out[n, c] = x[n, c] + y[n, c] + bias[c]


@parallel_kernel
def bias_grad_kernel(dout, dbias):
    N, F = dout.shape
    chunk = (N + REDUCE_CHUNKS - 1) // REDUCE_CHUNKS
    part = np.zeros((REDUCE_CHUNKS, F), dout.dtype)
    for k in prange(REDUCE_CHUNKS):
        for n in range(k * chunk, min(N, (k + 1) * chunk)):
            for f in range(F):
                part[k, f] += dout[n, f]
    for k in range(REDUCE_CHUNKS):
        for f in range(F):
            dbias[f] += part[k, f]


def residual_bias_add(x, y, bias, *, out=None):
    """out = x + y + bias (bias broadcast over rows). Returns out."""
    name = "residual_bias_add"
    dtype = float_dtype(name, x, y, bias)
    if x.shape != y.shape:
        raise ValueError(f"{name}: x has shape {x.shape}, y has {y.shape}; they must match")
    x2 = rows(name, "x", x, bias.shape[0])
    out = output(name, "out", out, x.shape, dtype)
    residual_bias_add_kernel(x2, rows(name, "y", y), bias, out.reshape(x2.shape))
    return out


def bias_grad(dout, *, dbias=None):
    """dbias += dout summed over every axis but the last. Returns dbias."""
    name = "bias_grad"
    dtype = float_dtype(name, dout)
    d2 = rows(name, "dout", dout)
    dbias = output(name, "dbias", dbias, (d2.shape[1],), dtype)
    bias_grad_kernel(d2, dbias)
    return dbias
