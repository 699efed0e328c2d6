"""One BLAS call from compiled code: out = alpha op(a) @ op(b) + beta out.

The Fortran `sgemm`/`dgemm` of the library engine.blas chooses (SciPy's
OpenBLAS, or Intel's MKL where it is installed on an Intel CPU), called by
address from a numba function compiled with nogil, outside any `prange`:
BLAS runs its own threads, and nesting them inside numba's would put two
threads on every core.

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

from ....blas import library as blas_library
from ....numba_config import kernel

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
