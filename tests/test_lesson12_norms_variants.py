"""Exercise 12.3 against the rules a learner writes in place of the stated one.

Each near miss below is a whole, plausible `summarize_norms`; the check must
reject every one with a hint that names that rule, and pass right answers
written in other ways (float32 sums among them).
"""
from __future__ import annotations

import numpy as np
import pytest

from check_tools import fails_with
from coursework import lesson12


def _global(group_norms, dtype=np.float64):
    table = np.array([np.asarray(v, dtype=dtype) for v in group_norms.values()])
    return np.sqrt((table ** 2).sum(axis=0))


def _frozen(group_norms):
    return [k for k, v in group_norms.items() if all(x == 0.0 for x in v)]


def with_spike_rule(yardstick, start=1, above=lambda n, limit: n > limit):
    """A summarize_norms whose spike rule compares norm[t] with factor * yardstick(total, t)."""
    def summarize_norms(group_norms, spike_factor=10.0):
        total = _global(group_norms)
        spikes = [t for t in range(start, total.size)
                  if above(total[t], spike_factor * yardstick(total, t))]
        return total, spikes, _frozen(group_norms)
    return summarize_norms


def with_frozen_rule(is_frozen):
    def summarize_norms(group_norms, spike_factor=10.0):
        right = lesson12.summarize_norms_reference(group_norms, spike_factor)
        return right[0], right[1], [k for k, v in group_norms.items()
                                    if is_frozen(np.asarray(v, dtype=np.float64))]
    return summarize_norms


def _safe_median(values):
    return float(np.median(values)) if len(values) else float("inf")


def _trimmed(values, share=0.1):
    cut = int(share * len(values))
    return float(np.mean(np.sort(values)[cut:len(values) - cut]))


NEAR_MISSES = {
    "median one step too few (leaves out t-1)": (
        with_spike_rule(lambda n, t: _safe_median(n[:t - 1])), "leaves out step t-1"),
    "median one step too few (leaves out step 0)": (
        with_spike_rule(lambda n, t: _safe_median(n[1:t])), "leaves out step 0"),
    "rolling median over 5 steps": (
        with_spike_rule(lambda n, t: np.median(n[max(0, t - 5):t])),
        "rolling window"),
    "rolling median over 20 steps": (
        with_spike_rule(lambda n, t: np.median(n[max(0, t - 20):t])),
        "rolling window"),
    "trimmed mean (10% each end)": (
        with_spike_rule(lambda n, t: _trimmed(n[:t], 0.1)), "trimmed mean"),
    "trimmed mean (25% each end)": (
        with_spike_rule(lambda n, t: _trimmed(n[:t], 0.25)), "trimmed mean"),
    "starts one step late": (
        with_spike_rule(lambda n, t: np.median(n[:t]), start=2), "starts at step 2"),
    "at least, not exceeds": (
        with_spike_rule(lambda n, t: np.median(n[:t]), above=lambda n, limit: n >= limit),
        "(> , not >=)"),
    "mean of the earlier steps": (
        with_spike_rule(lambda n, t: np.mean(n[:t])), "mean of the earlier steps"),
    "the step before": (
        with_spike_rule(lambda n, t: n[t - 1]), "step before it"),
    "median of the whole log": (
        with_spike_rule(lambda n, t: np.median(n)), "median of the whole log"),
    "median including step t": (
        with_spike_rule(lambda n, t: np.median(n[:t + 1])), "includes step t itself"),
    "frozen by np.allclose(v, 0)": (
        with_frozen_rule(lambda v: np.allclose(v, 0)), "'vanishing' has tiny norms"),
    "frozen by np.isclose(v, 0).all()": (
        with_frozen_rule(lambda v: np.isclose(v, 0).all()), "not with a tolerance"),
    "frozen by a zero at the last step": (
        with_frozen_rule(lambda v: v[-1] == 0.0), "zero at its last step only"),
}


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_12_3_rejects_the_near_miss_and_names_it(name):
    fn, phrase = NEAR_MISSES[name]
    fails_with(lesson12.check_summarize_norms, fn, words=("Exercise 12.3", phrase))


def test_12_3_each_rule_is_told_apart_by_at_least_one_log():
    """The logs, not luck in the check's order, separate each near miss from the rule."""
    for name, (fn, _) in NEAR_MISSES.items():
        differs = []
        for _, make in lesson12.NORM_LOGS:
            log = make()
            _, spikes, frozen = fn(log, 10.0)
            _, want_spikes, want_frozen = lesson12.summarize_norms_reference(log, 10.0)
            differs.append(sorted(spikes) != want_spikes or sorted(frozen) != want_frozen)
        assert any(differs), name


def summarize_in_float32(group_norms, spike_factor=10.0):
    total = _global(group_norms, np.float32)
    spikes = [t for t in range(1, total.size) if total[t] > spike_factor * np.median(total[:t])]
    return total, spikes, _frozen(group_norms)


def summarize_with_a_loop(group_norms, spike_factor=10.0):
    names = list(group_norms)
    steps = len(group_norms[names[0]])
    total, spikes = [], []
    for t in range(steps):
        total.append(sum(group_norms[k][t] ** 2 for k in names) ** 0.5)
        if t and total[t] > spike_factor * float(np.median(total[:t])):
            spikes.append(t)
    return total, spikes, [k for k in names if not any(group_norms[k])]


@pytest.mark.parametrize("fn", [summarize_in_float32, summarize_with_a_loop])
def test_12_3_passes_right_answers_written_differently(fn, capsys):
    lesson12.check_summarize_norms(fn)
    assert "Exercise 12.3 (summarize_norms) passed" in capsys.readouterr().out


def test_12_3_a_float16_norm_is_named_by_its_precision_not_by_the_formula():
    def in_float16(group_norms, spike_factor=10.0):
        total, spikes, frozen = summarize_in_float32(group_norms, spike_factor)
        return _global(group_norms, np.float16).astype(np.float64), spikes, frozen
    message = fails_with(lesson12.check_summarize_norms, in_float16, words=("precision",))
    assert "sqrt" not in message and "**2" not in message
