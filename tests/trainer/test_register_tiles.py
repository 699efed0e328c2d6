"""register_tiles.tile_gemm: the products attention runs (float32 in registers,
float64 through BLAS).

Checked against float64 numpy for every tile shape the driver picks (full
tiles, narrower column tiles, and one element at a time for the rows and
columns no tile covers), with a transposed and a strided left operand,
and for the promise the module makes: every element is the same chain of
multiply-adds whichever tile computed it, so its bits do not depend on where
it sits in the output."""
from __future__ import annotations

import numpy as np
import pytest

from engine.trainer.kernels.cpu.register_tiles import (ACCUMULATORS, MAX_VECTORS, ROWS, TILE_ROWS,
                                                   VECTOR_BYTES, packed_tile_gemm, tile_gemm)


def op(a, trans_a):
    return a.T if trans_a else a


def _operands(rng, m, n, k, trans_a, dtype):
    # a is a strided view into a wider array, as a head's slice of the QKV buffer is
    wide = rng.standard_normal((max(m, k) + 3, 3 * max(m, k) + 5)).astype(dtype)
    a = wide[:k, 2:2 + m] if trans_a else wide[:m, 2:2 + k]
    b = rng.standard_normal((k, n)).astype(dtype)
    return a, b


SHAPES = [(64, 128, 32), (64, 32, 128), (17, 70, 9), (5, 3, 4), (1, 1, 1), (3, 0, 2), (4, 16, 0)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_tile_gemm_equals_numpy(m, n, k, trans_a, dtype):
    rng = np.random.default_rng(m * 100 + n + k)
    a, b = _operands(rng, m, n, k, trans_a, dtype)
    want = (a.T if trans_a else a).astype(np.float64) @ b.astype(np.float64)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    scale = max(1.0, np.abs(want).max()) if want.size else 1.0

    out = np.full((m, n), np.nan, dtype)               # beta = 0 must not read out
    tile_gemm(op(a, trans_a), b, out, 0.5, 0.0)
    assert np.abs(out - 0.5 * want).max(initial=0) / scale < tol

    start = rng.standard_normal((m, n)).astype(dtype)  # beta = 1 adds into it
    out = start.copy()
    tile_gemm(op(a, trans_a), b, out, 1.0, 1.0)
    assert np.abs(out - (start + want)).max(initial=0) / scale < tol


def test_the_main_tile_fits_the_register_file():
    """The accumulators, the vectors of b loaded at each step of k and the one
    broadcast number of a all live in registers: one more and the compiler spills
    accumulators to memory in the inner loop (8 x 4 tiles with AVX-512 ran about 1.4x
    slower than 8 x 3). And every tile's height divides TILE_ROWS, the rows the
    linear layers' route asks for."""
    registers = 16 if VECTOR_BYTES == 32 else 32        # AVX2; AVX-512 and NEON
    assert ACCUMULATORS == ROWS * MAX_VECTORS
    assert ACCUMULATORS + MAX_VECTORS + 1 <= registers
    assert TILE_ROWS % ROWS == 0


def test_an_element_has_the_same_bits_wherever_it_sits():
    """float32: column j computed in a full tile, in a narrower tile and one
    element at a time, and row i in a tile and on its own: the same bits.
    (float64 goes to BLAS.)"""
    dtype = np.float32
    rng = np.random.default_rng(3)
    width = VECTOR_BYTES // np.dtype(dtype).itemsize
    n = MAX_VECTORS * width + width + 3                # full tile, narrow tile, 3 scalar columns
    m, k = 19, 37                                      # rows in tiles, then rows alone
    a, b = _operands(rng, m, n, k, False, dtype)
    out = np.empty((m, n), dtype)
    tile_gemm(a, b, out, 1.0, 0.0)
    for j in (0, MAX_VECTORS * width, n - 1):          # each kind of column, moved to the others
        for j_to in (0, MAX_VECTORS * width, n - 1):
            order = np.arange(n)
            order[j], order[j_to] = j_to, j
            moved = np.empty((m, n), dtype)
            tile_gemm(a, np.ascontiguousarray(b[:, order]), moved, 1.0, 0.0)
            assert np.array_equal(moved[:, j_to], out[:, j])
    flipped = np.empty((m, n), dtype)                  # the last row first: a tall tile's row
    tile_gemm(np.ascontiguousarray(a[::-1]), b, flipped, 1.0, 0.0)
    assert np.array_equal(flipped[::-1], out)


PANEL = MAX_VECTORS * VECTOR_BYTES // 4                # float32 columns of one packed panel


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("m,n,k", [
    (1024, 3 * PANEL, 128),          # panels only, rows in whole tiles: packed end to end
    (64, 2 * PANEL + 8, 70),         # a narrower tile after the panels
    (ROWS * 5 + 3, PANEL + 11, 33),  # rows no tile covers, columns one at a time
    (ROWS, PANEL, 1),                # one tile
    (2 * ROWS, PANEL - 8, 9),        # no whole panel: nothing to pack
    (3, 2 * PANEL, 5),               # fewer rows than a tile
])
def test_packed_tiles_give_the_same_bits(m, n, k, trans_a):
    """The packed route (the linear layers') only moves numbers before the same
    tiles run: its products equal the in-place route's bit for bit, with beta 0
    (out not read) and beta 1, for a plain and a transposed left operand."""
    rng = np.random.default_rng(m + n + k)
    a, b = _operands(rng, m, n, k, trans_a, np.float32)
    scratch = np.full((m + n) * k, np.nan, np.float32)
    for alpha, beta in ((0.5, 0.0), (1.0, 1.0)):
        start = rng.standard_normal((m, n)).astype(np.float32)
        here, packed = start.copy(), start.copy()
        tile_gemm(op(a, trans_a), b, here, alpha, beta)
        packed_tile_gemm(op(a, trans_a), b, packed, alpha, beta, scratch)
        assert np.array_equal(packed, here)


def test_packed_tiles_refuse_scratch_too_small():
    a = np.ones((8, 4), np.float32)
    b = np.ones((4, PANEL), np.float32)
    out = np.empty((8, PANEL), np.float32)
    with pytest.raises(ValueError, match=r"\(m \+ n\) \* k"):
        packed_tile_gemm(a, b, out, 1.0, 0.0, np.empty((8 + PANEL) * 4 - 1, np.float32))


def test_an_avx2_build_gives_the_same_bits(tmp_path):
    """The same product compiled for an AVX2 CPU (NUMBA_CPU_NAME=haswell: 8-float
    vectors, 4 x 16 tiles) and for this one: the same bits, as the module
    promises for every CPU with fused multiply-adds."""
    import os
    import subprocess
    import sys
    from engine.fast_math import HAS_FMA
    if not HAS_FMA:
        pytest.skip("this CPU has no fused multiply-add: its products are rounded twice")
    rng = np.random.default_rng(5)
    a, b = _operands(rng, 37, 70, 45, True, np.float32)
    np.save(tmp_path / "a.npy", np.ascontiguousarray(a))
    np.save(tmp_path / "b.npy", b)
    script = (
        "import sys, numpy as np\n"
        "from engine.trainer.kernels.cpu.register_tiles import VECTOR_BYTES, tile_gemm\n"
        "assert VECTOR_BYTES == 32, VECTOR_BYTES\n"
        "folder = sys.argv[1]\n"
        "a, b = np.load(folder + '/a.npy'), np.load(folder + '/b.npy')\n"
        "out = np.empty((a.shape[1], b.shape[1]), np.float32)\n"
        "tile_gemm(a.T, b, out, 0.5, 0.0)\n"
        "np.save(folder + '/out.npy', out)\n")
    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("NUMBA_CPU_FEATURES", None)
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, check=True,
                   cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    here = np.empty((a.shape[1], b.shape[1]), np.float32)
    tile_gemm(np.load(tmp_path / "a.npy").T, b, here, 0.5, 0.0)
    assert np.array_equal(np.load(tmp_path / "out.npy"), here)
