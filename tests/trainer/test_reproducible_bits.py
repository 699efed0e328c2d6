"""The first run on a machine (every kernel freshly compiled) and a later run (the
kernels loaded from numba's on-disk cache) give the same bits: the losses of
every step and the saved weights. Without this, a first run stopped and
resumed would not continue bit for bit."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARGS = ["--steps", "3", "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size",
        "32", "--batch-size", "4", "--eval-every", "3", "--eval-batches", "1", "--threads", "1",
        "--json"]


def _run(cache_dir, save, host_cpu=False, **env_extra):
    env = {k: v for k, v in os.environ.items() if not (host_cpu and k.startswith("NUMBA_CPU_"))}
    env.update(NUMBA_CACHE_DIR=str(cache_dir), **env_extra)
    done = subprocess.run([sys.executable, "-m", "engine.train", *ARGS, "--save", str(save)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    losses = [(r["loss"], r["grad_norm"], r.get("val_loss")) for r in records if "loss" in r]
    with np.load(save) as z:
        return losses, z["params"].tobytes(), z["adam_v"].tobytes()


def test_a_freshly_compiled_run_and_a_cached_run_agree_bit_for_bit(tmp_path):
    cache = tmp_path / "numba-cache"                      # empty: the first run compiles
    # no helper compiling ahead (compile_ahead.py): every kernel of this run compiles here
    compiled = _run(cache, tmp_path / "first.npz", ENGINE_COMPILE_AHEAD="0")
    assert any(cache.rglob("*.nbi")), "the first run should have filled the cache"
    cached = _run(cache, tmp_path / "second.npz")         # loads every kernel from it
    assert compiled[0] == cached[0], "losses differ between a compiled and a cached run"
    assert compiled[1] == cached[1], "weights differ between a compiled and a cached run"
    assert compiled[2] == cached[2], "AdamW moments differ between a compiled and a cached run"


def _host_features():
    done = subprocess.run([sys.executable, "-c", "import llvmlite.binding as ll; "
                           "print(ll.get_host_cpu_features().flatten())"],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_full_width_vectors_give_the_same_bits(tmp_path):
    """engine.numba_config lets LLVM use 512-bit vectors where the CPU has them;
    a run with LLVM's own choice (256 bits on AVX-512 server CPUs: the host's
    features as they are) gives the same bits. Both runs compile for this
    machine's own CPU, whatever CPU the test run chose (CI's AVX2 run sets
    NUMBA_CPU_NAME); on a CPU without AVX-512 the two compile alike."""
    ours = _run(tmp_path / "full", tmp_path / "full.npz", host_cpu=True)
    llvm_choice = _run(tmp_path / "llvm", tmp_path / "llvm.npz", host_cpu=True,
                       NUMBA_CPU_FEATURES=_host_features())
    assert ours == llvm_choice, "the vector width changed the results"


def test_the_vector_setting_respects_a_chosen_cpu():
    code = ("import os, engine, numba; from engine import numba_config; "
            "print(os.environ.get('NUMBA_CPU_FEATURES', ''))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU_")}
    chosen = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, env=dict(env, NUMBA_CPU_NAME="haswell"), check=True)
    assert chosen.stdout.strip() == "", "a chosen CPU must keep its own features"
    default = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                             text=True, env=env, check=True)
    if "+avx512f" in _host_features().split(","):
        assert default.stdout.strip().endswith(",-prefer-256-bit")
    else:
        assert default.stdout.strip() == ""
