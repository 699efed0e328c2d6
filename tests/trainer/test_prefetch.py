"""The attention kernels' software prefetch (kernels/cpu/prefetch.py): a hint that
changes no result, so what can be wrong is which lines it asks for and when.

Checked here: the lines asked for are exactly those that hold a row, wherever
the row starts; each block of query rows names the block that really comes
next in the kernels' order (its own pair's next block, then the next pair's
first, then none); and asking for rows of any view the kernels pass leaves
every number as it was. (That the kernels give the same results with it, in
both builds, is checked by the attention tests.)"""
from __future__ import annotations

import numpy as np
import pytest

from engine.trainer.kernels.cpu.prefetch import LINE, prefetch_rows, row_lines
from engine.trainer.kernels.attention import ROW_BLOCK, _next_block, _next_pair


@pytest.mark.parametrize("start", [0, 4, 60, 64, 100, 127, 4096 + 8])
@pytest.mark.parametrize("row_bytes", [4, 60, 64, 65, 128, 132, 1536])
def test_row_lines_are_exactly_the_lines_holding_the_row(start, row_bytes):
    first, stop = row_lines(start, row_bytes)
    asked = set(range(first, stop, LINE))
    holding = {byte - byte % LINE for byte in range(start, start + row_bytes)}
    assert asked == holding


def _blocks_in_kernel_order(B, H, T):
    """(batch, head, r0, r1) of every block, in the order the one-thread builds run them."""
    return [(task // H, task % H, r0, min(r0 + ROW_BLOCK, T))
            for task in range(B * H) for r0 in range(0, T, ROW_BLOCK)]


@pytest.mark.parametrize("B,H,T", [(1, 1, 1), (2, 3, 7), (1, 2, ROW_BLOCK),
                                   (2, 2, 3 * ROW_BLOCK), (1, 4, 150)])
def test_each_block_names_the_block_that_comes_next(B, H, T):
    blocks = _blocks_in_kernel_order(B, H, T)
    for i, (b, h, r0, r1) in enumerate(blocks):
        nb, nh = _next_pair(b * H + h, B, H)
        named = tuple(_next_block(b, h, r1, T, nb, nh))
        if i + 1 < len(blocks):
            assert named == blocks[i + 1], (b, h, r0, r1)
        else:
            assert named[0] == -1, "after the last block there is nothing to ask for"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_prefetching_a_views_rows_changes_nothing(dtype):
    rng = np.random.default_rng(3)
    qkv = rng.standard_normal((64, 3 * 24)).astype(dtype)
    before = qkv.copy()
    for view in (qkv[:, 8:16], qkv[:, 24 + 8:24 + 16], qkv[:, ::5], qkv[10:20], qkv[:, :0]):
        prefetch_rows(view, 0, view.shape[0])
        prefetch_rows(view, 3, 2)                      # an empty range asks for nothing
    assert np.array_equal(qkv, before)
