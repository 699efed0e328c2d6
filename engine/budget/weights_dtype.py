"""A model loaded in bf16 (`from_pretrained(..., torch_dtype=torch.bfloat16)`):
what changes in a Hugging Face step when its weights are 16-bit leaves.

The usual LoRA recipe loads the base model in bf16, lets peft keep the adapters
in fp32 (`get_peft_model`'s `autocast_adapter_dtype=True`) and trains under
transformers' `bf16=True`, which is `torch.autocast` to bf16. Against the same
step over fp32 weights, read from torch, transformers and peft and confirmed
with the CPU allocator's memory events (`tests/test_budget_weights_dtype.py`):

1. The frozen weights are 2 bytes each; the adapters, their gradients and
   AdamW's state stay fp32 (4, 4 and 8 bytes per adapter weight).
2. autocast casts nothing for a bf16 weight: no frozen matmul keeps a 16-bit
   copy of its weight, the head's included. The adapters' fp32 weights are still
   cast and cached, and each adapter still casts its input to fp32 (peft) and
   back (autocast): those terms are unchanged.
3. The rotary embedding hands back cos and sin in the hidden states' dtype
   (`LlamaRotaryEmbedding.forward`: `cos.to(dtype=x.dtype)`), so the copies the
   rotation keeps are bf16, not fp32.
4. Everything else a LLaMA block keeps has the same size: RMSNorm upcasts its
   input to fp32 (`hidden_states.to(torch.float32)`: the copy its pow and
   product keep) and casts x / rms back before the gain, the matmuls already
   produced bf16, eager attention's softmax runs in fp32 (`dtype=torch.float32`)
   and is cast back for P @ V, and the loss upcasts the bf16 logits to fp32.

Modelled only where measured: LoRA over a LLaMA-shaped model (LLaMA, Qwen2,
Mistral, Qwen3 configs) under precision bf16. GPT-2 in bf16 differs more (its
LayerNorm keeps bf16 input and statistics on the CPU but runs on CUDA's fp32
list, and its eager softmax follows the bf16 mask), full fine-tuning keeps bf16
gradients and optimizer state, and bf16 weights without autocast run every op
in bf16: each is refused by name until it is measured.
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


def problem(cfg) -> str | None:
    """None when `cfg`'s weights dtype is modelled, else a sentence naming what
    was not measured and what to choose instead."""
    if not bf16_weights(cfg):
        return None
    head = "weights_dtype='bf16'"
    if cfg.activation_model != "hf":
        return (f"{head} models a Hugging Face model loaded with torch_dtype=bfloat16; "
                f"choose activation_model 'hf' (not {cfg.activation_model!r}), or "
                f"weights_dtype 'fp32'.")
    if cfg.precision != "bf16":
        return (f"{head} with precision={cfg.precision!r}: only the Trainer's bf16=True "
                f"(torch.autocast to bf16 over the bf16 weights) was measured; choose "
                f"precision 'bf16', or weights_dtype 'fp32'.")
    if not cfg.lora_rank:
        return (f"{head} with full fine-tuning (lora_rank 0): bf16 gradients and "
                f"the optimizer's state were not measured; set lora_rank (e.g. 16), or "
                f"weights_dtype 'fp32'.")
    if cfg.qlora:
        return (f"{head} with qlora: the 4-bit layers' step over bf16 weights was not "
                f"measured; leave qlora unset, or weights_dtype 'fp32'.")
    if cfg.architecture != "llama":
        return (f"{head} with architecture={cfg.architecture!r}: only LLaMA-shaped "
                f"models were measured (GPT-2's LayerNorm and eager softmax change dtype "
                f"with the weights); choose architecture 'llama', or weights_dtype 'fp32'.")
    return None
