"""The exercise checks of lessons 08 and 09, fed right and typical wrong answers.

Each check must pass a correct answer, fail a stub with the exercise's own
"not done yet" message, and fail each typical wrong answer with a hint that
names the mistake (asserted by matching a phrase of the hint).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import engine
from engine import Tensor
from coursework import ExerciseError, lesson08, lesson09
from case_tools import assert_each_slip_named


def stub(*args, **kwargs):
    raise NotImplementedError()


def fails_with(check, answer, phrase):
    with pytest.raises(ExerciseError) as info:
        check(answer)
    assert phrase in str(info.value), str(info.value)
    return str(info.value)


# ================================================================ 08.1
def accumulate_right(model, micro_batches):
    model.zero_grad()
    K = len(micro_batches)
    total = 0.0
    for ids, targets in micro_batches:
        loss = model(ids, targets)
        (loss / K).backward()
        total += loss.item()
    return total / K


def accumulate_without_k(model, micro_batches):
    model.zero_grad()
    total = 0.0
    for ids, targets in micro_batches:
        loss = model(ids, targets)
        loss.backward()
        total += loss.item()
    return total / len(micro_batches)


def accumulate_without_zero(model, micro_batches):
    K = len(micro_batches)
    for ids, targets in micro_batches:
        (model(ids, targets) / K).backward()
    return 0.0


def accumulate_zero_inside(model, micro_batches):
    K = len(micro_batches)
    for ids, targets in micro_batches:
        model.zero_grad()
        (model(ids, targets) / K).backward()
    return 0.0


def accumulate_divide_twice(model, micro_batches):
    model.zero_grad()
    K = len(micro_batches)
    for ids, targets in micro_batches:
        (model(ids, targets) / K / K).backward()
    return 0.0


def accumulate_sum_of_losses(model, micro_batches):
    model.zero_grad()
    K = len(micro_batches)
    total = 0.0
    for ids, targets in micro_batches:
        loss = model(ids, targets)
        (loss / K).backward()
        total += loss.item()
    return total


def accumulate_one_graph(model, micro_batches):
    """Right gradients, but one graph over all K micro-batches and one backward."""
    model.zero_grad()
    K = len(micro_batches)
    total = None
    for ids, targets in micro_batches:
        loss = model(ids, targets) / K
        total = loss if total is None else total + loss
    total.backward()
    return total.item()


def test_08_1_one_graph_over_all_micro_batches_fails_on_the_peak():
    message = fails_with(lesson08.check_accumulate, accumulate_one_graph, "activation peak")
    assert "3.0 times" in message and "has to be gone before the next forward" in message


def test_08_1_passes_the_accumulation_loop(capsys):
    lesson08.check_accumulate(accumulate_right)
    assert "Exercise 08.1 (accumulate) passed." in capsys.readouterr().out


def test_08_1_stub_says_not_done():
    fails_with(lesson08.check_accumulate, stub, "Exercise 08.1 (accumulate): not done yet")


@pytest.mark.parametrize("answer, phrase", [
    (accumulate_without_k, "the missing /K"),
    (accumulate_without_zero, "stale gradients"),
    (accumulate_zero_inside, "last micro-batch only"),
    (accumulate_divide_twice, "divided by K twice"),
    (accumulate_sum_of_losses, "returned the sum"),
])
def test_08_1_names_the_typical_mistakes(answer, phrase):
    message = fails_with(lesson08.check_accumulate, answer, phrase)
    assert_no_accumulation_recipe(message)


RECIPE = ("divide its loss by K and call backward", "Zero once, before the loop",
          "backpropagate loss / K", "Call zero_grad()", "Call backward on each",
          "zero once; for each micro-batch")


def assert_no_accumulation_recipe(text):
    for recipe in RECIPE:
        assert recipe not in text, text


def accumulate_first_micro_batch_twice(model, micro_batches):
    """Runs the first micro-batch twice and skips the last: matches no named slip."""
    model.zero_grad()
    K = len(micro_batches)
    total = 0.0
    for ids, targets in [micro_batches[0]] + list(micro_batches[:-1]):
        loss = model(ids, targets)
        (loss / K).backward()
        total += loss.item()
    return total / K


def accumulate_divided_by_three(model, micro_batches):
    """Right for the story's K=3 only: the count is written as a constant."""
    model.zero_grad()
    total = 0.0
    for ids, targets in micro_batches:
        loss = model(ids, targets)
        (loss / 3).backward()
        total += loss.item()
    return total / 3


def test_08_1_a_wrong_loop_that_is_no_known_slip_gets_the_neutral_message():
    message = fails_with(lesson08.check_accumulate, accumulate_first_micro_batch_twice,
                         "the gradients differ from the full-batch gradient: the gradient of")
    assert "Hint" not in message and "furthest off" in message
    assert_no_accumulation_recipe(message)


def test_08_1_is_checked_on_other_splits_than_the_storys():
    # a loop right at K=3 only is caught at K=2, and told by how much
    fails_with(lesson08.check_accumulate, accumulate_divided_by_three, "K=2 micro-batches")


