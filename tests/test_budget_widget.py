"""BudgetWidget without a browser: set control values, read the widget models,
and compare with what engine.budget computes for the same settings."""
from __future__ import annotations

import html
import re

import pytest
from hypothesis import given, settings, strategies as st

from engine import budget as B
from engine.budget import lab
from matplotlib.colors import to_hex

import ipywidgets as w

from widgets.budget import BudgetWidget
from widgets.budget_knobs import RedrawnToggleButtons, named_fields
from widgets.budget_views import BAR_PX, CATEGORY_COLORS, CURVE_PX, _share


def png_size(png: bytes) -> tuple[int, int]:
    """Width and height from a PNG's header."""
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


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


def test_every_knob_the_table_shows_on_the_widget_has_a_control(widget):
    knobs = {f for f in B.BudgetConfig.__dataclass_fields__ if f != "name"}
    shown = {k.field for k in B.shown_on("widget")}
    assert set(widget.controls) == shown and set(widget.hidden) == knobs - shown
    assert set(widget.values()) == knobs


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


def test_invalid_settings_withdraw_the_numbers_and_say_where_to_fix_them(widget):
    widget.controls["seq_len"].value = 2048  # GPT-2 small has 1024 learned positions
    assert widget.result is None
    message = html.unescape(widget.message.value)
    assert "longer than block_size=1024" in message
    assert "Change it here: sequence N (training tab), positions (model tab)" in \
        re.sub("<[^>]+>", "", message)
    for shown in widget._results:  # no stale number is left on screen as if current
        assert shown.layout.visibility == "hidden"
    assert widget.summary().startswith("invalid settings: seq_len=2048 is longer")
    widget.controls["seq_len"].value = 512
    assert widget.message.value == "" and widget.readout.layout.visibility == "visible"
    assert shown_peak_bytes(widget) == B.budget(B.preset("gpt2-small", seq_len=512)).peak


def test_heads_are_chosen_among_the_divisors_of_the_width(widget):
    heads = widget.controls["n_head"]
    assert list(heads.options) == [h for h in range(1, 257) if 768 % h == 0]
    widget.controls["d_model"].value = 1000   # 12 does not divide 1000: nearest divisor
    assert 1000 % heads.value == 0 and heads.value == 10
    assert widget.message.value == ""
    assert shown_peak_bytes(widget) == B.budget(B.preset("gpt2-small", d_model=1000,
                                                         n_head=10)).peak


def test_sizes_step_through_powers_of_two_and_keep_exact_values(widget):
    step = widget.steppers["micro_batch"]
    assert {1, 2, 4, 8, 16, 1024} <= set(step.options)
    assert all(v & (v - 1) == 0 for v in step.options)  # 8 is the preset's own value
    step.value = 32
    assert widget.controls["micro_batch"].value == 32
    assert shown_peak_bytes(widget) == B.budget(B.preset("gpt2-small", micro_batch=32)).peak
    widget.controls["micro_batch"].value = 3  # an exact value joins the slider's stops
    assert widget.steppers["micro_batch"].value == 3
    w = BudgetWidget(preset="gpt2-xl", plots=False)  # d=1600 is not a power of two
    assert w.steppers["d_model"].value == 1600 and w.controls["n_head"].value == 25


def test_knobs_that_do_nothing_are_disabled(widget):
    c = widget.controls
    assert c["tensors_per_layer"].disabled and c["n_kv_head"].disabled
    assert c["zero"].disabled and c["grad_precision"].disabled  # one device, fp32
    c["activation_model"].value = "rule"
    assert not c["tensors_per_layer"].disabled
    c["devices"].value = 8
    c["precision"].value = "bf16"
    assert not c["zero"].disabled and not c["grad_precision"].disabled
    widget.preset.value = "llama2-70b"
    assert not c["n_kv_head"].disabled and c["n_kv_head"].value == 8
    c["architecture"].value = "gpt2"  # GPT-2 blocks: back to one K/V head per head
    assert c["n_kv_head"].value == 0 and c["n_kv_head"].disabled


