"""Which knob applies under which model or recipe, and why: one table.

A knob of `knobs.KNOBS` can mean nothing in some settings: the rule of thumb has no
framework loop, a GPT-2 block has no grouped-query attention, LoRA's targets need
LoRA. Each `Rule` says so once, for every reader:

  * `BudgetConfig.validate` refuses a value the settings cannot mean (`refusal`),
    naming the knob, its value and the fix;
  * the widget and the page grey the knob out with `reason`, and put back its
    default where the rule refuses any other value (`idle_knobs`).

A rule holds `when` its settings say so. `allowed(value)` says which values the rule
still accepts (by default only the knob's default); a rule that accepts every value
(`refuses=False`) only greys the knob, for a knob that does nothing then. The first
rule that holds for a knob decides; the table's order is the order the messages
are checked in.

Settings import no step model: the rules read `BudgetConfig`'s fields and
properties and the names of `layers` only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .knobs import ADAPTER_KNOBS, DEFAULT, KNOBS, ONE_IMPLEMENTATION, REAL_STEP_MODELS
from .linears import OUTSIDE_MODULES, trained_modules

Test = Callable[[object], bool]


@dataclass(frozen=True)
class Rule:
    """Under `when(cfg)`, `knob` takes only the values `allowed` accepts (the knob's
    default when `allowed` is None), because `reason`. `refusal(cfg)` is the sentence
    a refused value gets (naming knob, value and fix); a rule with `refuses=False`
    refuses nothing and only greys the knob."""
    knob: str
    when: Test
    reason: str | Callable[[object], str]
    refusal: Callable[[object], str] | None = None
    allowed: Callable[[object, object], bool] | None = None
    refuses: bool = True
    greys: bool = True    # False: only some values are refused; the knob still matters

    def why(self, cfg) -> str:
        return self.reason(cfg) if callable(self.reason) else self.reason

    def accepts(self, cfg) -> bool:
        value = getattr(cfg, self.knob)
        if not self.refuses:
            return True
        if self.allowed is not None:
            return self.allowed(cfg, value)
        return value == KNOBS[self.knob].default

    def message(self, cfg) -> str:
        if self.refusal is not None:
            return self.refusal(cfg)
        value = getattr(cfg, self.knob)
        default = KNOBS[self.knob].default
        return f"{self.knob}={value!r}: {self.why(cfg)}; leave {self.knob} at {default!r}."


def _model(cfg) -> str:
    return cfg.activation_model


def _real(cfg) -> bool:
    return cfg.activation_model in REAL_STEP_MODELS


def _not_llama(cfg) -> bool:
    return cfg.architecture != "llama"


def _bf16_weights(cfg) -> bool:
    return cfg.weights_dtype == "bf16"


# The knobs of a practitioner's loop, each with the value that means "no loop".
LOOP_KNOBS = ("optimizer_impl", "outputs", "use_cache", "padded_batch", "backend",
              "zero_engine")
LLAMA_TRAITS = ("qkv_bias", "qk_norm", "sliding_window", "attention_bias", "mlp_bias")


def _loop_refusal(knob):
    return lambda c: (f"{knob}={getattr(c, knob)!r} describes a real framework's step; the "
                      f"{_model(c)} model has none. Choose activation_model 'pytorch' or "
                      f"'hf', or leave {knob} at {KNOBS[knob].default!r}.")


def _pytorch_loop_refusal(knob):
    return lambda c: (f"{knob}={getattr(c, knob)!r}: the plain PyTorch GPT takes no "
                      f"attention mask and builds no key/value cache; choose "
                      f"activation_model 'hf', or leave {knob} at {KNOBS[knob].default!r}.")


def _llama_trait_refusal(knob):
    return lambda c: (f"{knob}={getattr(c, knob)!r} is a trait of LLaMA-shaped blocks "
                      f"(Qwen2, Qwen3, Mistral, LLaMA's biases); choose architecture 'llama', or turn "
                      f"{knob} off.")


def _lora_only_refusal(knob):
    return lambda c: (f"{knob}={getattr(c, knob)!r} describes LoRA adapters, but lora_rank "
                      f"is 0 (full fine-tuning); set lora_rank (e.g. 8), or leave {knob} "
                      f"unset.")


_ENGINE = lambda c: _model(c) == "engine"  # noqa: E731
_WEIGHTS_BF16 = "weights_dtype='bf16'"

RULES = (
    # the rule of thumb does not know which tensors are the attention core's
    Rule("recompute", lambda c: _model(c) == "rule",
         "the rule of thumb does not know which tensors belong to the attention core",
         lambda c: ("recompute='selective' needs to know which tensors belong to the "
                    "attention core, and the rule of thumb ('rule') does not; choose "
                    "activation_model 'transformer', or recompute 'none' or 'full'."),
         allowed=lambda c, v: v != "selective", greys=False),
    # a practitioner's loop exists only in a real framework's step
    *(Rule(k, lambda c: not _real(c),
           lambda c: f"the {_model(c)} model has no framework loop (activations of: "
                     f"pytorch or hf)", _loop_refusal(k)) for k in LOOP_KNOBS),
    *(Rule(k, lambda c: _model(c) == "pytorch", "the plain PyTorch GPT takes no attention "
           "mask and builds no key/value cache", _pytorch_loop_refusal(k))
      for k in ("use_cache", "padded_batch")),
    # LLaMA-shaped blocks' traits
    Rule("n_kv_head", _not_llama, "GPT-2 blocks have one key/value head per head",
         lambda c: (f"n_kv_head={c.n_kv_head}: GPT-2 blocks keep one key/value head per "
                    f"head; choose architecture 'llama' for grouped-query attention, or "
                    f"set n_kv_head to 0."),
         allowed=lambda c, v: not v or v == c.n_head),
    Rule("d_head", _not_llama, "GPT-2 blocks split the width evenly among the heads",
         lambda c: (f"d_head={c.d_head}: a GPT-2 block splits its width evenly among its "
                    f"heads; a head size of its own is a LLaMA setting (architecture "
                    f"'llama'), or set d_head to 0.")),
    *(Rule(k, _not_llama, "a trait of LLaMA-shaped blocks", _llama_trait_refusal(k))
      for k in LLAMA_TRAITS),
    # Gemma (model_type from a config.json or a preset): what transformers runs and
    # what was measured (engine.budget.gemma)
    Rule("attention", lambda c: c.model_type == "gemma2",
         "transformers runs Gemma 2 in eager mode only",
         lambda c: ("attention='flash' with a gemma2 model: transformers runs Gemma 2 in "
                    "eager mode only (SDPA cannot soft-cap its scores); choose "
                    "attention 'standard'."),
         allowed=lambda c, v: v == "standard", greys=False),
    Rule("attention", lambda c: (c.model_type == "gemma3_text" and c.sliding_window
                                 and c.seq_len >= c.sliding_window),
         "Gemma 3's windowed layers under SDPA from the window's length on were not modelled",
         lambda c: (f"attention='flash' with a gemma3_text model at seq_len={c.seq_len} >= "
                    f"its sliding_window {c.sliding_window}: SDPA's windowed layers (five "
                    f"in six) are then handed a mask and its global ones not, which was not "
                    f"modelled; choose attention 'standard' (in eager mode a window keeps "
                    f"nothing more), or seq_len below {c.sliding_window}."),
         allowed=lambda c, v: v == "standard", greys=False),
    # a real framework's step has no switch for these
    Rule("recompute", _real, "a real step checkpoints whole blocks (full) or keeps no "
         "probabilities with SDPA (attention 'flash')",
         lambda c: (f"recompute='selective' is not a switch of a {_model(c)} step: what it "
                    f"buys (no T x T probabilities kept) is what attention 'flash' (SDPA) "
                    f"does; choose attention 'flash' with recompute 'none', or recompute "
                    f"'full' (checkpoint every block)."),
         allowed=lambda c, v: v != "selective", greys=False),
    Rule("n_params", _real, lambda c: f"the {_model(c)} model follows every tensor of the "
         f"shape",
         lambda c: (f"n_params={c.n_params} replaces the shape by a count, but the "
                    f"{_model(c)} model follows every tensor of the shape; set n_params "
                    f"to 0.")),
    Rule("grad_precision", _real, lambda c: f"a {_model(c)} step keeps fp32 gradients of "
         f"its fp32 weights; autocast stores fp32",
         lambda c: (f"grad_precision={c.grad_precision!r}: a {_model(c)} step keeps fp32 "
                    f"gradients of its fp32 weights (autocast computes in 16 bits but "
                    f"stores fp32); set grad_precision 'storage'.")),
    Rule("grad_precision", lambda c: c.precision == "fp32",
         "fp32 weights have fp32 gradients either way", refuses=False),
    Rule("architecture", lambda c: _model(c) == "pytorch",
         "the plain PyTorch model is nanoGPT's GPT-2 block",
         lambda c: ("the plain PyTorch model is nanoGPT's GPT-2 block; with activation_model="
                    "'pytorch' set architecture 'gpt2' (or activation_model 'hf' for "
                    "LLaMA).")),
    # the engine's reference GPT is one model
    Rule("attention", _ENGINE, "the engine's reference GPT keeps its attention "
         "probabilities (standard)",
         lambda c: ("the engine's reference GPT keeps its attention probabilities (standard "
                    "attention); with activation_model='engine' set attention "
                    "'standard'.")),
    Rule("architecture", _ENGINE, "the engine's reference GPT is a GPT-2 style model",
         lambda c: ("the engine's reference GPT is a GPT-2 style model; with "
                    "activation_model='engine' set architecture 'gpt2'.")),
    Rule("dropout", _ENGINE, "the engine's reference GPT has no dropout",
         lambda c: ("the engine's reference GPT has no dropout; with activation_model="
                    "'engine' set dropout off.")),
    Rule("d_ff", _ENGINE, "the engine's reference GPT has an MLP of width 4 x width",
         lambda c: (f"the engine's reference GPT has an MLP of width 4*d_model="
                    f"{4 * c.d_model}, not d_ff={c.d_ff}; set d_ff to 0 or "
                    f"{4 * c.d_model}."),
         allowed=lambda c, v: v in (0, 4 * c.d_model), greys=False),
    Rule("tied_embedding", _ENGINE, "the engine's reference GPT ties its head",
         lambda c: ("the engine's reference GPT ties its output head to the token "
                    "embedding; set tied_embedding=True.")),
    Rule("attention", lambda c: _model(c) == "rule",
         "the rule of thumb counts k tensors, whatever the kernel", refuses=False),
    Rule("tensors_per_layer", lambda c: _model(c) != "rule",
         "k is the rule of thumb's; activations of: rule", refuses=False),
    # LoRA: peft's adapters over a transformers model
    *(Rule(k, lambda c: not c.lora_rank, "no adapters: LoRA rank is 0 (full fine-tuning)",
           _lora_only_refusal(k)) for k in ADAPTER_KNOBS),
    Rule("lora_rank", lambda c: _model(c) != "hf", "LoRA adapters are peft's, over a "
         "transformers model (activations of: hf)",
         lambda c: (f"lora_rank={c.lora_rank}: LoRA adapters are peft's, over a Hugging Face "
                    f"transformers model; choose activation_model 'hf', or set lora_rank "
                    f"to 0.")),
    Rule("precision", lambda c: c.qlora,
         "the 4-bit layers were measured in fp32 and under bf16 autocast",
         lambda c: ("qlora with precision='fp16': the 4-bit layers (bf16 compute) were "
                    "measured in fp32 steps and under bf16 autocast, not fp16; choose "
                    "precision 'bf16' or 'fp32'."),
         allowed=lambda c, v: v != "fp16", greys=False),
    # recipes built on LoRA's adapters (engine.budget.dora, engine.budget.trained_modules)
    Rule("modules_to_save", lambda c: c.tied_embedding,
         "a trained copy of a tied head or embedding would untie it: not measured",
         lambda c: (f"modules_to_save={c.modules_to_save!r} with a tied head: peft's trained "
                    f"copy would untie the head from the embedding, which was not measured; "
                    f"leave modules_to_save empty, or use an untied model.")),
    Rule("modules_to_save", lambda c: bool(c.modules_to_save),
         "the modules outside the blocks peft can train",
         lambda c: (f"modules_to_save={c.modules_to_save!r}: a {c.architecture} model's "
                    f"modules outside the blocks are "
                    f"{', '.join(OUTSIDE_MODULES[c.architecture])}; name those (a comma "
                    f"list), or leave modules_to_save empty."),
         allowed=lambda c, v: set(trained_modules(c)) <= set(OUTSIDE_MODULES[c.architecture]),
         greys=False),
    Rule("dora", lambda c: c.qlora, "DoRA over 4-bit weights was not measured",
         lambda c: ("dora with qlora: DoRA over bitsandbytes' 4-bit layers was not measured; "
                    "leave dora off, or qlora off.")),
    # optimizers a library runs tensor by tensor (transformers' Adafactor,
    # bitsandbytes' 8-bit AdamW): modelled in a real step, over fp32 trained tensors
    Rule("optimizer", lambda c: not _real(c), "Adafactor and 8-bit AdamW are modelled "
         "tensor by tensor in a real step (activations of: pytorch or hf)",
         lambda c: (f"optimizer={c.optimizer!r} keeps state shaped by each tensor, which "
                    f"only the real steps follow; choose activation_model 'pytorch' or "
                    f"'hf' (not {_model(c)!r}), or optimizer 'adamw', 'momentum' or 'sgd'."),
         allowed=lambda c, v: v not in ONE_IMPLEMENTATION, greys=False),
    Rule("optimizer", lambda c: _bf16_weights(c) and not c.lora_rank,
         "Adafactor and 8-bit AdamW over bf16 trained weights were not measured",
         lambda c: (f"optimizer={c.optimizer!r} with {_WEIGHTS_BF16} and full fine-tuning: "
                    f"its fp32 copies of bf16 gradients and weights were not measured; "
                    f"choose optimizer 'adamw', 'momentum' or 'sgd', weights_dtype 'fp32', "
                    f"or LoRA (lora_rank), whose adapters are fp32."),
         allowed=lambda c, v: v not in ONE_IMPLEMENTATION, greys=False),
    Rule("optimizer_impl", lambda c: c.optimizer in ONE_IMPLEMENTATION,
         lambda c: f"{c.optimizer} has one implementation (one tensor at a time); "
                   f"torch's foreach and fused switches are AdamW's and SGD's",
         lambda c: (f"optimizer_impl={c.optimizer_impl!r}: {c.optimizer} runs one tensor "
                    f"at a time (its library has no foreach or fused switch); leave "
                    f"optimizer_impl at 'default' or 'for-loop'."),
         allowed=lambda c, v: v in (DEFAULT, "for-loop")),
    # a model loaded in bf16: modelled only where measured
    Rule("weights_dtype", lambda c: _model(c) != "hf",
         "a model loaded in bf16 is a Hugging Face model (activations of: hf)",
         lambda c: (f"{_WEIGHTS_BF16} models a Hugging Face model loaded with "
                    f"torch_dtype=bfloat16; choose activation_model 'hf' (not "
                    f"{_model(c)!r}), or weights_dtype 'fp32'.")),
    Rule("weights_dtype", lambda c: c.precision != "bf16",
         "bf16 weights compute in bf16 (precision bf16, with or without autocast)",
         lambda c: (f"{_WEIGHTS_BF16} with precision={c.precision!r}: a model loaded in "
                    f"bf16 computes in bf16, under the Trainer's bf16=True (torch.autocast) "
                    f"or without autocast (--autocast off); choose precision 'bf16', or "
                    f"weights_dtype 'fp32'.")),
    Rule("weights_dtype", lambda c: c.qlora, "the 4-bit layers' step over bf16 weights "
         "was not measured",
         lambda c: (f"{_WEIGHTS_BF16} with qlora: the 4-bit layers' step over bf16 weights "
                    f"was not measured; leave qlora unset, or weights_dtype 'fp32'.")),
    Rule("weights_dtype", _not_llama, "only LLaMA-shaped models were measured in bf16",
         lambda c: (f"{_WEIGHTS_BF16} with architecture={c.architecture!r}: only "
                    f"LLaMA-shaped models were measured (GPT-2's LayerNorm and eager "
                    f"softmax change dtype with the weights); choose architecture 'llama', "
                    f"or weights_dtype 'fp32'.")),
    # training without autocast: measured over a model loaded in bf16
    Rule("autocast_mode", lambda c: not _bf16_weights(c),
         "without autocast a 16-bit step needs 16-bit weights (weights_dtype bf16)",
         lambda c: (f"autocast_mode={c.autocast_mode!r} (--autocast off) trains a model "
                    f"loaded in bf16 without torch.autocast; with {c.weights_dtype} weights "
                    f"set weights_dtype 'bf16' (activations of: hf, precision bf16), or "
                    f"leave --autocast on.")),
    Rule("autocast_mode", lambda c: not c.real_16bit, "no 16-bit real step to autocast",
         refuses=False),
    # what has no device does nothing
    Rule("zero", lambda c: c.devices == 1, "one device: nothing to shard", refuses=False),
    # whose ZeRO holds the gradients matters only where gradients are sharded
    Rule("zero_engine", lambda c: c.devices == 1 or c.zero < 2,
         "only ZeRO stages 2 and 3 over several devices shard the gradients",
         refuses=False),
    Rule("mfu", lambda c: c.device == "none" and not c.device_flops,
         "no device chosen: no step time to estimate", refuses=False),
)


def refusal(cfg) -> str | None:
    """The first refused value of `cfg`, as a sentence naming the knob, the value and
    the fix; None when every rule accepts it."""
    for rule in RULES:
        if rule.when(cfg) and not rule.accepts(cfg):
            return rule.message(cfg)
    return None


def idle_knobs(cfg) -> dict[str, Rule]:
    """The knobs that do nothing in `cfg`'s settings, each with the rule that says why
    (a front end greys them out; where `rule.refuses`, it puts back the default)."""
    found: dict[str, Rule] = {}
    for rule in RULES:
        if rule.knob not in found and rule.greys and rule.when(cfg):
            found[rule.knob] = rule
    return found


def rules_for(knob: str) -> tuple[Rule, ...]:
    """Every rule about one knob, in the table's order."""
    return tuple(r for r in RULES if r.knob == knob)


assert {r.knob for r in RULES} <= set(KNOBS), "a rule names a knob the table lacks"
assert DEFAULT == KNOBS["optimizer_impl"].default
