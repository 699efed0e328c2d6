"""Causal self-attention without the T x T matrix (the FlashAttention scheme).

Same layout and the same mathematics as engine.trainer.kernels.attention; what
changes is what is kept. The standard kernel saves P, (B, H, T, T) numbers, for
its backward: at long sequences that one buffer outgrows the rest of the
model. This kernel keeps the output Y and one number per row,

    lse_i = log sum_{j <= i} exp(s_ij),       s_ij = scale * q_i . k_j

so its saved memory grows linearly in T. Any probability can be rebuilt from
it in one exponential: p_ij = exp(s_ij - lse_i).

Forward: the online softmax. Row block by row block (TILE query rows), the key
columns arrive tile by tile; each row keeps a running maximum m, a running sum
l of exp(s - m) and an unnormalised output acc. When a tile raises the
maximum from m to m', what was summed so far is rescaled by exp(m - m'):

    l   <- l   * exp(m - m') + sum_j exp(s_ij - m')
    acc <- acc * exp(m - m') + sum_j exp(s_ij - m') v_j

After the last tile, y_i = acc / l and lse_i = m + log l. No score outlives
its tile.

Backward: the tiles of P are recomputed from Q, K and lse. The softmax
backward needs rowsum(P * dP) for each row; since dP = dY V^T and Y = P V,

    D_i = sum_j p_ij dp_ij = sum_j p_ij (dy_i . v_j) = dy_i . y_i,

one dot product of two saved (T, hs) arrays, computed before any tile. Then,
tile by tile: dV += P^T dY, dP = dY V^T, dS = scale * P * (dP - D),
dQ += dS K, dK += dS^T Q. The price: S and P are computed twice (forward and
backward), two more products of the five per tile.

Two builds, as for the standard kernel (engine/trainer/kernels/attention.py):

* One thread (every model replica): the standard kernel's blocked
  register-tile products, head by head, with each block of ROW_BLOCK query
  rows keeping its scores and probabilities in a (ROW_BLOCK, T) scratch that
  the next block overwrites, instead of in a (B, H, T, T) buffer. A block sees all
  the keys it needs at once, so no online rescaling is needed: the
  block's row maxima are exact. At long sequences this is the faster of
  the two kernels: it writes and reads back no T x T matrix.
* Several threads: the (batch, head) pairs run in parallel; each pair works
  on zero-padded copies of its Q, K, V (O(T * hs) scratch) and (TILE x TILE)
  tiles with the online softmax above, and every tile product goes through
  the standard kernel's `_rows4_product` (four rows per pass, so each loaded
  element feeds four multiply-adds).
"""
from __future__ import annotations

import numpy as np

from . import threads
from ._buffers import float_dtype, output
from ._lanes import row_dot, row_max, row_sum
from .attention import (ROW_BLOCK, _block_dims, _block_gradients, _check_qkv, _exp_causal_row,
                        _head_views, _padded, _row_width, _scratch, _softmax_backward_row,
                        _transpose_into)
from .register_tiles import tile_gemm
from ...numba_config import kernel, parallel_only_kernel, prange
from ...fast_math import exp

TILE = 16   # rows and columns per tile: one AVX-512 register of float32


@kernel
def _rows4_product(out, a, b, r, k0, k1, c0, c1):
    """out[r:r+4, c0:c1] += a[r:r+4, k0:k1] @ b[k0:k1, c0:c1]  ((k1 - k0) % 4 == 0).

    Four rows of `out` and four of `b` per pass: each loaded element of b feeds
    four multiply-adds, each loaded element of out takes four."""
    o0 = out[r]
    o1 = out[r + 1]
    o2 = out[r + 2]
    o3 = out[r + 3]
    for k in range(k0, k1, 4):
        b0, b1, b2, b3 = b[k], b[k + 1], b[k + 2], b[k + 3]
        a00, a01, a02, a03 = a[r, k], a[r, k + 1], a[r, k + 2], a[r, k + 3]
        a10, a11, a12, a13 = a[r + 1, k], a[r + 1, k + 1], a[r + 1, k + 2], a[r + 1, k + 3]
        a20, a21, a22, a23 = a[r + 2, k], a[r + 2, k + 1], a[r + 2, k + 2], a[r + 2, k + 3]
        a30, a31, a32, a33 = a[r + 3, k], a[r + 3, k + 1], a[r + 3, k + 2], a[r + 3, k + 3]
        for c in range(c0, c1):
            x0, x1, x2, x3 = b0[c], b1[c], b2[c], b3[c]
            o0[c] += a00 * x0 + a01 * x1 + a02 * x2 + a03 * x3
            o1[c] += a10 * x0 + a11 * x1 + a12 * x2 + a13 * x3
            o2[c] += a20 * x0 + a21 * x1 + a22 * x2 + a23 * x3
            o3[c] += a30 * x0 + a31 * x1 + a32 * x2 + a33 * x3


