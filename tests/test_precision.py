"""engine.precision: bit-exact rounding, accumulation, master weights, loss scaling.

References for the rounding:
* fp16: numpy's float16 conversion (an exact IEEE half, round to nearest even);
* bf16: an independent float64 reference written below (value grid and
  np.rint, no bit tricks), and torch.bfloat16 when PyTorch is importable.
NaN payloads differ between implementations, so a NaN is compared as "is NaN".
"""
from __future__ import annotations

import numpy as np
import pytest

from engine import precision as P

F32 = np.float32


def f32_from_bits(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def same_bits(a, b) -> np.ndarray:
    """Elementwise: identical float32 bits, or both NaN."""
    a, b = np.asarray(a, F32), np.asarray(b, F32)
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def assert_same_bits(got, want, inputs):
    ok = same_bits(got, want)
    if not ok.all():
        i = int(np.argmin(ok))
        x = np.asarray(inputs, F32).ravel()[i]
        raise AssertionError(
            f"{int((~ok).sum())} mismatches; first: input {x!r} "
            f"(bits {x.view(np.uint32):#010x}) -> got {np.asarray(got).ravel()[i]!r}, "
            f"want {np.asarray(want).ravel()[i]!r}")


def bf16_reference(x) -> np.ndarray:
    """Round float32 -> bf16 with float64 arithmetic on the value grid."""
    with np.errstate(invalid="ignore"):
        x = np.asarray(x, F32).astype(np.float64)
    out = np.empty_like(x)
    finite = np.isfinite(x)
    mag = np.abs(x[finite])
    e = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
    # log2 can be off by one next to a power of two: fix e so 2**e <= mag < 2**(e+1)
    e = np.where(np.ldexp(1.0, e.astype(int)) > mag, e - 1, e)
    e = np.where(np.ldexp(1.0, (e + 1).astype(int)) <= mag, e + 1, e)
    step = np.ldexp(1.0, (np.maximum(e, -126) - 7).astype(int))
    y = np.rint(x[finite] / step) * step
    bf16_max = (2 - 2.0 ** -7) * 2.0 ** 127
    y = np.where(np.abs(y) > bf16_max, np.copysign(np.inf, x[finite]), y)
    out[finite] = y
    out[~finite] = x[~finite]
    return out.astype(F32)


def every_midpoint(n_patterns: int = 1 << 16, shift: int = 16) -> np.ndarray:
    """For every 16-bit pattern: the float32 exactly halfway to the next
    pattern (a tie) and its float32 neighbours on both sides."""
    if shift == 16:  # bf16: a pattern is the top half of a float32
        base = np.arange(n_patterns, dtype=np.uint64) << np.uint64(16)
        mid = (base + 0x8000).astype(np.uint32)
        return np.concatenate([mid, mid - 1, mid + 1, base.astype(np.uint32)])
    raise ValueError(shift)


EDGE_VALUES = np.array([
    0.0, -0.0, 1.0, -1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), -(1 + 3 * 2 ** -8),
    1 + 2 ** -11, 1 + 3 * 2 ** -11, 1 + 1e-4, 65504.0, 65519.996, 65520.0, 65536.0,
    2 ** -14, 2 ** -24, 2 ** -25, 3 * 2 ** -25, 2 ** -26, 6e-5, 5.9e-8, 1e-45, 1e-40,
    3.3895314e38, 3.4e38, np.finfo(F32).max, np.finfo(F32).tiny, np.inf, -np.inf, np.nan,
], dtype=F32)
SPECIAL_BITS = np.array([0x7F800001, 0xFF800001, 0x7FC00000, 0xFFFFFFFF, 0x7F7FFFFF,
                         0x7F7F8000, 0x7F7F7FFF, 0x00008000, 0x00018000, 0x00007FFF,
                         0x80008000, 0x3F808000, 0x3F818000], dtype=np.uint32)


# ------------------------------------------------------------------ bf16
def test_bf16_worked_ties():
    # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even pattern (1.0)
    assert P.round_to_bf16(F32(1 + 2 ** -8)) == 1.0
    # 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up
    assert P.round_to_bf16(F32(1 + 3 * 2 ** -8)) == F32(1 + 2 ** -6)
    assert P.round_to_bf16(F32(-(1 + 3 * 2 ** -8))) == F32(-(1 + 2 ** -6))
    # the swallowed update of the lesson
    assert P.round_to_bf16(F32(1.0) + F32(1e-4)) == 1.0


def test_bf16_edge_cases_match_reference():
    x = np.concatenate([EDGE_VALUES, f32_from_bits(SPECIAL_BITS)])
    assert_same_bits(P.round_to_bf16(x), bf16_reference(x), x)


