"""A model loaded in bf16 (`from_pretrained(..., torch_dtype=torch.bfloat16)`):
what changes in a Hugging Face step when its weights are 16-bit leaves.

The usual LoRA recipe loads the base model in bf16, lets peft keep the adapters
in fp32 (`get_peft_model`'s `autocast_adapter_dtype=True`) and trains under
transformers' `bf16=True`, which is `torch.autocast` to bf16; a pure-bf16 full
fine-tune trains the bf16 weights themselves. Against the same step over fp32
weights, read from torch, transformers and peft and confirmed with the CPU
allocator's memory events (`tests/test_budget_weights_dtype.py`):

1. The weights are 2 bytes each. Under LoRA the adapters, their gradients and
   AdamW's state stay fp32 (4, 4 and 8 bytes per adapter weight). A full
   fine-tune has no fp32 master: gradients and optimizer state take the
   parameter's dtype (AdamW: 2 + 2 + 4 = 8 bytes per parameter) and the
   optimizer's temporaries are bf16 too.
2. autocast casts nothing for a bf16 weight: no matmul keeps a 16-bit copy of
   its weight, the head's included, and the autocast cache holds nothing. The
   adapters' fp32 weights are still cast and cached, and each adapter still
   casts its input to fp32 (peft) and back (autocast): those terms are unchanged.
   With no cast, a tied head's gradient contribution is a transposed view, summed
   out of place with the embedding's, as in an fp32 step without autocast.
3. The hidden states are bf16: the rotary embedding hands back cos and sin in
   their dtype (`cos.to(dtype=x.dtype)`), eager attention's dropout draws a
   bf16 mask on the CPU, checkpointing keeps each block's bf16 input and eager
   attention's mask in the model's dtype.
4. RMSNorm upcasts its input to fp32 (`hidden_states.to(torch.float32)`: the
   copy its pow and product keep) and casts x / rms back to bf16 before the gain:
   the gain's product keeps that bf16 copy (a trained gain only), and the
   matmuls that read the norm's output read one bf16 tensor, not a copy each.
   Eager attention's softmax still runs in fp32 (`dtype=torch.float32`) and is
   cast back for P @ V, and the loss still upcasts the bf16 logits to fp32.

5. Without autocast (`--autocast off`: the bf16 model trained as loaded, every op
   in bf16) a full fine-tune keeps what it keeps under autocast: no bf16 weight is
   cast either way, and RMSNorm, eager attention's softmax and the loss upcast
   explicitly, not by autocast's lists. Under LoRA each adapter's input is cast by
   peft to the fp32 adapter's dtype (`_cast_input_dtype`): A keeps that fp32 copy
   (under autocast, a 16-bit copy instead), and A(x) is fp32; no weight is copied
   and nothing is cached.

Modelled only where measured: LLaMA-shaped models (LLaMA, Qwen2, Mistral,
Qwen3 configs) under precision bf16, with or without autocast. GPT-2 in bf16
differs more (its LayerNorm keeps bf16 input and statistics on the CPU but runs
on CUDA's fp32 list, and its eager softmax follows the bf16 mask): refused by
name until it is measured (`compat`).
"""
from __future__ import annotations

BF16 = 2
WEIGHTS_DTYPE_BYTES = {"fp32": 4, "bf16": BF16}


def bf16_weights(cfg) -> bool:
    """Whether the model's own weights are bf16 leaves (the adapters stay fp32)."""
    return getattr(cfg, "weights_dtype", "fp32") == "bf16"


def hidden_bytes(cfg) -> int:
    """Bytes of a hidden-state element between ops (the embeddings' output, the
    residual stream, a block's input): the weights' dtype, fp32 unless loaded in bf16."""
    return BF16 if bf16_weights(cfg) else 4


def frozen_weight_bytes(cfg) -> int:
    """Bytes of one frozen (base model) weight element."""
    return WEIGHTS_DTYPE_BYTES[getattr(cfg, "weights_dtype", "fp32")]


def trains_bf16(cfg) -> bool:
    """Whether the trained parameters are bf16 (a full fine-tune of a bf16 model):
    their gradients, the optimizer's state and its math are bf16 too."""
    return bf16_weights(cfg) and not cfg.lora_rank


def training_bytes(cfg, fp32_bytes: dict[str, int]) -> dict[str, int]:
    """Bytes per trained parameter of each fixed buffer, from those over fp32 weights:
    halved (no fp32 master) when the trained parameters are bf16."""
    if not trains_bf16(cfg):
        return fp32_bytes
    return {k: v * BF16 // 4 for k, v in fp32_bytes.items()}
