"""Wall-clock timing for the lessons, the checks and the benchmark.

Two rules make a timing mean something on a shared, busy machine:

* `median_seconds`: one number per measurement, the median of several runs,
  so that a single run slowed down by something else does not decide it;
* `fixed_threads`: inside the measurement the thread pools (BLAS and numba)
  have a fixed size, so the result does not depend on how many cores happen
  to be free or on where BLAS decides to switch from one thread to several.

The lessons' timing cells, the exercise checks and the sgemm and matmul
references of `python -m engine.bench` use them. The trainer's own per-phase
and per-kernel times are read off `time.perf_counter` inside the step, where
a median of repeats is not possible.
"""
from __future__ import annotations

import ctypes
import time
from contextlib import contextmanager

import numpy as np

from .blas import openblas_entry_points

_BLAS_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                 "openblas_set_num_threads64_", "openblas_set_num_threads")
_BLAS_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
                 "openblas_get_num_threads64_", "openblas_get_num_threads")


def _wall_times(caller: str, fn, repeats: int, warmup: int) -> list[float]:
    """The wall time of each of `repeats` calls of `fn()`, after `warmup` untimed ones."""
    if repeats < 1:
        raise ValueError(f"{caller}: repeats must be at least 1, got {repeats}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def median_seconds(fn, repeats: int = 5, warmup: int = 0) -> float:
    """The median wall time of `fn()` over `repeats` calls, after `warmup`
    untimed calls (use one for anything that compiles on first call)."""
    return float(np.median(_wall_times("median_seconds", fn, repeats, warmup)))


def fastest_seconds(fn, repeats: int = 5, warmup: int = 0) -> float:
    """The shortest wall time of `fn()` over `repeats` calls, after `warmup`
    untimed ones: a peak rate's time (what the machine can do when nothing
    else gets in the way), where a median is a typical time."""
    return min(_wall_times("fastest_seconds", fn, repeats, warmup))


def timed_steps(step):
    """Blocks of training steps, timed one by one: from step(i) (batch index ->
    anything), run(first, count) runs batches first, first+1, ... and returns
    each step's seconds. The benchmark's paired timing takes such a function
    for each side."""
    def run(first, count):
        times = []
        for i in range(first, first + count):
            t0 = time.perf_counter()
            step(i)
            times.append(time.perf_counter() - t0)
        return times
    return run


def sgemm_flops(n: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of one n x n x n float32 product through the engine's BLAS
    (engine.blas: the library the trainer's products use, at its current
    threads), median of `repeats`: the ceiling of any matmul on this machine."""
    from .blas import library
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    out = np.empty_like(a)
    seconds = median_seconds(lambda: library().sgemm_into(a, a, out), repeats, warmup=1)
    return 2 * n ** 3 / seconds


def blas_threads() -> int | None:
    """Threads of the engine's BLAS (engine.blas: MKL, or SciPy's OpenBLAS), or
    None when it cannot be asked."""
    from .blas import library
    if library().name == "mkl":
        return library().threads()
    getters = openblas_entry_points(_BLAS_GETTERS)
    return int(getters[0][1]()) if getters else None


def set_blas_threads(n: int) -> dict:
    """Give every BLAS in the process `n` threads (each OpenBLAS loaded, and MKL
    when the engine uses it); returns {library: previous thread count} for
    `restore_blas_threads` ({} when none can be reached)."""
    from .blas import library
    previous = {path: int(get()) for path, get in openblas_entry_points(_BLAS_GETTERS)}
    for _, set_ in openblas_entry_points(_BLAS_SETTERS):
        set_(ctypes.c_int(int(n)))
    if library().name == "mkl":
        previous["mkl"] = library().threads()
        library().set_threads(n)
    return previous


def restore_blas_threads(previous: dict) -> None:
    """Undo `set_blas_threads` (pass what it returned)."""
    from .blas import library
    for path, set_ in openblas_entry_points(_BLAS_SETTERS):
        if previous.get(path, 0) > 0:
            set_(ctypes.c_int(previous[path]))
    if previous.get("mkl", 0) > 0 and library().name == "mkl":
        library().set_threads(previous["mkl"])


@contextmanager
def fixed_threads(n: int = 1):
    """Run BLAS (every one in the process, see set_blas_threads) and numba kernels on `n` threads
    inside the block; the previous sizes come back afterwards."""
    import numba
    n = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
    blas_before = set_blas_threads(n)
    numba_before = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        yield n
    finally:
        numba.set_num_threads(numba_before)
        restore_blas_threads(blas_before)
