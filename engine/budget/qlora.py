"""QLoRA (peft's LoRA over bitsandbytes' 4-bit weights): what storing the frozen
model's linear layers in 4 bits changes in LoRA's step, as practitioners load it:
`BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
bnb_4bit_compute_dtype=torch.bfloat16)`, then `prepare_model_for_kbit_training`, then
peft's adapters, trained in fp32 or under bf16 autocast (the Trainer's `bf16=True`).

1. The blocks' linear weights are bitsandbytes' 4-bit NF4, two weights a byte and an
   fp32 absmax per block of 64. `prepare_model_for_kbit_training` casts every other
   parameter (embeddings, norms, the output head) to fp32, whatever dtype the model
   was loaded in: the budget's fp32 weights.
2. `Linear4bit.forward` casts its input to the compute dtype (bf16), multiplies
   (`MatMul4Bit`, which keeps only the packed weight, already resident, and
   dequantizes it in the backward) and casts the output back to the input's dtype.
   So a frozen 4-bit layer keeps no input, as a frozen fp32 one, and under autocast
   no 16-bit copy of its weight either (the rows LoRA gives the frozen matmuls'
   weight copies go).
3. Under autocast a 4-bit layer's input is fp32 (a norm's output, the residual
   stream), so its output is fp32 where autocast's matmul makes 16 bits: the MLP's
   elementwise ops between the up-projections and the down-projection (LLaMA's SiLU
   and Gemma's GELU and their products, GPT-2's GELU written as five ops) keep fp32
   tensors. Attention keeps what LoRA's does: rotary's fp32 Q and K, and the 16-bit
   copies SDPA and eager attention's matmuls make, are the same bytes; but GPT-2's
   dropouts read fp32 where LoRA's read 16 bits (attention's P cast to V's dtype,
   the MLP's c_proj output), and a CPU dropout's mask takes its input's dtype.

Measured on the CPU through bitsandbytes' PyTorch fallback (`tests/test_budget_lora.py`,
`tests/test_budget_recipes_lora.py`); the same ops run on CUDA (an assumption there:
no GPU measured it, and CUDA's autocast already runs GELU's pow in fp32).
"""
from __future__ import annotations

from dataclasses import replace

from .block_backward import PROJECTION_INPUT, WEIGHT_COPIES, input_op
from .gemma import norms_around
from .linears import BLOCK_LINEARS, OUTPUT_PROJECTIONS, width
from .real_step import MLP_ELEMENTWISE, mask_bytes
from .recipe import Recipe, Rows
from .weights_dtype import frozen_weight_bytes

FP32 = 4
BF16 = 2  # bnb_4bit_compute_dtype
NF4_BLOCK = 64  # bitsandbytes' 4-bit blocksize: one fp32 absmax per 64 weights
GPT2_DROPOUTS_AFTER_4BIT = ("attention dropout", "residual dropout (mlp)")
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


def _rewritten(cfg, items: list, device: str) -> list:
    """No frozen matmul keeps a weight copy; under autocast the MLP's elementwise ops
    read a 4-bit layer's fp32 output where LoRA's read a 16-bit one, and so do GPT-2's
    dropouts after a 4-bit layer: attention's, on P cast to V's dtype (fp32: c_attn's
    output), and the MLP's, on c_proj's output (its input, the GELU's, is fp32); a CPU
    dropout's mask takes its input's dtype."""
    fp32_mask = mask_bytes(cfg, device, FP32)
    out = []
    for x in items:
        if x.op == FROZEN_COPIES:
            continue
        if cfg.autocast and x.op in MLP_ELEMENTWISE:
            x = replace(x, itemsize=FP32)
        if cfg.autocast and x.op in GPT2_DROPOUTS_AFTER_4BIT and x.tensor == "mask":
            x = replace(x, itemsize=fp32_mask)
        out.append(x)
    return out


def _layer_forward(cfg, layer) -> int:
    """What a 4-bit layer's forward holds at its matmul beyond what the block saves:
    its input cast to the compute dtype (bf16; an input already in 16 bits, attention's
    output under autocast, is used as it is), the weight dequantized to it
    (`dequantize_4bit`, freed when the matmul returns) and the product in bf16, before
    it is cast back to the input's dtype."""
    n = cfg.micro_batch * cfg.seq_len
    fan_in, fan_out = width(cfg, layer.fan_in), width(cfg, layer.fan_out)
    cast = 0 if cfg.autocast and layer.reads == "projection matmul" else n * fan_in * BF16
    return cast + fan_in * fan_out * BF16 + n * fan_out * BF16


