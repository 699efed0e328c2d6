"""The budget's real-step models (`--activations pytorch|hf`) against real steps:
the ten measured GPU steps shipped with the package (predicted, not fitted), and
PyTorch on this CPU at other shapes, term by term (skipped without torch or
transformers)."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from pathlib import Path

import pytest

import engine.budget as bm
from engine.budget import cli
from engine.budget.framework_step import real_step_activations

TABLE = Path(bm.__file__).parent / "measured" / "h200_hf_training_steps.json"
# The table's steps ran torch.optim.AdamW(foreach=False, fused=False): the for-loop.
GPT2 = ("--dropout {dropout} --activations hf --attention {attention} --recompute {recompute} "
        "--optimizer-impl for-loop")
LLAMA = ("--arch llama --layers 22 --width 2048 --heads 32 --kv-heads 4 --mlp-width 5632 "
         "--vocab 32000 --untied --batch 4 --seq 2048 --precision bf16 --dropout off "
         "--activations hf --attention flash --optimizer-impl for-loop")
# The table's rows in order, as a practitioner would ask for each.
COMMANDS = [
    "--preset gpt2-small --batch 8 --seq 1024 --precision fp32 " + GPT2.format(
        dropout="on", attention="standard", recompute="none"),
    "--preset gpt2-small --batch 8 --seq 1024 --precision fp32 " + GPT2.format(
        dropout="off", attention="standard", recompute="none"),
    "--preset gpt2-small --batch 8 --seq 1024 --precision fp32 " + GPT2.format(
        dropout="off", attention="flash", recompute="none"),
    "--preset gpt2-small --batch 8 --seq 1024 --precision bf16 " + GPT2.format(
        dropout="off", attention="flash", recompute="none"),
    "--preset gpt2-small --batch 8 --seq 1024 --precision fp32 " + GPT2.format(
        dropout="off", attention="flash", recompute="full"),
    "--preset gpt2-medium --batch 4 --seq 1024 --precision fp32 " + GPT2.format(
        dropout="on", attention="standard", recompute="none"),
    "--preset gpt2-medium --batch 8 --seq 1024 --precision bf16 " + GPT2.format(
        dropout="off", attention="flash", recompute="none"),
    "--preset gpt2-large --batch 8 --seq 1024 --precision bf16 " + GPT2.format(
        dropout="off", attention="flash", recompute="full"),
    LLAMA + " --recompute none",
    LLAMA + " --recompute full",
]


def run_json(argv: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(argv.split() + ["--json"]) == 0
    return json.loads(out.getvalue())


def measured_rows() -> list[dict]:
    return json.loads(TABLE.read_text())["rows"]


@pytest.mark.parametrize("index", range(len(COMMANDS)))
def test_each_measured_gpu_step_is_predicted_within_5_percent(index):
    row, got = measured_rows()[index], run_json(COMMANDS[index])
    assert got["parameters"] == row["n_params"], row["name"]
    for ours, theirs in (("activations", "activations"), ("peak", "peak_step2"),
                         ("peak_first_step", "peak_step1")):
        ratio = got["memory"][ours] / row[theirs]
        assert abs(ratio - 1) < 0.05, (f"{row['name']}: {ours} predicted "
                                       f"{got['memory'][ours]:,} measured {row[theirs]:,}")


def test_the_table_is_not_what_the_textbook_model_predicts():
    """The reason the real-step models exist: the op-list model of the same step
    misses the loss's vocabulary-sized tensors and autocast's copies."""
    row = measured_rows()[3]
    argv = COMMANDS[3].replace("--activations hf", "--activations transformer").replace(
        " --optimizer-impl for-loop", "")
    assert run_json(argv)["memory"]["peak"] < 0.6 * row["peak_step2"]


def test_the_peak_names_its_moment_and_what_is_alive():
    got = run_json(COMMANDS[3])["memory"]
    moment = got["peak_moment"]
    assert moment["moment"] == "the loss's backward"
    alive = {x["what"]: x["bytes"] for x in moment["alive"]}
    vocab = 8 * 1024 * 50257 * 4
    assert alive["gradient of the logits (fp32)"] == vocab
    assert alive["gradient of the log_softmax output"] == vocab
    assert sum(alive.values()) == got["peak"] == moment["bytes"]
    # checkpointing every block moves the peak to the loss at the end of the forward,
    # where autocast's cache still holds a 16-bit copy of every weight
    ckpt = run_json(COMMANDS[7])["memory"]["peak_moment"]
    assert ckpt["moment"] == "the loss at the end of the forward"
    assert any(x["what"].startswith("autocast cache") for x in ckpt["alive"])


def test_autocast_keeps_fp32_weights_and_gradients():
    cfg = bm.preset("gpt2-small", activation_model="hf", precision="bf16")
    assert bm.bytes_per_parameter("bf16", "adamw", "storage", autocast=True) == {
        "weights": 4, "master weights": 0, "gradients": 4, "optimizer state": 8}
    assert bm.fixed_bytes(cfg)["weights"] == 4 * bm.parameter_count(cfg)


def test_the_first_step_peaks_lower_than_the_steady_state():
    got = run_json(COMMANDS[8])["memory"]
    assert got["peak_first_step"] < got["peak"]
    assert got["peak"] - got["peak_first_step"] == 8 * 1_100_048_384  # AdamW's two fp32 buffers


def test_the_human_report_says_when_the_peak_happens():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.main(COMMANDS[3].split() + ["--breakdown"])
    text = out.getvalue()
    assert "peak       during the loss's backward: saved by the forward" in text
    assert "log_softmax output (fp32)" in text and "GELU: tanh" in text
    assert "moments of the step (step 1)" in text


def test_breakdown_items_add_up_to_the_activations():
    b = bm.budget(bm.preset("gpt2-medium", activation_model="hf", attention="standard",
                            dropout=True))
    assert sum(x.bytes for x in b.activations.items) == b.activations.saved


@pytest.mark.parametrize("changes, words", [
    (dict(recompute="selective"), "attention 'flash'"),
    (dict(n_params=10**9), "set n_params to 0"),
    (dict(grad_precision="fp32"), "fp32 gradients"),
])
def test_real_step_refuses_what_a_real_step_has_no_switch_for(changes, words):
    with pytest.raises(bm.BudgetError, match=words):
        bm.preset("gpt2-small", activation_model="hf", **changes)


def test_plain_pytorch_is_a_gpt2_and_the_engine_has_no_flash_attention():
    with pytest.raises(bm.BudgetError, match="activation_model 'hf' for LLaMA"):
        bm.preset("llama2-7b", activation_model="pytorch")
    with pytest.raises(bm.BudgetError, match="set attention 'standard'"):
        bm.preset("tiny", attention="flash")


def test_flash_drops_the_textbook_models_t_by_t_tensors():
    cfg = bm.preset("gpt2-small", activation_model="transformer")
    standard, flash = bm.activations(cfg), bm.activations(cfg.with_(attention="flash"))
    scores = 12 * 1024 * 1024 * 8 * 4 * 12  # a*s*s*b*4 bytes, 12 layers
    rows = 12 * 1024 * 8 * 4 * 12
    assert standard.saved - flash.saved == scores - rows


def test_a_shape_of_your_own_does_not_inherit_the_tiny_presets_limits():
    """No preset named: --seq beyond tiny's 128 positions and --arch llama work."""
    got = run_json("--params 7500000000 --precision fp16 --devices 64 --zero 1 --batch 1 "
                   "--seq 1024")
    assert got["config"]["seq_len"] == 1024
    got = run_json(LLAMA + " --recompute none")
    assert got["config"]["architecture"] == "llama"


