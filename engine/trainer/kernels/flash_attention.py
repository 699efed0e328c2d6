"""Causal self-attention without the T x T matrix (the FlashAttention scheme).

Same layout and the same mathematics as engine.trainer.kernels.attention; what
changes is what is kept. The standard kernel saves P, (B, H, T, T) numbers, for
its backward: at long sequences that one buffer outgrows the rest of the
model. This kernel keeps the output Y and one number per row,

    lse_i = log sum_{j <= i} exp(s_ij),       s_ij = scale * q_i . k_j

so its saved memory grows linearly in T. Any probability can be rebuilt from
it in one exponential: p_ij = exp(s_ij - lse_i).

Forward. For a block of query rows, every score s_ij it needs (j <= i) is
computed at once into a (ROW_BLOCK, T) scratch, so each row's maximum is
exact, the exponentials are taken once, and only lse_i leaves the block; the
next block overwrites the scratch. (Where fast memory holds only a small tile
of keys, as on a GPU, the keys arrive tile by tile instead and an online
softmax rescales what was summed whenever a later tile raises a row's
maximum; on a CPU a block's full row of scores, ROW_BLOCK x T numbers, fits
the caches.) The rows are never normalised in place: Y = E V with the
unnormalised e_ij = exp(s_ij - m_i), then each row of Y is divided by its sum.

Backward: P is recomputed from Q, K and lse. The softmax backward needs
rowsum(P * dP) for each row; since dP = dY V^T and Y = P V,

    D_i = sum_j p_ij dp_ij = sum_j p_ij (dy_i . v_j) = dy_i . y_i,

one dot product of two saved (T, hs) arrays. Then, block by block: S again,
P = exp(S - lse), dP = dY V^T, dS = scale * P * (dP - D), dQ = dS K,
dK += dS^T Q, dV += P^T dY. The price: S and P are computed twice (forward
and backward), one more product of the five per block and a block of
exponentials.

Every product is a register-tile product (register_tiles.tile_gemm), as in the
standard kernel (engine/trainer/kernels/attention.py), and so are its two
builds: one (batch, head) pair after another on one thread (every model
replica of the trainer's default), or the pairs in parallel (`prange`, for
`--thread-mode kernels` and the attention sweep), each with its own scratch.
Each pair is computed by the same code either way: the same bits.
"""
from __future__ import annotations

import numpy as np

from . import threads
from ._buffers import float_dtype, output
from .cpu.lanes import row_dot
from .attention import (ROW_BLOCK, _block_dims, _block_gradients, _check_qkv, _exp_causal_row,
                        _head_views, _next_pair, _prefetch_ahead, _prefetch_parts, _row_width,
                        _scratch, _softmax_backward_row, _transpose_into)
from .cpu.register_tiles import tile_gemm
from ...numba_config import kernel, parallel_only_kernel, prange, row_kernel
from ...fast_math import exp


@row_kernel
def _pair_forward(qkv, y, lse, b, h, s, inv, kt, nb, nh):
    """One (batch, head) pair, block of query rows by block. Scratch: s, (ROW_BLOCK, T),
    for a block's exponentials; inv, (ROW_BLOCK,), for its row sums; kt, (hs, T), K^T.
    Each block asks for rows ahead (attention._prefetch_ahead; (nb, nh) the next pair)."""
    B, H, T, C, hs, one, scale = _block_dims(qkv, lse)
    q, k, v = _head_views(qkv, b, h, T, hs, C)
    _transpose_into(k, kt)
    yh = y[b * T:(b + 1) * T, h * hs:(h + 1) * hs]
    for r0 in range(0, T, ROW_BLOCK):
        r1 = min(r0 + ROW_BLOCK, T)
        e = s[:r1 - r0, :r1]
        _prefetch_ahead(qkv, b, h, T, hs, C, r0, r1, nb, nh)
        tile_gemm(q[r0:r1], kt[:, :r1], e, float(scale), 0.0)           # S
        for i in range(r0, r1):
            m, total = _exp_causal_row(s[i - r0], i, _row_width(i, r1), r1)
            lse[b, h, i] = m + np.log(total)
            inv[i - r0] = one / total
        tile_gemm(e, v[:r1], yh[r0:r1], 1.0, 0.0)                       # E V
        for i in range(r0, r1):                                         # / row sums
            for d in range(hs):
                yh[i, d] *= inv[i - r0]


