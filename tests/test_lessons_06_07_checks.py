"""The exercise checks of lessons 06-07: right answers (also those written
another way) pass, typical wrong answers fail with the hint that names them."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from coursework import lesson06, lesson07, pieces, slots
from engine import budget as bm
from case_tools import assert_each_slip_named
from check_tools import fails_with
from notebook_tools import cell_errors, cell_stdout, run_judging_unfinished_exercises


@pytest.fixture()
def pieces_folder(tmp_path, monkeypatch):
    folder = tmp_path / "pieces"
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(folder))
    return folder


def _stub(*args):
    raise NotImplementedError()


def _define(tmp_path, source, function):
    """A function defined from a file, as a notebook cell defines it (so it can be saved)."""
    path = tmp_path / f"{function}_cell.py"
    path.write_text(source)
    namespace = {"__name__": "notebook"}
    exec(compile(source, str(path), "exec"), namespace)
    return namespace[function]


# ---------------------------------------------------------------- 06.1
def test_06_1_a_prediction_written_per_buffer_passes(capsys):
    def per_buffer(batch, n_in, n_hidden, n_out, itemsize):
        buffers = {"x (fc1's input)": (batch, n_in), "relu out = fc2's input": (batch, n_hidden)}
        return sum(math.prod(shape) for shape in buffers.values()) * itemsize
    lesson06.check_mlp_saved_bytes(per_buffer)
    assert "06.1 (mlp_saved_bytes) passed" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, words", [
    (lambda b, i, h, o, e: e * b * (i + 2 * h), ("same array",)),
    (lambda b, i, h, o, e: e * (b * (i + h) + i * h + h * o), ("added the weight matrices",)),
    (lambda b, i, h, o, e: b * (i + h), ("number of elements",)),
    (lambda b, i, h, o, e: e * b * h, ("fc1's matmul also keeps its input x",)),
    (lambda b, i, h, o, e: e * b * (i + h + o), ("output is not saved",)),
    (lambda b, i, h, o, e: e * b * (i + 2 * h + o), ("output is not needed",)),
    (_stub, ("06.1", "not done yet")),
])
def test_06_1_typical_wrong_predictions_are_named(wrong, words):
    fails_with(lesson06.check_mlp_saved_bytes, wrong, words=words)


def test_06_1_each_slip_is_named_by_its_reproduction():
    assert_each_slip_named(lesson06.check_mlp_saved_bytes, lesson06._mlp_cases(),
                           lesson06._mlp_slips(), lesson06.measured_mlp_bytes)


@pytest.mark.parametrize("wrong", [
    lambda b, i, h, o, e: e * b * (i + h) + e * h,          # fc1's bias counted as saved
    lambda b, i, h, o, e: e * (b + 1) * (i + h),             # one row too many
])
def test_06_1_a_miscount_that_is_no_known_slip_gets_the_neutral_message(wrong):
    message = fails_with(lesson06.check_mlp_saved_bytes, wrong,
                         words=["the engine measured", "bytes off", "list the ops"])
    for cause in ("twice", "weight matrices", "parameters", "number of elements",
                  "also keeps its input", "not saved", "not needed"):
        assert cause not in message


# ---------------------------------------------------------------- 06.2
BLOCK_SOURCE = """def block_saved_elements(B, T, C, H):
    per_token = 2 * (C + 1) + (C + 3 * C + C) + (C + 4 * C + 4 * C)
    return B * T * per_token + B * H * T ** 2
