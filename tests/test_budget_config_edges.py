"""Configurations that used to be mis-modelled in silence or end in a traceback:
each is now modelled right or refused with a message that names the fix."""
from __future__ import annotations

import json

import pytest

import engine.budget as bm
from engine.budget import cli

LLAMA_32_3B = {"model_type": "llama", "num_hidden_layers": 28, "hidden_size": 3072,
               "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
               "intermediate_size": 8192, "vocab_size": 128256,
               "max_position_embeddings": 131072, "tie_word_embeddings": True}


def test_a_llama_head_size_of_its_own_is_counted():
    """LLaMA 3.2 3B's published count; and with 32 heads of 128 over a width of 3072,
    Q and the output projection are 4096 wide (not 3072), K and V 8 x 128 (not 8 x 96)."""
    assert bm.parameter_count(bm.config_from_hf(LLAMA_32_3B)) == 3_212_749_824
    wide = bm.config_from_hf({**LLAMA_32_3B, "num_attention_heads": 32})
    narrow = bm.config_from_hf({**LLAMA_32_3B, "num_attention_heads": 32, "head_dim": None})
    assert wide.q_width == 4096 and narrow.q_width == 3072
    assert (bm.parameter_count(wide) - bm.parameter_count(narrow)
            == 28 * 2 * 3072 * ((4096 - 3072) + (8 * 128 - 8 * 96)))
    # the activations follow the wider Q too
    assert bm.activations(wide).saved > bm.activations(narrow).saved


def test_a_head_size_of_its_own_is_a_llama_setting():
    with pytest.raises(bm.BudgetError, match="architecture 'llama'"):
        bm.preset("gpt2-small", d_head=128)


def test_a_gpt2_config_with_cross_attention_is_refused():
    data = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4,
            "vocab_size": 100, "n_positions": 64, "add_cross_attention": True}
    with pytest.raises(bm.BudgetError, match="cross-attention"):
        bm.config_from_hf(data)


def test_deeply_nested_brackets_are_an_error_not_a_traceback(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(bm.BudgetError, match="nests its brackets too deeply"):
        bm.read_hf_config(path)


def test_more_devices_than_parameters_is_refused(capsys):
    argv = "--layers 1 --width 8 --heads 1 --vocab 10 --seq 4 --devices 100000 --zero 3"
    assert cli.main(argv.split()) == 2
    assert "ZeRO cannot split one parameter" in capsys.readouterr().err


def test_zero_without_devices_says_it_shards_nothing(capsys):
    assert cli.main(["--preset", "gpt2-small", "--zero", "3"]) == 0
    assert "ZeRO stage 3 shards nothing on one device" in capsys.readouterr().out


def test_a_llama_with_no_preset_needs_no_positions(capsys):
    argv = ("--arch llama --layers 22 --width 2048 --heads 32 --kv-heads 4 --mlp-width 5632 "
            "--vocab 32000 --untied --batch 4 --seq 2048 --json").split()
    assert cli.main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["parameters"] == 1_100_048_384
    assert got["config"]["activation_model"] == "transformer"  # not tiny's engine model


@pytest.mark.parametrize("name", bm.PRESET_NAMES)
def test_arch_llama_works_from_every_preset(name, capsys):
    assert cli.main(["--preset", name, "--arch", "llama", "--seq", "4096", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["config"]
    assert got["architecture"] == "llama" and got["seq_len"] == 4096


# ------------------------------------------------------------ the command line's inputs
def test_lora_targets_of_commas_alone_are_refused_not_read_as_peft_default(capsys):
    assert cli.main(["--preset", "llama2-7b", "--activations", "hf", "--lora-rank", "8",
                     "--lora-targets", ",,,"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--lora-targets ',,,' names no layer" in err and "q_proj" in err
    assert "\n" not in err
    with pytest.raises(bm.BudgetError, match="names no layer"):
        bm.preset("gpt2-small", activation_model="hf", lora_rank=8, lora_targets=" , ")


def test_ten_thousand_unknown_lora_targets_give_a_short_error(capsys):
    targets = ",".join(f"layer_{i}" for i in range(10_000))
    assert cli.main(["--preset", "llama2-7b", "--activations", "hf", "--lora-rank", "8",
                     "--lora-targets", targets]) == 2
    err = capsys.readouterr().err.strip()
    assert "'layer_0', 'layer_1', 'layer_2' and 9,997 more match no linear layer" in err
    assert len(err) < 400 and "\n" not in err


@pytest.mark.parametrize("flag, value", [("--device-memory", "0.5"), ("--headroom", "0.25"),
                                         ("--device-flops", "0.9")])
def test_a_fraction_of_a_byte_or_flop_is_refused_as_a_unit_slip(flag, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--preset", "gpt2-small", "--device", "H100-80GB-SXM", flag, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{flag}: '{value}' is below 1" in err and "unit slip" in err and "e.g." in err
    # with its unit the same number is read
    assert cli.memory_size("0.5GB") == 500_000_000