def test_device_fit_line_and_capacity():
    w = BudgetWidget(preset="llama2-7b")
    assert "no device chosen" in w.fit.value
    w.controls["device"].value = "A100-80GB"
    want = B.budget(B.preset("llama2-7b", device="A100-80GB"))
    assert want.device.fits is False
    assert "does not fit" in w.fit.value and "A100-80GB" in w.fit.value
    w.controls["devices"].value = 8
    w.controls["zero"].value = 3
    want = B.budget(B.preset("llama2-7b", device="A100-80GB", devices=8, zero=3))
    assert want.device.fits and ">fits</b>" in w.fit.value
    assert f"B={want.device.largest_micro_batch}" in w.fit.value
    assert f"{want.device.tokens_per_second:,.0f} tokens/s" in w.fit.value
    assert "reduce-scatter gradients" in w.parallel.value
    assert shown_peak_bytes(w) == want.peak
    bar, curve = w._figures
    capacity = [l for l in bar.axes[0].lines if l.get_label() == "A100-80GB memory (80 GiB)"]
    assert capacity and capacity[0].get_ydata()[0] == pytest.approx(80 * 2**30 / 1e9)
    assert "of 85.9 GB (80 GiB)" in w.fit.value  # the data sheet's GiB beside our GB
    w.controls["device"].value = "none"
    assert "no device chosen" in w.fit.value


def test_each_memory_item_keeps_its_colour_in_table_bar_and_curve():
    w = BudgetWidget(preset="gpt2-small", precision="bf16")
    bar, curve = w._figures
    for name in ("weights", "master weights", "gradients", "optimizer state",
                 "activations"):
        assert B.budget(w.config()).memory()[name] > 0
        assert CATEGORY_COLORS[name] in w.readout.value
        bars = [c for c in bar.axes[0].containers if c.get_label() == name]
        assert bars and to_hex(bars[0].patches[0].get_facecolor()) == CATEGORY_COLORS[name]
        areas = [p for p in curve.axes[0].collections if p.get_label() == name]
        assert areas and to_hex(areas[0].get_facecolor()[0]) == CATEGORY_COLORS[name]


def test_choosing_a_preset_loads_all_its_knobs(widget):
    widget.preset.value = "7b-example"
    cfg = B.preset("7b-example")
    for name, control in widget.controls.items():
        assert control.value == getattr(cfg, name), name
    assert shown_peak_bytes(widget) == B.budget(cfg).peak
    assert "134 MB" in widget.readout.value


def test_plots_are_redrawn_in_place_into_image_models():
    w = BudgetWidget(preset="24-layer-example")
    assert bytes(w.bar.value[:4]) == bytes(w.curve.value[:4]) == b"\x89PNG"
    bar, curve = w._figures
    assert curve.axes[0].get_title() == "activations overtake the fixed memory"
    stacked = sum(patch.get_height() for patch in bar.axes[0].patches)
    assert stacked == pytest.approx(w.result.peak / 1e9)  # GB: the unit it reaches
    assert bar.axes[0].get_ylabel() == "GB"
    before = w.curve.value
    w.controls["micro_batch"].value = 2
    assert w._figures[0] is bar and w._figures[1] is curve  # the same figures, redrawn
    assert bytes(w.curve.value) != bytes(before)
    # the same pixel size each time: the CSS box (aspect ratio) never changes
    assert png_size(bytes(w.curve.value)) == png_size(bytes(before)) == CURVE_PX
    assert png_size(bytes(w.bar.value)) == BAR_PX
    tiny = BudgetWidget(preset="tiny")
    assert tiny._figures[0].axes[0].get_ylabel() == "MB"  # units follow the size


def test_measure_needs_valid_settings(widget):
    widget.controls["seq_len"].value = 4096
    widget.measure()
    assert "Fix the settings first" in widget.measure_result.value


def test_measure_shows_engine_bytes_beside_the_prediction():
    w = BudgetWidget(preset="tiny", plots=False, micro_batch=2, seq_len=32, n_layer=2)
    w.measure()
    m = w.measured
    assert m["measured_saved"] == m["predicted_saved"] == w.result.activations.saved
    assert f"{m['measured_saved']:,}" in w.measure_result.value
    assert "+0.00%" in w.measure_result.value
    w.controls["micro_batch"].value = 3   # a new shape retires the old measurement
    assert w.measured is None and "settings changed" in w.measure_result.value
    w.controls["micro_batch"].value = 4   # and the next move clears the message
    assert w.measure_result.value == ""
    assert not w.measure_button.disabled


