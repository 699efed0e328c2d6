"""QLoRA (peft's LoRA over bitsandbytes' 4-bit weights): what storing the frozen
model's linear layers in 4 bits changes in LoRA's step.

The blocks' linear weights are bitsandbytes' 4-bit NF4, two weights a byte and an
fp32 absmax per block of 64 (the embeddings, norms and output head stay as loaded).
Its matmul (`MatMul4Bit`) keeps only the packed weight, already resident, and
dequantizes it in the backward, so a frozen 4-bit layer keeps no input as a frozen
fp32 one, and under autocast no 16-bit copy of its weight either (the rows LoRA
gives the frozen matmuls' weight copies go). Modelled in an fp32 step (the 4-bit
layers compute in bf16 and return fp32), measured on the CPU through bitsandbytes'
PyTorch fallback (`tests/test_budget_lora.py`).
"""
from __future__ import annotations

from .linears import BLOCK_LINEARS, width
from .recipes import Recipe, Rows
from .weights_dtype import frozen_weight_bytes

FP32 = 4
NF4_BLOCK = 64  # bitsandbytes' 4-bit blocksize: one fp32 absmax per 64 weights
# LoRA's row of the frozen matmuls' 16-bit weight copies (`lora.weight_copies`)
FROZEN_COPIES = "frozen matmuls"


def quantized_weights(cfg) -> list[int]:
    """Element counts of the weights QLoRA stores in 4 bits: every block's linear
    layers (transformers leaves the embeddings and the output head unquantized)."""
    if not cfg.qlora:
        return []
    one = [width(cfg, l.fan_in) * width(cfg, l.fan_out) for l in BLOCK_LINEARS[cfg.architecture]]
    return one * cfg.n_layer


def quantized_bytes(cfg) -> int:
    """Bytes of the 4-bit weights: two per byte, and an fp32 absmax per block of 64."""
    return sum((n + 1) // 2 + -(-n // NF4_BLOCK) * FP32 for n in quantized_weights(cfg))


def rows(cfg, base: Rows, rows: Rows, device: str) -> Rows:
    """A 4-bit weight is dequantized inside its matmul: no frozen matmul keeps a copy."""
    def drop(items):
        return [x for x in items if x.op != FROZEN_COPIES]
    return Rows(drop(rows.block), drop(rows.first), rows.outside, rows.checkpointed)


def fixed(cfg, fixed: dict, per_parameter: dict, parameters: int, trained: int) -> dict:
    """The blocks' linear weights in 4 bits instead of the dtype they were loaded in."""
    stored = quantized_bytes(cfg) - sum(quantized_weights(cfg)) * frozen_weight_bytes(cfg)
    return {**fixed, "weights": fixed["weights"] + stored}


RECIPE = Recipe("qlora", lambda cfg: bool(cfg.qlora), rows=rows, fixed=fixed)


def quantized(model):
    """`model` loaded back with its linear layers in bitsandbytes' 4-bit NF4, as
    QLoRA's recipes load it (`BitsAndBytesConfig(load_in_4bit=True,
    bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)`)."""
    import tempfile

    import torch
    from transformers import BitsAndBytesConfig
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                           bnb_4bit_compute_dtype=torch.bfloat16)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        return type(model).from_pretrained(
            folder, quantization_config=q, device_map="cpu",
            attn_implementation=model.config._attn_implementation)


