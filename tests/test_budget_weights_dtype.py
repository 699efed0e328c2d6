"""A model loaded in bf16 (`engine.budget.weights_dtype`): the counts by hand without
torch, then LoRA steps over bf16 weights on this CPU, measured with the profiler's
memory events and compared term by term (skipped without torch, transformers and peft)."""
from __future__ import annotations

import importlib.util
import json

import pytest

import engine.budget as bm
from budget_step_tools import assert_cpu_step_as_predicted
from engine.budget import lora, real_step_activations
from engine.budget.cli import main
from engine.budget.counts import fixed_bytes, parameter_count

BF16 = dict(activation_model="hf", precision="bf16", weights_dtype="bf16")
ALL_LLAMA = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 160,
         "vocab_size": 1000, "max_position_embeddings": 128, "tie_word_embeddings": False}


# ------------------------------------------------------------ torch-free
def test_llama31_8b_lora_r16_on_bf16_weights_holds_2_bytes_a_weight_and_4_an_adapter():
    cfg = bm.preset("llama3.1-8b", **BF16, lora_rank=16, lora_targets=ALL_LLAMA)
    P, T = parameter_count(cfg), lora.trainable_parameters(cfg)
    assert P == 8_030_261_248
    # each of 32 blocks: q, o 4096 -> 4096; k, v 4096 -> 1024; gate, up 4096 -> 14336;
    # down 14336 -> 4096; A is r x fan_in, B fan_out x r
    assert T == 32 * 16 * (2 * 8192 + 2 * 5120 + 3 * 18432) == 41_943_040
    assert fixed_bytes(cfg) == {"weights": 2 * P + 4 * T, "master weights": 0,
                                "gradients": 4 * T, "optimizer state": 8 * T}
    fp32 = fixed_bytes(cfg.with_(weights_dtype="fp32"))
    assert fp32["weights"] - fixed_bytes(cfg)["weights"] == 2 * P  # 16 GB, not 32 GB


def test_the_default_fp32_weights_change_no_number():
    cfg = bm.preset("llama3.1-8b", activation_model="hf", precision="bf16", lora_rank=16,
                    seq_len=2048, micro_batch=1)
    assert cfg.weights_dtype == "fp32"
    assert cfg == cfg.with_(weights_dtype="fp32")
    assert fixed_bytes(cfg)["weights"] == 4 * (parameter_count(cfg)
                                               + lora.trainable_parameters(cfg))


def test_a_full_fine_tune_of_bf16_weights_keeps_8_bytes_a_parameter_under_adamw():
    cfg = bm.preset("llama3.1-8b", **BF16)
    P = parameter_count(cfg)
    assert fixed_bytes(cfg) == {"weights": 2 * P, "master weights": 0, "gradients": 2 * P,
                                "optimizer state": 4 * P}
    assert fixed_bytes(cfg.with_(optimizer="momentum"))["optimizer state"] == 2 * P
    assert sum(fixed_bytes(cfg.with_(weights_dtype="fp32")).values()) == 16 * P


def test_a_full_fine_tune_of_bf16_weights_keeps_bf16_norm_copies_and_one_input_a_norm():
    fp32 = bm.preset("llama2-7b", activation_model="hf", precision="bf16", seq_len=256,
                     micro_batch=1, attention="flash")
    bf16 = fp32.with_(weights_dtype="bf16")
    L, h, f, V, d, n = 32, 4096, 11008, 32000, 128, 256
    copies = 2 * L * (4 * h * h + 3 * h * f) + 2 * V * h  # every matmul weight's cast
    norm_inputs = L * (2 + 1) * n * h * 2   # q, k, v read one input, gate and up one
    x_normed = (2 * L + 1) * n * h * (4 - 2)  # every norm's x / rms: bf16, not fp32
    rotary = 2 * n * d * (4 - 2)
    drop = real_step_activations(fp32).saved - real_step_activations(bf16).saved
    assert drop == copies + norm_inputs + x_normed + rotary


