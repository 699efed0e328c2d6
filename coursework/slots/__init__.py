"""The slots of the trainer a learner's piece can fill, and the contract of each.

A slot is the place in `engine.trainer` where a piece runs: a kernel of the
model's registry (`engine.trainer.model.use_kernel`), the clipping function
and the optimizer the training step is handed, the training step itself. Its
contract is what the trainer relies on, checked on the buffers the trainer
will hand the piece (float32 views of one flat buffer for clipping and AdamW:
scaling or updating *in place* is part of the contract) and compared with the
engine's own version. `check(piece, fn)` raises `SlotError` with the reason
when a piece would misbehave there; `adapt(piece, fn)` wraps a piece into the
calling convention of its slot; `seconds(piece, fn, shape)` times a piece and
the engine's version at the trainer's shape.

Each lesson's contracts live in a module of their own (lesson00.py ...
lesson13.py, named after the lesson whose exercise writes the piece); this
package gathers them in CONTRACTS and re-exports the names the lessons use.
"""
from __future__ import annotations

from . import (lesson00, lesson02, lesson03, lesson05, lesson07, lesson08, lesson09, lesson10,
               lesson11, lesson12, lesson13)
from .core import IN_SLOT_ONLY, SlotError
from .lesson00 import engine_central_difference
from .lesson02 import ScalarNode, _check_scalar_backward  # noqa: F401  (lesson 02 cites it)
from .lesson03 import TAPE_SLOTS, tape_rule
from .lesson05 import Spot, engine_spot_check
from .lesson07 import BLOCK_COUNT_SHAPES, engine_block_saved_elements
from .lesson08 import (FusedAccumulationModel, TapeAsFused, _small_cfg,  # noqa: F401
                       accumulated_gradient,
                       check_accumulate_through_view, checkpointed_gpt_mismatch,
                       engine_accumulate, exact_checkpoint_peak)
from .lesson09 import engine_master_weight_step, engine_update_scale
from .lesson10 import crossentropy_adapter, gelu_adapter
from .lesson11 import embedding_adapter
from .lesson12 import BETAS, EPS, WEIGHT_DECAY, EngineAdamW, SegmentAdamW, engine_clip
from .lesson13 import ADAPTERS, TRAINER_SLOTS, seconds

# piece name -> the function that checks a piece against its slot's contract
CONTRACTS = {piece: contract
             for module in (lesson00, lesson02, lesson03, lesson05, lesson07, lesson08, lesson09,
                            lesson10, lesson11, lesson12, lesson13)
             for piece, contract in module.CONTRACTS.items()}

__all__ = ["SlotError", "IN_SLOT_ONLY", "CONTRACTS", "check", "engine_central_difference",
           "ScalarNode", "TAPE_SLOTS", "tape_rule", "Spot", "engine_spot_check",
           "BLOCK_COUNT_SHAPES", "engine_block_saved_elements", "FusedAccumulationModel",
           "TapeAsFused", "accumulated_gradient", "check_accumulate_through_view",
           "checkpointed_gpt_mismatch", "engine_accumulate", "exact_checkpoint_peak",
           "engine_master_weight_step", "engine_update_scale", "crossentropy_adapter",
           "gelu_adapter", "embedding_adapter", "BETAS", "EPS", "WEIGHT_DECAY", "EngineAdamW",
           "SegmentAdamW", "engine_clip", "ADAPTERS", "TRAINER_SLOTS", "seconds"]


def check(piece: str, fn, at_save: bool = False) -> None:
    """Run `fn` in the slot of `piece` beside the engine; SlotError says what went wrong.
    `at_save`: called by the exercise's own check (skips the IN_SLOT_ONLY contracts)."""
    contract = CONTRACTS.get(piece)
    if contract is None or (at_save and piece in IN_SLOT_ONLY):
        return
    try:
        contract(fn)
    except SlotError:
        raise
    except Exception as err:
        raise SlotError(f"raised {type(err).__name__} where the engine runs it: "
                        f"{str(err).splitlines()[0] if str(err) else ''}".rstrip(": ")) from None
