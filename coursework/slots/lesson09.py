"""Lesson 09's slots: bfloat16 rounding, the master-weight step, the loss scale."""
from __future__ import annotations

import numpy as np

from engine import precision as P
from engine.precision import DynamicLossScaler, MixedPrecisionWeights

from .core import SlotError


def _bf16_probe() -> np.ndarray:
    """float32 values a training step rounds, and the ones that test a rounding: ties,
    subnormals, NaN payloads, values past bf16's max, random bit patterns."""
    rng = np.random.default_rng(901)
    special = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x00008000, 0x00018000,
                        0x7F7F8000, 0x7F800001, 0xFF800001, 0x7FC00000, 0x7F800000,
                        0x00000000, 0x80000000], dtype=np.uint32).view(np.float32)
    random = rng.integers(0, 2 ** 32, 4084, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values = rng.normal(size=3072).astype(np.float32) * np.float32(1e-3)
    return np.concatenate([special, random, values])


def _same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.all((a.view(np.uint32) == b.view(np.uint32))
                                              | (np.isnan(a) & np.isnan(b))))


def _check_to_bf16(fn):
    # engine.precision hands it float32 arrays of any shape: a weight matrix, the
    # transposed view a matmul reads, a 0-d scalar; it must not write into them.
    probe = _bf16_probe()
    cases = [probe.reshape(64, 112), probe.reshape(112, 64).T, np.float32(1.0001).reshape(())]
    for x in cases:
        before = x.copy()
        with P.use_bf16_rounding(None):
            want = P.round_to_bf16(x)
        with np.errstate(all="ignore"):   # the probe holds NaNs and infinities on purpose
            got = fn(x)
        if not _same_bits(x, before):
            raise SlotError(f"changed the float32 array of shape {x.shape} it was handed: the "
                            f"engine rounds weights and activations it still needs, so work on "
                            f"a copy (bits + ... makes a new array; bits += ... does not)")
        if not isinstance(got, np.ndarray) or got.dtype != np.float32 or got.shape != x.shape:
            raise SlotError(f"on a float32 array of shape {x.shape} it returned "
                            f"{getattr(got, 'dtype', type(got).__name__)} of shape "
                            f"{getattr(got, 'shape', '?')}; the engine needs float32 of the "
                            f"same shape")
        if not _same_bits(got, want):
            layout = "a transposed view" if not x.flags.c_contiguous else f"shape {x.shape}"
            raise SlotError(f"on a float32 array ({layout}) its values differ from "
                            f"engine.precision.round_to_bf16's")


def _check_master_weight_step(fn):
    # A training step hands it a parameter's fp32 master copy, its fp32 gradient and the
    # learning rate as a Python float; compared with engine.precision's
    # MixedPrecisionWeights over two steps.
    rng = np.random.default_rng(902)
    master = (1.0 + 0.1 * rng.normal(size=(16, 8))).astype(np.float32)
    engine = P.MixedPrecisionWeights({"w": master}, "bf16", master_weights=True)
    mine = master.copy()
    for step in (1, 2):
        grad = rng.normal(size=(16, 8)).astype(np.float32)
        kept = grad.copy()
        with P.use_bf16_rounding(None):
            engine.sgd_step({"w": grad}, 1e-3)
            got = fn(mine.copy(), grad, 1e-3)
            try:
                mine, weights = got
            except (TypeError, ValueError):
                raise SlotError(f"returned {type(got).__name__}, not the pair (new_master, "
                                f"weights)") from None
            mine, weights = np.asarray(mine), np.asarray(weights)
            if not _same_bits(grad, kept):
                raise SlotError("changed the gradient it was handed (the trainer still logs "
                                "and clips it): compute the update into a new array")
            if mine.dtype != np.float32 or mine.shape != master.shape:
                raise SlotError(f"the new master weights are {mine.dtype} of shape "
                                f"{mine.shape}; the optimizer keeps float32 {master.shape}")
            if not np.allclose(mine, engine.master["w"], rtol=1e-6, atol=0):
                raise SlotError(f"after step {step} the fp32 master weights differ from "
                                f"engine.precision.MixedPrecisionWeights' (lr 1e-3)")
            if not _same_bits(weights.astype(np.float32), P.round_to_bf16(mine)):
                raise SlotError(f"after step {step} the weights for the forward are not the "
                                f"bf16 rounding of the new master weights")


def _check_update_scale(fn):
    # A training loop calls it once a step and feeds back what it returns; compared with
    # engine.precision.DynamicLossScaler over 40 steps with overflows mixed in.
    engine = DynamicLossScaler(init_scale=2.0 ** 16, growth_interval=4)
    scale, good = 2.0 ** 16, 0
    pattern = [True] * 9 + [False, False] + [True] * 4 + [False] + [True] * 25
    for step, finite in enumerate(pattern):
        got = fn(scale, good, finite, 4)
        try:
            scale, good, apply = got
        except (TypeError, ValueError):
            raise SlotError(f"returned {got!r}, not (new_scale, new_good_steps, "
                            f"apply_step)") from None
        applied = engine.update(finite)
        if (float(scale), int(good), bool(apply)) != (engine.scale, engine.good_steps, applied):
            raise SlotError(f"at step {step} of a run (growth_interval 4, "
                            f"{'finite' if finite else 'overflowed'} gradients) it gave "
                            f"scale {float(scale):g}, good steps {good}, apply {bool(apply)}; "
                            f"engine.precision.DynamicLossScaler gives {engine.scale:g}, "
                            f"{engine.good_steps}, {applied}")


# The engine's versions, with the calling conventions of exercises 09.3 and 09.2.
def engine_update_scale(scale, good_steps, finite, growth_interval):
    """The engine's loss-scaler rule (engine.precision.DynamicLossScaler) with the calling
    convention of exercise 09.3: (new_scale, new_good_steps, apply_step)."""
    scaler = DynamicLossScaler(init_scale=scale, growth_interval=growth_interval,
                               min_scale=0.0)
    scaler.good_steps = int(good_steps)
    apply = scaler.update(bool(finite))
    return scaler.scale, scaler.good_steps, apply


def engine_master_weight_step(master, grad, lr):
    """The engine's master-weight SGD step (engine.precision.MixedPrecisionWeights) with the
    calling convention of exercise 09.2: (new fp32 master, bf16 weights for the forward)."""
    weights = MixedPrecisionWeights({"w": master}, storage="bf16", master_weights=True)
    weights.sgd_step({"w": grad}, lr)
    return weights.master["w"], weights.weights["w"]


CONTRACTS = {"to_bf16": _check_to_bf16, "master_weight_step": _check_master_weight_step, "update_scale": _check_update_scale}