def test_08_1_stub_docstring_states_the_contract_not_the_recipe():
    source = (Path(__file__).resolve().parents[1] / "course" / "source" /
              "08_accumulation_and_checkpointing.py").read_text()
    stub = source[source.index("def accumulate(model, micro_batches)"):]
    docstring = stub[:stub.index("### BEGIN SOLUTION")]
    for recipe in ("Zero once", "backward loss/K", "loss / K"):
        assert recipe not in docstring, docstring
    assert "the gradient of the mean loss" in docstring


# ================================================================ 08.2
def replay_right(fn, saved_input, grad_output):
    x = Tensor(saved_input, requires_grad=True)
    with engine.enable_grad():
        out = fn(x)
    out.backward(grad_output)
    return x.grad


def replay_without_enable_grad(fn, saved_input, grad_output):
    x = Tensor(saved_input, requires_grad=True)
    out = fn(x)
    out.backward(grad_output)
    return x.grad


def replay_seeded_with_ones(fn, saved_input, grad_output):
    x = Tensor(saved_input, requires_grad=True)
    with engine.enable_grad():
        fn(x).sum().backward()
    return x.grad


def replay_twice(fn, saved_input, grad_output):
    x = Tensor(saved_input, requires_grad=True)
    with engine.enable_grad():
        fn(x).backward(grad_output)
        x.zero_grad()
        fn(x).backward(grad_output)
    return x.grad


def replay_no_input_grad(fn, saved_input, grad_output):
    x = Tensor(saved_input)
    with engine.enable_grad():
        fn(x).backward(grad_output)
    return x.grad


def replay_detached_under_enable_grad(fn, saved_input, grad_output):
    x = Tensor(saved_input, requires_grad=True)
    with engine.enable_grad():
        out = Tensor(fn(x).data)          # the graph is cut here
    out.backward(grad_output)
    return x.grad


def test_08_2_a_learner_who_used_enable_grad_is_not_told_to_use_it():
    message = fails_with(lesson08.check_checkpointed_backward,
                         replay_detached_under_enable_grad, "recording on (good)")
    assert "inside `with engine.enable_grad()" not in message


def replay_sum_outside_enable_grad(fn, saved_input, grad_output):
    x = Tensor(saved_input, requires_grad=True)
    with engine.enable_grad():
        out = fn(x)
    out.sum().backward()                  # the sum ran with recording off
    return x.grad


def test_08_2_a_sum_outside_enable_grad_is_told_to_backpropagate_grad_output():
    message = fails_with(lesson08.check_checkpointed_backward,
                         replay_sum_outside_enable_grad, "start at fn's own output")
    assert "after the `with engine.enable_grad():` block" in message
    assert "was the output detached" not in message


def replay_passthrough(fn, saved_input, grad_output):
    return grad_output


def replay_halved(fn, saved_input, grad_output):
    return replay_right(fn, saved_input, grad_output / 2)


def test_08_2_hints_never_print_the_recipe():
    for answer in (replay_without_enable_grad, replay_seeded_with_ones, replay_no_input_grad,
                   replay_sum_outside_enable_grad, replay_detached_under_enable_grad,
                   replay_halved):
        message = fails_with(lesson08.check_checkpointed_backward, answer, "Exercise 08.2")
        for recipe in ("out.backward(grad_output)", "requires_grad=True", "Recompute fn on",
                       "return the input's .grad"):
            assert recipe not in message, message
    assert "none of the usual slips" in fails_with(lesson08.check_checkpointed_backward,
                                                   replay_halved, "Exercise 08.2")


def test_08_2_stub_docstring_states_the_contract_not_the_recipe():
    source = (Path(__file__).resolve().parents[1] / "course" / "source" /
              "08_accumulation_and_checkpointing.py").read_text()
    stub = source[source.index("def checkpointed_backward"):]
    docstring = stub[:stub.index("### BEGIN SOLUTION")]
    for recipe in ("Recompute", "recording on", "backpropagate grad_output"):
        assert recipe not in docstring, docstring


def test_08_2_passes_a_replay(capsys):
    lesson08.check_checkpointed_backward(replay_right)
    assert "Exercise 08.2 (checkpointed_backward) passed." in capsys.readouterr().out


def test_08_2_stub_says_not_done():
    fails_with(lesson08.check_checkpointed_backward, stub,
               "Exercise 08.2 (checkpointed_backward): not done yet")


@pytest.mark.parametrize("answer, phrase", [
    (replay_without_enable_grad, "enable_grad"),
    (replay_seeded_with_ones, "gradient of ones"),
    (replay_twice, "twice"),
    (replay_no_input_grad, "returned None"),
    (replay_passthrough, "grad_output itself"),
])
def test_08_2_names_the_typical_mistakes(answer, phrase):
    fails_with(lesson08.check_checkpointed_backward, answer, phrase)


def replay_twice_keeping_the_input_gradient(fn, saved_input, grad_output):
    x = Tensor(saved_input, requires_grad=True)
    with engine.enable_grad():
        fn(x).backward(grad_output)
        fn(x).backward(grad_output)
    return x.grad


def replay_negated(fn, saved_input, grad_output):
    return replay_right(fn, saved_input, -grad_output)


