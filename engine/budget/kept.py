"""What a model keeps for its backward: one kind of saved tensor (`Saved`) and
the activation bytes of one micro-batch under one model (`Activations`)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Saved:
    """One kind of tensor kept for the backward pass."""
    op: str             # the op whose VJP reads it
    tensor: str         # what it is
    elements: int       # elements per occurrence
    itemsize: int       # bytes per element
    count: int = 1      # occurrences (e.g. one per layer)
    until_end: bool = False  # kept until the very last VJP (the embedding's)

    @property
    def bytes(self) -> int:
        return self.elements * self.itemsize * self.count

    def times(self, count: int, op: str | None = None) -> "Saved":
        """This entry `count` times, under `op` if given (built directly: the fit
        searches ask for every block's entries at each evaluated step)."""
        return Saved(op or self.op, self.tensor, self.elements, self.itemsize, count,
                     self.until_end)


@dataclass(frozen=True)
class Activations:
    """Activation bytes of one micro-batch under one model.

    `saved` is what is alive when the forward pass ends; `peak` the most that
    is alive at any moment of the step. In the rule, transformer and engine
    models they differ only with recompute: the backward first frees what lies
    after the last block (the head, the loss), then rebuilds one block (or one
    attention core) at a time on top of what the blocks kept, so

        peak = saved - freed_before_blocks + max(freed_before_blocks, rebuilt)

    where `rebuilt` is one block's (or attention core's) saved tensors. A real
    framework's step (`step`) follows its own moments instead, and `peak` is
    its peak above the fixed memory.
    """
    model: str
    saved: int            # alive at the end of the forward pass
    peak: int             # most alive at any moment of the forward and backward
    items: tuple = ()     # the Saved entries behind `saved`
    step: object = None   # the step's moments (moments.StepMoments): its
    #                       moments; `peak` is then the step's peak minus the fixed bytes

    @property
    def transient(self) -> int:
        """What recompute adds on top of `saved` at the peak."""
        return self.peak - self.saved