def test_bf16_nan_stays_nan_even_with_only_low_payload_bits():
    # truncating 0x7F800001 would give 0x7F80 = inf; a NaN must stay NaN, sign kept
    x = f32_from_bits([0x7F800001, 0xFF800001])
    y = P.round_to_bf16(x)
    assert np.isnan(y).all()
    assert list(np.signbit(y)) == [False, True]


def test_bf16_overflow_and_infinities():
    x = f32_from_bits([0x7F7F8000, 0x7F7F7FFF, 0x7F800000, 0xFF800000])
    y = P.round_to_bf16(x)
    # 0x7F7F8000 is a tie between bf16 max (odd pattern 0x7F7F) and inf (0x7F80)
    assert list(P.bf16_bits(y)) == [0x7F80, 0x7F7F, 0x7F80, 0xFF80]


def test_bf16_every_tie_and_neighbour_matches_reference():
    x = f32_from_bits(every_midpoint())
    assert_same_bits(P.round_to_bf16(x), bf16_reference(x), x)


def test_bf16_random_bit_patterns_match_reference():
    rng = np.random.default_rng(0)
    x = f32_from_bits(rng.integers(0, 2 ** 32, size=300_000, dtype=np.uint64))
    assert_same_bits(P.round_to_bf16(x), bf16_reference(x), x)


def test_bf16_matches_torch_when_available():
    torch = pytest.importorskip("torch", reason="PyTorch not installed: bf16 is checked "
                                                "against the float64 reference only")
    rng = np.random.default_rng(1)
    x = np.concatenate([EDGE_VALUES, f32_from_bits(SPECIAL_BITS), f32_from_bits(every_midpoint()),
                        f32_from_bits(rng.integers(0, 2 ** 32, size=200_000, dtype=np.uint64))])
    want = torch.from_numpy(x.copy()).to(torch.bfloat16).to(torch.float32).numpy()
    assert_same_bits(P.round_to_bf16(x), want, x)


def test_bf16_bits_round_trip_over_all_patterns():
    patterns = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = P.bf16_from_bits(patterns)
    back = P.bf16_bits(values)
    finite = ~np.isnan(values)
    assert np.array_equal(back[finite], patterns[finite])   # every bf16 value is a fixed point
    assert np.isnan(P.bf16_from_bits(back[~finite])).all()
    with pytest.raises(TypeError, match="uint16"):
        P.bf16_from_bits(np.array([1, 2], dtype=np.int64))


# ------------------------------------------------------------------ fp16
def numpy_fp16(x) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(x, F32).astype(np.float16).astype(F32)


def test_fp16_edge_cases_match_numpy():
    x = np.concatenate([EDGE_VALUES, f32_from_bits(SPECIAL_BITS)])
    assert_same_bits(P.round_to_fp16(x), numpy_fp16(x), x)


def test_fp16_worked_values():
    r = P.round_to_fp16
    assert r(F32(65519.996)) == 65504.0          # just under the overflow threshold
    assert np.isposinf(r(F32(65520.0)))           # the tie with 65536 goes to the even side: inf
    assert r(F32(2 ** -25)) == 0.0                # half the smallest subnormal: tie -> 0 (even)
    assert r(F32(3 * 2 ** -25)) == F32(2 ** -23)  # tie between 1 and 2 subnormal steps -> 2
    assert np.signbit(r(F32(-1e-10)))             # flushed to -0.0, sign kept
    assert r(F32(1 + 1e-4)) == 1.0


def test_fp16_every_tie_and_neighbour_matches_numpy():
    # every finite fp16 value h, the float32 halfway to the next one, and its neighbours
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    lo = halves[np.isfinite(halves)].astype(np.float64)
    step = np.asarray(P.representable_step(lo.astype(F32), "fp16"), dtype=np.float64)
    mid = (lo + np.copysign(step, lo) / 2).astype(F32)    # exact in float32
    neighbours = [np.nextafter(mid, F32(np.inf)), np.nextafter(mid, F32(-np.inf))]
    x = np.concatenate([mid, *neighbours, lo.astype(F32)])
    assert_same_bits(P.round_to_fp16(x), numpy_fp16(x), x)


def test_fp16_random_bit_patterns_match_numpy():
    rng = np.random.default_rng(2)
    x = f32_from_bits(rng.integers(0, 2 ** 32, size=300_000, dtype=np.uint64))
    assert_same_bits(P.round_to_fp16(x), numpy_fp16(x), x)