def test_bf16_weights_keep_no_frozen_weight_copy_and_bf16_rotary_tables():
    fp32 = bm.preset("llama2-7b", activation_model="hf", precision="bf16", lora_rank=8,
                     seq_len=256, micro_batch=1, attention="flash")
    bf16 = fp32.with_(weights_dtype="bf16")
    L, h, f, V, d = 32, 4096, 11008, 32000, 128
    frozen_copies = 2 * (L * (4 * h * h + 3 * h * f)   # every block's seven matrices
                         - 3 * h * h)                   # but the first block's q, k, v
    head_copy, rotary = 2 * V * h, 2 * 256 * d * (4 - 2)
    drop = real_step_activations(fp32).saved - real_step_activations(bf16).saved
    assert drop == frozen_copies + head_copy + rotary


def test_the_last_blocks_forward_holds_what_the_forwards_own_variables_hold():
    """While the last block runs, LlamaModel's forward holds what no op keeps: the
    cache's copies attention did not keep (K rotated in the hidden states' dtype, bf16
    over bf16 weights), eager attention's causal mask, and over bf16 weights the
    hidden states RMSNorm copied to fp32 instead of keeping: the embeddings' output,
    the last block's input and its stream after attention."""
    from engine.budget.real_step import forward_locals, kv_cache_bytes
    cfg = bm.preset("llama2-7b", **BF16, lora_rank=8, seq_len=256, micro_batch=2,
                    attention="standard", n_kv_head=8, recompute="none")
    L, h, n, k = 32, 4096, 512, 8 * 128
    assert kv_cache_bytes(cfg) == L * n * k * (2 + 2)         # K and V, both bf16
    held = dict(forward_locals(cfg, "cpu"))
    assert held == {"key/value cache attention did not keep": L * n * k * (2 + 2),
                    "eager attention's causal mask": 2 * 256 * 256 * 2,
                    "bf16 hidden states: the embeddings' output, the last block's input "
                    "and its stream after attention": 3 * n * h * 2}
    # over fp32 weights under autocast K is rotated by fp32 cos/sin, the mask is fp32,
    # and RMSNorm keeps the fp32 hidden states themselves
    fp32 = cfg.with_(weights_dtype="fp32")
    assert dict(forward_locals(fp32, "cpu")) == {
        "key/value cache attention did not keep": L * n * k * (4 + 2),
        "eager attention's causal mask": 2 * 256 * 256 * 4}


@pytest.mark.parametrize("changes, says", [
    (dict(activation_model="transformer", precision="bf16"), "choose activation_model 'hf'"),
    (dict(activation_model="hf", precision="fp32", lora_rank=8), "precision='fp32'"),
    (dict(activation_model="hf", precision="bf16", lora_rank=8, architecture="gpt2",
          d_ff=0), "only LLaMA-shaped"),
])
def test_what_was_not_measured_is_refused_by_name(changes, says):
    with pytest.raises(bm.BudgetError, match=says):
        bm.preset("llama2-7b", weights_dtype="bf16", **changes)


def test_an_unknown_weights_dtype_is_refused():
    with pytest.raises(bm.BudgetError, match="weights_dtype='fp16' is unknown"):
        bm.preset("llama2-7b", weights_dtype="fp16")


def test_the_flag_reaches_the_json(capsys):
    args = ["--preset", "llama3.1-8b", "--activations", "hf", "--precision", "bf16",
            "--lora-rank", "16", "--lora-targets", ALL_LLAMA, "--json"]
    assert main(args) == 0
    fp32 = json.loads(capsys.readouterr().out)
    assert main(args + ["--weights-dtype", "bf16"]) == 0
    bf16 = json.loads(capsys.readouterr().out)
    assert fp32["memory"]["peak"] - bf16["memory"]["peak"] > 2 * 8_030_261_248


