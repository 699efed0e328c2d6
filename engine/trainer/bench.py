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

import argparse
import json
import os
import sys
import time

import numba
import numpy as np

from ..gpt_config import GPTConfig, init_params
from ..timing import fastest_seconds, median_seconds, sgemm_flops, timed_steps
from . import memory_rates
from .compile_ahead import wait_for_helper
from .torch_twin import TorchTwin, torch_gpt, torch_missing


def _median_ms(times):
    return float(np.median(times)) * 1e3


def _cache_stats(kernels) -> dict:
    hits = misses = 0
    for k in kernels:
        stats = getattr(k, "stats", None)
        if stats is not None:
            hits += sum(stats.cache_hits.values())
            misses += sum(stats.cache_misses.values())
    return {"loaded_from_cache": hits, "compiled": misses}


def _page_faults() -> int | None:
    """Page faults of this process so far that needed no disk (None where the OS
    does not count them). The buffers a step writes are allocated untouched; the
    first step's writes fault each page in once, which a virtual machine may
    make slow (the first step's line in the report says how many)."""
    try:
        import resource
    except ImportError:                       # Windows
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _resident_bytes() -> int | None:
    """This process's resident memory (Linux's /proc/self/statm; None elsewhere).
    Its growth over the first step is the memory that step touched for the first
    time, whatever the page size: on huge pages one fault brings in 2 MiB."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    import resource
    return pages * resource.getpagesize()


def format_first_step(r: dict) -> str:
    """The first step's time, what it compiled or loaded, and the pages it faulted in."""
    c = r["compile"]
    line = (f"first step {c['first_step_s']:.2f} s (kernels compiled: {c['compiled']}, "
            f"loaded from cache: {c['loaded_from_cache']}")
    if "page_faults" in c:
        line += f"; {c['page_faults']:,} page faults"
    if "newly_resident_bytes" in c:
        line += f", {c['newly_resident_bytes'] / 2 ** 20:,.0f} MiB newly resident"
    return line + ")"


def _numba_kernels():
    from numba.core.registry import CPUDispatcher
    from ..numba_config import ParallelKernel
    from . import kernels as fused
    found = []
    for mod in (fused.embedding, fused.layernorm, fused.gelu, fused.attention,
                fused.flash_attention, fused._lanes,
                fused.crossentropy, fused.residual, fused.linear, fused.adamw):
        for v in vars(mod).values():
            if isinstance(v, CPUDispatcher):
                found.append(v)
            elif isinstance(v, ParallelKernel):
                found += v.dispatchers()
    return list({id(d): d for d in found}.values())      # helpers imported twice, once


def sgemm_rate(cfg: GPTConfig, B: int, T: int, dtype, replicas: int = 1,
               repeats: int = 5) -> dict:
    """The linear layers' products of one step, run alone back to back:
    (forward, dx, dw) for each weight, the tied head included. With replicas,
    each of that many threads runs the products of its B/replicas rows at once
    (as the trainer does: one numba thread each, so the same route as the
    step's products, see kernels/linear.py), BLAS single-threaded."""
    from concurrent.futures import ThreadPoolExecutor
    from .kernels import gemm
    from .parallel import _one_thread_per_replica
    rng = np.random.default_rng(0)
    N, C, V = B * T // replicas, cfg.n_embd, cfg.vocab_size
    shapes = [(C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)] * cfg.n_layer + [(C, V)]
    arrays = []
    for k, n in shapes:
        x = rng.standard_normal((N, k)).astype(dtype)
        w = rng.standard_normal((k, n)).astype(dtype) * 0.02
        dy = rng.standard_normal((N, n)).astype(dtype)
        arrays.append((x, w, dy, np.empty((N, n), dtype), np.zeros((k, n), dtype),
                       np.empty((N, k), dtype)))
    flops = replicas * sum(3 * 2 * N * k * n for k, n in shapes)

    def products(_=None):
        for x, w, dy, y, dw, dx in arrays:
            gemm(x, w, y)
            gemm(x, dy, dw, trans_a=True, accumulate=True)
            gemm(dy, w, dx, trans_b=True)

    pool = (ThreadPoolExecutor(replicas, initializer=_one_thread_per_replica)
            if replicas > 1 else None)

    def one_pass():
        if pool is None:
            products()
        else:
            list(pool.map(products, range(replicas)))

    seconds = median_seconds(one_pass, repeats, warmup=1)
    if pool is not None:
        pool.shutdown()
    return {"flops": flops, "seconds": seconds, "gflops": flops / seconds / 1e9}


