"""Lesson 13's check and helpers, fed right and typical wrong answers.

13.1 (the training step) must pass a correct step, fail a stub with its own "not done
yet" message and name each typical slip. The helpers the lesson computes with are held
to what the lesson claims: MFU is achieved over peak FLOP/s with lesson 07's FLOP count,
lesson 08's formula predicts the checkpointed trainer's buffers to the byte, the bf16
export halves the file and reads back as the rounding gave it, and the slots of 08.3 and
09.1 refuse the typical wrong pieces with the reason.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from check_tools import fails_with
from coursework import lesson13
from coursework.lesson08 import exact_checkpoint_peak
from coursework.slots import SlotError, check
from engine.gpt_config import GPTConfig, tiny_config


def stub(*args, **kwargs):
    raise NotImplementedError()


# ------------------------------------------------------------------ 13.1
def step_right(model, optimizer, clip, x, y, lr, max_norm, phase):
    model.zero_grad()
    with phase("loss"):
        loss = model.forward(x, y)
    with phase("backward"):
        model.backward()
    with phase("optimizer"):
        norm = clip(model.named_grads(), max_norm)
        optimizer.step(lr)
    return loss, norm


def step_right_forward_backward(model, optimizer, clip, x, y, lr, max_norm, phase):
    """Right, written otherwise: the grads zeroed through the flat buffer, the norm
    taken from the clip's return value after the step."""
    model.grads.flat[...] = 0.0
    with phase("loss"):
        loss = float(model.forward(x, y))
    with phase("backward"):
        model.backward()
    with phase("optimizer"):
        before = clip(model.named_grads(), max_norm)
        optimizer.step(lr)
    return (loss, before)


def step_no_phases(model, optimizer, clip, x, y, lr, max_norm, phase):
    model.zero_grad()
    loss = model.forward(x, y)
    model.backward()
    norm = clip(model.named_grads(), max_norm)
    optimizer.step(lr)
    return loss, norm


def step_zero_after_backward(model, optimizer, clip, x, y, lr, max_norm, phase):
    with phase("loss"):
        loss = model.forward(x, y)
    with phase("backward"):
        model.backward()
    model.zero_grad()
    with phase("optimizer"):
        norm = clip(model.named_grads(), max_norm)
        optimizer.step(lr)
    return loss, norm


def step_backward_first(model, optimizer, clip, x, y, lr, max_norm, phase):
    model.zero_grad()
    with phase("backward"):
        model.backward()
    with phase("loss"):
        loss = model.forward(x, y)
    with phase("optimizer"):
        norm = clip(model.named_grads(), max_norm)
        optimizer.step(lr)
    return loss, norm


def step_norm_after(model, optimizer, clip, x, y, lr, max_norm, phase):
    loss, _ = step_right(model, optimizer, clip, x, y, lr, max_norm, phase)
    return loss, float(np.sqrt(np.sum(model.grads.flat.astype(np.float64) ** 2)))


def step_twice(model, optimizer, clip, x, y, lr, max_norm, phase):
    loss, norm = step_right(model, optimizer, clip, x, y, lr, max_norm, phase)
    optimizer.step(lr)
    return loss, norm


def step_clip_before_backward(model, optimizer, clip, x, y, lr, max_norm, phase):
    model.zero_grad()
    with phase("loss"):
        loss = model.forward(x, y)
    norm = clip(model.named_grads(), max_norm)
    with phase("backward"):
        model.backward()
    with phase("optimizer"):
        optimizer.step(lr)
    return loss, norm


def step_double_lr(model, optimizer, clip, x, y, lr, max_norm, phase):
    model.zero_grad()
    with phase("loss"):
        loss = model.forward(x, y)
    with phase("backward"):
        model.backward()
    with phase("optimizer"):
        norm = clip(model.named_grads(), max_norm)
        optimizer.step(2 * lr)
    return loss, norm


def step_loss_only(model, optimizer, clip, x, y, lr, max_norm, phase):
    return step_right(model, optimizer, clip, x, y, lr, max_norm, phase)[0]


