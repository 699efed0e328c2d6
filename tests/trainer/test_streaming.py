"""Streaming stores (kernels/cpu/streaming.py): a copy that skips the caches.

What can be wrong: a value copied wrong or not at all (the whole lines go one
way, the partial lines at either end another), a byte written outside the
row, or the machine code not streaming after all (LLVM is free to drop the
hint it is given). Checked here for every start of the row within a line and
every length across a few lines, both float types, strided rows; and that
the compiled copy uses the non-temporal store on x86, ordinary stores
elsewhere. (That attention's forward still gives every number it gave,
P included, is checked by the attention tests.)"""
from __future__ import annotations

import numba
import numpy as np
import pytest

from engine.trainer.arena import huge_page_memory
from engine.trainer.kernels.cpu.streaming import LINE, X86, stream_fence, stream_row


@numba.njit(cache=False)
def _stream_rows(src, dst):
    for n in range(dst.shape[0]):
        stream_row(src[n], dst[n])
    stream_fence()


@numba.njit(cache=False)
def _stream_one(src, dst):
    stream_row(src, dst)
    stream_fence()


def _aligned(n, dtype):
    """n elements of dtype starting on a cache line, filled with a sentinel."""
    out = huge_page_memory(n * np.dtype(dtype).itemsize).view(dtype)
    out[:] = -7
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_start_and_length_copies_exactly_and_nothing_else(dtype):
    per_line = LINE // np.dtype(dtype).itemsize
    rng = np.random.default_rng(0)
    src = rng.standard_normal(4 * per_line + 8).astype(dtype)
    for start in range(per_line + 1):
        for length in range(0, 3 * per_line + 3):
            buf = _aligned(5 * per_line, dtype)
            _stream_one(src[:length], buf[start:start + length])
            assert np.array_equal(buf[start:start + length], src[:length]), (start, length)
            assert (buf[:start] == -7).all() and (buf[start + length:] == -7).all(), \
                (start, length)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_of_arrays_and_strided_views(dtype):
    rng = np.random.default_rng(1)
    src = rng.standard_normal((6, 40)).astype(dtype)
    dst = _aligned(6 * 40, dtype).reshape(6, 40)
    _stream_rows(src, dst)
    assert np.array_equal(dst, src)
    wide = _aligned(6 * 80, dtype).reshape(6, 80)
    _stream_rows(src, wide[:, ::2])                    # a strided destination
    assert np.array_equal(wide[:, ::2], src) and (wide[:, 1::2] == -7).all()
    dst[:] = 0
    _stream_rows(np.asfortranarray(src), dst)          # a strided source
    assert np.array_equal(dst, src)


def test_the_compiled_copy_streams_on_x86_and_stores_plainly_elsewhere():
    src = np.ones((2, 64), np.float32)
    dst = _aligned(128, np.float32).reshape(2, 64)
    _stream_rows(src, dst)
    assembly = _stream_rows.inspect_asm(_stream_rows.signatures[0]).lower()
    streams = "movntps" in assembly or "movntdq" in assembly
    assert streams == X86, "x86 should stream whole lines (vmovntps); other CPUs store plainly"
    assert ("sfence" in assembly) == X86
