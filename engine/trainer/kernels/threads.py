"""How many threads the trainer's two thread pools use: numba's and BLAS's.

A step runs numba kernels (on numba's thread pool) and matrix products, those
that linear.py routes to BLAS on the threads of the BLAS engine.blas chose
(OpenBLAS's own, or MKL's); `product_routes()` says which products go where.
Both pools default to one thread per core. Under data parallelism with several
processes on one machine, each process must take its share of the cores, or
the pools of all processes fight over them and every barrier waits for a
thread that is not running.

`set_threads(n)` sets both pools (`set_threads(n, blas=1)`: n numba threads,
single-threaded BLAS, as the trainer's replicas want: each replica runs
its kernels under `one_numba_thread()`, and what runs between replicas,
the gradient norm and the AdamW update, uses all n). The BLAS pool is reached
through the `openblas_set_num_threads` entry point of every OpenBLAS loaded (numpy's and
SciPy's) and MKL's own call when the engine uses MKL (engine.timing); with
another BLAS (Accelerate) that part is skipped and reported.
"""
from __future__ import annotations

import contextlib
import os

import numba

from ...blas import library as blas_library
from ...timing import blas_threads, restore_blas_threads, set_blas_threads
from .linear import product_routes

def set_threads(n: int, *, blas: int | None = None) -> dict:
    """Use n threads in numba kernels (on the calling thread) and `blas` (default
    n) in BLAS; returns what was set, including the previous values (for
    restore_threads)."""
    n = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
    blas = n if blas is None else max(1, int(blas))
    previous = {"numba": numba.get_num_threads(), "blas": set_blas_threads(blas)}
    numba.set_num_threads(n)
    return {"numba": n, "blas": blas_threads(), "blas_library": blas_library().description,
            "products": product_routes(), "previous": previous}


@contextlib.contextmanager
def one_numba_thread():
    """Run the block with one numba thread on the calling thread (a model replica's
    work), then give the calling thread back its previous count."""
    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(previous)


def restore_threads(info: dict) -> None:
    """Undo set_threads (pass what it returned)."""
    previous = info.get("previous", {})
    if previous.get("numba"):
        numba.set_num_threads(previous["numba"])
    restore_blas_threads(previous.get("blas") or {})


def single_threaded() -> bool:
    """Whether the calling thread runs numba kernels on one thread (a model
    replica): the attention kernels then take their one-thread build (blocked
    products in vector registers, cpu/register_tiles.py), not their prange one."""
    return numba.get_num_threads() == 1


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
