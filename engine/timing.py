"""Wall-clock timing as a median of several runs.

The lessons' timing cells, the exercise checks and the sgemm and matmul
references of `python -m engine.bench` use `median_seconds`, so a single run
slowed down by something else on the machine does not decide the result. The
trainer's own per-phase and per-kernel times are read off `time.perf_counter`
inside the step, where a median of repeats is not possible.
"""
from __future__ import annotations

import time

import numpy as np


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
