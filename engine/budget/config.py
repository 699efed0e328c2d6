"""Settings of a budget: BudgetConfig, the presets, the byte sizes of each precision.

Architectures: GPT-2 blocks and LLaMA-shaped blocks (RMSNorm, SwiGLU, grouped-query
attention; biases, Qwen 3's q/k norms and Gemma's traits as settings), with presets
of both families (the open models practitioners fine-tune among them); `hf` reads
the same settings from a Hugging Face config.json. A configuration is validated
against the knob table (`knobs`) and the compatibility table (`compat`).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field, replace

from . import compat
from . import frameworks
from .devices import DEVICES, NO_DEVICE, find_device
from .linears import targeted
# The choices of the knob table, re-exported here for the front module and the models.
from .knobs import (ACTIVATION_MODELS, ARCHITECTURES, ATTENTIONS, GRAD_PRECISIONS, KNOBS,
                    OPTIMIZERS, PRECISIONS, REAL_STEP_MODELS, RECOMPUTE, ZERO_STAGES, default,
                    problems)

# Bytes per element of the activations and of the parameter copy the model
# computes with. 16-bit policies keep an fp32 master copy for the optimizer.
STORAGE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
MASTER_BYTES = {"fp32": 0, "bf16": 4, "fp16": 4}
# Optimizer state is fp32 in every policy: momentum keeps one buffer, AdamW two.
OPTIMIZER_BUFFERS = {"sgd": 0, "momentum": 1, "adamw": 2}
OPTIMIZER_STATE_BYTES = 4
# Bytes of state per parameter, as a figure: Adafactor keeps a row and a column vector
# per matrix (about 0), 8-bit AdamW two bytes; their exact state is counted tensor by
# tensor (`optimizer_step.optimizer_state_bytes`).
STATE_BYTES_PER_PARAMETER = {**{k: n * OPTIMIZER_STATE_BYTES for k, n in OPTIMIZER_BUFFERS.items()},
                             "adafactor": 0, "adamw-8bit": 2}
MASK_BYTES = 1          # a dropout mask element (one byte, as in Korthikanti et al.)
LOGITS_BYTES = 4        # the softmax of the cross-entropy is kept in fp32
_PLAIN = (int, bool, float, str)  # a knob's own types: no numpy integer to convert


class BudgetError(ValueError):
    """An impossible configuration; the message says what is allowed."""


# --------------------------------------------------------------------- config
@dataclass(frozen=True)
class BudgetConfig:
    """Every knob of the budget. Sizes are counts, not bytes.

    Model: a pre-norm decoder of `architecture` "gpt2" (learned positions,
    LayerNorm, GELU MLP, biases) or "llama" (rotary positions, RMSNorm, SwiGLU
    MLP, no biases, `n_kv_head` key/value heads shared by groups of query
    heads; 0 means one per head) with `n_layer` blocks of width `d_model`,
    `n_head` heads, an MLP of width `d_ff` (0 means 4 * d_model for gpt2 and
    LLaMA's rule, 8d/3 rounded up to a multiple of 256, for llama),
    vocabulary `vocab_size`, `block_size` positions (0 means `seq_len`), tied
    or untied output head. Set `n_params` to use a plain parameter count
    instead of the formula (the shape is then only used for the activations
    and the attention FLOPs).

    Training: micro-batch, sequence, accumulation, `precision` of the weights
    and activations, `grad_precision` ("storage": gradients in that precision,
    "fp32": accumulated in fp32), optimizer, activation model, recompute,
    `attention` ("standard" keeps the T x T probabilities, "flash" one number
    per query row). Under the real-step models ("pytorch", "hf") a 16-bit
    precision means torch.autocast: fp32 weights and gradients, 16-bit
    compute, and recompute "full" means checkpointing every block.

    Data parallel: `devices` replicas, each running its own micro-batches,
    with ZeRO stage `zero` (0-3) sharding the fixed memory among them.

    Device: `device`, a name from `DEVICES` or a label of your own, with
    `device_memory` (bytes) and `device_flops` (dense FLOP/s at this
    precision) overriding the named device's figures (0: the named device's;
    "none" and no figures: no device); `headroom`, the bytes set aside beside
    the step's peak for the CUDA context and the allocator (engine.budget.fit);
    `mfu`, the fraction of those FLOP/s a step achieves.
    """
    n_layer: int = default("n_layer")
    d_model: int = default("d_model")
    n_head: int = default("n_head")
    vocab_size: int = default("vocab_size")
    d_ff: int = default("d_ff")
    block_size: int = default("block_size")
    tied_embedding: bool = default("tied_embedding")
    n_params: int = default("n_params")
    micro_batch: int = default("micro_batch")
    seq_len: int = default("seq_len")
    accumulation: int = default("accumulation")
    precision: str = default("precision")
    optimizer: str = default("optimizer")
    optimizer_impl: str = default("optimizer_impl")
    activation_model: str = default("activation_model")
    tensors_per_layer: int = default("tensors_per_layer")
    dropout: bool = default("dropout")
    recompute: str = default("recompute")
    attention: str = default("attention")
    architecture: str = default("architecture")
    n_kv_head: int = default("n_kv_head")
    d_head: int = default("d_head")
    qkv_bias: bool = default("qkv_bias")
    qk_norm: bool = default("qk_norm")
    attention_bias: bool = default("attention_bias")
    mlp_bias: bool = default("mlp_bias")
    sliding_window: int = default("sliding_window")
    model_type: str = default("model_type")
    grad_precision: str = default("grad_precision")
    devices: int = default("devices")
    zero: int = default("zero")
    zero_engine: str = default("zero_engine")
    device: str = default("device")
    device_memory: int = default("device_memory")
    device_flops: int = default("device_flops")
    headroom: int = default("headroom")
    mfu: float = default("mfu")
    outputs: str = default("outputs")
    padded_batch: bool = default("padded_batch")
    use_cache: str = default("use_cache")
    backend: str = default("backend")
    lora_rank: int = default("lora_rank")
    lora_targets: str = default("lora_targets")
    lora_dropout: float = default("lora_dropout")
    qlora: bool = default("qlora")
    dora: bool = default("dora")
    modules_to_save: str = default("modules_to_save")
    weights_dtype: str = default("weights_dtype")
    autocast_mode: str = default("autocast_mode")
    name: str = field(default="custom", compare=False)

    def __post_init__(self):
        # numpy integers (from an array, a sweep) count as whole numbers; store
        # Python ints so products of sizes never overflow.
        for name, value in vars(self).items():
            if type(value) not in _PLAIN and isinstance(value, numbers.Integral):
                object.__setattr__(self, name, int(value))

    # Sizes read by the formulas; `ffn` and `positions` resolve the 0 defaults.
    @property
    def ffn(self) -> int:
        if self.d_ff:
            return self.d_ff
        if self.architecture == "llama":  # LLaMA's rule: 2/3 of 4d, to a multiple of 256
            return 256 * -(-(8 * self.d_model // 3) // 256)
        return 4 * self.d_model

    @property
    def positions(self) -> int:
        return self.block_size or self.seq_len

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def head_dim(self) -> int:
        return self.d_head or self.d_model // self.n_head

    @property
    def q_width(self) -> int:
        """Columns of Q (and of the attention's output): heads x head size."""
        return self.n_head * self.head_dim

    def validate(self) -> "BudgetConfig":
        """Return self, or raise BudgetError naming the knob, its value and the fix."""
        self._validate_numbers()
        refused = compat.refusal(self)  # which knob applies under which model or recipe
        if refused:
            raise BudgetError(refused)
        self._validate_shape()
        self._validate_device()
        self._validate_targets()
        return self

    def _validate_targets(self) -> None:
        """Every LoRA target names a linear layer of the block, as peft requires."""
        if self.lora_rank:
            try:
                targeted(self)
            except ValueError as exc:
                raise BudgetError(str(exc)) from None

    def _validate_numbers(self) -> None:
        """Every number within its knob's bounds, every choice one of its values
        (engine.budget.knobs holds both)."""
        found = problems({name: getattr(self, name) for name in KNOBS})
        if found:
            raise BudgetError(found[0])

    def _validate_shape(self) -> None:
        """Heads divide the width, key/value heads the heads, the sequence fits."""
        if self.d_model % self.n_head and not self.d_head:
            divisors = [h for h in range(1, min(self.d_model, 64) + 1) if self.d_model % h == 0]
            raise BudgetError(
                f"n_head={self.n_head} does not divide d_model={self.d_model}: every head "
                f"gets an equal share of the width. Allowed head counts for d_model="
                f"{self.d_model} include {divisors}.")
        if self.block_size and self.block_size < self.seq_len:
            what = ("number of learned positions" if self.architecture == "gpt2"
                    else "context length the model was trained for")
            raise BudgetError(
                f"seq_len={self.seq_len} is longer than block_size={self.block_size}, the "
                f"{what}; use seq_len <= {self.block_size} or a larger "
                f"block_size (0 means block_size = seq_len).")
        if self.n_head % self.kv_heads:
            divisors = [k for k in range(1, self.n_head + 1) if self.n_head % k == 0]
            raise BudgetError(
                f"n_kv_head={self.n_kv_head} does not divide n_head={self.n_head}: each "
                f"key/value head serves an equal group of query heads; allowed: {divisors} "
                f"(0 means one per head).")

    def _validate_device(self) -> None:
        if not isinstance(self.device, str):
            raise BudgetError(f"device={self.device!r} must be a device name.")
        if (find_device(self.device) is None and self.device != NO_DEVICE
                and not (self.device_memory and self.device_flops)):
            raise BudgetError(
                f"device={self.device!r} is not a known device ({', '.join(DEVICES)}; "
                f"any case, or a short name such as h200, mi300x, rtx-3090); name one of "
                f"those, or give both device_memory (bytes) and device_flops (FLOP/s) for "
                f"your own.")

    @property
    def resolved_optimizer_impl(self) -> str | None:
        """The optimizer implementation the step runs (the framework's when "default")."""
        return frameworks.resolved_optimizer_impl(self)[0]

    @property
    def resolved_outputs(self) -> str | None:
        """"kept", "freed" or "freed-after-backward": how long the loop holds the model's
        output (knobs.OUTPUTS)."""
        return frameworks.resolved_outputs(self)[0]

    @property
    def real_16bit(self) -> bool:
        """A real framework's step in 16 bits: the weights and gradients stay in the
        dtype the model was loaded in (fp32 under autocast, or bf16); no 16-bit
        storage copy with an fp32 master, as the textbook's mixed precision keeps."""
        return self.activation_model in REAL_STEP_MODELS and self.precision != "fp32"

    @property
    def autocast(self) -> bool:
        """A real framework's 16-bit step under torch.autocast (unless `--autocast off`
        over bf16 weights)."""
        return self.real_16bit and self.autocast_mode == "on"

    def one_shape(self) -> "BudgetConfig":
        """The same model, recipe and loop at one micro-batch on one device: the key of
        what is computed once per shape (the trained tensors, ZeRO 3's gathered weights),
        since the fit searches vary only the batch, the devices and the stage."""
        return replace(self, micro_batch=1, accumulation=1, devices=1, zero=0)

    def with_(self, **changes) -> "BudgetConfig":
        """A copy with some knobs changed (validated)."""
        return replace(self, **changes).validate()


# -------------------------------------------------------------------- presets
def corpus_vocab_size() -> int:
    """V of the trainer's `tiny` model: the distinct characters of the built-in
    corpus (`pydoc_data.topics`, shipped with CPython; its size varies a little
    between Python versions)."""
    from pydoc_data.topics import topics
    return len(set("".join(topics[k] for k in sorted(topics))))


def _llama3(name: str, layers: int, width: int, heads: int, mlp: int,
            tied: bool) -> BudgetConfig:
    """A Llama 3.1 or 3.2 model: 128,256 tokens, 8 key/value heads, 131,072
    positions, at micro-batch 1 of 4,096 tokens in bf16."""
    return BudgetConfig(name=name, architecture="llama", model_type="llama", n_layer=layers,
                        d_model=width, n_head=heads, n_kv_head=8, d_ff=mlp,
                        vocab_size=128256, block_size=131072, tied_embedding=tied,
                        micro_batch=1, seq_len=4096, precision="bf16")


def _gemma_presets() -> dict[str, BudgetConfig]:
    """Gemma 2 2B and Gemma 3 1B (google/gemma-2-2b, google/gemma-3-1b-pt config.json
    files): GeGLU, head_dim 256, tied head; Gemma 2 soft-caps, Gemma 3 has q/k norms.
    Transformers trains Gemma 2 in eager mode only (engine.budget.gemma)."""
    return {
        "gemma2-2b": BudgetConfig(
            name="gemma2-2b", architecture="llama", model_type="gemma2", n_layer=26,
            d_model=2304, n_head=8, n_kv_head=4, d_head=256, d_ff=9216, vocab_size=256000,
            block_size=8192, tied_embedding=True, sliding_window=4096, micro_batch=1,
            seq_len=4096, precision="bf16"),
        "gemma3-1b": BudgetConfig(
            name="gemma3-1b", architecture="llama", model_type="gemma3_text", n_layer=26,
            d_model=1152, n_head=4, n_kv_head=1, d_head=256, d_ff=6912, vocab_size=262144,
            block_size=32768, tied_embedding=True, qk_norm=True, sliding_window=512,
            micro_batch=1, seq_len=4096, precision="bf16"),
    }


def _presets() -> dict[str, BudgetConfig]:
    return {
        # Source text 002: 7B parameters, 32 layers, d=4096, B=8, N=2048, 16-bit,
        # "say 4" tensors per layer: 134 MB per tensor, 17 GB of activations.
        "7b-example": BudgetConfig(
            name="7b-example", n_layer=32, d_model=4096, n_head=32, vocab_size=32000,
            n_params=7_000_000_000, micro_batch=8, seq_len=2048, precision="bf16",
            activation_model="rule", tensors_per_layer=4),
        # Source text 000: B=8, N=2048, d=1024, L=24, bf16, 16 tensors per layer: 12.9 GB.
        "24-layer-example": BudgetConfig(
            name="24-layer-example", n_layer=24, d_model=1024, n_head=16, vocab_size=50257,
            micro_batch=8, seq_len=2048, precision="bf16", activation_model="rule",
            tensors_per_layer=16),
        # GPT-2 small (124M): 12 layers, d=768, 12 heads, V=50257, 1024 positions.
        "gpt2-small": BudgetConfig(
            name="gpt2-small", n_layer=12, d_model=768, n_head=12, vocab_size=50257,
            block_size=1024, micro_batch=8, seq_len=1024, precision="fp32"),
        # A 7B-class model in the GPT-3 6.7B shape, mixed-precision AdamW.
        "7b-class": BudgetConfig(
            name="7b-class", n_layer=32, d_model=4096, n_head=32, vocab_size=50257,
            micro_batch=1, seq_len=2048, precision="bf16", dropout=True),
        # GPT-2 medium, large and XL (355M, 774M, 1.56B), same block as small.
        "gpt2-medium": BudgetConfig(
            name="gpt2-medium", n_layer=24, d_model=1024, n_head=16, vocab_size=50257,
            block_size=1024, micro_batch=8, seq_len=1024, precision="bf16"),
        "gpt2-large": BudgetConfig(
            name="gpt2-large", n_layer=36, d_model=1280, n_head=20, vocab_size=50257,
            block_size=1024, micro_batch=4, seq_len=1024, precision="bf16"),
        "gpt2-xl": BudgetConfig(
            name="gpt2-xl", n_layer=48, d_model=1600, n_head=25, vocab_size=50257,
            block_size=1024, micro_batch=2, seq_len=1024, precision="bf16"),
        # LLaMA-2 (Touvron et al. 2023; the released config.json files): V=32000,
        # 4096 positions, untied head; 70B shares each K/V head among 8 query heads.
        "llama2-7b": BudgetConfig(
            name="llama2-7b", architecture="llama", n_layer=32, d_model=4096, n_head=32,
            d_ff=11008, vocab_size=32000, block_size=4096, tied_embedding=False,
            micro_batch=1, seq_len=4096, precision="bf16"),
        "llama2-13b": BudgetConfig(
            name="llama2-13b", architecture="llama", n_layer=40, d_model=5120, n_head=40,
            d_ff=13824, vocab_size=32000, block_size=4096, tied_embedding=False,
            micro_batch=1, seq_len=4096, precision="bf16"),
        "llama2-70b": BudgetConfig(
            name="llama2-70b", architecture="llama", n_layer=80, d_model=8192, n_head=64,
            n_kv_head=8, d_ff=28672, vocab_size=32000, block_size=4096,
            tied_embedding=False, micro_batch=1, seq_len=4096, precision="bf16"),
        # Open models practitioners fine-tune, from their released config.json files
        # (`tests/test_budget_presets.py` checks each count against the published one).
        # Llama 3.x: V=128256, 8 K/V heads, 128k positions; 3.2's small ones tie the head.
        "llama3.2-1b": _llama3("llama3.2-1b", 16, 2048, 32, 8192, tied=True),
        "llama3.2-3b": _llama3("llama3.2-3b", 28, 3072, 24, 8192, tied=True),
        "llama3.1-8b": _llama3("llama3.1-8b", 32, 4096, 32, 14336, tied=False),
        "llama3.1-70b": _llama3("llama3.1-70b", 80, 8192, 64, 28672, tied=False),
        # Qwen2.5-7B: Qwen2's block (biases on q, k and v), 4 K/V heads, untied.
        "qwen2.5-7b": BudgetConfig(
            name="qwen2.5-7b", architecture="llama", model_type="qwen2", n_layer=28,
            d_model=3584, n_head=28, n_kv_head=4, d_ff=18944, vocab_size=152064,
            block_size=131072, tied_embedding=False, qkv_bias=True, micro_batch=1,
            seq_len=4096, precision="bf16"),
        # Mistral-7B-v0.1: LLaMA's block with a 4096-token sliding window.
        "mistral-7b": BudgetConfig(
            name="mistral-7b", architecture="llama", model_type="mistral", n_layer=32,
            d_model=4096, n_head=32, n_kv_head=8, d_ff=14336, vocab_size=32000,
            block_size=32768, tied_embedding=False, sliding_window=4096, micro_batch=1,
            seq_len=4096, precision="bf16"),
        **_gemma_presets(),
        # The trainer's tiny config (engine/gpt_config.py tiny_config), as our engine runs it.
        "tiny": BudgetConfig(
            name="tiny", n_layer=4, d_model=128, n_head=4, vocab_size=corpus_vocab_size(),
            block_size=128, micro_batch=16, seq_len=128, precision="fp32",
            activation_model="engine"),
    }


PRESET_NAMES = ("7b-example", "24-layer-example", "gpt2-small", "gpt2-medium", "gpt2-large",
                "gpt2-xl", "llama2-7b", "llama2-13b", "llama2-70b", "llama3.2-1b",
                "llama3.2-3b", "llama3.1-8b", "llama3.1-70b", "qwen2.5-7b", "mistral-7b",
                "gemma2-2b", "gemma3-1b", "7b-class", "tiny")


def preset(name: str, **changes) -> BudgetConfig:
    """A named configuration, optionally with some knobs changed."""
    presets = _presets()
    if name not in presets:
        raise BudgetError(f"unknown preset {name!r}; allowed: {', '.join(PRESET_NAMES)}.")
    return presets[name].with_(**changes) if changes else presets[name].validate()
