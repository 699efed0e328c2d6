"""A cold first step on two cores: the later kernels compiled ahead, in a helper process.

With an empty numba cache the first training step compiles every kernel it
calls, in the order it calls them, and on one core at a time: numba
compiles under one lock per process, so while replica 0 compiles, replica 1
waits: the forward's compiles, then the backward's, then the optimizer's
(AdamW and the gradient norm, in their multi-threaded builds), about 40%, 35%
and 25% of the whole (kernels/cpu/README.md#a-cold-first-step).

The backward's kernels and the optimizer's depend on the types of their
arguments, not on the forward's results. So when the cache is cold, one
helper process compiles them while the first forward compiles, on the core
the waiting replica leaves idle, and writes them to numba's on-disk cache:
the trainer and the benchmark call `start_if_cold(model)` once they have
built their replicas. The trainer's process checks that cache at each
kernel's first call and loads what the helper has finished, so it compiles
only what the helper has not reached yet.

The helper's order is chosen against the trainer's: first what the trainer
needs last (the optimizer), then the longest compile of the backward
(attention's), then the rest of the backward in the model's own order;
the trainer meanwhile compiles the backward from its start, and the two
meet without waiting for each other.

* Started only when the cache is cold: `register_tiles`' compiled product
  was compiled at import rather than loaded (an empty cache, or one
  drop_stale_caches emptied after an engine source changed). Warm, nothing
  starts; ENGINE_COMPILE_AHEAD=0 turns the helper off.
* Compiled for the same machine code: the helper inherits this process's
  environment (NUMBA_CPU_FEATURES, NUMBA_CACHE_DIR, ENGINE_BLAS), and runs
  the kernels on the same thread plan (one numba thread for a replica's
  kernels, several for the optimizer's).
* Changes no result: a kernel loaded from the cache is the code a compile
  produces (no fast-math, see engine.numba_config), and if the helper is
  slow or fails, the trainer compiles what it does not find, as before.
  The helper writes nothing but numba's cache files.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading

import numba
import numpy as np

from .child_process import start_python

_lock = threading.Lock()
_helper: subprocess.Popen | None = None


def cache_was_cold() -> bool:
    """Whether this process compiled the engine's tile product at import instead
    of loading it from numba's cache: the cache was empty or dropped."""
    from .kernels.cpu.register_tiles import _compiled
    return _compiled.cache_hits == 0


def start_if_cold(model) -> subprocess.Popen | None:
    """Start the helper (once per process) when the cache is cold; returns it,
    or None when nothing started. `model`: the ThreadReplicas whose first step
    comes next, built on the thread plan that step runs on (its optimizer gets
    this thread's numba threads; several replicas run their kernels on one
    numba thread each)."""
    global _helper
    first = model.replicas[0]
    with _lock:
        if (_helper is not None or os.environ.get("ENGINE_COMPILE_AHEAD") == "0"
                or not cache_was_cold()):
            return None
        plan = {"config": model.cfg.to_dict(), "seq_len": int(first.T),
                "replicas": model.n > 1, "attention": first.attention,
                "dtype": np.dtype(first.dtype).name, "checkpointing": bool(first.checkpointing),
                "threads": int(numba.get_num_threads())}
        _helper = start_python(
            "import sys; from engine.trainer.compile_ahead import compile_later_kernels as c; "
            "c(sys.argv[1])", json.dumps(plan),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return _helper


def compile_later_kernels(plan_json: str) -> None:
    """The helper: run the optimizer's kernels and a backward on a throwaway
    one-row model of the same layout, so numba compiles them into its cache."""
    from ..gpt_config import GPTConfig
    from .kernels.threads import one_numba_thread, set_threads
    from .model import FusedGPT, decay_segments
    from .optim import AdamW, global_norm
    from . import kernels as fused
    plan = json.loads(plan_json)
    cfg, dtype = GPTConfig(**plan["config"]), np.dtype(plan["dtype"])
    set_threads(plan["threads"], blas=1 if plan["replicas"] else None)
    model = FusedGPT(cfg, 1, seq_len=plan["seq_len"], dtype=dtype, attention=plan["attention"],
                     checkpointing=plan["checkpointing"])
    # 1. the optimizer, on the threads the trainer gives it
    global_norm(model.grads.flat)
    AdamW(model.params.flat, decay_segments(model.params)).step(model.grads.flat, lr=0.0)
    kernels_on = one_numba_thread if plan["replicas"] else contextlib.nullcontext
    with kernels_on():
        a, A = model.acts, model.acts.layer(0)
        # 2. attention's backward, the longest compile of the backward
        if model.attention == "flash":
            fused.flash_attention_backward(a.datty, A.qkv, A.atty, A.lse, dqkv=a.dqkv)
        else:
            fused.attention_backward(a.datty, A.qkv, A.probs, dqkv=a.dqkv)
        # 3. the whole backward, without a forward (the forward's kernels are the
        #    trainer's own to compile; the backward's inputs are whatever the
        #    buffers hold)
        model._ids = np.zeros((1, model.T), np.int64)
        model.backward()


def wait_for_helper() -> int | None:
    """Wait until the helper, if one started, has finished; its exit code (None:
    none started). The benchmark waits before it times steps, so that the
    helper's compiling never runs beside them."""
    with _lock:
        helper = _helper
    return None if helper is None else helper.wait()
