"""Gemma, Gemma 2 and Gemma 3 text configs: what each config.json says (torch-free),
what transformers runs (compat.RULES), and each step measured against transformers'
GemmaForCausalLM, Gemma2ForCausalLM and Gemma3ForCausalLM on this CPU (skipped
without torch and transformers)."""
from __future__ import annotations

import importlib.util
import json

import pytest

import engine.budget as bm
from engine.budget import cli, real_step_activations
from engine.budget.real_step import block_saved, outside_saved
from budget_step_tools import assert_cpu_step_as_predicted

# The released config.json files' fields (google/gemma-2b, google/gemma-2-2b,
# google/gemma-3-1b-pt); the presets' test holds the latter two to their published counts.
GEMMA = {"model_type": "gemma", "hidden_size": 2048, "intermediate_size": 16384,
         "num_hidden_layers": 18, "num_attention_heads": 8, "num_key_value_heads": 1,
         "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192,
         "hidden_act": "gelu", "attention_bias": False}
GEMMA2 = {"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216,
          "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
          "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192,
          "sliding_window": 4096, "attn_logit_softcapping": 50.0,
          "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 256,
          "hidden_activation": "gelu_pytorch_tanh"}
GEMMA3 = {"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912,
          "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
          "head_dim": 256, "vocab_size": 262144, "max_position_embeddings": 32768,
          "sliding_window": 512, "sliding_window_pattern": 6, "query_pre_attn_scalar": 256,
          "final_logit_softcapping": None, "attn_logit_softcapping": None,
          "hidden_activation": "gelu_pytorch_tanh"}
HF = dict(activation_model="hf")


def whats(items) -> set[str]:
    return {f"{x.op}: {x.tensor}" for x in items}


# ------------------------------------------------------------ the config.json
def test_gemma_2b_is_read_with_its_published_count_and_a_tied_head():
    cfg = bm.config_from_hf(GEMMA)
    assert (cfg.architecture, cfg.model_type, cfg.tied_embedding) == ("llama", "gemma", True)
    assert cfg.head_dim == 256 and cfg.q_width == 2048
    assert bm.parameter_count(cfg) == 2_506_172_416  # google/gemma-2b


@pytest.mark.parametrize("data", [GEMMA, GEMMA2, GEMMA3], ids=lambda d: d["model_type"])
def test_gemmas_head_size_defaults_to_its_config_classs_256(data):
    cfg = bm.config_from_hf({k: v for k, v in data.items() if k != "head_dim"})
    assert cfg.head_dim == 256


def test_gemma_2_and_3_count_the_norms_around_attention_and_the_mlp():
    g2, g3 = bm.config_from_hf(GEMMA2), bm.config_from_hf(GEMMA3)
    assert bm.parameter_breakdown(g2)["rms norms"] == 26 * 4 * 2304
    assert bm.parameter_breakdown(g3)["q and k rms norms"] == 26 * 2 * 256
    from engine.budget.optimizer_step import parameter_tensors
    for cfg in (g2, g3):
        tensors = parameter_tensors(cfg)
        assert sum(t.numel for t in tensors) == bm.parameter_count(cfg)
        assert "layers.0.pre_feedforward_layernorm.weight" in {t.name for t in tensors}


@pytest.mark.parametrize("kind, inner", [("gemma3", "gemma3_text"), ("llava", "llama"),
                                         ("mistral3", "mistral")])
