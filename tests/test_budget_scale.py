"""engine.budget beyond one device: ZeRO sharding against the paper's figures,
device fit and step time, LLaMA blocks and the presets' published parameter
counts, Hugging Face config files, gradient precision."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from engine import budget as bm

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine.budget", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


# ------------------------------------------------- ZeRO (Rajbhandari et al. 2020)
ZERO_7_5B = bm.BudgetConfig(n_params=7_500_000_000, precision="bf16", optimizer="adamw",
                            devices=64, micro_batch=1, seq_len=16)


@pytest.mark.parametrize("stage, gigabytes", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_figure_1_per_device_memory(stage, gigabytes):
    """Figure 1: Psi = 7.5B, K = 12 bytes of optimizer state per parameter
    (fp32 master weights + Adam's two moments), N_d = 64."""
    b = bm.budget(replace(ZERO_7_5B, zero=stage))
    assert b.fixed["master weights"] + b.fixed["optimizer state"] == 12 * 7_500_000_000
    assert round(b.fixed_total / 1e9, 1) == gigabytes
    # the formulas behind the figure, exactly
    psi, k, n = 7_500_000_000, 12, 64
    exact = {0: (2 + 2 + k) * psi, 1: 2 * psi + 2 * psi + k * psi / n,
             2: 2 * psi + (2 + k) * psi / n, 3: (2 + 2 + k) * psi / n}[stage]
    assert b.fixed_total == pytest.approx(exact, abs=64)


def test_zero_shards_nothing_on_one_device_and_never_the_activations():
    one = bm.budget(replace(ZERO_7_5B, devices=1, zero=3))
    assert one.fixed_per_device == one.fixed and one.communication == ()
    many = bm.budget(replace(ZERO_7_5B, zero=3))
    assert (many.activations.saved, many.activations.peak, many.activations.items) == (
        one.activations.saved, one.activations.peak, one.activations.items)
    assert many.tokens_per_step_all_devices == 64 * bm.tokens_per_step(many.config)


def test_collective_volumes_follow_the_paper():
    """Stage 0-2 move 2 Psi per step (an all-reduce = reduce-scatter + all-gather),
    stage 3 moves 3 Psi; a ring sends (N-1)/N of each buffer per device."""
    n, grads = 64, 2 * 7_500_000_000
    sent = {s: sum(r["sent_per_device"] for r in
                   bm.budget(replace(ZERO_7_5B, zero=s)).communication) for s in range(4)}
    two_psi = 2 * (n - 1) * grads // n
    assert sent[0] == sent[1] == sent[2] == pytest.approx(two_psi, abs=2)
    assert sent[3] == pytest.approx(3 * (n - 1) * grads // n, abs=3)
    # stage 2 and 3 reduce-scatter after every micro-batch, stage 0 all-reduces once
    k4 = {s: bm.budget(replace(ZERO_7_5B, zero=s, accumulation=4)).communication
          for s in range(4)}
    assert [r["times_per_step"] for r in k4[0]] == [1]
    assert [r["times_per_step"] for r in k4[2]] == [4, 1]
    assert [r["times_per_step"] for r in k4[3]] == [4, 4, 4]


# ----------------------------------------------------------- gradient precision
def test_gradient_precision_is_its_own_knob():
    assert sum(bm.bytes_per_parameter("bf16", "adamw").values()) == 16
    assert sum(bm.bytes_per_parameter("bf16", "adamw", "fp32").values()) == 18
    assert sum(bm.bytes_per_parameter("fp32", "adamw", "fp32").values()) == 16
    cfg = bm.preset("llama2-7b")
    assert (bm.budget(cfg.with_(grad_precision="fp32")).fixed_total
            - bm.budget(cfg).fixed_total == 2 * bm.parameter_count(cfg))


# --------------------------------------------------------- presets and LLaMA
PUBLISHED = {"gpt2-small": 124_439_808, "gpt2-medium": 354_823_168,
             "gpt2-large": 774_030_080, "gpt2-xl": 1_557_611_200,
             "llama2-7b": 6_738_415_616, "llama2-13b": 13_015_864_320,
             "llama2-70b": 68_976_648_192}


@pytest.mark.parametrize("name, count", PUBLISHED.items())
def test_presets_have_their_published_parameter_counts(name, count):
    assert bm.parameter_count(bm.preset(name)) == count


def test_llama_block_has_no_biases_a_smaller_kv_and_a_three_matrix_mlp():
    d, f, kv = 8192, 28672, 8 * 128
    parts = bm.parameter_breakdown(bm.preset("llama2-70b"))
    assert parts["attention k and v"] == 80 * 2 * d * kv
    assert parts["mlp gate, up and down"] == 80 * 3 * d * f
    assert parts["rms norms"] == 80 * 2 * d and "position embedding" not in parts
    assert parts["output head"] == parts["token embedding"] == 32000 * d
    # LLaMA's width rule: 8d/3 rounded up to a multiple of 256
    assert bm.BudgetConfig(architecture="llama", d_model=4096, n_head=32).ffn == 11008
    assert bm.BudgetConfig(architecture="llama", d_model=5120, n_head=40).ffn == 13824


def test_grouped_query_attention_shrinks_k_and_v_only():
    mha = bm.preset("llama2-70b", n_kv_head=64, micro_batch=1, seq_len=64, block_size=0)
    gqa = mha.with_(n_kv_head=8)
    s, b, h = 64, 1, 8192
    per_layer = lambda c: sum(x.bytes for x in bm.llama_layer_ops(c))
    assert per_layer(mha) - per_layer(gqa) == 2 * 2 * s * b * (h - 1024)  # K and V, bf16
    assert bm.flops(mha)["per_token"]["forward"] - bm.flops(gqa)["per_token"]["forward"] \
        == 2 * 80 * 2 * h * (h - 1024)
    assert bm.attention_flops_per_token(mha) == bm.attention_flops_per_token(gqa)


def test_six_flops_per_parameter_holds_for_llama():
    cfg = bm.preset("llama2-7b", seq_len=16)
    tok = bm.flops(cfg)["per_token"]
    embed = 32000 * 4096  # the input table does no matmul
    assert tok["forward"] + tok["backward"] == pytest.approx(
        6 * (bm.parameter_count(cfg) - embed), rel=1e-3)


def test_gpt2_rejects_grouped_kv_heads_and_bad_groups():
    with pytest.raises(bm.BudgetError, match="architecture 'llama'"):
        bm.preset("gpt2-small", n_kv_head=4)
    with pytest.raises(bm.BudgetError, match=r"n_kv_head=5 does not divide n_head=32.*\[1, 2, 4"):
        bm.preset("llama2-7b", n_kv_head=5)
    with pytest.raises(bm.BudgetError, match="architecture 'gpt2'"):
        bm.preset("tiny", architecture="llama")


# -------------------------------------------------------- Hugging Face configs
@pytest.mark.parametrize("fixture, name", [("gpt2_config.json", "gpt2-small"),
                                           ("llama2_7b_config.json", "llama2-7b"),
                                           ("llama2_70b_config.json", "llama2-70b")])
def test_hf_config_reads_to_the_presets_count(fixture, name):
    cfg = bm.config_from_hf(bm.read_hf_config(FIXTURES / fixture))
    want = bm.preset(name)
    assert bm.parameter_count(cfg) == bm.parameter_count(want) == PUBLISHED[name]
    for knob in ("architecture", "n_layer", "d_model", "n_head", "kv_heads", "ffn",
                 "vocab_size", "positions", "tied_embedding"):
        assert getattr(cfg, knob) == getattr(want, knob), knob


def test_cli_hf_config_matches_the_preset():
    path = str(FIXTURES / "llama2_7b_config.json")
    data = json.loads(cli("--hf-config", path, "--seq", "2048", "--json").stdout)
    assert data["parameters"] == 6_738_415_616
    assert data["config"]["seq_len"] == 2048 and data["config"]["architecture"] == "llama"


@pytest.mark.parametrize("content, says", [
    ('[1, 2]', "JSON list"),
    ('{"model_type": "bert"}', '"model_type": "bert" is not read here'),
    ('{"model_type": "gpt2", "n_layer": "12"}', '"n_layer": "12" is not a positive'),
    ('not json', "not a JSON file"),
])
def test_hf_config_bad_files_get_a_clear_error(tmp_path, content, says):
    path = tmp_path / "config.json"
    path.write_text(content)
    run = cli("--hf-config", str(path))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert says in run.stderr, run.stderr
    missing = cli("--hf-config", str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr


# ------------------------------------------------------------------- devices
def _step_peak(cfg):
    b = bm.budget(cfg)
    return max(b.peak, b.peak_first_step)


def test_fit_and_largest_micro_batch_on_a_device():
    cfg = bm.preset("gpt2-small", device="A100-40GB", precision="bf16")
    b = bm.budget(cfg)
    d = b.device
    assert d.memory == 40 * 2**30 and d.flops_per_second == 312e12
    assert d.headroom == 2 * 2**30 and d.usable == d.memory - d.headroom
    assert d.fits == (_step_peak(cfg) + d.headroom <= d.memory)
    big = d.largest_micro_batch
    assert _step_peak(cfg.with_(micro_batch=big)) <= d.usable
    assert _step_peak(cfg.with_(micro_batch=big + 1)) > d.usable
    assert bm.budget(cfg.with_(micro_batch=big + 1)).device.fits is False


def test_the_headroom_is_taken_from_the_card():
    cfg = bm.preset("gpt2-small", device="A100-40GB", precision="bf16")
    none = bm.budget(cfg.with_(headroom=0)).device
    lots = bm.budget(cfg.with_(headroom=20 * 2**30)).device
    assert none.usable == none.memory and lots.usable == lots.memory - 20 * 2**30
    assert lots.largest_micro_batch < none.largest_micro_batch
    with pytest.raises(bm.BudgetError, match="headroom"):
        bm.preset("gpt2-small", headroom=-1)


def test_longest_sequence_and_fewest_devices_that_fit():
    short = bm.preset("llama2-7b", n_layer=4, block_size=0, activation_model="hf",
                      attention="flash", device="A100-40GB")
    d = bm.budget(short).device
    longest = d.longest_sequence
    assert 4096 < longest < 2**24
    assert _step_peak(short.with_(micro_batch=1, seq_len=longest)) <= d.usable
    assert _step_peak(short.with_(micro_batch=1, seq_len=longest + 1)) > d.usable
    cfg = bm.preset("llama2-7b", activation_model="hf", attention="flash",
                    device="A100-80GB", micro_batch=1)
    d = bm.budget(cfg).device
    assert d.longest_sequence is None      # the fixed memory alone does not fit
    few = d.fewest_devices
    assert few is not None and d.fits is False
    fitted = cfg.with_(devices=few["devices"], zero=few["zero"])
    assert _step_peak(fitted) <= d.usable
    # one device fewer fits at no ZeRO stage
    for stage in (0, 1, 2, 3):
        assert _step_peak(cfg.with_(devices=few["devices"] - 1, zero=stage)) > d.usable


def test_lora_fit_answers_beside_full_fine_tuning():
    lora = bm.preset("llama3.2-1b", lora_rank=16, activation_model="hf", attention="flash",
                     recompute="full", device="rtx-4090", micro_batch=4)
    d = bm.budget(lora).device
    full = bm.preset("llama3.2-1b", activation_model="hf", attention="flash",
                     recompute="full", device="rtx-4090", micro_batch=4)
    f = bm.budget(full).device
    assert d.full_fine_tuning == {"fits": f.fits, "largest_micro_batch": f.largest_micro_batch,
                                  "longest_sequence": f.longest_sequence,
                                  "fewest_devices": f.fewest_devices}
    assert d.largest_micro_batch > f.largest_micro_batch
    assert d.longest_sequence > f.longest_sequence
    assert f.full_fine_tuning is None
    out = cli("--preset", "llama3.2-1b", "--lora-rank", "16", "--activations", "hf",
              "--device", "rtx-4090").stdout
    assert "full FT    without adapters: fits" in out
    assert "(4 bytes/trainable param)" in out and "(4 bytes/param)" in out


def test_devices_by_short_name_in_any_case():
    assert bm.find_device("h200").name == "H200-141GB"
    assert bm.find_device("H100-80gb").name == "H100-80GB-SXM"
    assert bm.find_device("rtx-3090") is bm.find_device("RTX3090") is bm.DEVICES["RTX-3090"]
    assert bm.find_device("mi300x").name == "MI300X" and bm.find_device("l4").name == "L4"
    assert bm.find_device("a100") is None          # two cards start so: named in full
    for name in ("B200-180GB", "L40S", "A10G", "RTX-4090"):
        assert name in bm.DEVICES
    run = cli("--preset", "gpt2-small", "--device", "h200", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["device"]["device"] == "H200-141GB"
    run = cli("--preset", "gpt2-small", "--device", "a100")
    assert run.returncode == 2 and "A100-40GB" in run.stderr


def test_step_time_at_the_stated_mfu():
    cfg = bm.preset("llama2-7b", devices=8, zero=3, device="H100-80GB-SXM", mfu=0.5)
    b = bm.budget(cfg)
    seconds = b.flops["per_step"]["total"] / (0.5 * 989e12)
    assert b.device.step_seconds == pytest.approx(seconds)
    assert b.device.tokens_per_second == pytest.approx(8 * 4096 / seconds)
    fp32 = bm.budget(cfg.with_(precision="fp32")).device
    assert fp32.flops_per_second == 67e12  # the device's fp32 rate for fp32 math


def test_device_figures_override_and_custom_devices():
    cfg = bm.preset("gpt2-small", device="A100-80GB", device_memory=10**9)
    assert bm.budget(cfg).device.memory == 10**9
    assert bm.budget(cfg).device.flops_per_second == 19.5e12  # fp32 preset
    mine = bm.preset("gpt2-small", device="my card", device_memory=8 * 10**9,
                     device_flops=10**13)
    assert bm.budget(mine).device.device == "my card"
    with pytest.raises(bm.BudgetError, match="not a known device"):
        bm.preset("gpt2-small", device="my card")
    assert bm.budget(bm.preset("gpt2-small")).device is None


def test_this_machine_is_measured():
    spec = bm.this_machine()
    assert spec["device_memory"] > 10**8 and spec["device_flops"] > 10**8
    assert bm.budget(bm.preset("tiny", **spec)).device.fits is True


def test_nothing_fits_says_so():
    cfg = bm.preset("llama2-70b", device="RTX-4090")
    assert bm.budget(cfg).device.fits is False
    assert bm.budget(cfg).device.largest_micro_batch is None
    run = cli("--preset", "llama2-70b", "--device", "RTX-4090")
    assert "fits       no" in run.stdout and "even B=1 does not fit" in run.stdout


def test_cli_sharding_and_device_report():
    run = cli("--preset", "llama2-7b", "--devices", "8", "--zero", "3", "--device",
              "A100-80GB", "--mfu", "0.4")
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "ZeRO stage 3 over 8 devices" in out and "1/8 of 13.5 GB" in out
    assert "reduce-scatter gradients" in out and "all-gather weights (forward)" in out
    assert "fits       yes" in out and "tokens/s over 8 devices" in out
    data = json.loads(cli("--preset", "llama2-7b", "--devices", "8", "--zero", "3",
                          "--device-memory", "80GiB", "--device-flops", "312T",
                          "--json").stdout)
    assert data["device"]["memory"] == 80 * 2**30
    assert data["device"]["flops_per_second"] == 312e12
    assert data["memory"]["peak"] == bm.budget(bm.preset(
        "llama2-7b", devices=8, zero=3)).peak


@pytest.mark.parametrize("args, says", [
    (("--zero", "4"), ["--zero 4", "0, 1, 2, 3"]),
    (("--devices", "0"), ["--devices 0", "positive whole number"]),
    (("--mfu", "1.5"), ["--mfu 1.5", "at most 1"]),
    (("--device", "TPU"), ["--device 'TPU'", "A100-80GB"]),
    (("--device-memory", "lots"), ["'lots' is not a memory size"]),
    (("--arch", "rwkv"), ["--arch 'rwkv'", "gpt2, llama"]),
    (("--grad-precision", "fp8"), ["--grad-precision 'fp8'", "storage, fp32"]),
    (("--untied",), ["leave out --untied"]),  # tiny runs the engine's tied GPT
    (("--preset", "gpt2-small", "--hf-config", "x.json"), ["not both"]),
])
def test_cli_rejects_bad_scale_settings(args, says):
    run = cli(*args)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    for fragment in says:
        assert fragment in run.stderr, (fragment, run.stderr)
    assert "set --untied on" not in run.stderr


def test_absurd_sizes_are_refused_by_name_and_huge_numbers_still_print():
    run = cli("--preset", "gpt2-small", "--width", "1" + "0" * 200, "--heads", "1")
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "--width" in run.stderr and "at most 24 digits" in run.stderr
    run = cli("--preset", "gpt2-small", "--width", str(10**9), "--heads", "1")
    assert run.returncode == 2 and "--width 1000000000 is not allowed" in run.stderr
    assert "up to 1,048,576" in run.stderr
    assert bm.human_bytes(10**400) == "1.00e+400 B"
    assert bm.human_count(10**300).startswith("1.00e+300")


def test_lora_flops_skip_the_frozen_weights_gradients():
    full = bm.preset("llama2-7b", activation_model="hf")
    lora = full.with_(lora_rank=8)     # peft's default targets: q_proj, v_proj
    f, l = bm.budget(full).flops["per_token"], bm.budget(lora).flops["per_token"]
    matmul = bm.counts.matmul_weights(full)
    adapters = 32 * 8 * (4096 + 4096) * 2           # A and B of q and v in 32 blocks
    attention = bm.counts.attention_flops_per_token(full)
    assert l["forward"] == f["forward"] + 2 * adapters
    assert f["backward"] == 2 * f["forward"]
    # input gradients only through the frozen matmuls; both of the adapters'
    assert l["backward"] == 2 * matmul + 2 * attention + 4 * adapters
    assert l["backward"] < 0.6 * f["backward"]


@pytest.mark.parametrize("zero", [1, 2])
def test_under_lora_zero_1_and_2_gather_back_only_the_adapters(zero):
    """The frozen model is replicated under ZeRO 1 and 2 (nothing updates it), so the
    all-gather after the step carries the adapters alone: LLaMA-2-7B, rank 16 on q and v,
    32 layers x 2 modules x 16 x (4096 + 4096) fp32 weights."""
    adapters = 32 * 2 * 16 * (4096 + 4096) * 4
    cfg = bm.preset("llama2-7b", activation_model="hf", devices=8, zero=zero, lora_rank=16)
    rows = {r["collective"]: r for r in bm.budget(cfg).communication}
    assert rows["all-gather"]["bytes"] == adapters == rows["reduce-scatter"]["bytes"]
    assert rows["all-gather"]["sent_per_device"] == 7 * adapters // 8


def test_under_lora_zero_3_gathers_every_weight_but_reduces_the_adapters_alone():
    cfg = bm.preset("llama2-7b", activation_model="hf", devices=8, zero=3, lora_rank=16)
    b = bm.budget(cfg)
    gathers = [r["bytes"] for r in b.communication if r["collective"] == "all-gather"]
    assert gathers == [b.fixed["weights"]] * 2          # forward and backward, frozen or not
    reduced = [r["bytes"] for r in b.communication if r["collective"] == "reduce-scatter"]
    assert reduced == [32 * 2 * 16 * (4096 + 4096) * 4]