@row_kernel
def _pair_backward(dy, qkv, y, lse, dqkv, b, h, sp, sd, kt, vt, nb, nh):
    """The backward of one pair, block of query rows by block: S again, P = exp(S -
    lse), dP = dY V^T, dS = scale P (dP - D) with D_i = dy_i . y_i, then dQ = dS K,
    dK += dS^T Q, dV += P^T dY. Scratch: sp and sd, (ROW_BLOCK, T), for P and dP
    (then dS); kt and vt, (hs, T), for K^T and V^T. Each block asks for rows ahead
    as the forward's, and for the next block's rows of dY and Y."""
    B, H, T, C, hs, one, scale = _block_dims(qkv, lse)
    q, k, v = _head_views(qkv, b, h, T, hs, C)
    _transpose_into(k, kt)
    _transpose_into(v, vt)
    dq, dk, dv = _head_views(dqkv, b, h, T, hs, C)
    g = dy[b * T:(b + 1) * T, h * hs:(h + 1) * hs]
    yh = y[b * T:(b + 1) * T, h * hs:(h + 1) * hs]
    dk[:, :] = 0
    dv[:, :] = 0
    for r0 in range(0, T, ROW_BLOCK):
        r1 = min(r0 + ROW_BLOCK, T)
        p, d = sp[:r1 - r0, :r1], sd[:r1 - r0, :r1]
        pb, ph, s0, s1 = _prefetch_ahead(qkv, b, h, T, hs, C, r0, r1, nb, nh)
        _prefetch_parts(dy, pb, ph, T, hs, C, 0, 1, s0, s1)
        _prefetch_parts(y, pb, ph, T, hs, C, 0, 1, s0, s1)
        tile_gemm(q[r0:r1], kt[:, :r1], p, float(scale), 0.0)           # S again
        for i in range(r0, r1):                                         # P
            row, row_lse = sp[i - r0], lse[b, h, i]
            for j in range(_row_width(i, r1)):
                row[j] = exp(row[j] - row_lse)
            row[i + 1:r1] = one - one
        tile_gemm(g[r0:r1], vt[:, :r1], d, 1.0, 0.0)                    # dP = dY V^T
        for t in range(r0, r1):                                         # dS, in place
            _softmax_backward_row(sp[t - r0], sd[t - r0], row_dot(g[t], yh[t], hs),
                                  r1, scale)
        _block_gradients(d, p, q, k, g, dq, dk, dv, r0, r1)


@kernel
def flash_forward_blocked(qkv, y, lse):
    """The one-thread build: the pairs one after another, sharing the scratch."""
    B, H, T, C, hs, one, scale = _block_dims(qkv, lse)
    rows = min(ROW_BLOCK, T)
    s, inv, kt = _scratch(rows, T, qkv), np.empty(rows, qkv.dtype), _scratch(hs, T, qkv)
    for task in range(B * H):
        nb, nh = _next_pair(task, B, H)
        _pair_forward(qkv, y, lse, task // H, task % H, s, inv, kt, nb, nh)


@kernel
def flash_backward_blocked(dy, qkv, y, lse, dqkv):
    B, H, T, C, hs, one, scale = _block_dims(qkv, lse)
    rows = min(ROW_BLOCK, T)
    sp, sd = _scratch(rows, T, qkv), _scratch(rows, T, qkv)
    kt, vt = _scratch(hs, T, qkv), _scratch(hs, T, qkv)
    for task in range(B * H):
        nb, nh = _next_pair(task, B, H)
        _pair_backward(dy, qkv, y, lse, dqkv, task // H, task % H, sp, sd, kt, vt, nb, nh)


@parallel_only_kernel
def flash_forward_parallel(qkv, y, lse):
    B, H, T, C, hs, one, scale = _block_dims(qkv, lse)
    rows = min(ROW_BLOCK, T)
    for task in prange(B * H):                  # every (batch, head) pair is independent
        _pair_forward(qkv, y, lse, task // H, task % H, _scratch(rows, T, qkv),
                      np.empty(rows, qkv.dtype), _scratch(hs, T, qkv), -1, 0)


@parallel_only_kernel
def flash_backward_parallel(dy, qkv, y, lse, dqkv):
    B, H, T, C, hs, one, scale = _block_dims(qkv, lse)
    rows = min(ROW_BLOCK, T)
    for task in prange(B * H):
        _pair_backward(dy, qkv, y, lse, dqkv, task // H, task % H, _scratch(rows, T, qkv),
                       _scratch(rows, T, qkv), _scratch(hs, T, qkv), _scratch(hs, T, qkv),
                       -1, 0)


def flash_attention_forward(qkv, n_head, *, out=None, lse=None):
    """Causal self-attention of qkv (B, T, 3C) with n_head heads, tiled.
    Returns (out (B, T, C), lse (B, H, T)); out and lse are what the backward needs."""
    name = "flash_attention_forward"
    dtype = float_dtype(name, qkv)
    B, T, C = _check_qkv(name, qkv, n_head)
    out = output(name, "out", out, (B, T, C), dtype)
    lse = output(name, "lse", lse, (B, n_head, T), dtype)
    kernel = flash_forward_blocked if threads.single_threaded() else flash_forward_parallel
    kernel(qkv.reshape(B * T, 3 * C), out.reshape(B * T, C), lse)
    return out, lse


def flash_attention_backward(dout, qkv, out, lse, *, dqkv=None):
    """Gradient of flash_attention_forward's out with respect to qkv (written),
    from the forward's out and lse. Returns dqkv."""
    name = "flash_attention_backward"
    dtype = float_dtype(name, dout, qkv, out, lse)
    if lse.ndim != 3:
        raise ValueError(f"{name}: lse must have shape (B, H, T), got {lse.shape}")
    B, T, C = _check_qkv(name, qkv, lse.shape[1])
    if dout.shape != (B, T, C) or out.shape != (B, T, C) or lse.shape != (B, lse.shape[1], T):
        raise ValueError(f"{name}: dout {dout.shape}, out {out.shape} and lse {lse.shape} do "
                         f"not fit qkv {qkv.shape}; expected ({B}, {T}, {C}) twice and "
                         f"({B}, H, {T})")
    dqkv = output(name, "dqkv", dqkv, qkv.shape, dtype)
    kernel = flash_backward_blocked if threads.single_threaded() else flash_backward_parallel
    kernel(np.ascontiguousarray(dout).reshape(B * T, C), qkv.reshape(B * T, 3 * C),
           np.ascontiguousarray(out).reshape(B * T, C), np.ascontiguousarray(lse),
           dqkv.reshape(B * T, 3 * C))
    return dqkv
