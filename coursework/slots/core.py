"""What every slot contract shares: the error a broken contract raises."""
from __future__ import annotations


class SlotError(Exception):
    """A piece breaks the contract of its slot. The message says how."""


# Contracts that need the trainer's compiled kernels run where the slot is (lesson 13),
# not in the early lesson's check, where compiling them would cost a minute or more.
IN_SLOT_ONLY = {"accumulate"}
