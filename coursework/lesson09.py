"""Checks for lesson 09, "Precision".

09.1 float32 -> bf16 rounding on the bits, round to nearest, ties to even;
09.2 one SGD step with fp32 master weights and bf16 weights for the forward;
09.3 the dynamic loss scaler's rule (skip and halve on overflow, grow after
     N good steps).
The typical wrong answers recognised: truncation, ties rounded up (away
from zero), NaN turned into infinity; growing on an overflow, applying a
non-finite step, a counter that is not reset; updating the bf16 copy.
"""
from __future__ import annotations

import numpy as np

from engine.precision import round_to_bf16
from ._cases import Case, Slip, array_difference, slip_reproduced
from ._core import ExerciseError, attempt, passed
from .pieces import save_piece
from .slots import engine_update_scale

EX_BF16 = "09.1 (to_bf16)"
EX_MASTER = "09.2 (master_weight_step)"
EX_SCALE = "09.3 (update_scale)"


def _bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def _from_bits(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def _truncate(x):
    return _from_bits(_bits(x) & np.uint32(0xFFFF0000))


def _half_up(x):
    return _from_bits((_bits(x) + np.uint32(0x8000)) & np.uint32(0xFFFF0000))


def _same(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return (_bits(a) == _bits(b)) | (np.isnan(a) & np.isnan(b))


# ------------------------------------------------------------------ 09.1
def check_to_bf16(to_bf16) -> None:
    """to_bf16(x: float32 array) -> float32 array holding bf16 values."""
    ties = _from_bits([0x3F808000, 0x3F818000, 0xBF808000, 0xBF818000,   # 1+2^-8, 1+3*2^-8, negatives
                       0x00008000, 0x00018000,                           # subnormal ties
                       0x7F7F8000])                                      # max bf16 vs inf
    plain = np.array([1.0, -2.5, 1.0 + 1e-4, 3.14159265, 1e-3, 65504.0, 0.0, -0.0,
                      1e-40, 3e38, np.inf, -np.inf], dtype=np.float32)
    nan_like = _from_bits([0x7F800001, 0xFF800001, 0x7FC00000])   # NaNs, two with tiny payloads
    rng = np.random.default_rng(0)
    random = _from_bits(rng.integers(0, 2 ** 32, 20000, dtype=np.uint64))
    random = random[np.isfinite(random)]
    x = np.concatenate([ties, plain, nan_like, random])
    got = attempt(EX_BF16, to_bf16, x.copy())
    got = np.asarray(got)
    if got.shape != x.shape:
        raise ExerciseError(EX_BF16, f"the result has shape {got.shape}, the input {x.shape}; "
                            f"round every element and keep the shape.")
    if got.dtype != np.float32:
        raise ExerciseError(EX_BF16, f"return float32 values (the bf16 values, as float32), "
                            f"got dtype {got.dtype}; view the uint32 bits back with "
                            f".view(np.float32).")
    want = round_to_bf16(x)
    ok = _same(got, want)
    if ok.all():
        save_piece("to_bf16", to_bf16, EX_BF16)
        passed(EX_BF16, "Ties go to even, NaN stays NaN, overflow becomes infinity.")
        return
    bad = int(np.argmin(ok))
    shown = (f"for x = {x[bad]!r} (bits {_bits(x[bad]):#010x}) you return {got[bad]!r}, the "
             f"nearest bf16 is {want[bad]!r}")
    finite = np.isfinite(x)
    if _same(got, _truncate(x))[finite].all():
        hint = ("you truncate (drop the low 16 bits). That always rounds towards zero, and the "
                "nearest bf16 value is often the one above.")
    elif _same(got, _half_up(x))[finite].all():
        hint = ("exact ties (the dropped 16 bits are exactly 0x8000) must go to the even "
                "neighbour, the one whose lowest kept bit is 0; yours always go up.")
    elif _same(got, want)[finite].all():
        hint = ("a NaN whose payload sits in the low 16 bits (e.g. bits 0x7F800001) turns into "
                "infinity when those bits are dropped. Keep NaN a NaN: NaN inputs need a path "
                "of their own.")
    elif not np.isnan(got[bad]) and np.isnan(want[bad]):
        hint = "NaN must stay NaN."
    else:
        hint = None
    n_bad = int(np.count_nonzero(~ok))
    shown += f" ({n_bad} of {x.size} values differ)"
    raise ExerciseError(EX_BF16, f"{shown}." + (f" Hint: {hint}" if hint else ""))


# ------------------------------------------------------------------ 09.3
def _scale_cases() -> list[tuple]:
    """(scale, good_steps, finite, growth_interval): the story's steps, then seeded random
    ones, one to three good steps short of the interval, some overflowing below a scale
    of 1."""
    cases = [(2.0 ** 15, 0, True, 3), (2.0 ** 15, 1, True, 3), (2.0 ** 15, 2, True, 3),
             (2.0 ** 15, 2, False, 3), (2.0 ** 15, 0, False, 3), (1024.0, 5, True, 2000),
             (1024.0, 1999, True, 2000), (8.0, 0, True, 1)]
    rng = np.random.default_rng(93)
    for i in range(12):
        interval = int(rng.choice([1, 2, 4, 5, 100]))
        good = max(0, interval - int(rng.integers(1, 4)))
        if i % 4 == 0:      # an overflow at a scale below 1, where a floor would show
            cases.append((2.0 ** int(rng.integers(-4, 0)), good, False, interval))
        else:
            cases.append((2.0 ** int(rng.integers(0, 25)), good, bool(rng.random() < 0.7),
                          interval))
    return cases


def check_update_scale(update_scale) -> None:
    """update_scale(scale, good_steps, finite, growth_interval)
    -> (new_scale, new_good_steps, apply_step)."""
    for scale, good, finite, interval in _scale_cases():
        got = attempt(EX_SCALE, update_scale, scale, good, finite, interval)
        try:
            new_scale, new_good, apply = got
        except (TypeError, ValueError):
            raise ExerciseError(EX_SCALE, f"return three values (new_scale, new_good_steps, "
                                f"apply_step), got {got!r}.") from None
        want = engine_update_scale(scale, good, finite, interval)
        if (float(new_scale), int(new_good), bool(apply)) == want:
            continue
        call = (f"update_scale(scale={scale:g}, good_steps={good}, finite={finite}, "
                f"growth_interval={interval}) returned {got!r}, expected {want!r}")
        if not finite and bool(apply):
            hint = ("a step whose gradients hold inf or NaN must be skipped (apply_step=False): "
                    "applying it would write inf/NaN into the weights.")
        elif not finite and float(new_scale) >= scale:
            hint = ("an overflow means the scale is too large: halve it (never grow it on an "
                    "overflow).")
        elif not finite and int(new_good) != 0:
            hint = "after an overflow the count of good steps starts again from 0."
        elif finite and not bool(apply):
            hint = "a step with finite gradients is applied."
        elif finite and good + 1 >= interval and float(new_scale) == scale:
            hint = (f"this is good step number {good + 1}, which reaches growth_interval="
                    f"{interval}: double the scale (and restart the count at 0).")
        elif finite and float(new_scale) == 2 * scale and int(new_good) != 0:
            hint = "after growing, restart the count of good steps at 0."
        elif finite and good + 1 < interval and float(new_scale) != scale:
            hint = (f"only {good + 1} good steps so far; keep the scale until {interval} "
                    f"good steps in a row.")
        elif finite and good + 1 < interval and int(new_good) != good + 1:
            hint = (f"a finite step below growth_interval adds exactly one good step; you "
                    f"went from {good} to {int(new_good)}.")
        elif finite and float(new_scale) not in (scale, 2 * scale):
            hint = (f"the scale grows by a factor of 2 when it grows; yours changed by a "
                    f"factor of {float(new_scale) / scale:.4g}.")
        elif not finite and float(new_scale) != scale / 2:
            hint = (f"an overflow backs the scale off by a factor of 2; yours changed by a "
                    f"factor of {float(new_scale) / scale:.4g}.")
        else:
            hint = (f"on this {'finite' if finite else 'overflowing'} step, compare each of "
                    f"the three values you return with what the lesson's scaler does.")
        raise ExerciseError(EX_SCALE, f"{call}. Hint: {hint}")
    save_piece("update_scale", update_scale, EX_SCALE)
    passed(EX_SCALE, "Skip and halve on overflow; double after growth_interval good steps.")


# ------------------------------------------------------------------ 09.2
def _master_cases() -> list[Case]:
    """The story's step (64 weights near 1, lr 1e-4), then seeded random ones: other sizes,
    scales of the weights and learning rates."""
    rng = np.random.default_rng(3)
    shapes = [(64, 1.0, 1e-4), (7, 1.0, 1e-3), (33, 0.05, 1e-2), (128, 4.0, 3e-4),
              (16, 1.0, 0.1)]
    cases = []
    for size, scale, lr in shapes:
        master = (scale * (1.0 + rng.normal(size=size) * 0.1)).astype(np.float32)
        grad = rng.normal(size=size).astype(np.float32)
        cases.append(Case((master, grad, np.float32(lr)),
                          f"for {size} master weights near {scale:g} and lr={lr:g}"))
    return cases


def _master_reference(master, grad, lr):
    return master - np.float32(lr) * grad


def _within_a_float32_step(got, want) -> bool:
    """float32 arithmetic and float64 arithmetic cast back once differ by at most one step
    of float32 (one ulp); anything further went through fewer bits somewhere."""
    got, want = np.asarray(got), np.asarray(want, np.float32)
    if got.shape != want.shape:
        return False
    gap = np.abs(got.astype(np.float64) - want.astype(np.float64))
    return bool((gap <= np.spacing(np.abs(want))).all())


MASTER_IN_BF16 = ("your master weights are rounded to bf16: an update of relative size 1e-4 "
                  "is then swallowed (1 + 1e-4 rounds to 1 in bf16). Keep the master copy in "
                  "full float32; round only the copy the forward pass reads.")

MASTER_SLIPS = [
    Slip(lambda m, g, lr: round_to_bf16(m - lr * g), MASTER_IN_BF16),
    Slip(lambda m, g, lr: round_to_bf16(round_to_bf16(m) - lr * g), MASTER_IN_BF16),
    Slip(lambda m, g, lr: m.copy(), "the master weights did not move: the step has to land "
                                    "in them (in float32)."),
    Slip(lambda m, g, lr: m + lr * g, "gradient descent subtracts: the step goes against the "
                                      "gradient."),
    Slip(lambda m, g, lr: m - lr * round_to_bf16(g),
         "you rounded the gradient to bf16 before the update: its last digits are lost, and "
         "they are what the fp32 master copy is there to keep."),
    Slip(lambda m, g, lr: m - round_to_bf16(np.array(lr, np.float32)) * g,
         "you rounded the learning rate to bf16: the step is then a little too long or too "
         "short on every weight. Keep the learning rate in float32."),
]

WEIGHT_SLIPS = [
    Slip(lambda m, g, lr: _master_reference(m, g, lr),
         "the weights for the forward pass are the new master weights unrounded: the forward "
         "reads bf16 values, so round them (with your to_bf16, or "
         "engine.precision.round_to_bf16)."),
    Slip(lambda m, g, lr: round_to_bf16(m), "the bf16 weights were rounded from the old master "
                                            "weights, from before the step."),
    Slip(lambda m, g, lr: _truncate(_master_reference(m, g, lr)),
         "the bf16 weights are truncated (the low 16 bits dropped), which always rounds "
         "towards zero; the forward reads the nearest bf16 value."),
]


def _master_pair(value, case: Case):
    try:
        new_master, weights = value
    except (TypeError, ValueError):
        raise ExerciseError(EX_MASTER, f"return two arrays (new_master, weights), got "
                            f"{type(value).__name__}.") from None
    new_master, weights = np.asarray(new_master), np.asarray(weights)
    if new_master.dtype != np.float32:
        raise ExerciseError(EX_MASTER, f"keep the master weights in float32, got "
                            f"{new_master.dtype}.")
    return new_master, weights


def check_master_weight_step(master_weight_step) -> None:
    """master_weight_step(master, grad, lr) -> (new_master fp32, weights for the forward
    rounded to bf16), on the story's step and seeded random ones."""
    cases = _master_cases()
    answers = [_master_pair(attempt(EX_MASTER, master_weight_step, *(
        x.copy() if isinstance(x, np.ndarray) else x for x in case.args)), case)
        for case in cases]
    masters = [_master_reference(*case.args) for case in cases]
    for index, what, wants, same, slips in (
            (0, "new master weights", masters, _within_a_float32_step, MASTER_SLIPS),
            (1, "bf16 weights", [round_to_bf16(w) for w in masters],
             lambda got, want: np.shape(got) == np.shape(want) and bool(_same(got, want).all()),
             WEIGHT_SLIPS)):
        got = [pair[index] for pair in answers]
        bad = next((i for i, (x, w) in enumerate(zip(got, wants)) if not same(x, w)), None)
        if bad is None:
            continue
        slip = slip_reproduced(slips, cases, got, wants, same)
        where = array_difference(got[bad], wants[bad])
        if index == 0 and np.shape(got[bad]) == np.shape(wants[bad]):
            ulps = np.abs(got[bad].astype(np.float64) - wants[bad]) / np.spacing(
                np.abs(wants[bad]))
            where += f", up to {np.nanmax(ulps):.3g} float32 steps off"
        hint = f" Hint: {slip.hint}" if slip else ""
        raise ExerciseError(EX_MASTER, f"{cases[bad].label}, your {what} differ: {where}."
                                       f"{hint}")
    save_piece("master_weight_step", master_weight_step, EX_MASTER)
    passed(EX_MASTER, "The update lands in fp32; the forward reads its bf16 rounding.")


# ------------------------------------------------------------------ the notebook
#: Each exercise function of the lesson, and its exercise.
EXERCISE_FUNCTIONS = {"to_bf16": EX_BF16, "master_weight_step": EX_MASTER, "update_scale":
                      EX_SCALE}


def name_unfinished_exercises() -> None:
    """In the notebook, a cell that needs an unfinished exercise of this lesson says which."""
    from . import _core
    _core.name_unfinished_exercises(EXERCISE_FUNCTIONS)
