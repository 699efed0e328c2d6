"""The fine-tuning recipes' models as the libraries build them, for `torch_step`
to measure: peft's adapters (LoRA, DoRA, trained modules) over a transformers
model, and the model loaded back in bitsandbytes' 4-bit NF4 for QLoRA. What
each recipe changes in the step's memory is said in its own module (`lora`,
`dora`, `qlora`, `trained_modules`)."""
from __future__ import annotations

from ..linears import ALL_LINEAR, target_names
from ..lora import input_requires_grad


def peft_model(model, cfg):
    """`model` with `cfg`'s adapters, as peft's recipes build it: checkpointing
    (when `cfg.recompute` is "full") with `enable_input_require_grads()` before
    `get_peft_model`; DoRA (`use_dora`) and `modules_to_save` as `cfg` says."""
    from peft import LoraConfig, get_peft_model
    if input_requires_grad(cfg):
        model.enable_input_require_grads()
    # peft resolves all-linear itself: the step measured is peft's meaning of it
    targets = (ALL_LINEAR if cfg.lora_targets.strip() == ALL_LINEAR
               else list(target_names(cfg)))
    config = LoraConfig(r=cfg.lora_rank, lora_alpha=2 * cfg.lora_rank,
                        target_modules=targets, lora_dropout=cfg.lora_dropout,
                        fan_in_fan_out=cfg.architecture == "gpt2", bias="none",
                        use_dora=cfg.dora, task_type="CAUSAL_LM",
                        modules_to_save=[m.strip() for m in cfg.modules_to_save.split(",")
                                         if m.strip()] or None)
    return get_peft_model(model, config)


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
