"""Row reductions the compiler can vectorise without fast-math.

A loop `total += a[j]` is a chain: each addition waits for the one before,
and without fast-math LLVM may not reorder it (that would change the
rounding), so the loop stays scalar, and any exp or multiply inside it with
it. These helpers write the reordering out instead: LANES running partial
sums, lane k taking the elements j = k (mod LANES), then the partials
combined in one fixed tree. The order is part of the source, so every
compile (fresh or loaded from the cache) gives the same bits, and the LANES
independent additions of a pass become one vector instruction (LANES = 8:
one AVX2 register of float32).

    row_sum(a, n)     sum of a[:n]
    row_dot(a, b, n)  sum of a[:n] * b[:n]
    row_max(a, n)     max of a[:n] (exact in any order; lanes only for speed)
"""
from __future__ import annotations

from ...numba_config import kernel

LANES = 8


@kernel
def _combine(p0, p1, p2, p3, p4, p5, p6, p7):
    return ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))


@kernel
def row_sum(a, n):
    """sum(a[:n]) in LANES partial sums, combined in a fixed order."""
    zero = a.dtype.type(0)
    p0 = p1 = p2 = p3 = p4 = p5 = p6 = p7 = zero
    full = n - n % LANES
    for j in range(0, full, LANES):
        p0 += a[j]
        p1 += a[j + 1]
        p2 += a[j + 2]
        p3 += a[j + 3]
        p4 += a[j + 4]
        p5 += a[j + 5]
        p6 += a[j + 6]
        p7 += a[j + 7]
    for j in range(full, n):
        p0 += a[j]
    return _combine(p0, p1, p2, p3, p4, p5, p6, p7)


@kernel
def row_dot(a, b, n):
    """sum(a[:n] * b[:n]) in LANES partial sums, combined in a fixed order."""
    zero = a.dtype.type(0)
    p0 = p1 = p2 = p3 = p4 = p5 = p6 = p7 = zero
    full = n - n % LANES
    for j in range(0, full, LANES):
        p0 += a[j] * b[j]
        p1 += a[j + 1] * b[j + 1]
        p2 += a[j + 2] * b[j + 2]
        p3 += a[j + 3] * b[j + 3]
        p4 += a[j + 4] * b[j + 4]
        p5 += a[j + 5] * b[j + 5]
        p6 += a[j + 6] * b[j + 6]
        p7 += a[j + 7] * b[j + 7]
    for j in range(full, n):
        p0 += a[j] * b[j]
    return _combine(p0, p1, p2, p3, p4, p5, p6, p7)


@kernel
def row_max(a, n):
    """max(a[:n]) for n >= 1, in LANES running maxima."""
    p0 = p1 = p2 = p3 = p4 = p5 = p6 = p7 = a[0]
    full = n - n % LANES
    for j in range(0, full, LANES):
        p0 = max(p0, a[j])
        p1 = max(p1, a[j + 1])
        p2 = max(p2, a[j + 2])
        p3 = max(p3, a[j + 3])
        p4 = max(p4, a[j + 4])
        p5 = max(p5, a[j + 5])
        p6 = max(p6, a[j + 6])
        p7 = max(p7, a[j + 7])
    for j in range(full, n):
        p0 = max(p0, a[j])
    return max(max(max(p0, p1), max(p2, p3)), max(max(p4, p5), max(p6, p7)))