# ------------------------------------------------ measured with peft here
needs_peft = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "peft")),
    reason="torch, transformers and peft are not installed (pip install -e '.[lora]')")

WIDE = {**LLAMA, "hidden_size": 128, "intermediate_size": 352, "vocab_size": 2000}
# (name, config.json, knobs): a model loaded in bf16, trained under autocast to bf16
# (the Trainer's bf16=True): LoRA with peft's adapters in fp32, or every weight
CPU_TABLE = [
    ("llama gqa r64 q,v (peft's default), eager", LLAMA, dict(lora_rank=64)),
    ("llama gqa r64 all, sdpa", LLAMA,
     dict(lora_rank=64, lora_targets=ALL_LLAMA, attention="flash")),
    ("llama gqa r64 all, lora_dropout, eager", LLAMA,
     dict(lora_rank=64, lora_targets=ALL_LLAMA, lora_dropout=0.1)),
    ("llama gqa r64 all, checkpointing, sdpa", LLAMA,
     dict(lora_rank=64, lora_targets=ALL_LLAMA, recompute="full", attention="flash")),
    ("llama gqa r64 all, checkpointing, eager", LLAMA,
     dict(lora_rank=64, lora_targets=ALL_LLAMA, recompute="full")),
    ("llama gqa r64 q,v, checkpointing, padded batch, accumulation 2, eager", LLAMA,
     dict(lora_rank=64, recompute="full", padded_batch=True, accumulation=2)),
    ("llama gqa r64 all, padded batch, accumulation 2, sdpa", LLAMA,
     dict(lora_rank=64, lora_targets=ALL_LLAMA, padded_batch=True, accumulation=2,
          attention="flash")),
    ("qwen2 r32 all, sdpa", {**LLAMA, "model_type": "qwen2"},
     dict(lora_rank=32, lora_targets=ALL_LLAMA, attention="flash")),
    ("llama tied r16 q,v, attention dropout, eager",
     {**LLAMA, "tie_word_embeddings": True, "attention_dropout": 0.1}, dict(lora_rank=16)),
    # full fine-tuning of the bf16 weights: bf16 gradients, AdamW state and temporaries;
    # the wide steps at micro-batch 1 peak at the optimizer step or the backward's end
    ("full: llama gqa, eager", LLAMA, dict()),
    ("full: llama gqa, sdpa, accumulation 2", LLAMA, dict(attention="flash", accumulation=2)),
    ("full: llama gqa, checkpointing, eager", LLAMA, dict(recompute="full")),
    ("full: qwen2, padded batch, fused AdamW, sdpa", {**LLAMA, "model_type": "qwen2"},
     dict(attention="flash", optimizer_impl="fused", padded_batch=True)),
    ("full: llama tied, momentum, eager", {**LLAMA, "tie_word_embeddings": True},
     dict(optimizer="momentum", micro_batch=1)),
    ("full: wide llama, B=1, AdamW (optimizer-bound)", WIDE, dict(micro_batch=1, seq_len=16)),
    ("full: wide llama tied, B=1, foreach AdamW", {**WIDE, "tie_word_embeddings": True},
     dict(micro_batch=1, seq_len=16, optimizer_impl="foreach")),
    ("full: wide llama tied, B=1, accumulation 2 (backward's end)",
     {**WIDE, "tie_word_embeddings": True}, dict(micro_batch=1, seq_len=16, accumulation=2)),
]


@needs_peft
@pytest.mark.parametrize("name, data, knobs", [pytest.param(*c, id=c[0]) for c in CPU_TABLE])
def test_each_step_on_bf16_weights_matches_the_cpu(name, data, knobs):
    start = dict(micro_batch=2, seq_len=64, optimizer_impl="for-loop", backend="cpu", **BF16)
    assert_cpu_step_as_predicted(bm.config_from_hf(data, **{**start, **knobs}))
