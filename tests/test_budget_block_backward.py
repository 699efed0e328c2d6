"""A checkpointed block's backward, walked op by op (engine/budget/block_backward.py),
and the rebuilt blocks' moments around it: counted by hand, and measured on this CPU
for wide blocks, where the block's backward decides the peak."""
from __future__ import annotations

import importlib.util

import pytest

import engine.budget as bm
from budget_step_tools import assert_cpu_step_as_predicted
from engine.budget import moments as M
from engine.budget import optimizer_step as opt
from engine.budget.block_backward import backward_by_op
from engine.budget.framework_step import RNG_STATE_BYTES as RNG
from engine.budget.kept import Saved

LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 160,
         "vocab_size": 1000, "max_position_embeddings": 128, "tie_word_embeddings": False}
WIDE = {"hidden_size": 128, "intermediate_size": 352, "vocab_size": 300}
HF = dict(activation_model="hf", backend="cpu", recompute="full")
needs_torch = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "transformers")),
    reason="torch and transformers are not installed (pip install -e '.[transformers]')")


def test_the_walk_counts_what_each_op_of_the_block_holds_by_hand():
    """An MLP of three ops, walked back: at the down matmul every row, its weight's
    gradient, the gradient of its input (the size of its row) and of its output (none
    after the last op); at the activation the down matmul's row is released and the
    gradients of both the activation's input and output are alive; at the up matmul
    its own weight's gradient joins."""
    cfg = bm.config_from_hf(LLAMA, **HF)
    rows = [Saved("gate/up matmuls", "input", 10, 4),
            Saved("SiLU", "input", 30, 2),
            Saved("down matmul", "input", 30, 2)]
    tensors = [opt.ParamTensor("layers.1.mlp.gate_proj.weight", 7, True),
               opt.ParamTensor("layers.1.mlp.up_proj.weight", 7, True),
               opt.ParamTensor("layers.1.mlp.down_proj.weight", 7, True),
               opt.ParamTensor("layers.0.mlp.down_proj.weight", 1000, True)]  # not this block
    at_down = (40 + 60 + 60) + 7 * 4 + 60
    at_silu = (40 + 60) + 7 * 4 + (60 + 60)
    at_up = 40 + 3 * 7 * 4 + (40 + 60)
    assert backward_by_op(cfg, rows, tensors, 1, 4) == [at_down, at_silu, at_up]
    assert backward_by_op(cfg, rows, tensors, 1, 0) == [220, 220, 140]  # added in place


def test_a_weight_copy_goes_once_its_layers_backward_has_run():
    """Each matmul's backward node keeps its 16-bit weight copy until it has run: walking
    back, the down projection's copy is alive at its own op and gone at the activation's,
    while the copies of the layers before it wait for their own backward."""
    from engine.budget.real_step import block_weights
    cfg = bm.config_from_hf(LLAMA, **HF)
    copies, down = block_weights(cfg) * 2, cfg.ffn * cfg.d_model * 2
    rows = [Saved("gate/up matmuls", "input", 10, 4), Saved("SiLU", "input", 30, 2),
            Saved("down matmul", "input", 30, 2),
            Saved("block matmuls", "weights, 16-bit copies", block_weights(cfg), 2)]
    at_down, at_silu, at_up = copies + 220, copies - down + 220, copies - down + 140
    assert backward_by_op(cfg, rows, [], 1, 0) == [at_down, at_silu, at_up]


def test_a_frozen_layer_passes_on_a_gradient_as_large_as_its_input():
    """Under LoRA on q and v the down projection is frozen and keeps no row, but the
    gradient it hands the activation is B x T x ffn: read off the full fine-tune's row
    of its input, not off the (absent) next row."""
    cfg = bm.config_from_hf(LLAMA, **HF)
    base = [Saved("SiLU", "input", 30, 2), Saved("SiLU(gate) * up", "both", 60, 2),
            Saved("down matmul", "input", 30, 2)]
    assert backward_by_op(cfg, base[:2], [], 1, 0) == [30 * 2 + 120 + 120, 60 + 60 + 120]
    assert backward_by_op(cfg, base[:2], [], 1, 0, base=base) == [
        30 * 2 + 120 + 120 + 60, 60 + 60 + 120]


def test_an_rms_norms_backward_holds_four_more_tensors_like_its_input():
    """transformers' RMSNorm is small ops; its backward, at pow's, holds the gradient
    through x * rsqrt, mean's expanded gradient and pow's three temporaries: five
    input-sized tensors, one of them the input's gradient."""
    cfg = bm.config_from_hf(LLAMA, **HF)
    rows = [Saved("rms norm 2", "input (the residual stream, fp32)", 50, 4),
            Saved("rms norm 2", "1/rms, one per token", 5, 4)]
    assert backward_by_op(cfg, rows, [], 1, 0) == [220 + 220]
    assert backward_by_op(cfg, rows, [], 1, 0, base=rows) == [220 + 220 + 4 * 200]


