"""The config's own switches, padded batches and the LLaMA family under the "hf"
step: what each config.json says (torch-free), and measured against transformers
on this CPU term by term (skipped without torch and transformers)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import engine.budget as bm
from engine.budget.hf import config_and_sources
from engine.budget import real_step_activations
from engine.budget.real_step import block_saved, keeps_kv_cache, kv_cache_unsaved_bytes, outside_saved

FIXTURES = Path(__file__).parent / "fixtures"
GPT2 = json.loads((FIXTURES / "gpt2_config.json").read_text())
# The released config.json files' fields (Qwen/Qwen2.5-0.5B, Qwen/Qwen3-0.6B,
# mistralai/Mistral-7B-v0.1), with their published parameter counts.
QWEN2 = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
         "max_position_embeddings": 32768, "max_window_layers": 24, "num_attention_heads": 14,
         "num_hidden_layers": 24, "num_key_value_heads": 2, "sliding_window": 32768,
         "tie_word_embeddings": True, "use_cache": True, "use_sliding_window": False,
         "vocab_size": 151936, "attention_dropout": 0.0}
QWEN3 = {"model_type": "qwen3", "attention_bias": False, "head_dim": 128, "hidden_size": 1024,
         "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
         "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
         "sliding_window": None, "tie_word_embeddings": True, "use_cache": True,
         "use_sliding_window": False, "vocab_size": 151936, "attention_dropout": 0.0}
MISTRAL = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
           "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32,
           "num_key_value_heads": 8, "sliding_window": 4096, "tie_word_embeddings": False,
           "use_cache": True, "vocab_size": 32000}
HF = dict(activation_model="hf")


def whats(items) -> set[str]:
    return {f"{x.op}: {x.tensor}" for x in items}


# ------------------------------------------------------- the config's switches
def test_a_released_gpt2_config_turns_dropout_on_and_says_where_from():
    cfg, sources = config_and_sources(GPT2, **HF)
    assert cfg.dropout is True
    assert sources["dropout"].where == "file"
    assert "resid_pdrop 0.1, embd_pdrop 0.1, attn_pdrop 0.1" in str(sources["dropout"])
    off, sources = config_and_sources(GPT2, **HF, dropout=False)
    assert off.dropout is False and str(sources["dropout"]) == "flag: --dropout"
    # the file says nothing: transformers' GPT2Config default, 0.1 at each site
    silent = {k: v for k, v in GPT2.items() if not k.endswith("pdrop")}
    cfg, sources = config_and_sources(silent, **HF)
    assert cfg.dropout is True and sources["dropout"].where == "default"


def test_gpt2_pdrops_that_differ_are_counted_as_all_on_and_the_source_says_so():
    cfg, sources = config_and_sources({**GPT2, "attn_pdrop": 0.0}, **HF)
    assert cfg.dropout is True
    assert "every GPT-2 dropout site is counted as on" in str(sources["dropout"])
    assert not config_and_sources({**GPT2, "attn_pdrop": 0, "resid_pdrop": 0,
                                   "embd_pdrop": 0}, **HF)[0].dropout


def test_the_files_use_cache_decides_the_cache_and_a_flag_overrides_it():
    cfg, sources = config_and_sources({**GPT2, "use_cache": False}, **HF)
    assert cfg.use_cache == "off" and not keeps_kv_cache(cfg)
    assert str(sources["use_cache"]) == "file: use_cache false"
    cfg, sources = config_and_sources(GPT2, **HF)
    assert keeps_kv_cache(cfg) and sources["use_cache"].where == "default"
    cfg, sources = config_and_sources({**GPT2, "use_cache": False}, **HF, use_cache="on")
    assert keeps_kv_cache(cfg) and sources["use_cache"].where == "flag"
    # gradient checkpointing turns the cache off in training (merge_with_config_defaults)
    assert not keeps_kv_cache(cfg.with_(recompute="full"))


def test_the_textbook_models_take_the_files_dropout_but_no_cache():
    cfg, sources = config_and_sources(GPT2)
    assert cfg.dropout and "use_cache" not in sources
    engine = config_and_sources({**GPT2, "n_embd": 128, "n_head": 4, "n_layer": 2},
                                activation_model="engine", seq_len=128)[0]
    assert engine.dropout is False


def test_without_a_cache_gpt2_under_sdpa_keeps_no_concatenated_k_and_v():
    cfg = config_and_sources(GPT2, **HF, attention="flash", seq_len=1024)[0]
    off = cfg.with_(use_cache="off")
    n, k, L = 1024, 768, 12
    assert (real_step_activations(cfg).saved - real_step_activations(off).saved
            == L * 2 * n * k * 2)


@pytest.mark.parametrize("attention", ["standard", "flash"])
def test_llamas_only_dropout_is_attention_dropout(attention):
    cfg = bm.preset("llama2-7b", **HF, attention=attention, dropout=True, seq_len=512)
    kept = whats(block_saved(cfg) + outside_saved(cfg))
    assert not any("residual dropout" in w or "embedding dropout" in w for w in kept)
    gpt2 = whats(outside_saved(bm.preset("gpt2-small", **HF, dropout=True)))
    assert "embedding dropout: mask" in gpt2


# ------------------------------------------------------------- padded batches
def test_a_padded_batch_under_sdpa_keeps_each_layers_mask_and_repeats_grouped_k_and_v():
    cfg = bm.preset("llama2-70b", **HF, attention="flash", seq_len=1024, dropout=False)
    padded = cfg.with_(padded_batch=True)
    n, q, k, L = 1024, 8192, 1024, 80
    mask = L * 1024 * 1024 * 2                 # B x T x T in bf16 per layer
    repeat = L * 2 * n * (q - k) * 2           # K and V to all 64 heads instead of 8
    assert real_step_activations(padded).saved - real_step_activations(cfg).saved == (
        mask + repeat)
    # the cache's K and V copies are no longer what attention keeps
    assert kv_cache_unsaved_bytes(padded) == L * n * k * (4 + 2)
    assert kv_cache_unsaved_bytes(padded.with_(use_cache="off")) == 0


def test_a_padded_batch_costs_eager_attention_nothing():
    """transformers builds eager attention's float mask with or without padding."""
    cfg = bm.preset("llama2-70b", **HF, attention="standard", seq_len=512)
    assert (real_step_activations(cfg.with_(padded_batch=True)).saved
            == real_step_activations(cfg).saved)