def test_measure_says_it_is_working_and_drops_a_stale_result(monkeypatch):
    w = BudgetWidget(preset="tiny", plots=False, micro_batch=2, seq_len=32, n_layer=2)
    seen = {}
    real = lab.measure

    def slow_measure(cfg, seed=0, progress=None):  # a knob moves while the engine runs
        seen["button"] = (w.measure_button.disabled, w.measure_button.description)
        seen["text"] = w.measure_result.value
        seen["bar"] = w.measure_progress.layout.visibility
        progress(0.5, 3.0)
        seen["half"] = (w.measure_progress.value, w.measure_result.value)
        result = real(cfg, seed)
        w.controls["micro_batch"].value = 4
        return result

    monkeypatch.setattr(lab, "measure", slow_measure)
    w.measure()
    assert seen["button"] == (True, "measuring...") and "running" in seen["text"]
    assert seen["bar"] == "visible" and seen["half"][0] == 0.5
    assert "50% done, estimating the time left" in seen["half"][1]
    assert w.measure_progress.layout.visibility == "hidden"
    assert w.measured is None and "settings changed" in w.measure_result.value
    assert not w.measure_button.disabled


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


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_setting_gives_a_readout_or_a_message(data):
    """Whatever a learner sets, the widget shows either engine.budget's numbers or
    engine.budget's message: it never raises."""
    widget = BudgetWidget(preset="gpt2-small", plots=False)
    for name, control in widget.controls.items():
        if control.disabled and not hasattr(control, "options"):
            continue  # set by a config file, shown only
        if data.draw(st.booleans(), label=f"change {name}"):
            if hasattr(control, "options"):
                values = [o[1] if isinstance(o, tuple) else o for o in control.options]
                value = data.draw(st.sampled_from(values), label=name)
            elif isinstance(control.value, bool):
                value = data.draw(st.booleans(), label=name)
            elif isinstance(control.value, str):  # a free-form list (LoRA's targets)
                value = data.draw(st.sampled_from(["", "c_attn", "q_proj,v_proj",
                                                   "no_such_layer"]), label=name)
            elif isinstance(control.value, float):
                value = data.draw(st.floats(control.min, control.max), label=name)
            else:
                value = data.draw(st.integers(control.min, min(control.max, 5000)), label=name)
            control.value = value
    cfg = B.BudgetConfig(name=widget.preset.value, **widget.values())
    try:
        want = B.budget(cfg)
    except B.BudgetError as exc:
        assert widget.result is None and str(exc)[:40] in html.unescape(widget.message.value)
    else:
        assert widget.message.value == "" and shown_peak_bytes(widget) == want.peak
    assert_no_dead_end(widget, "random settings")


@pytest.mark.parametrize("name", B.PRESET_NAMES)
def test_every_preset_loads_exactly_through_the_constrained_controls(widget, name):
    """Heads among divisors, power-of-two sliders and K/V choices still hold each
    preset's own values (d=1600, 25 heads, 8 K/V heads of 64, ...)."""
    widget.preset.value = name
    cfg = B.preset(name)
    assert {n: c.value for n, c in widget.controls.items()} == {
        n: getattr(cfg, n) for n in widget.controls}
    assert widget.message.value == "" and shown_peak_bytes(widget) == B.budget(cfg).peak


def test_a_knob_moved_while_measuring_says_the_settings_changed():
    """In a browser the kernel handles a knob moved during "measure" after the
    measurement returns: the result gives way to the message, not to nothing."""
    w = BudgetWidget(preset="tiny", plots=False, micro_batch=2, seq_len=32, n_layer=2)
    w.measure()
    assert w.measured is not None
    w.controls["seq_len"].value = 16  # the queued move arrives
    assert "settings changed" in w.measure_result.value and w.measured is None


def test_zero_buttons_are_redrawn_when_they_are_enabled(widget):
    """ipywidgets 8 draws `disabled` on toggle buttons only when it rebuilds them
    (new labels or icons): each change of `disabled` also swaps the icons."""
    zero = widget.controls["zero"]
    assert zero.disabled
    before = list(zero.icons)
    widget.controls["devices"].value = 8
    assert not zero.disabled and list(zero.icons) != before
    assert all(icon == "" for icon in zero.icons)  # no icon drawn either way
    again = list(zero.icons)
    widget.controls["devices"].value = 1
    assert zero.disabled and list(zero.icons) != again


def test_zero_stage_changes_the_bytes_of_one_device(widget):
    widget.controls["devices"].value = 8
    peaks = []
    for stage in (0, 1, 2, 3):
        widget.controls["zero"].value = stage
        want = B.budget(B.preset("gpt2-small", devices=8, zero=stage))
        assert shown_peak_bytes(widget) == want.peak
        peaks.append(want.peak)
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == 4


