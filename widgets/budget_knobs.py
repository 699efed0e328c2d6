"""The budget widget's controls, made from `engine.budget`'s table of knobs.

Every knob the table shows on the widget (`shown_on("widget")`) gets a control built
from its row: toggle buttons for its choices, a checkbox for a switch, a bounded box
for a number (its bounds, 0 allowed where the table says what 0 means), a text box for
a free-form string; the knob's help is the control's tooltip. What the widget adds is
its own: a short label, a tab per group of knobs, and the few controls whose choices
follow other knobs (heads among the divisors of the width, the device list).

The budget's compatibility table (`engine.budget.compat`) says which knobs do nothing
in which mode. Such a knob is greyed out with its reason; when the mode refuses the value it holds (gradients in fp32 under a real
framework's step), the widget puts it back to the knob's default and says so, so a
message never names a control that cannot be pressed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import ipywidgets as w
from traitlets import observe

from engine import budget as B
from engine.budget import compat
from engine.budget.devices import NO_DEVICE

# Short labels: the table's help is the long form, shown on hover.
LABELS = {
    "n_layer": "layers L", "d_model": "width d", "n_head": "heads a",
    "vocab_size": "vocabulary V", "d_ff": "MLP width", "block_size": "positions",
    "tied_embedding": "output head tied to the embedding", "n_params": "parameter count",
    "n_kv_head": "key/value heads", "d_head": "head size", "micro_batch": "micro-batch B",
    "seq_len": "sequence N", "accumulation": "accumulation K", "grad_precision": "gradients in",
    "optimizer_impl": "optimizer runs", "activation_model": "activations of",
    "tensors_per_layer": "tensors per layer", "dropout": "dropout masks",
    "outputs": "model output", "use_cache": "key/value cache",
    "devices": "data-parallel devices", "zero": "ZeRO stage", "device_memory": "memory (bytes)",
    "device_flops": "FLOP/s", "mfu": "MFU", "headroom": "headroom (bytes)",
    "lora_rank": "LoRA rank r", "lora_targets": "LoRA targets", "lora_dropout": "LoRA dropout",
    "qlora": "QLoRA (4-bit base)", "dora": "DoRA", "modules_to_save": "trained modules",
    "zero_engine": "ZeRO engine",
}
# The tab each group of the table goes to; a group not listed gets a tab of its own.
TABS = {"model": "model", "batch": "training", "policy": "training",
        "step": "real step", "parallel": "devices", "device": "devices"}
# Sizes with a power-of-two slider beside their box, and the slider's usual top.
STEPPED = {"d_model": 32768, "micro_batch": 4096, "seq_len": 131072, "accumulation": 256}

WIDE = {"description_width": "132px"}  # every label 132 px
FULL = {"width": "auto", "align_self": "stretch"}  # as wide as the controls' column


def label(field: str) -> str:
    return LABELS.get(field, field.replace("_", " "))


def tab_of(k: B.Knob) -> str:
    return TABS.get(k.group, k.group)


def tip(k: B.Knob) -> str:
    """A knob's help, with what 0 stands for where it has a meaning."""
    return k.help + (f"; 0: {k.zero_means}" if k.zero_means else "")


class RedrawnToggleButtons(w.ToggleButtons):
    """Toggle buttons that show a change of `disabled` at once. ipywidgets 8's view
    applies `disabled` only when it rebuilds its buttons, which it does when the
    labels or the icons change; so each change of `disabled` also swaps `icons`
    between two lists that draw no icon."""

    @observe("disabled")
    def _redraw(self, change) -> None:
        with self.hold_sync():
            self.icons = [""] * len(self.options) if not self.icons else []


def toggles(k: B.Knob) -> RedrawnToggleButtons:
    """One button per choice; each button's title names its row, so a screen reader
    says "ZeRO stage: 3", not "3"."""
    options = list(k.choices)
    return RedrawnToggleButtons(options=options, description=label(k.field), tooltip=tip(k),
                                tooltips=[f"{label(k.field)}: {o}" for o in options],
                                style={"button_width": "auto", **WIDE},
                                layout=w.Layout(**FULL))


