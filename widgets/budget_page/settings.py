"""The page's settings: a URL query <-> a BudgetConfig, through the one knob table.

A query names a model (a preset, a pasted config.json read by the same code as
`--hf-config`, or a Hub model id read as `--hf-model` reads it) and the knobs changed
from it; every knob the table shows on the page
(`engine.budget.knobs.shown_on("page")`) may appear, read by its kind and checked by
its own bounds (`Knob.problem`, `BudgetConfig.validate`), so a knob added to the table
is a setting of the page with its help and its limits. A value that is not allowed
raises BudgetError naming the knob and the fix, before any work; one the visitor set
that the other settings grey out and refuse is put back, saying so (`put_back`), and
each answer names the knobs greyed out with the compatibility table's reasons
(`idle_reasons`).
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import re
from dataclasses import replace
from urllib.parse import urlencode

from engine import budget as B
from engine.budget import compat
from engine.budget import devices as D
from engine.budget.cli import flop_rate, memory_size
from engine.budget.hf import config_from_hf
from engine.budget.hub import hub_config
from engine.budget.knobs import KNOBS, REAL_STEP_MODELS, Knob, shown_on
from engine.budget.linears import ALL_LINEAR

DEFAULT_PRESET = "gpt2-small"
# The knob the budget defaults to when a preset does not choose one.
_TABLE_ACTIVATIONS = KNOBS["activation_model"].default
# What the page opens with where a preset leaves the knob table's default: the
# real-step model (lesson 07 shows the textbook count misses up to half a real
# step) and a card of today, so the first verdict is about a device.
# The H200 is the card the course's own step measurements come from (engine/budget/measured).
DEFAULT_DEVICE = "H200-141GB" if "H200-141GB" in D.DEVICES else "H100-80GB-SXM"
# A real framework's step runs SDPA (transformers' default attention since 4.36), not
# eager attention's kept T x T probabilities.
PAGE_DEFAULTS = {"activation_model": "hf", "device": DEFAULT_DEVICE, "attention": "flash"}
# A model of your own (pasted or named) is trained at a fine-tune's usual length, not its
# whole context (131,072 tokens for Llama 3.1); its context bounds the longest sequence.
MODEL_SEQ_LEN = 2048
MODEL_PARAMS = ("preset", "config", "hf_model")
# Kept when the model changes: the machine a run is planned for is not the model's.
HARDWARE_GROUPS = ("parallel", "device")
MAX_CONFIG_CHARS = 16_000   # a config.json is one or two thousand; 3x this, URL-encoded, fits a head
MAX_NUMBER_CHARS = 40       # longer than any bound of the knob table
MAX_TEXT_CHARS = 200        # a setting written as text (a list of module names, say)
CUSTOM_DEVICE = "custom"
PASTED = "the pasted config.json"
_BY_UNIT = {"device_memory": memory_size, "device_flops": flop_rate, "headroom": memory_size}
_SWITCH = {"on": True, "off": False, "true": True, "false": False}
# Values a text box offers as you type (a datalist); any other value may be typed.
SUGGESTIONS = {"lora_targets": (ALL_LINEAR,)}


def page_knobs() -> dict[str, Knob]:
    return {k.field: k for k in shown_on("page")}


def device_choices() -> tuple[str, ...]:
    return ("none", *D.DEVICES, CUSTOM_DEVICE)


def hardware_fields() -> list[str]:
    return [f for f, k in page_knobs().items() if k.group in HARDWARE_GROUPS]


def choice_help(k: Knob) -> dict[str, str]:
    """One line per choice where the knob's help describes each as `name (what)`."""
    found = {}
    for choice in k.choices:
        m = re.search(rf"(?<![\w-]){re.escape(str(choice))} \(([^()]*)\)", k.help)
        if m:
            found[str(choice)] = m.group(1)
    return found if len(found) == len(k.choices) else {}


def describe_knobs() -> list[dict]:
    """The page's controls, from the knob table: what each is, its help and limits."""
    out = []
    for k in page_knobs().values():
        choices = device_choices() if k.field == "device" else k.choices
        kind = "bool" if k.kind is bool else ("choice" if choices else k.kind.__name__)
        # kind: bool, choice, int, float or str (a text box)
        out.append({"field": k.field, "label": k.field.replace("_", " "), "help": k.help,
                    "group": k.group, "kind": kind, "choices": [str(c) for c in choices],
                    "choice_help": choice_help(k), "low": k.low, "high": k.high,
                    "zero_means": k.zero_means, "units": k.field in _BY_UNIT,
                    "suggestions": list(SUGGESTIONS.get(k.field, ()))})
    return out