def test_08_2_compares_over_the_story_and_generated_segments():
    cases = lesson08._segment_cases()
    forms = [case.args[0] for case in cases]
    assert cases[0].label.startswith("on the story's segment") and len(cases) >= 6
    assert "gelu(x) * x" in forms and "x @ w" in forms          # no parameters; one op
    assert len(set(forms)) == len(lesson08._SEGMENT_FORMS)
    # the reference is one plain backward, and every segment gives its parameters gradients
    for case in cases:
        x_grad, params = lesson08._segment_gradients(*case.args)
        assert x_grad.shape == case.args[2:4]
        assert all(g is not None and np.any(g) for _, g in params)
    # cases are drawn from fixed seeds: the same segments, numbers and messages every run
    again = lesson08._segment_cases()
    assert [c.args for c in again] == [c.args for c in cases]
    first = lesson08._segment_gradients(*cases[3].args)
    assert lesson08._same_gradients(lesson08._segment_gradients(*cases[3].args), first)


@pytest.mark.parametrize("answer, slip", [
    (replay_seeded_with_ones, 0), (replay_passthrough, 1), (replay_twice, 2),
    (replay_twice_keeping_the_input_gradient, 3),
])
def test_08_2_each_named_slip_is_the_wrong_replay_it_names(answer, slip):
    """A slip's reproduction gives exactly what a learner's replay making that slip gives,
    on every segment, and the check names it with that slip's hint."""
    slips = lesson08._replay_slips()
    for case in lesson08._segment_cases():
        got = lesson08._learner_replay(answer, case)
        assert lesson08._same_gradients(got, slips[slip].reproduce(*case.args)), case.label
    message = fails_with(lesson08.check_checkpointed_backward, answer, "Hint: ")
    assert slips[slip].says(None, None, None) in message


@pytest.mark.parametrize("answer", [replay_halved, replay_negated])
def test_08_2_a_wrong_replay_that_is_no_slip_is_told_where_it_differs(answer):
    message = fails_with(lesson08.check_checkpointed_backward, answer,
                         "on the story's segment fn(x) = tanh(gelu(x @ w) @ v) + x")
    assert "the input gradient is off: entry (" in message and "entries differ" in message
    assert "where the plain backward has" in message and "(off by " in message
    assert "none of the usual slips" in message
    for hint in lesson08._replay_slips():
        assert hint.says(None, None, None) not in message


# ================================================================ 08.3
def peak_right(n_blocks, k, a, b):
    starts = range(0, n_blocks, k)
    return max((j + 1) * a + min(k, n_blocks - s) * b for j, s in enumerate(starts))