"""


def test_06_2_passes_and_saves_the_count_as_a_piece(pieces_folder, tmp_path, capsys):
    fn = _define(tmp_path, BLOCK_SOURCE, "block_saved_elements")
    lesson06.check_block_saved_elements(fn)
    assert "06.2 (block_saved_elements) passed" in capsys.readouterr().out
    loaded, why = pieces.piece_for_slot("block_saved_elements")
    assert why is None and loaded(16, 128, 128, 4) == slots.engine_block_saved_elements(
        16, 128, 128, 4)
    count, owner = pieces.block_count()
    assert owner == "yours (06.2)" and count(2, 8, 16, 2) == 16 * 2 * 8 * 16 + 2 * 16 + 2 * 2 * 64


@pytest.mark.parametrize("wrong, words", [
    (lambda B, T, C, H: 16 * B * T * C + 2 * B * T, ("probabilities att",)),
    (lambda B, T, C, H: 16 * B * T * C + B * H * T * T, ("rstd",)),
    (lambda B, T, C, H: 16 * B * T * C + 2 * B * T + B * T * T, ("per head",)),
    (lambda B, T, C, H: 19 * B * T * C + 2 * B * T + B * H * T * T, ("views of the one qkv",)),
    (lambda B, T, C, H: 4 * (16 * B * T * C + 2 * B * T + B * H * T * T), ("bytes (x4)",)),
    (_stub, ("06.2", "not done yet")),
])
def test_06_2_typical_miscounts_are_named(wrong, words, pieces_folder):
    fails_with(lesson06.check_block_saved_elements, wrong, words=words)
    assert not (pieces_folder / "block_saved_elements.py").exists()


def test_06_2_each_slip_is_named_by_its_reproduction(pieces_folder):
    assert_each_slip_named(lesson06.check_block_saved_elements, lesson06._block_cases(),
                           lesson06._block_slips(), lesson06.measured_block_elements)


def test_06_2_a_miscount_that_is_no_known_slip_gets_the_neutral_message(pieces_folder):
    def with_the_mask(B, T, C, H):            # a dropout mask the engine's block does not have
        return 16 * B * T * C + 2 * B * T + B * H * T * T + B * T * C
    message = fails_with(lesson06.check_block_saved_elements, with_the_mask,
                         words=["the engine measured", "elements off", "op by op"])
    assert "residual stream" not in message and "views of the one qkv" not in message


def test_a_count_right_only_on_the_checks_shapes_is_refused_at_save(pieces_folder, tmp_path):
    """The slot's contract also covers lesson 07's shapes: a count that is right on 06.2's
    small shapes but wrong at T=128 passes the measurement, and is refused as a piece."""
    source = ("def block_saved_elements(B, T, C, H):\n"
              "    att = B * H * T * T if T <= 16 else B * T * T\n"
              "    return 16 * B * T * C + 2 * B * T + att\n")
    fn = _define(tmp_path, source, "block_saved_elements")
    fails_with(lesson06.check_block_saved_elements, fn,
               words=("would not work where the engine runs it", "T=128", "keeps"))
    assert not (pieces_folder / "block_saved_elements.py").exists()


def _write_piece(folder, source, function="block_saved_elements"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "block_saved_elements.py").write_text(source)
    (folder / "index.json").write_text(json.dumps(
        {"block_saved_elements": {"function": function, "exercise": "06.2"}}))


@pytest.mark.parametrize("source, says", [
    ("def block_saved_elements(B, T, C, H):\n    return 16 * B * T * C\n",
     "yours was skipped: for B=2, T=8, C=16, H=2 it counts"),
    ("def block_saved_elements(B, T, C, H):\n    return None\n",
     "yours was skipped: returned None"),
    ("def block_saved_elements(B, T, C, H):\n    return K * B * T * C\n",
     "'K' from the notebook"),
    ("def block_saved_elements(B, T, C, H)\n", "yours does not load: SyntaxError"),
])
def test_lesson_07_runs_the_engines_count_and_says_why_for_a_broken_piece(pieces_folder,
                                                                        source, says):
    count, owner = pieces.block_count()
    assert count is slots.engine_block_saved_elements
    assert owner == "the engine's, because not written yet"
    _write_piece(pieces_folder, source)
    count, owner = pieces.block_count()
    assert count is slots.engine_block_saved_elements
    assert owner.startswith("the engine's, because ") and says in owner, owner


def test_the_engines_count_keeps_the_slots_contract_and_equals_the_measurement():
    slots.check("block_saved_elements", slots.engine_block_saved_elements)
    for B, T, C, H in lesson06.BLOCK_SHAPES:
        assert slots.engine_block_saved_elements(B, T, C, H) == \
            lesson06.measure_block_elements(B, T, C, H)


# ---------------------------------------------------------------- 06.3
def fits_by_search(memory, N, d, L, k, e):
    """Written another way: double B while it fits, then bisect."""
    def fits(b):
        return b * N * d * k * L * e <= memory
    lo, hi = 0, 1                      # fits(lo); hi is to be tried
    while fits(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def test_06_3_right_answers_pass(capsys):
    lesson06.check_micro_batch_that_fits(lambda m, N, d, L, k, e: m // (N * d * k * L * e))
    lesson06.check_micro_batch_that_fits(fits_by_search)
    lesson06.check_micro_batch_that_fits(   # a whole float is a number of sequences too
        lambda m, N, d, L, k, e: math.floor(m / (N * d * k * L * e)) * 1.0)
    out = capsys.readouterr().out
    assert "06.3 (micro_batch_that_fits) passed" in out
    assert "7B example fits 37 sequences" in out and "24-layer example 9 in 16 GB" in out


def _one(N, d, L, k, e):
    return N * d * k * L * e


@pytest.mark.parametrize("wrong, words", [
    (lambda m, N, d, L, k, e: m // (N * d * k * e), ("if the stack had one layer", "every layer keeps")),
    (lambda m, N, d, L, k, e: m // (N * d * L * e), ("one tensor of N x d per layer",)),
    (lambda m, N, d, L, k, e: m // (N * d * k * L), ("each element takes",)),
    (lambda m, N, d, L, k, e: m // (_one(N, d, L, k, e) * 8), ("factor of 8", "already bytes")),
    (lambda m, N, d, L, k, e: m * 8 // _one(N, d, L, k, e), ("factor of 8",)),
    (lambda m, N, d, L, k, e: -(-m // _one(N, d, L, k, e)), ("does not fit", "not up")),
    (lambda m, N, d, L, k, e: round(m / _one(N, d, L, k, e)), ("does not fit",
                                                              "not to the nearest")),
    (lambda m, N, d, L, k, e: (m - 1) // _one(N, d, L, k, e), ("fits too", "<, where the memory allows <=")),
    (lambda m, N, d, L, k, e: m / _one(N, d, L, k, e), ("whole number of sequences", "//")),
    (lambda m, N, d, L, k, e: (m // _one(N, d, L, k, e)) or None, ("return None", "0")),
    (lambda m, N, d, L, k, e: 2 * (m // _one(N, d, L, k, e)) + 1, ("sequences more than fit",)),
    (lambda m, N, d, L, k, e: max(1, m // _one(N, d, L, k, e)), ("not even one sequence",
                                                                 "the answer is 0")),
    (lambda m, N, d, L, k, e: 1 << ((m // _one(N, d, L, k, e)).bit_length() - 1)
     if m >= _one(N, d, L, k, e) else 0, ("largest power of two", "of any size")),
    (_stub, ("06.3", "not done yet")),
])
def test_06_3_typical_wrong_designs_are_named(wrong, words):
    fails_with(lesson06.check_micro_batch_that_fits, wrong, words=words)


def test_06_3_each_slip_is_named_by_its_reproduction():
    assert_each_slip_named(lesson06.check_micro_batch_that_fits, lesson06._fit_cases(),
                           lesson06._fit_slips(), lesson06.engine_micro_batch_that_fits)


@pytest.mark.parametrize("wrong", [
    lambda m, N, d, L, k, e: m // (N * d * k * (L + 1) * e),     # one layer too many
    lambda m, N, d, L, k, e: m // _one(N, d, L, k, e) - 1,        # a sequence kept in reserve
    lambda m, N, d, L, k, e: m // (N * d * k * L * e + N * d),    # an extra tensor per sequence
])
def test_06_3_a_wrong_answer_that_is_no_known_slip_gets_the_neutral_hint(wrong):
    message = fails_with(lesson06.check_micro_batch_that_fits, wrong,
                         words=["engine.budget finds B="])
    assert "Hint" not in message and "<=" not in message and "layer" not in message, message


def test_06_3_the_checks_answers_are_engine_budgets_and_include_an_exact_fit_and_none():
    cases = lesson06._fit_cases()
    answers = [lesson06.engine_micro_batch_that_fits(*case.args) for case in cases]
    assert answers[:5] == [37, 9, 24, 5, 0]
    m, N, d, L, k, e = cases[3].args
    cfg = lesson06._rule_config(N, d, L, k, e)
    assert bm.activations(cfg.with_(micro_batch=5)).saved == m      # fills it to the byte
    # the generated stacks: exact fits, remainders, one byte short, and none that fits
    ones = [_one(*case.args[1:]) for case in cases[5:]]
    remainders = [case.args[0] % one for case, one in zip(cases[5:], ones)]
    assert 0 in remainders and any(r == one - 1 for r, one in zip(remainders, ones))
    assert 0 in answers[5:] and max(answers[5:]) > 8
    assert all(a == case.args[0] // _one(*case.args[1:]) for a, case in zip(answers, cases))


# ---------------------------------------------------------------- 07.1
def flops_full(P, L, N, d):
    return 3 * (2 * P + 4 * L * N * d)


def flops_causal_half(P, L, N, d):
    return 3 * (2 * P + 2 * L * N * d)


def test_07_1_full_attention_passes(capsys):
    lesson07.check_training_flops(flops_full)
    out = capsys.readouterr().out
    assert "passed" in out and "causal" not in out


def test_07_1_causal_half_passes_and_both_conventions_are_explained(capsys):
    lesson07.check_training_flops(flops_causal_half)
    out = capsys.readouterr().out
    assert "passed" in out and "causal half" in out and "full N x N" in out


def test_07_1_mixed_conventions_fail():
    def mixed(P, L, N, d):
        return flops_full(P, L, N, d) if N > 512 else flops_causal_half(P, L, N, d)
    fails_with(lesson07.check_training_flops, mixed, words=("one convention",))


def test_07_1_forward_only_still_named():
    fails_with(lesson07.check_training_flops, lambda P, L, N, d: 2 * P + 4 * L * N * d,
               words=("forward pass only",))


def test_07_1_each_slip_is_named_by_its_reproduction_under_either_convention():
    assert_each_slip_named(lesson07.check_training_flops, lesson07._flops_cases(),
                           lesson07._flops_slips(), flops_full,
                           same=lesson07._close_count)
    fails_with(lesson07.check_training_flops, lambda P, L, N, d: 2 * P + 2 * L * N * d,
               words=("forward pass only",))


@pytest.mark.parametrize("wrong", [
    lambda P, L, N, d: 3 * (2 * P + 4 * L * N * N),       # attention priced per sequence
    lambda P, L, N, d: 3 * (2 * P + 4 * N * d),           # attention in one layer only
])
def test_07_1_a_count_that_is_no_known_slip_gets_the_neutral_message(wrong):
    message = fails_with(lesson07.check_training_flops, wrong,
                         words=("engine.budget says", "times it"))
    assert "Hint" not in message and "2 x matmul_weights" not in message


def test_07_1_runs_generated_models_beside_the_storys():
    cases = lesson07._flops_cases()
    assert len(cases) == 8 and len({case.args for case in cases}) == 8


# ---------------------------------------------------------------- 07.2
def right_bytes(precision, optimizer):
    storage = 4 if precision == "fp32" else 2
    master = 0 if precision == "fp32" else 4
    return storage + master + storage + 4 * {"sgd": 0, "momentum": 1, "adamw": 2}[optimizer]


def bytes_with(**slip):
    def answer(precision, optimizer):
        storage = 4 if precision == "fp32" else 2
        master = 0 if precision == "fp32" or slip.get("no_master") else 4
        grad = 0 if slip.get("no_grad") else (4 if slip.get("fp32_grad") else storage)
        per_buffer = storage if slip.get("state_in_storage") else 4
        return storage + master + grad + per_buffer * {"sgd": 0, "momentum": 1,
                                                        "adamw": 2}[optimizer]
    return answer


def test_07_2_right_answer_passes(capsys):
    lesson07.check_fixed_bytes_per_parameter(right_bytes)
    assert "16 bytes" in capsys.readouterr().out


@pytest.mark.parametrize("slip, words", [
    ("no_grad", ("left out the gradient buffer",)),
    ("no_master", ("master copy",)),
    ("state_in_storage", ("optimizer state in the storage precision",)),
    ("fp32_grad", ("18 bytes", "fp32 gradient")),
])
def test_07_2_each_slip_gets_its_own_hint(slip, words):
    """A forgotten gradient buffer and bf16 optimizer state give the same 10 bytes for
    bf16 + momentum; the hint must still name the right one."""
    message = fails_with(lesson07.check_fixed_bytes_per_parameter, bytes_with(**{slip: True}),
                         words=words)
    others = {"no_grad": "left out the gradient buffer", "no_master": "master copy",
              "state_in_storage": "optimizer state in the storage"}
    for name, phrase in others.items():
        if name != slip and slip != "fp32_grad":
            assert phrase not in message


# ---------------------------------------------------------------- 07.3
def crossover(which):
    def find(cfg):
        fixed = bm.budget(cfg).fixed_total
        b = 1
        while getattr(bm.activations(cfg.with_(micro_batch=b)), which) <= fixed:
            b += 1
        return b
    return find


def test_07_3_peak_passes(capsys):
    lesson07.check_crossover_batch(crossover("peak"))
    assert "passed" in capsys.readouterr().out


def test_07_3_saved_instead_of_peak_is_rejected():
    fails_with(lesson07.check_crossover_batch, crossover("saved"),
               words=("peak", "not only what is saved"))


def crossover_variant(over=lambda peak, fixed: peak > fixed, fixed_of=lambda b: b.fixed_total,
                      start=1, doubling_only=False, last_under=False):
    """A find_crossover_batch as a learner might write it, with one slip switched on."""
    def find(cfg):
        fixed = fixed_of(bm.budget(cfg))

        def is_over(b):
            return over(bm.activations(cfg.with_(micro_batch=b)).peak, fixed)
        b = start
        while not is_over(b):
            b = 2 * b if doubling_only else b + 1
        return b - 1 if last_under else b
    return find


def crossover_by_bisection(cfg):
    fixed = bm.budget(cfg).fixed_total
    lo, hi = 0, 1 << 20              # peak(lo) <= fixed < peak(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if bm.activations(cfg.with_(micro_batch=mid)).peak > fixed:
            hi = mid
        else:
            lo = mid
    return float(hi)                  # a whole float is a batch too


def test_07_3_right_answers_written_differently_pass(capsys):
    lesson07.check_crossover_batch(crossover_variant())
    lesson07.check_crossover_batch(crossover_by_bisection)
    assert capsys.readouterr().out.count("07.3 (find_crossover_batch) passed") == 2


@pytest.mark.parametrize("wrong, words", [
    (crossover_variant(over=lambda peak, fixed: peak >= fixed),
     ("equals the fixed memory to the byte", "equal is not larger")),
    (crossover_variant(start=2), ("single sequence", "never looks at B=1")),
    (crossover_variant(last_under=True), ("last batch", "first one that exceeds")),
    (crossover_variant(fixed_of=lambda b: b.fixed["weights"]), ("weights alone",)),
    (crossover_variant(fixed_of=lambda b: b.fixed_total - b.fixed["optimizer state"]),
     ("leaves out the optimizer state",)),
    (crossover_variant(fixed_of=lambda b: b.fixed_total - b.fixed["gradients"]),
     ("leaves out the", "gradients")),
    (crossover_variant(doubling_only=True), ("power of two", "search between")),
    (_stub, ("07.3", "not done yet")),
])
def test_07_3_near_misses_are_named(wrong, words):
    fails_with(lesson07.check_crossover_batch, wrong, words=words)


def test_07_3_cases_hold_an_exact_tie_and_a_crossover_at_one_sequence():
    cases = {cfg.name: cfg for cfg in lesson07._crossover_cases()}
    tie = cases["exact-tie"]
    assert bm.activations(tie.with_(micro_batch=4)).peak == bm.budget(tie).fixed_total
    assert bm.crossover_batch(tie) == 5 and bm.crossover_batch(cases["long-sequence"]) == 1


# ------------------------------------------------------ lesson 06's pictures
ROOT = Path(__file__).resolve().parents[1]


def test_lesson_06_shows_the_memory_timeline_before_it_is_run():
    """The student notebook has no outputs: its markdown shows a committed picture of the
    timeline, found from the student notebook (course/) and the solution (course/solutions/)."""
    source = (ROOT / "course" / "source" / "06_activation_memory.py").read_text()
    images = re.findall(r"\]\((images/[^)]+\.png)\)", source)
    assert images == ["images/06_memory_timeline.png"]
    for folder in ("course", "course/solutions"):
        picture = ROOT / folder / images[0]
        assert picture.is_file() and picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ 07.4
def test_07_4_right_answer_written_otherwise_passes(capsys):
    def via_rates(step_flops, device_flops, measured_seconds):
        achieved = step_flops / measured_seconds           # the FLOP/s the step reached
        return step_flops * (1 / device_flops), achieved / device_flops
    lesson07.check_step_floor_and_mfu(via_rates)
    assert "passed" in capsys.readouterr().out


def test_07_4_stub_says_not_done():
    def stub(step_flops, device_flops, measured_seconds):
        raise NotImplementedError()
    fails_with(lesson07.check_step_floor_and_mfu, stub, words=("not done",))


@pytest.mark.parametrize("wrong, words", [
    (lambda f, d, m: (d / f, (f / d) / m), ("FLOPs divided by FLOP/s",)),
    (lambda f, d, m: (1e3 * f / d, (f / d) / m), ("not milliseconds",)),
    (lambda f, d, m: (m, (f / d) / m), ("prediction from the FLOP count",)),
    (lambda f, d, m: (f / d, m / (f / d)), ("at most 1",)),
    (lambda f, d, m: (f / d, 100 * (f / d) / m), ("not a percentage",)),
    (lambda f, d, m: (f / d, f / m), ("doubling the device's FLOP/s changes your MFU by a "
                                      "factor of 1, where it must halve",)),
    (lambda f, d, m: (f * d, (f / d) / m), ("doubling the device's FLOP/s changes your floor",)),
    (lambda f, d, m: (6 * f / d, (f / d) / m), ("6 times the right value", "constant factor")),
    (lambda f, d, m: (f / d, (f / d) * m / 1e4), ("doubling the measured time",)),
    (lambda f, d, m: f / d, ("return the pair",)),
    (lambda f, d, m: None, ("return the pair",)),
])
def test_07_4_each_slip_gets_its_own_hint(wrong, words):
    message = fails_with(lesson07.check_step_floor_and_mfu, wrong, words=words)
    for formula in ("floor / measured", "step_flops /", "/ measured", "/ device_flops"):
        assert formula not in message, message


def test_07_4_is_checked_beyond_the_storys_steps():
    # the story's steps all run below half the device's rate; a generated one does not
    def capped(step_flops, device_flops, measured):
        floor = step_flops / device_flops
        return floor, min(floor / measured, 0.5)
    fails_with(lesson07.check_step_floor_and_mfu, capped, words=("your MFU is",))


def test_07_4_asks_for_the_reasons_and_gives_no_formula():
    """The lesson gives the quantities and the contract; the learner works out the
    arithmetic and says why the floor is a floor and the MFU at most 1."""
    source = (ROOT / "course" / "source" / "07_training_step_budget.py").read_text()
    before = source[:source.index("def step_floor_and_mfu")]
    for formula in ("floor / measured", "FLOPs / (", "step_flops / device_flops",
                    "/ measured", "over the FLOP/s"):
        assert formula not in before, formula
    exercise = before[before.index("## Exercise 07.4"):]
    for asked in ("fastest this step could possibly run", "in seconds",
                  "share of the device's rate", "why can no real", "at most"):
        assert asked in exercise, asked
    after = source[source.index("# CHECK 07.4"):]
    assert "That is why the floor is a floor" in after     # the answers come after the check


def test_lesson_07_demonstrations_run_without_the_exercises(tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path / "pieces"))
    cells = run_judging_unfinished_exercises("07_training_step_budget",
                                             lesson07.EXERCISE_FUNCTIONS)
    step = next(c for c in cells if "step_floor_and_mfu(step_flops" in c.source)
    assert "measured step:" in cell_stdout(step)     # the measurement shows before the error
    assert any("BudgetWidget(" in c.source and not cell_errors(c) for c in cells)


def test_07_2_a_count_that_is_no_known_slip_gets_the_neutral_message():
    def one_byte_more(precision, optimizer):
        return right_bytes(precision, optimizer) + 1
    message = fails_with(lesson07.check_fixed_bytes_per_parameter, one_byte_more,
                         words=("bytes off",))
    assert "Hint" not in message and "master copy" not in message


def test_07_3_a_search_that_is_no_known_slip_gets_the_neutral_message():
    def two_past(cfg):
        return bm.crossover_batch(cfg) + 2
    message = fails_with(lesson07.check_crossover_batch, two_past, words=("expected B=",))
    assert "Hint" not in message and "fixed_total" not in message


def test_07_3_runs_generated_steps_beside_the_storys():
    cases = lesson07._crossover_cases()
    assert len(cases) == 11 and {c.recompute for c in cases[8:]} <= {"none", "full"}


# ------------------------------------------------------------------ 07.5
def test_07_5_right_answer_written_otherwise_passes(capsys):
    def by_the_tensors(n_tokens, vocab, precision, other_saved, resident):
        one = n_tokens * vocab * 4                  # fp32, autocast or not
        saved_output, grad_output, grad_logits = one, one, one
        return other_saved + saved_output + grad_output + grad_logits + resident
    lesson07.check_loss_peak(by_the_tensors)
    assert "passed" in capsys.readouterr().out


def test_07_5_stub_says_not_done():
    def stub(n_tokens, vocab, precision, other_saved, resident):
        raise NotImplementedError()
    fails_with(lesson07.check_loss_peak, stub, words=("not done",))


def _bytes(precision):
    return 4 if precision == "fp32" else 2


@pytest.mark.parametrize("wrong, words", [
    (lambda n, V, p, o, r: r + o + n * V * 4, ("end of the forward",)),
    (lambda n, V, p, o, r: r + o + 2 * n * V * 4, ("one fp32 [n, V] tensor",
                                                    "what it reads and what it writes")),
    (lambda n, V, p, o, r: r + o + 4 * n * V * 4, ("no reference to the logits",)),
    (lambda n, V, p, o, r: r + o + 3 * n * V * _bytes(p), ("fp32 list",)),
    (lambda n, V, p, o, r: 3 * n * V * 4, ("moment of the whole step",)),
    (lambda n, V, p, o, r: r + o, ("left out the loss's own [n, V] tensors",)),
])
def test_07_5_each_slip_gets_its_own_hint(wrong, words):
    message = fails_with(lesson07.check_loss_peak, wrong, words=words)
    assert "resident + other_saved" not in message


def test_07_5_each_slip_is_named_by_its_reproduction():
    cases, wants = lesson07._loss_cases()
    assert_each_slip_named(lesson07.check_loss_peak, cases, lesson07._loss_slips(),
                           lambda *args: wants[args])
    assert len(cases) == 8 and {case.args[2] for case in cases[4:]} == {"fp32", "bf16"}


@pytest.mark.parametrize("wrong", [
    lambda n, V, p, o, r: r + o + 3 * n * V * 4 + n * 4,        # a row of fp32 losses too
    lambda n, V, p, o, r: r + 3 * n * V * 4,                   # the rest of the forward left out
    lambda n, V, p, o, r: r + o + 3 * n * (V + 1) * 4,          # one column too many
])
def test_07_5_a_count_that_is_no_known_slip_gets_the_neutral_message(wrong):
    message = fails_with(lesson07.check_loss_peak, wrong,
                         words=["bytes off", "fp32 [n, V] tensors)"])
    assert "Hint" not in message and "resident + other_saved" not in message
