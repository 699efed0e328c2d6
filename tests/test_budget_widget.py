"""BudgetWidget without a browser: set control values, read the widget models,
and compare with what engine.budget computes for the same settings."""
from __future__ import annotations

import html
import re

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from engine import budget as B
from widgets.budget import BudgetWidget


def shown_peak_bytes(widget: BudgetWidget) -> int:
    m = re.search(r"class='budget-peak-bytes'>([\d,]+)<", widget.readout.value)
    assert m, widget.readout.value
    return int(m.group(1).replace(",", ""))


@pytest.fixture
def widget():
    return BudgetWidget(preset="gpt2-small", plots=False)


def test_initial_readout_is_the_preset_budget(widget):
    assert shown_peak_bytes(widget) == B.budget(B.preset("gpt2-small")).peak
    assert widget.message.value == ""
    assert "budget-readout" in widget.readout._dom_classes


def test_every_config_knob_has_a_control(widget):
    knobs = {f for f in B.BudgetConfig.__dataclass_fields__ if f != "name"}
    assert set(widget.controls) == knobs


@pytest.mark.parametrize("knob, value", [("micro_batch", 3), ("seq_len", 512),
                                         ("n_layer", 6), ("precision", "bf16"),
                                         ("optimizer", "sgd"), ("recompute", "full"),
                                         ("activation_model", "rule"), ("dropout", True)])
def test_moving_a_knob_shows_engine_budget_for_the_new_value(widget, knob, value):
    before = shown_peak_bytes(widget)
    widget.controls[knob].value = value
    want = B.budget(B.preset("gpt2-small", **{knob: value})).peak
    assert shown_peak_bytes(widget) == want != before
    assert widget.result.config == B.preset("gpt2-small", **{knob: value})


def test_flops_table_follows_accumulation(widget):
    widget.controls["accumulation"].value = 4
    per_step = B.budget(B.preset("gpt2-small", accumulation=4)).flops["per_step"]["total"]
    assert B.human_flops(per_step) in widget.flops_table.value
    assert "32,768 tokens" in widget.flops_table.value  # 4 x 8 x 1024


def test_recompute_toggle_reports_bytes_saved_and_flops_added(widget):
    assert "recompute off" in widget.tradeoff.value
    widget.controls["recompute"].value = "full"
    t = B.recompute_tradeoff(B.preset("gpt2-small", recompute="full"))
    assert f"saves {B.human_bytes(t['bytes_saved'])}" in widget.tradeoff.value
    assert f"adds {B.human_flops(t['flops_added'])}" in widget.tradeoff.value
    assert "+33% compute" in widget.tradeoff.value  # one extra forward on top of 3


def test_invalid_settings_show_a_message_not_a_traceback(widget):
    good = widget.readout.value
    widget.controls["n_head"].value = 5
    assert widget.result is None
    assert "does not divide" in widget.message.value and "Allowed head counts" in widget.message.value
    assert widget.readout.value == good  # the last valid readout stays
    widget.controls["n_head"].value = 8
    assert widget.message.value == ""
    assert shown_peak_bytes(widget) == B.budget(B.preset("gpt2-small", n_head=8)).peak


def test_choosing_a_preset_loads_all_its_knobs(widget):
    widget.preset.value = "7b-example"
    cfg = B.preset("7b-example")
    for name, control in widget.controls.items():
        assert control.value == getattr(cfg, name), name
    assert shown_peak_bytes(widget) == B.budget(cfg).peak
    assert "134 MB" in widget.readout.value


def test_plots_are_drawn_into_output_models():
    w = BudgetWidget(preset="24-layer-example")
    assert len(w.bar.outputs) == 1 and len(w.curve.outputs) == 1
    bar, curve = w._figures
    assert curve.axes[0].get_title() == "activations overtake the fixed memory"
    stacked = sum(patch.get_height() for patch in bar.axes[0].patches)
    assert stacked == pytest.approx(w.result.peak / 1e9)
    w.controls["micro_batch"].value = 2
    assert len(w.curve.outputs) == 1  # replaced, not appended


def test_measure_needs_valid_settings(widget):
    widget.controls["n_head"].value = 7
    widget.measure()
    assert "Fix the settings first" in widget.measure_result.value


def test_measure_shows_engine_bytes_beside_the_prediction():
    w = BudgetWidget(preset="tiny", plots=False, micro_batch=2, seq_len=32, n_layer=2)
    w.measure()
    m = w.measured
    assert m["measured_saved"] == m["predicted_saved"] == w.result.activations.saved
    assert f"{m['measured_saved']:,}" in w.measure_result.value
    assert "+0.00%" in w.measure_result.value
    w.controls["micro_batch"].value = 3   # a new shape clears the old measurement
    assert w.measured is None and w.measure_result.value == ""


def test_measure_with_checkpointing_shows_the_higher_peak():
    w = BudgetWidget(preset="tiny", plots=False, micro_batch=2, seq_len=32, recompute="full")
    w.measure()
    m = w.measured
    assert m["measured_peak"] == m["predicted_peak"] == w.result.activations.peak
    assert m["measured_saved"] < m["measured_peak"]
    assert f"{m['measured_peak']:,}" in w.measure_result.value


def test_measure_of_a_huge_shape_says_why_not(widget):
    widget.measure()
    assert "too large to measure" in widget.measure_result.value


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_setting_gives_a_readout_or_a_message(widget, data):
    """Whatever a learner sets, the widget shows either engine.budget's numbers or
    engine.budget's message: it never raises."""
    for name, control in widget.controls.items():
        if data.draw(st.booleans(), label=f"change {name}"):
            if hasattr(control, "options"):
                value = data.draw(st.sampled_from(list(control.options)), label=name)
            elif isinstance(control.value, bool):
                value = data.draw(st.booleans(), label=name)
            else:
                value = data.draw(st.integers(control.min, min(control.max, 5000)), label=name)
            control.value = value
    cfg = B.BudgetConfig(name=widget.preset.value,
                         **{n: c.value for n, c in widget.controls.items()})
    try:
        want = B.budget(cfg)
    except B.BudgetError as exc:
        assert widget.result is None and str(exc)[:40] in html.unescape(widget.message.value)
    else:
        assert widget.message.value == "" and shown_peak_bytes(widget) == want.peak
