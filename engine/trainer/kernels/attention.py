"""Causal multi-head self-attention, forward and backward.

Layout. The QKV projection writes one (B*T, 3C) buffer: queries in columns
[0, C), keys in [C, 2C), values in [2C, 3C); head h owns the `hs = C/H`
columns h*hs ... (h+1)*hs of each part. The output `y` is (B*T, C) with the
heads side by side, ready for the output projection.

For one (batch, head) pair, with scale = 1/sqrt(hs):

    forward                                  backward (given dY)
    S  = scale * Q K^T   (rows i, cols j<=i)  dP = dY V^T
    P  = softmax(S) along j                   dS = scale * P * (dP - rowsum(P * dP))
    Y  = P V                                  dQ = dS K,  dK = dS^T Q,  dV = P^T dY

The softmax backward is the O(T^2) form above, one dot product per row, never
the (T x T) Jacobian per row. P is saved (B, H, T, T) for the backward; its
upper triangle stays zero.

Two builds, chosen by how many numba threads the caller has:

* One thread (every model replica of the trainer's default): the (batch,
  head) pairs run one after another, and every product is a register-tile
  product (`register_tiles.tile_gemm`) on the head's slices of the QKV
  buffer, read in place; K^T and V^T, the right operands of S = Q K^T and
  dP = dY V^T, are copied once per head. These products are small (64 x 128
  x 32 at T = 128), and a BLAS call spends microseconds on each before it
  multiplies: with BLAS the products ran at about half the speed (the
  module's docstring has the figures). Causality is blocked: query rows go
  in blocks of ROW_BLOCK, and block [r0, r1) only multiplies keys 0 ...
  r1-1, so the only masked products computed are the diagonal block's upper
  half. What is left between the products is the softmax and its backward,
  row by row.
* Several threads (`--thread-mode kernels`): the pairs run in parallel
  (`prange`). Each pair copies its slices into small zero-padded tiles
  (rows padded to a multiple of 16, the float32 vector width on AVX-512)
  and multiplies them with hand-written loops; `_rows4_product` computes
  four output rows at once so each row of the right operand, once loaded,
  feeds four multiply-adds.

Both builds share the row-wise softmax and softmax backward. They agree to
rounding (the tile products fuse each multiply-add, the hand-written loops
do not), not bit for bit; each is deterministic on its own.
"""
from __future__ import annotations

import numpy as np

from . import threads
from ._buffers import float_dtype, output
from .register_tiles import tile_gemm
from ._lanes import LANES, row_dot, row_max, row_sum
from ...numba_config import kernel, parallel_only_kernel, prange, row_kernel
from ...fast_math import exp

TILE = 16        # column padding of the tile build: one AVX-512 register of float32
ROW_BLOCK = 64   # query rows per product in the one-thread build


@row_kernel
def _padded(n, multiple):
    return (n + multiple - 1) // multiple * multiple


@kernel
def _tile(rows, cols, like):
    """Scratch for one head (a few tens of KB, freed when the head is done)."""
    return np.empty((rows, cols), like.dtype)


@kernel
def _scratch(rows, cols, like):
    """An uninitialised (rows, cols) array whose rows are cols + 16 elements
    apart: at T = 1024 rows of exactly 4 KiB all fall into the same few sets of
    the L1 cache, and a product that reads 32 of them in turn evicts its own
    operand (measured at T = 1024, one thread: flash attention's forward 1.22x
    and backward 1.17x faster with the padding)."""
    return np.empty((rows, cols + 16), like.dtype)[:, :cols]


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
def _causal_rows_times(out, a, bt, Tp):
    """out[i, j] = sum_d a[i, d] bt[d, j] for the column blocks j that touch j <= i.

    (S = Q K^T and dP = dY V^T.) Entries above the diagonal inside the last
    block are computed too (cheaper than masking); callers ignore them."""
    hp = a.shape[1]
    for i in range(0, Tp, 4):
        width = _padded(i + 4, TILE)
        out[i:i + 4, :width] = 0
        _rows4_product(out, a, bt, i, 0, hp, 0, width)


