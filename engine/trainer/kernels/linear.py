"""Linear layers on BLAS: one sgemm (dgemm in float64) per product, no copies.

    forward   y  = x @ w + b               w stored (in, out)
    backward  dx = dy @ w^T                (written, or added into)
              dw += x^T @ dy,  db += sum of dy over rows

Matrix products of this size are where a tuned BLAS beats hand-written
loops, so they go to the Fortran `sgemm`/`dgemm` of the library engine.blas
chooses: SciPy's OpenBLAS (the routine numba's `np.dot` calls), or Intel's
MKL when it is installed on an Intel CPU. They are called from a numba
function compiled with nogil, outside any `prange`: BLAS runs its own
threads, and nesting them inside numba's would put two threads on every core.

Calling the Fortran routine directly, instead of `np.dot`, buys two things:
beta = 1 accumulates into the output in place (how weight gradients add up
over micro-batches with no extra pass), and transposes are flags, never
copies. A C-ordered (m, n) array read column-major is its own transpose, so
out = op(a) @ op(b) is computed as out^T = op(b)^T @ op(a)^T.
"""
from __future__ import annotations

import llvmlite.binding as llvm
import numpy as np
from numba import types

from ._buffers import float_dtype, output
from ...blas import library as blas_library
from ...numba_config import kernel, parallel_kernel, prange

# The compiled kernels call the routines by name; the names are bound to the
# chosen library's addresses at every import, which keeps the machine code
# cacheable (and the same cached code serves either library).
BLAS = blas_library()
for _name in ("sgemm", "dgemm"):
    llvm.add_symbol(f"engine_fused_{_name}", getattr(BLAS, _name))
_GEMM_SIGNATURE = types.void(*([types.voidptr] * 13))
_sgemm = types.ExternalFunction("engine_fused_sgemm", _GEMM_SIGNATURE)
_dgemm = types.ExternalFunction("engine_fused_dgemm", _GEMM_SIGNATURE)


@kernel
def gemm_kernel(a, b, out, trans_a, trans_b, alpha, beta):
    """out = alpha op(a) @ op(b) + beta out, for 2-D arrays whose rows are
    contiguous: whole C-ordered arrays, or slices of them (the rows of one
    attention head inside the QKV buffer). Each row stride becomes the
    routine's leading dimension, so a slice is read in place, never copied."""
    m, n = out.shape
    k = a.shape[0] if trans_a else a.shape[1]
    item = out.itemsize
    # Fortran arguments are pointers, so every scalar travels in a 1-element array.
    flags = np.array([ord("T") if trans_b else ord("N"), ord("T") if trans_a else ord("N")],
                     np.int8)
    dims = np.array([n, m, k, b.strides[0] // item, a.strides[0] // item,
                     out.strides[0] // item], np.int32)                # n m k ldb lda ldc
    scalars = np.empty(2, out.dtype)
    scalars[0], scalars[1] = alpha, beta
    args = (flags[0:1].ctypes, flags[1:2].ctypes, dims[0:1].ctypes, dims[1:2].ctypes,
            dims[2:3].ctypes, scalars[0:1].ctypes, b.ctypes, dims[3:4].ctypes, a.ctypes,
            dims[4:5].ctypes, scalars[1:2].ctypes, out.ctypes, dims[5:6].ctypes)
    if item == 4:   # float32
        _sgemm(*args)
    else:
        _dgemm(*args)


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
