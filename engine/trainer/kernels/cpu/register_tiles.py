"""Small matrix products with the output tile held in vector registers.

Attention multiplies small slices, head by head: a block of 32 query rows
times the keys it can see is 32 x 1024 x 32 at T = 1024 (S = Q K^T). A BLAS
call spends microseconds before its first multiply (argument checks, choosing
a kernel, packing both operands into its own buffers), and with an inner or
outer dimension of 32 its packed panels are mostly edges: at T = 1024 these
tiles run up to twice as fast (README.md#register-tiles). The linear layers' products (1024 x 512 x 128 and alike)
come here too where BLAS's kernels are narrower than these vectors (linear.py
says when).

The tile routine (`_tile_product`) computes an R x (V*W) block of the output,
W being the number of floats in one vector register (16 float32 with
AVX-512, 8 with AVX2). The R*V partial results live in registers for the
whole sum over k; each step of k loads V vectors of one row of b, and
broadcasts R numbers of a, each feeding V fused multiply-adds:

    for k:  b_k = b[k, c0 : c0 + V*W]              (V vector loads)
            for r < R:  acc[r] += a[r0 + r, k] * b_k   (one broadcast, V FMAs)
    out[r0 : r0 + R, c0 : c0 + V*W] = alpha * acc (+ beta * out)

so the output block is written once, after the last k, never re-read inside
the loop (a loop that adds into `out` row by row, as plain numba code does,
does a load and a store for every multiply-add and runs at half the speed).
R*V is ACCUMULATORS: 24 of AVX-512's 32 registers (8 x 3), 12 of AVX2's 16
(4 x 3), which leaves room for the V loads of b and the broadcast, and keeps
at least 8 independent sums in flight (a multiply-add waits about 4 cycles
for its result, and two start every cycle).

The linear layers' products are larger, and their operands are packed
first (`packed_tile_gemm`): each full-width column panel of b is copied
into k * MAX_VECTORS * W numbers in a row, and a transposed a (the weight
gradient x^T dy) tile by tile, its ROWS numbers of each k side by side.
Read in place, a panel's k rows lie a row of b apart, and with rows of 384
or 512 float32 (a multiple of 512 bytes) they fall into a few sets of the
L1 cache and evict each other, so every tile fetched its panel again from
L2; packed, the tiny GPT's products ran about 1.2x faster. Attention's
products are small (k as low as 32), where a copy costs more than it saves,
so `tile_gemm` reads in place (README.md#packed-operands).

The same bits on every CPU with FMA: every output element is one chain of
fused multiply-adds over k in order (then alpha, then beta), whatever R, V
and W are; the loop for the rows and columns no tile covers does the same
arithmetic. Without FMA (see `fast_math.HAS_FMA`) each step is a multiply and
an add. This is the float32 path; float64, which only the gradient checks
run, goes to BLAS's dgemm.

Limits: b and out must have unit stride along their rows (rows of a
C-ordered array, or slices of one); a may be any 2-D view, a transposed one
included (dK = dS^T Q passes ds.T, which reads dS column by column).
There is no `trans_b`: a caller wanting a @ c^T copies c^T first (for
attention, K^T of one head: T * hs numbers against T^2 * hs multiply-adds).
"""
from __future__ import annotations

import platform

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import cfunc, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .llvm_loops import counted_loop
from .blas_gemm import gemm_kernel
from ....fast_math import HAS_FMA, fma
from ....numba_config import kernel, row_kernel, target_has_avx512


def _vector_bytes() -> int:
    """Bytes in one vector register of the CPU numba compiles for."""
    if platform.machine().lower() in ("arm64", "aarch64"):
        return 16
    return 64 if target_has_avx512() else 32


VECTOR_BYTES = _vector_bytes()
# The main tile: ROWS x 3 vectors, 24 accumulators of AVX-512's (and NEON's) 32
# registers, 12 of AVX2's 16, which leaves the 3 loads of b and the broadcast.
# Each row of b loaded is used ROWS times and each number of a broadcast feeds
# 3 multiply-adds. The fastest shape measured (README.md#tile-shape); NEON's is
# chosen by its register count.
ROWS = 4 if VECTOR_BYTES == 32 else 8
MAX_VECTORS = 3                                  # vectors per row of the main tile
ACCUMULATORS = ROWS * MAX_VECTORS
TILE_ROWS = 2 * ROWS    # the tallest tile (one vector wide); every tile's height divides it


