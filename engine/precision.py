"""Low-precision training, emulated on float32 so every bit can be inspected.

Mixed precision is three separate decisions, and this module keeps them apart:

* storage: which format a tensor is *kept* in (weights copy, activations,
  gradients). We emulate bf16 and fp16 storage by rounding float32 values to
  the nearest value the format can hold (`round_to_bf16`, `round_to_fp16`,
  `cast`). The result is still a float32 array, but only holds values the
  smaller format could store.
* accumulation: the format a long sum is carried in. `sequential_sum` rounds
  the running sum after every addition, like a kernel whose accumulator lives
  in that format; `matmul_mixed` rounds the inputs and the output but sums in
  float32, as real mixed-precision kernels do.
* master weights: an fp32 copy of the parameters that the optimizer updates
  (`MixedPrecisionWeights`). Without it, small updates vanish in bf16.

fp16 has a narrow range, so its gradients underflow; `DynamicLossScaler`
multiplies the loss by a large scale, skips steps whose gradients overflowed
and adapts the scale.

The last part is a small two-layer classifier trained under a
`PrecisionPolicy`; lesson 09 and the tests use it to show a run stalling with
bf16 weights, recovering with fp32 master weights, and fp16 gradients being
rescued by loss scaling.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "FloatFormat", "FORMATS", "round_to_bf16", "use_bf16_rounding", "round_to_fp16", "cast",
    "bf16_bits", "bf16_from_bits", "representable_step", "underflow_report",
    "sequential_sum", "matmul_mixed",
    "MixedPrecisionWeights", "DynamicLossScaler",
    "PrecisionPolicy", "POLICIES", "ClassificationProblem", "make_classification",
    "classifier_loss_and_grads", "TrainLog", "train_classifier",
    "time_training_step", "cpu_flags_for_low_precision",
]


# ---------------------------------------------------------------- formats
@dataclass(frozen=True)
class FloatFormat:
    """What a binary floating-point format can hold.

    `mantissa_bits` counts the stored fraction bits (the leading 1 is implicit),
    so the format resolves 2**-mantissa_bits relative to a power of two.
    """
    name: str
    bits: int
    exponent_bits: int
    mantissa_bits: int

    @property
    def min_exponent(self) -> int:
        """Exponent of the smallest normal number (2**min_exponent)."""
        return 2 - 2 ** (self.exponent_bits - 1)

    @property
    def max_exponent(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def epsilon(self) -> float:
        """Gap between 1.0 and the next representable number."""
        return 2.0 ** -self.mantissa_bits

    @property
    def smallest_normal(self) -> float:
        return 2.0 ** self.min_exponent

    @property
    def smallest_subnormal(self) -> float:
        return 2.0 ** (self.min_exponent - self.mantissa_bits)

    @property
    def max(self) -> float:
        return (2.0 - 2.0 ** -self.mantissa_bits) * 2.0 ** self.max_exponent

    def bytes_per_value(self) -> int:
        return self.bits // 8


FORMATS = {
    "fp32": FloatFormat("fp32", 32, 8, 23),
    "bf16": FloatFormat("bf16", 16, 8, 7),   # fp32's exponent, 7 fraction bits
    "fp16": FloatFormat("fp16", 16, 5, 10),  # narrow exponent, 10 fraction bits
}


def _format(name: str) -> FloatFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown storage format {name!r}; use one of "
                         f"{sorted(FORMATS)}") from None


def _as_float32(x) -> np.ndarray:
    """The value as the float32 engine holds it (float64 input is rounded once)."""
    return np.asarray(x, dtype=np.float32)


# ---------------------------------------------------------------- bf16
_SIGN_EXP_MANT_HI = np.uint32(0xFFFF0000)  # the 16 bits bf16 keeps
_QUIET_NAN_BIT = np.uint32(0x00400000)     # top fraction bit: keeps a NaN a NaN


def round_to_bf16(x) -> np.ndarray:
    """Round float32 values to the nearest bf16 value, ties to even.

    bf16 is the upper half of a float32: same sign and exponent, 7 of the 23
    fraction bits. Rounding works on the integer view of the bits: add just
    under half of the dropped part (0x7FFF) plus the lowest kept bit (so an
    exact tie goes up only when that makes the kept part even), then clear
    the lower 16 bits. A carry out of the fraction bumps the exponent, which
    is exactly right (and turns values past bf16's max into infinity).
    NaN keeps its sign and is forced quiet, so dropping bits cannot turn it
    into an infinity.
    """
    x32 = _as_float32(x)
    if _bf16_rounding is not None:     # a replacement installed by use_bf16_rounding
        return _replaced_rounding(x32)
    bits = x32.view(np.uint32)
    lowest_kept = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = (bits + np.uint32(0x7FFF) + lowest_kept) & _SIGN_EXP_MANT_HI
    nan_bits = (bits | _QUIET_NAN_BIT) & _SIGN_EXP_MANT_HI
    out = np.where(np.isnan(x32), nan_bits, rounded).astype(np.uint32)
    return out.view(np.float32)


_bf16_rounding = None                  # set by use_bf16_rounding; None: the rounding above


@contextmanager
def use_bf16_rounding(fn):
    """Inside the `with`, every bf16 rounding of this module (`round_to_bf16`, so
    `cast`, `matmul_mixed`, `MixedPrecisionWeights`, `train_classifier`) runs
    `fn(x)` instead: x a float32 array, the result its bf16 values as float32,
    e.g. your own from lesson 09. `fn=None` runs the built-in rounding."""
    global _bf16_rounding
    previous, _bf16_rounding = _bf16_rounding, fn
    try:
        yield
    finally:
        _bf16_rounding = previous


def _replaced_rounding(x32: np.ndarray) -> np.ndarray:
    """Run the replacement; a replacement that calls round_to_bf16 itself gets the
    built-in rounding (no endless recursion)."""
    global _bf16_rounding
    fn, _bf16_rounding = _bf16_rounding, None
    try:
        return np.asarray(fn(x32), dtype=np.float32)
    finally:
        _bf16_rounding = fn


def bf16_bits(x) -> np.ndarray:
    """The 16-bit patterns of `x` rounded to bf16 (dtype uint16)."""
    return (round_to_bf16(x).view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def bf16_from_bits(bits) -> np.ndarray:
    """float32 values of bf16 bit patterns (exact: bf16 is a float32 prefix)."""
    b = np.asarray(bits)
    if b.dtype != np.uint16:
        raise TypeError(f"bf16_from_bits expects uint16 bit patterns, got dtype {b.dtype}; "
                        f"convert with np.asarray(bits, dtype=np.uint16)")
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


# ---------------------------------------------------------------- fp16
def representable_step(x, fmt: str) -> np.ndarray:
    """Gap above |x| to the next value of format `fmt` (float64), for float32 x.

    Normal numbers in [2**e, 2**(e+1)) are spaced 2**(e - mantissa_bits);
    below the smallest normal the spacing stays at the subnormal step.
    The exponent e is read from the float32 bits of x (for float32 zeros and
    subnormals the field reads -127, which the clamp turns into the subnormal
    step too).
    """
    f = _format(fmt)
    bits = _as_float32(x).view(np.uint32)
    e = ((bits >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int32) - 127
    return np.ldexp(1.0, np.maximum(e, f.min_exponent) - f.mantissa_bits)


def round_to_fp16(x) -> np.ndarray:
    """Round float32 values to the nearest fp16 value, ties to even.

    Works on the value grid rather than on bits: near |x| fp16 values are
    spaced `step = representable_step(x, "fp16")`, a power of two, so x / step
    is exact and `np.rint` (ties to even) picks the nearest grid point, and
    multiplying back by step is exact too. Below fp16's smallest normal
    (2**-14, about 6.1e-5) the step stays 2**-24: that yields the subnormals,
    and zero (sign kept) under 2**-25. Results past the largest finite fp16
    (65504) overflow to infinity; infinities and NaN pass through.
    """
    x32 = _as_float32(x)
    step = representable_step(x32, "fp16").astype(np.float32)  # 2^-24..2^5: exact
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.rint(x32 / step) * step
    y = np.where(np.abs(y) > np.float32(FORMATS["fp16"].max),
                 np.copysign(np.float32(np.inf), x32), y)
    return np.where(np.isfinite(x32), y, x32).astype(np.float32)


def cast(x, fmt: str) -> np.ndarray:
    """Store `x` in format `fmt` ("fp32", "bf16" or "fp16"), as float32 values."""
    _format(fmt)
    if fmt == "bf16":
        return round_to_bf16(x)
    if fmt == "fp16":
        return round_to_fp16(x)
    return np.array(x, dtype=np.float32)


def underflow_report(values, fmt: str = "fp16", scale: float = 1.0) -> dict:
    """What storing `values * scale` in `fmt` (then dividing by scale) does.

    Returns the shares of the nonzero values that were flushed to zero, that
    landed among the subnormals (fewer significant bits), that overflowed to
    infinity, the median of the element-wise relative errors (what a typical
    entry lost) and the relative error of the whole tensor, which the largest
    entries dominate (both inf on overflow).
    """
    f = _format(fmt)
    v = np.asarray(values, dtype=np.float32).ravel()
    nonzero = v != 0
    count = max(int(np.count_nonzero(nonzero)), 1)
    with np.errstate(over="ignore"):
        scaled = v * np.float32(scale)
    stored = cast(scaled, fmt)
    mag = np.abs(stored)
    restored = stored.astype(np.float64) / scale
    exact = v.astype(np.float64)
    norm = float(np.linalg.norm(exact)) or 1.0
    overflowed = int(np.count_nonzero(np.isinf(stored) & np.isfinite(v)))
    with np.errstate(invalid="ignore"):
        elementwise = np.abs(restored[nonzero] - exact[nonzero]) / np.abs(exact[nonzero])
    return {
        "flushed_to_zero": int(np.count_nonzero(nonzero & (stored == 0))) / count,
        "subnormal": int(np.count_nonzero((mag > 0) & (mag < f.smallest_normal))) / count,
        "overflowed": overflowed / count,
        "median_relative_error": (float("inf") if overflowed
                                  else float(np.median(elementwise)) if elementwise.size
                                  else 0.0),
        "relative_error": (float("inf") if overflowed
                           else float(np.linalg.norm(restored - exact)) / norm),
    }


# ---------------------------------------------------------------- accumulation
def sequential_sum(values, accumulate: str) -> float:
    """Add `values` one by one, keeping the running sum in format `accumulate`.

    This is a naive kernel's inner loop. With a bf16 accumulator, once the sum
    is large, each small addend is less than half a step and is lost.
    """
    v = cast(values, accumulate).ravel()
    total = np.float32(0.0)
    for term in v:
        total = cast(np.float32(total + term), accumulate)[()]
    return float(total)


def matmul_mixed(a, b, storage: str) -> np.ndarray:
    """`a @ b` as a mixed-precision kernel does it: inputs and output stored in
    `storage`, the inner products accumulated in float32."""
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 after an overflow
        product = np.matmul(cast(a, storage), cast(b, storage))
    return cast(product, storage)


# ---------------------------------------------------------------- master weights
class MixedPrecisionWeights:
    """Parameters kept in a storage format, with or without an fp32 master copy.

    `weights` are what the forward pass reads (values of the storage format).
    `sgd_step(grads, lr)` applies an update: with master weights the update
    goes into the fp32 copy and the storage copy is re-rounded from it; without
    them the update is added to the stored values and rounded straight back,
    so any update smaller than half a storage step is lost.
    `update_kept` says how much of the last update survived: the norm of the
    change of the weights the optimizer owns (the master copy when there is
    one) over the norm of the intended update. 1.0 means nothing was lost; a
    stalled run shows values near 0.
    """

    def __init__(self, params: dict, storage: str = "bf16", master_weights: bool = True):
        _format(storage)
        self.storage = storage
        self.master = ({k: np.array(v, dtype=np.float32) for k, v in params.items()}
                       if master_weights else None)
        self.weights = {k: cast(v, storage) for k, v in params.items()}
        self.update_kept = float("nan")

    def sgd_step(self, grads: dict, lr: float) -> None:
        intended = kept = 0.0
        for name, stored in self.weights.items():
            update = np.float32(lr) * np.asarray(grads[name], dtype=np.float32)
            if self.master is not None:
                before = self.master[name].copy()
                self.master[name] -= update           # fp32: small updates survive
                change = self.master[name] - before
                self.weights[name] = cast(self.master[name], self.storage)
            else:
                new = cast(stored - update, self.storage)  # rounded straight back
                change = new - stored
                self.weights[name] = new
            intended += float(np.sum(np.square(update, dtype=np.float64)))
            kept += float(np.sum(np.square(change, dtype=np.float64)))
        self.update_kept = float(np.sqrt(kept / intended)) if intended > 0 else 1.0


# ---------------------------------------------------------------- loss scaling
class DynamicLossScaler:
    """Loss scaling for fp16 gradients, with the scale adjusted as training goes.

    Use per step:
        loss_to_backprop = loss * scaler.scale
        ... backward: the gradients come out multiplied by scale ...
        grads, finite = scaler.unscale(grads)   # fp32, divided by scale
        if finite: apply the update
        scaler.update(finite)

    `update(False)` (a gradient was inf or NaN) means the step is skipped and
    the scale is multiplied by `backoff_factor`; after `growth_interval`
    finite steps in a row the scale is multiplied by `growth_factor`, so it
    keeps probing for the largest scale that does not overflow.
    """

    def __init__(self, init_scale: float = 2.0 ** 15, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 min_scale: float = 1.0):
        if not init_scale > 0:
            raise ValueError(f"DynamicLossScaler: init_scale must be positive, got {init_scale}")
        if not growth_factor > 1:
            raise ValueError(f"DynamicLossScaler: growth_factor must exceed 1, got {growth_factor}")
        if not 0 < backoff_factor < 1:
            raise ValueError(f"DynamicLossScaler: backoff_factor must lie in (0, 1), "
                             f"got {backoff_factor}")
        if int(growth_interval) < 1:
            raise ValueError(f"DynamicLossScaler: growth_interval must be >= 1, "
                             f"got {growth_interval}")
        self.scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.min_scale = float(min_scale)
        self.good_steps = 0      # finite steps since the last change of scale
        self.skipped_steps = 0   # total steps skipped for non-finite gradients
        self.history: list[tuple[float, bool]] = []  # (scale used, step applied)

    def unscale(self, grads: dict) -> tuple[dict, bool]:
        """Divide scaled gradients by the scale (in fp32); say whether all are finite."""
        inv = np.float32(1.0 / self.scale)
        out = {k: np.asarray(g, dtype=np.float32) * inv for k, g in grads.items()}
        finite = all(bool(np.isfinite(g).all()) for g in out.values())
        return out, finite

    def update(self, finite: bool) -> bool:
        """Record one step; return True when its update should be applied."""
        self.history.append((self.scale, bool(finite)))
        if not finite:
            self.skipped_steps += 1
            self.good_steps = 0
            self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            return False
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0
        return True


# ---------------------------------------------------------------- a model to train
@dataclass(frozen=True)
class PrecisionPolicy:
    """How one training run stores its numbers.

    storage: format of the weight copy the forward reads, of the saved
        activations and of the gradients flowing backward.
    master_weights: the optimizer updates an fp32 copy of the weights.
    loss_scale: None for no scaling, else a DynamicLossScaler's initial scale.
    Matmuls always accumulate in float32, as real mixed-precision kernels do.
    """
    storage: str = "fp32"
    master_weights: bool = True
    loss_scale: float | None = None
    growth_interval: int = 2000

    def describe(self) -> str:
        parts = [f"{self.storage} storage",
                 "fp32 master weights" if self.master_weights else "no master copy"]
        if self.loss_scale is not None:
            parts.append(f"loss scale from 2^{int(np.log2(self.loss_scale))}")
        return ", ".join(parts)


POLICIES = {
    "fp32": PrecisionPolicy("fp32"),
    "bf16 weights only": PrecisionPolicy("bf16", master_weights=False),
    "bf16 + fp32 master": PrecisionPolicy("bf16", master_weights=True),
    "fp16 + fp32 master": PrecisionPolicy("fp16", master_weights=True),
    "fp16 + master + loss scaling": PrecisionPolicy("fp16", master_weights=True,
                                                    loss_scale=2.0 ** 15),
}


@dataclass
class ClassificationProblem:
    """Points labelled by a fixed random teacher network, and a student's start."""
    x: np.ndarray
    labels: np.ndarray
    init: dict


def make_classification(n: int = 512, d_in: int = 16, d_hidden: int = 32,
                        classes: int = 8, seed: int = 0) -> ClassificationProblem:
    """A learnable task: labels are the argmax of a random two-layer teacher,
    so a student of the same shape can drive the loss towards zero (and its
    gradients towards the tiny values where fp16 runs out of range)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d_in)).astype(np.float32)
    teacher_w1 = rng.normal(size=(d_in, d_hidden)) / np.sqrt(d_in)
    teacher_w2 = rng.normal(size=(d_hidden, classes)) / np.sqrt(d_hidden)
    labels = np.argmax(np.maximum(x @ teacher_w1, 0) @ teacher_w2, axis=1)
    init = {"w1": rng.normal(size=(d_in, d_hidden)) / np.sqrt(d_in),
            "w2": rng.normal(size=(d_hidden, classes)) / np.sqrt(d_hidden)}
    return ClassificationProblem(x, labels, {k: v.astype(np.float32) for k, v in init.items()})


def classifier_loss_and_grads(weights: dict, x, labels, storage: str = "fp32",
                              loss_scale: float = 1.0) -> tuple[float, dict]:
    """Mean cross-entropy of relu(x @ w1) @ w2 and its gradients.

    Every tensor the backward reads or produces is stored in `storage`;
    matmuls accumulate in float32 and the softmax runs in float32, as real
    mixed-precision kernels do. The gradients are those of
    `loss * loss_scale`, as a scaled backward pass produces them.
    """
    def store(t):
        return cast(t, storage)

    n = x.shape[0]
    x = store(x)
    pre = matmul_mixed(x, weights["w1"], storage)
    h = store(np.maximum(pre, 0))
    logits = matmul_mixed(h, weights["w2"], storage)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_z = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    log_p = shifted - log_z
    loss = float(-np.mean(log_p[np.arange(n), labels]))
    # d(scale * mean CE)/d logits = scale * (p - onehot) / n: the mean over n
    # rows makes every entry small, and confident predictions make it smaller.
    g_logits = np.exp(log_p)
    g_logits[np.arange(n), labels] -= 1.0
    g_logits = store(g_logits * np.float32(loss_scale / n))
    g_w2 = matmul_mixed(h.T, g_logits, storage)
    g_h = matmul_mixed(g_logits, weights["w2"].T, storage)
    g_pre = store(np.where(pre > 0, g_h, np.float32(0)))
    g_w1 = matmul_mixed(x.T, g_pre, storage)
    return loss, {"w1": g_w1, "w2": g_w2}


@dataclass
class TrainLog:
    policy: PrecisionPolicy
    losses: list = field(default_factory=list)
    update_kept: list = field(default_factory=list)  # share of each update that survived
    scales: list = field(default_factory=list)  # loss scale used at each step
    applied: list = field(default_factory=list)  # False where the step was skipped
    skipped: int = 0
    weights: dict = field(default_factory=dict)  # final weights, as the forward reads them


def train_classifier(policy: PrecisionPolicy, problem: ClassificationProblem | None = None,
                     steps: int = 300, lr: float = 1.0, start: dict | None = None) -> TrainLog:
    """Full-batch SGD on `problem` under `policy`, from `start` (default: the
    problem's initial weights). The logged loss is the fp32 cross-entropy of
    the weights the forward pass read."""
    problem = problem if problem is not None else make_classification()
    params = MixedPrecisionWeights(start if start is not None else problem.init,
                                   policy.storage, policy.master_weights)
    scaler = (DynamicLossScaler(policy.loss_scale, growth_interval=policy.growth_interval)
              if policy.loss_scale is not None else None)
    log = TrainLog(policy)
    for _ in range(steps):
        scale = scaler.scale if scaler else 1.0
        loss, grads = classifier_loss_and_grads(params.weights, problem.x, problem.labels,
                                                policy.storage, scale)
        log.losses.append(loss)
        log.scales.append(scale)
        if scaler:
            grads, finite = scaler.unscale(grads)
            apply = scaler.update(finite)
        else:
            apply = all(bool(np.isfinite(g).all()) for g in grads.values())
        log.applied.append(bool(apply))
        if apply:
            params.sgd_step(grads, lr)
            log.update_kept.append(params.update_kept)
        else:
            log.skipped += 1
            log.update_kept.append(0.0)
    log.weights = {k: v.copy() for k, v in params.weights.items()}
    return log


# ---------------------------------------------------------------- speed
def time_training_step(policy: PrecisionPolicy, problem: ClassificationProblem,
                       repeats: int = 20) -> float:
    """Best-of-`repeats` seconds for one forward+backward+update under `policy`."""
    params = MixedPrecisionWeights(problem.init, policy.storage, policy.master_weights)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        _, grads = classifier_loss_and_grads(params.weights, problem.x, problem.labels,
                                             policy.storage)
        params.sgd_step(grads, 1e-6)
        best = min(best, time.perf_counter() - t0)
    return best


def cpu_flags_for_low_precision() -> list[str]:
    """The CPU's bf16/fp16-related instruction flags (Linux /proc/cpuinfo; [] elsewhere)."""
    wanted = ("avx512_bf16", "amx_bf16", "amx_fp16", "avx512_fp16", "f16c", "avx2", "avx512f")
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return [f for f in wanted if f in flags]
    except OSError:
        pass
    return []
