"""How fast one core writes and reads memory: what a step's kept activations cost.

A training step writes its kept activations in the forward and reads them
back in the backward. Where they are larger than the caches (the tiny GPT
keeps about 33 MiB a replica), that is traffic to memory, and how fast one
core moves it decides part of the step: the benchmark's "again at once"
profile shows what each call pays for where its data was. `measure()` times
three sweeps over one buffer well past the caches, on the calling thread:

* write: every element stored with ordinary stores, as the step's kernels
  store. An ordinary store to a line that is not in the caches first reads
  the line from memory (a read for ownership), and writes it back later;
* streamed write: whole lines with non-temporal stores
  (`kernels/_streaming.py`), which skip that read and bypass the caches;
* read: a sum over every element.

Each write copies one small row, hot in the first-level cache, across the
buffer, so what is timed is the stores. Every figure is the fastest of a few
passes (a peak rate, like the benchmark's sgemm rate), in GB/s, 1e9 bytes.

The buffer: twice the last-level cache the OS reports, at least MIN_BYTES and
at most MAX_BYTES, on huge pages as the step's own buffers (`arena.py`). A
reported cache need not be what one core can use: a virtual machine reported
a 480 MiB L3, where one core wrote 64 MiB as slowly as 256 MiB (6.8 GB/s)
and read 64 MiB at 25 GB/s against 13 GB/s for 256 MiB. The floor keeps the
buffer past what a core gets of an ordinary machine's caches either way.
"""
from __future__ import annotations

import os

import numpy as np

from ..numba_config import kernel
from ..timing import fastest_seconds
from .arena import zeros
from .kernels._lanes import row_sum
from .kernels._streaming import stream_fence, stream_row

MIN_BYTES = 256 << 20
MAX_BYTES = 1 << 30
ROW = 4096            # float32 elements copied across the buffer: 16 KiB, in L1


@kernel
def _write_plain(buf, row):
    w = row.shape[0]
    for start in range(0, buf.shape[0] - w + 1, w):
        for j in range(w):
            buf[start + j] = row[j]


@kernel
def _write_streamed(buf, row):
    w = row.shape[0]
    for start in range(0, buf.shape[0] - w + 1, w):
        stream_row(row, buf[start:start + w])
    stream_fence()


@kernel
def _read(buf):
    return row_sum(buf, buf.shape[0])


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


def buffer_bytes(cache_bytes: int) -> int:
    """Twice `cache_bytes`, within [MIN_BYTES, MAX_BYTES], a whole number of rows."""
    nbytes = min(MAX_BYTES, max(MIN_BYTES, 2 * cache_bytes))
    return nbytes - nbytes % (ROW * 4)


def measure(nbytes: int | None = None, passes: int = 3) -> dict:
    """One core's memory rates over a buffer of nbytes (default: buffer_bytes of
    the reported last-level cache). Returns {"buffer_bytes", "write_gbs",
    "streamed_gbs", "read_gbs", "reported_cache_bytes"}."""
    cache = last_level_cache_bytes()
    if nbytes is None:
        nbytes = buffer_bytes(cache)
    if nbytes < ROW * 4 or nbytes % (ROW * 4):
        raise ValueError(f"memory_rates.measure: nbytes={nbytes} must be a positive multiple of "
                         f"{ROW * 4} (one row of {ROW} float32); pass e.g. "
                         f"{max(1, nbytes // (ROW * 4)) * ROW * 4}")
    if passes < 1:
        raise ValueError(f"memory_rates.measure: passes={passes}; pass at least 1")
    buf = zeros(nbytes // 4, np.float32)
    row = np.arange(ROW, dtype=np.float32)
    # warmup=1: the first write also touches every page (the OS zeroes each on first use)
    rate = lambda fn: nbytes / fastest_seconds(fn, passes, warmup=1) / 1e9  # noqa: E731
    return {"buffer_bytes": nbytes, "reported_cache_bytes": cache,
            "write_gbs": rate(lambda: _write_plain(buf, row)),
            "streamed_gbs": rate(lambda: _write_streamed(buf, row)),
            "read_gbs": rate(lambda: _read(buf))}


def traffic_ms(kept_bytes: float, rates: dict) -> tuple[float, float]:
    """Milliseconds to write kept_bytes once and read them back once at `rates`
    (measure's): with ordinary stores, and with every write streamed."""
    read = kept_bytes / (rates["read_gbs"] * 1e9)
    return ((kept_bytes / (rates["write_gbs"] * 1e9) + read) * 1e3,
            (kept_bytes / (rates["streamed_gbs"] * 1e9) + read) * 1e3)