def test_formats_describe_the_real_limits():
    fp16, bf16 = P.FORMATS["fp16"], P.FORMATS["bf16"]
    assert fp16.max == float(np.finfo(np.float16).max) == 65504.0
    assert fp16.smallest_normal == float(np.finfo(np.float16).tiny)        # ~6.1e-5
    assert fp16.smallest_subnormal == float(np.finfo(np.float16).smallest_subnormal)
    assert bf16.smallest_normal == float(np.finfo(F32).tiny)               # fp32's range
    assert bf16.epsilon == 2.0 ** -7 and fp16.epsilon == 2.0 ** -10
    assert P.cast(F32(bf16.max), "bf16") == F32(bf16.max)


def test_cast_names_the_formats_on_error():
    with pytest.raises(ValueError, match="'fp8'.*bf16"):
        P.cast(np.ones(2), "fp8")
    x = np.array([1.5, 2.25], F32)
    assert P.cast(x, "fp32").dtype == F32 and np.array_equal(P.cast(x, "fp32"), x)


# ------------------------------------------------------------------ accumulation
def test_bf16_accumulator_stalls_at_256():
    # 256 + 1 is a tie between 256 and 258 in bf16 (8 significant bits): stays 256
    assert P.sequential_sum(np.ones(1000), "bf16") == 256.0
    assert P.sequential_sum(np.ones(1000), "fp32") == 1000.0
    assert P.sequential_sum(np.ones(3000), "fp16") == 2048.0


def test_matmul_mixed_rounds_inputs_and_output_but_sums_in_fp32():
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(8, 300)).astype(F32), rng.normal(size=(300, 5)).astype(F32)
    got = P.matmul_mixed(a, b, "bf16")
    want = P.round_to_bf16(P.round_to_bf16(a) @ P.round_to_bf16(b))
    assert np.array_equal(got, want)
    # a bf16 accumulator would be much worse than fp32 accumulation
    ab, bb = P.round_to_bf16(a[0]), P.round_to_bf16(b[:, 0])
    exact = float(np.dot(ab.astype(np.float64), bb.astype(np.float64)))
    lowp = P.sequential_sum(ab * bb, "bf16")
    assert abs(float(got[0, 0]) - exact) <= abs(exact) * 2 ** -8 + 1e-6
    assert abs(lowp - exact) > abs(float(got[0, 0]) - exact)


# ------------------------------------------------------------------ master weights
def test_small_updates_vanish_without_master_weights():
    start = {"w": np.ones(10, F32)}
    grads = {"w": np.full(10, 1.0, F32)}
    plain = P.MixedPrecisionWeights(start, "bf16", master_weights=False)
    master = P.MixedPrecisionWeights(start, "bf16", master_weights=True)
    for _ in range(100):
        plain.sgd_step(grads, lr=1e-4)
        master.sgd_step(grads, lr=1e-4)
    assert np.all(plain.weights["w"] == 1.0) and plain.update_kept == 0.0
    np.testing.assert_allclose(master.master["w"], 0.99, rtol=1e-5)
    assert np.all(master.weights["w"] == P.round_to_bf16(master.master["w"]))
    assert master.weights["w"][0] < 1.0 and master.update_kept == pytest.approx(1.0, rel=1e-3)


def test_training_stalls_with_bf16_weights_and_recovers_with_master_weights():
    problem = P.make_classification()
    logs = {name: P.train_classifier(P.POLICIES[name], problem, steps=600)
            for name in ("fp32", "bf16 weights only", "bf16 + fp32 master")}
    fp32, stalled, mixed = (logs[k].losses[-1] for k in logs)
    assert stalled > 3 * fp32, (stalled, fp32)
    assert mixed < 1.1 * fp32, (mixed, fp32)
    # the stalled run lost most of each update; the master copy kept all of it
    assert np.mean(logs["bf16 weights only"].update_kept[-100:]) < 0.5
    assert np.mean(logs["bf16 + fp32 master"].update_kept[-100:]) > 0.99


# ------------------------------------------------------------------ loss scaling
def lm_logit_gradient(tokens=2048, vocab=96, margin=0.0, seed=0):
    """d(mean cross-entropy)/d(logits) of a language model's output layer."""
    rng = np.random.default_rng(seed)
    logits = 0.02 * rng.normal(size=(tokens, vocab))
    targets = rng.integers(0, vocab, tokens)
    logits[np.arange(tokens), targets] += margin
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(tokens), targets] -= 1.0
    return (p / tokens).astype(F32)