@kernel
def _lower_times(out, m, x, Tp):
    """out[i, :] = sum_{j <= i} m[i, j] x[j, :] for lower-triangular m (Y = P V, dQ = dS K)."""
    hp = x.shape[1]
    out[:, :] = 0
    for i in range(0, Tp, 4):
        _rows4_product(out, m, x, i, 0, i + 4, 0, hp)


@kernel
def _transposed_times_lower(out_t, xt, m, Tp):
    """out_t[:, j] = sum_{i >= j} xt[:, i] m[i, j] for lower-triangular m.

    (dK^T = Q^T dS and dV^T = dY^T P.) Walks m in blocks of TILE rows; block
    rows i0..i0+15 only reach columns j < i0 + 16."""
    hp = xt.shape[0]
    out_t[:, :] = 0
    for i0 in range(0, Tp, TILE):
        for d in range(0, hp, 4):
            _rows4_product(out_t, xt, m, d, i0, i0 + TILE, 0, i0 + TILE)


@row_kernel
def _exp_causal_row(row, i, width, end):
    """row[:end] becomes exp(row[j] - m) for j <= i, zeros after, where m is
    the maximum of row[:i+1]; row[:width] (width > i) holds computed scores.
    Returns (m, the sum of the exponentials).

    The exponentials run over all `width` entries and the masked ones are
    zeroed afterwards: a mask inside the loop (`exp(..) if j <= i else 0`)
    kept the exp loop from vectorising (1.9 against 0.8 ns an element). The
    row's maximum and sum go through the lane reductions of `_lanes` (a
    plain `total += e` would keep a loop scalar too)."""
    one = row.dtype.type(1)
    m = row_max(row, i + 1)
    for j in range(width):
        row[j] = exp(row[j] - m)
    row[i + 1:end] = one - one
    return m, row_sum(row, width)


@row_kernel
def _softmax_causal_row(row, i, width, end):
    """row[:end] becomes softmax(row[:i+1]) followed by zeros (see
    `_exp_causal_row`). Returns (the row's maximum, the sum of its
    exponentials): their log-sum-exp is what flash attention keeps (the
    standard kernel skips the logarithm, a library call per row)."""
    m, total = _exp_causal_row(row, i, width, end)
    inv = row.dtype.type(1) / total
    for j in range(width):
        row[j] *= inv
    return m, total


@row_kernel
def _softmax_backward_row(p, d, dot, width, scale):
    """d[:width] = scale * p * (d - dot), dS from dP for one row, where dot =
    sum(p * dP) over the row (p is zero past the diagonal, so the whole width
    needs no mask)."""
    for j in range(width):
        d[j] = scale * p[j] * (d[j] - dot)


@kernel
def _softmax_causal_rows(s, T):
    """Row i of the tile s becomes softmax(s[i, :i+1]), zeros after the diagonal.

    Only the column blocks that `_causal_rows_times` wrote are read: up to
    width = i + 1 rounded up to TILE (loops of one fixed multiple vectorise
    completely, while loops of length i + 1 leave a scalar remainder)."""
    for i in range(T):
        _softmax_causal_row(s[i], i, _padded(i + 1, TILE), s.shape[1])


@kernel
def _load_rows(src, row0, col0, T, hs, out, scale):
    """out[t, d] = scale * src[row0 + t, col0 + d]: one head's (T, hs) slice, zero-padded."""
    out[:, :] = 0
    for t in range(T):
        for d in range(hs):
            out[t, d] = src[row0 + t, col0 + d] * scale


@kernel
def _load_cols(src, row0, col0, T, hs, out_t, scale):
    """out_t[d, t] = scale * src[row0 + t, col0 + d]: the same slice, transposed."""
    out_t[:, :] = 0
    for t in range(T):
        for d in range(hs):
            out_t[d, t] = src[row0 + t, col0 + d] * scale