def test_arch_contradicting_a_config_file_is_refused(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 64,
                                "n_head": 4, "vocab_size": 100, "n_positions": 64}))
    assert cli.main(["--hf-config", str(path), "--arch", "llama"]) == 2
    assert "contradicts the file's model_type 'gpt2'" in capsys.readouterr().err


# ------------------------------------------------- measured with PyTorch here
def _missing(*modules):
    return [m for m in modules if importlib.util.find_spec(m) is None]


needs_torch = pytest.mark.skipif(bool(_missing("torch")), reason="PyTorch is not installed "
                                 "(pip install -e '.[torch]')")
needs_transformers = pytest.mark.skipif(
    bool(_missing("torch", "transformers")),
    reason="torch and transformers are not installed (pip install -e '.[transformers]')")

SMALL = dict(n_layer=2, d_model=64, n_head=4, vocab_size=1000, micro_batch=2, seq_len=64)
LLAMA_SMALL = dict(architecture="llama", n_kv_head=2, tied_embedding=False)
CPU_CASES = [
    ("hf", dict(attention="standard")),
    ("hf", dict(attention="standard", dropout=True)),
    ("hf", dict(attention="flash")),
    ("hf", dict(attention="flash", recompute="full")),
    ("hf", dict(attention="flash", **LLAMA_SMALL)),
    ("hf", dict(attention="standard", **LLAMA_SMALL)),
    ("hf", dict(attention="flash", recompute="full", **LLAMA_SMALL)),
    ("pytorch", dict(attention="standard", dropout=True)),
    ("pytorch", dict(attention="flash")),
]


def _compare(model: str, changes: dict) -> tuple:
    from engine.budget.lab.torch_step import measure_step
    cfg = bm.BudgetConfig(**SMALL, activation_model=model, **changes).validate()
    m = measure_step(cfg, device="cpu")
    acts = real_step_activations(m.config, device="cpu")
    peak = bm.budget(m.config).fixed_total + acts.peak
    return m, acts, peak


@pytest.mark.parametrize("model, changes", CPU_CASES,
                         ids=[f"{m}-" + "-".join(f"{v}" for v in c.values())
                              for m, c in CPU_CASES])