@kernel
def _load_rows(src, row0, col0, T, hs, out, scale):
    """out[t, d] = scale * src[row0 + t, col0 + d]: one head's (T, hs) slice, zero-padded
    to out's shape. For the transposed slice (K^T, V^T) pass out_t.T."""
    out[T:, :] = 0
    out[:T, hs:] = 0
    for t in range(T):
        for d in range(hs):
            out[t, d] = src[row0 + t, col0 + d] * scale


@kernel
def _mask_above_diagonal(tile, value):
    """tile[r, c] = value where c > r: the future positions of a diagonal tile."""
    for r in range(TILE):
        for c in range(r + 1, TILE):
            tile[r, c] = value


@kernel
def _tile_scores(s, a, bt, i0, j0):
    """s[r, c] = sum_d a[i0 + r, d] bt[d, j0 + c] over one TILE x TILE tile
    (S = scale Q K^T with the scale folded into K^T, and dP = dY V^T)."""
    s[:, :] = 0
    rows, cols = a[i0:i0 + TILE], bt[:, j0:j0 + TILE]
    for r in range(0, TILE, 4):
        _rows4_product(s, rows, cols, r, 0, a.shape[1], 0, TILE)


@kernel
def _tile_times(out, o0, m, x, x0):
    """out[o0 + r, :] += sum_c m[r, c] x[x0 + c, :]  (acc += P V, dQ += dS K)."""
    rows, xs = out[o0:o0 + TILE], x[x0:x0 + TILE]
    for r in range(0, TILE, 4):
        _rows4_product(rows, m, xs, r, 0, TILE, 0, x.shape[1])


@kernel
def _tile_transposed_times(out, o0, m, x, x0, mt):
    """out[o0 + c, :] += sum_r m[r, c] x[x0 + r, :]  (dV += P^T dY, dK += dS^T Q);
    mt is scratch for the transposed tile."""
    for r in range(TILE):
        for c in range(TILE):
            mt[c, r] = m[r, c]
    _tile_times(out, o0, mt, x, x0)


@kernel
def _head_forward(qkv, y, lse, b, h):
    """One (batch, head) pair: writes its Y columns into y and its lse row."""
    H, T = lse.shape[1], lse.shape[2]
    C = y.shape[1]
    hs = C // H
    Tp, hp = _padded(T, TILE), _padded(hs, 4)
    one = qkv.dtype.type(1)
    zero = one - one
    scale = one / np.sqrt(qkv.dtype.type(hs))
    row0 = b * T
    q, kt, v = np.empty((Tp, hp), qkv.dtype), np.empty((hp, Tp), qkv.dtype), \
        np.empty((Tp, hp), qkv.dtype)
    _load_rows(qkv, row0, h * hs, T, hs, q, one)
    _load_rows(qkv, row0, C + h * hs, T, hs, kt.T, scale)      # scale folded into K^T
    _load_rows(qkv, row0, 2 * C + h * hs, T, hs, v, one)
    s = np.empty((TILE, TILE), qkv.dtype)
    acc = np.zeros((Tp, hp), qkv.dtype)
    m = np.empty(TILE, qkv.dtype)
    total = np.empty(TILE, qkv.dtype)
    for i0 in range(0, Tp, TILE):
        for j0 in range(0, i0 + 1, TILE):         # causal: tiles left of the diagonal
            _tile_scores(s, q, kt, i0, j0)
            if j0 == i0:
                _mask_above_diagonal(s, -np.inf)  # the diagonal tile: only j <= i counts
            for r in range(TILE):
                tile_max = row_max(s[r], TILE)    # column j0 <= i always exists
                new_max = tile_max if j0 == 0 else max(m[r], tile_max)
                rescale = zero if j0 == 0 else exp(m[r] - new_max)
                for c in range(TILE):             # no running sum: this loop vectorises
                    s[r, c] = exp(s[r, c] - new_max)
                total[r] = (zero if j0 == 0 else total[r] * rescale) + row_sum(s[r], TILE)
                m[r] = new_max
                for d in range(hp):
                    acc[i0 + r, d] *= rescale
            if j0 == i0:
                _mask_above_diagonal(s, zero)     # exp(-inf) is 0 in exact arithmetic only
            _tile_times(acc, i0, s, v, j0)        # acc += exp(S - m) V
        for r in range(min(TILE, T - i0)):
            t = i0 + r
            inv = one / total[r]
            for d in range(hs):
                y[row0 + t, h * hs + d] = acc[t, d] * inv
            lse[b, h, t] = m[r] + np.log(total[r])


