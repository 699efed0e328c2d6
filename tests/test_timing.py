import pytest

from engine.timing import median_seconds


def test_median_ignores_one_slow_run_and_warmup_is_untimed():
    import time
    calls = []

    def fn():
        calls.append(None)
        if len(calls) in (1, 3):          # the warm-up call and one timed call are slow
            time.sleep(0.05)

    t = median_seconds(fn, repeats=5, warmup=1)
    assert len(calls) == 6
    assert t < 0.02


def test_repeats_must_be_positive():
    with pytest.raises(ValueError, match="repeats must be at least 1, got 0"):
        median_seconds(lambda: None, repeats=0)


def test_fixed_threads_sets_every_blas_and_numba_then_restores():
    import numba

    from engine.blas import openblas_entry_points
    from engine.timing import _BLAS_GETTERS, fixed_threads

    def blas_sizes():
        return {path: get() for path, get in openblas_entry_points(_BLAS_GETTERS)}

    before_blas, before_numba = blas_sizes(), numba.get_num_threads()
    assert before_blas, "numpy's and SciPy's OpenBLAS should both be found on Linux"
    with fixed_threads(1) as n:
        assert n == 1
        assert set(blas_sizes().values()) == {1}       # numpy's BLAS and SciPy's alike
        assert numba.get_num_threads() == 1
    assert blas_sizes() == before_blas
    assert numba.get_num_threads() == before_numba


def test_fixed_threads_restores_after_an_exception():
    import numba

    from engine.timing import fixed_threads

    before = numba.get_num_threads()
    with pytest.raises(RuntimeError):
        with fixed_threads(1):
            raise RuntimeError("inside the measurement")
    assert numba.get_num_threads() == before


def test_fastest_seconds_is_the_shortest_call():
    import time

    from engine.timing import fastest_seconds
    pauses = iter([0.03, 0.001, 0.02])
    assert fastest_seconds(lambda: time.sleep(next(pauses)), repeats=3) < 0.015
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        fastest_seconds(lambda: None, repeats=0)
