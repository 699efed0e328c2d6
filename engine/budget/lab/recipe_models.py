"""The fine-tuning recipes' models as the libraries build them, for `torch_step`
to measure: peft's adapters (LoRA, DoRA, trained modules) over a transformers
model, and the model loaded back in bitsandbytes' 4-bit NF4 for QLoRA. What
each recipe changes in the step's memory, and how peft spells it, is said in its
own module (`lora`, `dora`, `qlora`, `trained_modules`)."""
from __future__ import annotations

from .. import recipes
from ..lora import input_requires_grad


def peft_model(model, cfg):
    """`model` with `cfg`'s adapters, as peft's recipes build it: checkpointing
    (when `cfg.recompute` is "full") with `enable_input_require_grads()` before
    `get_peft_model`, and the `LoraConfig` the applied recipes spell
    (`recipes.peft_options`: LoRA's rank and targets, DoRA's `use_dora`, ...)."""
    from peft import LoraConfig, get_peft_model
    if input_requires_grad(cfg):
        model.enable_input_require_grads()
    return get_peft_model(model, LoraConfig(**recipes.peft_options(cfg)))


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
