"""Does a step fit the device, the largest micro-batch that does, and how
long a step takes.

Time: a step costs F FLOPs per device (forward, backward and recompute of
its K micro-batches); at a model FLOP utilization `mfu` of the device's
dense FLOP/s R it takes F / (mfu * R) seconds. Real runs reach 0.3-0.5 (the
PaLM paper reports 0.46 for its largest model); communication is taken to
overlap with compute, which holds when the step is compute-bound and is
shown beside the estimate so the reader can judge.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .activations import activations
from .config import BudgetConfig


@dataclass(frozen=True)
class DeviceFit:
    """The budget of one device against a device's memory and speed."""
    device: str
    memory: int                  # bytes of the device (0: not given)
    flops_per_second: float      # dense FLOP/s at this precision (0: not given)
    peak: int                    # bytes one device needs at the peak of the step
    fits: bool | None            # None when the memory is not given
    largest_micro_batch: int | None   # largest B that fits at this N (None: B=1 does not)
    step_seconds: float | None
    tokens_per_second: float | None   # all devices together

    @property
    def headroom(self) -> int:
        return self.memory - self.peak


def largest_micro_batch(cfg: BudgetConfig, fixed_per_device: int, memory: int,
                        max_batch: int = 1 << 20) -> int | None:
    """The largest micro-batch B (at this N) whose per-device peak fits in
    `memory`, or None if B=1 does not. The activation peak grows with B; the
    fixed bytes do not."""
    def fits(b: int) -> bool:
        return fixed_per_device + activations(replace(cfg, micro_batch=b)).peak <= memory

    if not fits(1):
        return None
    if fits(max_batch):
        return max_batch
    lo, hi = 1, max_batch  # fits(lo), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def device_fit(cfg: BudgetConfig, name: str, memory: int, flops_per_second: float,
               fixed_per_device: int, peak: int, flops_per_step: int,
               tokens_per_step_all: int) -> DeviceFit:
    seconds = _ratio(flops_per_step, cfg.mfu * flops_per_second) if flops_per_second else None
    return DeviceFit(
        device=name, memory=memory, flops_per_second=flops_per_second, peak=peak,
        fits=(peak <= memory) if memory else None,
        largest_micro_batch=(largest_micro_batch(cfg, fixed_per_device, memory)
                             if memory else None),
        step_seconds=seconds,
        tokens_per_second=_ratio(tokens_per_step_all, seconds) if seconds else None)


def _ratio(a, b) -> float:
    """a / b as a float; sizes beyond float range give inf, not an OverflowError."""
    try:
        return a / b
    except OverflowError:
        return float("inf")