def step_with(zero_at_end=False, clip_in="optimizer", limit=None, rate=None):
    """The right step with one thing changed: zeroing after the update (right, written
    differently), clipping in another phase, or another limit or learning rate than the
    ones handed (`limit` and `rate` pick them from (lr, max_norm))."""
    def step(model, optimizer, clip, x, y, lr, max_norm, phase):
        if not zero_at_end:
            model.zero_grad()
        with phase("loss"):
            loss = model.forward(x, y)
        for name in ("backward", "optimizer"):
            with phase(name):
                if name == "backward":
                    model.backward()
                if name == clip_in:
                    norm = clip(model.named_grads(),
                                max_norm=limit(lr, max_norm) if limit else max_norm)
                if name == "optimizer":
                    optimizer.step(rate(lr, max_norm) if rate else lr)
        if zero_at_end:
            model.zero_grad()
        return loss, norm
    return step


step_zero_at_the_end = step_with(zero_at_end=True)
step_clip_in_backward = step_with(clip_in="backward")
step_fixed_max_norm = step_with(limit=lambda lr, max_norm: 1.0)
step_swapped = step_with(limit=lambda lr, max_norm: lr, rate=lambda lr, max_norm: max_norm)


@pytest.mark.parametrize("fn", [step_right, step_right_forward_backward,
                                step_zero_at_the_end])
def test_13_1_passes(fn, capsys):
    lesson13.check_train_step(fn)
    assert "Exercise 13.1 (train_step) passed." in capsys.readouterr().out


def test_13_1_stub_says_not_done():
    fails_with(lesson13.check_train_step, stub, words=("Exercise 13.1", "not done yet"))


@pytest.mark.parametrize("index, phrase", [
    (0, "each step must start from an empty one"), (1, "update was not clipped"),
    (2, "clipped after the optimizer's step"),
])
def test_13_1_names_the_wrong_order(index, phrase):
    wrong, _ = lesson13._variants()[index]
    fails_with(lesson13.check_train_step, wrong, words=("Exercise 13.1", phrase))


@pytest.mark.parametrize("fn, phrase", [
    (step_no_phases, "went through the phases []"),
    (step_zero_after_backward, "zeroed after the backward had filled it"),
    (step_clip_before_backward, "clipping ran before the backward"),
    (step_double_lr, "optimizer.step got lr=0.06, but this step was handed lr=0.03"),
    (step_swapped, "optimizer.step got lr=0.05"),
    (step_fixed_max_norm, "clip got max_norm=1.0, but this step was handed max_norm=0.05"),
    (step_clip_in_backward, 'in step 1 `clip` ran inside `phase("backward")`'),
    (step_backward_first, "comes before the backward phase"),
    (step_norm_after, "the norm after clipping"),
    (step_twice, "ran 6 times"),
    (step_loss_only, "return the pair (loss, grad_norm)"),
])
def test_13_1_names_the_mistake(fn, phrase):
    fails_with(lesson13.check_train_step, fn, words=("Exercise 13.1", phrase))


@pytest.mark.parametrize("fn", [step_zero_after_backward, step_clip_before_backward,
                                step_double_lr, step_fixed_max_norm, step_clip_in_backward] + [wrong for wrong, _ in lesson13._variants()])
def test_13_1_hints_never_print_the_step(fn):
    message = fails_with(lesson13.check_train_step, fn, words=("Exercise 13.1",))
    for code in ("model.zero_grad()", "model.forward(x, y)", "model.backward()",
                 "clip(model.named_grads()", "optimizer.step(lr)"):
        assert code not in message, message
    if fn is step_clip_before_backward:
        assert "zeroed after the backward" not in message


def test_the_reference_clip_matches_the_exercise():
    grads = {"a": np.array([3.0, 0.0]), "b": np.array([4.0])}
    assert lesson13.engine_clip(grads, 1.0) == pytest.approx(5.0)
    assert np.allclose(grads["a"], [0.6, 0.0], rtol=1e-5) and np.allclose(grads["b"], [0.8], rtol=1e-5)


# ------------------------------------------------------------------ MFU
def test_step_flops_is_six_per_weight_per_token_plus_full_attention():
    cfg = tiny_config(103)
    B, T, C, L, V = 16, cfg.block_size, cfg.n_embd, cfg.n_layer, cfg.vocab_size
    weights = L * 12 * C * C + V * C              # four matrices per block, the tied head
    attention = 3 * L * 2 * (2 * T * C)           # QK^T and PV, forward + 2x backward
    assert lesson13.step_flops(cfg, B) == 6 * weights * B * T + attention * B * T
    from engine import budget
    assert lesson13.step_flops(cfg, B) == budget.budget(budget.preset("tiny")).flops[
        "per_step"]["total"]


