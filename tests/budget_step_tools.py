"""One check shared by the budget's measured tables: a step run on this CPU in
PyTorch against the budget's prediction of that very step."""
from __future__ import annotations

import pytest

import engine.budget as bm
from engine.budget import real_step_activations
from engine.budget.counts import fixed_bytes


def assert_cpu_step_as_predicted(cfg, rel: float = 0.05) -> None:
    """Weights to the byte; activations, the peak and step 1's peak within `rel`."""
    from engine.budget.lab.torch_step import measure_step
    m = measure_step(cfg, device="cpu")
    assert m.config == cfg, "the CPU ran another step than the one predicted"
    acts = real_step_activations(cfg, device="cpu")
    assert m.weights == fixed_bytes(cfg)["weights"]
    assert acts.saved == pytest.approx(m.activations, rel=rel)
    assert bm.budget(cfg).fixed_total + acts.peak == pytest.approx(m.peak, rel=rel)
    assert acts.step.first_step_peak_moment.bytes == pytest.approx(m.peak_first_step, rel=rel)
