"""Where a step's time goes, kernel by kernel, measured from outside the model.

`KernelProfiler` stands between a model and its kernel registry: while it
is active, every kernel call of the model's first replica goes through it,
is timed, and, when asked, is run once more at once, its data then in the
caches. The model knows nothing of it: FusedGPT._k is a plain registry call,
and the profiler shadows that method on one instance only.
"""
from __future__ import annotations

import functools
import time

import numpy as np

from .. import model as fused_model


def _can_run_twice(name: str, args, kwargs) -> bool:
    """Whether calling kernel `name` again at once changes nothing: every output is
    written, not added into (a matmul without accumulate), and none shares memory
    with an input (the cross-entropy overwrites its logits; GELU's backward may
    write dh over dout). Such a call runs again as it is; any other, on a copy
    of what the first run left (`_run_again`)."""
    spec = fused_model.KERNEL_SPECS[name]
    if name == "crossentropy_softmax" or any(mode != "write" for _, mode in spec.outputs):
        return False
    if kwargs.get("accumulate"):
        return False
    outputs = [v for v in kwargs.values() if isinstance(v, np.ndarray)]
    inputs = [a for a in args if isinstance(a, np.ndarray)]
    return not any(np.may_share_memory(o, i) for o in outputs for i in inputs)


def _run_again(name: str, fn, args, kwargs) -> float:
    """Seconds kernel `name` takes called once more at once, its data then in the
    caches (as far as it fits). A call that adds into an output or overwrites an
    input runs on what the first run left, and every array it was given is put
    back as that first run left it afterwards, so the step keeps its bits. (The
    copy taken first touches all those arrays, which is the point: the second
    run finds them in the caches.) A read-only array (a batch of token ids, say)
    cannot have changed, and is left alone."""
    arrays = [] if _can_run_twice(name, args, kwargs) else [
        v for v in (*args, *kwargs.values()) if isinstance(v, np.ndarray) and v.flags.writeable]
    left = [a.copy() for a in arrays]
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    seconds = time.perf_counter() - t0
    for a, kept in zip(arrays, left):
        a[...] = kept
    return seconds


class KernelProfiler:
    """`with KernelProfiler(model) as prof:` times every kernel call of the model
    (a FusedGPT, or replica 0 of ThreadReplicas) while the block runs.

    prof.seconds: kernel name -> seconds over all its calls. With again=True,
    prof.again: name -> [seconds as called, seconds run again at once]
    (`_run_again`). The calls run on the model's own thread, as without the
    profiler. It wraps the model's `_k`, whatever that calls, so it times any
    version of the trainer (tools/ab_steps.py profiles an older tree's models
    with it)."""

    def __init__(self, model, again: bool = False):
        self.target = getattr(model, "replicas", [model])[0]
        self.seconds: dict[str, float] = {}
        self.again: dict[str, list[float]] | None = {} if again else None
        self._call = None             # the model's own kernel call, while profiled

    def _timed(self, name: str, *args, **kwargs):
        fn = functools.partial(self._call, name)
        t0 = time.perf_counter()
        result = fn(*args, **kwargs)
        t1 = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + t1 - t0
        if self.again is not None:
            pair = self.again.setdefault(name, [0.0, 0.0])
            pair[0] += t1 - t0
            pair[1] += _run_again(name, fn, args, kwargs)
        return result

    def __enter__(self):
        self._call = self.target._k
        self.target._k = self._timed          # shadows FusedGPT._k on this instance
        return self

    def __exit__(self, *exc):
        del self.target._k
        self._call = None


def _profiled_steps(ours, steps, warmup) -> tuple[int, float]:
    """Run the profiling passes' steps (a quarter of --steps, at least 3, on the
    warm-up batches); returns (how many, seconds per step)."""
    n_prof = max(3, steps // 4)
    t0 = time.perf_counter()
    for i in range(n_prof):
        ours(1 + i % warmup if warmup else 0)
    return n_prof, (time.perf_counter() - t0) / n_prof


def profile_kernels(model, ours, phase_s, steps, warmup) -> dict:
    """Per-kernel ms over separate steps (timing each call costs a little), and
    where the rest of the step went: per_kernel_ms, profiled_step_ms,
    outside_kernels_ms and matmul_ms (the linear layers' products)."""
    for key in phase_s:
        phase_s[key] = 0.0
    with KernelProfiler(model) as prof:
        n_prof, prof_wall = _profiled_steps(ours, steps, warmup)
    per_kernel = {k: v / n_prof * 1e3 for k, v in
                  sorted(prof.seconds.items(), key=lambda kv: -kv[1])}
    kernels_ms = sum(per_kernel.values())
    phases = {k: v / n_prof * 1e3 for k, v in phase_s.items()}
    rest = {"replica 0: Python between kernels": phases["replica 0 forward+backward"]
            - kernels_ms,
            "waiting for the other replicas, summing their gradients":
                phases["all replicas forward+backward"] - phases["replica 0 forward+backward"],
            "clip + AdamW": phases["clip + AdamW"]}
    return {"per_kernel_ms": per_kernel, "profiled_step_ms": prof_wall * 1e3,
            "outside_kernels_ms": rest,
            "matmul_ms": per_kernel.get("matmul", 0.0) + per_kernel.get("linear_forward", 0.0)}


def profile_again(model, ours, steps, warmup) -> dict:
    """Per kernel, over all its calls: ms as called in the step and ms run again
    at once, its data then in the caches (`_run_again`). A pass of its own:
    the second runs warm the caches for the next kernel."""
    with KernelProfiler(model, again=True) as prof:
        n_prof, _ = _profiled_steps(ours, steps, warmup)
    return {name: {"as_called_ms": first / n_prof * 1e3, "again_ms": second / n_prof * 1e3}
            for name, (first, second) in sorted(prof.again.items(), key=lambda kv: -kv[1][0])}


def cached_step_ms(r: dict) -> tuple[float, float, float]:
    """(ms of the profiled calls as called, ms again at once, the median step less
    the difference): about what a step would take if every kernel found its data
    in the caches and the time outside the kernels stayed as it is."""
    called = sum(t["as_called_ms"] for t in r["again_ms"].values())
    warm = sum(t["again_ms"] for t in r["again_ms"].values())
    return called, warm, r["ours"]["ms_per_step"] - (called - warm)
