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
upper triangle is zero. Right of each block of query rows (below) nothing is
ever written or read: those entries keep the zeros the buffer was made with.
Zeroing them at every step would write up to half of P for nothing the
backward reads (kernels/cpu/README.md#untouched-upper-triangle).

One pair at a time (`_head_forward`, `_head_backward`), every product is a
register-tile product (`cpu.register_tiles.tile_gemm`) on the head's slices of
the QKV buffer, read in place; K^T and V^T, the right operands of S = Q K^T
and dP = dY V^T, are copied once per head. These products are small (32 x
128 x 32 at T = 128, 32 x 1024 x 32 at T = 1024), and a BLAS call spends
microseconds on each before it multiplies
(kernels/cpu/README.md#register-tiles). Causality is blocked: query rows go in blocks of ROW_BLOCK, and
block [r0, r1) only multiplies keys 0 ... r1-1, so the only masked products
computed are the diagonal block's upper half. What is left between the
products is the softmax and its backward, row by row.

The block height trades two costs. A tall block wastes more: the masked
upper half of every diagonal block is computed and thrown away, about
ROW_BLOCK / T times the useful products (half as many again at T = 128 with
64 rows). A short block costs more passes: each adds into dK and dV over all
the keys it saw, and each tile product has less k to spread its start and
its stores over. 32 rows: the fastest or within 1% at every T measured, for
both kernels (kernels/cpu/README.md#attention-block-height).

P goes to memory past the caches. A block's S is computed, and becomes P,
in a scratch block that stays in the first-level cache; Y = P V reads it
there, and its rows then stream into `probs` (`cpu/streaming.py`), which only
the backward reads, much later: ordinary stores would first read every line
of P from memory (kernels/cpu/README.md#streaming-p).

Two builds of the loop over pairs, chosen by how many numba threads the
caller has: one after another (`..._serial`: every model replica of the
trainer's default runs on one thread), or in parallel (`..._parallel`, a
`prange` over the pairs, for `--thread-mode kernels`; each pair then has its
own scratch). The pairs are independent and each is computed by the same
code, so both builds give the same bits. The one-thread builds also ask for
the next block's rows ahead of time (`cpu/prefetch.py` says why); that is a hint to the caches, and changes no number.
"""
from __future__ import annotations

import numpy as np

from . import threads
from ._buffers import float_dtype, output
from .cpu.register_tiles import tile_gemm
from .cpu.prefetch import prefetch_rows
from .cpu.streaming import stream_fence, stream_row
from .cpu.lanes import LANES, row_dot, row_max, row_sum
from ...numba_config import kernel, parallel_only_kernel, prange, row_kernel
from ...fast_math import exp

ROW_BLOCK = 32   # query rows per block (per product); see the module's docstring


@row_kernel
def _padded(n, multiple):
    return (n + multiple - 1) // multiple * multiple


@row_kernel
def _scratch(rows, cols, like):
    """An uninitialised (rows, cols) array whose rows are cols + 16 elements
    apart: at T = 1024 rows of exactly 4 KiB all fall into the same few sets of
    the L1 cache, and a product that reads 32 of them in turn evicts its own
    operand (measured at T = 1024, one thread: flash attention's forward 1.22x
    and backward 1.17x faster with the padding)."""
    return np.empty((rows, cols + 16), like.dtype)[:, :cols]


@row_kernel
def _block_scratch(T, like):
    """The scratch of one block of query rows against every key: S, then P, in
    the forward; dP, then dS, in the backward."""
    return _scratch(min(ROW_BLOCK, T), T, like)


@row_kernel
def _exp_causal_row(row, i, width, end):
    """row[:end] becomes exp(row[j] - m) for j <= i, zeros after, where m is
    the maximum of row[:i+1]; row[:width] (width > i) holds computed scores.
    Returns (m, the sum of the exponentials).

    The exponentials run over all `width` entries and the masked ones are
    zeroed afterwards: a mask inside the loop (`exp(..) if j <= i else 0`)
    kept the exp loop from vectorising (1.9 against 0.8 ns an element). The
    row's maximum and sum go through the lane reductions of `cpu.lanes` (a
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


@row_kernel
def _head_views(m, b, h, T, hs, C):
    """Head h's (T, hs) slices of batch b in a (B*T, 3C) array: Q, K, V (or dQ, dK, dV)."""
    rows = m[b * T:(b + 1) * T]
    return (rows[:, h * hs:(h + 1) * hs], rows[:, C + h * hs:C + (h + 1) * hs],
            rows[:, 2 * C + h * hs:2 * C + (h + 1) * hs])


@row_kernel
def _next_pair(task, B, H):
    """(batch, head) of the pair after pair number `task` of B * H, or (-1, 0)
    after the last: whose rows the one-thread builds ask for in advance."""
    if task + 1 >= B * H:
        return -1, 0
    return (task + 1) // H, (task + 1) % H


@row_kernel
def _next_block(b, h, r1, T, nb, nh):
    """(batch, head, first row, end row) of the block of query rows after the one
    ending at r1 of pair (b, h): the pair's own next block, or the first block of
    pair (nb, nh) (batch -1: there is none)."""
    if r1 < T:
        return b, h, r1, min(r1 + ROW_BLOCK, T)
    return nb, nh, 0, min(ROW_BLOCK, T)


@row_kernel
def _prefetch_parts(m, b, h, T, hs, C, first, last, r0, r1):
    """Ask for rows r0 ... r1-1 of head h's slices of batch b in m, (B*T, C) or
    (B*T, 3C), in parts first ... last-1 (0, 1, 2: Q, K, V); nothing if b < 0."""
    if b >= 0:
        rows = m[b * T:(b + 1) * T]
        for part in range(first, last):
            prefetch_rows(rows[:, part * C + h * hs:part * C + (h + 1) * hs], r0, r1)


@row_kernel
def _prefetch_ahead(qkv, b, h, T, hs, C, r0, r1, nb, nh):
    """What every block of pair (b, h), rows r0 ... r1-1, asks for: the same rows
    of the next pair (nb, nh)'s K and V, which that pair transposes whole before
    its first block, and the next block's rows of Q. Returns the next block,
    (batch, head, first row, end row), for the caller's own rows (dY, P, Y)."""
    _prefetch_parts(qkv, nb, nh, T, hs, C, 1, 3, r0, r1)
    pb, ph, s0, s1 = _next_block(b, h, r1, T, nb, nh)
    _prefetch_parts(qkv, pb, ph, T, hs, C, 0, 1, s0, s1)
    return pb, ph, s0, s1


@row_kernel
def _block_dims(qkv, per_head):
    """(B, H, T, C, hs, one, scale) of a one-thread build's call: per_head is probs
    (B, H, T, T) or lse (B, H, T)."""
    B, H, T = per_head.shape[0], per_head.shape[1], per_head.shape[2]
    C = qkv.shape[1] // 3
    one = qkv.dtype.type(1)
    return B, H, T, C, C // H, one, one / np.sqrt(qkv.dtype.type(C // H))


@row_kernel
def _transpose_into(src, dst):
    """dst[d, t] = src[t, d]: one head's K^T or V^T, the right operand of S = Q K^T
    and dP = dY V^T (the tile products want the rows of their right operand)."""
    for t in range(src.shape[0]):
        for d in range(src.shape[1]):
            dst[d, t] = src[t, d]


@row_kernel
def _block_gradients(ds, p, q, k, g, dq, dk, dv, r0, r1):
    """The products of one block of query rows [r0, r1) in a backward, given its
    dS and P over keys 0 ... r1-1: dQ = dS K (written), dK += dS^T Q and
    dV += P^T dY (the keys' gradients collect every block's share)."""
    tile_gemm(ds, k[:r1], dq[r0:r1], 1.0, 0.0)
    tile_gemm(ds.T, q[r0:r1], dk[:r1], 1.0, 1.0)
    tile_gemm(p.T, g[r0:r1], dv[:r1], 1.0, 1.0)


@row_kernel
def _row_width(i, r1):
    """Columns a row i handles: i + 1 rounded up to a whole number of the lane
    reductions' steps (LANES, one AVX-512 vector of float32), at most r1."""
    return min(_padded(i + 1, LANES), r1)


@row_kernel
def _head_forward(qkv, y, probs, b, h, kt, sp, nb, nh):
    """One (batch, head) pair, block of query rows by block: S = scale Q K^T and
    Y = P V as tile products on the keys the block can see; Y into y. Scratch:
    kt, (hs, T), for K^T, and sp, (ROW_BLOCK, T), where a block's S becomes its
    P in the caches; its rows then stream into probs[b, h] (`cpu/streaming.py`:
    only the backward reads them, long after). Each block asks for rows ahead
    (`_prefetch_ahead`; (nb, nh) is the next pair, nb < 0 for none)."""
    B, H, T, C, hs, one, scale = _block_dims(qkv, probs)
    q, k, v = _head_views(qkv, b, h, T, hs, C)
    _transpose_into(k, kt)
    yh = y[b * T:(b + 1) * T, h * hs:(h + 1) * hs]
    p = probs[b, h]
    for r0 in range(0, T, ROW_BLOCK):
        r1 = min(r0 + ROW_BLOCK, T)
        _prefetch_ahead(qkv, b, h, T, hs, C, r0, r1, nb, nh)
        s = sp[:r1 - r0, :r1]
        tile_gemm(q[r0:r1], kt[:, :r1], s, float(scale), 0.0)
        for i in range(r0, r1):
            _softmax_causal_row(s[i - r0], i, _row_width(i, r1), r1)
        tile_gemm(s, v[:r1], yh[r0:r1], 1.0, 0.0)
        for i in range(r0, r1):
            stream_row(s[i - r0], p[i, :r1])
    stream_fence()


@row_kernel
def _head_backward(dy, qkv, probs, dqkv, b, h, ds, vt, nb, nh):
    """The backward of one pair, block of query rows by block: dP = dY V^T, dS,
    then dQ = dS K, and dK += dS^T Q, dV += P^T dY over the keys the block
    saw. Scratch: ds, (ROW_BLOCK, T), and vt, (hs, T), for V^T. Each block asks
    for rows ahead as the forward's, and for the next block's rows of dY and P."""
    B, H, T, C, hs, one, scale = _block_dims(qkv, probs)
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
        pb, ph, s0, s1 = _prefetch_ahead(qkv, b, h, T, hs, C, r0, r1, nb, nh)
        _prefetch_parts(dy, pb, ph, T, hs, C, 0, 1, s0, s1)
        if pb >= 0:
            prefetch_rows(probs[pb, ph][:, :s1], s0, s1)
        tile_gemm(g[r0:r1], vt[:, :r1], d, 1.0, 0.0)                     # dP = dY V^T
        for t in range(r0, r1):                                          # dS, in place
            _softmax_backward_row(p[t], d[t - r0], row_dot(p[t], d[t - r0], t + 1), r1, scale)
        _block_gradients(d, p[r0:r1, :r1], q, k, g, dq, dk, dv, r0, r1)


@kernel
def attention_forward_serial(qkv, y, probs):
    B, H, T, C, hs, one, scale = _block_dims(qkv, probs)
    kt, sp = _scratch(hs, T, qkv), _block_scratch(T, qkv)
    for task in range(B * H):
        nb, nh = _next_pair(task, B, H)
        _head_forward(qkv, y, probs, task // H, task % H, kt, sp, nb, nh)


@kernel
def attention_backward_serial(dy, qkv, probs, dqkv):
    B, H, T, C, hs, one, scale = _block_dims(qkv, probs)
    ds, vt = _block_scratch(T, qkv), _scratch(hs, T, qkv)
    for task in range(B * H):
        nb, nh = _next_pair(task, B, H)
        _head_backward(dy, qkv, probs, dqkv, task // H, task % H, ds, vt, nb, nh)


@parallel_only_kernel
def attention_forward_parallel(qkv, y, probs):
    B, H, T, C, hs, one, scale = _block_dims(qkv, probs)
    for task in prange(B * H):                  # every (batch, head) pair is independent
        _head_forward(qkv, y, probs, task // H, task % H, _scratch(hs, T, qkv),
                      _block_scratch(T, qkv), -1, 0)


@parallel_only_kernel
def attention_backward_parallel(dy, qkv, probs, dqkv):
    B, H, T, C, hs, one, scale = _block_dims(qkv, probs)
    for task in prange(B * H):
        _head_backward(dy, qkv, probs, dqkv, task // H, task % H,
                       _block_scratch(T, qkv), _scratch(hs, T, qkv), -1, 0)


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
    Returns (out (B, T, C), probs (B, H, T, T)); probs is what the backward needs.
    A probs you pass keeps what it held right of each block of ROW_BLOCK query
    rows (the module's docstring): pass a zeroed one to read P as a whole."""
    name = "attention_forward"
    dtype = float_dtype(name, qkv)
    B, T, C = _check_qkv(name, qkv, n_head)
    out = output(name, "out", out, (B, T, C), dtype)
    probs = output(name, "probs", probs, (B, n_head, T, T), dtype)
    kernel = attention_forward_serial if threads.single_threaded() else attention_forward_parallel
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
    kernel = attention_backward_serial if threads.single_threaded() else attention_backward_parallel
    kernel(np.ascontiguousarray(dout).reshape(B * T, C),
           qkv.reshape(B * T, 3 * C), probs, dqkv.reshape(B * T, 3 * C))
    return dqkv
