"""How many threads the trainer's two thread pools use: numba's and BLAS's.

A step alternates numba kernels (numba's OpenMP threads) and matrix products
(OpenBLAS's own threads). Both pools default to one thread per core. Under
data parallelism with several processes on one machine, each process must
take its share of the cores, or the pools of all processes fight over them
and every barrier waits for a thread that is not running.

`set_threads(n)` sets both pools. The BLAS pool is reached through the
`openblas_set_num_threads` entry point of whichever OpenBLAS SciPy loaded;
with another BLAS (MKL, Accelerate) that part is skipped and reported.
"""
from __future__ import annotations

import ctypes
import os

import numba

_SETTERS = ("scipy_openblas_set_num_threads", "openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads", "openblas_get_num_threads")


def _openblas_libraries():
    """Paths of the OpenBLAS libraries mapped into this process (after SciPy's BLAS loads)."""
    import scipy.linalg.blas  # noqa: F401  (make sure SciPy's BLAS is loaded)
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return []
    paths = {line.split()[-1] for line in maps.splitlines()
             if "openblas" in line.lower() and line.split()[-1].startswith("/")}
    # SciPy's library first: it runs our matrix products.
    return sorted(paths, key=lambda p: ("scipy.libs" not in p, p))


def _blas_call(names, *args):
    for path in _openblas_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in names:
            fn = getattr(lib, name, None)
            if fn is not None:
                return fn(*args), path
    return None, None


def blas_threads() -> int | None:
    """Threads of SciPy's OpenBLAS, or None when it cannot be asked."""
    value, _ = _blas_call(_GETTERS)
    return value


def set_threads(n: int) -> dict:
    """Use n threads in numba kernels (on the calling thread) and in BLAS;
    returns what was set, including the previous values (for restore_threads)."""
    n = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
    previous = {"numba": numba.get_num_threads(), "blas": blas_threads()}
    numba.set_num_threads(n)
    _, path = _blas_call(_SETTERS, ctypes.c_int(n))
    return {"numba": n, "blas": n if path else None, "blas_library": path,
            "previous": previous}


def restore_threads(info: dict) -> None:
    """Undo set_threads (pass what it returned)."""
    previous = info.get("previous", {})
    if previous.get("numba"):
        numba.set_num_threads(previous["numba"])
    if previous.get("blas"):
        _blas_call(_SETTERS, ctypes.c_int(previous["blas"]))


def cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def concurrent_kernels_ok() -> bool:
    """Whether several Python threads may run parallel kernels at once: the omp
    and tbb threading layers allow it, numba's fallback `workqueue` does not."""
    return numba.config.THREADING_LAYER in ("omp", "tbb", "threadsafe", "safe")