def _forward_transient(cfg, base: list) -> int:
    """The most a block's forward holds in a 4-bit layer beyond the block's rows: each
    layer's `_layer_forward`, less the rows the block saves after that layer (read off
    the full fine-tune's rows `base`, where every layer's input has its row)."""
    ops = [x.op for x in base]
    best = 0
    for layer in BLOCK_LINEARS[cfg.architecture]:
        reads = input_op(layer, ops)
        if reads is None:
            continue
        last = len(ops) - 1 - ops[::-1].index(reads)
        later = sum(x.bytes for x in base[last + 1:] if x.op not in WEIGHT_COPIES)
        best = max(best, _layer_forward(cfg, layer) - later)
    return best


def _layer_backwards(cfg, base: list) -> tuple:
    """What each 4-bit layer's backward holds beyond the rows saved before it, as
    (the op whose rows come before the layer, bytes). Beside the gradient of the
    layer's output (in the input's dtype, and its bf16 cast), `MatMul4Bit.backward`
    computes `grad_output @ dequantize_4bit(W).to(bf16)`: the weight dequantized to the
    dtype it was quantized from (the dtype the model was loaded in) and its bf16 cast
    are alive at once (one tensor when that dtype is bf16), then the cast and the bf16
    gradient of the input; an fp32 input's cast then hands back an fp32 gradient
    beside the bf16 one. The largest of the three counts. An output projection that
    writes the residual stream as it is (no dropout, no norm after it) is handed the
    stream's gradient, which the block's moments count already. Read off the full
    fine-tune's rows `base`, where every layer's input has its row."""
    n, ops = cfg.micro_batch * cfg.seq_len, [x.op for x in base]
    # GPT-2's residual dropout and Gemma 2 and 3's norms come between
    into_stream = not norms_around(cfg) and not (cfg.architecture == "gpt2" and cfg.dropout)
    found = []
    for layer in BLOCK_LINEARS[cfg.architecture]:
        fan_in, fan_out = width(cfg, layer.fan_in), width(cfg, layer.fan_out)
        reads = input_op(layer, ops)
        if reads is None:
            continue
        # the op before the row of the layer's input; SDPA's own, whose output it reads
        before = reads if reads == PROJECTION_INPUT else ops[ops.index(reads) - 1]
        # the output is cast back to the input's dtype: bf16 for attention's output
        # under autocast (its gradient needs no cast then), fp32 for the others
        sixteen = cfg.autocast and layer.reads == "projection matmul"
        stream = into_stream and layer.reads in OUTPUT_PROJECTIONS
        grad_out = n * fan_out * (BF16 if sixteen else BF16 if stream else FP32 + BF16)
        loaded = fan_in * fan_out * frozen_weight_bytes(cfg)
        cast = 0 if frozen_weight_bytes(cfg) == BF16 else fan_in * fan_out * BF16
        grad_in = n * fan_in * BF16
        grad_in_fp32 = 0 if sixteen else n * fan_in * FP32
        found.append((before, grad_out + max(loaded + cast, loaded + grad_in if not cast
                                             else cast + grad_in, grad_in + grad_in_fp32)))
    return tuple(found)


def rows(cfg, base: Rows, rows: Rows, device: str) -> Rows:
    """Each block's rows as the 4-bit layers change them (see the module's doc), and
    what a 4-bit layer's forward and backward hold beyond them."""
    return replace(rows, block=_rewritten(cfg, rows.block, device),
                   first=_rewritten(cfg, rows.first, device),
                   forward_transient=max(rows.forward_transient,
                                         _forward_transient(cfg, base.block)),
                   layer_backwards=rows.layer_backwards + _layer_backwards(cfg, base.block))


def fixed(cfg, fixed: dict, per_parameter: dict, parameters: int, trained: int) -> dict:
    """The blocks' linear weights in 4 bits instead of the dtype they were loaded in."""
    stored = quantized_bytes(cfg) - sum(quantized_weights(cfg)) * frozen_weight_bytes(cfg)
    return {**fixed, "weights": fixed["weights"] + stored}


RECIPE = Recipe("qlora", lambda cfg: bool(cfg.lora_rank and cfg.qlora), rows=rows,
                fixed=fixed, knob="qlora")
