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