@kernel
def _head_forward(qkv, y, probs, b, h):
    """Attention of one (batch, head) pair: writes its P into probs and its Y into y."""
    H, T = probs.shape[1], probs.shape[2]
    C = y.shape[1]
    hs = C // H
    Tp, hp = _padded(T, TILE), _padded(hs, 4)
    one = qkv.dtype.type(1)
    scale = one / np.sqrt(qkv.dtype.type(hs))
    row0 = b * T
    q, kt, v = _tile(Tp, hp, qkv), _tile(hp, Tp, qkv), _tile(Tp, hp, qkv)
    _load_rows(qkv, row0, h * hs, T, hs, q, one)
    _load_cols(qkv, row0, C + h * hs, T, hs, kt, scale)        # scale folded into K^T
    _load_rows(qkv, row0, 2 * C + h * hs, T, hs, v, one)
    # P is built in place in probs[b, h] when T fills whole tiles (the usual case)
    s = probs[b, h] if T == Tp else _tile(Tp, Tp, qkv)
    _causal_rows_times(s, q, kt, Tp)            # S = scale Q K^T, lower blocks only
    _softmax_causal_rows(s, T)                  # P, in place
    out = _tile(Tp, hp, qkv)
    _lower_times(out, s, v, Tp)                 # Y = P V
    for t in range(T):
        if T != Tp:
            probs[b, h, t, :] = s[t, :T]
        y[row0 + t, h * hs:(h + 1) * hs] = out[t, :hs]


@kernel
def _head_backward(dy, qkv, probs, dqkv, b, h):
    """Backward of one (batch, head) pair: writes its dQ, dK, dV columns of dqkv."""
    H, T = probs.shape[1], probs.shape[2]
    C = dy.shape[1]
    hs = C // H
    Tp, hp = _padded(T, TILE), _padded(hs, 4)
    one = qkv.dtype.type(1)
    scale = one / np.sqrt(qkv.dtype.type(hs))
    row0 = b * T
    qt, k, vt = _tile(hp, Tp, qkv), _tile(Tp, hp, qkv), _tile(hp, Tp, qkv)
    g, gt = _tile(Tp, hp, qkv), _tile(hp, Tp, qkv)
    _load_cols(qkv, row0, h * hs, T, hs, qt, one)
    _load_rows(qkv, row0, C + h * hs, T, hs, k, one)
    _load_cols(qkv, row0, 2 * C + h * hs, T, hs, vt, one)
    _load_rows(dy, row0, h * hs, T, hs, g, one)
    _load_cols(dy, row0, h * hs, T, hs, gt, one)
    if T == Tp:
        p = probs[b, h]                         # read in place
    else:
        p = np.zeros((Tp, Tp), qkv.dtype)
        for t in range(T):
            p[t, :T] = probs[b, h, t, :]
    ds = _tile(Tp, Tp, qkv)
    _causal_rows_times(ds, g, vt, Tp)           # dP = dY V^T
    for t in range(Tp):                         # dS = scale * P * (dP - rowsum(P * dP))
        width = _padded(t + 1, TILE)            # the columns dP was computed for
        _softmax_backward_row(p[t], ds[t], row_dot(p[t], ds[t], t + 1), width, scale)
        ds[t, width:] = 0
    dq = _tile(Tp, hp, qkv)
    _lower_times(dq, ds, k, Tp)                 # dQ = dS K
    dkt = _tile(hp, Tp, qkv)
    _transposed_times_lower(dkt, qt, ds, Tp)    # dK^T = Q^T dS
    dvt = _tile(hp, Tp, qkv)
    _transposed_times_lower(dvt, gt, p, Tp)     # dV^T = dY^T P
    for t in range(T):
        r = row0 + t
        dqkv[r, h * hs:(h + 1) * hs] = dq[t, :hs]
        for d in range(hs):
            dqkv[r, C + h * hs + d] = dkt[d, t]
            dqkv[r, 2 * C + h * hs + d] = dvt[d, t]


