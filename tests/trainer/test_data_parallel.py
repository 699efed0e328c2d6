"""Data parallelism: under `mpiexec -n 2` the losses equal one process's with the
same global batch, and gradient buckets start their all-reduce during the
backward of the last micro-batch only."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARGS = ["--dtype", "float64", "--steps", "4", "--n-layer", "2", "--n-head", "2",
        "--n-embd", "16", "--block-size", "16", "--batch-size", "4", "--grad-accum", "2",
        "--eval-every", "2", "--eval-batches", "1", "--json"]


def _mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else shutil.which("mpiexec")


def _records(stdout):
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_two_processes_give_the_losses_of_one():
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install -e '.[mpi]')")
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec on PATH (pip install -e '.[mpi]' installs MPICH's)")
    one = subprocess.run([sys.executable, "-m", "engine.train", *ARGS], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    two = subprocess.run([mpiexec, "-n", "2", sys.executable, "-m", "engine.train",
                          "--data-parallel", *ARGS], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    single = [r for r in _records(one.stdout) if "loss" in r]
    parallel = [r for r in _records(two.stdout) if "loss" in r]
    assert [r["step"] for r in parallel] == [1, 2, 3, 4], "rank 0 alone prints the steps"
    # float64, global batch 4 x 2 micro-batches either way; only summation order may differ
    for a, b in zip(single, parallel):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-12, abs=0)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-10)
        if "val_loss" in a:
            assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-12)
    ends = [r for r in _records(two.stdout) if r.get("event") == "end"]
    assert len(ends) == 1


def test_buckets_are_reduced_during_the_last_backward_only():
    MPI = pytest.importorskip("mpi4py.MPI", reason="mpi4py is not installed")
    from engine.trainer.model import FusedGPT, gradient_buckets
    from engine.gpt_config import GPTConfig
    from engine.trainer.mpi_job import GradientAllReduce

    cfg = GPTConfig(vocab_size=11, block_size=8, n_layer=3, n_head=2, n_embd=8)
    model = FusedGPT(cfg, 2, dtype=np.float64)
    reducer = GradientAllReduce(MPI.COMM_SELF, model.grads.flat)
    events = []
    original = model._block_backward

    def traced_block_backward(i, *later):
        events.append(("block", i))
        original(i, *later)

    def start(a, b):
        events.append(("reduce", (a, b)))
        reducer.start(a, b)

    model._block_backward = traced_block_backward
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 11, (2, 8)), rng.integers(0, 11, (2, 8))
    model.zero_grad()
    for k in range(3):
        model.forward(x, y, loss_scale=1 / 3)
        model.backward(grad_ready=start if k == 2 else None)
    assert len(reducer.requests) == cfg.n_layer + 2, "non-blocking: nothing waited yet"
    reducer.wait()
    reduces = [e[1] for e in events if e[0] == "reduce"]
    assert reduces == gradient_buckets(model.grads, cfg.n_layer)
    spans = sorted(reduces)
    assert spans[0][0] == 0 and spans[-1][1] == model.grads.flat.size
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), "buckets tile the buffer"
    # block i's bucket starts right after block i's backward, before block i-1's
    last = events[-(2 * cfg.n_layer + 2):]
    assert last[0] == ("reduce", model.grads.span("lnf_"))
    for j, i in enumerate(reversed(range(cfg.n_layer))):
        assert last[1 + 2 * j] == ("block", i)
        assert last[2 + 2 * j] == ("reduce", model.grads.span(f"h{i}."))
