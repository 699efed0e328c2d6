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


def _run(cache_dir, save):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir))
    done = subprocess.run([sys.executable, "-m", "engine.train", *ARGS, "--save", str(save)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    losses = [(r["loss"], r["grad_norm"], r.get("val_loss")) for r in records if "loss" in r]
    with np.load(save) as z:
        return losses, z["params"].tobytes(), z["adam_v"].tobytes()


def test_a_freshly_compiled_run_and_a_cached_run_agree_bit_for_bit(tmp_path):
    cache = tmp_path / "numba-cache"                      # empty: the first run compiles
    compiled = _run(cache, tmp_path / "first.npz")
    assert any(cache.rglob("*.nbi")), "the first run should have filled the cache"
    cached = _run(cache, tmp_path / "second.npz")         # loads every kernel from it
    assert compiled[0] == cached[0], "losses differ between a compiled and a cached run"
    assert compiled[1] == cached[1], "weights differ between a compiled and a cached run"
    assert compiled[2] == cached[2], "AdamW moments differ between a compiled and a cached run"
