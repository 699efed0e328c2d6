"""How fast is the fused trainer? `python -m engine.bench --help`.

    python -m engine.bench                      # the tiny config, in detail
    python -m engine.bench --shapes             # one table: tiny, T512, T1024, wide
    python -m engine.bench --shapes tiny T=256,B=8 --attention flash

Measures, in one run (per shape, with --shapes):

* compile: the first step (numba compiles each kernel, or loads it from the
  on-disk cache), reported apart from the steady state;
* ms/step and tokens/s: median and quartiles over --steps training steps
  (forward, backward, clipping, AdamW) after --warmup steps;
* PyTorch eager, when it is installed: the same model with the same initial
  weights and batches, in a process of its own (torch_twin.py says why),
  and the largest relative difference between the two first-step
  gradients. The method, for a shared machine that may slow
  either side at any moment: first --alone-steps steps of ours in a row,
  then as many of PyTorch's (the standalone figures); then --steps steps of
  each in alternating blocks of --block steps, ours first in even rounds,
  PyTorch first in odd ones (both orders; blocks rather than single steps,
  so that neither side starts each step with cold caches and thread
  pools). The paired ratio is the median over rounds of (PyTorch's block
  median / ours), with its range;
* GFLOP/s of the step, its share of the machine's sgemm rate (a 1024^3
  product through the engine's BLAS on all cores, measured right after; where
  OPENBLAS_CORETYPE holds OpenBLAS to other kernels than it would pick for the
  CPU, also the rate of its own pick, from a child process without the
  variable), and the linear layers' matrix products against the same
  products run alone;
* where the time goes, kernel by kernel, and outside the kernels (Python
  between kernels, replicas waiting for each other and summing gradients,
  clipping and AdamW); then, in a pass of its own, every call timed as
  called and once more at once: what the call pays for finding its data
  where the rest of the step left it, against its data in the caches (a call
  that adds into an output or overwrites an input runs again on what the first
  run left, and is then put back as the first run left it), and the median
  step less what all calls pay that way;
* memory: how fast one core writes (ordinary and streaming stores) and reads
  a buffer past the caches, and the step's cores all at once (memory_rates.py),
  and what writing the kept activations once and reading them back once costs
  each core at its share of the latter;
* activation_bytes: the bytes of the buffers the step keeps from forward to
  backward (all replicas), attention's share apart (--attention chooses the
  kernel: standard keeps (B, H, T, T) probabilities, flash (B, H, T) numbers).

`--sweep-attention` measures instead, for each sequence length, the saved
bytes and forward+backward ms of both our attention kernels and of PyTorch's
scaled_dot_product_attention in the same model, in one run.

Timings on a shared machine are noisy; medians and same-run ratios are the
numbers to quote, with the machine's load. Nothing here is a test: it
reports, it does not judge.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...gpt_config import GPTConfig, init_params
from ...timing import timed_steps
from ..compile_ahead import start_if_cold, wait_for_helper
from ..model import activation_bytes
from .first_step import first_step
from .machine import measure_machine, sgemm_rate
from .profile import profile_again, profile_kernels
from .torch_twin import TorchTwin, torch_missing


def _median_ms(times):
    return float(np.median(times)) * 1e3


@dataclass(frozen=True)
class _Plan:
    """One benchmark run: run's arguments, with the threads planned and the
    defaults that depend on PyTorch settled."""
    cfg: GPTConfig
    batch_size: int
    steps: int
    warmup: int
    alone: int                # steps of each side alone first (0 without PyTorch)
    block: int
    seed: int
    attention: str
    torch_attention: str
    torch_reason: str | None  # why PyTorch is left out; None when it runs
    threads: int
    thread_mode: str
    replicas: int
    thread_info: dict

    def setup(self) -> dict:
        """The report's "config": the shape and how the step ran."""
        info = self.thread_info
        return {**self.cfg.to_dict(), "batch_size": self.batch_size, "dtype": "float32",
                "threads": self.threads, "thread_mode": self.thread_mode,
                "replicas": self.replicas, "attention": self.attention,
                "thread_plan": info["plan"].describe(),
                "kernel_threads": info["numba"], "blas_threads": info["blas"],
                "blas": info["blas_library"], "products": info["products"],
                "block": self.block}