def peak_usual_estimate(n_blocks, k, a, b):
    return -(-n_blocks // k) * a + k * b


def peak_boundaries_only(n_blocks, k, a, b):
    return -(-n_blocks // k) * a


def peak_float_segments(n_blocks, k, a, b):
    return n_blocks / k * a + k * b


def test_08_3_passes_the_exact_peak(capsys):
    lesson08.check_checkpoint_peak(peak_right)
    assert "Exercise 08.3 (checkpoint_peak) passed." in capsys.readouterr().out


def test_08_3_stub_says_not_done():
    fails_with(lesson08.check_checkpoint_peak, stub, "Exercise 08.3 (checkpoint_peak): not done")


def peak_without_own_boundary(n_blocks, k, a, b):
    return max(j * a + min(k, n_blocks - s) * b for j, s in enumerate(range(0, n_blocks, k)))


def peak_by_walking_the_backward(n_blocks, k, a, b):
    """The same peak, found by freeing boundaries as a backward would, as a float."""
    starts = list(range(0, n_blocks, k))
    peak = 0.0
    for j in reversed(range(len(starts))):
        insides = (min(n_blocks, starts[j] + k) - starts[j]) * b
        peak = max(peak, float(a * (j + 1) + insides))
    return peak


def test_08_3_passes_a_peak_written_differently(capsys):
    lesson08.check_checkpoint_peak(peak_by_walking_the_backward)
    assert "Exercise 08.3 (checkpoint_peak) passed." in capsys.readouterr().out


def peak_extra_segment(n_blocks, k, a, b):
    """The walk over L // k + 1 segments: right whenever k does not divide L."""
    n = n_blocks // k + 1
    sizes = [max(0, min(k, n_blocks - j * k)) for j in range(n)]
    return max((j + 1) * a + size * b for j, size in enumerate(sizes))


def peak_floor_segments(n_blocks, k, a, b):
    return (n_blocks // k) * a + k * b


def peak_no_checkpointing(n_blocks, k, a, b):
    return n_blocks * b


@pytest.mark.parametrize("answer, phrase", [
    (peak_usual_estimate, "the usual estimate"),
    (peak_boundaries_only, "boundaries only"),
    (peak_float_segments, "a whole number rounded up"),
    (peak_floor_segments, "a whole number rounded up"),
    (peak_no_checkpointing, "the peak without checkpointing"),
    (peak_without_own_boundary, "left out the boundary that starts the segment"),
    (peak_extra_segment, "L // k + 1"),
])
def test_08_3_names_the_typical_mistakes(answer, phrase):
    message = fails_with(lesson08.check_checkpoint_peak, answer, phrase)
    assert "(j+1)*a" not in message and "max over segments" not in message


def test_08_3_each_slip_is_named_by_its_reproduction():
    assert_each_slip_named(lesson08.check_checkpoint_peak, lesson08._peak_cases(),
                           lesson08._peak_slips(), lesson08.exact_checkpoint_peak)


def test_08_3_one_segment_too_many_is_rejected_where_k_divides_l():
    # L // k + 1 segments agree with the tape whenever k does not divide L, so only a case
    # where it does tells them apart; checkpoint_peak(4, 2, 1000, 10) is one
    assert peak_extra_segment(4, 2, 1000, 10) != peak_right(4, 2, 1000, 10)
    message = fails_with(lesson08.check_checkpoint_peak, peak_extra_segment, "L // k + 1")
    assert "checkpoint_peak(4, 2, 1000, 10)" in message


def test_08_3_checks_every_l_and_k_up_to_8():
    grid = {case.args[:2] for case in lesson08._peak_cases()}
    assert {(L, k) for L in range(1, 9) for k in range(1, 9)} <= grid


def peak_counting_the_output_too(n_blocks, k, a, b):
    """The walk that also keeps the stack's output as a boundary: matches no named slip."""
    starts = range(0, n_blocks, k)
    return max((j + 2) * a + min(k, n_blocks - s) * b for j, s in enumerate(starts))


def peak_sizes_swapped(n_blocks, k, a, b):
    """The right walk with the two sizes read in the wrong order: matches no named slip."""
    return peak_right(n_blocks, k, b, a)


@pytest.mark.parametrize("answer", [peak_counting_the_output_too, peak_sizes_swapped])
def test_08_3_a_wrong_peak_that_is_no_known_slip_gets_the_neutral_hint(answer):
    message = fails_with(lesson08.check_checkpoint_peak, answer, "the tape measures")
    assert "you have" in message and "bytes off" in message
    for cause in ("usual estimate", "boundaries only", "rounded up", "without checkpointing",
                  "left out", "L // k + 1"):
        assert cause not in message


def test_08_3_formula_is_the_measured_peak():
    # the check's claim: the exact formula equals what engine.memory measures
    for L, k in [(4, 1), (5, 2), (6, 4), (3, 3)]:
        measured, a, b = lesson08._measured_stack_peak(L, k)
        assert measured == peak_right(L, k, a, b)


# ================================================================ 09.1
def bf16_right(x):
    bits = x.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    quiet_nan = (bits | np.uint32(0x00400000)) & np.uint32(0xFFFF0000)
    return np.where(np.isnan(x), quiet_nan, rounded).astype(np.uint32).view(np.float32)


def bf16_truncate(x):
    return (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


def bf16_half_up(x):
    bits = x.view(np.uint32)
    rounded = (bits + np.uint32(0x8000)) & np.uint32(0xFFFF0000)
    quiet_nan = (bits | np.uint32(0x00400000)) & np.uint32(0xFFFF0000)
    return np.where(np.isnan(x), quiet_nan, rounded).astype(np.uint32).view(np.float32)


def bf16_nan_to_inf(x):
    bits = x.view(np.uint32)
    return ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))
            & np.uint32(0xFFFF0000)).view(np.float32)


def bf16_float64(x):
    return bf16_right(x).astype(np.float64)


def test_09_1_passes_round_to_nearest_even(capsys):
    lesson09.check_to_bf16(bf16_right)
    assert "Exercise 09.1 (to_bf16) passed." in capsys.readouterr().out


def test_09_1_stub_says_not_done():
    fails_with(lesson09.check_to_bf16, stub, "Exercise 09.1 (to_bf16): not done yet")


@pytest.mark.parametrize("answer, phrase", [
    (bf16_truncate, "you truncate"),
    (bf16_half_up, "even neighbour"),
    (bf16_nan_to_inf, "Keep NaN a NaN"),
    (bf16_float64, "float32"),
])
def test_09_1_names_the_typical_mistakes(answer, phrase):
    message = fails_with(lesson09.check_to_bf16, answer, phrase)
    assert "0x7FFF" not in message and "& 0xFFFF0000" not in message


def bf16_round_half_down(x):
    """Ties go down, every other value to the nearest: matches no named slip."""
    bits = x.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF)) & np.uint32(0xFFFF0000)
    quiet_nan = (bits | np.uint32(0x00400000)) & np.uint32(0xFFFF0000)
    return np.where(np.isnan(x), quiet_nan, rounded).astype(np.uint32).view(np.float32)


def test_09_1_a_rounding_that_is_no_known_slip_gets_the_neutral_message():
    message = fails_with(lesson09.check_to_bf16, bf16_round_half_down, "the nearest bf16 is")
    assert "values differ" in message and "Hint" not in message and "0x7FFF" not in message


# ================================================================ 09.3
def scale_right(scale, good_steps, finite, growth_interval):
    if not finite:
        return scale / 2, 0, False
    good_steps += 1
    if good_steps >= growth_interval:
        return scale * 2, 0, True
    return scale, good_steps, True