def test_mfu_is_achieved_over_peak():
    # 10 GFLOP in 0.1 s is 100 GFLOP/s; on a 400 GFLOP/s machine that is a quarter
    assert lesson13.mfu(10e9, 0.1, 400e9) == pytest.approx(0.25)
    assert lesson13.mfu(10e9, 0.2, 400e9) == pytest.approx(0.125)   # twice as slow


def test_the_sgemm_rate_is_a_rate():
    small = lesson13.sgemm_flops_per_s(64, 32, 16, repeats=3)
    assert 1e6 < small < 1e14                      # FLOP/s, not seconds or FLOPs


# --------------------------------------------------- 08.3 on the fused trainer
@pytest.mark.parametrize("cfg, B", [(tiny_config(103), 16),
                                    (GPTConfig(vocab_size=13, block_size=8, n_layer=3,
                                               n_head=2, n_embd=8), 2)])
def test_the_formula_predicts_the_checkpointed_trainer_to_the_byte(cfg, B):
    from engine.trainer.model import FusedGPT
    measured = FusedGPT(cfg, batch_size=B, checkpointing=True).acts.saved_nbytes()
    assert lesson13.predicted_checkpointed_bytes(exact_checkpoint_peak, cfg, B) == measured
    # the same, written as the closed form of k = 1: L boundaries and one block's buffers
    sizes = lesson13.fused_activation_sizes(cfg, B)
    assert cfg.n_layer * sizes["boundary"] + sizes["block"] + sizes["outside"] == measured
    plain = FusedGPT(cfg, batch_size=B).acts.saved_nbytes()
    assert measured < plain