@parallel_only_kernel
def attention_forward_tiles(qkv, y, probs):
    B, H = probs.shape[0], probs.shape[1]
    for task in prange(B * H):                  # every (batch, head) pair is independent
        _head_forward(qkv, y, probs, task // H, task % H)


@parallel_only_kernel
def attention_backward_tiles(dy, qkv, probs, dqkv):
    B, H = probs.shape[0], probs.shape[1]
    for task in prange(B * H):
        _head_backward(dy, qkv, probs, dqkv, task // H, task % H)


@row_kernel
def _head_views(m, b, h, T, hs, C):
    """Head h's (T, hs) slices of batch b in a (B*T, 3C) array: Q, K, V (or dQ, dK, dV)."""
    rows = m[b * T:(b + 1) * T]
    return (rows[:, h * hs:(h + 1) * hs], rows[:, C + h * hs:C + (h + 1) * hs],
            rows[:, 2 * C + h * hs:2 * C + (h + 1) * hs])


@row_kernel
def _block_dims(qkv, per_head):
    """(B, H, T, C, hs, one, scale) of a one-thread build's call: per_head is probs
    (B, H, T, T) or lse (B, H, T)."""
    B, H, T = per_head.shape[0], per_head.shape[1], per_head.shape[2]
    C = qkv.shape[1] // 3
    one = qkv.dtype.type(1)
    return B, H, T, C, C // H, one, one / np.sqrt(qkv.dtype.type(C // H))


@kernel
def _transpose_into(src, dst):
    """dst[d, t] = src[t, d]: one head's K^T or V^T, the right operand of S = Q K^T
    and dP = dY V^T (the tile products want the rows of their right operand)."""
    for t in range(src.shape[0]):
        for d in range(src.shape[1]):
            dst[d, t] = src[t, d]


@kernel
def _block_gradients(ds, p, q, k, g, dq, dk, dv, r0, r1):
    """The products of one block of query rows [r0, r1) in a backward, given its
    dS and P over keys 0 ... r1-1: dQ = dS K (written), dK += dS^T Q and
    dV += P^T dY (the keys' gradients collect every block's share)."""
    tile_gemm(ds, k[:r1], dq[r0:r1], False, 1.0, 0.0)
    tile_gemm(ds, q[r0:r1], dk[:r1], True, 1.0, 1.0)
    tile_gemm(p, g[r0:r1], dv[:r1], True, 1.0, 1.0)


@row_kernel
def _row_width(i, r1):
    """Columns a row i handles: i + 1 rounded up to a whole number of the lane
    reductions' steps (LANES, one AVX-512 vector of float32), at most r1."""
    return min(_padded(i + 1, LANES), r1)


@kernel
def attention_forward_blocked(qkv, y, probs):
    """The one-thread build: per head, per block of query rows, S = scale Q K^T
    and Y = P V as tile products on the keys that block can see."""
    B, H, T, C, hs, one, scale = _block_dims(qkv, probs)
    kt = _scratch(hs, T, qkv)
    for b in range(B):
        for h in range(H):
            q, k, v = _head_views(qkv, b, h, T, hs, C)
            _transpose_into(k, kt)
            yh = y[b * T:(b + 1) * T, h * hs:(h + 1) * hs]
            p = probs[b, h]
            for r0 in range(0, T, ROW_BLOCK):
                r1 = min(r0 + ROW_BLOCK, T)
                tile_gemm(q[r0:r1], kt[:, :r1], p[r0:r1, :r1], False, scale, 0.0)
                for i in range(r0, r1):
                    _softmax_causal_row(p[i], i, _row_width(i, r1), T)
                tile_gemm(p[r0:r1, :r1], v[:r1], yh[r0:r1], False, one, 0.0)


@kernel
def attention_backward_blocked(dy, qkv, probs, dqkv):
    """The one-thread build of the backward, block of query rows by block:
    dP = dY V^T, dS, then dQ = dS K, and dK += dS^T Q, dV += P^T dY over the
    keys the block saw. Scratch: one (ROW_BLOCK, T) block of dS and V^T."""
    B, H, T, C, hs, one, scale = _block_dims(qkv, probs)
    ds = _scratch(min(ROW_BLOCK, T), T, qkv)
    vt = _scratch(hs, T, qkv)
    for b in range(B):
        for h in range(H):
            q, k, v = _head_views(qkv, b, h, T, hs, C)
            dq, dk, dv = _head_views(dqkv, b, h, T, hs, C)
            _transpose_into(v, vt)
            g = dy[b * T:(b + 1) * T, h * hs:(h + 1) * hs]
            p = probs[b, h]
            dk[:, :] = 0
            dv[:, :] = 0
            for r0 in range(0, T, ROW_BLOCK):
                r1 = min(r0 + ROW_BLOCK, T)
                d = ds[:r1 - r0, :r1]
                tile_gemm(g[r0:r1], vt[:, :r1], d, False, one, 0.0)           # dP = dY V^T
                for t in range(r0, r1):                                          # dS, in place
                    _softmax_backward_row(p[t], d[t - r0], row_dot(p[t], d[t - r0], t + 1),
                                          r1, scale)
                _block_gradients(d, p[r0:r1, :r1], q, k, g, dq, dk, dv, r0, r1)


def _check_qkv(kernel_name, qkv, n_head):
    if qkv.ndim != 3 or qkv.shape[2] % 3:
        raise ValueError(f"{kernel_name}: qkv must have shape (B, T, 3C), got {qkv.shape}")
    C = qkv.shape[2] // 3
    if n_head < 1 or C % n_head:
        raise ValueError(f"{kernel_name}: C={C} is not divisible by n_head={n_head}")
    if not qkv.flags.c_contiguous:
        raise ValueError(f"{kernel_name}: qkv must be C-contiguous; pass np.ascontiguousarray(qkv)")
    return qkv.shape[0], qkv.shape[1], C


def attention_forward(qkv, n_head, *, out=None, probs=None):
    """Causal self-attention of qkv (B, T, 3C) with n_head heads.
    Returns (out (B, T, C), probs (B, H, T, T)); probs is what the backward needs."""
    name = "attention_forward"
    dtype = float_dtype(name, qkv)
    B, T, C = _check_qkv(name, qkv, n_head)
    out = output(name, "out", out, (B, T, C), dtype)
    probs = output(name, "probs", probs, (B, n_head, T, T), dtype)
    kernel = attention_forward_blocked if threads.single_threaded() else attention_forward_tiles
    kernel(qkv.reshape(B * T, 3 * C), out.reshape(B * T, C), probs)
    return out, probs


def attention_backward(dout, qkv, probs, *, dqkv=None):
    """Gradient of attention_forward's out with respect to qkv (written). Returns dqkv."""
    name = "attention_backward"
    dtype = float_dtype(name, dout, qkv, probs)
    B, T, C = _check_qkv(name, qkv, probs.shape[1])
    if dout.shape != (B, T, C) or probs.shape[0] != B or probs.shape[2:] != (T, T):
        raise ValueError(f"{name}: dout {dout.shape} and probs {probs.shape} do not fit "
                         f"qkv {qkv.shape}; expected ({B}, {T}, {C}) and ({B}, H, {T}, {T})")
    dqkv = output(name, "dqkv", dqkv, qkv.shape, dtype)
    kernel = attention_backward_blocked if threads.single_threaded() else attention_backward_tiles
    kernel(np.ascontiguousarray(dout).reshape(B * T, C),
           qkv.reshape(B * T, 3 * C), probs, dqkv.reshape(B * T, 3 * C))
    return dqkv