def test_each_path_matches_pytorch_on_this_cpu(model, changes):
    """Every op list of the model against the CPU allocator at a shape of its
    own: what the forward leaves alive, and both steps' peaks."""
    if model == "hf" and _missing("transformers"):
        pytest.skip("transformers is not installed (pip install -e '.[transformers]')")
    if _missing("torch"):
        pytest.skip("PyTorch is not installed (pip install -e '.[torch]')")
    m, acts, peak = _compare(model, changes)
    assert m.weights == bm.fixed_bytes(m.config)["weights"]
    assert acts.saved == pytest.approx(m.activations, rel=0.03)
    assert peak == pytest.approx(m.peak, rel=0.05)
    assert acts.step.first_step_peak_moment.bytes == pytest.approx(m.peak_first_step, rel=0.05)


@needs_torch
def test_the_same_terms_hold_at_another_batch_and_length():
    """Right for the right reasons: double the batch, halve the length, and the
    plain PyTorch step still matches term by term."""
    from engine.budget.lab.torch_step import measure_step
    cfg = bm.BudgetConfig(**{**SMALL, "micro_batch": 4, "seq_len": 32},
                          activation_model="pytorch", attention="standard").validate()
    m = measure_step(cfg, device="cpu")
    assert real_step_activations(cfg, device="cpu").saved == pytest.approx(m.activations,
                                                                           rel=0.03)


@needs_torch
def test_measure_torch_prints_measured_beside_predicted(capsys):
    argv = ("--layers 2 --width 64 --heads 4 --vocab 500 --batch 2 --seq 64 "
            "--activations pytorch --attention flash --measure torch").split()
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "measured with PyTorch on cpu: B=2 N=64 L=2 fp32" in out
    for row in ("weights", "activations", "peak", "peak_first_step"):
        assert f"  {row} " in out


def test_measure_torch_needs_a_real_step_model(capsys):
    assert cli.main("--preset tiny --measure torch".split()) == 2
    assert "needs --activations pytorch or hf" in capsys.readouterr().err


@needs_torch
def test_with_accumulation_the_gradients_so_far_are_alive_in_later_micro_batches():
    """Two micro-batches per step: the second's loss backward runs beside the
    first's gradients, which the model adds to that moment."""
    from engine.budget.lab.torch_step import measure_step
    cfg = bm.BudgetConfig(**SMALL, activation_model="pytorch", attention="flash",
                          accumulation=2).validate()
    m = measure_step(cfg, device="cpu")
    acts = real_step_activations(cfg, device="cpu")
    one = real_step_activations(cfg.with_(accumulation=1), device="cpu")
    assert acts.step.peak_moment.bytes - one.step.peak_moment.bytes == bm.fixed_bytes(cfg)[
        "gradients"]
    assert bm.budget(cfg).fixed_total + acts.peak == pytest.approx(m.peak, rel=0.05)
    assert acts.saved == pytest.approx(m.activations, rel=0.03)


def test_gpt2_eager_with_one_sequence_keeps_all_of_q_k_v_through_q():
    """With one sequence (B = 1) reshaping GPT-2's Q, a view of c_attn's output, to
    Q @ K^T's 3-D operand needs no copy: Q keeps all of Q|K|V alive, and without the
    cache K^T and V are views of it too (with more sequences each is a copy)."""
    one = bm.BudgetConfig(**{**SMALL, "micro_batch": 1}, activation_model="hf",
                          attention="standard").validate()
    n, h = 64, 64

    def attention_rows(cfg):
        return {x.tensor: x.elements * x.itemsize for x in real_step_activations(cfg).step.items
                if x.op in ("Q @ K^T", "P @ V") and "first" not in x.op}
    assert attention_rows(one) == {"Q (a view of Q|K|V)": 3 * n * h * 4,
                                   "K^T (copy)": n * h * 4, "V (copy)": n * h * 4}
    assert attention_rows(one.with_(use_cache="off")) == {"Q (a view of Q|K|V)": 3 * n * h * 4}
    two = one.with_(micro_batch=2)
    assert {k for k in attention_rows(two) if "copy" in k} == {"Q (copy)", "K^T (copy)",
                                                               "V (copy)"}


@needs_torch
@pytest.mark.parametrize("changes", [dict(), dict(use_cache="off"),
                                     dict(precision="bf16", dropout=True)],
                         ids=["fp32", "no cache", "bf16 autocast, dropout"])
def test_gpt2_eager_with_one_sequence_matches_pytorch_on_this_cpu(changes):
    """Activations 0.95 before the view was counted."""
    if _missing("transformers"):
        pytest.skip("transformers is not installed (pip install -e '.[transformers]')")
    m, acts, peak = _compare_one(changes)
    assert acts.saved == pytest.approx(m.activations, rel=0.01)
    assert peak == pytest.approx(m.peak, rel=0.05)
    assert acts.step.first_step_peak_moment.bytes == pytest.approx(m.peak_first_step, rel=0.05)


def _compare_one(changes: dict) -> tuple:
    from engine.budget.lab.torch_step import measure_step
    cfg = bm.BudgetConfig(**{**SMALL, "micro_batch": 1}, activation_model="hf",
                          attention="standard", **changes).validate()
    m = measure_step(cfg, device="cpu")
    acts = real_step_activations(m.config, device="cpu")
    return m, acts, bm.budget(m.config).fixed_total + acts.peak
