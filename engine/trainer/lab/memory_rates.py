"""How fast the cores write and read memory: what a step's kept activations cost.

A training step writes its kept activations in the forward and reads them
back in the backward. Where they are larger than the caches (the tiny GPT
keeps about 33 MiB a replica), that is traffic to memory, and how fast each
core moves it decides part of the step: the benchmark's "again at once"
profile shows what each call pays for where its data was. `measure()` times
three sweeps over one buffer well past the caches, on one core or on several
at once (each sweeping its own part: the trainer's replicas write and read
their activations side by side, and a machine whose cores share one memory
bus may give each of them less than one core gets alone):

* write: every element stored with ordinary stores, as the step's kernels
  store. An ordinary store to a line that is not in the caches first reads
  the line from memory (a read for ownership), and writes it back later;
* streamed write: whole lines with non-temporal stores
  (`kernels/cpu/streaming.py`), which skip that read and bypass the caches;
* read: a sum over every element.

Each write copies one small row, hot in the first-level cache, across the
buffer, so what is timed is the stores. Every figure is the fastest of a few
passes (a peak rate, like the benchmark's sgemm rate), in GB/s, 1e9 bytes,
all cores' bytes together.

The buffer: twice the last-level cache the OS reports, at least MIN_BYTES and
at most MAX_BYTES, on huge pages as the step's own buffers (`arena.py`). A
reported cache need not be what one core can use: a virtual machine reported
a 480 MiB L3, where one core wrote 64 MiB as slowly as 256 MiB (6.8 GB/s)
and read 64 MiB at 25 GB/s against 13 GB/s for 256 MiB. The floor keeps the
buffer past what a core gets of an ordinary machine's caches either way.
"""
from __future__ import annotations

import os

import numba
import numpy as np

from ...numba_config import parallel_kernel, prange, row_kernel
from ...timing import fastest_seconds
from ..arena import zeros
from ..kernels.cpu.lanes import row_sum
from ..kernels.cpu.streaming import stream_fence, stream_row

MIN_BYTES = 256 << 20
MAX_BYTES = 1 << 30
ROW = 4096            # float32 elements copied across the buffer: 16 KiB, in L1


@row_kernel
def _part(buf, parts, p):
    """Part p of buf cut into `parts` equal pieces (each core sweeps its own)."""
    size = buf.shape[0] // parts
    return buf[p * size:(p + 1) * size]


@parallel_kernel
def _write(buf, row, parts, streamed):
    """Each core copies `row` across its part: with ordinary stores, or streamed."""
    w = row.shape[0]
    for p in prange(parts):
        part = _part(buf, parts, p)
        for start in range(0, part.shape[0] - w + 1, w):
            if streamed:
                stream_row(row, part[start:start + w])
            else:
                for j in range(w):
                    part[start + j] = row[j]
        stream_fence()                     # each core's own streaming stores, if any


@parallel_kernel
def _read(buf, parts):
    sums = np.zeros(parts, np.float64)
    for p in prange(parts):
        part = _part(buf, parts, p)
        sums[p] = row_sum(part, part.shape[0])
    return sums.sum()


def last_level_cache_bytes(folder: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """The largest cache the OS reports for the first core (Linux's sysfs: each
    index*/size reads like "491520K"), or 0 where it reports none."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes = [0]
    try:
        entries = os.listdir(folder)
    except OSError:
        return 0
    for entry in entries:
        try:
            with open(os.path.join(folder, entry, "size")) as f:
                text = f.read().strip()
        except OSError:
            continue
        number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "")
        if number.isdigit():
            sizes.append(int(number) * units.get(unit, 1))
    return max(sizes)


def buffer_bytes(cache_bytes: int, cores: int = 1) -> int:
    """Twice `cache_bytes`, within [MIN_BYTES, MAX_BYTES], a whole number of rows
    for each of `cores` parts."""
    nbytes = min(MAX_BYTES, max(MIN_BYTES, 2 * cache_bytes))
    return nbytes - nbytes % (ROW * 4 * cores)


def measure(nbytes: int | None = None, passes: int = 3, cores: int = 1) -> dict:
    """Memory rates of `cores` cores at once, each sweeping its own part of a
    buffer of nbytes (default: buffer_bytes of the reported last-level cache).
    Returns {"cores", "buffer_bytes", "reported_cache_bytes", "write_gbs",
    "streamed_gbs", "read_gbs"}, the rates of all cores together."""
    most = numba.config.NUMBA_NUM_THREADS
    if not 1 <= cores <= most:
        raise ValueError(f"memory_rates.measure: cores={cores}; numba runs 1 to {most} "
                         f"threads here (NUMBA_NUM_THREADS), pass one of those")
    cache = last_level_cache_bytes()
    if nbytes is None:
        nbytes = buffer_bytes(cache, cores)
    unit = ROW * 4 * cores
    if nbytes < unit or nbytes % unit:
        raise ValueError(f"memory_rates.measure: nbytes={nbytes} must be a positive multiple of "
                         f"{unit} (a row of {ROW} float32 for each of {cores} core(s)); pass "
                         f"e.g. {max(1, nbytes // unit) * unit}")
    if passes < 1:
        raise ValueError(f"memory_rates.measure: passes={passes}; pass at least 1")
    buf = zeros(nbytes // 4, np.float32)
    row = np.arange(ROW, dtype=np.float32)
    previous = numba.get_num_threads()
    numba.set_num_threads(cores)          # one thread: the kernels' serial builds
    try:
        # warmup=1: the first write also touches every page (the OS zeroes each on first use)
        rate = lambda fn: nbytes / fastest_seconds(fn, passes, warmup=1) / 1e9  # noqa: E731
        return {"cores": cores, "buffer_bytes": nbytes, "reported_cache_bytes": cache,
                "write_gbs": rate(lambda: _write(buf, row, cores, False)),
                "streamed_gbs": rate(lambda: _write(buf, row, cores, True)),
                "read_gbs": rate(lambda: _read(buf, cores))}
    finally:
        numba.set_num_threads(previous)


def traffic_ms(kept_bytes: float, rates: dict) -> tuple[float, float]:
    """Milliseconds to write kept_bytes once and read them back once at `rates`
    (measure's, all its cores together): with ordinary stores, and with every
    write streamed."""
    read = kept_bytes / (rates["read_gbs"] * 1e9)
    return ((kept_bytes / (rates["write_gbs"] * 1e9) + read) * 1e3,
            (kept_bytes / (rates["streamed_gbs"] * 1e9) + read) * 1e3)