# ----------------------------------------------------------- the LLaMA family
@pytest.mark.parametrize("data, count, traits", [
    (QWEN2, 494_032_768, dict(qkv_bias=True, qk_norm=False, sliding_window=0)),
    (QWEN3, 596_049_920, dict(qkv_bias=False, qk_norm=True, sliding_window=0, d_head=128)),
    (MISTRAL, 7_241_732_096, dict(qkv_bias=False, qk_norm=False, sliding_window=4096)),
])
def test_llama_shaped_configs_are_read_with_their_traits_and_published_counts(
        data, count, traits):
    cfg = bm.config_from_hf(data)
    assert cfg.architecture == "llama" and cfg.model_type == data["model_type"]
    assert bm.parameter_count(cfg) == count
    for knob, value in traits.items():
        assert getattr(cfg, knob) == value, knob


def test_qwen3s_head_size_defaults_to_its_config_classs_128():
    cfg = bm.config_from_hf({k: v for k, v in QWEN3.items() if k != "head_dim"})
    assert cfg.head_dim == 128 and cfg.q_width == 16 * 128


def test_mistrals_window_changes_the_step_only_from_its_length():
    short, sources = config_and_sources(MISTRAL, **HF, attention="flash", seq_len=2048)
    assert "hides no key" in str(sources["sliding_window"])
    plain = short.with_(sliding_window=0)
    assert real_step_activations(short).saved == real_step_activations(plain).saved
    long, sources = config_and_sources(MISTRAL, **HF, attention="flash", seq_len=4096)
    assert "keeps a float copy of it" in str(sources["sliding_window"])
    assert (real_step_activations(long).saved
            > real_step_activations(long.with_(sliding_window=0)).saved)


def test_qwen3s_q_and_k_norms_are_kept_per_head():
    cfg = bm.config_from_hf(QWEN3, **HF, seq_len=256)
    norms = [x for x in block_saved(cfg) if x.op in ("q_norm", "k_norm")]
    n = 256
    assert sum(x.bytes for x in norms) == (n * 16 * 128 * (4 + 2) + n * 16 * 4
                                          + n * 8 * 128 * (4 + 2) + n * 8 * 4)




def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine.budget", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("data", [QWEN2, MISTRAL, QWEN3], ids=["qwen2", "mistral", "qwen3"])
def test_arch_llama_agrees_with_every_llama_shaped_file(tmp_path, data):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    agrees = _cli("--hf-config", str(path), "--arch", "llama", "--json")
    assert agrees.returncode == 0, agrees.stderr
    alone = _cli("--hf-config", str(path), "--json")
    assert json.loads(agrees.stdout)["memory"] == json.loads(alone.stdout)["memory"]
    refused = _cli("--hf-config", str(path), "--arch", "gpt2")
    assert refused.returncode == 2 and "contradicts" in refused.stderr