def _make_tile_product(rows: int, vectors: int):
    """The tile routine for a rows x (vectors * W) block, as a numba intrinsic
    on raw pointers (element units for every step):

        _tile_product(a, b, out, a0, b0, o0, k, a_rs, a_ks, ldb, ldo, alpha, beta)

    The tile's element (r, kk) of a is a[a0 + r * a_rs + kk * a_ks], so a
    transposed operand is the same routine with its steps swapped; its row kk
    of b starts at b[b0 + kk * ldb], its row r of out at out[o0 + r * ldo].
    beta == 0 never reads out (it may hold garbage)."""

    @intrinsic
    def _tile_product(typingctx, a, b, out, a0, b0, o0, k, a_rs, a_ks, ldb, ldo, alpha, beta):
        if not (isinstance(a, types.CPointer) and a == b == out
                and a.dtype in (types.float32, types.float64)):
            return None
        signature = types.void(a, b, out, *([types.intp] * 8), a.dtype, a.dtype)

        def codegen(context, builder, sig, args):
            (a_ptr, b_ptr, o_ptr, a0_val, b0_val, o0_val, k_val, a_rs_val, a_ks_val, ldb_val,
             ldo_val, alpha_val, beta_val) = args
            element = context.get_value_type(a.dtype)
            item = context.get_abi_sizeof(element)
            width = VECTOR_BYTES // item
            vector = ir.VectorType(element, width)
            intp = a0_val.type
            const = lambda n: ir.Constant(intp, n)  # noqa: E731
            a_rows = [builder.gep(a_ptr, [builder.add(a0_val, builder.mul(const(r), a_rs_val))])
                      for r in range(rows)]
            b_start = builder.gep(b_ptr, [b0_val])
            if HAS_FMA:
                fused = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(vector, [vector] * 3),
                    f"llvm.fma.v{width}f{item * 8}")
                multiply_add = lambda x, y, z: builder.call(fused, [x, y, z])  # noqa: E731
            else:
                multiply_add = lambda x, y, z: builder.fadd(builder.fmul(x, y), z)  # noqa: E731

            def splat(value):
                one = builder.insert_element(ir.Constant(vector, ir.Undefined), value,
                                             ir.Constant(ir.IntType(32), 0))
                return builder.shuffle_vector(
                    one, ir.Constant(vector, ir.Undefined),
                    ir.Constant(ir.VectorType(ir.IntType(32), width), [0] * width))

            zero = ir.Constant(vector, [ir.Constant(element, 0.0)] * width)
            step, accs, close = counted_loop(builder, k_val, [zero] * (rows * vectors), "tile")
            b_row = builder.gep(b_start, [builder.mul(step, ldb_val)])
            b_vecs = [builder.load(builder.bitcast(builder.gep(b_row, [const(v * width)]),
                                                   vector.as_pointer()), align=item)
                      for v in range(vectors)]
            offset = builder.mul(step, a_ks_val)
            new = []
            for r in range(rows):
                a_rk = splat(builder.load(builder.gep(a_rows[r], [offset])))
                new += [multiply_add(a_rk, b_vecs[v], accs[r * vectors + v])
                        for v in range(vectors)]
            close(new)

            alphas, betas = splat(alpha_val), splat(beta_val)
            keep = builder.fcmp_ordered("!=", beta_val, ir.Constant(element, 0.0))
            pointers = [builder.bitcast(builder.gep(o_ptr, [builder.add(builder.add(
                o0_val, builder.mul(const(r), ldo_val)), const(v * width))]),
                vector.as_pointer()) for r in range(rows) for v in range(vectors)]
            scaled = [builder.fmul(alphas, acc) for acc in accs]
            with builder.if_else(keep) as (add_old, overwrite):
                with add_old:
                    for pointer, value in zip(pointers, scaled):
                        old = builder.load(pointer, align=item)
                        builder.store(builder.fadd(value, builder.fmul(betas, old)), pointer,
                                      align=item)
                with overwrite:
                    for pointer, value in zip(pointers, scaled):
                        builder.store(value, pointer, align=item)
            return context.get_dummy_value()

        return signature, codegen

    return _tile_product


# The tile shapes: MAX_VECTORS vectors wide and ROWS tall, then 2 vectors (ROWS
# tall) and 1 (TILE_ROWS tall) for the last columns. Rows and columns no tile
# covers go through `_elements`, one at a time; fewer shapes, less to compile.
_WIDE = _make_tile_product(ROWS, MAX_VECTORS)
_TWO = _make_tile_product(ROWS, 2)
_ONE = _make_tile_product(TILE_ROWS, 1)


