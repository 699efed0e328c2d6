"""Fine-tuning recipes: rewriters of what the base model's step holds, each in one place.

The base model's step is a full fine-tune: every parameter trained, every op keeping
what its backward reads (`real_step`). A recipe practitioners copy from peft or
bitsandbytes (LoRA, QLoRA, DoRA, trained copies of whole modules) changes that step
in a few fixed ways, and a `Recipe` says each in its own module:

  rows            which of the base model's saved entries stay, and what the recipe
                  adds (blocks, the first block, the entries outside the blocks)
  tensors         which tensors the optimizer updates (their gradients, its state and
                  its temporaries follow), the backward's last gradient first
  fixed           the fixed bytes: the weights stored, trained weights, gradients and
                  optimizer state
  autocast_cache  the 16-bit copies autocast caches that no op keeps
  head_gradient   the elements of the weight gradient the head's backward makes

`registry()` lists them in the order they apply to one configuration: each rewriter
reads what the ones before it made (DoRA rewrites LoRA's adapters, QLoRA LoRA's
frozen weights). The step's code (`framework_step`, `optimizer_step`, `counts`,
`report`) asks this registry, never a recipe's knob.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from typing import Callable

from .kept import Saved


@dataclass(frozen=True)
class Rows:
    """What the forward keeps, as a recipe rewrites it: one block's entries (every block
    but the first), the first block's, the entries outside the blocks, and under
    checkpointing what each checkpoint keeps (None without checkpointing)."""
    block: list[Saved]
    first: list[Saved]
    outside: list[Saved]
    checkpointed: list[Saved] | None = None

    def blocks(self, n_layer: int) -> list[Saved]:
        """Every block's entries: the checkpoints' under checkpointing, else the first
        block's `first` and the other L - 1 `block`'s."""
        if self.checkpointed is not None:
            return list(self.checkpointed)
        if n_layer == 1:
            return [replace(x, count=1) for x in self.first]
        if self.block == self.first:
            return [replace(x, count=n_layer) for x in self.block]
        return ([replace(x, count=n_layer - 1) for x in self.block]
                + [replace(x, op=f"{x.op} (first block)", count=1) for x in self.first])


@dataclass(frozen=True)
class Recipe:
    """One fine-tuning recipe. Each rewriter is optional (None: the recipe leaves that
    part as it found it)."""
    name: str
    applies: Callable[[object], bool]
    # (cfg, the base model's rows, the rows so far, device) -> rows
    rows: Callable | None = None
    # (cfg, the trained tensors so far, make(name, numel, decays)) -> tensors
    tensors: Callable | None = None
    # (cfg, fixed bytes so far, bytes per trained parameter, parameter count, trained
    #  count) -> fixed bytes
    fixed: Callable | None = None
    # (cfg, bytes so far) -> bytes
    autocast_cache: Callable | None = None
    # (cfg, elements so far) -> elements
    head_gradient: Callable | None = None
    freezes_base: bool = False   # the base model's own parameters get no gradient


@cache
def registry() -> tuple[Recipe, ...]:
    """Every recipe, in the order they apply (imported on first use: each recipe's
    module imports `Recipe` from here)."""
    from . import dora, lora, qlora, trained_modules
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