def test_a_multimodal_config_is_refused_naming_its_text_config(kind, inner, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": kind, "text_config": {"model_type": inner},
                                "vision_config": {}}))
    assert cli.main(["--hf-config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "multimodal" in err
    assert f'"text_config" holds the language model ("{inner}")' in err
    assert "save that object as a config.json of its own and pass it" in err


@pytest.mark.parametrize("data, says", [
    ({**GEMMA2, "attn_logit_softcapping": None}, '"attn_logit_softcapping": null'),
    ({**GEMMA3, "final_logit_softcapping": 30.0}, '"final_logit_softcapping": 30.0'),
])
def test_soft_capping_other_than_the_config_class_makes_is_refused(data, says):
    with pytest.raises(bm.BudgetError, match=says):
        bm.config_from_hf(data)


@pytest.mark.parametrize("data", [{**GEMMA3, "sliding_window_pattern": 4},
                                  {**GEMMA2, "layer_types": ["full_attention"] * 26}],
                         ids=["gemma3 pattern 4", "gemma2 all global"])
def test_a_layer_layout_other_than_the_released_one_is_refused(data):
    with pytest.raises(bm.BudgetError, match="only the released layouts are read"):
        bm.config_from_hf(data)


# ------------------------------------------------- what transformers runs
def test_gemma2_runs_eager_attention_only():
    with pytest.raises(bm.BudgetError, match="eager mode only"):
        bm.config_from_hf(GEMMA2, **HF, attention="flash")
    with pytest.raises(bm.BudgetError, match="eager mode only"):
        bm.preset("gemma2-2b", **HF, attention="flash")


def test_gemma3_under_sdpa_is_modelled_below_its_window_only():
    assert bm.config_from_hf(GEMMA3, **HF, attention="flash", seq_len=511)
    with pytest.raises(bm.BudgetError, match="seq_len=512 >= its sliding_window 512"):
        bm.config_from_hf(GEMMA3, **HF, attention="flash", seq_len=512)
    assert bm.config_from_hf(GEMMA3, **HF, attention="standard", seq_len=4096)


# ------------------------------------------------------- what the step keeps
def test_gemma2_keeps_the_soft_capped_scores_and_logits():
    cfg = bm.preset("gemma2-2b", **HF, seq_len=1024)
    n, V, scores = 1024, 256000, 8 * 1024 * 1024
    kept = {f"{x.op}: {x.tensor}": x.bytes for x in block_saved(cfg) + outside_saved(cfg)}
    assert kept["soft-capping: tanh: output (the scores' dtype)"] == scores * 2
    assert kept["final logit soft-capping: tanh output"] == n * V * 2
    assert not any("soft-capping" in w for w in whats(block_saved(bm.preset(
        "gemma3-1b", **HF, seq_len=1024)) + outside_saved(bm.preset("gemma3-1b", **HF))))


def test_over_bf16_weights_gemmas_norms_keep_x_over_rms_in_fp32_where_llamas_keep_bf16():
    gemma = bm.preset("gemma3-1b", **HF, weights_dtype="bf16", seq_len=1024)
    llama = bm.preset("llama3.2-1b", **HF, weights_dtype="bf16", seq_len=1024)
    for cfg, size in ((gemma, 4), (llama, 2)):
        normed = [x for x in block_saved(cfg) + outside_saved(cfg)
                  if x.op in ("rms norm 1", "rms norm 2", "final rms norm")
                  and "x / rms" in x.tensor]
        assert len(normed) == 3 and {x.itemsize for x in normed} == {size}


def test_norms_around_attention_and_mlp_keep_fp32_copies_of_the_matmuls_outputs():
    g2 = bm.preset("gemma2-2b", **HF, seq_len=1024)
    plain = bm.config_from_hf({**GEMMA2, "model_type": "gemma", "attn_logit_softcapping": None,
                               "final_logit_softcapping": None}, **HF, seq_len=1024)
    around = [x for x in block_saved(g2) if x.op in ("post-attention norm",
                                                     "post-feedforward norm")]
    n, h = 1024, 2304
    assert sum(x.bytes for x in around) == 2 * (n * h * 4 * 2 + n * 4)
    assert not [x for x in block_saved(plain) if "post-" in x.op]


# ------------------------------------------------ measured with transformers here
needs_transformers = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "peft")),
    reason="torch, transformers and peft are not installed (pip install -e "
           "'.[transformers]')")


def _small(data: dict) -> dict:
    """A config.json of the same family, shrunk to seconds on a CPU."""
    return {**data, "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 160,
            "vocab_size": 1000, "max_position_embeddings": 128, "query_pre_attn_scalar": 32}