# ------------------------------------------------------------------ reading
def _number(k: Knob, text: str):
    text = text.strip()
    if k.field in _BY_UNIT:
        try:
            return _BY_UNIT[k.field](text)
        except argparse.ArgumentTypeError as exc:
            raise B.BudgetError(f"{k.field}: {exc}.") from None
    if len(text) > MAX_NUMBER_CHARS:
        problem = k.problem(10 ** MAX_NUMBER_CHARS)
        raise B.BudgetError(problem.replace(repr(10 ** MAX_NUMBER_CHARS),
                                            repr(text[:12] + "...")))
    try:
        value = int(text) if k.kind is int else float(text)
    except ValueError:
        whole = "a whole number" if k.kind is int else "a number"
        raise B.BudgetError(f"{k.field}={text[:MAX_NUMBER_CHARS]!r} is not {whole}; "
                            f"type digits only, e.g. {k.default or 1}.") from None
    if k.kind is float and not math.isfinite(value):
        raise B.BudgetError(f"{k.field}={text!r} is not a finite number.")
    return value


def read_value(k: Knob, text: str):
    """The value of knob `k` that a query's `text` gives (bounds checked later)."""
    if k.kind is bool:
        if text.lower() not in _SWITCH:
            raise B.BudgetError(f"{k.field}={text[:40]!r} is not a switch; "
                                f"choose on or off.")
        return _SWITCH[text.lower()]
    if k.field == "device":
        found = D.find_device(text) if hasattr(D, "find_device") else None
        text = found.name if found else text  # short names in any case: h200, rtx-3090
        if text not in device_choices():
            raise B.BudgetError(f"device={text[:40]!r} is not a device of this page; "
                                f"choose one of {', '.join(device_choices())}.")
        return text
    if k.kind is str:
        if len(text) > MAX_TEXT_CHARS:
            raise B.BudgetError(f"{k.field}: {len(text):,} characters is more than this "
                                f"setting takes ({MAX_TEXT_CHARS}); see its help.")
        return text  # Knob.problem and the budget's checks name what is allowed
    return _number(k, text)


def read_pasted_config(text: str) -> dict:
    """A pasted config.json as the dict `engine.budget.hf` reads; nothing else in it obeyed."""
    if len(text) > MAX_CONFIG_CHARS:
        raise B.BudgetError(f"config: the pasted text has {len(text):,} characters, more "
                            f"than a config.json's {MAX_CONFIG_CHARS:,}; paste the model's "
                            f"config.json.")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise B.BudgetError(f"config: the pasted text is not JSON ({str(exc)[:80]}); paste "
                            f"the model's config.json whole.") from None
    if not isinstance(data, dict):
        raise B.BudgetError(f"config: the pasted text holds a JSON {type(data).__name__}, "
                            f"not the object of a config.json; paste the whole file.")
    return data


@functools.lru_cache(maxsize=64)
def hub_model(model_id: str) -> dict:
    """A Hub model's config.json (engine.budget.hub), fetched once per id by this
    process: later answers for the model ask the network nothing."""
    return hub_config(model_id)


@functools.lru_cache(maxsize=None)
def _preset(name: str) -> B.BudgetConfig:
    """A preset, built once (frozen, so shared safely): the page reads one per request."""
    return B.preset(name)


def _start(params: dict) -> tuple[B.BudgetConfig | None, dict | None, dict, str]:
    """The preset the query names with the page's defaults, or the config.json of the
    model it names; the model's part of the query; the name the file goes by."""
    if "config" in params:
        data = read_pasted_config(params["config"])
        model_query = {"config": json.dumps(data, separators=(",", ":"))}
        return None, data, model_query, PASTED
    if "hf_model" in params:
        return None, hub_model(params["hf_model"]), {"hf_model": params["hf_model"]}, \
            params["hf_model"]
    name = params.get("preset", DEFAULT_PRESET)
    if name not in B.PRESET_NAMES:
        raise B.BudgetError(f"preset={name[:40]!r} is not a model of this page; choose one "
                            f"of {', '.join(B.PRESET_NAMES)}, or paste a config.json.")
    start = _preset(name)
    defaults = dict(PAGE_DEFAULTS)
    if start.activation_model != _TABLE_ACTIVATIONS:  # the preset chose its own
        del defaults["activation_model"]
        if start.activation_model not in REAL_STEP_MODELS:
            del defaults["attention"]
    return replace(start, **defaults), None, {"preset": name}, name