def test_the_command_line_says_where_the_files_switches_came_from():
    path = str(FIXTURES / "gpt2_config.json")
    text = _cli("--hf-config", path, "--activations", "hf").stdout
    assert f"read from {path}:" in text
    assert "dropout        file: resid_pdrop 0.1" in text
    assert "use_cache      default: transformers' use_cache true" in text
    data = json.loads(_cli("--hf-config", path, "--activations", "hf", "--dropout", "off",
                           "--json").stdout)
    assert data["config_sources"]["dropout"] == "flag: --dropout"
    assert json.loads(_cli("--preset", "tiny", "--json").stdout)["config_sources"] == {}


@pytest.mark.parametrize("kind, says", [
    ("mixtral", "mixture-of-experts"),
    ("olmo2", "q/k norms over the whole width"),
    ("phi3", "fused q/k/v"),
    ("falcon", "the families read are gpt2, llama, qwen2, mistral, qwen3"),
])
def test_other_model_types_are_refused_naming_what_differs(kind, says):
    with pytest.raises(bm.BudgetError, match=f'"model_type": "{kind}" is not read here') as e:
        bm.config_from_hf({**QWEN2, "model_type": kind})
    assert says in str(e.value)


@pytest.mark.parametrize("data, says", [
    ({**QWEN2, "use_sliding_window": True, "max_window_layers": 12}, "all sliding or none"),
    ({**QWEN3, "attention_bias": "yes"}, '"attention_bias": "yes" must be true or false'),
    ({**QWEN2, "model_type": "llama", "mlp_bias": 1}, '"mlp_bias": 1 must be true or false'),
    ({**GPT2, "resid_pdrop": "0.1"}, "not a dropout probability"),
    ({**GPT2, "use_cache": "yes"}, "must be true or false"),
])
def test_what_a_family_read_here_lacks_is_refused_by_name(data, says):
    with pytest.raises(bm.BudgetError, match=says):
        bm.config_from_hf(data)


LLAMA_BIASED = {**QWEN2, "model_type": "llama", "attention_bias": True, "mlp_bias": True}


def test_llamas_attention_and_mlp_biases_are_read_and_counted():
    cfg = bm.config_from_hf(LLAMA_BIASED)
    plain = bm.config_from_hf({**LLAMA_BIASED, "attention_bias": False, "mlp_bias": False})
    assert cfg.attention_bias and cfg.mlp_bias and not cfg.qkv_bias
    d, f, q, kv, L = 896, 4864, 896, 2 * 64, 24
    assert bm.parameter_count(cfg) - bm.parameter_count(plain) == L * (q + 2 * kv + d
                                                                      + 2 * f + d)
    from engine.budget.optimizer_step import parameter_tensors
    tensors = parameter_tensors(cfg)
    assert sum(t.numel for t in tensors) == bm.parameter_count(cfg)
    assert {t.name for t in tensors if t.name.startswith("layers.0.") and "bias" in t.name} == {
        f"layers.0.{m}.bias" for m in ("self_attn.q_proj", "self_attn.k_proj",
                                       "self_attn.v_proj", "self_attn.o_proj",
                                       "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    assert not any(t.decays for t in tensors if t.name.endswith(".bias"))
    # Qwen3's class has attention_bias only (on q, k, v and o)
    qwen3 = bm.config_from_hf({**QWEN3, "attention_bias": True})
    assert bm.parameter_count(qwen3) - 596_049_920 == 28 * (16 * 128 + 2 * 8 * 128 + 1024)


def test_a_bias_keeps_nothing_for_the_backward_but_its_autocast_copy():
    """addmm's backward reads its two matrices, not the bias (saved-tensor hooks
    count the same bytes with and without them); under autocast the bias's 16-bit
    cast is cached beside the weights'."""
    hf = dict(**HF, seq_len=512, attention="flash")
    cfg = bm.config_from_hf(LLAMA_BIASED, **hf, precision="fp32")
    plain = bm.config_from_hf({**LLAMA_BIASED, "attention_bias": False, "mlp_bias": False},
                              **hf, precision="fp32")
    assert real_step_activations(cfg).saved == real_step_activations(plain).saved
    from engine.budget.real_step import block_biases
    assert block_biases(cfg) == 896 + 2 * 128 + 896 + 2 * 4864 + 896


def test_the_bias_switches_are_flags_of_the_command_line():
    plain = json.loads(_cli("--preset", "llama2-7b", "--json").stdout)["parameters"]
    both = _cli("--preset", "llama2-7b", "--attention-bias", "on", "--mlp-bias", "on", "--json")
    assert both.returncode == 0, both.stderr
    L, d, f = 32, 4096, 11008
    assert json.loads(both.stdout)["parameters"] - plain == L * (4 * d + 2 * f + d)
    refused = _cli("--preset", "gpt2-small", "--mlp-bias", "on")
    assert refused.returncode == 2 and "--mlp-bias True is a trait of LLaMA-shaped" in (
        refused.stderr)


def test_qwen2_sliding_every_layer_is_read_as_a_window():
    cfg = bm.config_from_hf({**QWEN2, "use_sliding_window": True, "max_window_layers": 0,
                             "sliding_window": 1024})
    assert cfg.sliding_window == 1024


# ------------------------------------------- measured with transformers here
needs_transformers = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "transformers")),
    reason="torch and transformers are not installed (pip install -e '.[transformers]')")


