"""One block of memory for a step's many buffers, on huge pages where the OS gives them.

A step of the tiny GPT uses about sixty arrays, most of them 64 KiB to
2 MiB, 41 MiB in all for each replica. Allocated one by one, each
lies on 4 KiB pages: some 10,000 pages, several times what a core's
second-level TLB holds (one to two thousand entries). So a kernel that reads a
saved activation back (cold: the rest of the step has long pushed it out of
the caches) also walks the page tables for its addresses, and the walks miss
the caches too. On 2 MiB pages the same 41 MiB take 21 TLB entries.

Carved from one mapping aligned to 2 MiB and marked for transparent huge pages
(`madvise(MADV_HUGEPAGE)`, Linux), the same arrays lie on 2 MiB pages where the
kernel allows them (its setting `transparent_hugepage` set to "madvise" or
"always"). One layer of attention with cold caches ran about 1.1x faster, the
tiny GPT's two-replica step 1.03-1.06x (kernels/cpu/README.md#huge-pages).

Elsewhere (macOS, Windows, huge pages off) the arrays are the same and lie on
small pages: only the speed differs, never a number. Each array starts on a
64-byte cache line; mapped memory starts zeroed, as np.zeros would.
"""
from __future__ import annotations

import math
import mmap

import numpy as np

HUGE_PAGE = 2 << 20       # bytes: x86-64's and most ARM kernels' transparent huge page
LINE = 64                 # bytes: every array starts on a cache line


def _aligned(nbytes: int, to: int) -> int:
    return (nbytes + to - 1) // to * to


def huge_page_memory(nbytes: int) -> np.ndarray:
    """A zeroed uint8 array of nbytes whose start is aligned to HUGE_PAGE, with the
    OS asked to back it with huge pages (a no-op where it cannot). Under one huge
    page it is plain np.zeros aligned to a cache line: a whole 2 MiB page for a
    few KiB would waste memory."""
    nbytes = max(int(nbytes), 0)
    if nbytes < HUGE_PAGE:
        raw = np.zeros(nbytes + LINE, np.uint8)
        start = (-raw.ctypes.data) % LINE
        return raw[start:start + nbytes]
    size = _aligned(nbytes, HUGE_PAGE)
    if hasattr(mmap, "MAP_PRIVATE"):                  # POSIX: private (shared anonymous
        block = mmap.mmap(-1, size + HUGE_PAGE,       # memory is shmem, which the kernel
                          flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)   # keeps on small pages)
    else:
        block = mmap.mmap(-1, size + HUGE_PAGE)       # Windows: anonymous, zeroed
    raw = np.frombuffer(block, np.uint8)              # keeps the mapping alive
    start = (-raw.ctypes.data) % HUGE_PAGE
    if hasattr(block, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        block.madvise(mmap.MADV_HUGEPAGE)             # before the first touch of any page
    return raw[start:start + size]


def zeros(n: int, dtype) -> np.ndarray:
    """np.zeros(n, dtype) on huge pages (see huge_page_memory)."""
    itemsize = np.dtype(dtype).itemsize
    return huge_page_memory(n * itemsize)[:n * itemsize].view(dtype)


def carve(build, dtype):
    """Run build(zeros) twice: `zeros(*shape)` returns an array of `dtype`. The
    first run only measures (its arrays are never touched, so they cost no
    memory); the second hands out zeroed views of one huge-page block, one after
    another, each on a cache line. Returns what the second run returns."""
    itemsize = np.dtype(dtype).itemsize
    sizes = []

    def measure(*shape):
        sizes.append(_aligned(math.prod(shape) * itemsize, LINE))
        return np.empty(shape, dtype)

    build(measure)
    memory = huge_page_memory(sum(sizes))
    offset = 0

    def take(*shape):
        nonlocal offset
        n = math.prod(shape)
        view = memory[offset:offset + n * itemsize].view(dtype).reshape(shape)
        offset += _aligned(n * itemsize, LINE)
        return view

    return build(take)