def run(cfg: GPTConfig, batch_size: int, *, steps: int = 20, warmup: int = 3,
        with_torch: bool = True, torch_attention: str = "sdpa", threads: int | None = None,
        thread_mode: str | None = None, seed: int = 0, data=None, progress=None,
        attention: str = "standard", block: int = 4, alone: int | None = None) -> dict:
    """Benchmark the fused trainer (and PyTorch eager when available); returns a report dict.

    Timing method (a shared machine slows either side at any moment):
    `alone` steps of ours in a row, then as many of PyTorch's (default
    steps // 2; the standalone figures), then `steps` steps of each in
    alternating blocks of `block` steps, ours first in even rounds and
    PyTorch first in odd ones (both orders; a block rather than single steps,
    so neither side's thread pools and caches are cold at every step). The
    paired ratio is the median over rounds of (PyTorch block median / our
    block median); every median comes with its quartiles."""
    from ..kernels.threads import cores, restore_threads
    from ..thread_plan import block_matmul_weights, plan_threads
    say = progress or (lambda line: None)
    torch_reason = torch_missing() if with_torch else "disabled with --no-torch"
    if torch_reason is not None:
        alone = 0
    elif alone is None:
        alone = max(1, steps // 2)
    n_threads = threads or cores()
    thread_mode, replicas, thread_info = plan_threads(
        n_threads, batch_size, cfg.block_size, thread_mode,
        block_weights=block_matmul_weights(cfg.n_layer, cfg.n_embd))
    plan = _Plan(cfg, batch_size, steps, warmup, alone, block, seed, attention,
                 torch_attention, torch_reason, n_threads, thread_mode, replicas, thread_info)
    try:
        report = _measure(plan, data, say)
        restore_threads(thread_info)                  # BLAS back to its own threads
        measure_machine(report)
        return report
    finally:
        restore_threads(thread_info)


def _measure(plan: _Plan, data, say) -> dict:
    """Our step (first step, timed steps, profile), PyTorch's beside it, and the
    step's products alone: the report without the machine's rates."""
    from ..data import batch_at
    from ..model import decay_segments
    from ..optim import AdamW
    from ..parallel import ThreadReplicas
    cfg, B, T, dtype = plan.cfg, plan.batch_size, plan.cfg.block_size, np.float32
    params = init_params(cfg, plan.seed, dtype)
    if data is None:
        data = np.random.default_rng(plan.seed).integers(0, cfg.vocab_size, 200_000)
    batches = [batch_at(data, plan.seed, i, B, T)
               for i in range(plan.warmup + 1 + plan.steps + plan.alone)]

    model = ThreadReplicas(cfg, B, plan.replicas, params=params, dtype=dtype,
                           attention=plan.attention)
    start_if_cold(model)          # a cold cache: the later kernels compile in a helper
    kept = activation_bytes(model.replicas)
    opt = AdamW(model.params.flat, decay_segments(model.params), lr=1e-3, weight_decay=0.1)
    phase_s = {"replica 0 forward+backward": 0.0, "all replicas forward+backward": 0.0,
               "clip + AdamW": 0.0}
    ours = _our_step(model, opt, batches, phase_s)

    say("first step (compiling numba kernels, or loading them from the cache)...")
    first_s, cache = first_step(ours)
    wait_for_helper()             # a cold cache's helper never compiles beside timed steps

    twin = None
    if plan.torch_reason is None:
        say("PyTorch, in a process of its own: first-step gradients, first step...")
        twin = TorchTwin(cfg, params, batches, attention=plan.torch_attention,
                         threads=plan.threads)
    waits = lambda: (phase_s["all replicas forward+backward"]  # noqa: E731
                     - phase_s["replica 0 forward+backward"])
    try:
        timing = _time_steps(timed_steps(ours), twin and twin.steps, plan.warmup, plan.steps,
                             say, plan.block, plan.alone, waits)
    finally:
        if twin is not None:
            twin.close()
    t_ours = timing["ours"]
    profile = profile_kernels(model, ours, phase_s, plan.steps, plan.warmup)
    again = profile_again(model, ours, plan.steps, plan.warmup)

    gemm_alone = sgemm_rate(cfg, B, T, dtype, plan.replicas)
    model.close()
    report = _report(plan, t_ours, first_s, cache, gemm_alone, profile)
    report.update(kept)
    report["again_ms"] = again
    report["ours"]["wait_ms_per_step"] = timing["wait_s"] / len(t_ours) * 1e3
    report["ours"]["alone"] = _spread(timing["ours_alone"])
    report["ours"]["spread"] = _spread(t_ours)
    if twin is not None:
        report["torch"] = _torch_report(twin, plan.torch_attention, timing, B * T,
                                        _gradient_agreement(cfg, B, params, dtype, batches[0],
                                                            plan.attention, twin.grads))
    return report


def _report(plan: _Plan, t_ours, first_s, cache, gemm_alone, profile) -> dict:
    from ..model import step_flops
    B, T = plan.batch_size, plan.cfg.block_size
    flops = step_flops(plan.cfg, B, T)
    ms = _median_ms(t_ours)
    matmul_ms = profile["matmul_ms"]
    report = {
        "config": plan.setup(),
        "compile": {"first_step_s": first_s, **cache},
        "ours": {"ms_per_step": ms, "tokens_per_s": B * T / (ms / 1e3),
                 "ms_min": min(t_ours) * 1e3,
                 "gflops": flops["total"] / (ms / 1e3) / 1e9, "steps": len(t_ours),
                 "ms_all": [t * 1e3 for t in t_ours]},
        "flops_per_step": flops,
        "linear": {"sgemm_alone_gflops": gemm_alone["gflops"],
                   "in_step_ms": matmul_ms,
                   "in_step_gflops": flops["linear"] / (matmul_ms / 1e3) / 1e9
                   if matmul_ms else None},
        "per_kernel_ms": profile["per_kernel_ms"],
        "per_kernel_note": ("replica 0 of %d, running concurrently with the others"
                            % plan.replicas if plan.replicas > 1 else "the whole step"),
        "profiled_step_ms": profile["profiled_step_ms"],
        "outside_kernels_ms": profile["outside_kernels_ms"],
        "torch": None, "torch_skipped": plan.torch_reason,
    }
    lin = report["linear"]
    if lin["in_step_gflops"]:
        lin["share_of_sgemm"] = lin["in_step_gflops"] / lin["sgemm_alone_gflops"]
    return report


def _torch_report(twin, torch_attention, timing, tokens, agreement) -> dict:
    """PyTorch's times beside ours: paired (the alternating blocks) and alone."""
    t_torch, t_ours = timing["torch"], timing["ours"]
    tms, ms = _median_ms(t_torch), _median_ms(t_ours)
    ratios = [theirs / mine for mine, theirs in timing["rounds"]]
    alone = _spread(timing["torch_alone"])
    ours_alone = _spread(timing["ours_alone"])["median"]
    worst, worst_name = agreement
    return {"version": twin.version, "attention": torch_attention,
            "ms_per_step": tms, "tokens_per_s": tokens / (tms / 1e3),
            "ms_min": min(t_torch) * 1e3, "speedup_best": min(t_torch) / min(t_ours),
            "first_step_s": twin.first_step_s, "ms_all": [t * 1e3 for t in t_torch],
            "spread": _spread(t_torch), "alone": alone,
            "speedup": tms / ms,
            "speedup_rounds": {"median": float(np.median(ratios)), "min": min(ratios),
                               "max": max(ratios), "rounds": len(ratios)},
            "speedup_alone": alone["median"] / ours_alone if ours_alone else None,
            "first_step_grad_max_rel_diff": worst,
            "first_step_grad_worst_tensor": worst_name}


def _our_step(model, opt, batches, phase_s):
    """Step i of the benchmark: the trainer's own accumulate_and_step on batch i, its phases
    added into phase_s."""
    from ..step import accumulate_and_step

    def ours(i):
        t0 = time.perf_counter()
        record = accumulate_and_step(model, opt, [batches[i]], lr=1e-3, clip=1.0)
        wall = time.perf_counter() - t0
        p = record["phases"]
        phase_s["replica 0 forward+backward"] += p["loss"] + p["backward"]
        phase_s["all replicas forward+backward"] += wall - p["optimizer"]
        phase_s["clip + AdamW"] += p["optimizer"]
        return record["loss"]
    return ours


def _gradient_agreement(cfg, B, params, dtype, batch, attention, reference):
    """The largest relative difference between our first-step gradients (one
    replica, the whole batch, before any update) and `reference` (PyTorch's,
    by parameter name), and the tensor where it is."""
    from ..model import FusedGPT
    model = FusedGPT(cfg, B, params=params, dtype=dtype, attention=attention)
    model.forward(*batch)
    model.backward()
    worst, worst_name = 0.0, None
    for name, g in model.named_grads().items():
        ref = reference[name]
        rel = float(np.abs(g - ref).max() / max(np.abs(ref).max(), 1e-30))
        if rel > worst:
            worst, worst_name = rel, name
    return worst, worst_name


def _time_steps(ours, theirs, warmup, steps, say, block=4, alone=None, waits=None):
    """Warm up, then time both sides (see `run`). A side is run(first, count) ->
    seconds of each step (`timed_steps`, or TorchTwin.steps); each takes the
    same batches in the same order. Returns a dict of per-step seconds,
    "ours"/"torch" from the paired blocks, "ours_alone"/"torch_alone" from the
    standalone runs, and "rounds": (ours median, theirs median) per pair of
    blocks. `waits`, when given, is a callable returning the replica waiting
    accumulated so far (read before and after the paired blocks)."""
    sides = [ours] + ([theirs] if theirs is not None else [])
    for side in sides:
        side(1, warmup)
    out = {"ours": [], "torch": [], "ours_alone": [], "torch_alone": [], "rounds": []}
    next_batch = [warmup + 1] * len(sides)

    def timed(which, count, into):
        got = sides[which](next_batch[which], count)
        next_batch[which] += count
        into.extend(got)
        return got

    if theirs is None:
        say(f"timing {steps} steps...")
        w0 = waits() if waits else 0.0
        timed(0, steps, out["ours"])
        out["wait_s"] = (waits() - w0) if waits else 0.0
        return out
    alone = max(1, steps // 2) if alone is None else alone
    block = max(1, min(block, steps))
    if alone:
        say(f"timing {alone} steps of each alone...")
        timed(0, alone, out["ours_alone"])
        timed(1, alone, out["torch_alone"])
    say(f"timing {steps} steps of each in alternating blocks of {block}, both orders...")
    w0 = waits() if waits else 0.0
    done = r = 0
    while done < steps:
        count = min(block, steps - done)
        if r % 2 == 0:                               # ours first, then theirs...
            a = timed(0, count, out["ours"])
            b = timed(1, count, out["torch"])
        else:                                        # ...then the other order
            b = timed(1, count, out["torch"])
            a = timed(0, count, out["ours"])
        out["rounds"].append((float(np.median(a)), float(np.median(b))))
        done += count
        r += 1
    out["wait_s"] = (waits() - w0) if waits else 0.0
    return out


def _spread(times) -> dict:
    """Median and the quartiles of a list of seconds, in ms."""
    ms = np.asarray(times) * 1e3
    if ms.size == 0:
        return {"median": None, "p25": None, "p75": None}
    return {"median": float(np.median(ms)), "p25": float(np.percentile(ms, 25)),
            "p75": float(np.percentile(ms, 75))}


TOKENS_PER_STEP = 2048


SHAPES = {   # name -> (B, T, n_layer, n_head, n_embd); B * T = 2048 tokens a step
    "tiny": (16, 128, 4, 4, 128),
    "T512": (4, 512, 4, 4, 128),
    "T1024": (2, 1024, 4, 4, 128),
    "wide": (16, 128, 6, 8, 256),
}


DEFAULT_SHAPES = tuple(SHAPES)


def parse_shape(text: str) -> tuple[str, tuple[int, int, int, int, int]]:
    """A preset name (SHAPES) or key=value pairs over tiny's, e.g. "T=256,B=8,C=192,H=6".
    Keys: B, T, L (layers), H (heads), C (width)."""
    if text in SHAPES:
        return text, SHAPES[text]
    values = dict(zip("BTLHC", SHAPES["tiny"]))
    for part in text.split(","):
        key, eq, value = part.partition("=")
        key = key.strip().upper()
        if not eq or key not in values or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"shape {text!r}: use a preset ({', '.join(SHAPES)}) or "
                             f"key=value pairs with keys B, T, L, H, C (e.g. T=256,B=8)")
        values[key] = int(value)
    return text, tuple(values[k] for k in "BTLHC")


def run_shapes(shapes, vocab_size: int, data=None, progress=None, **kwargs) -> list[dict]:
    """`run` for each (name, (B, T, L, H, C)); each report gets its "shape" name."""
    say = progress or (lambda line: None)
    reports = []
    for name, (B, T, L, H, C) in shapes:
        say(f"--- shape {name}: B={B} T={T} L={L} H={H} C={C}")
        cfg = GPTConfig(vocab_size=vocab_size, block_size=T, n_layer=L, n_head=H, n_embd=C)
        report = run(cfg, B, data=data, progress=progress, **kwargs)
        report["shape"] = name
        reports.append(report)
    return reports
