"""Whose step the budget models, one record each: what that framework's usual loop does
beyond the model, so a knob left at "default" takes the framework's own choice.

    rule, transformer  textbook counts: the activations a block needs, nothing a loop adds
    engine             this engine's tape GPT (`engine.nn.GPT`): everything resident throughout
    pytorch            a plain GPT as nanoGPT writes it, trained by the loop its README shows:
                       `logits, loss = model(x, y)` (the caller holds the logits through the
                       backward) and `torch.optim.AdamW(params)`, which on CUDA runs the
                       multi-tensor (foreach) code (`torch.optim.optimizer.
                       _default_to_fused_or_foreach`: foreach when every tensor is on CUDA)
    hf                 Hugging Face transformers trained by its `Trainer`: the loop keeps only
                       the loss, and the optimizer is the one `TrainingArguments.optim`
                       names by default (`adamw_torch_fused` when torch >= 2.8: fused AdamW)

The report says which choice it used and where it came from.
"""
from __future__ import annotations

from dataclasses import dataclass

from .knobs import DEFAULT, ONE_IMPLEMENTATION

# Where each optimizer without torch's switches comes from, and how it runs.
ONE_IMPLEMENTATION_WHY = {
    "adafactor": "transformers' Adafactor updates one parameter at a time",
    "adamw-8bit": "bitsandbytes' AdamW8bit updates one parameter at a time",
}


@dataclass(frozen=True)
class Framework:
    name: str
    label: str
    optimizer_impl: str | None   # what its loop's optimizer runs (None: no temporaries modelled)
    optimizer_why: str
    outputs: str | None          # "kept" or "freed" (None: the model has no loop)
    outputs_why: str
    state_from_first_step: bool  # the optimizer state appears in the first step()
    real_step: bool              # its moments follow a real framework's code


FRAMEWORKS = {f.name: f for f in (
    Framework("rule", "rule of thumb", None, "", None, "", False, False),
    Framework("transformer", "transformer op list", None, "", None, "", False, False),
    Framework("engine", "this engine's GPT", None, "", None, "", False, False),
    Framework("pytorch", "plain PyTorch GPT (nanoGPT)", "foreach",
              "torch.optim.AdamW(params) on CUDA", "kept",
              "`logits, loss = model(x, y)` as nanoGPT's loop", True, True),
    Framework("hf", "Hugging Face transformers", "fused",
              "transformers' Trainer default (adamw_torch_fused)", "freed",
              "the Trainer keeps only the loss", True, True),
)}


def framework(cfg) -> Framework:
    return FRAMEWORKS[cfg.activation_model]


def resolved_optimizer_impl(cfg) -> tuple[str | None, str]:
    """(the optimizer implementation the step runs, where that choice came from)."""
    if cfg.optimizer in ONE_IMPLEMENTATION and framework(cfg).real_step:
        return "for-loop", ONE_IMPLEMENTATION_WHY[cfg.optimizer]
    if cfg.optimizer_impl != DEFAULT:
        return cfg.optimizer_impl, "--optimizer-impl"
    fw = framework(cfg)
    if fw.name == "pytorch" and cfg.backend == "cpu":
        # _default_to_fused_or_foreach picks foreach only when every tensor sits on a
        # device of its foreach list (CUDA-like), never on the CPU
        return "for-loop", "torch.optim.AdamW(params) on the CPU"
    return fw.optimizer_impl, fw.optimizer_why


def resolved_outputs(cfg) -> tuple[str | None, str]:
    """(whether the loop keeps the model's output through backward, and why)."""
    if cfg.outputs != DEFAULT:
        return cfg.outputs, "--outputs"
    fw = framework(cfg)
    return fw.outputs, fw.outputs_why
