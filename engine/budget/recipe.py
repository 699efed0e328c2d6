"""What a fine-tuning recipe is: a `Recipe` of optional rewriters, and the `Rows` the
forward keeps as they rewrite them (`recipes` holds the registry of every recipe)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .kept import Saved


@dataclass(frozen=True)
class Rows:
    """What the forward keeps, as a recipe rewrites it: one block's entries (every block
    but the first), the first block's, the entries outside the blocks, and under
    checkpointing what each checkpoint keeps (None without checkpointing). Beside
    them, what a block's forward holds at its largest beyond the entries it saves
    (transients no op keeps, such as DoRA's B @ A), which the last block's forward
    holds beside every block's entries, and what a layer keeps no row for holds in its
    backward (`block_backward`: QLoRA's dequantized weights and the gradients around
    them), each as (the op whose rows come before the layer, bytes)."""
    block: list[Saved]
    first: list[Saved]
    outside: list[Saved]
    checkpointed: list[Saved] | None = None
    forward_transient: int = 0
    layer_backwards: tuple = ()
    # (the op whose backward makes it, bytes): gradients of tensors no optimizer holds,
    # held by the graph until it goes (peft's transposed weights under DoRA on GPT-2)
    graph_gradients: tuple = ()

    def blocks(self, n_layer: int) -> list[Saved]:
        """Every block's entries: the checkpoints' under checkpointing, else the first
        block's `first` and the other L - 1 `block`'s."""
        if self.checkpointed is not None:
            return list(self.checkpointed)
        if n_layer == 1:
            return [x.times(1) for x in self.first]
        if self.block == self.first:
            return [x.times(n_layer) for x in self.block]
        return ([x.times(n_layer - 1) for x in self.block]
                + [x.times(1, op=f"{x.op} (first block)") for x in self.first])


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
    # the knob (knobs.KNOBS) that turns on a recipe built on LoRA's adapters: the report
    # names its setting beside LoRA's
    knob: str | None = None
    # (cfg) -> the keyword arguments the recipe adds to peft's `LoraConfig`, as its
    # library spells it: what the lab builds and measures (engine.budget.lab)
    peft_options: Callable | None = None