def test_readout_table_has_bytes_share_and_whole_model(widget):
    widget.controls["devices"].value = 4
    widget.controls["zero"].value = 3
    b = B.budget(B.preset("gpt2-small", devices=4, zero=3))
    table = widget.readout.value
    for name in ("weights", "gradients", "optimizer state", "activations"):
        value = b.memory()[name]
        assert (f"{name}</td><td class='num'>{B.human_bytes(value)}</td>"
                f"<td class='num'>{_share(value, b.peak)}</td>") in table
    assert f"<td class='num'>{100 * b.memory()['activations'] / b.peak:.0f}%</td>" in table
    assert _share(1, 1000) == "<1%" and _share(0, 10) == "0%" and _share(5, 10) == "50%"
    assert f"<td class='num'>{B.human_bytes(b.fixed['optimizer state'])}</td>" in table
    top = max(b.activations.items, key=lambda x: x.bytes)
    assert f"largest kept tensor: {top.op}" in html.unescape(table)


def test_a_real_step_says_when_its_peak_happens():
    w = BudgetWidget(preset="gpt2-small", plots=False, activation_model="hf")
    b = B.budget(w.config())
    line = html.unescape(w.readout.value)
    assert f"peak during {b.activations.step.peak_moment.name}" in line
    assert shown_peak_bytes(w) == b.peak == sum(b.memory().values())
    assert "step transient" in w.readout.value


def test_legends_sit_below_the_pictures_they_key():
    w = BudgetWidget(preset="llama2-7b", device="A100-80GB")
    for fig in w._figures:
        fig.canvas.draw()
        ax = fig.axes[0]
        legend = ax.get_legend().get_window_extent()
        assert legend.y1 <= ax.bbox.y0, (legend, ax.bbox)  # none of it over the axes


def test_time_left_is_said_steadily(monkeypatch):
    """Odd estimates (14 s, 219 s, 23 s for a run of about 37 s) do not make the
    figure jump, and it never goes up."""
    from widgets import budget as module
    clock = iter(float(t) for t in range(100))
    monkeypatch.setattr(module.time, "monotonic", lambda: next(clock))
    eta = module.TimeLeft()
    eta.start()
    said = [eta(left) for left in (36, 35, 14, 219, 23, 31, 30, 29)]
    assert said[:2] == ["estimating the time left"] * 2
    numbers = [int(re.search(r"(\d+) s left", s).group(1)) for s in said[2:]]
    assert numbers == sorted(numbers, reverse=True) and max(numbers) <= 35


# ------------------------------------------------ never a dead end (issue 51, item 5)
def test_fp32_gradients_then_a_real_step_is_not_a_dead_end(widget):
    """Gradients in fp32, then activations of hf: the widget puts the gradients back to
    storage, says so, greys the buttons with the reason, and shows the numbers."""
    c = widget.controls
    c["precision"].value = "bf16"
    c["grad_precision"].value = "fp32"
    c["activation_model"].value = "hf"
    assert widget.result is not None and widget.message.value == ""
    assert c["grad_precision"].value == "storage" and c["grad_precision"].disabled
    note = html.unescape(widget.note.value)
    assert "gradients in</b> set back to 'storage' for you: a hf step keeps fp32" in note
    assert "gradients in</b>: a hf step" in html.unescape(widget.idle_hints["training"].value)
    c["micro_batch"].value = 4  # later knobs change the numbers again
    assert shown_peak_bytes(widget) == B.budget(widget.config()).peak
    assert widget.note.value == ""  # said once, for the change that caused it
    c["activation_model"].value = "transformer"
    assert not c["grad_precision"].disabled


def test_a_message_naming_a_greyed_control_enables_it(widget):
    """Whatever the rules miss, a control a message names is enabled (the safety net)."""
    c = widget.controls
    c["activation_model"].value = "rule"
    assert c["attention"].disabled
    widget.error = "attention='flash' is refused here; set attention 'standard'."
    widget._message_html()
    assert not c["attention"].disabled