@kernel
def _head_backward(dy, qkv, y, lse, dqkv, b, h):
    """Backward of one (batch, head) pair: writes its dQ, dK, dV columns of dqkv."""
    H, T = lse.shape[1], lse.shape[2]
    C = dy.shape[1]
    hs = C // H
    Tp, hp = _padded(T, TILE), _padded(hs, 4)
    one = qkv.dtype.type(1)
    zero = one - one
    scale = one / np.sqrt(qkv.dtype.type(hs))
    row0 = b * T
    dt = qkv.dtype
    q, k, kt = np.empty((Tp, hp), dt), np.empty((Tp, hp), dt), np.empty((hp, Tp), dt)
    vt, g = np.empty((hp, Tp), dt), np.empty((Tp, hp), dt)
    _load_rows(qkv, row0, h * hs, T, hs, q, one)
    _load_rows(qkv, row0, C + h * hs, T, hs, k, one)
    _load_rows(qkv, row0, C + h * hs, T, hs, kt.T, scale)
    _load_rows(qkv, row0, 2 * C + h * hs, T, hs, vt.T, one)
    _load_rows(dy, row0, h * hs, T, hs, g, one)
    # D_i = dy_i . y_i = rowsum(P * dP), and the row statistics, padded
    rowdot, row_lse = np.zeros(Tp, dt), np.zeros(Tp, dt)
    for t in range(T):
        r = row0 + t
        rowdot[t] = row_dot(dy[r, h * hs:(h + 1) * hs], y[r, h * hs:(h + 1) * hs], hs)
        row_lse[t] = lse[b, h, t]
    dq, dk, dv = np.zeros((Tp, hp), dt), np.zeros((Tp, hp), dt), np.zeros((Tp, hp), dt)
    p, ds, tr = np.empty((TILE, TILE), dt), np.empty((TILE, TILE), dt), np.empty((TILE, TILE), dt)
    for i0 in range(0, Tp, TILE):
        for j0 in range(0, i0 + 1, TILE):
            _tile_scores(p, q, kt, i0, j0)                 # S again
            for r in range(TILE):                          # P = exp(S - lse)
                for c in range(TILE):
                    p[r, c] = exp(p[r, c] - row_lse[i0 + r])
            if j0 == i0:
                _mask_above_diagonal(p, zero)
            for r in range(max(0, T - i0), TILE):           # padding rows past T
                p[r, :] = 0
            _tile_transposed_times(dv, j0, p, g, i0, tr)   # dV += P^T dY
            _tile_scores(ds, g, vt, i0, j0)                # dP = dY V^T
            for r in range(TILE):                          # dS = scale * P * (dP - D)
                for c in range(TILE):
                    ds[r, c] = scale * p[r, c] * (ds[r, c] - rowdot[i0 + r])
            _tile_times(dq, i0, ds, k, j0)                 # dQ += dS K
            _tile_transposed_times(dk, j0, ds, q, i0, tr)  # dK += dS^T Q
    for t in range(T):
        r = row0 + t
        for d in range(hs):
            dqkv[r, h * hs + d] = dq[t, d]
            dqkv[r, C + h * hs + d] = dk[t, d]
            dqkv[r, 2 * C + h * hs + d] = dv[t, d]