def test_a_checkpointed_step_has_the_last_blocks_backward_and_the_firsts():
    """The last block's backward holds every checkpoint and few gradients; the first's
    one checkpoint and the later blocks' gradients: both are moments, with the same
    arrangements (one per op and the rebuild) for the fit searches."""
    cfg = bm.config_from_hf({**LLAMA, **WIDE}, micro_batch=2, seq_len=64, **HF)
    step = bm.real_step_activations(cfg, device="cpu").step
    found = {m.name: m for m in step.moments}
    last, first = found[M.LAST_BLOCK_BACKWARD], found[M.FIRST_BLOCK_BACKWARD]
    assert len(last.arrangements) == len(first.arrangements) > 1
    assert max(last.arrangements) == last.bytes and max(first.arrangements) == first.bytes

    def held(m, what):
        return sum(a.bytes for a in m.terms if a.what.startswith(what))
    n, h = 2 * 64, 128
    # one block's input, and the CPU generator's state its checkpoint stashed
    assert held(last, "the checkpoints") - held(first, "the checkpoints") == n * h * 4 + RNG
    block = sum(t.numel for t in opt.trainable_tensors(cfg) if t.block == 1) * 4
    assert held(first, "gradients made before") - held(last, "gradients made before") == block


# Wide blocks and a small vocabulary: the peak is inside a block's backward.
WIDE_STEPS = [
    ("mistral fp32, eager", {**LLAMA, **WIDE, "model_type": "mistral", "sliding_window": 4096},
     dict(micro_batch=3, seq_len=32, optimizer_impl="fused")),
    ("qwen2 fp32, eager, accumulation 2, 8-bit AdamW",
     {**LLAMA, **WIDE, "model_type": "qwen2", "tie_word_embeddings": True,
      "use_sliding_window": False},
     dict(micro_batch=3, seq_len=64, accumulation=2, optimizer="adamw-8bit")),
    ("gemma3 bf16 autocast, sdpa",
     {**LLAMA, **WIDE, "model_type": "gemma3_text", "head_dim": 32, "sliding_window": 512,
      "query_pre_attn_scalar": 32, "hidden_activation": "gelu_pytorch_tanh",
      "tie_word_embeddings": True},
     dict(micro_batch=3, seq_len=32, precision="bf16", attention="flash",
          optimizer_impl="fused")),
    ("llama fp32, sdpa, LoRA r32 q,v",
     {**LLAMA, **WIDE}, dict(micro_batch=3, seq_len=64, attention="flash", lora_rank=32)),
    # QLoRA: each 4-bit layer's backward holds its weight dequantized, in fp32 and bf16
    ("QLoRA: mistral fp32, eager, r8 all-linear",
     {**LLAMA, **WIDE, "model_type": "mistral", "sliding_window": 4096},
     dict(micro_batch=2, seq_len=64, accumulation=2, optimizer_impl="fused", qlora=True,
          lora_rank=8, lora_targets="all-linear")),
    ("QLoRA: gemma3 bf16 autocast, sdpa, r8 q,v, lora_dropout",
     {**LLAMA, **WIDE, "model_type": "gemma3_text", "head_dim": 32, "sliding_window": 512,
      "query_pre_attn_scalar": 32, "hidden_activation": "gelu_pytorch_tanh",
      "tie_word_embeddings": True},
     dict(micro_batch=2, seq_len=64, precision="bf16", attention="flash", qlora=True,
          lora_rank=8, lora_dropout=0.1, optimizer_impl="fused")),
    ("QLoRA without checkpointing: mistral fp32, sdpa, accumulation 2",
     {**LLAMA, **WIDE, "model_type": "mistral", "sliding_window": 4096},
     dict(micro_batch=1, seq_len=48, accumulation=2, attention="flash", qlora=True,
          lora_rank=8, recompute="none")),
    # the down projection's fp32 output gradient is the residual stream's (1.06 before)
    ("QLoRA without checkpointing: qwen3 fp32, sdpa, r32, lora_dropout, output freed",
     {**LLAMA, **WIDE, "model_type": "qwen3", "head_dim": 32, "tie_word_embeddings": True},
     dict(micro_batch=2, seq_len=32, accumulation=2, precision="fp32", attention="flash",
          qlora=True, lora_rank=32, lora_dropout=0.1, recompute="none",
          outputs="freed-after-backward", optimizer_impl="for-loop")),
    # checkpointed DoRA over GPT-2: the DoRA rows beside their adapter's (0.92 before)
    ("DoRA: gpt2 fp32, eager, r32, lora_dropout",
     {"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 300,
      "n_positions": 128, "activation_function": "gelu_new"},
     dict(micro_batch=3, seq_len=32, precision="fp32", optimizer_impl="fused", lora_rank=32,
          lora_dropout=0.1, dora=True)),
    # peft wraps GPT-2's transposed weight in a new Parameter: its gradient, made by each
    # block's backward, stays with the graph, and autocast's copy of the dropped input
    # is kept for it (0.93 before)
    ("DoRA: gpt2 bf16 autocast, eager, r32, lora_dropout",
     {"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 300,
      "n_positions": 128, "activation_function": "gelu_new"},
     dict(micro_batch=3, seq_len=32, precision="bf16", optimizer_impl="fused", lora_rank=32,
          lora_dropout=0.1, dora=True)),
    # GPT-2's rebuilt MLP under autocast: while its c_proj's adapter runs, the GELU's
    # 16-bit output, peft's fp32 cast of it, the base output, B(A(x)) and its scaled
    # copy are alive and no op keeps them (peak 0.955 before)
    ("LoRA: gpt2 bf16 autocast, sdpa, r32 all-linear",
     {"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 300,
      "n_positions": 128, "activation_function": "gelu_new"},
     dict(micro_batch=3, seq_len=32, precision="bf16", attention="flash", lora_rank=32,
          lora_targets="all-linear")),
    # a tied model's later micro-batch: the head's new gradient waits for the
    # embedding's beside every gradient made before (peak 0.950 before)
    ("gemma bf16 autocast, eager, accumulation 2, Adafactor",
     {**LLAMA, **WIDE, "model_type": "gemma", "head_dim": 32,
      "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True},
     dict(micro_batch=3, seq_len=48, precision="bf16", accumulation=2, optimizer="adafactor")),
    # Qwen3, every linear layer adapted: the rebuild stops inside down_proj's adapter,
    # beside peft's fp32 cast of its input and lora_dropout's output (0.94 before)
    ("qwen3 bf16 autocast, sdpa, r8 all-linear, lora_dropout, output freed",
     {**LLAMA, **WIDE, "model_type": "qwen3", "head_dim": 32, "tie_word_embeddings": True},
     dict(micro_batch=2, seq_len=48, precision="bf16", attention="flash", lora_rank=8,
          lora_targets="all-linear", lora_dropout=0.1, outputs="freed-after-backward",
          optimizer_impl="foreach")),
]


@needs_torch
@pytest.mark.parametrize("name, data, knobs", [pytest.param(*c, id=c[0]) for c in WIDE_STEPS])
def test_each_wide_checkpointed_step_matches_this_cpu(name, data, knobs):
    if knobs.get("lora_rank") and importlib.util.find_spec("peft") is None:
        pytest.skip("peft is not installed (pip install -e '.[lora]')")
    needs_bnb = knobs.get("optimizer") == "adamw-8bit" or knobs.get("qlora")
    if needs_bnb and importlib.util.find_spec("bitsandbytes") is None:
        pytest.skip("bitsandbytes is not installed (pip install -e '.[lora]')")
    assert_cpu_step_as_predicted(bm.config_from_hf(data, **{**HF, **knobs}))


def test_a_4bit_down_projection_holds_its_weight_dequantized_both_ways_by_hand():
    """LLaMA's down_proj under QLoRA, trained in fp32: its forward holds its input cast
    to bf16, its weight dequantized to bf16 and the bf16 product (nothing is saved after
    it). Its backward, after the product's rows, holds the bf16 cast of its output's
    gradient (the fp32 one is the residual stream's, counted by the block's moments)
    and the largest of: the weight dequantized to fp32 beside its bf16 cast; the cast
    beside the input's bf16 gradient; that gradient beside its fp32 cast."""
    from engine.budget import recipes
    from engine.budget.framework_step import block_saved
    cfg = bm.config_from_hf({**LLAMA, **WIDE}, micro_batch=2, seq_len=64, qlora=True,
                            lora_rank=8, activation_model="hf", backend="cpu")
    n, h, f = 2 * 64, 128, 352

    def rows_of(step):
        block = block_saved(step, "cpu")
        return recipes.rows(step, recipes.Rows(block, block, []), "cpu")
    rows = rows_of(cfg)
    assert rows.forward_transient == n * f * 2 + f * h * 2 + n * h * 2
    down = rows.layer_backwards[-1]
    assert down == ("SiLU(gate) * up", n * h * 2 + max(f * h * (4 + 2), f * h * 2 + n * f * 2,
                                                      n * f * (2 + 4)))
    # at B x T = 512 the input's two gradients outgrow the weight's two copies
    wide = rows_of(cfg.with_(micro_batch=8)).layer_backwards[-1][1]
    assert wide == 512 * h * 2 + 512 * f * (2 + 4)