def moves(widget) -> list[tuple[str, object]]:
    """Every value of every choice the widget offers (buttons, lists, switches), and
    numbers that bring the engine's refusals (a short context, a narrow MLP, devices);
    of the devices, none and one card ("this machine" would measure the machine)."""
    found = []
    for name, control in widget.controls.items():
        if isinstance(control, w.Checkbox):
            found += [(name, True), (name, False)]
        elif hasattr(control, "options") and name not in ("n_head", "n_kv_head"):
            options = control.options
            if name == "device":  # none and one card: every card is the same kind of move
                options = [o for o in options if o != B.THIS_MACHINE][:2]
            found += [(name, o) for o in options]
    found += [("n_kv_head", 2), ("d_head", 32), ("d_ff", 1000), ("block_size", 512),
              ("seq_len", 4096), ("devices", 8), ("device_memory", 10**9),
              ("device_flops", 10**12), ("lora_rank", 8), ("lora_targets", "no_such_layer"),
              ("lora_dropout", 0.1)]
    return [(n, v) for n, v in found if n in widget.controls]


def restore(widget, values: dict) -> None:
    """Put settings back on screen as a preset does: load them, then update."""
    widget._load(B.BudgetConfig(**values))
    widget._update()


def assert_no_dead_end(widget, how: str) -> None:
    """Numbers, or a message whose every named knob is a control that can be pressed,
    with the old numbers withdrawn; and one press of a named choice leaves the error."""
    if widget.result is not None:
        assert widget.message.value == "", how
        return
    named = named_fields(widget.error, widget.values())
    assert named, (how, widget.error)
    for field in named:
        assert field in widget.controls, (how, f"{field} is named but not shown", widget.error)
        assert not widget.controls[field].disabled, (how, f"{field} is greyed", widget.error)
    assert all(r.layout.visibility == "hidden" for r in widget._results), how
    state, error = widget.values(), widget.error
    for field in named:
        control = widget.controls[field]
        for option in getattr(control, "options", []):
            control.value = option[1] if isinstance(option, tuple) else option
            left = widget.error != error
            restore(widget, state)
            if left:
                return
    numbers_only = all(not hasattr(widget.controls[f], "options") for f in named)
    assert numbers_only, (how, "no press of a named choice leaves", error)


@pytest.mark.parametrize("preset", ["gpt2-small", "llama2-7b", "7b-example"])
def test_every_message_names_controls_that_can_be_pressed(preset):
    """Walk every pair of moves the widget allows (one, then another) from a preset:
    whatever message results names only enabled controls, and a press of one of them
    leaves it."""
    widget = BudgetWidget(preset=preset, plots=False)
    all_moves = moves(widget)
    start = widget.values()
    errors = set()
    for first, a in all_moves:
        restore(widget, start)
        widget.controls[first].value = a
        assert_no_dead_end(widget, f"{first}={a!r}")
        after_first = widget.values()
        for second, b in all_moves:
            widget.controls[second].value = b
            assert_no_dead_end(widget, f"{first}={a!r}, then {second}={b!r}")
            errors.add(widget.error.split(";")[0][:50])
            restore(widget, after_first)
    assert len(errors) > 5  # the walk reaches the engine's refusals, not only numbers


# ------------------------------------------------ one table of knobs (issue 51, item 1)
def test_controls_are_made_from_the_table_of_knobs(widget):
    """Each control carries its knob's help, choices and bounds (engine.budget.knobs)."""
    for k in B.shown_on("widget"):
        control = widget.controls[k.field]
        assert control.tooltip.startswith(k.help), k.field
        if k.choices:
            assert list(control.options) == list(k.choices), k.field
        elif k.kind is int and k.field not in ("n_head", "n_kv_head"):
            assert (control.min, control.max) == (0 if k.zero_means else k.low, k.high)
        elif k.kind is bool:
            assert isinstance(control, w.Checkbox), k.field
    assert list(widget.controls["device"].options) == ["none", *B.DEVICES, B.THIS_MACHINE]


def test_a_knob_added_to_the_table_appears_with_its_help(monkeypatch):
    """No widget code per knob: a new row of the table is a control, in its group's tab."""
    from engine.budget import knobs as table
    from widgets.budget_knobs import make_controls, tab_of
    new = B.Knob("warmup_steps", "--warmup", int, 0, "steps of learning-rate warm-up",
                 "schedule", low=1, high=10_000, zero_means="no warm-up")
    monkeypatch.setattr(table, "KNOBS", {**table.KNOBS, new.field: new})
    controls = make_controls(B.preset("gpt2-small"))
    box = controls["warmup_steps"]
    assert box.tooltip == "steps of learning-rate warm-up; 0: no warm-up"
    assert (box.min, box.max, box.description) == (0, 10_000, "warmup steps")
    assert tab_of(new) == "schedule"


