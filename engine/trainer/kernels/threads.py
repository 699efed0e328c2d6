"""How many threads the trainer's two thread pools use: numba's and BLAS's.

A step alternates numba kernels (numba's OpenMP threads) and matrix products
(OpenBLAS's own threads). Both pools default to one thread per core. Under
data parallelism with several processes on one machine, each process must
take its share of the cores, or the pools of all processes fight over them
and every barrier waits for a thread that is not running.

`set_threads(n)` sets both pools. The BLAS pool is reached through the
`openblas_set_num_threads` entry point of every OpenBLAS loaded (numpy's and
SciPy's; engine.timing); with another BLAS (MKL, Accelerate) that part is
skipped and reported.
"""
from __future__ import annotations

import os

import numba

from ...timing import blas_threads, restore_blas_threads, set_blas_threads

def set_threads(n: int) -> dict:
    """Use n threads in numba kernels (on the calling thread) and in BLAS;
    returns what was set, including the previous values (for restore_threads)."""
    n = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
    previous = {"numba": numba.get_num_threads(), "blas": set_blas_threads(n)}
    numba.set_num_threads(n)
    blas = blas_threads()
    return {"numba": n, "blas": blas, "blas_library": next(iter(previous["blas"]), None),
            "previous": previous}


def restore_threads(info: dict) -> None:
    """Undo set_threads (pass what it returned)."""
    previous = info.get("previous", {})
    if previous.get("numba"):
        numba.set_num_threads(previous["numba"])
    restore_blas_threads(previous.get("blas") or {})


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
