"""What the budget assumes for one answer: the docstrings of the modules that model the
step the page answered, in the order the step is built from them.

A real framework's step (activations of pytorch or hf) is what the model keeps
(`real_step`), its moments (`moments`), a block's backward walked op by op
(`block_backward`) and what the optimizer allocates (`optimizer_step`), rewritten
by each fine-tuning recipe that applies (LoRA, DoRA, QLoRA, trained modules:
`recipes.registry`), over bf16 weights where the model is loaded so
(`weights_dtype`), with a Gemma family's traits (`gemma`); several devices bring
data parallelism and ZeRO (`sharding`). The textbook models (rule, transformer,
engine) are the package's own text. Each module says its assumptions once; this page
shows them, never a copy.
"""
from __future__ import annotations

import html
import sys
from importlib import import_module
from types import ModuleType

from engine import budget as B
from engine.budget.knobs import REAL_STEP_MODELS
from engine.budget.recipes import registry

_PACKAGE = "engine.budget"


def step_modules(cfg: B.BudgetConfig) -> list[ModuleType]:
    """The modules whose docstrings state what the answer for `cfg` assumes."""
    if cfg.activation_model not in REAL_STEP_MODELS:
        names = [_PACKAGE]
    else:
        names = [f"{_PACKAGE}.{m}" for m in ("real_step", "moments", "block_backward",
                                              "optimizer_step")]
        if cfg.model_type.startswith("gemma"):
            names.append(f"{_PACKAGE}.gemma")
        if cfg.weights_dtype == "bf16":
            names.append(f"{_PACKAGE}.weights_dtype")
        # each recipe's `applies` is written in the recipe's own module
        names += [r.applies.__module__ for r in registry() if r.applies(cfg)]
    if cfg.devices > 1:
        names.append(f"{_PACKAGE}.sharding")
    return [sys.modules.get(n) or import_module(n) for n in names]


def assumptions_html(cfg: B.BudgetConfig | None, query: str = "", refused: str = "") -> str:
    """The page of what the answer for `cfg` assumes (the package's text when there is
    no configuration, with the refusal that said why)."""
    modules = step_modules(cfg) if cfg is not None else [B]
    back = "./" + (f"?{html.escape(query)}" if query else "")
    said = (f"<p>These settings are refused ({html.escape(refused)}); what the budget "
            f"assumes in general:</p>" if refused else "")
    sections = "".join(
        f"<section><h2><code>{html.escape(m.__name__)}</code></h2>"
        f"<pre style='white-space:pre-wrap;max-width:90ch'>{html.escape(m.__doc__ or '')}"
        f"</pre></section>" for m in modules)
    name = f" for {html.escape(cfg.name)}" if cfg is not None else ""
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<title>Assumptions of the training-step budget</title></head><body><main>"
            f"<h1>What the budget assumes{name}</h1>"
            f"<p><a href='{back}'>back to the calculator</a></p>{said}"
            "<p>The text of each module that models this step, as its code states "
            f"it:</p>{sections}</main></body></html>")