@row_kernel
def _elements(a, b, out, r0, r1, c0, c1, k, a_rs, a_ks, ldb, ldo, alpha, beta):
    """out[r0:r1, c0:c1] one element at a time, with the tiles' arithmetic: one
    chain of multiply-adds over k in order, then alpha, then beta."""
    zero = alpha - alpha
    for r in range(r0, r1):
        for c in range(c0, c1):
            acc = zero
            for kk in range(k):
                acc = fma(a[r * a_rs + kk * a_ks], b[kk * ldb + c], acc)
            scaled = alpha * acc
            o = r * ldo + c
            out[o] = scaled + beta * out[o] if beta != 0 else scaled


@row_kernel
def _columns(a, b, out, m, n, c0, k, a_rs, a_ks, ldb, ldo, width, alpha, beta):
    """out[:, c0:] read in place: column blocks of MAX_VECTORS, 2 or 1 vectors,
    each as tall tiles, then what no tile covers, element by element."""
    while n - c0 >= width:
        vectors = MAX_VECTORS if n - c0 >= MAX_VECTORS * width else (
            2 if n - c0 >= 2 * width else 1)
        rows = ROWS if vectors > 1 else TILE_ROWS
        tall_end = m - m % rows
        for r0 in range(0, tall_end, rows):
            a0, o0 = r0 * a_rs, r0 * ldo + c0
            if vectors == MAX_VECTORS:
                _WIDE(a, b, out, a0, c0, o0, k, a_rs, a_ks, ldb, ldo, alpha, beta)
            elif vectors == 2:
                _TWO(a, b, out, a0, c0, o0, k, a_rs, a_ks, ldb, ldo, alpha, beta)
            else:
                _ONE(a, b, out, a0, c0, o0, k, a_rs, a_ks, ldb, ldo, alpha, beta)
        _elements(a, b, out, tall_end, m, c0, c0 + vectors * width, k, a_rs, a_ks, ldb, ldo,
                  alpha, beta)
        c0 += vectors * width
    _elements(a, b, out, 0, m, c0, n, k, a_rs, a_ks, ldb, ldo, alpha, beta)   # last n % W


