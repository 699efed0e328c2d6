"""Does a step fit the device, the largest micro-batch, the longest sequence and
the fewest devices that do, and how long a step takes.

Memory: a step fits when the larger of its two peaks (the first step's, when a
real optimizer creates its state, and every later step's) plus `headroom` is at
most the device's memory. The headroom is what a process holds beyond the
allocator's live tensors: the CUDA context and the libraries' workspaces, and
the caching allocator's blocks that are reserved but not handed out. It is a
stated allowance (the `headroom` knob), not a measured term.

Time: a step costs F FLOPs per device (forward, backward and recompute of
its K micro-batches); at a model FLOP utilization `mfu` of the device's
dense FLOP/s R it takes F / (mfu * R) seconds. Real runs reach 0.3-0.5 (the
PaLM paper reports 0.46 for its largest model); communication is taken to
overlap with compute, which holds when the step is compute-bound and is
shown beside the estimate so the reader can judge.
"""
from __future__ import annotations

from dataclasses import dataclass

from .activations import activations
from .config import BudgetConfig, BudgetError
from .counts import parameter_count
from .knobs import MAX_BATCH, MAX_COUNT, ZERO_STAGES


@dataclass(frozen=True)
class DeviceFit:
    """The budget of one device against a device's memory and speed."""
    device: str
    memory: int                  # bytes of the device (0: not given)
    flops_per_second: float      # dense FLOP/s at this precision (0: not given)
    peak: int                    # bytes one device needs at the larger of its step peaks
    headroom: int                # bytes set aside beside the peak (context, allocator)
    fits: bool | None            # None when the memory is not given
    largest_micro_batch: int | None   # largest B that fits at this N (None: B=1 does not)
    longest_sequence: int | None      # longest N that fits at B=1 (None: N=1 does not)
    fewest_devices: dict | None       # {"devices", "zero"}: the fewest that fit, or None
    full_fine_tuning: dict | None     # under LoRA, the same answers without adapters
    step_seconds: float | None
    tokens_per_second: float | None   # all devices together

    @property
    def usable(self) -> int:
        """The device's memory less the headroom: what the step's tensors may use."""
        return self.memory - self.headroom

    @property
    def spare(self) -> int:
        """Usable bytes left at the peak (negative: by how much it does not fit)."""
        return self.usable - self.peak


def step_peak(cfg: BudgetConfig) -> int:
    """One device's peak over the first step and every later one."""
    step = activations(cfg).step
    return max(step.peak_moment.bytes, step.first_step_peak_moment.bytes)


def largest_fitting(fits, low: int, high: int) -> int | None:
    """The largest n in [low, high] with fits(n), for a fits that is true up to some
    n and false beyond; None when fits(low) is false."""
    if not fits(low):
        return None
    if fits(high):
        return high
    while high - low > 1:   # fits(low), not fits(high)
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def smallest_fitting(fits, low: int, high: int) -> int | None:
    """The smallest n in [low, high] with fits(n), for a fits that is false below
    some n and true from there; None when fits(high) is false."""
    if not fits(high):
        return None
    if fits(low):
        return low
    while high - low > 1:   # not fits(low), fits(high)
        mid = (low + high) // 2
        low, high = (low, mid) if fits(mid) else (mid, high)
    return high


def largest_micro_batch(cfg: BudgetConfig, fixed_per_device: int, memory: int,
                        max_batch: int = MAX_BATCH) -> int | None:
    """The largest micro-batch B (at this N) whose activation peak plus
    `fixed_per_device` fits in `memory`, or None if B=1 does not. The activation
    peak grows with B; the fixed bytes do not."""
    return largest_fitting(
        lambda b: fixed_per_device + activations(cfg.with_(micro_batch=b)).peak <= memory,
        1, max_batch)


def _fits(cfg: BudgetConfig, usable: int, **changes) -> bool:
    try:
        return step_peak(cfg.with_(**changes)) <= usable
    except BudgetError:     # a setting the model cannot take (too many devices) never fits
        return False


def fewest_devices(cfg: BudgetConfig, usable: int) -> dict | None:
    """The fewest data-parallel devices that fit this step (at its micro-batch),
    with the lowest ZeRO stage that gets there: {"devices": n, "zero": stage}."""
    most = min(MAX_BATCH, parameter_count(cfg))
    found = []
    for stage in ZERO_STAGES:
        n = smallest_fitting(lambda d: _fits(cfg, usable, devices=d, zero=stage), 1, most)
        if n is not None:
            found.append((n, stage))
    if not found:
        return None
    n, stage = min(found)
    return {"devices": n, "zero": stage}


def fit_answers(cfg: BudgetConfig, usable: int) -> dict:
    """Whether the step fits in `usable` bytes, the largest micro-batch, the longest
    sequence and the fewest devices that do."""
    return dict(
        fits=_fits(cfg, usable),
        largest_micro_batch=largest_fitting(
            lambda b: _fits(cfg, usable, micro_batch=b), 1, MAX_BATCH),
        longest_sequence=largest_fitting(
            lambda n: _fits(cfg, usable, micro_batch=1, seq_len=n), 1,
            cfg.block_size or MAX_COUNT),
        fewest_devices=fewest_devices(cfg, usable))


def without_adapters(cfg: BudgetConfig) -> BudgetConfig:
    """The same step as a full fine-tune: every parameter trained, no adapters."""
    return cfg.with_(lora_rank=0, lora_targets="", lora_dropout=0.0, qlora=False, dora=False,
                     modules_to_save="")


def device_fit(cfg: BudgetConfig, name: str, memory: int, flops_per_second: float,
               peak: int, flops_per_step: int, tokens_per_step_all: int) -> DeviceFit:
    seconds = _ratio(flops_per_step, cfg.mfu * flops_per_second) if flops_per_second else None
    usable = memory - cfg.headroom
    answers = dict(largest_micro_batch=None, longest_sequence=None, fewest_devices=None,
                   full_fine_tuning=None)
    if memory:
        answers = fit_answers(cfg, usable)
        del answers["fits"]     # the verdict below reads the peak it was given
        answers["full_fine_tuning"] = (fit_answers(without_adapters(cfg), usable)
                                       if cfg.lora_rank else None)
    return DeviceFit(
        device=name, memory=memory, flops_per_second=flops_per_second, peak=peak,
        headroom=cfg.headroom, fits=(peak <= usable) if memory else None, **answers,
        step_seconds=seconds,
        tokens_per_second=_ratio(tokens_per_step_all, seconds) if seconds else None)


def _ratio(a, b) -> float:
    """a / b as a float; sizes beyond float range give inf, not an OverflowError."""
    try:
        return a / b
    except OverflowError:
        return float("inf")
