"""peft's `modules_to_save`: modules outside the blocks trained in full beside LoRA's
adapters (`LoraConfig(modules_to_save=["lm_head", "embed_tokens"])`).

peft wraps each named module in a `ModulesToSaveWrapper` holding the frozen original
and a trained copy (`modules_to_save.default`), which the forward runs. Against LoRA's
step, read from peft and torch and measured on the CPU
(`tests/test_budget_recipes_lora.py`):

1. The copy is stored beside the original (its weight once more), and trained: its
   gradient and AdamW's state. peft deep-copies the module, and casts only the
   adapters to fp32 (`autocast_adapter_dtype`): the copy of a model loaded in bf16 is
   bf16, its weight, gradient and AdamW state half the bytes of an adapter's
   (`ParamTensor.itemsize`). An output head's copy is the last parameter (its
   gradient the first of the backward's), a token embedding's the first (its
   gradient the last).
2. A trained head keeps its input again (its weight's gradient reads it), and its
   matmul makes the head's vocabulary-by-width weight gradient first of all, as a
   full fine-tune's does (`framework_step._head_weights`).
3. A trained token embedding makes its output need a gradient: nothing before the
   first adapter goes unkept (the first block keeps what every block keeps), and
   GPT-2's embedding dropout keeps its mask.

Modelled for untied heads (a tied head's copy would untie it: refused in `compat`).
"""
from __future__ import annotations

from dataclasses import replace

from .linears import OUTSIDE_MODULES, trained_modules
from .recipe import Recipe, Rows
from .weights_dtype import BF16, bf16_weights

FP32 = 4


def _head(cfg) -> bool:
    return "lm_head" in trained_modules(cfg)


def _embedding(cfg) -> bool:
    return OUTSIDE_MODULES[cfg.architecture][0] in trained_modules(cfg)


def rows(cfg, base: Rows, rows: Rows, device: str) -> Rows:
    """The head's input kept again for a trained head; every block keeping the same
    (and GPT-2's embedding dropout mask) for a trained embedding."""
    wanted = {("head matmul", True)} if _head(cfg) else set()
    if _embedding(cfg):
        wanted.add(("embedding dropout", False))
    outside = list(rows.outside)
    for i, x in enumerate(base.outside):  # each back in its place among the rest
        if (x.op, x.tensor.startswith("input")) in wanted and x not in outside:
            later = [outside.index(y) for y in base.outside[i + 1:] if y in outside]
            outside.insert(later[0] if later else len(outside), x)
    first = rows.block if _embedding(cfg) else rows.first
    return replace(rows, first=first, outside=outside)


def _copy_itemsize(cfg) -> int:
    """A copy's dtype, where it is not the adapters' fp32: bf16 over a bf16 model."""
    return BF16 if bf16_weights(cfg) else 0


def tensors(cfg, trained: list, make) -> list:
    """The copies, in the model's order around the adapters: the embedding's first,
    the head's last."""
    V, d = cfg.vocab_size, cfg.d_model
    embedding = OUTSIDE_MODULES[cfg.architecture][0]
    first = [make(f"{embedding}.modules_to_save.weight", V * d, True, V + d)] if _embedding(cfg) else []
    last = [make("lm_head.modules_to_save.weight", V * d, True, V + d)] if _head(cfg) else []
    return ([replace(t, itemsize=_copy_itemsize(cfg)) for t in first] + trained
            + [replace(t, itemsize=_copy_itemsize(cfg)) for t in last])


def fixed(cfg, fixed: dict, per_parameter: dict, parameters: int, trained: int) -> dict:
    """The copies of a bf16 model's modules take a bf16 element's share of each trained
    buffer (`per_parameter`, an fp32 adapter's bytes): half of the weight, gradient and
    optimizer state an adapter weight of as many elements would (the optimizers whose
    state is counted tensor by tensor read `ParamTensor.itemsize` themselves)."""
    if not _copy_itemsize(cfg):
        return fixed
    copies = cfg.vocab_size * cfg.d_model * len(trained_modules(cfg))
    saved = 1 - _copy_itemsize(cfg) / FP32
    return {k: v - int(copies * per_parameter[k] * saved) for k, v in fixed.items()}


RECIPE = Recipe(
    "modules_to_save", lambda cfg: bool(cfg.lora_rank and cfg.modules_to_save), rows=rows,
    tensors=tensors, fixed=fixed, knob="modules_to_save",
    peft_options=lambda cfg: {"modules_to_save": list(trained_modules(cfg))},
    head_gradient=lambda cfg, elements: cfg.vocab_size * cfg.d_model if _head(cfg) else elements)
