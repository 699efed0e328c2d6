"""Linear layers: the matrix products of the model, on BLAS or on register tiles.

    forward   y  = x @ w + b               w stored (in, out)
    backward  dx = dy @ w^T                (written, or added into)
              dw += x^T @ dy,  db += sum of dy over rows

Matrix products of this size are where a tuned BLAS usually beats
hand-written loops: it packs its operands for the caches and runs kernels
written for the CPU. So `gemm` calls BLAS (cpu/blas_gemm.py), with one
exception, decided once per process from two facts the engine knows:

* the width of the BLAS's kernels (engine.blas: OpenBLAS names them, and
  OPENBLAS_CORETYPE may hold them to a narrower set than the CPU has, as a
  machine that wants the same bits on every CPU of a fleet does), and
* the width of numba's vectors, which the register tiles use
  (cpu/register_tiles.py: the output block held in registers).

When the tiles' vectors are wider (OpenBLAS held to its 256-bit kernels,
numba compiling for an AVX-512 CPU), a one-thread product whose output the
tiles cover whole (rows a multiple of 16, columns of the vector width) goes
to the tiles: about twice as fast there. At equal width BLAS keeps every
product (kernels/cpu/README.md#linear-layers-tiles-or-blas).

The tiles need b's rows contiguous, so dx = dy @ w^T copies w^T first
(in * out numbers against rows * in * out multiply-adds), into a buffer this
thread keeps for that shape; the tiles' packed copies of the operands
(register_tiles.packed_tile_gemm) go into one more such buffer, so a step
still allocates nothing after the first. Which path ran is not a matter of
luck: `product_routes()` says it, and the benchmark prints it.
"""
from __future__ import annotations

import threading

import numba
import numpy as np

from ._buffers import float_dtype, output
from .cpu.blas_gemm import BLAS, gemm_kernel
from .cpu.register_tiles import TILE_ROWS, VECTOR_BYTES, packed_tile_gemm
from ...numba_config import parallel_kernel, prange


def tiles_are_wider(blas_bits, tile_bits: int) -> bool:
    """Whether the register tiles' vectors are wider than the BLAS kernels'
    (unknown BLAS kernels, as MKL's chosen at run time, count as full width)."""
    return blas_bits is not None and blas_bits < tile_bits


# True: one-thread float32 products the tiles cover go to the tiles (see above).
TILES_FOR_PRODUCTS = tiles_are_wider(BLAS.kernel_bits, VECTOR_BYTES * 8)
_TILE_COLUMNS = VECTOR_BYTES // 4        # float32 numbers in one vector


def product_routes() -> str:
    """Which code runs the trainer's float32 products in this process, in words."""
    blas_bits = f"{BLAS.kernel_bits}-bit" if BLAS.kernel_bits else "its own"
    if TILES_FOR_PRODUCTS:
        return (f"register tiles ({VECTOR_BYTES * 8}-bit) where they cover the output on one "
                f"thread, else {BLAS.description} ({blas_bits} kernels)")
    return BLAS.description


def _on_tiles(out, m: int, n: int) -> bool:
    return (TILES_FOR_PRODUCTS and out.dtype == np.float32 and m % TILE_ROWS == 0
            and n % _TILE_COLUMNS == 0 and numba.get_num_threads() == 1)


_thread_buffers = threading.local()    # per thread (replica): w^T by shape, the packing scratch


def _transposed_rows(b):
    """b.T with contiguous rows, in the calling thread's buffer for that shape
    (kept for the next step's products of the same shape)."""
    buffers = _thread_buffers.__dict__.setdefault("by_shape", {})
    key = (b.shape[1], b.shape[0], b.dtype.str)
    if key not in buffers:
        buffers[key] = np.empty(key[:2], b.dtype)
    np.copyto(buffers[key], b.T)
    return buffers[key]


# The sum over k in blocks of TILE_K: a block's rows of b (TILE_K x n) stay in the
# core's cache while every tile of the output reads them, where the whole of b
# (1024 x 512 for a weight gradient) would be fetched again for each row of tiles.
TILE_K = 256


