"""Bias + GELU (tanh form), fused: one pass forward, one pass backward.

    u   = h + bias                          (h: the fc matmul's output, bias-free)
    out = 0.5 u (1 + tanh(z)),              z = k (u + a u^3), k = sqrt(2/pi), a = 0.044715
        = u sigmoid(2z) = u / (1 + exp(-2z))

The second line is the same function (0.5 (1 + tanh z) = sigmoid(2z)) with
fewer operations per element: one exponential and one division, where tanh
written through exp, 1 - 2 / (exp(2z) + 1), adds a subtraction, a multiply
and the halving; engine/kernels/fast.py computes it the same way.

Unfused, a framework runs "add bias", "GELU" and, in backward, "GELU'" and
"sum the bias gradient" as four passes over a (rows, 4C) array. Here the
forward reads h once and writes out once; the backward reads dout and h once,
writes dh once and adds the bias gradient from the same sweep (per-chunk
partial sums, then the chunks in a fixed order).

What is saved: only h (the matmul already wrote it). u and the sigmoid are
recomputed in the backward: an add and one exp per element, cheaper than
storing them. With s = sigmoid(2z) and ds/dz = 2 s (1 - s):

    dout/du = s + u * 2 s (1 - s) * k (1 + 3 a u^2)
            = s (1 + 2 u (1 - s) k (1 + 3 a u^2))

The output itself need not be kept either. The backward has s in hand, so
given `out=` it writes u * s there too, one multiply per element: the
trainer's model keeps h but not GELU's output, which the next product's
weight gradient reads (engine/trainer/model.py). Both passes compute
out = u * s from the same expression, so the backward's copy has the
forward's bits.
"""
from __future__ import annotations

import numpy as np

from ._buffers import float_dtype, output, rows
from ...numba_config import REDUCE_CHUNKS, parallel_kernel, prange, row_kernel
from ...fast_math import exp

from ...constants import GELU_A, GELU_K  # one copy for every kernel


@row_kernel
def _sigmoid_2z(u, one, k2, a):
    """s = sigmoid(2z) = 1 / (1 + exp(-2z)), z = k (u + a u^3): one expression for
    both passes, so the backward's u * s has the forward's bits.

    In float32, s never falls below the smallest normal number: the engine's exp
    saturates at exp(87) (engine/fast_math.py), so for u below about -10.3 s
    stays 1.6e-38 where the exact value is smaller still (GELU's output there,
    u * s, is within 1e-35 of zero either way). A subnormal s would put every
    operation on it on the CPU's slow path: measured on one core, 1024 x 512
    pre-activations from N(0, 6^2), 4% of them below -10.3, the forward took
    2.2 ms and the backward 3.1 ms with exp saturating at exp(88), against
    0.27 and 0.52 ms when no pre-activation is that low."""
    return one / (one + exp(k2 * (u + a * u * u * u)))


@parallel_kernel
def bias_gelu_forward_kernel(h, bias, out):
    N, F = h.shape
    one = h.dtype.type(1)
    k2, a = h.dtype.type(-2 * GELU_K), h.dtype.type(GELU_A)
    for n in prange(N):
        for f in range(F):
            u = h[n, f] + bias[f]
            out[n, f] = u * _sigmoid_2z(u, one, k2, a)


@row_kernel
def _slope_times_row(g, hrow, bias, out, value):
    """out[f] = g[f] * gelu'(u) and value[f] = gelu(u) for one row, u = hrow + bias."""
    one, two = hrow.dtype.type(1), hrow.dtype.type(2)
    k, k2 = hrow.dtype.type(GELU_K), hrow.dtype.type(-2 * GELU_K)
    a, a3 = hrow.dtype.type(GELU_A), hrow.dtype.type(3 * GELU_A)
    for f in range(hrow.shape[0]):
        u = hrow[f] + bias[f]
        s = _sigmoid_2z(u, one, k2, a)
        value[f] = u * s
        out[f] = g[f] * (s * (one + two * u * (one - s) * k * (one + a3 * u * u)))


@parallel_kernel
def bias_gelu_backward_kernel(dout, h, bias, dh, dbias, value):
    """value: (N, F) to receive gelu(h + bias) as well, or (0, F) for no copy."""
    N, F = h.shape
    keep = value.shape[0] == N
    chunk = (N + REDUCE_CHUNKS - 1) // REDUCE_CHUNKS
    part = np.zeros((REDUCE_CHUNKS, F), h.dtype)
    for c in prange(REDUCE_CHUNKS):
        # Each row's dh goes to a fresh scratch row first, then into dh: the model
        # passes dh = dout (in place), and a loop that writes into an array it may
        # also read cannot be vectorised (the compiler must assume they overlap);
        # one that writes into its own scratch can. Measured, one thread, (1024, 512)
        # float32 in place: 7.4 ms writing dh directly, 0.97 ms through the row.
        row, unkept = np.empty(F, h.dtype), np.empty(F, h.dtype)
        for n in range(c * chunk, min(N, (c + 1) * chunk)):
            _slope_times_row(dout[n], h[n], bias, row, value[n] if keep else unkept)
            for f in range(F):
                dh[n, f] = row[f]
                part[c, f] += row[f]
    for c in range(REDUCE_CHUNKS):
        for f in range(F):
            dbias[f] += part[c, f]


def bias_gelu_forward(h, bias, *, out=None):
    """out = gelu(h + bias), row-wise over the last axis. Returns out."""
    name = "bias_gelu_forward"
    dtype = float_dtype(name, h, bias)
    h2 = rows(name, "h", h, bias.shape[0])
    out = output(name, "out", out, h.shape, dtype)
    bias_gelu_forward_kernel(h2, bias, out.reshape(h2.shape))
    return out


def bias_gelu_backward(dout, h, bias, *, dh=None, dbias=None, out=None):
    """dh = dout * gelu'(h + bias) (written); dbias is *added into*; given out,
    gelu(h + bias) is written there too, the same bits as bias_gelu_forward's.
    Returns (dh, dbias)."""
    name = "bias_gelu_backward"
    dtype = float_dtype(name, dout, h, bias)
    F = bias.shape[0]
    h2 = rows(name, "h", h, F)
    dout2 = rows(name, "dout", dout, F)
    if dout2.shape != h2.shape:
        raise ValueError(f"{name}: dout has shape {dout.shape}, h has {h.shape}; they must match")
    dh = output(name, "dh", dh, h.shape, dtype)
    dbias = output(name, "dbias", dbias, (F,), dtype)
    value = (np.empty((0, F), dtype) if out is None
             else output(name, "out", out, h.shape, dtype).reshape(h2.shape))
    bias_gelu_backward_kernel(dout2, h2, bias, dh.reshape(h2.shape), dbias, value)
    return dh, dbias
