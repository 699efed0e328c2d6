"""The LoRA family as recipes (`engine.budget.recipes`): peft's `all-linear` targets,
DoRA (`use_dora=True`) and `modules_to_save`, counted by hand without torch, then run
through peft on this CPU and measured with the profiler's memory events (skipped
without torch, transformers and peft)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import engine.budget as bm
from budget_step_tools import assert_cpu_step_as_predicted
from engine.budget import lora, real_step_activations, recipes
from engine.budget import optimizer_step as opt
from engine.budget.counts import fixed_bytes, parameter_count

HF = dict(activation_model="hf", precision="fp32")
GPT2 = json.loads((Path(__file__).parent / "fixtures" / "gpt2_config.json").read_text())
LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 160,
         "vocab_size": 1000, "max_position_embeddings": 128, "tie_word_embeddings": False}
SMALL_GPT2 = {**GPT2, "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000,
              "n_positions": 128, "resid_pdrop": 0, "embd_pdrop": 0, "attn_pdrop": 0}
needs_peft = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "peft")),
    reason="torch, transformers and peft are not installed (pip install -e '.[lora]')")


def _cpu(data, **knobs):
    start = dict(micro_batch=2, seq_len=64, optimizer_impl="for-loop", backend="cpu", **HF)
    return bm.config_from_hf(data, **{**start, **knobs})


# ------------------------------------------------------------- the registry
def test_the_recipes_apply_in_a_fixed_order_and_only_where_set():
    names = [r.name for r in recipes.registry()]
    assert names == ["lora", "dora", "qlora", "modules_to_save"]
    cfg = bm.preset("llama2-7b", **HF, lora_rank=8, dora=True)
    assert [r.name for r in recipes.applied(cfg)] == ["lora", "dora"]
    assert recipes.applied(bm.preset("llama2-7b", **HF)) == ()


def test_each_recipe_over_lora_names_a_knob_of_the_table_and_an_adapter_knob():
    """The report lists each recipe's setting beside LoRA's from the registry, so a new
    recipe shows up there without an edit to the report."""
    from engine.budget.knobs import ADAPTER_KNOBS, KNOBS
    knobs = [r.knob for r in recipes.registry() if r.knob]
    assert knobs == ["dora", "qlora", "modules_to_save"]
    assert all(k in KNOBS and k in ADAPTER_KNOBS for k in knobs)


# ------------------------------------------------------------- all-linear
@pytest.mark.parametrize("preset, names", [
    ("gpt2-small", ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]),
    ("llama2-7b", ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                   "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]),
])
def test_all_linear_targets_every_linear_layer_of_the_blocks(preset, names):
    cfg = bm.preset(preset, **HF, lora_rank=8, lora_targets="all-linear")
    assert [l.name for l in lora.targeted(cfg)] == names


@needs_peft
@pytest.mark.parametrize("data", [SMALL_GPT2, LLAMA], ids=["gpt2", "llama"])
def test_all_linear_adapts_the_layers_peft_adapts(data):
    """peft's own resolution of "all-linear" (every nn.Linear and Conv1D but the
    output head) trains exactly the tensors the budget lists."""
    import torch

    from engine.budget.lab.torch_step import _build
    cfg = _cpu(data, lora_rank=8, lora_targets="all-linear")
    with torch.device("meta"):
        model = _build(cfg)
    trained = [(n, p.numel()) for n, p in model.named_parameters() if p.requires_grad]
    budget = [(t.name, t.numel) for t in opt.trainable_tensors(cfg)]
    assert [numel for _, numel in trained] == [numel for _, numel in budget]
    assert all(n.replace(".default", "").endswith(b) for (n, _), (b, _) in zip(trained, budget))


# ------------------------------------------------------------------- DoRA
def test_dora_trains_a_magnitude_per_output_column_of_each_adapted_layer():
    cfg = bm.preset("llama2-7b", **HF, lora_rank=8)
    dora = cfg.with_(dora=True)
    # q_proj and v_proj of 32 blocks: 4096 output columns each
    extra = 32 * 2 * 4096
    assert sum(t.numel for t in opt.trainable_tensors(dora)) - lora.trainable_parameters(cfg) \
        == extra
    names = [t.name for t in opt.trainable_tensors(dora)][:3]
    assert names == ["layers.0.self_attn.q_proj.lora_A.weight",
                     "layers.0.self_attn.q_proj.lora_B.weight",
                     "layers.0.self_attn.q_proj.lora_magnitude_vector.weight"]
    assert fixed_bytes(dora)["optimizer state"] - fixed_bytes(cfg)["optimizer state"] \
        == 8 * extra
    assert fixed_bytes(dora)["weights"] - fixed_bytes(cfg)["weights"] == 4 * extra


def test_dora_keeps_each_layers_base_output_and_adapter_output():
    cfg = bm.preset("llama2-7b", **HF, lora_rank=8, seq_len=256, attention="flash")
    n, L, q, v = 256, 32, 4096, 4096
    # per block: q_proj's and v_proj's base output and B(A(x)), fp32; the norm, the scale
    # and the scale - 1 (the first block's q and v read an input needing no gradient)
    extra = L * 2 * n * (q + v) * 4 + L * 3 * (q + v) * 4 - (q + v) * 4
    assert (real_step_activations(cfg.with_(dora=True)).saved
            - real_step_activations(cfg).saved) == extra


def test_a_rebuilt_dora_block_holds_the_last_layers_b_at_a_where_the_rebuild_stops():
    """LLaMA's down_proj is the block's last saver: the rebuild stops in its (scale - 1)
    * base(x), with its identity (kept by A(I)'s graph in fp32), A(I) and B(A(I))."""
    cfg = _cpu_like(LLAMA, lora_rank=64, recompute="full", attention="flash", **ALL)
    n, f, d, r = 2 * 64, 160, 64, 64
    extra = f * f * 4 + f * r * 4 + f * d * 4 + n * d * 4
    assert _rebuilt_extra(cfg) == extra


def test_a_rebuilt_dora_block_under_autocast_peaks_in_the_last_layers_product():
    """GPT-2's mlp.c_proj under bf16 autocast: at B(A(I)) the fp32 identity and its
    16-bit copy, A(I) and B(A(I)) (16-bit), the base output before its bias comes off,
    the GELU's 16-bit output, peft's fp32 cast of it and the MLP's fp32 input are alive;
    its own saved entries made after that moment are not yet."""
    cfg = _cpu_like(SMALL_GPT2, lora_rank=16, recompute="full", precision="bf16", **ALL)
    n, f, d, r = 2 * 64, 256, 64, 16
    alive = (f * f * (4 + 2) + f * r * 2 + f * d * 2 + n * d * 2
             + n * f * 2 + n * f * 4 + n * d * 4)
    # A's 16-bit copy of the input, A(x), B(A(x)), the output less its bias (fp32),
    # the norm, the scale and the scale - 1
    after = n * f * 2 + n * r * 2 + n * d * 2 + n * d * 4 + 3 * d * 4
    assert _rebuilt_extra(cfg) == alive - after


def _cpu_like(data, **knobs):
    return bm.config_from_hf(data, micro_batch=2, seq_len=64, backend="cpu", dora=True,
                             **{**HF, **knobs})


def _rebuilt_extra(cfg) -> int:
    """What the rebuilt block's forward holds beyond what the block saves (the recipes'
    forward transient under checkpointing)."""
    from engine.budget.framework_step import block_saved, checkpoint_kept
    block = block_saved(cfg, "cpu")
    rows = recipes.rows(cfg, recipes.Rows(block, block, [], checkpoint_kept(cfg, "cpu")), "cpu")
    assert not any(x.op.startswith("dora (") for x in rows.block)  # no row: a transient
    return rows.forward_transient


@pytest.mark.parametrize("changes, says", [
    (dict(dora=True), "dora=True describes LoRA adapters, but lora_rank is 0"),
    (dict(modules_to_save="lm_head"), "lora_rank is 0"),
])
def test_a_recipe_over_lora_needs_lora(changes, says):
    with pytest.raises(bm.BudgetError, match=says):
        bm.preset("llama2-7b", **HF, **changes)


ALL = dict(lora_targets="all-linear")
WIDE_LLAMA = {**LLAMA, "hidden_size": 128, "intermediate_size": 352, "vocab_size": 300}
WIDE_GEMMA3 = {**WIDE_LLAMA, "model_type": "gemma3_text", "head_dim": 32,
               "num_key_value_heads": 2, "sliding_window": 512, "query_pre_attn_scalar": 32,
               "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True}
DORA_TABLE = [
    ("gpt2 r64 all-linear, eager", SMALL_GPT2, dict(lora_rank=64, **ALL)),
    ("gpt2 r64 all-linear, lora_dropout, sdpa", SMALL_GPT2,
     dict(lora_rank=64, lora_dropout=0.1, attention="flash", **ALL)),
    ("gpt2 r64 all-linear, checkpointing", SMALL_GPT2, dict(lora_rank=64, recompute="full", **ALL)),
    ("llama gqa r8 q,v, eager", LLAMA, dict(lora_rank=8)),
    ("llama gqa r64 all-linear, sdpa", LLAMA, dict(lora_rank=64, attention="flash", **ALL)),
    ("bf16: llama gqa r64 all-linear, lora_dropout, sdpa", LLAMA,
     dict(lora_rank=64, lora_dropout=0.1, attention="flash", precision="bf16", **ALL)),
    ("bf16: gpt2 r64 all-linear, eager", SMALL_GPT2, dict(lora_rank=64, precision="bf16", **ALL)),
    ("bf16: llama gqa r64 q,v, checkpointing, sdpa", LLAMA,
     dict(lora_rank=64, recompute="full", attention="flash", precision="bf16")),
    ("bf16: llama gqa r64 all-linear, checkpointing, sdpa", LLAMA,
     dict(lora_rank=64, recompute="full", attention="flash", precision="bf16", **ALL)),
    # q, k and v with biases: each keeps its output less the bias, fp32 by promotion
    ("bf16: qwen2 r32 all-linear, sdpa", {**LLAMA, "model_type": "qwen2"},
     dict(lora_rank=32, attention="flash", precision="bf16", qkv_bias=True, **ALL)),
    # wide blocks, a small vocabulary: the peak is the last block's down_proj forward,
    # its identity, B @ A and the weight's norm beside every block's entries
    ("llama gqa r32 all-linear, wide, eager", WIDE_LLAMA, dict(lora_rank=32, **ALL)),
    ("gemma3 r32 all-linear, wide, eager", WIDE_GEMMA3, dict(lora_rank=32, **ALL)),
    # a model loaded in bf16: DoRA casts W to the adapters' fp32 input, a copy the base
    # output made again from the dropped input keeps, and the peak at the weight's norm
    # sits beside the forward's own bf16 hidden states and unkept cache (activations
    # 0.69 and 0.76, peaks 0.73 and 0.79 before)
    ("bf16 weights, no autocast: qwen2 r8 all-linear, lora_dropout, wide, eager",
     {**WIDE_LLAMA, "model_type": "qwen2"},
     dict(lora_rank=8, lora_dropout=0.1, precision="bf16", weights_dtype="bf16",
          autocast_mode="off", **ALL)),
    ("bf16 weights under autocast: llama r8 all-linear, lora_dropout, wide, eager", WIDE_LLAMA,
     dict(lora_rank=8, lora_dropout=0.1, precision="bf16", weights_dtype="bf16", **ALL)),
]
# Checkpointed steps: the peak is inside a block's backward, where the block is rebuilt
# (DoRA's forward transient beside its rows) and walked back op by op
# (engine/budget/block_backward.py) beside the checkpoints still alive and the
# gradients made so far.
DORA_CHECKPOINTED = [
    ("bf16: gpt2 r16 all-linear, checkpointing", SMALL_GPT2,
     dict(lora_rank=16, recompute="full", precision="bf16", **ALL)),
    ("llama gqa r64 all-linear, checkpointing, sdpa", LLAMA,
     dict(lora_rank=64, recompute="full", attention="flash", **ALL)),
]


@needs_peft
@pytest.mark.parametrize("name, data, knobs", [pytest.param(*c, id=c[0])
                                                for c in DORA_TABLE + DORA_CHECKPOINTED])
def test_each_dora_step_matches_peft_on_this_cpu(name, data, knobs):
    assert_cpu_step_as_predicted(_cpu(data, dora=True, **knobs))


# ---------------------------------------------------------- modules_to_save
def test_a_trained_head_copy_is_stored_trained_and_keeps_its_input():
    cfg = bm.preset("llama2-7b", **HF, lora_rank=8, seq_len=256)
    saved = cfg.with_(modules_to_save="lm_head")
    V, d, n = 32000, 4096, 256
    assert [t.name for t in opt.trainable_tensors(saved)][-1] == "lm_head.modules_to_save.weight"
    more = {k: fixed_bytes(saved)[k] - fixed_bytes(cfg)[k] for k in fixed_bytes(cfg)}
    assert more == {"weights": 4 * V * d, "master weights": 0, "gradients": 4 * V * d,
                    "optimizer state": 8 * V * d}
    assert parameter_count(saved) == parameter_count(cfg)  # the model's own count
    # the head's input (the final norm's output, fp32) is kept again
    assert real_step_activations(saved).saved - real_step_activations(cfg).saved == n * d * 4


def test_a_bf16_models_head_copy_is_bf16_beside_fp32_adapters():
    """peft deep-copies the module and casts only the adapters to fp32: over a model
    loaded in bf16 the head's copy, its gradient and AdamW's two states are bf16, half
    of what an fp32 adapter weight of as many elements costs."""
    cfg = bm.preset("llama2-7b", **{**HF, "precision": "bf16"}, lora_rank=8, seq_len=256,
                    weights_dtype="bf16")
    saved = cfg.with_(modules_to_save="lm_head")
    V, d = 32000, 4096
    assert opt.trainable_tensors(saved)[-1].itemsize == 2
    assert {t.itemsize for t in opt.trainable_tensors(saved)[:-1]} == {0}  # the adapters
    more = {k: fixed_bytes(saved)[k] - fixed_bytes(cfg)[k] for k in fixed_bytes(cfg)}
    assert more == {"weights": 2 * V * d, "master weights": 0, "gradients": 2 * V * d,
                    "optimizer state": 4 * V * d}


def test_a_trained_embedding_makes_the_first_block_keep_what_every_block_keeps():
    cfg = bm.preset("llama2-7b", **HF, lora_rank=8, seq_len=256)
    saved = cfg.with_(modules_to_save="embed_tokens")
    assert opt.trainable_tensors(saved)[0].name == "embed_tokens.modules_to_save.weight"
    blocks = [x for x in real_step_activations(saved).items if "first block" in x.op]
    assert blocks == []  # no first block of its own


@pytest.mark.parametrize("changes, says", [
    (dict(modules_to_save="lm_head,norm"), "modules outside the blocks are embed_tokens, lm_head"),
    (dict(modules_to_save="lm_head", tied_embedding=True), "would untie the head"),
    (dict(dora=True, qlora=True), "dora with qlora"),
])
def test_what_the_recipes_cannot_be_is_refused_by_name(changes, says):
    with pytest.raises(bm.BudgetError, match=says):
        bm.preset("llama2-7b", **HF, lora_rank=8, **changes)


MODULES_TABLE = [
    ("llama gqa r8 q,v + lm_head, eager", LLAMA, dict(lora_rank=8, modules_to_save="lm_head")),
    ("llama gqa r8 q,v + embed_tokens, sdpa", LLAMA,
     dict(lora_rank=8, modules_to_save="embed_tokens", attention="flash")),
    ("bf16: llama gqa r8 + both, sdpa", LLAMA,
     dict(lora_rank=8, modules_to_save="lm_head,embed_tokens", precision="bf16",
          attention="flash")),
    ("llama gqa r64 all-linear + lm_head, checkpointing, accumulation 2", LLAMA,
     dict(lora_rank=64, lora_targets="all-linear", modules_to_save="lm_head",
          recompute="full", attention="flash", accumulation=2)),
    ("gpt2 untied r8 + lm_head, wte, dropout", {**SMALL_GPT2, "tie_word_embeddings": False,
                                               "embd_pdrop": 0.1},
     dict(lora_rank=8, modules_to_save="lm_head,wte")),
    # the copies of a model loaded in bf16 are bf16, the adapters fp32 (1.13-1.18 before)
    ("mistral bf16 weights r32 q,v + lm_head, autocast, checkpointing, lora_dropout",
     {**LLAMA, "model_type": "mistral", "sliding_window": 4096, "hidden_size": 128,
      "intermediate_size": 352, "vocab_size": 300},
     dict(lora_rank=32, lora_dropout=0.1, modules_to_save="lm_head", precision="bf16",
          weights_dtype="bf16", recompute="full", outputs="freed-after-backward")),
    ("llama bf16 weights r8 + lm_head and embed_tokens, no autocast", LLAMA,
     dict(lora_rank=8, modules_to_save="lm_head,embed_tokens", precision="bf16",
          weights_dtype="bf16", autocast_mode="off", attention="flash")),
]


@needs_peft
@pytest.mark.parametrize("name, data, knobs", [pytest.param(*c, id=c[0]) for c in MODULES_TABLE])
def test_each_modules_to_save_step_matches_peft_on_this_cpu(name, data, knobs):
    assert_cpu_step_as_predicted(_cpu(data, **knobs))


# ------------------------------------------------------ QLoRA under autocast
def test_qlora_under_bf16_autocast_keeps_the_mlp_in_fp32():
    """Each 4-bit layer hands back its fp32 input's dtype: LLaMA's SiLU keeps an fp32
    input and the product its two fp32 operands, where LoRA keeps bf16 ones."""
    cfg = bm.preset("llama2-7b", **{**HF, "precision": "bf16"}, lora_rank=8, seq_len=256,
                    attention="flash")
    n, f, L = 256, 11008, 32
    quantized = cfg.with_(qlora=True)
    # the frozen matmuls' 16-bit weight copies go (dequantized inside MatMul4Bit)
    copies = sum(x.bytes for x in real_step_activations(cfg).items
                 if x.op.startswith("frozen matmuls"))
    assert copies > 0
    assert (real_step_activations(quantized).saved - real_step_activations(cfg).saved
            == L * 3 * n * f * 2 - copies)


needs_bitsandbytes = pytest.mark.skipif(
    importlib.util.find_spec("bitsandbytes") is None,
    reason="bitsandbytes is not installed (pip install -e '.[lora]')")
BF16 = dict(precision="bf16", qlora=True)
QLORA_TABLE = [
    ("llama gqa r64 q,v, checkpointing (prepare_model_for_kbit_training's default), sdpa",
     LLAMA, dict(lora_rank=64, recompute="full", attention="flash", **BF16)),
    ("llama gqa r64 all-linear, sdpa", LLAMA,
     dict(lora_rank=64, lora_targets="all-linear", attention="flash", **BF16)),
    ("llama gqa r64 q,v, lora_dropout, eager", LLAMA,
     dict(lora_rank=64, lora_dropout=0.1, **BF16)),
    ("gpt2 r64 all-linear, eager", SMALL_GPT2,
     dict(lora_rank=64, lora_targets="all-linear", **BF16)),
    ("gpt2 r64 c_attn, checkpointing, accumulation 2", SMALL_GPT2,
     dict(lora_rank=64, recompute="full", accumulation=2, **BF16)),
]


@needs_peft
@needs_bitsandbytes
@pytest.mark.parametrize("name, data, knobs", [pytest.param(*c, id=c[0]) for c in QLORA_TABLE])
def test_each_bf16_qlora_step_matches_peft_and_bitsandbytes_on_this_cpu(name, data, knobs):
    assert_cpu_step_as_predicted(_cpu(data, **knobs))


def test_the_command_line_takes_the_recipes_flags_and_states_their_defaults(capsys):
    from engine.budget.cli import main
    base = ["--preset", "llama2-7b", "--activations", "hf", "--lora-rank", "8"]
    assert main(base) == 0
    assert "(--dora off, --qlora off, --modules-to-save none)" in capsys.readouterr().out
    assert main(base + ["--lora-targets", "all-linear", "--dora", "on", "--modules-to-save",
                        "lm_head", "--device", "h100", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    cfg = bm.preset("llama2-7b", activation_model="hf", lora_rank=8, lora_targets="all-linear",
                    dora=True, modules_to_save="lm_head")
    assert got["trainable_parameters"] == sum(t.numel for t in opt.trainable_tensors(cfg))


# ------------------------------------------------------- how peft spells each recipe
def test_each_recipe_spells_its_own_peft_option_and_the_lab_reads_them_all():
    """The lab's `LoraConfig` is the applied recipes' options in order, so a new recipe
    over LoRA reaches the measured model from its own module."""
    cfg = bm.preset("llama2-7b", **HF, lora_rank=8, dora=True, modules_to_save="lm_head",
                    lora_targets="all-linear", lora_dropout=0.05)
    assert recipes.peft_options(cfg) == dict(
        r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.05,
        fan_in_fan_out=False, bias="none", task_type="CAUSAL_LM", use_dora=True,
        modules_to_save=["lm_head"])
    plain = recipes.peft_options(bm.preset("gpt2-small", **HF, lora_rank=4))
    assert plain["target_modules"] == ["c_attn"] and plain["fan_in_fan_out"] is True
    assert "use_dora" not in plain and "modules_to_save" not in plain
    assert recipes.peft_options(bm.preset("llama2-7b", **HF)) == {}


def test_a_new_recipes_peft_option_reaches_the_lab_without_an_edit_to_it(monkeypatch):
    from engine.budget.lab import recipe_models
    extra = recipes.Recipe("pissa", lambda cfg: bool(cfg.lora_rank),
                           peft_options=lambda cfg: {"init_lora_weights": "pissa"})
    registry = recipes.registry()
    monkeypatch.setattr(recipes, "registry", lambda: (*registry, extra))
    built = {}

    class FakePeft:  # stands in for peft: records the LoraConfig the lab hands it
        @staticmethod
        def LoraConfig(**options):
            built.update(options)
            return options

        @staticmethod
        def get_peft_model(model, config):
            return model

    monkeypatch.setitem(__import__("sys").modules, "peft", FakePeft)
    recipe_models.peft_model(object(), bm.preset("llama2-7b", **HF, lora_rank=8, dora=True))
    assert built["init_lora_weights"] == "pissa" and built["use_dora"] is True
    assert built["r"] == 8 and built["target_modules"] == ["q_proj", "v_proj"]
