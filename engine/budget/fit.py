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

import functools
import math
from dataclasses import dataclass, replace

from . import optimizer_step, sharding
from .activations import activations
from .config import BudgetConfig, BudgetError
from .counts import parameter_count
from .knobs import ADAPTER_KNOBS, MAX_BATCH, MAX_COUNT, ZERO_STAGES, default


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
    return max(moment_bytes(cfg))


@functools.lru_cache(maxsize=8192)
def moment_bytes(cfg: BudgetConfig) -> tuple[int, ...]:
    """The bytes of every moment of one device's step, the steady state's then step 1's,
    each of a moment's arrangements apart (BudgetConfig is frozen and compares by its
    knobs: one evaluation per setting)."""
    step = activations(cfg).step
    return tuple(size for m in (*step.moments, *step.first_step)
                 for size in (m.arrangements or (m.bytes,)))


def clear_caches() -> None:
    """Forget every step evaluated (a benchmark's uncached run starts here)."""
    moment_bytes.cache_clear()
    _answers.cache_clear()
    sharding.clear_caches()
    optimizer_step.clear_caches()


def largest_fitting(fits, low: int, high: int, guess: int | None = None) -> int | None:
    """The largest n in [low, high] with fits(n), for a fits that is true up to some
    n and false beyond; None when fits(low) is false. A `guess` near the answer makes
    it quick (a gallop from there, then bisection): the answer does not depend on it."""
    if guess is None:
        if not fits(low):
            return None
        if fits(high):
            return high
    else:
        found = _bracket(fits, low, high, min(max(guess, low), high))
        if not isinstance(found, tuple):
            return found
        low, high = found
    while high - low > 1:   # fits(low), not fits(high)
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def _bracket(fits, low: int, high: int, guess: int):
    """From `guess`, steps doubling outwards until the edge is between two of them:
    (last that fits, first that does not), or the answer itself at an end."""
    if fits(guess):
        last, step = guess, 1
        while True:
            ahead = last + step
            if ahead >= high:
                return high if fits(high) else (last, high)
            if not fits(ahead):
                return last, ahead
            last, step = ahead, 2 * step
    first_not, step = guess, 1
    while True:
        behind = first_not - step
        if behind <= low:
            return (low, first_not) if fits(low) else None
        if fits(behind):
            return behind, first_not
        first_not, step = behind, 2 * step


def smallest_fitting(fits, low: int, high: int, guess: int | None = None) -> int | None:
    """The smallest n in [low, high] with fits(n), for a fits that is false below
    some n and true from there; None when fits(high) is false."""
    if guess is not None and guess >= high and not fits(high):
        return None
    last_short = largest_fitting(lambda n: not fits(n), low, high,
                                 None if guess is None else guess - 1)
    if last_short is None:
        return low
    return None if last_short == high else last_short + 1


def largest_micro_batch(cfg: BudgetConfig, fixed_per_device: int, memory: int,
                        max_batch: int = MAX_BATCH) -> int | None:
    """The largest micro-batch B (at this N) whose activation peak plus
    `fixed_per_device` fits in `memory`, or None if B=1 does not. The activation
    peak grows with B; the fixed bytes do not."""
    return largest_fitting(
        lambda b: fixed_per_device + activations(cfg.with_(micro_batch=b)).peak <= memory,
        1, max_batch)


def _peaks(cfg: BudgetConfig, **changes) -> tuple[int, ...] | None:
    """`moment_bytes` of `cfg` with `changes`; None for a setting the model cannot take
    (too many devices, a sequence beyond the positions): it never fits."""
    try:
        return moment_bytes(replace(cfg, **changes))   # activations() validates it
    except BudgetError:
        return None


def _fits(cfg: BudgetConfig, usable: int, **changes) -> bool:
    peaks = _peaks(cfg, **changes)
    return peaks is not None and max(peaks) <= usable