@parallel_only_kernel
def flash_forward_tiles(qkv, y, lse):
    B, H = lse.shape[0], lse.shape[1]
    for task in prange(B * H):                  # every (batch, head) pair is independent
        _head_forward(qkv, y, lse, task // H, task % H)


@parallel_only_kernel
def flash_backward_tiles(dy, qkv, y, lse, dqkv):
    B, H = lse.shape[0], lse.shape[1]
    for task in prange(B * H):
        _head_backward(dy, qkv, y, lse, dqkv, task // H, task % H)


@kernel
def flash_forward_blocked(qkv, y, lse):
    """The one-thread build: the standard kernel's blocked forward, with each
    block's exponentials in a (ROW_BLOCK, T) scratch that the next block
    overwrites; only the row's log-sum-exp is kept. The rows are never
    normalised: Y = E V with the unnormalised e_ij = exp(s_ij - m_i), then
    each row of Y is divided by its sum (hs divisions a row instead of one
    more pass over its i + 1 exponentials)."""
    B, H, T, C, hs, one, scale = _block_dims(qkv, lse)
    s = _scratch(min(ROW_BLOCK, T), T, qkv)
    inv = np.empty(min(ROW_BLOCK, T), qkv.dtype)
    kt = _scratch(hs, T, qkv)
    for b in range(B):
        for h in range(H):
            q, k, v = _head_views(qkv, b, h, T, hs, C)
            _transpose_into(k, kt)
            yh = y[b * T:(b + 1) * T, h * hs:(h + 1) * hs]
            for r0 in range(0, T, ROW_BLOCK):
                r1 = min(r0 + ROW_BLOCK, T)
                e = s[:r1 - r0, :r1]
                tile_gemm(q[r0:r1], kt[:, :r1], e, float(scale), 0.0)           # S
                for i in range(r0, r1):
                    m, total = _exp_causal_row(s[i - r0], i, _row_width(i, r1), r1)
                    lse[b, h, i] = m + np.log(total)
                    inv[i - r0] = one / total
                tile_gemm(e, v[:r1], yh[r0:r1], 1.0, 0.0)                       # E V
                for i in range(r0, r1):                                         # / row sums
                    for d in range(hs):
                        yh[i, d] *= inv[i - r0]


@kernel
def flash_backward_blocked(dy, qkv, y, lse, dqkv):
    """The one-thread build of the backward, block of query rows by block: S
    again, P = exp(S - lse), dP = dY V^T, dS = scale P (dP - D) with
    D_i = dy_i . y_i, then dQ = dS K, dK += dS^T Q, dV += P^T dY."""
    B, H, T, C, hs, one, scale = _block_dims(qkv, lse)
    rows = min(ROW_BLOCK, T)
    sp, sd = _scratch(rows, T, qkv), _scratch(rows, T, qkv)
    kt, vt = _scratch(hs, T, qkv), _scratch(hs, T, qkv)
    for b in range(B):
        for h in range(H):
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


def flash_attention_forward(qkv, n_head, *, out=None, lse=None):
    """Causal self-attention of qkv (B, T, 3C) with n_head heads, tiled.
    Returns (out (B, T, C), lse (B, H, T)); out and lse are what the backward needs."""
    name = "flash_attention_forward"
    dtype = float_dtype(name, qkv)
    B, T, C = _check_qkv(name, qkv, n_head)
    out = output(name, "out", out, (B, T, C), dtype)
    lse = output(name, "lse", lse, (B, n_head, T), dtype)
    kernel = flash_forward_blocked if threads.single_threaded() else flash_forward_tiles
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
    kernel = flash_backward_blocked if threads.single_threaded() else flash_backward_tiles
    kernel(np.ascontiguousarray(dout).reshape(B * T, C), qkv.reshape(B * T, 3 * C),
           np.ascontiguousarray(out).reshape(B * T, C), np.ascontiguousarray(lse),
           dqkv.reshape(B * T, 3 * C))
    return dqkv
