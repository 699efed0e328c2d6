"""engine.trainer.compile_ahead: on a cold numba cache, a helper process compiles the
backward's and the optimizer's kernels into the cache while the first forward
compiles; on a warm cache nothing starts. The trainer and the benchmark start it
once they have built their replicas; building replicas alone starts nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine import bench
from engine.trainer import compile_ahead
from engine.trainer.data import Dataset
from engine.trainer.lab import versus_torch
from engine.trainer.parallel import ThreadReplicas
from engine.trainer import train as train_module
from engine.trainer.train import TrainConfig, train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# In a fresh process: build the trainer's model (two replicas), start the helper as
# the trainer does, and report whether one started and how it ended; with "step",
# then run one training step and report, per kernel, whether this process compiled
# it or loaded it from the cache.
PROBE = """
import json, sys
import numpy as np
from engine.gpt_config import GPTConfig
from engine.trainer import compile_ahead
from engine.trainer.kernels import layernorm, adamw
from engine.trainer.thread_plan import plan_threads
from engine.trainer.model import decay_segments
from engine.trainer.optim import AdamW
from engine.trainer.parallel import ThreadReplicas
from engine.trainer.step import accumulate_and_step
cfg = GPTConfig(vocab_size=11, block_size=16, n_layer=1, n_head=2, n_embd=32)
plan_threads(2, 4, 16, "replicas")
model = ThreadReplicas(cfg, 4, 2, attention="flash")
compile_ahead.start_if_cold(model)
out = {"cold": compile_ahead.cache_was_cold(), "helper": compile_ahead.wait_for_helper()}
if sys.argv[1] == "step":
    opt = AdamW(model.params.flat, decay_segments(model.params), lr=1e-3)
    x, y = np.random.default_rng(0).integers(0, 11, (2, 4, 16))
    accumulate_and_step(model, opt, [(x, y)], lr=1e-3, clip=1.0)
    def compiled(kernel):
        return sum(kernel.stats.cache_misses.values())
    out.update(forward=compiled(layernorm.layernorm_forward_kernel.serial),
               backward=compiled(layernorm.layernorm_backward_kernel.serial),
               optimizer=compiled(adamw.adamw_kernel.parallel))
print(json.dumps(out))
"""


def _probe(cache, what, **env_extra):
    env = {k: v for k, v in os.environ.items() if k != "ENGINE_COMPILE_AHEAD"}
    env.update(NUMBA_CACHE_DIR=str(cache), **env_extra)
    done = subprocess.run([sys.executable, "-c", PROBE, what], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_cold_cache_gets_the_later_kernels_from_a_helper_and_a_warm_one_starts_none(tmp_path):
    cache = tmp_path / "numba-cache"                     # empty: cold
    first = _probe(cache, "build")
    assert first["cold"] and first["helper"] == 0        # started, and finished cleanly
    # The helper compiled the backward's and the optimizer's kernels, not the forward's:
    # the next process (warm now, so no helper) loads the former and compiles the latter.
    second = _probe(cache, "step")
    assert not second["cold"] and second["helper"] is None
    assert second["backward"] == 0 and second["optimizer"] == 0
    assert second["forward"] > 0


def test_the_helper_can_be_turned_off(tmp_path):
    off = _probe(tmp_path / "numba-cache", "build", ENGINE_COMPILE_AHEAD="0")
    assert off["cold"] and off["helper"] is None


class _Started(Exception):
    """Raised by a stand-in start_if_cold: the run stops where the helper would start."""


def _stop_at_start(model):
    raise _Started(model)


def test_the_trainer_starts_the_helper_for_the_replicas_it_built(monkeypatch):
    monkeypatch.setattr(train_module, "start_if_cold", _stop_at_start)
    with pytest.raises(_Started) as started:
        train(TrainConfig(steps=1, n_layer=1, n_head=2, n_embd=32, block_size=16,
                          batch_size=4, threads=2, thread_mode="replicas"),
              dataset=Dataset.from_text("def f(x):\n    return x\n" * 40))
    model = started.value.args[0]
    assert isinstance(model, ThreadReplicas) and model.n == 2


def test_the_benchmark_starts_the_helper_for_the_replicas_it_built(monkeypatch):
    from engine.gpt_config import GPTConfig
    monkeypatch.setattr(versus_torch, "start_if_cold", _stop_at_start)
    cfg = GPTConfig(vocab_size=20, block_size=16, n_layer=1, n_head=2, n_embd=16)
    with pytest.raises(_Started) as started:
        bench.run(cfg, 4, steps=1, warmup=0, with_torch=False, threads=2,
                  thread_mode="replicas")
    model = started.value.args[0]
    assert isinstance(model, ThreadReplicas) and model.n == 2


def test_building_replicas_starts_nothing(monkeypatch):
    from engine.gpt_config import GPTConfig
    monkeypatch.setattr(compile_ahead, "start_if_cold", _stop_at_start)
    ThreadReplicas(GPTConfig(vocab_size=11, block_size=16, n_layer=1, n_head=2, n_embd=32),
                   4, 2).close()
