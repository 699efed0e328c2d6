"""The presets of open models: each preset's shape is its released config.json's, and
its parameter count the published one. With transformers installed, the count is also
read off the model itself, built on the meta device (no memory) from the same file."""
from __future__ import annotations

import importlib.util

import pytest

import engine.budget as bm

# The fields of each released config.json the budget reads (meta-llama/Llama-3.2-1B,
# Llama-3.2-3B, Llama-3.1-8B, Llama-3.1-70B, Qwen/Qwen2.5-7B, mistralai/Mistral-7B-v0.1,
# google/gemma-2-2b, google/gemma-3-1b-pt)
# and the parameter count its model card publishes.
LLAMA3 = {"model_type": "llama", "vocab_size": 128256, "max_position_embeddings": 131072,
          "num_key_value_heads": 8, "attention_bias": False, "mlp_bias": False}
RELEASED = {
    "llama3.2-1b": ({**LLAMA3, "num_hidden_layers": 16, "hidden_size": 2048,
                     "num_attention_heads": 32, "intermediate_size": 8192, "head_dim": 64,
                     "tie_word_embeddings": True}, 1_235_814_400),
    "llama3.2-3b": ({**LLAMA3, "num_hidden_layers": 28, "hidden_size": 3072,
                     "num_attention_heads": 24, "intermediate_size": 8192, "head_dim": 128,
                     "tie_word_embeddings": True}, 3_212_749_824),
    "llama3.1-8b": ({**LLAMA3, "num_hidden_layers": 32, "hidden_size": 4096,
                     "num_attention_heads": 32, "intermediate_size": 14336,
                     "tie_word_embeddings": False}, 8_030_261_248),
    "llama3.1-70b": ({**LLAMA3, "num_hidden_layers": 80, "hidden_size": 8192,
                      "num_attention_heads": 64, "intermediate_size": 28672,
                      "tie_word_embeddings": False}, 70_553_706_496),
    "qwen2.5-7b": ({"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584,
                    "num_attention_heads": 28, "num_key_value_heads": 4,
                    "intermediate_size": 18944, "vocab_size": 152064,
                    "max_position_embeddings": 131072, "sliding_window": 131072,
                    "use_sliding_window": False, "max_window_layers": 28,
                    "tie_word_embeddings": False}, 7_615_616_512),
    "mistral-7b": ({"model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096,
                    "num_attention_heads": 32, "num_key_value_heads": 8,
                    "intermediate_size": 14336, "vocab_size": 32000,
                    "max_position_embeddings": 32768, "sliding_window": 4096,
                    "tie_word_embeddings": False}, 7_241_732_096),
    "gemma2-2b": ({"model_type": "gemma2", "num_hidden_layers": 26, "hidden_size": 2304,
                   "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                   "intermediate_size": 9216, "vocab_size": 256000,
                   "max_position_embeddings": 8192, "sliding_window": 4096,
                   "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                   "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh"},
                  2_614_341_888),
    "gemma3-1b": ({"model_type": "gemma3_text", "num_hidden_layers": 26, "hidden_size": 1152,
                   "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                   "intermediate_size": 6912, "vocab_size": 262144,
                   "max_position_embeddings": 32768, "sliding_window": 512,
                   "sliding_window_pattern": 6, "query_pre_attn_scalar": 256,
                   "hidden_activation": "gelu_pytorch_tanh"}, 999_885_952),
}
SHAPE = ("architecture", "model_type", "n_layer", "d_model", "n_head", "kv_heads", "head_dim",
         "ffn", "vocab_size", "block_size", "tied_embedding", "qkv_bias", "qk_norm",
         "sliding_window")


def test_every_open_model_is_a_preset():
    assert set(RELEASED) <= set(bm.PRESET_NAMES)


@pytest.mark.parametrize("name", RELEASED)
def test_each_preset_counts_its_published_parameters(name):
    assert bm.parameter_count(bm.preset(name)) == RELEASED[name][1]


@pytest.mark.parametrize("name", RELEASED)
def test_each_preset_has_the_shape_its_config_json_gives(name):
    data, count = RELEASED[name]
    from_file, ours = bm.config_from_hf(data), bm.preset(name)
    assert {k: getattr(ours, k) for k in SHAPE} == {k: getattr(from_file, k) for k in SHAPE}
    assert bm.parameter_count(from_file) == count


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("torch", "transformers")),
                    reason="torch and transformers are not installed (pip install -e "
                           "'.[transformers]'); the published counts are checked without them")
@pytest.mark.parametrize("name", RELEASED)
def test_transformers_builds_each_released_config_with_the_published_count(name):
    import torch
    import transformers
    data, count = RELEASED[name]
    from engine.budget.lab.torch_step import CONFIG_CLASS, LLAMA_FAMILY
    family = LLAMA_FAMILY[data["model_type"]]
    config = getattr(transformers, CONFIG_CLASS.get(family, f"{family}Config"))(
        **{k: v for k, v in data.items() if k != "model_type"})
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        model = getattr(transformers, f"{family}ForCausalLM")(config)
    assert sum(p.numel() for p in model.parameters()) == count