def dropdown(field: str, options, help_text: str) -> w.Dropdown:
    return w.Dropdown(options=list(options), description=label(field), tooltip=help_text,
                      style=WIDE, layout=w.Layout(**FULL))


def device_choices() -> list[str]:
    """No device, every device engine.budget lists, and this machine (measured)."""
    return [NO_DEVICE, *B.DEVICES, B.THIS_MACHINE]


def control_for(k: B.Knob, start: B.BudgetConfig):
    """A control made from a knob's row of the table: toggles for choices, a checkbox
    for a switch, a bounded box for a number, a text box for a string; heads, key/value
    heads and the device are lists that follow the model or engine.budget's devices."""
    if k.field == "n_head":
        return dropdown(k.field, [start.n_head], tip(k))
    if k.field == "n_kv_head":
        return dropdown(k.field, [("one per head", 0)], tip(k))
    if k.field == "device":
        return dropdown(k.field, device_choices(), tip(k))
    common = {"description": label(k.field), "tooltip": tip(k), "layout": w.Layout(**FULL)}
    if k.kind is bool:
        return w.Checkbox(indent=False, **common)
    if k.choices:
        return toggles(k)
    if k.kind is int:
        return w.BoundedIntText(min=0 if k.zero_means else k.low, max=k.high, style=WIDE,
                                **common)
    if k.kind is float:  # a fraction: from 0 where 0 means something, else from one step
        return w.FloatSlider(min=0.0 if k.zero_means else 0.05, max=k.high, step=0.05,
                             style=WIDE, continuous_update=False, **common)
    return w.Text(style=WIDE, continuous_update=False, **common)


def make_controls(start: B.BudgetConfig) -> dict:
    """One control per knob the widget shows, under the knob's field name."""
    controls = {k.field: control_for(k, start) for k in B.shown_on("widget")}
    for name, control in controls.items():  # stable handles for browser tests
        control.add_class(f"budget-knob-{name.replace('_', '-')}")
    return controls


def zeros_hint(knobs: list[B.Knob]) -> str:
    """One line: what a 0 stands for in each box of a tab that takes one."""
    said = [f"{label(k.field)}, {k.zero_means}" for k in knobs
            if k.zero_means and k.kind is int and k.field != "n_kv_head"]
    return f"A 0 means: {'; '.join(said)}." if said else ""


# ------------------------------------------------------------ knobs that do nothing
@dataclass(frozen=True)
class Idle:
    """A knob that does nothing with the current values, and why (from the budget's
    compatibility table, `engine.budget.compat`). With `resets`, those values refuse
    any value but the knob's default, and the widget puts it back."""
    reason: str
    resets: bool


def idle_knobs(values: dict) -> dict[str, Idle]:
    """The knobs that do nothing with these values, each with why."""
    cfg = B.BudgetConfig(**{k: v for k, v in values.items() if k in B.KNOBS})
    return {field: Idle(rule.why(cfg), rule.refuses)
            for field, rule in compat.idle_knobs(cfg).items() if field in values}


# ------------------------------------------------------- what a message names
_SAID_AS_SETTING = r"(?=\s*(=|<=|>=|'| to\b| off\b| on\b| at\b))"


def named_fields(message: str, fields) -> list[str]:
    """The knobs an engine.budget message names, in the order it names them: a field
    with an underscore wherever it stands as a word, a one-word field ("attention")
    only where it is set ("attention 'flash'", "dropout off"), not in prose ("the
    attention core")."""
    found = []
    for field in fields:
        pattern = rf"\b{field}\b" + ("" if "_" in field else _SAID_AS_SETTING)
        m = re.search(pattern, message)
        if m:
            found.append((m.start(), field))
    return [f for _, f in sorted(found)]
