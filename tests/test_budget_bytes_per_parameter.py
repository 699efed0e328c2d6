"""The bytes-per-parameter figure is the recipe's: the whole model's fixed bytes over
every parameter (counts.fixed_bytes_per_parameter), as the command line, the JSON and
the widget's readout print it, for full fine-tuning, LoRA, bf16 weights and QLoRA."""
import pytest

import engine.budget as bm
from engine.budget.counts import fixed_bytes_per_parameter, total_parameter_count
from engine.budget.qlora import NF4_BLOCK, quantized_weights
from widgets import budget_views as W

LLAMA = dict(activation_model="hf")


def _recipe(**changes):
    return bm.preset("llama3.1-8b", **{**LLAMA, **changes})


def _expected(cfg) -> float:
    """Bytes per parameter from the recipe's own rules, counted weight by weight."""
    P, T = bm.parameter_count(cfg), bm.trainable_parameter_count(cfg)
    if not cfg.lora_rank:
        per = 8 if cfg.weights_dtype == "bf16" else 16   # AdamW: 2+2+4 bf16, 4+4+8 fp32
        return per
    frozen = 2 if cfg.weights_dtype == "bf16" else 4
    weights = P * frozen
    if cfg.qlora:
        four_bit = sum(quantized_weights(cfg))
        blocks = sum(-(-n // NF4_BLOCK) for n in quantized_weights(cfg))
        weights = (P - four_bit) * 4 + four_bit / 2 + blocks * 4
    return (weights + T * 16) / (P + T)    # the adapters: fp32, fp32 gradient, AdamW's 8


@pytest.mark.parametrize("recipe, low, high", [
    (dict(), 16, 16),
    (dict(lora_rank=16), 4.0, 4.1),
    (dict(weights_dtype="bf16"), 8, 8),
    (dict(lora_rank=16, weights_dtype="bf16"), 2.0, 2.1),
    (dict(lora_rank=16, qlora=True, precision="fp32"), 0.9, 1.1),
])
def test_the_figure_is_the_recipes(recipe, low, high):
    cfg = _recipe(**recipe)
    figure = fixed_bytes_per_parameter(cfg)
    assert figure == pytest.approx(_expected(cfg), rel=1e-6)
    assert low <= figure <= high
    b = bm.budget(cfg)
    assert b.as_dict()["fixed_bytes_per_parameter"] == figure
    assert sum(b.as_dict()["bytes_per_parameter"].values()) == pytest.approx(figure)
    assert figure * total_parameter_count(cfg) == pytest.approx(sum(b.fixed.values()))


def test_the_command_line_and_the_readout_print_it():
    lora = bm.budget(_recipe(lora_rank=16))
    out = bm.describe(lora)
    assert "(4.01 bytes/param: every weight, the adapters' gradients and optimizer state" in out
    assert "4.01 bytes of fixed memory per parameter" in W.readout_html(lora)
    qlora = bm.budget(_recipe(lora_rank=16, qlora=True, precision="fp32"))
    assert "1.03 bytes/param" in bm.describe(qlora)
    assert "1.03 bytes of fixed memory per parameter" in W.readout_html(qlora)
    full = bm.budget(_recipe())
    assert "(16 bytes/param)" in bm.describe(full)
    assert "16 bytes of fixed memory per parameter" in W.readout_html(full)
    bf16 = bm.budget(_recipe(weights_dtype="bf16"))
    assert "(8 bytes/param)" in bm.describe(bf16)