AUTOCAST = dict(precision="bf16", backend="cpu")
ALL = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
CPU_TABLE = [
    ("gemma, eager", GEMMA, dict(attention="standard")),
    ("gemma, sdpa, bf16 autocast", GEMMA, dict(attention="flash", **AUTOCAST)),
    ("gemma, sdpa, checkpointed, lora", GEMMA, dict(attention="flash", recompute="full",
                                                    lora_rank=8)),
    ("gemma2, eager", GEMMA2, dict(attention="standard")),
    ("gemma2, eager, bf16 autocast", GEMMA2, dict(attention="standard", **AUTOCAST)),
    ("gemma2, eager, checkpointed", GEMMA2, dict(attention="standard", recompute="full")),
    ("gemma2, eager, checkpointed, bf16 autocast, lora", GEMMA2,
     dict(attention="standard", recompute="full", lora_rank=8, lora_dropout=0.1, **AUTOCAST)),
    ("gemma2, eager, lora all linear", GEMMA2, dict(attention="standard", lora_rank=8,
                                                    lora_targets=ALL)),
    ("gemma2, eager, window 32 < seq 64", {**GEMMA2, "sliding_window": 32},
     dict(attention="standard")),
    ("gemma3, eager", GEMMA3, dict(attention="standard")),
    ("gemma3, eager, window 32 < seq 64, checkpointed", {**GEMMA3, "sliding_window": 32},
     dict(attention="standard", recompute="full")),
    ("gemma3, eager, bf16 autocast", GEMMA3, dict(attention="standard", **AUTOCAST)),
    ("gemma3, sdpa, below the window", GEMMA3, dict(attention="flash")),
    ("gemma3, sdpa, checkpointed", GEMMA3, dict(attention="flash", recompute="full")),
    ("gemma2, eager, bf16 weights", GEMMA2, dict(attention="standard", weights_dtype="bf16",
                                                 **AUTOCAST)),
    ("gemma2, eager, bf16 weights, lora all linear, dropout", GEMMA2,
     dict(attention="standard", weights_dtype="bf16", lora_rank=8, lora_targets=ALL,
          lora_dropout=0.1, **AUTOCAST)),
    ("gemma, eager, bf16 weights, checkpointed, lora", GEMMA,
     dict(attention="standard", weights_dtype="bf16", lora_rank=8, recompute="full",
          **AUTOCAST)),
    ("gemma3, sdpa, bf16 weights, lora", GEMMA3, dict(attention="flash", weights_dtype="bf16",
                                                      lora_rank=8, **AUTOCAST)),
    ("gemma3, sdpa, bf16 autocast, lora", GEMMA3, dict(attention="flash", lora_rank=8,
                                                       lora_targets="q_proj,v_proj,down_proj",
                                                       **AUTOCAST)),
]


@needs_transformers
@pytest.mark.parametrize("name, data, knobs", CPU_TABLE, ids=[c[0] for c in CPU_TABLE])
def test_each_gemma_step_matches_transformers_on_this_cpu(name, data, knobs):
    start = dict(micro_batch=2, seq_len=64, precision="fp32", optimizer_impl="for-loop", **HF)
    assert_cpu_step_as_predicted(bm.config_from_hf(_small(data), **{**start, **knobs}))


QLORA_TABLE = [
    ("gemma2, eager, qlora", GEMMA2, dict(attention="standard", lora_rank=8, qlora=True)),
    ("gemma3, sdpa, qlora all linear", GEMMA3, dict(attention="flash", lora_rank=8,
                                                    qlora=True, lora_targets=ALL)),
    # under autocast the GeGLU reads the 4-bit gate's and up's fp32 outputs
    ("gemma2, eager, bf16 autocast, qlora, dropout", GEMMA2,
     dict(attention="standard", lora_rank=32, qlora=True, lora_dropout=0.1, **AUTOCAST)),
    ("gemma3, sdpa, bf16 autocast, qlora all linear", GEMMA3,
     dict(attention="flash", lora_rank=8, qlora=True, lora_targets=ALL, **AUTOCAST)),
]


@needs_transformers
@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None,
                    reason="bitsandbytes is not installed (pip install bitsandbytes)")
@pytest.mark.parametrize("name, data, knobs", QLORA_TABLE, ids=[c[0] for c in QLORA_TABLE])
def test_qlora_over_gemma_matches_transformers_on_this_cpu(name, data, knobs):
    start = dict(micro_batch=2, seq_len=64, precision="fp32", optimizer_impl="for-loop", **HF)
    assert_cpu_step_as_predicted(bm.config_from_hf(_small(data), **{**start, **knobs}))