def test_fp16_gradients_underflow_and_loss_scaling_saves_them():
    g = lm_logit_gradient(margin=12.0)   # a confident model: tiny wrong-class gradients
    plain = P.underflow_report(g, "fp16", 1.0)
    scaled = P.underflow_report(g, "fp16", 2.0 ** 15)
    assert np.median(np.abs(g)) < P.FORMATS["fp16"].smallest_normal
    assert plain["flushed_to_zero"] > 0.5 and plain["median_relative_error"] == 1.0
    assert scaled["flushed_to_zero"] == 0.0 and scaled["subnormal"] < 0.01
    assert scaled["median_relative_error"] < 2.0 ** -10
    assert P.underflow_report(g, "bf16", 1.0)["flushed_to_zero"] == 0.0  # fp32's range
    # an untrained model's gradient is larger (up to 1/tokens): 2^28 overflows it
    overflow = P.underflow_report(lm_logit_gradient(margin=0.0), "fp16", 2.0 ** 28)
    assert overflow["overflowed"] > 0 and overflow["relative_error"] == float("inf")


def test_loss_scaler_defaults_and_unscale():
    s = P.DynamicLossScaler()
    assert s.scale == 2.0 ** 15 and s.growth_interval == 2000
    grads, finite = s.unscale({"w": np.array([2.0 ** 15, -2.0 ** 14], F32)})
    assert finite and grads["w"].dtype == F32 and list(grads["w"]) == [1.0, -0.5]
    _, finite = s.unscale({"w": np.array([1.0, np.inf], F32)})
    assert not finite
    _, finite = s.unscale({"w": np.array([np.nan], F32)})
    assert not finite


def test_loss_scaler_skips_halves_and_grows():
    s = P.DynamicLossScaler(init_scale=1024.0, growth_interval=3)
    assert s.update(True) and s.update(True) and s.scale == 1024.0
    assert s.update(False) is False                   # overflow: skip the step, halve
    assert s.scale == 512.0 and s.skipped_steps == 1 and s.good_steps == 0
    for _ in range(2):
        assert s.update(True)
    assert s.scale == 512.0                           # the counter restarted after the skip
    assert s.update(True) and s.scale == 1024.0 and s.good_steps == 0
    assert [applied for _, applied in s.history] == [True, True, False, True, True, True]
    floor = P.DynamicLossScaler(init_scale=2.0, min_scale=1.0)
    floor.update(False)
    floor.update(False)
    assert floor.scale == 1.0


@pytest.mark.parametrize("kwargs, message", [
    ({"init_scale": 0}, "init_scale"), ({"growth_factor": 1.0}, "growth_factor"),
    ({"backoff_factor": 1.5}, "backoff_factor"), ({"growth_interval": 0}, "growth_interval")])
def test_loss_scaler_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        P.DynamicLossScaler(**kwargs)


def test_fp16_training_with_an_overambitious_scale_skips_then_settles():
    policy = P.PrecisionPolicy("fp16", master_weights=True, loss_scale=2.0 ** 30,
                               growth_interval=25)
    log = P.train_classifier(policy, steps=200)
    assert log.scales[0] == 2.0 ** 30
    # the first steps overflow: each one is skipped and halves the scale
    first_good = next(i for i, s in enumerate(log.scales) if i and s >= log.scales[i - 1])
    assert first_good >= 3
    assert all(log.scales[i] == log.scales[i - 1] / 2 for i in range(1, first_good))
    assert max(log.scales[first_good:]) > log.scales[first_good]   # it grows again
    assert log.skipped >= first_good
    # a skipped step is a lost step: the run matches fp32 trained for the applied steps
    fp32 = P.train_classifier(P.POLICIES["fp32"], steps=200 - log.skipped)
    assert log.losses[-1] == pytest.approx(fp32.losses[-1], rel=0.02)


def test_representable_step_matches_numpy_spacing_across_the_whole_range():
    x = np.concatenate([2.0 ** np.arange(-149, 128), np.random.default_rng(4).uniform(
        1e-44, 1e38, 1000)]).astype(F32)
    assert np.array_equal(P.representable_step(x, "fp32"), np.spacing(x).astype(np.float64))
    halves = np.concatenate([2.0 ** np.arange(-24, 16), [3e-7, 6e-5, 0.3, 700.0, 60000.0]])
    halves = halves.astype(np.float16)
    assert np.array_equal(P.representable_step(halves.astype(F32), "fp16"),
                          np.spacing(halves).astype(np.float64))
    assert P.representable_step(F32(0.0), "bf16") == 2.0 ** -133   # bf16's smallest subnormal
    assert P.representable_step(F32(3.0), "bf16") == 2.0 ** -6
