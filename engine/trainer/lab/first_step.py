"""The first step of a run: numba compiles each kernel (or loads it from the
on-disk cache), and the step's writes fault in each page of its buffers once.
`first_step` times it apart from the steady state and says what it paid for."""
from __future__ import annotations

import time


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


def _numba_kernels():
    from numba.core.registry import CPUDispatcher
    from ...numba_config import ParallelKernel
    from .. import kernels as fused
    found = []
    for mod in (fused.embedding, fused.layernorm, fused.gelu, fused.attention,
                fused.flash_attention, fused.cpu.lanes,
                fused.crossentropy, fused.residual, fused.linear, fused.adamw):
        for v in vars(mod).values():
            if isinstance(v, CPUDispatcher):
                found.append(v)
            elif isinstance(v, ParallelKernel):
                found += v.dispatchers()
    return list({id(d): d for d in found}.values())      # helpers imported twice, once


def first_step(ours) -> tuple[float, dict]:
    """Run step 0 (`ours(0)`); returns its seconds and what it compiled, loaded,
    faulted in. numba counts cache hits from the process's start, so the counts
    are taken before and after: a table's later shapes would otherwise report the
    earlier ones' compiles."""
    faults, resident = _page_faults(), _resident_bytes()
    kernels = _numba_kernels()
    before = _cache_stats(kernels)
    t0 = time.perf_counter()
    ours(0)
    seconds = time.perf_counter() - t0
    cache = {k: n - before[k] for k, n in _cache_stats(kernels).items()}
    if faults is not None:
        cache["page_faults"] = _page_faults() - faults
    if resident is not None:
        cache["newly_resident_bytes"] = max(0, _resident_bytes() - resident)
    return seconds, cache
