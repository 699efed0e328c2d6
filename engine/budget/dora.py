"""DoRA (peft's `LoraConfig(use_dora=True)`): LoRA's adapters, and a trained magnitude
per output column of each adapted layer that rescales the layer's output.

peft's `DoraLinearLayer.forward` (peft/tuners/lora/dora.py) computes, per adapted
layer with base weight W, adapters A and B and scaling s,

    norm   = ||W + s * B @ A||, per output column, detached (`get_weight_norm`)
    scale  = magnitude / norm
    output = base(x) + (scale - 1) * base(x) + scale * B(A(x)) * s

and the products keep, read from torch's autograd formulas and confirmed with
saved-tensor hooks and the CPU allocator's memory events
(`tests/test_budget_recipes_lora.py`):

1. `(scale - 1) * base(x)` keeps the base layer's output (the magnitude's gradient
   reads it; a layer with a bias, GPT-2's Conv1D, keeps its output less the bias, a
   new tensor, fp32 under autocast by type promotion with the fp32 bias), and
   `scale - 1` where that output needs a gradient.
2. `scale * B(A(x))` keeps the adapter's output B(A(x)) (its own, not LoRA's
   `B(A(x)) * s`, which nothing keeps) and `scale`; the division keeps `norm`.
   Both outputs are in the compute dtype: 16 bits under autocast.
3. With `lora_dropout` the base output is made again from the dropped input
   (`F.linear(dropout(x), W)`), which keeps W: resident in fp32, under autocast a
   16-bit copy of its own (a frozen weight is not cached), when the input needs a
   gradient.
4. The magnitudes are trained: one fp32 vector per adapted layer, registered after
   its B, with its gradient and AdamW's state.

So in a layer whose input needs no gradient (the first block's first adapters), no
`scale - 1` and no copy of W are kept. `B @ A` itself (made by running the adapters
over an identity matrix) and W + s * B @ A are transients of the forward: no op keeps
them, but B @ A and its graph (the identity, A(I)) live until the layer's forward
returns. Under checkpointing that happens again while a block is rebuilt in the
backward: the rebuilt block holds the largest layer's. Where that transient meets the
gradients made so far is not followed further: two checkpointed steps measured on the
CPU stay off (peaks 0.89 and 1.06 of the prediction, strict xfails in the test). Measured on the CPU in fp32 and under bf16 autocast; on CUDA the same ops run,
so the same tensors are kept (an assumption: no GPU measured it).
"""
from __future__ import annotations

from .kept import Saved
from .linears import targeted, width
from .lora import input_requires_grad, needs_no_gradient
from .recipe import Recipe, Rows
from .weights_dtype import bf16_weights

FP32 = 4


def _has_bias(cfg, layer) -> bool:
    """GPT-2's Conv1D layers have biases; Qwen2's q, k and v projections (`qkv_bias`)."""
    if cfg.architecture == "gpt2":
        return True
    return getattr(cfg, "qkv_bias", False) and layer.name.split(".")[-1] in (
        "q_proj", "k_proj", "v_proj")


def _layer_terms(cfg, layer, first: bool) -> list[Saved]:
    """What one DoRA layer keeps beyond LoRA's adapter (see the module's doc)."""
    n = cfg.micro_batch * cfg.seq_len
    fan_in, fan_out = width(cfg, layer.fan_in), width(cfg, layer.fan_out)
    lo = 2 if cfg.autocast else FP32
    input_grad = not (first and needs_no_gradient(cfg, layer))
    op = f"dora {layer.name}"
    # less its bias, the base output is promoted to the fp32 bias's dtype
    minus_bias = _has_bias(cfg, layer) and not cfg.lora_dropout and not bf16_weights(cfg)
    items = [Saved(op, "the base layer's output" + (", less its bias" if minus_bias else "")
                   + " (for the magnitude's gradient)", n * fan_out,
                   FP32 if minus_bias else lo),
             Saved(op, "B(A(x)), the adapter's output", n * fan_out, lo),
             Saved(op, "the norm, the scale" + (" and the scale - 1" if input_grad else ""),
                   (3 if input_grad else 2) * fan_out, FP32)]
    if cfg.lora_dropout and cfg.autocast and input_grad and not bf16_weights(cfg):
        items.append(Saved(op, "W, 16-bit copy (the base output from the dropped input)",
                           fan_in * fan_out, 2))
    return items


def _lora_weight_bytes(cfg, layer) -> int:
    """B @ A as `get_lora_weight` makes it, held with its graph until the layer's forward
    returns: the identity A read (16-bit under autocast), A(I), and B(A(I)) (cast back
    to fp32 under autocast, where the 16-bit product goes)."""
    fan_in, fan_out, r = width(cfg, layer.fan_in), width(cfg, layer.fan_out), cfg.lora_rank
    lo = 2 if cfg.autocast else FP32
    return fan_in * fan_in * lo + fan_in * r * lo + fan_in * fan_out * FP32


def rows(cfg, base: Rows, rows: Rows, device: str) -> Rows:
    """Each adapted layer's DoRA terms added to LoRA's block (and first block). Under
    checkpointing the rebuilt block also holds, while each layer's forward runs again,
    that layer's B @ A (the largest layer's: one at a time)."""
    first = not input_requires_grad(cfg)  # the first block starts without gradients
    block = rows.block + [t for l in targeted(cfg) for t in _layer_terms(cfg, l, False)]
    head = rows.first + [t for l in targeted(cfg) for t in _layer_terms(cfg, l, first)]
    if rows.checkpointed is not None:
        largest = max(_lora_weight_bytes(cfg, l) for l in targeted(cfg))
        block.append(Saved("dora (recomputed forward)", "B @ A over an identity, until the "
                           "layer's forward returns", largest, 1))
    return Rows(block, head, rows.outside, rows.checkpointed)


def tensors(cfg, trained: list, make) -> list:
    """Each adapted layer's magnitude vector, after its B (peft's order)."""
    out = []
    for t in trained:
        out.append(t)
        if t.name.endswith(".lora_B.weight"):
            name = t.name.removesuffix(".lora_B.weight")
            layer = next(l for l in targeted(cfg) if name.endswith(l.name))
            out.append(make(f"{name}.lora_magnitude_vector.weight",
                            width(cfg, layer.fan_out), True))
    return out


RECIPE = Recipe("dora", lambda cfg: bool(cfg.lora_rank and cfg.dora), rows=rows,
                tensors=tensors)