def test_the_new_device_list_and_headroom_are_on_screen(widget):
    """Devices come from engine.budget.devices (H200 among them); headroom is a box."""
    c = widget.controls
    assert "H200-141GB" in c["device"].options
    c["device"].value = "H200-141GB"
    want = B.budget(widget.config())
    assert "on H200-141GB" in widget.fit.value and want.device.memory == 143_771 * 2**20
    assert widget.controls["headroom"].value == B.knob("headroom").default
    tabs = widget.ui.children[1].children[1]
    devices = tabs.children[list(tabs.titles).index("devices")]
    assert c["headroom"] in devices.children


# ------------------------------------------------ accessibility (issue 51, item 6)
def contrast(one: str, two: str) -> float:
    """WCAG 2 contrast ratio of two #rrggbb colours."""
    def luminance(colour):
        rgb = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    hi, lo = sorted((luminance(one), luminance(two)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_selected_toggles_have_enough_contrast():
    """The selected button's label against its fill is at least 4.5:1, and its fill
    stands out from JupyterLab's unselected one (#eeeeee) by at least 3:1."""
    from widgets import budget as module
    assert contrast(module.SELECTED_FG, module.SELECTED_BG) >= 4.5
    assert contrast(module.SELECTED_BG, "#eeeeee") >= 3
    rule = re.search(r"\.widget-toggle-button\.mod-active[^{]*\{([^}]*)\}", module.STYLE)
    assert rule and f"background-color: {module.SELECTED_BG}" in rule.group(1)
    assert f"color: {module.SELECTED_FG}" in rule.group(1)
    assert "focus-visible" in module.STYLE  # a ring outside the fill shows focus


def test_every_button_row_has_a_name_and_each_button_says_its_row(widget):
    for name, control in widget.controls.items():
        if isinstance(control, w.ToggleButtons):
            assert isinstance(control, RedrawnToggleButtons), name  # disabled shows at once
            assert control.description, name
            assert list(control.tooltips) == [f"{control.description}: {o}"
                                              for o in control.options], name


# ------------------------------------------------ LoRA against full fine-tuning (issue 50)
def test_lora_against_full_fine_tuning_shows_which_terms_shrink():
    """Under activations of hf: full fine-tuning, LoRA r=8 and r=64 (and the rank on
    screen), each term from engine.budget; gradients and optimizer state shrink to the
    adapters', the weights and the activations do not."""
    from widgets.budget_views import _change, lora_terms
    widget = BudgetWidget(preset="llama3.1-8b", plots=False, activation_model="hf",
                          precision="fp32")
    table = html.unescape(widget.lora.value)
    cfg = widget.config()
    full = lora_terms(cfg)
    assert full["gradients"] == B.budget(cfg).fixed["gradients"] > 0
    for rank in (8, 64):
        lora = lora_terms(cfg.with_(lora_rank=rank))
        assert f"LoRA r={rank}" in table
        for term in ("gradients", "optimizer state"):
            assert lora[term] < 0.01 * full[term]
            assert B.human_bytes(lora[term]) in table
        assert abs(lora["weights"] / full["weights"] - 1) < 0.02
        assert f"{_change(lora['weights'], full['weights'])}<" in table  # +0.1%: the adapters
        assert abs(lora["activations"] / full["activations"] - 1) < 0.25
        assert lora["peak"] < full["peak"]
    widget.controls["lora_rank"].value = 16  # the rank on screen joins the two
    assert "LoRA r=16 (set)" in html.unescape(widget.lora.value)
    widget.controls["activation_model"].value = "transformer"
    assert "choose activations of <b>hf</b>" in widget.lora.value
    assert widget.controls["lora_rank"].value == 0 and widget.controls["lora_rank"].disabled


def test_the_fit_line_counts_the_headroom_knob():
    """The verdict is the peak plus the headroom against the card, as the line says."""
    w = BudgetWidget(preset="llama2-7b", plots=False, device="A100-80GB", devices=8, zero=3)
    d = B.budget(w.config()).device
    assert d.fits and f"headroom {B.human_bytes(d.headroom)}" in w.fit.value
    assert f"N={d.longest_sequence:,}" in w.fit.value
    w.controls["headroom"].value = 20 * 10**9  # 68.6 GB + 20 GB > 85.9 GB
    assert "does not fit" in w.fit.value and "headroom 20 GB" in w.fit.value
    assert "Fewest devices that fit" in w.fit.value
