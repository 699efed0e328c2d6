"""What the machine gives: its sgemm rate (on the step's own route and in a
child process with OpenBLAS's own kernels for the CPU), and its memory rates
set against the activations a step keeps (memory_rates.py measures those)."""
from __future__ import annotations

import json
import os

import numba
import numpy as np

from ...gpt_config import GPTConfig
from ...timing import fastest_seconds, median_seconds, sgemm_flops
from . import memory_rates


def sgemm_rate(cfg: GPTConfig, B: int, T: int, dtype, replicas: int = 1,
               repeats: int = 5) -> dict:
    """The linear layers' products of one step, run alone back to back:
    (forward, dx, dw) for each weight, the tied head included. With replicas,
    each of that many threads runs the products of its B/replicas rows at once
    (as the trainer does: one numba thread each, so the same route as the
    step's products, see kernels/linear.py), BLAS single-threaded."""
    from concurrent.futures import ThreadPoolExecutor
    from ..kernels import gemm
    from ..parallel import _one_thread_per_replica
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
    from ...blas import library
    from ..kernels import gemm
    from ..kernels.threads import cores
    from ..parallel import _one_thread_per_replica
    from ...timing import fixed_threads
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
    from ...blas import library
    from ...numba_config import users_environment
    from ..child_process import start_python
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


def measure_machine(report: dict) -> None:
    """Add the machine's rates to a step's report, measured after the step's own
    timings: the 1024^3 sgemm rate, one core's memory rates, the step's cores at
    once (more replicas than numba has threads share them: the threads are the
    cores that run at once), and the CPU's own sgemm where OPENBLAS_CORETYPE holds
    OpenBLAS to other kernels."""
    report["linear"]["machine_sgemm_gflops"] = sgemm_flops() / 1e9
    report["memory"] = memory_rates.measure()
    cores = min(step_cores(report["config"]), numba.config.NUMBA_NUM_THREADS)
    if cores > 1:
        report["memory_together"] = memory_rates.measure(cores=cores)
    own = cpu_own_sgemm()
    if own is not None and own["blas"] != report["config"]["blas"]:
        report["linear"]["cpu_own_sgemm"] = own