def scale_applies_overflow(scale, good_steps, finite, growth_interval):
    new_scale, good, _ = scale_right(scale, good_steps, finite, growth_interval)
    return new_scale, good, True


def scale_grows_on_overflow(scale, good_steps, finite, growth_interval):
    if not finite:
        return scale * 2, 0, False
    return scale_right(scale, good_steps, finite, growth_interval)


def scale_keeps_count(scale, good_steps, finite, growth_interval):
    if not finite:
        return scale / 2, good_steps, False
    return scale_right(scale, good_steps, finite, growth_interval)


def scale_off_by_one(scale, good_steps, finite, growth_interval):
    if not finite:
        return scale / 2, 0, False
    if good_steps + 1 > growth_interval:
        return scale * 2, 0, True
    return scale, good_steps + 1, True


def scale_no_reset_after_growth(scale, good_steps, finite, growth_interval):
    if not finite:
        return scale / 2, 0, False
    good_steps += 1
    if good_steps >= growth_interval:
        return scale * 2, good_steps, True
    return scale, good_steps, True


def scale_grows_early(scale, good_steps, finite, growth_interval):
    if not finite:
        return scale / 2, 0, False
    if good_steps + 2 >= growth_interval:          # one step before the window is full
        return scale * 2, 0, True
    return scale, good_steps + 1, True


def scale_counts_nothing(scale, good_steps, finite, growth_interval):
    new_scale, good, apply = scale_right(scale, good_steps, finite, growth_interval)
    return new_scale, (good_steps if good else 0), apply


def scale_grows_fourfold(scale, good_steps, finite, growth_interval):
    new_scale, good, apply = scale_right(scale, good_steps, finite, growth_interval)
    return (4 * scale if new_scale > scale else new_scale), good, apply


def scale_backs_off_tenfold(scale, good_steps, finite, growth_interval):
    new_scale, good, apply = scale_right(scale, good_steps, finite, growth_interval)
    return (scale / 10 if not finite else new_scale), good, apply


def test_09_3_passes_the_scaler_rule(capsys):
    lesson09.check_update_scale(scale_right)
    assert "Exercise 09.3 (update_scale) passed." in capsys.readouterr().out


def test_09_3_stub_says_not_done():
    fails_with(lesson09.check_update_scale, stub, "Exercise 09.3 (update_scale): not done yet")


@pytest.mark.parametrize("answer, phrase", [
    (scale_applies_overflow, "must be skipped"),
    (scale_grows_on_overflow, "halve it"),
    (scale_keeps_count, "starts again from 0"),
    (scale_off_by_one, "reaches growth_interval"),
    (scale_no_reset_after_growth, "restart the count"),
    (scale_grows_early, "only 2 good steps so far"),
    (scale_counts_nothing, "adds exactly one good step"),
    (scale_grows_fourfold, "changed by a factor of 4"),
    (scale_backs_off_tenfold, "changed by a factor of 0.1"),
])
def test_09_3_names_the_typical_mistakes(answer, phrase):
    message = fails_with(lesson09.check_update_scale, answer, phrase)
    assert "double the scale when the count reaches" not in message


def scale_floored_at_one(scale, good_steps, finite, growth_interval):
    """Backs off no further than a scale of 1, a floor the lesson's scaler does not have."""
    new_scale, good, apply = scale_right(scale, good_steps, finite, growth_interval)
    return max(new_scale, 1.0), good, apply


def test_09_3_is_checked_beyond_the_storys_scales():
    # the story's scales are all 8 or more; the generated ones go below 1
    fails_with(lesson09.check_update_scale, scale_floored_at_one, "update_scale(scale=0.25")
    assert min(case[0] for case in lesson09._scale_cases()) < 1


def test_09_3_rule_matches_the_engine_scaler():
    from engine.precision import DynamicLossScaler
    s = DynamicLossScaler(init_scale=64.0, growth_interval=3)
    scale, good = 64.0, 0
    for finite in [True, True, True, False, True, True, True, True, False, False, True]:
        applied = s.update(finite)
        scale, good, apply = scale_right(scale, good, finite, 3)
        assert (s.scale, s.good_steps, applied) == (scale, good, apply)


# ================================================================ 09.2
def master_right(master, grad, lr):
    new_master = master - np.float32(lr) * grad
    return new_master, bf16_right(new_master)


def master_in_bf16(master, grad, lr):
    w = bf16_right(bf16_right(master) - np.float32(lr) * grad)
    return w, w


def master_forward_unrounded(master, grad, lr):
    new_master = master - np.float32(lr) * grad
    return new_master, new_master


def master_ascent(master, grad, lr):
    new_master = master + np.float32(lr) * grad
    return new_master, bf16_right(new_master)


def master_stale_weights(master, grad, lr):
    return master - np.float32(lr) * grad, bf16_right(master)


def master_truncated_weights(master, grad, lr):
    new_master = master - np.float32(lr) * grad
    return new_master, bf16_truncate(new_master)


