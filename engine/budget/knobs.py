"""The budget's knobs: one table, read by every front end and by the validation.

Each `Knob` names a field of `BudgetConfig`, its command-line flag, its type, its
default, its choices or bounds, one line of help and the front ends that show it.
The command line builds its parser from this table, the widget and the page their
controls, and `BudgetConfig.validate` its checks of numbers and choices, so a knob
added here appears everywhere with its help and its bounds.

Bounds keep every number finite and the arithmetic quick: sizes are whole numbers
below limits no real model reaches (a hundred thousand layers, a width of a million), so a
typo such as `--width 10**4000` is refused by name before any work starts.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

# Choices shared by the code that reads them.
PRECISIONS = ("fp32", "bf16", "fp16")
# The textbook's optimizers: a number of fp32 state bytes per parameter, in every model.
OPTIMIZERS = ("sgd", "momentum", "adamw")
# Optimizers whose state is shaped tensor by tensor and whose library runs one tensor at
# a time, with no foreach or fused switch (transformers' Adafactor, bitsandbytes' 8-bit
# AdamW): modelled in a real step only.
ONE_IMPLEMENTATION = ("adafactor", "adamw-8bit")
# torch's names for how an optimizer's step runs over the parameters: one tensor at a
# time, multi-tensor (foreach) kernels over whole lists, or one fused kernel.
OPTIMIZER_IMPLS = ("for-loop", "foreach", "fused")
# Whose step the activations model: the textbook rule, the transformer op list, this
# engine's GPT, a plain PyTorch GPT (nanoGPT's code), Hugging Face transformers.
ACTIVATION_MODELS = ("rule", "transformer", "engine", "pytorch", "hf")
REAL_STEP_MODELS = ("pytorch", "hf")
ATTENTIONS = ("standard", "flash")
RECOMPUTE = ("none", "selective", "full")
ARCHITECTURES = ("gpt2", "llama")
GRAD_PRECISIONS = ("storage", "fp32")
ZERO_STAGES = (0, 1, 2, 3)
# Whose ZeRO-2/3 a real step's gradients follow (engine.budget.sharding): DeepSpeed's
# bucketed reduce or FSDP's reduce-scatter of each block as its backward ends.
ZERO_ENGINES = ("deepspeed", "fsdp")
# What the loop does with the model's output (the logits): keeps it until the next
# forward returns, drops it as the forward returns (the loss only), or deletes it after
# `backward()` (`del logits`).
OUTPUTS = ("kept", "freed", "freed-after-backward")
SWITCH = ("on", "off")
BACKENDS = ("cuda", "cpu")
WEIGHTS_DTYPES = ("fp32", "bf16")
# "default": the framework's own choice (engine.budget.frameworks), stated in the output.
DEFAULT = "default"

FRONT_ENDS = frozenset({"cli", "widget", "page"})
CLI_ONLY = frozenset({"cli"})

# Largest sizes accepted: far beyond any real model, small enough to stay exact.
MAX_COUNT = 1 << 24          # vocabulary, positions, sequence length
MAX_WIDTH = 1 << 20          # width, MLP width
MAX_HEADS = 1 << 16          # heads, key/value heads, head size
MAX_LAYERS = 100_000
MAX_PARAMS = 10 ** 15
MAX_BATCH = 1 << 20          # micro-batch, accumulation, devices
MAX_DEVICE_MEMORY = 10 ** 16  # 10 PB: no accelerator has more
MIN_DEVICE_MEMORY = 10 ** 6   # 1 MB: a smaller "memory" is a unit slip (0.5 = half a byte)
MAX_DEVICE_FLOPS = 10 ** 20
MIN_DEVICE_FLOPS = 10 ** 6
# Beside the allocator's peak a CUDA process holds its context and the libraries'
# workspaces (about 0.5-1 GiB with CUDA 12's lazy module loading) and the caching
# allocator's reserved but unused blocks (a few % of the peak): 2 GiB covers both on
# the cards the budget lists. No GPU measured it here; the knob says so.
HEADROOM = 2 * 2 ** 30


@dataclass(frozen=True)
class Knob:
    """One setting of a budget."""
    field: str                    # the BudgetConfig field
    flag: str                     # the command line's flag ("" when it has none)
    kind: type                    # int, float, str or bool
    default: object
    help: str
    group: str                    # model, batch, policy, step, parallel, device
    choices: tuple = ()           # the allowed values, when they are a list
    low: float | None = None      # the smallest allowed int, or the bound a float is above
    high: float | None = None     # the largest allowed (0 is also allowed when
    zero_means: str = ""           #   `zero_means` says what 0 stands for)
    fronts: frozenset = FRONT_ENDS
    # describes LoRA's adapters: meaningless without a rank (refused at lora_rank 0),
    # reset where a step is compared with full fine-tuning (fit.without_adapters)
    adapter: bool = False

    def problem(self, value) -> str | None:
        """None when `value` is allowed, else a sentence naming the knob, the value
        and what is allowed."""
        name = f"{self.field}={value!r}"
        if self.kind is bool:
            return None if isinstance(value, bool) else f"{name} must be True or False."
        if self.choices:
            if value in self.choices and type(value) is type(self.choices[0]):
                return None
            return f"{name} is unknown; allowed: {', '.join(map(str, self.choices))}."
        if self.kind is int:
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                return f"{name} is not allowed: it must be {self._range()}."
        elif self.kind is float:
            if (isinstance(value, bool) or not isinstance(value, numbers.Real)
                    or not math.isfinite(value)):
                return f"{name} is not allowed: it must be {self._range()}."
        else:
            return None if isinstance(value, self.kind) else f"{name} must be a {self.kind.__name__}."
        if value == 0 and self.zero_means:
            return None
        # A float's lower bound is exclusive (mfu is above 0), an int's inclusive.
        below = self.low is not None and (value <= self.low if self.kind is float
                                          else value < self.low)
        if below or (self.high is not None and value > self.high):
            return f"{name} is not allowed: it must be {self._range()}."
        return None

    def _range(self) -> str:
        whole = "a positive whole number" if self.kind is int else "a number"
        if self.kind is int and self.low == 1 and self.high is not None:
            text = f"{whole} (1, 2, 3, ...) up to {self.high:,}"
        elif self.kind is float and self.low is not None:
            text = f"{whole} above 0 and at most {self.high:g}"
        else:
            text = f"{whole} from {self.low:,} to {self.high:,}"
        return text + (f", or 0 for {self.zero_means}" if self.zero_means else "")


def _k(field, flag, kind, default, help, group, **more) -> Knob:
    return Knob(field, flag, kind, default, help, group, **more)


KNOBS = {k.field: k for k in (
    # the model's shape
    _k("n_layer", "--layers", int, 4, "number of blocks L", "model", low=1, high=MAX_LAYERS),
    _k("d_model", "--width", int, 128, "model width d (C)", "model", low=1, high=MAX_WIDTH),
    _k("n_head", "--heads", int, 4, "attention heads a; must divide the width", "model",
       low=1, high=MAX_HEADS),
    _k("vocab_size", "--vocab", int, 256, "vocabulary size V", "model", low=1, high=MAX_COUNT),
    _k("d_ff", "--mlp-width", int, 0, "MLP width", "model", low=1, high=MAX_WIDTH,
       zero_means="the architecture's rule (4 x width; LLaMA: 8d/3 to a multiple of 256)"),
    _k("block_size", "--positions", int, 0, "learned positions (the model's context)",
       "model", low=1, high=MAX_COUNT, zero_means="the sequence length"),
    _k("tied_embedding", "--tied/--untied", bool, True,
       "output head tied to the token embedding, or a separate one", "model"),
    _k("n_params", "--params", int, 0, "a plain parameter count instead of the formula",
       "model", low=1, high=MAX_PARAMS, zero_means="the formula", fronts=CLI_ONLY),
    _k("architecture", "--arch", str, "gpt2", "block architecture (llama: RMSNorm, SwiGLU, "
       "no biases, rotary positions)", "model", choices=ARCHITECTURES),
    _k("n_kv_head", "--kv-heads", int, 0, "key/value heads of grouped-query attention",
       "model", low=1, high=MAX_HEADS, zero_means="one per head"),
    _k("d_head", "--head-dim", int, 0, "size of one attention head (llama)", "model",
       low=1, high=MAX_HEADS, zero_means="width / heads"),
    _k("qkv_bias", "--qkv-bias", bool, False, "biases on the q/k/v projections of a "
       "LLaMA-shaped block (Qwen2)", "model", fronts=CLI_ONLY),
    # LlamaConfig's bias switches (attention_bias also Qwen3Config's)
    _k("attention_bias", "--attention-bias", bool, False, "biases on the q, k, v and "
       "output projections of a LLaMA-shaped block (LlamaConfig's attention_bias)", "model",
       fronts=CLI_ONLY),
    _k("mlp_bias", "--mlp-bias", bool, False, "biases on the gate, up and down projections "
       "of a LLaMA-shaped block (LlamaConfig's mlp_bias)", "model", fronts=CLI_ONLY),
    _k("qk_norm", "--qk-norm", bool, False, "RMSNorm over each head of q and k (Qwen3)",
       "model", fronts=CLI_ONLY),
    _k("sliding_window", "--sliding-window", int, 0, "attention window of a Mistral-style "
       "block", "model", low=1, high=MAX_COUNT, zero_means="no window", fronts=CLI_ONLY),
    _k("model_type", "", str, "", "the config.json's model_type (set by --hf-config)",
       "model", fronts=frozenset()),
    # the batch
    _k("micro_batch", "--batch", int, 16, "micro-batch B (sequences)", "batch", low=1,
       high=MAX_BATCH),
    _k("seq_len", "--seq", int, 128, "sequence length N (tokens)", "batch", low=1,
       high=MAX_COUNT),
    _k("accumulation", "--accum", int, 1, "micro-batches per optimizer step K", "batch",
       low=1, high=MAX_BATCH),
    # the training policy
    _k("precision", "--precision", str, "fp32", "weights and activations (16-bit ones keep "
       "fp32 master weights; under pytorch and hf: torch.autocast)", "policy",
       choices=PRECISIONS),
    _k("weights_dtype", "--weights-dtype", str, "fp32", "the dtype the model is loaded "
       "in: fp32 (autocast makes 16-bit copies) or bf16 (torch_dtype=bfloat16; no fp32 "
       "master)", "policy", choices=WEIGHTS_DTYPES),
    _k("autocast_mode", "--autocast", str, "on", "on: a 16-bit precision of a real step "
       "(pytorch, hf) runs under torch.autocast (the default); off: a model loaded in "
       "bf16 (--weights-dtype bf16) trained without autocast, every op in bf16 and "
       "peft's fp32 adapters on fp32 copies of their inputs", "policy", choices=SWITCH),
    _k("grad_precision", "--grad-precision", str, "storage", "gradients in the weights' "
       "precision, or accumulated in fp32 (mixed-precision AdamW: 16 or 18 bytes/param)",
       "policy", choices=GRAD_PRECISIONS),
    _k("optimizer", "--optimizer", str, "adamw", "the optimizer (default adamw; momentum: "
       "SGD with momentum; adafactor: transformers' Adafactor as the Trainer's "
       "optim='adafactor' builds it, factored second moments, no first moment; "
       "adamw-8bit: bitsandbytes' AdamW8bit, blockwise 8-bit state; these two under "
       "pytorch and hf)", "policy", choices=(*OPTIMIZERS, *ONE_IMPLEMENTATION)),
    _k("optimizer_impl", "--optimizer-impl", str, DEFAULT, "how its step runs, in torch's "
       "names: one parameter at a time, multi-tensor lists, one fused kernel (default: "
       "what the framework's usual loop runs)", "policy", choices=(DEFAULT, *OPTIMIZER_IMPLS)),
    _k("activation_model", "--activations", str, "transformer", "whose step is modelled: "
       "rule (k tensors per layer), transformer (the textbook op list), engine (this "
       "engine's GPT), pytorch (a plain PyTorch GPT as nanoGPT writes it), hf (Hugging "
       "Face transformers' GPT-2 or LLaMA)", "policy", choices=ACTIVATION_MODELS),
    _k("tensors_per_layer", "--tensors-per-layer", int, 16, "k of the rule of thumb",
       "policy", low=1, high=10_000),
    _k("dropout", "--dropout", bool, False, "dropout (p > 0) in the step", "policy"),
    _k("recompute", "--recompute", str, "none", "recompute in the backward (under pytorch "
       "and hf, full = checkpoint every block)", "policy", choices=RECOMPUTE),
    _k("attention", "--attention", str, "standard", "standard keeps the T x T "
       "probabilities (eager attention), flash one number per row (SDPA's kernels)",
       "policy", choices=ATTENTIONS),
    # fine-tuning with LoRA adapters (peft), engine.budget.lora
    _k("lora_rank", "--lora-rank", int, 0, "rank r of peft's LoRA adapters over a frozen "
       "model (hf)", "policy", low=1, high=MAX_WIDTH, zero_means="full fine-tuning"),
    _k("lora_targets", "--lora-targets", str, "", "the layers that get adapters, as peft's "
       "target_modules: a comma list of names or '.'-separated suffixes (GPT-2: c_attn, "
       "c_proj, c_fc; LLaMA: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
       "down_proj), or all-linear (every linear layer but the output head); default "
       "(empty): peft's, c_attn or q_proj,v_proj", "policy", adapter=True),
    _k("lora_dropout", "--lora-dropout", float, 0.0, "peft's lora_dropout, the probability "
       "of dropping an adapter's input", "policy", adapter=True, low=0.0, high=1.0,
       zero_means="no dropout"),
    _k("qlora", "--qlora", bool, False, "the frozen model's linear layers in bitsandbytes' "
       "4-bit NF4 under the adapters (QLoRA: blocks of 64 weights, an fp32 absmax each)",
       "policy", adapter=True),
    # recipes built on LoRA's adapters (engine.budget.dora, engine.budget.trained_modules)
    _k("dora", "--dora", bool, False, "peft's DoRA (use_dora=True): each adapted layer "
       "also trains a magnitude per output column and rescales its output by it "
       "(default: off, plain LoRA)", "policy", adapter=True),
    _k("modules_to_save", "--modules-to-save", str, "", "peft's modules_to_save: a comma "
       "list of modules outside the blocks trained in full beside the adapters (lm_head, "
       "embed_tokens; GPT-2: wte); default: none", "policy", adapter=True),
    # what the practitioner's loop does beyond the model
    _k("outputs", "--outputs", str, DEFAULT, "what the loop does with the model's output "
       "(the logits): kept until the next forward returns, freed as the forward returns "
       "(only the loss kept), or freed-after-backward (`del logits` after backward()) "
       "(default: the framework's usual loop: pytorch kept, hf freed)", "step",
       choices=(DEFAULT, *OUTPUTS)),
    _k("padded_batch", "--padded-batch", bool, False, "an attention mask with padding in "
       "the batch", "step"),
    _k("use_cache", "--use-cache", str, DEFAULT, "whether transformers builds its key/value "
       "cache in the forward (default: the config.json's use_cache, else on)", "step",
       choices=(DEFAULT, *SWITCH)),
    _k("backend", "--backend", str, "cuda", "where the step runs: what its kernels keep "
       "(dropout masks, SDPA's paths, autocast's op lists) differs", "step",
       choices=BACKENDS),
    # data parallelism
    _k("devices", "--devices", int, 1, "data-parallel devices N (each runs its own "
       "micro-batches)", "parallel", low=1, high=MAX_BATCH),
    _k("zero", "--zero", int, 0, "ZeRO stage over the devices: 0 replicate, 1 shard the "
       "optimizer state, 2 and the gradients, 3 and the weights", "parallel",
       choices=ZERO_STAGES),
    _k("zero_engine", "--zero-engine", str, "deepspeed", "how ZeRO stages 2 and 3 hold "
       "the gradients in a pytorch or hf step: deepspeed (reduced in buckets of "
       "reduce_bucket_size, 5e8 elements, DeepSpeed's defaults) or fsdp (each block's "
       "gradients reduce-scattered as its backward ends)", "parallel",
       choices=ZERO_ENGINES),
    # the device
    _k("device", "--device", str, "none", "the accelerator to check against (a full or "
       "short name in any case: h200, mi300x, rtx-3090)", "device"),
    _k("device_memory", "--device-memory", int, 0, "device memory in bytes (overrides the "
       "device's)", "device", low=MIN_DEVICE_MEMORY, high=MAX_DEVICE_MEMORY,
       zero_means="the named device's"),
    _k("device_flops", "--device-flops", int, 0, "dense FLOP/s at this precision "
       "(overrides the device's)", "device", low=MIN_DEVICE_FLOPS, high=MAX_DEVICE_FLOPS,
       zero_means="the named device's"),
    _k("headroom", "--headroom", int, HEADROOM, "memory set aside beside the step's peak "
       "for the CUDA context, the libraries' workspaces and the caching allocator's "
       "reserved but unused blocks: a stated allowance (2 GiB), not a measured term",
       "device", low=1, high=MAX_DEVICE_MEMORY, zero_means="nothing set aside"),
    _k("mfu", "--mfu", float, 0.4, "model FLOP utilization of the step-time estimate "
       "(0.4 is typical of large runs)", "device", low=0.0, high=1.0),
)}


# The knobs that describe LoRA's adapters, in the table's order.
ADAPTER_KNOBS = tuple(k.field for k in KNOBS.values() if k.adapter)


def knob(field: str) -> Knob:
    return KNOBS[field]


def default(field: str):
    """The default of a knob (BudgetConfig's fields read it from here)."""
    return KNOBS[field].default


def problems(values: dict) -> list[str]:
    """Every knob whose value in `values` is not allowed, as sentences."""
    return [p for p in (KNOBS[f].problem(v) for f, v in values.items() if f in KNOBS) if p]


def shown_on(front: str) -> list[Knob]:
    """The knobs a front end shows, in the table's order."""
    return [k for k in KNOBS.values() if front in k.fronts]


# The plan's questions (engine.budget.plan): not settings of one step, so not fields
# of BudgetConfig; the command line shows them beside the plan's flag.
LINK_BANDWIDTH = 100 * 10 ** 9
PLAN_KNOBS = {k.field: k for k in (
    _k("tokens_per_step", "--tokens-per-step", int, 0, "tokens each optimizer step sees, "
       "all devices together (default: the setting's own, batch x seq x accum x devices)",
       "plan", low=1, high=MAX_COUNT * MAX_BATCH, zero_means="the setting's own",
       fronts=CLI_ONLY),
    _k("link_bandwidth", "--link-bandwidth", int, LINK_BANDWIDTH, "bytes per second "
       "each device sends in the collectives of ZeRO and data parallelism (default "
       "100 GB/s, a stated allowance between PCIe 4 (about 25) and H100 NVLink (about "
       "450)); the plan adds this time to the compute", "plan", low=1,
       high=MAX_DEVICE_MEMORY, fronts=CLI_ONLY),
    _k("plan_full_fine_tuning", "--plan-full-fine-tuning", bool, True, "under LoRA, the "
       "plan also lists full fine-tuning (default: on)", "plan", fronts=CLI_ONLY),
)}