def _model_start(data: dict, source: str) -> B.BudgetConfig:
    """A config.json's model with the page's defaults, at MODEL_SEQ_LEN tokens or its
    whole context when that is shorter."""
    whole = config_from_hf(data, source, **PAGE_DEFAULTS)
    return whole.with_(seq_len=min(MODEL_SEQ_LEN, whole.block_size or MODEL_SEQ_LEN))


def config_from_params(params: dict) -> tuple[B.BudgetConfig, str]:
    """The configuration of a query's parameters (a dict of strings), and the
    normalised query that reproduces it: the model and the knobs that differ from
    the model's start."""
    cfg, query, _ = settings_of(params)
    return cfg, query


def settings_of(params: dict) -> tuple[B.BudgetConfig, str, list[str]]:
    """`config_from_params`, and a sentence for each value put back to its knob's
    default (`put_back`)."""
    knobs = page_knobs()
    unknown = sorted(set(params) - set(knobs) - set(MODEL_PARAMS))
    if unknown:
        raise B.BudgetError(f"{unknown[0][:40]!r} is not a setting of this page; the "
                            f"settings are {', '.join(MODEL_PARAMS)}, {', '.join(knobs)}.")
    models = [m for m in MODEL_PARAMS if m in params]
    if len(models) > 1:
        raise B.BudgetError(f"{' and '.join(models)} each name the model; choose a preset, "
                            f"paste a config.json or give a Hub model id, one of them.")
    changes = {f: read_value(knobs[f], params[f]) for f in knobs if f in params}
    start, data, model_query, source = _start(params)
    if data is not None:
        try:
            start = _model_start(data, source)
        except B.BudgetError:  # the page's defaults do not suit this file: all is said
            start = None
        length = {"seq_len": start.seq_len} if start else {}
        notes = put_back(start, changes) if start else []
        cfg = config_from_hf(data, source, **{**PAGE_DEFAULTS, **length, **changes})
        start = start or B.BudgetConfig()
    else:
        notes = put_back(start, changes)
        cfg = replace(start, **changes).validate()
    differ = {f: cfg_value(cfg, f) for f in knobs if getattr(cfg, f) != getattr(start, f)}
    return cfg, urlencode({**model_query, **differ}), notes


def put_back(start: B.BudgetConfig, changes: dict) -> list[str]:
    """As the widget does: a page knob the visitor set away from the model's start that
    the other settings grey out and refuse (DoRA left on when the LoRA rank goes back to
    0), or that the page chose (attention 'flash' when the engine's GPT is asked for),
    goes back to its default in `changes`; one sentence each says so. What the model
    itself brings is never put back: a conflict with it is refused by name."""
    knobs, notes = page_knobs(), []
    for _ in range(len(knobs)):  # each pass puts back at least one knob, or ends
        cfg = replace(start, **changes)
        refused = {f: rule for f, rule in compat.idle_knobs(cfg).items()
                   if f in knobs and rule.refuses and not rule.accepts(cfg)
                   and (f in PAGE_DEFAULTS or getattr(cfg, f) != getattr(start, f))}
        if not refused:
            break
        for field, rule in refused.items():
            changes[field] = KNOBS[field].default
            said = cfg_value(replace(cfg, **{field: changes[field]}), field) or "empty"
            notes.append(f"{field.replace('_', ' ')} set back to {said} for you: "
                         f"{rule.why(cfg)}.")
    return notes


def idle_reasons(cfg: B.BudgetConfig) -> dict[str, str]:
    """The page's knobs that do nothing in `cfg`, each with why: the budget's
    compatibility table (`engine.budget.compat.idle_knobs`), read, not copied."""
    knobs = page_knobs()
    return {f: rule.why(cfg) for f, rule in compat.idle_knobs(cfg).items() if f in knobs}


def cfg_value(cfg: B.BudgetConfig, field: str) -> str:
    """A knob's value as the page's controls and the URL write it."""
    value = getattr(cfg, field)
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def control_values(cfg: B.BudgetConfig) -> dict[str, str]:
    return {f: cfg_value(cfg, f) for f in page_knobs()}


def named_knobs(message: str) -> list[str]:
    """The page's settings a message names (its controls are offered beside it)."""
    fields = [*page_knobs(), *MODEL_PARAMS]
    return [f for f in fields if re.search(_as_setting(f), message)]


def _as_setting(field: str) -> str:
    """How a message names a setting as a setting: a name with an underscore (no English
    word has one), or a one-word name written with its value (`zero=7`, `architecture
    'gpt2'`, `config: ...`): "attention" in a sentence about a model's block is a word."""
    if "_" in field:
        return rf"(?<![\w-]){field}(?!\w)"
    return rf"(?<![\w-]){field}\s*(?:[=:<>'\"])"