# Every moment of a step is a sum of tensors whose sizes are polynomials in the knob a
# search moves (a micro-batch's tensors grow linearly with B, the T x T ones with T^2,
# each device's shard as 1/N), so two or three evaluations predict where each moment
# crosses the usable bytes. The prediction is only the search's starting point: the
# answer is the one a bisection finds, confirmed by evaluating around it.
def _affine_guess(at_1, at_2, usable: int) -> int | None:
    """The largest x with every moment (a + s*x, from x = 1 and 2) at most `usable`."""
    if at_1 is None or at_2 is None or len(at_1) != len(at_2):
        return None
    bound = MAX_COUNT * MAX_BATCH
    for m1, m2 in zip(at_1, at_2):
        slope = m2 - m1
        if slope > 0:
            bound = min(bound, (usable - (m1 - slope)) // slope)
    return bound


def _quadratic_guess(points, usable: int) -> int | None:
    """The largest x with every moment (a quadratic in x through x = 1, 2, 3) at most
    `usable`."""
    if any(p is None for p in points) or len({len(p) for p in points}) != 1:
        return None
    bound = float(MAX_COUNT)
    for m1, m2, m3 in zip(*points):
        a = (m3 - 2 * m2 + m1) / 2
        b = (m2 - m1) - 3 * a
        c = m1 - a - b
        if a > 0:
            disc = b * b - 4 * a * (c - usable)
            bound = min(bound, (-b + math.sqrt(disc)) / (2 * a) if disc >= 0 else 0)
        elif b > 0:
            bound = min(bound, (usable - c) / b)
    return int(bound)


def _reciprocal_guess(at_1, at_2, usable: int) -> int | None:
    """The smallest n with every moment (a + c/n, from n = 1 and 2) at most `usable`."""
    if at_1 is None or at_2 is None or len(at_1) != len(at_2):
        return None
    need = 1
    for m1, m2 in zip(at_1, at_2):
        c, a = 2 * (m1 - m2), 2 * m2 - m1
        if a >= usable:
            return MAX_BATCH        # this moment never fits: the search confirms it
        if c > 0:
            need = max(need, -(-c // (usable - a)))
    return need


def fewest_devices(cfg: BudgetConfig, usable: int) -> dict | None:
    """The fewest data-parallel devices that fit this step (at its micro-batch),
    with the lowest ZeRO stage that gets there: {"devices": n, "zero": stage}."""
    most = min(MAX_BATCH, parameter_count(cfg))
    if _fits(cfg, usable, devices=1, zero=0):   # one device, which shards nothing
        return {"devices": 1, "zero": ZERO_STAGES[0]}
    found = []
    for stage in ZERO_STAGES:
        # one device shards nothing, whatever the stage: one setting to evaluate
        def fits(d, stage=stage):
            return _fits(cfg, usable, devices=d, zero=stage if d > 1 else 0)
        if not fits(most):
            continue
        guess = _reciprocal_guess(_peaks(cfg, devices=1, zero=0),
                                  _peaks(cfg, devices=2, zero=stage), usable)
        n = smallest_fitting(fits, 1, most, guess)
        if n is not None:
            found.append((n, stage))
    if not found:
        return None
    n, stage = min(found)
    return {"devices": n, "zero": stage}


def fit_answers(cfg: BudgetConfig, usable: int) -> dict:
    """Whether the step fits in `usable` bytes, the largest micro-batch, the longest
    sequence and the fewest devices that do."""
    fits, batch, sequence, fewest = _answers(cfg, usable)
    return dict(fits=fits, largest_micro_batch=batch, longest_sequence=sequence,
                fewest_devices=dict(fewest) if fewest else None)


@functools.lru_cache(maxsize=1024)
def _answers(cfg: BudgetConfig, usable: int) -> tuple:
    """fit_answers as a tuple, once per setting (a LoRA step and its table's columns
    share the full fine-tune's)."""
    # each search asks first whether its smallest setting fits, before any guess
    batch = largest_fitting(
        lambda b: _fits(cfg, usable, micro_batch=b), 1, MAX_BATCH,
        _affine_guess(_peaks(cfg, micro_batch=1), _peaks(cfg, micro_batch=2), usable)
    ) if _fits(cfg, usable, micro_batch=1) else None
    longest = cfg.block_size or MAX_COUNT
    sequence = largest_fitting(
        lambda n: _fits(cfg, usable, micro_batch=1, seq_len=n), 1, longest,
        _quadratic_guess([_peaks(cfg, micro_batch=1, seq_len=n) for n in (1, 2, 3)], usable)
    ) if _fits(cfg, usable, micro_batch=1, seq_len=1) else None
    fewest = fewest_devices(cfg, usable)
    return (_fits(cfg, usable), batch, sequence,
            tuple(fewest.items()) if fewest else None)


def without_adapters(cfg: BudgetConfig) -> BudgetConfig:
    """The same step as a full fine-tune: every parameter trained, no adapters, and every
    knob that describes adapters (knobs.ADAPTER_KNOBS, QLoRA's 4-bit weights among them)
    at its default."""
    return cfg.with_(lora_rank=0, **{knob: default(knob) for knob in ADAPTER_KNOBS})


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
