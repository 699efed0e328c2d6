"""memory_rates: the write, streamed-write and read rates of one core or of
several at once, and what a step's kept activations cost at them. What can be
wrong: a sweep that does not touch the whole buffer, or a core that sweeps
another's part (the rate would be too high), writes that copy the wrong
numbers, a buffer sized from a cache the OS never reported, a size the sweeps
cannot cover, the caller's thread count not given back, or the traffic
arithmetic. (The rates themselves are the machine's: checked only to be
positive.)"""
from __future__ import annotations

from contextlib import contextmanager

import numba
import numpy as np
import pytest

from engine.trainer.lab import memory_rates
from engine.trainer.arena import zeros
from engine.trainer.lab.memory_rates import ROW


@contextmanager
def threads_at_most(n):
    """numba's threads set to n, or to all it has if fewer (a part per thread, or
    several parts on one)."""
    previous = numba.get_num_threads()
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    try:
        yield
    finally:
        numba.set_num_threads(previous)


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("offset", [0, 1])         # a line-aligned buffer, and one that is not
@pytest.mark.parametrize("parts", [1, 2, 3])
def test_each_write_copies_the_row_across_the_whole_buffer(streamed, offset, parts):
    rows = 2 * parts
    memory = zeros(rows * ROW + 16, np.float32)
    memory[:] = -1
    buf = memory[offset:offset + rows * ROW]
    row = np.random.default_rng(0).standard_normal(ROW).astype(np.float32)
    with threads_at_most(parts):
        memory_rates._write(buf, row, parts, streamed)
    np.testing.assert_array_equal(buf, np.tile(row, rows))
    assert (memory[:offset] == -1).all() and (memory[offset + rows * ROW:] == -1).all()


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_the_read_sums_every_element(parts):
    buf = np.random.default_rng(1).random(6 * ROW).astype(np.float32)
    with threads_at_most(parts):
        total = memory_rates._read(buf, parts)
    assert total == pytest.approx(buf.astype(np.float64).sum(), rel=1e-5)


@pytest.mark.parametrize("cores", [1, 2])
def test_measure_reports_three_positive_rates_over_the_buffer_it_was_given(cores):
    if cores > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"numba runs {numba.config.NUMBA_NUM_THREADS} thread(s) here")
    before = numba.get_num_threads()
    r = memory_rates.measure(64 * ROW * 4, passes=2, cores=cores)
    assert numba.get_num_threads() == before                 # the caller's threads, back
    assert r["buffer_bytes"] == 64 * ROW * 4 and r["cores"] == cores
    for key in ("write_gbs", "streamed_gbs", "read_gbs"):
        assert np.isfinite(r[key]) and r[key] > 0


@pytest.mark.parametrize("nbytes", [0, 1000, ROW * 4 + 4])
def test_a_size_the_sweeps_cannot_cover_is_refused_with_a_size_that_works(nbytes):
    with pytest.raises(ValueError, match=rf"nbytes={nbytes} must be a positive multiple of "
                                         rf"{ROW * 4}.*pass e\.g\. {ROW * 4}"):
        memory_rates.measure(nbytes)
    with pytest.raises(ValueError, match="passes=0"):
        memory_rates.measure(ROW * 4, passes=0)
    most = numba.config.NUMBA_NUM_THREADS
    with pytest.raises(ValueError, match=rf"cores={most + 1}; numba runs 1 to {most} threads"):
        memory_rates.measure(ROW * 4, cores=most + 1)


def test_the_buffer_is_twice_the_reported_cache_within_its_bounds():
    MiB = 1 << 20
    assert memory_rates.buffer_bytes(0) == memory_rates.MIN_BYTES
    assert memory_rates.buffer_bytes(480 * MiB) == 960 * MiB
    assert memory_rates.buffer_bytes(4096 * MiB) == memory_rates.MAX_BYTES
    odd = memory_rates.buffer_bytes(300 * MiB + 12345)
    assert odd % (ROW * 4) == 0 and 600 * MiB - ROW * 4 < odd <= 600 * MiB + 24690
    three = memory_rates.buffer_bytes(480 * MiB, cores=3)      # a whole row for every part
    assert three % (3 * ROW * 4) == 0 and 960 * MiB - 3 * ROW * 4 < three <= 960 * MiB


def test_the_cache_size_is_read_from_the_oss_description(tmp_path):
    for index, size in (("index0", "48K"), ("index2", "2048K"), ("index3", "491520K"),
                        ("index4", "garbage")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "size").write_text(size + "\n")
    (tmp_path / "index5").mkdir()                  # no size file: skipped
    assert memory_rates.last_level_cache_bytes(str(tmp_path)) == 491520 * 1024
    assert memory_rates.last_level_cache_bytes(str(tmp_path / "missing")) == 0


def test_traffic_is_one_write_and_one_read_of_the_kept_bytes():
    rates = {"write_gbs": 1.0, "streamed_gbs": 4.0, "read_gbs": 2.0}
    ordinary, streamed = memory_rates.traffic_ms(1e9, rates)
    assert ordinary == pytest.approx(1000 + 500) and streamed == pytest.approx(250 + 500)
