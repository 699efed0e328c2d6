"""Lesson 07's slot: the activation model's count of a block's saved elements."""
from __future__ import annotations

from engine import budget

from .core import SlotError


def engine_block_saved_elements(B: int, T: int, C: int, H: int) -> int:
    """The engine's count, with the calling convention of exercise 06.2: the float
    elements one block of `engine.nn.GPT` keeps (`engine.budget.engine_block_saved`)."""
    cfg = budget.BudgetConfig(n_layer=1, d_model=C, n_head=H, micro_batch=B, seq_len=T,
                              block_size=T, vocab_size=11, activation_model="engine")
    return sum(item.elements * item.count for item in budget.engine_block_saved(cfg))


# (B, T, C, H): the shapes of lesson 06's check and of lesson 07's budget (the tiny preset
# at B=16 and B=4, at T=64, and with 8 heads), where the budget runs the piece
BLOCK_COUNT_SHAPES = [(2, 8, 16, 2), (1, 16, 32, 4), (3, 5, 24, 3), (16, 128, 128, 4),
                      (4, 128, 128, 4), (16, 64, 128, 4), (16, 128, 128, 8)]


def _check_block_saved_elements(fn):
    for B, T, C, H in BLOCK_COUNT_SHAPES:
        got, want = fn(B, T, C, H), engine_block_saved_elements(B, T, C, H)
        try:
            same = float(got) == want
        except (TypeError, ValueError):
            raise SlotError(f"returned {got!r} for B={B}, T={T}, C={C}, H={H} instead of a "
                            f"count of elements") from None
        if not same:
            raise SlotError(f"for B={B}, T={T}, C={C}, H={H} it counts {got!r} elements, the "
                            f"engine's block keeps {want:,}")


CONTRACTS = {"block_saved_elements": _check_block_saved_elements}