def _small(data: dict) -> dict:
    """A config.json of the same family, shrunk to seconds on a CPU."""
    if data["model_type"] == "gpt2":
        return {**data, "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000,
                "n_positions": 128}
    return {**data, "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 160, "vocab_size": 1000,
            "max_position_embeddings": 128, "head_dim": 32 if "head_dim" in data else None}


# (name, the config.json, the knobs the practitioner sets); every case is a file
# read by hf.py, so the file's switches are what the step runs with.
CPU_TABLE = [
    ("released gpt2 (dropout 0.1), eager", GPT2, dict(attention="standard")),
    ("released gpt2 (dropout 0.1), sdpa", GPT2, dict(attention="flash")),
    ("llama attention_dropout 0.1, eager", {**QWEN2, "model_type": "llama",
                                            "attention_dropout": 0.1}, dict(attention="standard")),
    ("gpt2 use_cache false, sdpa", {**GPT2, "use_cache": False, "resid_pdrop": 0,
                                    "embd_pdrop": 0, "attn_pdrop": 0}, dict(attention="flash")),
    ("gpt2 padded, sdpa", {**GPT2, "resid_pdrop": 0, "embd_pdrop": 0, "attn_pdrop": 0},
     dict(attention="flash", padded_batch=True)),
    ("llama gqa padded, sdpa", {**QWEN2, "model_type": "llama"},
     dict(attention="flash", padded_batch=True)),
    ("llama gqa padded, eager", {**QWEN2, "model_type": "llama"},
     dict(attention="standard", padded_batch=True)),
    ("qwen2, sdpa", QWEN2, dict(attention="flash")),
    ("mistral window 32 <= seq 64, sdpa", {**MISTRAL, "sliding_window": 32},
     dict(attention="flash")),
    ("mistral window 65 > seq 64, sdpa", {**MISTRAL, "sliding_window": 65},
     dict(attention="flash")),
    ("qwen3, sdpa", QWEN3, dict(attention="flash")),
    ("qwen3, eager, batch 4 x 32", QWEN3, dict(attention="standard", micro_batch=4,
                                               seq_len=32)),
    ("llama attention and mlp biases, eager", LLAMA_BIASED, dict(attention="standard")),
    ("llama attention and mlp biases, sdpa, checkpointed", LLAMA_BIASED,
     dict(attention="flash", recompute="full")),
    ("llama attention and mlp biases, sdpa, bf16 autocast", LLAMA_BIASED,
     dict(attention="flash", precision="bf16", backend="cpu")),
    ("qwen3 attention_bias, eager, bf16 autocast", {**QWEN3, "attention_bias": True},
     dict(attention="standard", precision="bf16", backend="cpu")),
]


@needs_transformers
@pytest.mark.parametrize("name, data, knobs", CPU_TABLE, ids=[c[0] for c in CPU_TABLE])
def test_each_family_and_switch_matches_transformers_on_this_cpu(name, data, knobs):
    from engine.budget.lab.torch_step import measure_step
    start = dict(micro_batch=2, seq_len=64, precision="fp32", optimizer_impl="for-loop", **HF)
    cfg = bm.config_from_hf(_small(data), **{**start, **knobs})
    m = measure_step(cfg, device="cpu")
    assert m.config == cfg, "the CPU ran another step than the one predicted"
    acts = real_step_activations(cfg, device="cpu")
    assert m.weights == bm.fixed_bytes(cfg)["weights"]
    assert acts.saved == pytest.approx(m.activations, rel=0.05)
    assert bm.budget(cfg).fixed_total + acts.peak == pytest.approx(m.peak, rel=0.05)
    assert acts.step.first_step_peak_moment.bytes == pytest.approx(m.peak_first_step, rel=0.05)