def _pack_scratch(numbers: int):
    """This thread's scratch for the tiles' packed operands, grown as needed."""
    scratch = getattr(_thread_buffers, "pack", None)
    if scratch is None or scratch.size < numbers:
        scratch = _thread_buffers.pack = np.empty(numbers, np.float32)
    return scratch


def _tile_blocks(a, b, out, beta: float) -> None:
    """out = a @ b + beta out on the tiles, k in blocks of TILE_K (the first block
    applies beta, the later ones add)."""
    k = a.shape[1]
    scratch = _pack_scratch((out.shape[0] + out.shape[1]) * min(k, TILE_K))
    for k0 in range(0, k, TILE_K):
        packed_tile_gemm(a[:, k0:k0 + TILE_K], b[k0:k0 + TILE_K], out, 1.0,
                         beta if k0 == 0 else 1.0, scratch)


def gemm(a, b, out, *, trans_a=False, trans_b=False, accumulate=False):
    """out (+)= op(a) @ op(b), all C-contiguous 2-D arrays; op(m) = m.T when trans_*."""
    if not (a.flags.c_contiguous and b.flags.c_contiguous and out.flags.c_contiguous):
        raise ValueError("gemm: a, b and out must be C-contiguous 2-D arrays "
                         "(transpose with trans_a/trans_b, not with .T)")
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    k2, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
    if k != k2 or out.shape != (m, n):
        raise ValueError(f"gemm: op(a) is ({m}, {k}), op(b) is ({k2}, {n}), out is {out.shape}; "
                         f"need op(a) (m, k) @ op(b) (k, n) -> out (m, n)")
    float_dtype("gemm", a, b, out)
    if m and n:
        if k == 0:
            if not accumulate:
                out[...] = 0
        elif _on_tiles(out, m, n):
            b_rows = _transposed_rows(b) if trans_b else b       # the tiles read b by rows
            _tile_blocks(a.T if trans_a else a, b_rows, out, 1.0 if accumulate else 0.0)
        else:
            gemm_kernel(a, b, out, trans_a, trans_b, 1.0, 1.0 if accumulate else 0.0)
    return out


@parallel_kernel
def broadcast_rows_kernel(bias, out):
    N, F = out.shape
    for n in prange(N):
        for f in range(F):
            out[n, f] = bias[f]


def linear_forward(x, w, b=None, *, out=None):
    """out = x @ w (+ b) for x (rows, in), w (in, out). Returns out."""
    name = "linear_forward"
    dtype = float_dtype(name, x, w)
    x2 = x.reshape(-1, x.shape[-1])
    out = output(name, "out", out, x.shape[:-1] + (w.shape[1],), dtype)
    o2 = out.reshape(x2.shape[0], w.shape[1])
    if b is not None:
        broadcast_rows_kernel(b, o2)            # the bias first, then BLAS adds x @ w
    gemm(x2, w, o2, accumulate=b is not None)
    return out


def linear_backward(dy, x, w, *, dx=None, dw=None, db=None, accumulate_dx=False):
    """dw += x^T dy, db += column sums of dy, dx = dy w^T (or += with
    accumulate_dx). Pass db=False for a layer without bias. Returns (dx, dw, db)."""
    from .residual import bias_grad
    name = "linear_backward"
    dtype = float_dtype(name, dy, x, w)
    x2 = x.reshape(-1, x.shape[-1])
    dy2 = dy.reshape(-1, dy.shape[-1])
    dw = output(name, "dw", dw, w.shape, dtype)
    gemm(x2, dy2, dw, trans_a=True, accumulate=True)
    if db is not False:
        db = bias_grad(dy2, dbias=db)
    dx = output(name, "dx", dx, x.shape, dtype)
    gemm(dy2, w, dx.reshape(x2.shape), trans_b=True, accumulate=accumulate_dx)
    return dx, dw, (None if db is False else db)
