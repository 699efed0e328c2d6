"""The budget's settings shelf: one compatibility table read by the validation and by
the widget's greying, and settings that import no step model."""
import ast
from dataclasses import replace
from pathlib import Path

import pytest

from engine import budget as bm
from engine.budget import compat

BUDGET = Path(bm.__file__).parent
# The settings shelf: the knobs, the compatibility table, the frameworks' defaults, the
# devices' figures, the names of a block's linear layers, and the config itself.
SETTINGS = {"knobs", "compat", "frameworks", "devices", "linears", "config"}


def _imports(module: str) -> set[str]:
    tree = ast.parse((BUDGET / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= ({node.module.split(".")[0]} if node.module
                      else {a.name for a in node.names})
    return found


@pytest.mark.parametrize("module", sorted(SETTINGS))
def test_settings_import_no_step_model(module):
    assert _imports(module) <= SETTINGS, _imports(module) - SETTINGS


def _breaking(rule, cfg):
    """`cfg` changed so that `rule` holds and its knob holds a value it refuses, or None
    where this test cannot make one."""
    knob = bm.KNOBS[rule.knob]
    candidates = [c for c in knob.choices if c != knob.default] if knob.choices else []
    if knob.kind is bool:
        candidates = [not knob.default]
    elif knob.kind is int and not knob.choices:
        candidates = [7]
    elif knob.kind is float:
        candidates = [0.1]
    elif knob.kind is str and not knob.choices:
        candidates = ["q_proj"]
    for value in candidates:
        broken = replace(cfg, **{rule.knob: value})
        if rule.when(broken) and not rule.accepts(broken):
            return broken
    return None


# A setting under which each refusing rule holds.
STARTS = [bm.preset("gpt2-small", activation_model=m) for m in ("rule", "transformer",
                                                                 "engine", "pytorch")]
STARTS += [bm.preset("gpt2-small", activation_model="hf"),
           bm.preset("llama2-7b", activation_model="hf", precision="fp32"),
           bm.preset("llama2-7b", activation_model="hf", lora_rank=8),
           bm.preset("gpt2-small", activation_model="hf", lora_rank=8, precision="bf16"),
           bm.preset("llama2-7b", activation_model="hf", precision="fp32", lora_rank=8,
                     qlora=True),
           bm.preset("gemma2-2b", activation_model="hf"),
           bm.preset("gemma3-1b", activation_model="hf")]
# optimizers a library runs tensor by tensor, and a full fine-tune of bf16 weights
STARTS += [bm.preset("llama2-7b", activation_model="hf", optimizer="adafactor"),
           bm.preset("llama2-7b", activation_model="hf", weights_dtype="bf16")]
# Rules that an earlier rule always answers first today (qlora is refused under the
# bf16 precision that bf16 weights need).
SHADOWED = {("weights_dtype", "the 4-bit layers' step over bf16 weights was not measured")}


def test_every_refusing_rule_refuses_in_validation_and_greys_in_the_widget():
    from widgets.budget_knobs import idle_knobs
    tried = set()
    for rule in compat.RULES:
        if not rule.refuses:
            continue
        for start in STARTS:
            broken = _breaking(rule, start)
            if broken is None or compat.refusal(broken) != rule.message(broken):
                continue
            with pytest.raises(bm.BudgetError) as err:
                broken.validate()
            assert str(err.value) == rule.message(broken)
            assert rule.knob in str(err.value) or rule.knob.split("_")[0] in str(err.value)
            if rule.greys and rule.knob in bm.KNOBS and "widget" in bm.KNOBS[rule.knob].fronts:
                values = {k.field: getattr(broken, k.field) for k in bm.shown_on("widget")}
                assert idle_knobs(values)[rule.knob].resets
            tried.add(id(rule))
            break
    refusing = [r for r in compat.RULES if r.refuses and (r.knob, r.reason) not in SHADOWED]
    # every refusing rule could be broken from one of the starts
    assert len(tried) == len(refusing), [r.knob for r in refusing if id(r) not in tried]


def test_a_knob_that_only_does_nothing_is_greyed_but_accepted():
    cfg = bm.preset("gpt2-small", devices=1, zero=2)
    assert cfg.zero == 2  # accepted: one device, nothing to shard, nothing refused
    assert "zero" in compat.idle_knobs(cfg) and not compat.idle_knobs(cfg)["zero"].refuses


def test_a_refused_value_of_a_knob_that_still_matters_is_not_greyed():
    cfg = replace(bm.preset("gpt2-small", activation_model="hf"), recompute="selective")
    assert "attention 'flash'" in compat.refusal(cfg)
    assert "recompute" not in compat.idle_knobs(cfg)
