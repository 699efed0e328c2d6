"""Which code runs the trainer's matrix products (engine.trainer.kernels.linear).

`gemm` calls BLAS, except where the engine's register tiles have wider
vectors than the BLAS's kernels (OpenBLAS held to its 256-bit Haswell kernels
on a CPU numba compiles AVX-512 code for): there a one-thread float32 product
whose output the tiles cover whole goes to the tiles. Checked here: the rule,
the kernels' widths as OpenBLAS names them, that each route computes every
flag combination right, that the route taken is the one the rule names (a
spy on the tiles), and, in fresh processes, that OPENBLAS_CORETYPE's kernels
decide it on this machine."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from engine.blas import openblas_kernel_bits
from engine.timing import fixed_threads
from engine.trainer.kernels import linear
from engine.trainer.kernels.cpu.register_tiles import TILE_ROWS, VECTOR_BYTES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLUMNS = VECTOR_BYTES // 4


def test_tiles_only_where_their_vectors_are_wider():
    assert linear.tiles_are_wider(256, 512)
    assert not linear.tiles_are_wider(512, 512)
    assert not linear.tiles_are_wider(256, 256)
    assert not linear.tiles_are_wider(None, 512)       # MKL: kernels chosen at run time


@pytest.mark.parametrize("core,bits", [("Haswell", 256), ("Zen", 256), ("SkylakeX", 512),
                                       ("Cooperlake", 512), ("SapphireRapids", 512),
                                       ("Nehalem", 128), ("NeoverseN1", None), ("", None)])
def test_openblas_kernel_widths(core, bits):
    assert openblas_kernel_bits(core) == bits


@pytest.fixture
def tile_spy(monkeypatch):
    """Route every product the rule allows to the tiles, and count the calls."""
    calls = []
    real = linear.packed_tile_gemm

    def spy(*args):
        calls.append(args[2].shape)
        return real(*args)
    monkeypatch.setattr(linear, "TILES_FOR_PRODUCTS", True)
    monkeypatch.setattr(linear, "packed_tile_gemm", spy)
    return calls


@pytest.mark.parametrize("k", [37, 2 * linear.TILE_K + 5])     # one block of k, and three
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("accumulate", [False, True])
def test_the_tile_route_computes_every_flag_combination(tile_spy, trans_a, trans_b, accumulate,
                                                        k):
    m, n = 2 * TILE_ROWS, 3 * COLUMNS
    blocks = -(-k // linear.TILE_K)
    rng = np.random.default_rng(7)
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    out = rng.standard_normal((m, n)).astype(np.float32)
    want = ((a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b).astype(np.float64)
            + (out if accumulate else 0.0))
    with fixed_threads(1):
        linear.gemm(a, b, out, trans_a=trans_a, trans_b=trans_b, accumulate=accumulate)
    assert tile_spy == [(m, n)] * blocks, "a covered one-thread float32 product did not go to " \
                                         "the tiles, one call per block of k"
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("why,m,n,dtype,threads", [
    ("rows not a multiple of the tile's", TILE_ROWS + 3, COLUMNS, np.float32, 1),
    ("columns not a multiple of a vector", TILE_ROWS, COLUMNS + 7, np.float32, 1),
    ("float64 (the gradient checks)", TILE_ROWS, COLUMNS, np.float64, 1),
    ("two threads (BLAS's threads split it)", TILE_ROWS, COLUMNS, np.float32, 2),
])
def test_blas_keeps_what_the_tiles_do_not_cover(tile_spy, why, m, n, dtype, threads):
    import numba
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip("one core: no second thread to split a product")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((m, 20)).astype(dtype)
    b = rng.standard_normal((20, n)).astype(dtype)
    out = np.empty((m, n), dtype)
    with fixed_threads(threads):
        linear.gemm(a, b, out)
    assert tile_spy == [], f"{why}: went to the tiles"
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5,
                               atol=1e-4)


def _one_thread_step(model, x, y):
    model.zero_grad()
    loss = model.forward(x, y)
    model.backward()
    return loss, model.grads.flat.copy()


def test_a_model_on_the_tiles_learns_what_it_learns_on_blas(monkeypatch):
    """The whole model, one thread, both routes: the same loss and gradients to float32
    rounding, whichever route this machine takes by itself."""
    from engine.gpt_config import GPTConfig
    from engine.trainer.model import FusedGPT
    cfg = GPTConfig(vocab_size=40, block_size=32, n_layer=2, n_head=2, n_embd=32)
    rng = np.random.default_rng(5)
    x, y = (rng.integers(0, cfg.vocab_size, (4, cfg.block_size)) for _ in range(2))
    model = FusedGPT(cfg, 4, seed=3)
    calls = []
    real = linear.packed_tile_gemm
    monkeypatch.setattr(linear, "packed_tile_gemm", lambda *a: (calls.append(1), real(*a)))
    results = {}
    with fixed_threads(1):
        for tiles in (False, True):
            monkeypatch.setattr(linear, "TILES_FOR_PRODUCTS", tiles)
            results[tiles] = _one_thread_step(model, x, y)
    assert calls, "no product went to the tiles"
    assert results[True][0] == pytest.approx(results[False][0], rel=1e-6)
    np.testing.assert_allclose(results[True][1], results[False][1], rtol=1e-4, atol=1e-7)


def test_a_step_on_the_tiles_allocates_no_arrays(monkeypatch):
    """w^T for dx and the tiles' packed operands go into buffers the thread keeps, so
    after the first step a step on the tile route allocates no more than one on BLAS
    (see test_gpt_model)."""
    from engine.gpt_config import GPTConfig
    from engine.trainer.model import FusedGPT

    from .reference import step_allocation_bytes
    cfg = GPTConfig(vocab_size=30, block_size=32, n_layer=2, n_head=2, n_embd=64)
    rng = np.random.default_rng(6)
    x, y = (rng.integers(0, cfg.vocab_size, (8, cfg.block_size)) for _ in range(2))
    model = FusedGPT(cfg, 8)
    monkeypatch.setattr(linear, "TILES_FOR_PRODUCTS", True)
    with fixed_threads(1):
        peak = step_allocation_bytes(model, x, y)
    # one copy of the largest weight (64 x 256 float32) would be 64 KiB
    assert peak < 32 * 1024, f"a step on the tiles allocated {peak} bytes"


def test_the_mfu_peak_is_measured_on_the_route_the_trainer_takes(tile_spy):
    """lab.machine.product_peak_flops (lesson 13's MFU peak) times the trainer's own
    products, every core its share of rows: on the tiles when they are the route."""
    from engine.trainer.lab.machine import product_peak_flops
    from engine.trainer.kernels.threads import cores
    m = TILE_ROWS * cores()
    rate = product_peak_flops(m, 24, 2 * COLUMNS, repeats=2)
    assert 1e6 < rate < 1e14                     # FLOP/s
    assert tile_spy and set(tile_spy) == {(TILE_ROWS, 2 * COLUMNS)}


_PROBE = """
import json
from engine.blas import library
from engine.trainer.kernels import linear
from engine.trainer.kernels.cpu.register_tiles import VECTOR_BYTES
print(json.dumps({"description": library().description, "bits": library().kernel_bits,
                  "tiles": linear.TILES_FOR_PRODUCTS, "routes": linear.product_routes(),
                  "tile_bits": VECTOR_BYTES * 8}))
"""


@pytest.mark.parametrize("core,bits", [("Haswell", 256), ("SkylakeX", 512)])
def test_openblas_kernels_named_in_the_environment_decide_the_route(core, bits):
    """OPENBLAS_CORETYPE=Haswell: 256-bit kernels, so the tiles take the covered
    products exactly when numba compiles 512-bit code here; SkylakeX (on a CPU
    that runs it): BLAS keeps them all."""
    env = dict(os.environ, OPENBLAS_CORETYPE=core, ENGINE_BLAS="openblas")
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    if f"{core} kernels" not in got["description"]:
        # OpenBLAS refuses kernels the CPU cannot run (SkylakeX without AVX-512)
        assert core == "SkylakeX" and got["tile_bits"] < 512, got
        return
    assert got["bits"] == bits
    assert got["tiles"] == (got["tile_bits"] > bits)
    assert ("register tiles" in got["routes"]) == got["tiles"]