def test_09_2_passes_a_master_weight_step(capsys):
    lesson09.check_master_weight_step(master_right)
    assert "Exercise 09.2 (master_weight_step) passed." in capsys.readouterr().out


def test_09_2_stub_says_not_done():
    fails_with(lesson09.check_master_weight_step, stub,
               "Exercise 09.2 (master_weight_step): not done yet")


def master_bf16_gradient(master, grad, lr):
    new_master = master - np.float32(lr) * bf16_right(grad)
    return new_master, bf16_right(new_master)


def master_bf16_learning_rate(master, grad, lr):
    new_master = master - bf16_right(np.array([lr], np.float32))[0] * grad
    return new_master, bf16_right(new_master)


def master_via_float64(master, grad, lr):
    new_master = (master.astype(np.float64) - float(lr) * grad.astype(np.float64))
    new_master = new_master.astype(np.float32)
    return new_master, bf16_right(new_master)


def test_09_2_passes_float64_arithmetic_cast_back_once(capsys):
    lesson09.check_master_weight_step(master_via_float64)
    assert "Exercise 09.2 (master_weight_step) passed." in capsys.readouterr().out


@pytest.mark.parametrize("answer, phrase", [
    (master_in_bf16, "swallowed"),
    (master_forward_unrounded, "new master weights unrounded"),
    (master_ascent, "subtracts"),
    (master_stale_weights, "old master"),
    (master_bf16_gradient, "rounded the gradient to bf16"),
    (master_bf16_learning_rate, "rounded the learning rate to bf16"),
    (master_truncated_weights, "truncated"),
])
def test_09_2_names_the_typical_mistakes(answer, phrase):
    message = fails_with(lesson09.check_master_weight_step, answer, phrase)
    assert "master - lr * grad" not in message and "round_to_bf16(new_master)" not in message


def test_09_2_each_slip_is_named_by_its_reproduction():
    cases = lesson09._master_cases()
    for index, slips in ((0, lesson09.MASTER_SLIPS), (1, lesson09.WEIGHT_SLIPS)):
        for slip in slips:
            def answer(master, grad, lr, slip=slip):
                new_master = master - np.float32(lr) * grad
                pair = [new_master, bf16_right(new_master)]
                pair[index] = slip.reproduce(master, grad, lr)
                return tuple(pair)
            fails_with(lesson09.check_master_weight_step, answer, slip.hint)
    assert len(cases) == 5


def master_weights_rounded_twice(master, grad, lr):
    new_master = master - np.float32(lr) * grad
    return new_master, bf16_right(bf16_right(new_master) + np.float32(2 ** -9))


def master_half_step(master, grad, lr):
    new_master = master - np.float32(lr) * grad / np.float32(2)
    return new_master, bf16_right(new_master)


@pytest.mark.parametrize("answer", [master_weights_rounded_twice, master_half_step])
def test_09_2_a_wrong_step_that_is_no_known_slip_gets_the_neutral_message(answer):
    message = fails_with(lesson09.check_master_weight_step, answer, "where the reference has")
    assert "Hint" not in message and "round_to_bf16(new_master)" not in message


# ======================================= 08.1 through the fused model's view (lesson 13)
from coursework import pieces, slots                                    # noqa: E402
from engine import precision as P                                       # noqa: E402


def accumulate_item_first(model, micro_batches):
    """Right, written differently: read the loss first, scale by a product."""
    model.zero_grad()
    losses = []
    for ids, targets in micro_batches:
        loss = model(ids, targets)
        losses.append(loss.item())
        (loss * (1.0 / len(micro_batches))).backward()
    return sum(losses) / len(losses)


def accumulate_tensor_total(model, micro_batches):
    """Right on the tape, but adds up the loss Tensors: the fused view's loss has no +."""
    model.zero_grad()
    K = len(micro_batches)
    total = 0.0
    for ids, targets in micro_batches:
        loss = model(ids, targets)
        (loss / K).backward()
        total = total + loss
    return total.item() / K


def accumulate_reads_data(model, micro_batches):
    """Right on the tape, but reads loss.data, which the fused view does not have."""
    model.zero_grad()
    K = len(micro_batches)
    total = 0.0
    for ids, targets in micro_batches:
        loss = model(ids, targets)
        (loss / K).backward()
        total += float(loss.data)
    return total / K


def accumulate_divides_grads(model, micro_batches):
    """Right on the tape, but divides every .grad by K after the loop: the fused view has
    no parameters() (the exercise's contract says so)."""
    model.zero_grad()
    losses = []
    for ids, targets in micro_batches:
        loss = model(ids, targets)
        loss.backward()
        losses.append(loss.item())
    for p in model.parameters().values():
        p.grad /= len(micro_batches)
    return sum(losses) / len(losses)


def test_08_1_a_loop_that_divides_the_grads_is_told_the_fused_view_has_none():
    message = fails_with(lesson08.check_accumulate, accumulate_divides_grads,
                         "through the fused model's view")
    assert "no .grad to divide after the loop" in message
    assert "divide each loss by K before its backward" in message


