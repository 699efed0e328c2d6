"""The page's defaults describe the step practitioners run: SDPA for a real framework's
step, a model of your own at a fine-tune's length with its context bounding the longest
sequence, gradient checkpointing offered with its peak where activations are most of the
peak; and an error offers only the settings it names as settings."""
from __future__ import annotations

import json
import pytest

from engine import budget as bm
from engine.budget.counts import fixed_bytes_per_parameter
from engine.budget.report import per_parameter as per_parameter_figure

from budget_page_tools import ROOT

pytest.importorskip("starlette", reason="the budget page needs the extra 'page'")
from widgets.budget_page import answers, settings  # noqa: E402

LLAMA_FILE = ROOT / "tests" / "fixtures" / "llama2_7b_config.json"
GPT2_FILE = ROOT / "tests" / "fixtures" / "gpt2_config.json"
# Llama 3.1 8B's config.json, the fields the budget reads
LLAMA_31_8B = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
               "num_attention_heads": 32, "num_key_value_heads": 8,
               "intermediate_size": 14336, "vocab_size": 128256,
               "max_position_embeddings": 131072, "tie_word_embeddings": False}


def config_of(**params) -> tuple[bm.BudgetConfig, str]:
    return settings.config_from_params({k: str(v) for k, v in params.items()})


def test_a_real_frameworks_step_runs_sdpa_by_default():
    assert config_of(preset="llama2-7b")[0].attention == "flash"
    assert config_of(config=LLAMA_FILE.read_text())[0].attention == "flash"
    assert config_of(preset="tiny")[0].attention == "standard"  # the engine's own step
    cfg, query = config_of(preset="llama2-7b", attention="standard")  # still a choice
    assert cfg.attention == "standard" and "attention=standard" in query


def test_a_pasted_model_keeps_a_fine_tunes_length_and_its_context_bounds_the_longest():
    cfg, query = config_of(config=json.dumps(LLAMA_31_8B), device="H200-141GB")
    assert cfg.seq_len == settings.MODEL_SEQ_LEN == 2048 and cfg.block_size == 131072
    assert "seq_len" not in query  # the model's start
    assert bm.budget(cfg).device.longest_sequence <= 131072
    small, _ = config_of(config=GPT2_FILE.read_text(), device="H200-141GB")
    assert small.seq_len == 1024  # its whole context is shorter than 2048
    assert bm.budget(small).device.longest_sequence == 1024  # fits more, bounded by it
    kept, query = config_of(config=json.dumps(LLAMA_31_8B), seq_len=512)  # the page's N
    assert kept.seq_len == 512 and "seq_len=512" in query


def test_gradient_checkpointing_is_offered_with_its_peak_where_activations_dominate():
    cfg, _ = config_of(preset="gpt2-small", micro_batch=32, device="rtx-4090")
    b = bm.budget(cfg)
    assert 2 * b.memory()["activations"] > b.peak
    full = bm.budget(cfg.with_(recompute="full")).device
    offer = answers.checkpointing_html(b)
    said = answers.plain_text(offer)
    assert said == (f"turn on gradient checkpointing: {bm.human_bytes(full.peak)}, "
                    f"{'fits' if full.fits else 'does not fit'}.")
    assert "data-knob='recompute' data-value='full'" in offer
    assert said in answers._panels(cfg)["verdict"]
    assert answers.checkpointing_html(bm.budget(cfg.with_(recompute="full"))) == ""
    assert answers.checkpointing_html(bm.budget(cfg.with_(device="none"))) == ""
    few, _ = config_of(config=GPT2_FILE.read_text())  # activations 41% of the peak
    assert answers.checkpointing_html(bm.budget(few)) == ""


def test_an_error_offers_only_the_settings_it_names_as_settings():
    olmo = dict(LLAMA_31_8B, model_type="olmo2")
    with pytest.raises(bm.BudgetError) as error:
        config_of(config=json.dumps(olmo))
    prose = f"{error.value} Its attention core differs."
    assert "attention" in prose  # a word of the sentence ...
    assert "attention" not in settings.named_knobs(prose)  # ... not a setting
    assert settings.named_knobs("zero=7 is unknown") == ["zero"]
    assert set(settings.named_knobs("with activation_model='pytorch' set architecture "
                                    "'gpt2'")) == {"architecture", "activation_model"}
    assert settings.named_knobs("use seq_len <= 1024") == ["seq_len"]


@pytest.mark.parametrize("card, mib", [("L4", 23_034), ("H100-80GB-SXM", 81_559),
                                       ("H200-141GB", 143_771), ("RTX-4090", 24_564),
                                       ("A10G", 23_028), ("L40S", 46_068)])
def test_a_card_holds_the_memory_nvidia_smi_reports(card, mib):
    assert bm.DEVICES[card].memory == mib * 2**20
    cfg, _ = config_of(preset="gpt2-small", device=card)
    assert f"of {bm.human_bytes(mib * 2**20)}" in answers._panels(cfg)["verdict"]


@pytest.mark.parametrize("recipe", [{}, {"lora_rank": 16}, {"lora_rank": 16,
                                                              "weights_dtype": "bf16"}])
def test_the_small_print_gives_the_budgets_own_bytes_per_parameter(recipe):
    cfg, _ = config_of(preset="llama2-7b", **recipe)
    said = answers._panels(cfg)["readout"]
    per = per_parameter_figure(fixed_bytes_per_parameter(cfg))
    assert f"{per} bytes of fixed memory per parameter" in said
    assert recipe == {} or "16 bytes of fixed memory" not in said