@row_kernel
def _packed_panels(a, b, out, pack, m, n, k, a_rs, a_ks, ldb, ldo, width, alpha, beta):
    """The full MAX_VECTORS-wide column panels of out from packed copies of the
    operands; returns the first column they leave to `_columns`.

    Read in place, a panel's rows of b lie ldb apart (the module's docstring
    says what that costs); packed, a panel is k * MAX_VECTORS * width numbers in
    a row, in the L1 cache for all the row tiles. A transposed a (a_ks != 1:
    the weight gradient x^T dy) reads its ROWS numbers of one k from rows lda
    apart, the same trap: it is packed too, tile by tile, its ROWS numbers of
    each k side by side. A plain a (ROWS rows, each read in order) is read fast
    in place and not copied. Both copies only move numbers: the same products,
    bit for bit."""
    panel = MAX_VECTORS * width
    panels = n // panel
    for p in range(panels):
        for kk in range(k):
            for j in range(panel):
                pack[(p * k + kk) * panel + j] = b[kk * ldb + p * panel + j]
    tall_end = m - m % ROWS
    a_at = panels * k * panel                   # the packed a follows the panels
    if a_ks != 1:
        for t in range(tall_end // ROWS):
            for kk in range(k):
                for r in range(ROWS):
                    pack[a_at + (t * k + kk) * ROWS + r] = a[(t * ROWS + r) * a_rs + kk * a_ks]
    # The tiles read a from its packed copy (tile t at a_at + t * ROWS * k, ROWS numbers
    # per k) or in place; either way the same numbers in the same order.
    a_src, src_rs, src_ks = (pack, 1, ROWS) if a_ks != 1 else (a, a_rs, a_ks)
    for p in range(panels):
        c0 = p * panel
        for r0 in range(0, tall_end, ROWS):
            a0 = a_at + r0 * k if a_ks != 1 else r0 * a_rs
            _WIDE(a_src, pack, out, a0, p * k * panel, r0 * ldo + c0, k, src_rs, src_ks, panel,
                  ldo, alpha, beta)
        _elements(a, b, out, tall_end, m, c0, c0 + panel, k, a_rs, a_ks, ldb, ldo, alpha, beta)
    return panels * panel


def _tile_gemm_pointers(a, b, out, pack, packed, m, n, k, a_rs, a_ks, ldb, ldo, width, alpha,
                        beta):
    """The product on raw pointers (width: elements per vector); packed != 0:
    pack has room for (m + n) * k numbers and the wide panels are packed."""
    c0 = 0
    if packed:
        c0 = _packed_panels(a, b, out, pack, m, n, k, a_rs, a_ks, ldb, ldo, width, alpha, beta)
    _columns(a, b, out, m, n, c0, k, a_rs, a_ks, ldb, ldo, width, alpha, beta)


# Compiled once, as a C-callable function, at import (from numba's cache after
# the first run), and called by its address, as linear.py calls BLAS: numba
# links the code of a compiled callee into every caller and optimises it again
# there, which cost about a second of the first step per caller. float32 only:
# float64 (the gradient checks, where speed does not matter) goes to BLAS.
_float32_pointer = types.CPointer(types.float32)
_compiled = cfunc(types.void(*([_float32_pointer] * 4), *([types.intp] * 9), types.float32,
                             types.float32), cache=True, nopython=True)(_tile_gemm_pointers)
# LLVM's symbol table is one per process: the name is this module's full name, so
# that each copy of the engine a process imports links its callers to its own tiles.
_SYMBOL = __name__.replace(".", "_") + "_f32"
llvm.add_symbol(_SYMBOL, _compiled.address)
_tile_gemm_f32 = types.ExternalFunction(
    _SYMBOL,
    types.void(*([types.voidptr] * 4), *([types.intp] * 9), types.float32, types.float32))


@row_kernel
def _tiles(a, b, out, alpha, beta, scratch, packed):
    m, n = out.shape
    item = out.itemsize
    _tile_gemm_f32(a.ctypes, b.ctypes, out.ctypes, scratch.ctypes, packed, m, n, a.shape[1],
                   a.strides[0] // item, a.strides[1] // item, b.strides[0] // item,
                   out.strides[0] // item, VECTOR_BYTES // item, np.float32(alpha),
                   np.float32(beta))


def _product(a, b, out, alpha, beta, pack):
    """Typed by dtype when numba compiles a caller (below): float32 calls the
    compiled tiles (pack: None, or scratch for the packed panels), float64 BLAS;
    a caller's code holds only its own path."""


@overload(_product)
def _product_for(a, b, out, alpha, beta, pack):
    if out.dtype == types.float32:
        if isinstance(pack, types.NoneType):
            return lambda a, b, out, alpha, beta, pack: _tiles(a, b, out, alpha, beta, out, 0)

        def packed_tiles(a, b, out, alpha, beta, pack):
            if pack.size < (out.shape[0] + out.shape[1]) * a.shape[1]:
                raise ValueError("packed_tile_gemm: scratch needs (m + n) * k numbers")
            _tiles(a, b, out, alpha, beta, pack, 1)
        return packed_tiles

    def blas(a, b, out, alpha, beta, pack):
        m, n = out.shape
        if m == 0 or n == 0:
            return
        if a.shape[1] == 0:                   # BLAS refuses an empty inner dimension
            for r in range(m):
                for c in range(n):
                    out[r, c] = beta * out[r, c] if beta != 0 else 0.0
        elif a.strides[1] == out.itemsize:
            gemm_kernel(a, b, out, False, False, alpha, beta)
        else:                                 # a transposed view: BLAS reads it transposed
            gemm_kernel(a.T, b, out, True, False, alpha, beta)
    return blas


@kernel
def tile_gemm(a, b, out, alpha, beta):
    """out = alpha a @ b + beta out. a is any 2-D view (pass x.T for x^T: the
    transposed view only swaps the strides); b and out need unit stride along
    their rows (see the module's docstring). float64 goes to BLAS (dgemm),
    which needs a's rows or its columns contiguous."""
    _product(a, b, out, alpha, beta, None)


@kernel
def packed_tile_gemm(a, b, out, alpha, beta, scratch):
    """tile_gemm with the wide panels packed first (`_packed_panels`): for the
    linear layers' products, whose operands are large enough that packing pays.
    scratch: float32, at least (m + n) * k numbers. The same bits as tile_gemm."""
    _product(a, b, out, alpha, beta, scratch)