def test_a_formula_of_the_boundaries_only_mispredicts_the_trainer():
    cfg = tiny_config(103)
    boundaries_only = lambda n, k, a, b: -(-n // k) * a          # noqa: E731
    from engine.trainer.model import FusedGPT
    measured = FusedGPT(cfg, batch_size=16, checkpointing=True).acts.saved_nbytes()
    assert lesson13.predicted_checkpointed_bytes(boundaries_only, cfg, 16) < measured


def test_the_checkpoint_slot_takes_a_right_formula_written_otherwise():
    def closed_form(n_blocks, k, boundary_bytes, block_bytes):
        segments = -(-n_blocks // k)
        last = n_blocks - (segments - 1) * k
        full = (segments - 1) * boundary_bytes + k * block_bytes if segments > 1 else 0
        return max(full, segments * boundary_bytes + last * block_bytes)
    check("checkpoint_peak", closed_form)


@pytest.mark.parametrize("wrong, says", [
    (lambda n, k, a, b: -(-n // k) * a, "checkpoint_peak(4, 1"),          # boundaries only
    (lambda n, k, a, b: n * b, "checkpoint_peak(4, 1"),                   # no checkpointing
    (lambda n, k, a, b: None, "gives None"),
])
def test_the_checkpoint_slot_refuses_a_wrong_formula(wrong, says):
    with pytest.raises(SlotError, match=r"the peak is") as info:
        check("checkpoint_peak", wrong)
    assert says in str(info.value)


# ------------------------------------------------------- 09.1 on the weights
def bf16_by_bits(x):
    """Right, written otherwise: round half to even on the integer view, by cases."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    low = bits & 0xFFFF
    up = bits >> 16
    up = up + ((low > 0x8000) | ((low == 0x8000) & ((up & 1) == 1)))
    out = (up << 16).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), np.float32(np.nan), out).astype(np.float32)


def test_the_bf16_slot_takes_a_right_rounding_written_otherwise():
    check("to_bf16", bf16_by_bits)


@pytest.mark.parametrize("wrong, says", [
    (lambda x: (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32),
     "differ from engine.precision.round_to_bf16"),
    (lambda x: x.astype(np.float64), "float64"),
    (lambda x: None, "returned None"),
])
def test_the_bf16_slot_refuses_a_wrong_rounding(wrong, says):
    with pytest.raises(SlotError, match=says):
        check("to_bf16", wrong)


def test_the_bf16_slot_refuses_a_rounding_in_place():
    def in_place(x):
        x[...] = bf16_by_bits(x)
        return x
    with pytest.raises(SlotError, match="changed the float32 array"):
        check("to_bf16", in_place)


def test_the_bf16_export_halves_the_file_and_reads_back_the_rounding(tmp_path):
    from engine.precision import round_to_bf16
    weights = (np.random.default_rng(0).normal(size=10_000) * 0.02).astype(np.float32)
    out = lesson13.export_bf16(bf16_by_bits, weights, tmp_path)
    assert out["bf16_path"].exists() and out["fp32_path"].exists()
    assert out["bf16_bytes"] / out["fp32_bytes"] == pytest.approx(0.5, abs=0.01)
    np.testing.assert_array_equal(out["weights"], round_to_bf16(weights))
    assert np.max(np.abs(out["weights"] / weights - 1)) <= 2.0 ** -8    # half a bf16 step (8 bits)
    assert lesson13.from_bf16_bits(lesson13.bf16_bits(round_to_bf16, weights)).dtype == np.float32


def test_a_truncating_export_is_not_the_rounding(tmp_path):
    from engine.precision import round_to_bf16
    truncate = lambda x: (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)  # noqa: E731
    weights = (np.random.default_rng(1).normal(size=1000)).astype(np.float32)
    out = lesson13.export_bf16(truncate, weights, tmp_path)
    assert not np.array_equal(out["weights"], round_to_bf16(weights))
    assert math.isclose(out["bf16_bytes"] / out["fp32_bytes"], 0.5, abs_tol=0.1)


# ------------------------------------------- slow pieces: why, and the way out
def test_a_slow_piece_is_explained_with_its_cost_per_step_and_the_way_out():
    trainer = lesson13.Trainer({"bias_gelu_forward": stub, "adamw_step": stub}, {
        name: "not written yet" for name in lesson13.TRAINER_PIECES
        if name not in ("bias_gelu_forward", "adamw_step")})
    cfg = tiny_config(65)
    times = {"bias_gelu_forward": (9e-3, 1e-3), "adamw_step": (1.5e-3, 1e-3)}
    table = trainer.slot_table(cfg, 16, timer=lambda name, fn, cfg, b: times[name])
    gelu = next(line for line in table if "bias + GELU" in line)
    assert "exp is made of multiplies and adds" in gelu
    assert f"Per training step ({2 * cfg.n_layer} calls) yours adds about 64 ms." in gelu
    assert 'add "bias_gelu_forward" to ENGINE_FOR' in gelu
    adamw = next(line for line in table if "AdamW" in line)
    assert "faster because" not in adamw          # 1.5x is within the 2x tolerance
    assert table[-1] == "slow pieces: bias_gelu_forward (9.0x the engine's time)"


def test_every_trainer_slot_has_its_gap_explained():
    assert set(lesson13.ENGINE_ADVANTAGE) == set(lesson13.TRAINER_PIECES)


def test_engine_for_puts_the_engines_kernel_in_a_slot_the_learner_names():
    from engine.trainer.model import kernel_owners, reset_kernels
    trainer = lesson13.plug_in_pieces(engine_for=["bias_gelu_forward", "adamw_step"])
    try:
        assert "bias_gelu_forward" not in trainer.pieces and "adamw_step" not in trainer.pieces
        assert trainer.owner("bias_gelu_forward") == "engine's: you chose it (ENGINE_FOR)"
        assert trainer.owner("adamw_step") == "engine's: you chose it (ENGINE_FOR)"
        assert kernel_owners()["bias_gelu_forward"] == "engine"
        assert isinstance(trainer.make_optimizer(_tiny_model()), lesson13.FlatAdamW)
    finally:
        reset_kernels()


def test_engine_for_refuses_a_name_that_is_not_a_slot():
    with pytest.raises(ValueError, match="'adamw', which is not a slot of the trainer"):
        lesson13.plug_in_pieces(engine_for=["adamw"])


def _tiny_model():
    from engine.trainer.model import FusedGPT
    return FusedGPT(GPTConfig(vocab_size=13, block_size=8, n_layer=1, n_head=2, n_embd=8),
                    batch_size=2, seed=0)
