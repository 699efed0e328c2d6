"""Wall-clock timing for the lessons, the checks and the benchmark.

Two rules make a timing mean something on a shared, busy machine:

* `median_seconds`: one number per measurement, the median of several runs,
  so that a single run slowed down by something else does not decide it;
* `fixed_threads`: inside the measurement the thread pools (BLAS and numba)
  have a fixed size, so the result does not depend on how many cores happen
  to be free or on where BLAS decides to switch from one thread to several.
"""
from __future__ import annotations

import ctypes
import time
from contextlib import contextmanager

import numpy as np

_BLAS_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                 "openblas_set_num_threads64_", "openblas_set_num_threads")
_BLAS_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
                 "openblas_get_num_threads64_", "openblas_get_num_threads")


def median_seconds(fn, repeats: int = 5, warmup: int = 0) -> float:
    """The median wall time of `fn()` over `repeats` calls, after `warmup`
    untimed calls (use one for anything that compiles on first call)."""
    if repeats < 1:
        raise ValueError(f"median_seconds: repeats must be at least 1, got {repeats}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _openblas_entry_points(names):
    """(library path, function) for every OpenBLAS mapped into this process that
    has one of `names`; numpy and SciPy each load their own copy."""
    import scipy.linalg.blas  # noqa: F401  (load SciPy's BLAS as well as numpy's)
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f
                     if "openblas" in line.lower() and line.split()[-1].startswith("/")}
    except OSError:                      # not Linux: leave BLAS as it is
        return []
    found = []
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        fn = next((getattr(lib, n) for n in names if hasattr(lib, n)), None)
        if fn is not None:
            found.append((path, fn))
    return found


@contextmanager
def fixed_threads(n: int = 1):
    """Run BLAS (every OpenBLAS in the process) and numba kernels on `n` threads
    inside the block; the previous sizes come back afterwards."""
    import numba
    n = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
    getters = dict(_openblas_entry_points(_BLAS_GETTERS))
    setters = _openblas_entry_points(_BLAS_SETTERS)
    before = {path: int(get()) for path, get in getters.items()}
    numba_before = numba.get_num_threads()
    for _, set_ in setters:
        set_(ctypes.c_int(n))
    numba.set_num_threads(n)
    try:
        yield n
    finally:
        numba.set_num_threads(numba_before)
        for path, set_ in setters:
            if before.get(path, 0) > 0:
                set_(ctypes.c_int(before[path]))