def test_08_1_the_exercise_states_the_view_contract():
    from notebook_tools import ROOT
    source = (ROOT / "course" / "source" / "08_accumulation_and_checkpointing.py").read_text()
    exercise = source[source.index("## Exercise 08.1"):source.index("def accumulate(")]
    for offered in ("`model(ids, targets)`", "`model.zero_grad()`", "`.backward()`",
                    "`.item()`", "no `model.parameters()`"):
        assert offered in exercise, offered


def test_08_1_passes_a_loop_written_differently_also_through_the_fused_view(capsys):
    lesson08.check_accumulate(accumulate_item_first)
    assert "Exercise 08.1 (accumulate) passed." in capsys.readouterr().out
    slots.check_accumulate_through_view(accumulate_item_first)


@pytest.mark.parametrize("answer, phrase", [
    (accumulate_tensor_total, "unsupported operand"),
    (accumulate_reads_data, "has no attribute 'data'"),
])
def test_08_1_refuses_a_loop_the_fused_view_cannot_run(answer, phrase):
    message = fails_with(lesson08.check_accumulate, answer, "through the fused model's view")
    assert phrase in message and "add up loss.item() (a float)" in message


@pytest.mark.parametrize("answer, phrase", [
    (accumulate_without_k, "accumulated gradient differs"),
    (accumulate_sum_of_losses, "the mean loss over 4 micro-batches"),
])
def test_08_1_view_contract_compares_with_the_engine_loop(answer, phrase):
    with pytest.raises(slots.SlotError, match=phrase):
        slots.check_accumulate_through_view(answer)


def test_08_1_view_on_the_tape_gives_the_tape_gradient():
    # the thin view adds nothing: the engine's loop through it is the tape's own accumulation
    cfg = slots._small_cfg()
    rng = np.random.default_rng(0)
    ids, targets = rng.integers(0, 13, (4, 8)), rng.integers(0, 13, (4, 8))
    micro = [(ids[i:i + 2], targets[i:i + 2]) for i in (0, 2)]
    params = engine.gpt_config.init_params(cfg, seed=0, dtype=np.float64)
    through = engine.nn.GPT(cfg, params)
    loss = accumulate_right(slots.FusedAccumulationModel(slots.TapeAsFused(through)), micro)
    plain = engine.nn.GPT(cfg, params)
    want = accumulate_right(plain, micro)
    assert loss == pytest.approx(want, rel=1e-12)
    assert all(np.allclose(through.grads()[n], g, rtol=1e-12) for n, g in plain.grads().items())


# ============================================ slot contracts of 08.2, 09.1-09.3
def replay_returns_tensor(fn, saved_input, grad_output):
    x = Tensor(saved_input, requires_grad=True)
    with engine.enable_grad():
        fn(x).backward(grad_output)
    return Tensor(x.grad)


def replay_edits_saved_input(fn, saved_input, grad_output):
    grad = replay_right(fn, saved_input, grad_output)
    saved_input *= 0.0
    return grad


@pytest.mark.parametrize("piece, fn", [
    ("checkpoint_replay", replay_right), ("checkpoint_replay", engine.recompute.replay),
    ("to_bf16", bf16_right), ("to_bf16", P.round_to_bf16),
    ("master_weight_step", master_right), ("update_scale", scale_right),
])
def test_slot_contracts_pass_right_pieces_and_the_engine(piece, fn):
    slots.check(piece, fn)


def bf16_in_place(x):
    """Right values, but rounds the caller's array in place (the engine still needs it)."""
    nan = np.isnan(x)
    bits = x.view(np.uint32)
    quiet = (bits | np.uint32(0x00400000)) & np.uint32(0xFFFF0000)
    bits += np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    bits &= np.uint32(0xFFFF0000)
    bits[nan] = quiet[nan]
    return x


def bf16_through_bytes(x):
    """Right on 1-D arrays, but tobytes() flattens a matrix (and reorders a transposed one)."""
    return bf16_right(np.frombuffer(x.tobytes(), dtype=np.float32).copy())


def master_scales_grad_in_place(master, grad, lr):
    """Right values, but scales the caller's gradient buffer in place."""
    grad *= np.float32(lr)
    new_master = master - grad
    return new_master, bf16_right(new_master)


def master_in_float64(master, grad, lr):
    new_master = master.astype(np.float64) - lr * grad
    return new_master, bf16_right(new_master.astype(np.float32))


@pytest.mark.parametrize("piece, fn, phrase", [
    ("checkpoint_replay", replay_without_enable_grad, "raised RuntimeError"),
    ("checkpoint_replay", replay_returns_tensor, "returned Tensor"),
    ("checkpoint_replay", replay_edits_saved_input, "changed the saved input"),
    ("checkpoint_replay", replay_twice, "differs from engine.recompute.replay"),
    ("checkpoint_replay", replay_seeded_with_ones, "differs from engine.recompute.replay"),
    ("to_bf16", bf16_in_place, "changed the float32 array of shape (64, 112)"),
    ("to_bf16", bf16_through_bytes, "of shape (7168,)"),
    ("to_bf16", bf16_truncate, "differ from engine.precision.round_to_bf16"),
    ("to_bf16", bf16_float64, "returned float64"),
    ("master_weight_step", master_scales_grad_in_place, "changed the gradient"),
    ("master_weight_step", master_in_float64, "float64"),
    ("master_weight_step", master_in_bf16, "differ from engine.precision.MixedPrecisionWeights"),
    ("master_weight_step", master_stale_weights, "not the bf16 rounding of the new master"),
    ("update_scale", scale_off_by_one, "DynamicLossScaler gives"),
    ("update_scale", scale_keeps_count, "DynamicLossScaler gives"),
    ("update_scale", lambda *a: None, "not (new_scale"),
])
def test_slot_contracts_refuse_broken_pieces(piece, fn, phrase):
    with pytest.raises(slots.SlotError) as info:
        slots.check(piece, fn)
    assert phrase in str(info.value), str(info.value)


