"""engine.budget: the source texts' worked numbers, the published activation
formula, the engine's own measurement, and the command line."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from engine import budget as bm
from engine.budget import lab
from engine.gpt_config import GPTConfig, num_params

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine.budget", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def line_value(text: str, label: str) -> str:
    """The size printed after `label` in the human-readable report."""
    m = re.search(rf"^\s*{re.escape(label)}\s+(\S+ \S+)", text, re.M)
    assert m, f"no line {label!r} in:\n{text}"
    return m.group(1)


# ------------------------------------------------- the source texts' numbers
def test_cli_reproduces_the_7b_example():
    run = cli("--preset", "7b-example")
    assert run.returncode == 0, run.stderr
    assert line_value(run.stdout, "one B x N x d tensor") == "134 MB"
    assert line_value(run.stdout, "activations (saved)") == "17.2 GB"  # "17 GB"
    assert line_value(run.stdout, "weights") == "14 GB"  # 7B params in 16-bit
    data = json.loads(cli("--preset", "7b-example", "--json").stdout)
    one = 8 * 2048 * 4096 * 2
    assert data["one_tensor_bytes"] == one == 134_217_728
    assert data["memory"]["activations"] == 32 * 4 * one


def test_cli_reproduces_the_24_layer_example():
    run = cli("--preset", "24-layer-example")
    assert run.returncode == 0, run.stderr
    assert line_value(run.stdout, "activations (saved)") == "12.9 GB"
    data = json.loads(cli("--preset", "24-layer-example", "--json").stdout)
    assert data["memory"]["activations"] == 8 * 2048 * 1024 * 24 * 16 * 2


def test_cli_knobs_override_the_preset():
    data = json.loads(cli("--preset", "7b-example", "--seq", "4096", "--json").stdout)
    assert data["memory"]["activations"] == 2 * 32 * 4 * 134_217_728  # double N, double it


def test_mixed_precision_adamw_is_16_bytes_per_parameter():
    for precision in ("bf16", "fp16"):
        assert sum(bm.bytes_per_parameter(precision, "adamw").values()) == 16
    assert bm.bytes_per_parameter("bf16", "adamw") == {
        "weights": 2, "master weights": 4, "gradients": 2, "optimizer state": 8}
    assert sum(bm.bytes_per_parameter("fp32", "sgd").values()) == 8
    assert sum(bm.bytes_per_parameter("fp32", "momentum").values()) == 12
    assert sum(bm.bytes_per_parameter("bf16", "sgd").values()) == 8


# ------------------------------------------------------------ parameters
def test_gpt2_small_has_its_known_parameter_count():
    assert bm.parameter_count(bm.preset("gpt2-small")) == 124_439_808


@settings(max_examples=40, deadline=None)
@given(L=st.integers(1, 6), heads=st.integers(1, 4), head_size=st.integers(1, 16),
       V=st.integers(2, 300), T=st.integers(1, 64))
def test_parameter_formula_matches_the_shared_gpt_config(L, heads, head_size, V, T):
    d = heads * head_size
    cfg = bm.BudgetConfig(n_layer=L, d_model=d, n_head=heads, vocab_size=V, block_size=T,
                         seq_len=T)
    assert bm.parameter_count(cfg) == num_params(GPTConfig(V, T, L, heads, d))


def test_untied_head_adds_one_vocabulary_matrix():
    tied = bm.preset("gpt2-small")
    untied = tied.with_(tied_embedding=False)
    assert bm.parameter_count(untied) - bm.parameter_count(tied) == 768 * 50257


# ------------------------------------------------------------------ FLOPs
@settings(max_examples=30, deadline=None)
@given(L=st.integers(1, 8), heads=st.integers(1, 8), head_size=st.integers(1, 32),
       b=st.integers(1, 8), n=st.integers(1, 256), k=st.integers(1, 4))
def test_flop_accounting(L, heads, head_size, b, n, k):
    cfg = bm.BudgetConfig(n_layer=L, d_model=heads * head_size, n_head=heads, vocab_size=97,
                         micro_batch=b, seq_len=n, accumulation=k)
    f = bm.flops(cfg)
    tok = f["per_token"]
    assert tok["backward"] == 2 * tok["forward"] and tok["recompute"] == 0
    assert f["per_micro_batch"]["total"] == b * n * tok["total"]
    assert f["per_step"]["total"] == k * f["per_micro_batch"]["total"]
    full = bm.flops(cfg.with_(recompute="full"))["per_token"]
    assert full["total"] == 4 * tok["forward"]  # one more forward: 3x becomes 4x
    selective = bm.flops(cfg.with_(recompute="selective"))["per_token"]
    assert selective["recompute"] == bm.attention_flops_per_token(cfg) == 4 * L * n * cfg.d_model


def test_six_flops_per_parameter_per_token_when_attention_is_small():
    cfg = bm.preset("7b-example", seq_len=16, micro_batch=1)
    tok = bm.flops(cfg)["per_token"]
    assert tok["forward"] + tok["backward"] == pytest.approx(6 * 7e9, rel=1e-3)


# ------------------------------------------------------------ activations
@settings(max_examples=60, deadline=None)
@given(s=st.integers(1, 512), b=st.integers(1, 16), heads=st.integers(1, 16),
       head_size=st.integers(1, 64), L=st.integers(1, 4))
def test_per_op_transformer_count_equals_korthikanti(s, b, heads, head_size, L):
    h = heads * head_size
    cfg = bm.BudgetConfig(n_layer=L, d_model=h, n_head=heads, micro_batch=b, seq_len=s,
                         precision="bf16", dropout=True)
    layer = sum(x.bytes for x in bm.transformer_layer_ops(cfg))
    assert layer == bm.korthikanti_layer_bytes(s, b, h, heads, "none")
    # the published form sbh(34 + 5as/h), in exact arithmetic
    assert layer * h == s * b * h * (34 * h + 5 * heads * s)
    outside = sum(x.bytes for x in bm.transformer_outside_ops(cfg))
    for mode in ("none", "selective", "full"):
        acts = bm.activations(cfg.with_(recompute=mode))
        assert acts.saved == L * bm.korthikanti_layer_bytes(s, b, h, heads, mode) + outside


def test_transformer_count_without_dropout_and_in_fp32():
    s, b, h, a = 64, 2, 32, 4
    cfg = bm.BudgetConfig(n_layer=1, d_model=h, n_head=a, micro_batch=b, seq_len=s)
    layer = sum(x.bytes for x in bm.transformer_layer_ops(cfg))
    # 16 tensors of s*b*h and the softmax output, 4 bytes each, no masks
    assert layer == 4 * (16 * s * b * h + a * s * s * b)


@pytest.mark.parametrize("name", ["gpt2-small", "7b-class"])
def test_recompute_keeps_less_and_rebuilds_one_block(name):
    cfg = bm.preset(name)
    none = bm.activations(cfg)
    full = bm.activations(cfg.with_(recompute="full"))
    assert full.saved < none.saved and full.peak < none.peak
    # the head and loss are freed before the last block is rebuilt
    outside = sum(x.bytes for x in bm.transformer_outside_ops(cfg) if not x.until_end)
    stays = sum(x.bytes for x in bm.transformer_outside_ops(cfg) if x.until_end)
    block = sum(x.bytes for x in bm.transformer_layer_ops(cfg))
    e = bm.STORAGE_BYTES[cfg.precision]
    kept = cfg.n_layer * cfg.micro_batch * cfg.seq_len * cfg.d_model * e
    assert full.saved == kept + stays + outside
    assert full.peak == kept + stays + max(outside, block)
    # GPT-2 small's logits (V=50257) outweigh a block; the 7B-class block outweighs them
    assert (full.transient > 0) == (name == "7b-class")


def test_rule_of_thumb_grows_linearly_in_batch_and_sequence():
    cfg = bm.preset("24-layer-example")
    base = bm.activations(cfg).saved
    assert bm.activations(cfg.with_(micro_batch=16)).saved == 2 * base
    assert bm.activations(cfg.with_(seq_len=4096)).saved == 2 * base
    assert bm.budget(cfg.with_(micro_batch=16)).fixed == bm.budget(cfg).fixed


def test_crossover_batch_is_where_activations_overtake_fixed_memory():
    for name in ("gpt2-small", "24-layer-example", "7b-class"):
        cfg = bm.preset(name)
        cross = bm.crossover_batch(cfg)
        fixed = bm.budget(cfg).fixed_total
        assert cross is not None
        assert bm.activations(cfg.with_(micro_batch=cross)).peak > fixed
        if cross > 1:
            assert bm.activations(cfg.with_(micro_batch=cross - 1)).peak <= fixed


def test_peak_is_fixed_plus_activation_peak():
    b = bm.budget(bm.preset("gpt2-small", recompute="full"))
    assert b.peak == sum(b.fixed.values()) + b.activations.saved + b.activations.transient


# ------------------------------------------------------ human-readable units
@pytest.mark.parametrize("n, text", [(134_217_728, "134 MB"), (17_179_869_184, "17.2 GB"),
                                     (999, "999 B"), (1_000, "1 kB"), (999_700_000, "1000 MB"),
                                     (0, "0 B")])
def test_human_bytes(n, text):
    assert bm.human_bytes(n) == text


# ----------------------------------------------------------- command line
def test_cli_help_and_json():
    run = cli("--help")
    assert run.returncode == 0 and "--preset" in run.stdout and "--json" in run.stdout
    data = json.loads(cli("--preset", "gpt2-small", "--json").stdout)
    assert data["parameters"] == 124_439_808
    assert data["memory"]["peak"] == bm.budget(bm.preset("gpt2-small")).peak


@pytest.mark.parametrize("args, says", [
    (("--preset", "gpt2-small", "--heads", "5"), ["--heads 5", "does not divide", "[1, 2, 3, 4, 6"]),
    (("--preset", "gpt2-small", "--batch", "0"), ["--batch 0", "positive whole number"]),
    (("--preset", "gpt2-small", "--layers", "-2"), ["--layers -2", "positive whole number"]),
    (("--preset", "nano"), ["unknown preset 'nano'", "gpt2-small", "tiny"]),
    (("--preset", "gpt2-small", "--precision", "fp8"), ["fp8", "fp32, bf16, fp16"]),
    (("--preset", "7b-example", "--recompute", "selective"), ["selective", "transformer"]),
    (("--preset", "gpt2-small", "--seq", "4096"), ["--seq 4096", "--positions 1024"]),
])
def test_cli_rejects_impossible_input(args, says):
    run = cli(*args)
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    for fragment in says:
        assert fragment in run.stderr, (fragment, run.stderr)


# ------------------------------------------- "this engine" against engine.memory
SMALL_CONFIGS = [  # (L, d, H, V, B, N): shapes chosen to differ in every factor
    (1, 16, 2, 11, 2, 8),
    (2, 24, 3, 29, 3, 16),
    (3, 32, 4, 64, 1, 32),
    (2, 48, 6, 17, 4, 12),
    (4, 32, 1, 50, 2, 24),
    (1, 64, 8, 97, 5, 7),
]


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("L, d, H, V, b, n", SMALL_CONFIGS)
def test_engine_model_equals_the_measurement(L, d, H, V, b, n, recompute):
    cfg = bm.BudgetConfig(n_layer=L, d_model=d, n_head=H, vocab_size=V, micro_batch=b,
                         seq_len=n, activation_model="engine", recompute=recompute)
    m = lab.measure(cfg, seed=L + n)
    # saved = alive at the end of the forward pass; without recompute, all the tape saved
    assert m["measured_saved"] == m["predicted_saved"] == bm.activations(cfg).saved
    assert m["measured_peak"] == pytest.approx(m["predicted_peak"], rel=0.01)
    assert m["measured_weights"] == m["predicted_weights"]
    assert m["measured_gradients"] == m["predicted_gradients"]
    assert m["measured_step_peak"] == pytest.approx(m["predicted_step_peak"], rel=0.01)
    # the timeline rises through the forward and is back to zero after the backward
    live = [bytes_ for _, _, bytes_ in m["timeline"]]
    assert max(live) == m["measured_peak"] and live[-1] == 0


def test_engine_model_agrees_with_the_engines_own_closed_form():
    from engine.gpt_config import GPTConfig
    from engine.nn import gpt_saved_bytes
    for L, d, H, V, b, n in SMALL_CONFIGS:
        cfg = bm.BudgetConfig(n_layer=L, d_model=d, n_head=H, vocab_size=V, micro_batch=b,
                             seq_len=n, activation_model="engine")
        assert bm.activations(cfg).saved == gpt_saved_bytes(GPTConfig(V, n, L, H, d), b, n)


def test_engine_model_has_the_sixteen_tensors_of_the_source_text():
    cfg = bm.BudgetConfig(n_layer=1, d_model=64, n_head=4, micro_batch=2, seq_len=32,
                         activation_model="engine")
    btc = 2 * 32 * 64
    floats = sum(x.elements for x in bm.engine_block_saved(cfg))
    assert floats == 16 * btc + 2 * 2 * 32 + 4 * 2 * 32 * 32


def test_measure_refuses_what_the_engine_cannot_run():
    with pytest.raises(bm.BudgetError, match="too large to measure"):
        lab.measure(bm.preset("gpt2-small"))
    with pytest.raises(bm.BudgetError, match="no dropout"):
        lab.measure(bm.preset("tiny", activation_model="transformer", dropout=True))


def test_checkpointing_every_block_cuts_the_measured_peak():
    plain = lab.measure(bm.preset("tiny", micro_batch=4))
    ckpt = lab.measure(bm.preset("tiny", micro_batch=4, recompute="full"))
    assert ckpt["measured_peak"] * 3 < plain["measured_peak"]
    assert ckpt["measured_saved"] < ckpt["measured_peak"]  # one block rebuilt on top
    assert ckpt["loss"] == plain["loss"]


def test_cli_tiny_preset_is_the_trainer_config():
    from engine.gpt_config import num_params, tiny_config
    data = json.loads(cli("--preset", "tiny", "--json").stdout)
    cfg = data["config"]
    assert (cfg["n_layer"], cfg["d_model"], cfg["n_head"], cfg["seq_len"],
            cfg["micro_batch"]) == (4, 128, 4, 128, 16)
    assert data["parameters"] == num_params(tiny_config(bm.corpus_vocab_size()))


# ------------------------------------ the lesson 06-07 checks built on these numbers
from coursework import ExerciseError, lesson06, lesson07  # noqa: E402


def _stub(*args):
    raise NotImplementedError()


def _fails_with(check, fn, *fragments):
    with pytest.raises(ExerciseError) as info:
        check(fn)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_lesson06_checks_accept_the_engine_counts_and_name_the_usual_slips():
    lesson06.check_mlp_saved_bytes(lambda b, i, h, o, e: e * b * (i + h))
    _fails_with(lesson06.check_mlp_saved_bytes, lambda b, i, h, o, e: e * b * (i + 2 * h),
                "06.1", "same array")
    _fails_with(lesson06.check_mlp_saved_bytes, lambda b, i, h, o, e: e * b * h,
                "fc1's matmul also keeps its input x")
    _fails_with(lesson06.check_mlp_saved_bytes, _stub, "06.1", "not done yet")

    lesson06.check_block_saved_elements(lambda B_, T, C, H: 16 * B_ * T * C + 2 * B_ * T
                                        + B_ * H * T * T)
    _fails_with(lesson06.check_block_saved_elements,
                lambda B_, T, C, H: 16 * B_ * T * C + 2 * B_ * T, "06.2", "probabilities att")
    _fails_with(lesson06.check_block_saved_elements,
                lambda B_, T, C, H: 16 * B_ * T * C + B_ * H * T * T, "rstd")

    lesson06.check_micro_batch_that_fits(lambda m, N, d, L, k, e: m // (N * d * L * k * e))
    _fails_with(lesson06.check_micro_batch_that_fits,
                lambda m, N, d, L, k, e: m // (N * d * k * e), "06.3", "one layer")


def test_lesson07_checks_accept_the_budget_and_name_the_usual_slips():
    lesson07.check_training_flops(lambda P, L, N, d: 3 * (2 * P + 4 * L * N * d))
    _fails_with(lesson07.check_training_flops, lambda P, L, N, d: 2 * P + 4 * L * N * d,
                "07.1", "forward pass only")
    _fails_with(lesson07.check_training_flops, lambda P, L, N, d: 6 * P, "no weights")

    def right(precision, optimizer):
        return sum(bm.bytes_per_parameter(precision, optimizer).values())

    lesson07.check_fixed_bytes_per_parameter(right)
    _fails_with(lesson07.check_fixed_bytes_per_parameter,
                lambda p, o: right(p, o) - (4 if p != "fp32" else 0), "07.2", "master copy")

    lesson07.check_crossover_batch(bm.crossover_batch)
    _fails_with(lesson07.check_crossover_batch, lambda cfg: bm.crossover_batch(cfg) - 1,
                "07.3", "the last batch where the activations still fit")
    _fails_with(lesson07.check_crossover_batch, _stub, "07.3", "not done yet")


@pytest.mark.parametrize("recompute", ["none", "full", "selective"])
def test_measure_reports_progress_against_an_exact_count_of_the_steps_events(recompute):
    from engine.budget.lab.measure import _StepProgress, _tape_step, step_events
    run = lab.measurable(bm.BudgetConfig(n_layer=3, d_model=32, n_head=2, vocab_size=17,
                                      micro_batch=2, seq_len=8, recompute=recompute))
    counter = _StepProgress(step_events(run), lambda *a: None)
    _tape_step(run, 0, observers=(counter,))
    assert counter.done == counter.total       # the count read off 1 and 2 blocks is exact
    seen = []
    lab.measure(run, progress=lambda fraction, left: seen.append((fraction, left)))
    assert all(0 < f <= 1 and left >= 0 for f, left in seen)
