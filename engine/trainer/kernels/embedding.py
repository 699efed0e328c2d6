"""Token + position embedding: a gather forward, a deterministic scatter-add backward.

    forward   x[b, t, :] = wte[ids[b, t], :] + wpe[t, :]
    backward  dwte[v, :] += sum of dx[b, t, :] over the positions where ids[b, t] == v
              dwpe[t, :] += sum over b of dx[b, t, :]

The backward is where a parallel version goes wrong: two threads that add
rows for the same token into the same row of dwte at the same moment lose
one of the additions (a race), and even with atomic adds the order of the
additions, hence the last bits of the result, changes from run to run.

Here each thread owns a block of *columns* of the whole table and walks the
tokens in their original order. No two threads ever write the same number,
and every number receives its additions in the same order on every run and
for any number of threads: bit-for-bit reproducible, with no locks. The
position table is split by rows (each position is one thread's).
"""
from __future__ import annotations

import numpy as np

from ._buffers import float_dtype, output, rows
from ...numba_config import parallel_kernel, prange

COLUMN_BLOCK = 16   # columns per task: one 64-byte cache line of float32


@parallel_kernel
def embedding_forward_kernel(ids, wte, wpe, out):
    B, T = ids.shape
    C = wte.shape[1]
    for n in prange(B * T):
        token, t = ids[n // T, n % T], n % T
        for c in range(C):
            out[n, c] = wte[token, c] + wpe[t, c]


@parallel_kernel
def embedding_backward_kernel(ids, dx, dwte, dwpe):
    B, T = ids.shape
    C = dwte.shape[1]
    n_blocks = (C + COLUMN_BLOCK - 1) // COLUMN_BLOCK
    for blk in prange(n_blocks):                  # scatter-add: columns split, tokens in order
        c0, c1 = blk * COLUMN_BLOCK, min(C, (blk + 1) * COLUMN_BLOCK)
        for n in range(B * T):
            token = ids[n // T, n % T]
            for c in range(c0, c1):
                dwte[token, c] += dx[n, c]
    for t in prange(T):                            # positions: one row per task, b in order
        for b in range(B):
            for c in range(C):
                dwpe[t, c] += dx[b * T + t, c]


def _check_ids(kernel, ids, vocab_size, block_size):
    ids = np.asarray(ids)
    if ids.ndim != 2:
        raise ValueError(f"{kernel}: ids must have shape (B, T), got {ids.shape}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"{kernel}: ids must be integers, got dtype {ids.dtype}")
    if ids.shape[1] > block_size:
        raise ValueError(f"{kernel}: T={ids.shape[1]} exceeds the {block_size} rows of wpe")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"{kernel}: ids must lie in [0, {vocab_size}), got values from "
                         f"{ids.min()} to {ids.max()}")
    return np.ascontiguousarray(ids)


def embedding_forward(ids, wte, wpe, *, out=None):
    """x = wte[ids] + wpe[:T] for ids of shape (B, T). Returns out (B, T, C)."""
    name = "embedding_forward"
    dtype = float_dtype(name, wte, wpe)
    ids = _check_ids(name, ids, wte.shape[0], wpe.shape[0])
    B, T = ids.shape
    out = output(name, "out", out, (B, T, wte.shape[1]), dtype)
    embedding_forward_kernel(ids, wte, wpe, out.reshape(B * T, -1))
    return out


def embedding_backward(ids, dx, vocab_size, *, dwte=None, dwpe=None):
    """Scatter-add of dx (B, T, C) into dwte (vocab_size, C) and dwpe (>= T, C),
    both *added into*. Returns (dwte, dwpe)."""
    name = "embedding_backward"
    ids = _check_ids(name, ids, vocab_size, 1 << 62)
    B, T = ids.shape
    dtype = float_dtype(name, dx)
    dx2 = rows(name, "dx", dx)
    C = dx2.shape[1]
    if dx2.shape[0] != B * T:
        raise ValueError(f"{name}: dx has {dx2.shape[0]} rows, ids has B*T={B * T}")
    dwte = output(name, "dwte", dwte, (vocab_size, C), dtype)
    if dwpe is None:
        dwpe = np.zeros((T, C), dtype)
    elif dwpe.shape[0] < T or dwpe.shape[1] != C or dwpe.dtype != dtype:
        raise ValueError(f"{name}: dwpe must be ({T} or more, {C}) {dtype}, got "
                         f"{dwpe.shape} {dwpe.dtype}")
    embedding_backward_kernel(ids, dx2, dwte, dwpe)
    return dwte, dwpe
