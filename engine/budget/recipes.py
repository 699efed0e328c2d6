"""Fine-tuning recipes: rewriters of what the base model's step holds, each in one place.

The base model's step is a full fine-tune: every parameter trained, every op keeping
what its backward reads (`real_step`). A recipe practitioners copy from peft or
bitsandbytes (LoRA, QLoRA, DoRA, trained copies of whole modules) changes that step
in a few fixed ways, and a `Recipe` (`recipe`) says each in its own module:

  rows            which of the base model's saved entries stay, and what the recipe
                  adds (blocks, the first block, the entries outside the blocks)
  tensors         which tensors the optimizer updates (their gradients, its state and
                  its temporaries follow), the backward's last gradient first
  fixed           the fixed bytes: the weights stored, trained weights, gradients and
                  optimizer state
  autocast_cache  the 16-bit copies autocast caches that no op keeps
  head_gradient   the elements of the weight gradient the head's backward makes
  peft_options    what the recipe adds to peft's `LoraConfig` (the model the lab measures)

`registry()` lists them in the order they apply to one configuration: each rewriter
reads what the ones before it made (DoRA rewrites LoRA's adapters, QLoRA LoRA's
frozen weights). The step's code (`framework_step`, `optimizer_step`, `counts`,
`report`) and the lab that measures the step ask this registry, never a recipe's knob.

A new recipe over LoRA is its own module (its rewriters, how peft spells it, its
`RECIPE`) and a line in `registry()`; its setting is a row of `knobs.KNOBS` marked
`adapter=True` with `BudgetConfig`'s field of that name; what it cannot be combined
with is a rule in `compat`; and a test measures its step against peft's.
"""
from __future__ import annotations

from functools import cache

from . import dora, lora, qlora, trained_modules
from .recipe import Recipe, Rows  # noqa: F401  (the recipes' record, read here)


@cache
def registry() -> tuple[Recipe, ...]:
    """Every recipe, in the order they apply."""
    return (lora.RECIPE, dora.RECIPE, qlora.RECIPE, trained_modules.RECIPE)


def applied(cfg) -> tuple[Recipe, ...]:
    """The recipes `cfg` uses, in the order they apply."""
    return tuple(r for r in registry() if r.applies(cfg))


def freezes_base(cfg) -> bool:
    """Whether the base model's own parameters are frozen (an adapter recipe)."""
    return any(r.freezes_base for r in applied(cfg))


def rows(cfg, base: Rows, device: str) -> Rows:
    out = base
    for r in applied(cfg):
        if r.rows is not None:
            out = r.rows(cfg, base, out, device)
    return out


def tensors(cfg, base: list, make) -> list:
    out = base
    for r in applied(cfg):
        if r.tensors is not None:
            out = r.tensors(cfg, out, make)
    return out


def fixed(cfg, base: dict, per_parameter: dict, parameters: int, trained: int) -> dict:
    out = base
    for r in applied(cfg):
        if r.fixed is not None:
            out = r.fixed(cfg, out, per_parameter, parameters, trained)
    return out


def autocast_cache(cfg, base: int) -> int:
    out = base
    for r in applied(cfg):
        if r.autocast_cache is not None:
            out = r.autocast_cache(cfg, out)
    return out


def head_gradient(cfg, base: int) -> int:
    out = base
    for r in applied(cfg):
        if r.head_gradient is not None:
            out = r.head_gradient(cfg, out)
    return out


def peft_options(cfg) -> dict:
    """peft's `LoraConfig` keyword arguments for `cfg`: every applied recipe's, in order."""
    out: dict = {}
    for r in applied(cfg):
        if r.peft_options is not None:
            out.update(r.peft_options(cfg))
    return out