@pytest.mark.parametrize("check, answer, phrase", [
    (lesson09.check_to_bf16, bf16_in_place, "changed the float32 array"),
    (lesson09.check_master_weight_step, master_scales_grad_in_place, "changed the gradient"),
])
def test_a_piece_right_in_the_notebook_but_wrong_in_its_slot_is_not_saved(check, answer,
                                                                          phrase):
    message = fails_with(check, answer, "would not work where the engine runs it")
    assert phrase in message


# ============================================== the lessons run yours or the engine's
@pytest.mark.parametrize("piece, exercise, engine_fn, check, answer", [
    ("checkpoint_replay", "08.2", engine.recompute.replay, lesson08.check_checkpointed_backward,
     replay_right),
    ("to_bf16", "09.1", P.round_to_bf16, lesson09.check_to_bf16, bf16_right),
])
def test_piece_or_engine_runs_yours_or_says_why_the_engines_runs(
        piece, exercise, engine_fn, check, answer, tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path))
    fn, owner = pieces.piece_or_engine(piece, exercise, engine_fn)
    assert fn is engine_fn and owner == "the engine's, because not written yet"
    check(answer)                                            # saves the piece
    fn, owner = pieces.piece_or_engine(piece, exercise, engine_fn)
    assert fn is not engine_fn and owner == f"yours ({exercise})"
    # a saved file broken afterwards is refused by the contract, and the engine's runs
    source = (tmp_path / f"{piece}.py").read_text()
    broken = source.replace("return x.grad", "return x.grad * 2").replace(
        "return np.where(np.isnan(x), quiet_nan, rounded)",
        "return np.where(np.isnan(x), quiet_nan, bits & np.uint32(0xFFFF0000))")
    assert broken != source
    (tmp_path / f"{piece}.py").write_text(broken)
    fn, owner = pieces.piece_or_engine(piece, exercise, engine_fn)
    assert fn is engine_fn and owner.startswith("the engine's, because yours was skipped: ")


def test_use_bf16_rounding_routes_every_bf16_rounding_and_restores():
    x = np.array([1.0001, 3.3e38, 1e-3], dtype=np.float32)
    calls = []

    def counted(a):
        calls.append(a.shape)
        return bf16_right(a)
    with P.use_bf16_rounding(counted):
        assert np.array_equal(P.cast(x, "bf16"), bf16_right(x))
        P.matmul_mixed(x[None, :], x[:, None], "bf16")
        with P.use_bf16_rounding(None):                 # the built-in inside
            P.cast(x, "bf16")
    assert calls == [(3,), (1, 3), (3, 1), (1, 1)]
    P.cast(x, "bf16")
    assert len(calls) == 4                              # restored on exit
    with P.use_bf16_rounding(lambda a: P.round_to_bf16(a) * 0):   # calls the engine's
        assert np.array_equal(P.cast(x, "bf16"), np.zeros(3, np.float32))


def test_lesson_outputs_do_not_depend_on_whose_piece_ran():
    # lesson 09's master-weight runs with your rounding equal the engine's bit for bit ...
    problem = P.make_classification()
    policy = P.POLICIES["bf16 weights only"]
    want = P.train_classifier(policy, problem, steps=40, lr=1.0)
    with P.use_bf16_rounding(bf16_right):
        got = P.train_classifier(policy, problem, steps=40, lr=1.0)
    assert got.losses == want.losses and got.update_kept == want.update_kept
    # ... and lesson 08's checkpointed GPT with your replay measures the engine's peak
    from engine import memory, nn
    from engine.gpt_config import GPTConfig, init_params
    cfg = GPTConfig(vocab_size=16, block_size=8, n_layer=4, n_head=2, n_embd=16)
    params = init_params(cfg, seed=2, dtype=np.float64)
    ids = np.random.default_rng(2).integers(0, 16, (2, 8))
    seen = {}
    for who, fn in (("engine", engine.recompute.replay), ("yours", replay_right)):
        gpt = nn.GPT(cfg, params)
        with memory.record() as mem:
            with engine.recompute.checkpointed(gpt, "every", replay_fn=fn):
                loss = gpt(ids, ids)
            loss.backward()
        seen[who] = mem.peak_bytes, gpt.grads()
    assert seen["yours"][0] == seen["engine"][0]
    assert all(np.array_equal(seen["yours"][1][n], g) for n, g in seen["engine"][1].items())