def product_peak_flops(m: int, k: int, n: int, repeats: int = 30, seed: int = 0) -> float:
    """The fastest float32 (m, k) @ (k, n) product the trainer's own code reaches
    on this machine, in FLOP/s (2 m k n per product), best of `repeats`: the
    faster of one BLAS call on all its threads (engine.blas) and the trainer's
    way, every core computing its share of the rows at once on one thread
    (`gemm`'s route: BLAS, or the register tiles where their vectors are wider,
    see kernels/linear.py). A peak for MFU that the step cannot pass by taking
    a faster route than the one measured."""
    from concurrent.futures import ThreadPoolExecutor
    from ..blas import library
    from .kernels import gemm
    from .kernels.threads import cores
    from .parallel import _one_thread_per_replica
    from ..timing import fixed_threads
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(m, k)).astype(np.float32)
    b = rng.normal(size=(k, n)).astype(np.float32)
    out = np.empty((m, n), np.float32)
    seconds = fastest_seconds(lambda: library().sgemm_into(a, b, out), repeats, warmup=1)
    workers = max(1, min(cores(), m))
    rows = [slice(i * m // workers, (i + 1) * m // workers) for i in range(workers)]
    with fixed_threads(1), ThreadPoolExecutor(workers, initializer=_one_thread_per_replica) as pool:
        seconds = min(seconds, fastest_seconds(lambda: list(pool.map(
            lambda r: gemm(a[r], b, out[r]), rows)), repeats, warmup=1))
    return 2.0 * m * k * n / seconds


# ------------------------------------------------------------ activation memory
def activation_bytes(models) -> dict:
    """Bytes the step keeps from forward to backward, over the given FusedGPTs
    (the replicas of one step), and attention's own share of them: the
    probabilities (standard kernel) or the row log-sum-exps (flash kernel)."""
    total = attention = 0
    for m in models:
        total += m.acts.saved_nbytes()
        for layer in m.acts.layer_sets:
            attention += getattr(layer, "probs", getattr(layer, "lse", None)).nbytes
    return {"activation_bytes": total, "attention_saved_bytes": attention}


SWEEP_LENGTHS = (128, 256, 512, 1024, 2048)


def sweep_attention(cfg: GPTConfig, lengths=SWEEP_LENGTHS, tokens: int = 2048, *,
                    repeats: int = 3, threads: int | None = None, with_torch: bool = True,
                    seed: int = 0, progress=None) -> dict:
    """For each sequence length T (batch B = max(1, tokens // T)): the bytes one
    forward+backward of the model keeps, attention's share, and the median
    forward+backward ms, for our standard and flash kernels and for the same
    model in PyTorch with scaled_dot_product_attention(is_causal=True), which
    runs in a process of its own (torch_twin.TorchTwin), as in the benchmark.
    One model at a time, every kernel on `threads` threads."""
    from dataclasses import replace
    from .kernels.threads import cores, restore_threads, set_threads
    from .model import FusedGPT
    say = progress or (lambda line: None)
    with_torch = with_torch and torch_missing() is None
    n_threads = threads or cores()
    rows, version = [], None
    for T in lengths:
        c = replace(cfg, block_size=T)
        B = max(1, tokens // T)
        rng = np.random.default_rng(seed)
        ids, targets = rng.integers(0, c.vocab_size, (2, B, T))
        params = init_params(c, seed, np.float32)
        row = {"T": T, "B": B}
        info = set_threads(n_threads)
        try:
            for kind in ("standard", "flash"):
                say(f"T={T} B={B}: ours, {kind} attention...")
                model = FusedGPT(c, B, params=params, attention=kind)
                step = lambda: (model.forward(ids, targets), model.backward())  # noqa: E731
                row[kind] = {"ms": median_seconds(step, repeats, warmup=1) * 1e3,
                             **activation_bytes([model])}
                del model
        finally:
            restore_threads(info)
        if with_torch:          # in a process of its own, as in the benchmark (torch_twin.py)
            say(f"T={T} B={B}: PyTorch SDPA, in a process of its own...")
            batches = [(ids, targets)] * (repeats + 1)         # one batch, repeated
            with TorchTwin(c, params, batches, attention="sdpa", threads=n_threads) as twin:
                seconds = twin.forward_backward(0, repeats + 1)[1:]      # the first warms up
                row["torch_sdpa"] = {"ms": float(np.median(seconds)) * 1e3,
                                     "activation_bytes": twin.saved_bytes(0)}
                version = twin.version
        rows.append(row)
    return {"config": {**cfg.to_dict(), "tokens_per_batch": tokens, "threads": n_threads,
                       "repeats": repeats, "torch": version},
            "rows": rows}


def format_sweep(r: dict) -> str:
    c = r["config"]
    mib = lambda n: f"{n / 2**20:9.2f}"  # noqa: E731
    lines = [f"attention sweep: L={c['n_layer']} H={c['n_head']} C={c['n_embd']} "
             f"V={c['vocab_size']}, B*T = {c['tokens_per_batch']} tokens, {c['threads']} "
             f"thread(s), forward+backward median of {c['repeats']}",
             f"{'T':>6}{'B':>4} | {'standard':^27} | {'flash':^27} | {'PyTorch SDPA':^18}",
             f"{'':10}| {'kept MiB':>9}{'attn MiB':>9}{'ms':>9} | {'kept MiB':>9}{'attn MiB':>9}"
             f"{'ms':>9} | {'saved MiB':>9}{'ms':>9}"]
    for row in r["rows"]:
        s, f, t = row["standard"], row["flash"], row.get("torch_sdpa")
        line = (f"{row['T']:>6}{row['B']:>4} | {mib(s['activation_bytes'])}"
                f"{mib(s['attention_saved_bytes'])}{s['ms']:9.1f} | {mib(f['activation_bytes'])}"
                f"{mib(f['attention_saved_bytes'])}{f['ms']:9.1f} | ")
        line += f"{mib(t['activation_bytes'])}{t['ms']:9.1f}" if t else "   (no torch)"
        lines.append(line)
    return "\n".join(lines)


def run(cfg: GPTConfig, batch_size: int, *, steps: int = 20, warmup: int = 3,
        with_torch: bool = True, torch_attention: str = "sdpa", threads: int | None = None,
        thread_mode: str = "replicas", seed: int = 0, data=None, progress=None,
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
    say = progress or (lambda line: None)
    torch_reason = torch_missing() if with_torch else "disabled with --no-torch"
    from .kernels.threads import cores, plan_threads, restore_threads

    n_threads = threads or cores()
    thread_mode, replicas, thread_info = plan_threads(n_threads, batch_size, thread_mode)
    try:
        report = _measure(cfg, batch_size, steps, warmup, torch_reason, torch_attention,
                          n_threads, thread_mode, replicas, thread_info, seed, data, say,
                          attention, block, alone)
        restore_threads(thread_info)                  # BLAS back to its own threads
        report["linear"]["machine_sgemm_gflops"] = sgemm_flops() / 1e9
        report["memory"] = memory_rates.measure()
        # the step's cores side by side, as they run it (more replicas than numba has
        # threads share them: the threads are the cores that run at once)
        cores = min(step_cores(report["config"]), numba.config.NUMBA_NUM_THREADS)
        if cores > 1:
            report["memory_together"] = memory_rates.measure(cores=cores)
        own = cpu_own_sgemm()
        if own is not None and own["blas"] != report["config"]["blas"]:
            report["linear"]["cpu_own_sgemm"] = own
        return report
    finally:
        restore_threads(thread_info)


def _measure(cfg, batch_size, steps, warmup, torch_reason, torch_attention, n_threads,
             thread_mode, replicas, thread_info, seed, data, say, attention="standard",
             block=4, alone=None):
    from .data import batch_at
    from .model import decay_segments
    from .optim import AdamW
    from .parallel import ThreadReplicas
    B, T = batch_size, cfg.block_size
    dtype = np.float32
    params = init_params(cfg, seed, dtype)
    if data is None:
        data = np.random.default_rng(seed).integers(0, cfg.vocab_size, 200_000)
    with_torch = torch_reason is None
    alone_n = (max(1, steps // 2) if alone is None else alone) if with_torch else 0
    batches = [batch_at(data, seed, i, B, T) for i in range(warmup + 1 + steps + alone_n)]

    model = ThreadReplicas(cfg, B, replicas, params=params, dtype=dtype, attention=attention)
    kept = activation_bytes(model.replicas)
    opt = AdamW(model.params.flat, decay_segments(model.params), lr=1e-3, weight_decay=0.1)
    phase_s = {"replica 0 forward+backward": 0.0, "all replicas forward+backward": 0.0,
               "clip + AdamW": 0.0}
    ours = _our_step(model, opt, batches, phase_s)
    alone = alone_n

    say("first step (compiling numba kernels, or loading them from the cache)...")
    faults, resident = _page_faults(), _resident_bytes()
    kernels = _numba_kernels()
    before = _cache_stats(kernels)      # numba counts from the process's start: the table's
    t0 = time.perf_counter()            # later shapes would report the earlier ones' compiles
    ours(0)
    first_step = time.perf_counter() - t0
    cache = {k: n - before[k] for k, n in _cache_stats(kernels).items()}
    if faults is not None:
        cache["page_faults"] = _page_faults() - faults
    if resident is not None:
        cache["newly_resident_bytes"] = max(0, _resident_bytes() - resident)
    wait_for_helper()             # a cold cache's helper never compiles beside timed steps

    twin = None
    if with_torch:
        say("PyTorch, in a process of its own: first-step gradients, first step...")
        twin = TorchTwin(cfg, params, batches, attention=torch_attention, threads=n_threads)
    waits = lambda: (phase_s["all replicas forward+backward"]  # noqa: E731
                     - phase_s["replica 0 forward+backward"])
    try:
        timing = _time_steps(timed_steps(ours), twin and twin.steps, warmup, steps, say,
                             block, alone, waits)
    finally:
        if twin is not None:
            twin.close()
    t_ours = timing["ours"]
    per_kernel, prof_wall, rest, matmul_ms = _profile(model, ours, phase_s, steps, warmup)
    again = _profile_again(model, ours, steps, warmup)

    gemm_alone = sgemm_rate(cfg, B, T, dtype, replicas)
    model.close()
    setup = {**cfg.to_dict(), "batch_size": B, "dtype": "float32", "threads": n_threads,
             "thread_mode": thread_mode, "replicas": replicas, "attention": attention,
             "kernel_threads": thread_info["numba"], "blas_threads": thread_info["blas"],
             "blas": thread_info["blas_library"], "products": thread_info["products"],
             "block": block}
    report = _report(cfg, B, T, setup, t_ours, first_step, cache, gemm_alone, matmul_ms,
                     per_kernel, prof_wall, rest, replicas, torch_reason)
    report.update(kept)
    report["again_ms"] = again
    report["ours"]["wait_ms_per_step"] = timing["wait_s"] / len(t_ours) * 1e3
    report["ours"]["alone"] = _spread(timing["ours_alone"])
    report["ours"]["spread"] = _spread(t_ours)
    if twin is not None:
        report["torch"] = _torch_report(twin, torch_attention, timing, B * T,
                                        _gradient_agreement(cfg, B, params, dtype, batches[0],
                                                            attention, twin.grads))
    return report


def _report(cfg, B, T, setup, t_ours, first_step, cache, gemm_alone, matmul_ms, per_kernel,
            prof_wall, rest, replicas, torch_reason) -> dict:
    from .model import step_flops
    flops = step_flops(cfg, B, T)
    ms = _median_ms(t_ours)
    report = {
        "config": setup,
        "compile": {"first_step_s": first_step, **cache},
        "ours": {"ms_per_step": ms, "tokens_per_s": B * T / (ms / 1e3),
                 "ms_min": min(t_ours) * 1e3,
                 "gflops": flops["total"] / (ms / 1e3) / 1e9, "steps": len(t_ours),
                 "ms_all": [t * 1e3 for t in t_ours]},
        "flops_per_step": flops,
        "linear": {"sgemm_alone_gflops": gemm_alone["gflops"],
                   "in_step_ms": matmul_ms,
                   "in_step_gflops": flops["linear"] / (matmul_ms / 1e3) / 1e9
                   if matmul_ms else None},
        "per_kernel_ms": per_kernel,
        "per_kernel_note": ("replica 0 of %d, running concurrently with the others" % replicas
                            if replicas > 1 else "the whole step"),
        "profiled_step_ms": prof_wall * 1e3,
        "outside_kernels_ms": rest,
        "torch": None, "torch_skipped": torch_reason,
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
    """Step i of the benchmark: the trainer's own train_step on batch i, its phases
    added into phase_s."""
    from .step import train_step

    def ours(i):
        t0 = time.perf_counter()
        record = train_step(model, opt, [batches[i]], lr=1e-3, clip=1.0)
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
    from .model import FusedGPT
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


def _profiled_steps(ours, steps, warmup) -> tuple[int, float]:
    """Run the profiling passes' steps (a quarter of --steps, at least 3, on the
    warm-up batches); returns (how many, seconds per step)."""
    n_prof = max(3, steps // 4)
    t0 = time.perf_counter()
    for i in range(n_prof):
        ours(1 + i % warmup if warmup else 0)
    return n_prof, (time.perf_counter() - t0) / n_prof


def _profile(model, ours, phase_s, steps, warmup):
    """Per-kernel ms over separate steps (timing each call costs a little), and
    where the rest of the step went."""
    model.profile = {}
    for key in phase_s:
        phase_s[key] = 0.0
    n_prof, prof_wall = _profiled_steps(ours, steps, warmup)
    per_kernel = {k: v / n_prof * 1e3 for k, v in
                  sorted(model.profile.items(), key=lambda kv: -kv[1])}
    model.profile = None
    kernels_ms = sum(per_kernel.values())
    phases = {k: v / n_prof * 1e3 for k, v in phase_s.items()}
    rest = {"replica 0: Python between kernels": phases["replica 0 forward+backward"]
            - kernels_ms,
            "waiting for the other replicas, summing their gradients":
                phases["all replicas forward+backward"] - phases["replica 0 forward+backward"],
            "clip + AdamW": phases["clip + AdamW"]}
    matmul_ms = per_kernel.get("matmul", 0.0) + per_kernel.get("linear_forward", 0.0)
    return per_kernel, prof_wall, rest, matmul_ms


def _profile_again(model, ours, steps, warmup) -> dict:
    """Per kernel, over all its calls: ms as called in the step and ms run again
    at once, its data then in the caches (model._run_again). A pass of its own:
    the second runs warm the caches for the next kernel."""
    model.profile, model.profile_again = {}, {}
    n_prof, _ = _profiled_steps(ours, steps, warmup)
    again = {name: {"as_called_ms": first / n_prof * 1e3, "again_ms": second / n_prof * 1e3}
             for name, (first, second) in sorted(model.profile_again.items(),
                                                 key=lambda kv: -kv[1][0])}
    model.profile = model.profile_again = None
    return again


def _kib_or_mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def format_report(r: dict) -> str:
    c = r["config"]
    mode = (f"{c['replicas']} replicas x 1 thread" if c["thread_mode"] == "replicas"
            else f"1 model, {c['threads']}-thread kernels")
    lines = [f"fused trainer benchmark: V={c['vocab_size']} T={c['block_size']} "
             f"L={c['n_layer']} H={c['n_head']} C={c['n_embd']} B={c['batch_size']} float32, "
             f"{c['threads']} thread(s): {mode}; BLAS: {c['blas']}",
             f"matrix products: {c['products']}",
             format_first_step(r), ""]
    o, t = r["ours"], r["torch"]
    if "activation_bytes" in r:
        lines.insert(2, f"activations kept for the backward: {_kib_or_mib(r['activation_bytes'])}, "
                        f"attention's share {_kib_or_mib(r['attention_saved_bytes'])} "
                        f"({c.get('attention', 'standard')} kernel)")
    q = lambda sp: f"{sp['median']:.1f} ({sp['p25']:.1f}-{sp['p75']:.1f})"  # noqa: E731
    lines.append(f"{'':24}{'ms/step (quartiles)':>22}{'tokens/s':>10}{'GFLOP/s':>9}"
                 f"{'best ms':>9}{'alone ms':>20}")
    alone = lambda sp: q(sp) if sp["median"] is not None else "-"  # noqa: E731
    lines.append(f"{'fused (FusedGPT)':24}{q(o['spread']):>22}{o['tokens_per_s']:>10,.0f}"
                 f"{o['gflops']:>9.1f}{o['ms_min']:>9.1f}{alone(o['alone']):>20}")
    if t:
        gf = r["flops_per_step"]["total"] / (t["ms_per_step"] / 1e3) / 1e9
        lines.append(f"{'PyTorch ' + t['version'] + ' eager':24}{q(t['spread']):>22}"
                     f"{t['tokens_per_s']:>10,.0f}{gf:>9.1f}{t['ms_min']:>9.1f}"
                     f"{alone(t['alone']):>20}")
        sr = t["speedup_rounds"]
        lines.append(f"speed-up over PyTorch eager: {sr['median']:.2f}x paired (median of "
                     f"{sr['rounds']} rounds of {c.get('block', 1)}-step blocks in both orders, "
                     f"range {sr['min']:.2f}-{sr['max']:.2f}x; {t['speedup']:.2f}x from the "
                     f"step medians, {t['speedup_best']:.2f}x best step against best step"
                     + (f", {t['speedup_alone']:.2f}x alone" if t["speedup_alone"] else "")
                     + f"; attention={t['attention']})")
        lines.append(f"first-step gradients: largest relative difference "
                     f"{t['first_step_grad_max_rel_diff']:.2e} ({t['first_step_grad_worst_tensor']})")
    else:
        lines.append(f"PyTorch comparison skipped: {r['torch_skipped']}")
    if c["replicas"] > 1:
        lines.append(f"waiting for the other replicas and summing their gradients: "
                     f"{o['wait_ms_per_step']:.1f} ms a step "
                     f"({o['wait_ms_per_step'] / o['ms_per_step']:.0%} of the median step)")
    lin = r["linear"]
    lines.append("")
    lines.append(f"linear layers: {lin['in_step_gflops'] or 0:.1f} GFLOP/s inside the step vs "
                 f"{lin['sgemm_alone_gflops']:.1f} GFLOP/s for the same products alone"
                 + (f" ({lin['share_of_sgemm']:.0%})" if "share_of_sgemm" in lin else ""))
    if "machine_sgemm_gflops" in lin:
        lines.append(f"machine sgemm (1024^3, {c['blas']}, default threads): "
                     f"{lin['machine_sgemm_gflops']:.1f} GFLOP/s; the whole step ran at "
                     f"{o['gflops'] / lin['machine_sgemm_gflops']:.0%} of it")
    if "cpu_own_sgemm" in lin:
        own = lin["cpu_own_sgemm"]
        lines.append(f"with the CPU's own kernels ({own['blas']}; OPENBLAS_CORETYPE unset, "
                     f"in a child process): {own['gflops']:.1f} GFLOP/s; the whole step ran "
                     f"at {o['gflops'] / own['gflops']:.0%} of it")
    lines.append("")
    lines += format_profile(r)
    return "\n".join(lines)


def format_profile(r: dict) -> list[str]:
    """Where the time of one step went: kernel by kernel, then outside the kernels."""
    lines = [f"where the time goes (profiled step {r['profiled_step_ms']:.1f} ms; kernels "
             f"of {r['per_kernel_note']}):"]
    total = sum(r["per_kernel_ms"].values())
    for name, ms in r["per_kernel_ms"].items():
        lines.append(f"  {name:24}{ms:8.2f} ms  {ms / total:6.1%} of the kernels")
    for name, ms in r["outside_kernels_ms"].items():
        lines.append(f"  {name}: {ms:.2f} ms")
    again = r.get("again_ms")
    if again:
        lines += ["", "every call, as called in the step and again at once (its data then in "
                  "the caches):"]
        for name, t in again.items():
            lines.append(f"  {name:24}{t['as_called_ms']:8.2f} ms  again {t['again_ms']:6.2f} ms"
                         f"  {t['as_called_ms'] / t['again_ms']:5.2f}x")
        called, warm, step_ms = cached_step_ms(r)
        lines.append(f"  {'all calls':24}{called:8.2f} ms  again {warm:6.2f} ms"
                     f"  {called / warm:5.2f}x")
        rate = r["linear"].get("machine_sgemm_gflops")
        share = (f", {r['flops_per_step']['total'] / step_ms / 1e6 / rate:.0%} of the "
                 f"machine's sgemm rate" if rate else "")
        lines.append(f"the median step less what its calls pay for where their data was: "
                     f"about {step_ms:.1f} ms{share}")
    return lines + format_memory(r)


def format_memory(r: dict) -> list[str]:
    """The memory rates of one core and of the step's cores at once, and what the
    kept activations cost at the latter."""
    m = r.get("memory")
    if not m:
        return []
    cache = m["reported_cache_bytes"]
    def rates(x):
        return (f"writes {x['write_gbs']:.1f} GB/s, {x['streamed_gbs']:.1f} GB/s streamed "
                f"past the caches; reads {x['read_gbs']:.1f} GB/s")
    lines = [f"memory, one core (a {_kib_or_mib(m['buffer_bytes'])} buffer"
             + (f"; the OS reports a {_kib_or_mib(cache)} cache" if cache else "")
             + f"): {rates(m)}"]
    together = r.get("memory_together")
    if together:
        lines.append(f"memory, {together['cores']} cores at once, all together: "
                     f"{rates(together)}")
    if "activation_bytes" in r:
        per_core, ordinary, streamed = kept_traffic(r)
        paid = ""
        if r.get("again_ms"):
            called, warm, _ = cached_step_ms(r)
            paid = f"; the calls above paid {called - warm:.1f} ms for where their data was"
        lines.append(f"the activations kept, {_kib_or_mib(per_core)} a core, written once and "
                     f"read back once at these rates: {ordinary:.1f} ms a step "
                     f"({streamed:.1f} ms with every write streamed){paid}")
    return lines


def step_cores(config: dict) -> int:
    """The cores a step runs on at once: one per replica, or one model's threads."""
    return config["replicas"] if config["thread_mode"] == "replicas" else config["threads"]


def kept_traffic(r: dict) -> tuple[float, float, float]:
    """(bytes of kept activations a core, ms to write them once and read them back
    once with ordinary stores, ms with every write streamed): the activations shared
    by the cores that ran the memory sweep at once (one for a one-core step), each
    core at its share of their rates."""
    rates = r.get("memory_together") or r["memory"]
    cores = rates["cores"]
    per_core_rates = {k: rates[k] / cores for k in ("write_gbs", "streamed_gbs", "read_gbs")}
    per_core = r["activation_bytes"] / cores
    return (per_core, *memory_rates.traffic_ms(per_core, per_core_rates))


def cached_step_ms(r: dict) -> tuple[float, float, float]:
    """(ms of the profiled calls as called, ms again at once, the median step less
    the difference): about what a step would take if every kernel found its data
    in the caches and the time outside the kernels stayed as it is."""
    called = sum(t["as_called_ms"] for t in r["again_ms"].values())
    warm = sum(t["again_ms"] for t in r["again_ms"].values())
    return called, warm, r["ours"]["ms_per_step"] - (called - warm)


# ------------------------------------------------------------------ shape table
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


# A child process's 1024^3 sgemm rate, printed as one line of JSON.
_SGEMM_CHILD = """
import json, os
from engine.blas import library
from engine.timing import sgemm_flops
rate = max(sgemm_flops() for _ in range(3))
print(json.dumps({"blas": library().description, "gflops": rate / 1e9,
                  "coretype": os.environ.get("OPENBLAS_CORETYPE")}))
"""


def cpu_own_sgemm() -> dict | None:
    """The 1024^3 sgemm rate with the kernels OpenBLAS picks for this CPU, where the
    environment holds it to others (OPENBLAS_CORETYPE): measured in a child process
    without the variable, all cores, best of three. The benchmark keeps the user's
    setting for its own products; this says what the CPU could give with its own
    kernels, so that a step's share of "the machine's sgemm rate" can be read both
    ways. None when the engine's BLAS is not OpenBLAS or nothing holds it."""
    import subprocess
    from ..blas import library
    from ..numba_config import users_environment
    from .child_process import start_python
    if library().name != "openblas" or not os.environ.get("OPENBLAS_CORETYPE"):
        return None
    env = {k: v for k, v in users_environment().items() if k != "OPENBLAS_CORETYPE"}
    env["ENGINE_BLAS"] = "openblas"
    child = start_python(_SGEMM_CHILD, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out, err = child.communicate(timeout=600)
    if child.returncode != 0:
        raise RuntimeError(f"the sgemm child process (OPENBLAS_CORETYPE unset) failed:\n{err}")
    return json.loads(out.strip().splitlines()[-1])


def machine_ceiling(reports: list[dict]) -> float | None:
    """The machine's sgemm rate for a table: the best of the readings taken after
    each shape. One reading can land in a moment the machine is busy (it once
    read half the others, which put a shape at 191% of it); the best is the
    rate the machine can give, and the same yardstick for every row."""
    rates = [r["linear"].get("machine_sgemm_gflops") for r in reports]
    rates = [x for x in rates if x]
    return max(rates) if rates else None


def format_table(reports: list[dict]) -> str:
    """One line per shape: ours and PyTorch's ms/step (median, quartiles), tokens/s,
    GFLOP/s, the share of the machine's sgemm rate, the ratios (paired rounds and
    alone), the replicas' waiting share and the first-step gradient agreement."""
    w = max([5] + [len(r.get("shape", "")) for r in reports])
    head = (f"{'shape':>{w}}{'B':>4}{'T':>6}{'L':>3}{'H':>3}{'C':>5} |"
            f"{'ours ms/step':>20}{'tok/s':>8}{'GFLOP/s':>8}{'sgemm':>6}{'wait':>5} |"
            f"{'torch ms/step':>20}{'tok/s':>8} |{'paired x (range)':>18}"
            f"{'alone ms ours/torch':>21}{'x':>6} |{'grad rel':>9}")
    lines = [head, "-" * len(head)]
    q = lambda sp: f"{sp['median']:.1f} ({sp['p25']:.0f}-{sp['p75']:.0f})"  # noqa: E731
    sgemm = machine_ceiling(reports)
    for r in reports:
        c, o, t = r["config"], r["ours"], r["torch"]
        share = f"{o['gflops'] / sgemm:.0%}" if sgemm else "-"
        wait = f"{o['wait_ms_per_step'] / o['ms_per_step']:.0%}" if c["replicas"] > 1 else "-"
        line = (f"{r.get('shape', ''):>{w}}{c['batch_size']:>4}{c['block_size']:>6}"
                f"{c['n_layer']:>3}{c['n_head']:>3}{c['n_embd']:>5} |{q(o['spread']):>20}"
                f"{o['tokens_per_s']:>8,.0f}{o['gflops']:>8.1f}{share:>6}{wait:>5} |")
        if t:
            sr = t["speedup_rounds"]
            alone = (f"{o['alone']['median']:.1f}/{t['alone']['median']:.1f}"
                     if t["speedup_alone"] else "-")
            line += (f"{q(t['spread']):>20}{t['tokens_per_s']:>8,.0f} |"
                     f"{sr['median']:>7.2f} ({sr['min']:.2f}-{sr['max']:.2f})"
                     f"{alone:>21}{(t['speedup_alone'] or 0):>6.2f} |"
                     f"{t['first_step_grad_max_rel_diff']:>9.1e}")
        else:
            line += f"{'(no torch)':>20}"
        lines.append(line)
    r0 = reports[0]
    t0 = r0["torch"]
    lines.append(f"ours: {r0['config']['threads']} thread(s), "
                 f"{r0['config']['thread_mode']}; {r0['config']['attention']} attention; "
                 f"BLAS {r0['config']['blas']}"
                 + (f"; PyTorch {t0['version']} eager, attention={t0['attention']}" if t0 else "")
                 + f"; float32; vocabulary {r0['config']['vocab_size']}")
    lines.append(f"our matrix products: {r0['config']['products']}")
    if sgemm:
        lines.append(f"machine sgemm rate: {sgemm:.1f} GFLOP/s (1024^3, {r0['config']['blas']}, "
                     f"all cores; "
                     f"the best of the readings taken after each shape)")
    own = max((r["linear"]["cpu_own_sgemm"] for r in reports if "cpu_own_sgemm" in r["linear"]),
              key=lambda x: x["gflops"], default=None)
    if own:
        shares = ", ".join(f"{r.get('shape', '?')} {r['ours']['gflops'] / own['gflops']:.0%}"
                           for r in reports)
        lines.append(f"with the CPU's own kernels ({own['blas']}; OPENBLAS_CORETYPE unset, in a "
                     f"child process; best reading): {own['gflops']:.1f} GFLOP/s; the steps at "
                     f"{shares} of it")
    lines.append("ms/step: median (quartiles) of the paired steps; sgemm: the step's GFLOP/s "
                 "over the machine's 1024^3 sgemm rate; wait: replicas waiting and summing "
                 "gradients, share of the step; paired x: median (range) over rounds of "
                 "PyTorch's block median / ours; alone: medians of the standalone runs; "
                 "grad rel: largest first-step gradient difference to PyTorch, relative")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench",
                                description="Tokens/s and ms/step of the fused GPT trainer, "
                                            "next to PyTorch eager when it is installed.")
    p.add_argument("--steps", type=int, default=20, help="timed steps (median; default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=None,
                   help="default: the built-in corpus's character count")
    p.add_argument("--threads", type=int, default=None, help="default: all cores")
    p.add_argument("--thread-mode", choices=("replicas", "kernels"), default="replicas",
                   help="replicas: one model copy per thread (the trainer's default); "
                        "kernels: one model with multi-threaded kernels")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    p.add_argument("--torch-attention", choices=("sdpa", "manual"), default="sdpa")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--shapes", nargs="*", metavar="SHAPE", default=None,
                   help="instead of one shape: one table over these shapes (presets "
                        + ", ".join(f"{k}=B{v[0]},T{v[1]},L{v[2]},H{v[3]},C{v[4]}"
                                    for k, v in SHAPES.items())
                        + "; or key=value pairs over tiny's, e.g. T=256,B=8); "
                        "no names: all the presets")
    p.add_argument("--block", type=int, default=4,
                   help="steps per block when alternating with PyTorch (default 4)")
    p.add_argument("--alone-steps", type=int, default=None,
                   help="steps of each side run alone first (default steps // 2; 0: none)")
    p.add_argument("--attention", choices=("standard", "flash"), default="standard",
                   help="our attention kernel: standard keeps the T x T probabilities, "
                        "flash one number per row")
    p.add_argument("--sweep-attention", action="store_true",
                   help="instead: saved bytes and forward+backward ms of both kernels and "
                        "PyTorch SDPA at T = " + ", ".join(map(str, SWEEP_LENGTHS))
                        + " (B = 2048 // T; median of --steps forward+backward passes)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.block < 1 or (args.alone_steps or 0) < 0:
        p.error("--steps and --block must be >= 1, --warmup and --alone-steps >= 0")
    for flag, value in (("--batch-size", args.batch_size), ("--threads", args.threads)):
        if value is not None and value < 1:
            p.error(f"{flag} must be at least 1, got {value}")
    from .data import Dataset, builtin_text
    data = None
    vocab = args.vocab_size
    if vocab is None:
        ds = Dataset.from_text(builtin_text())
        vocab, data = ds.tokenizer.vocab_size, ds.train
    progress = None if args.json else (lambda s: print(s, file=sys.stderr))
    options = dict(steps=args.steps, warmup=args.warmup, with_torch=not args.no_torch,
                   torch_attention=args.torch_attention, threads=args.threads,
                   thread_mode=args.thread_mode, attention=args.attention, block=args.block,
                   alone=args.alone_steps)
    if args.shapes is not None:
        try:
            shapes = [parse_shape(s) for s in (args.shapes or DEFAULT_SHAPES)]
        except ValueError as exc:
            p.error(str(exc))
        reports = run_shapes(shapes, vocab, data=data, progress=progress, **options)
        if args.json:
            print(json.dumps(reports, indent=2))
        else:
            print(format_table(reports))
            for r in reports:
                print(f"\n[{r['shape']}] {format_first_step(r)}; " + "\n".join(format_profile(r)))
        return 0
    try:
        cfg = GPTConfig(vocab_size=vocab, block_size=args.block_size, n_layer=args.n_layer,
                        n_head=args.n_head, n_embd=args.n_embd)
    except ValueError as exc:
        p.error(str(exc))
    if args.sweep_attention:
        sweep = sweep_attention(cfg, repeats=args.steps, threads=args.threads,
                                with_torch=not args.no_torch,
                                progress=None if args.json else
                                (lambda s: print(s, file=sys.stderr)))
        print(json.dumps(sweep, indent=2) if args.json else format_sweep(sweep))
        return 0
    report = run(cfg, args.batch_size, data=data, progress=progress, **options)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
