"""Settings of a budget: BudgetConfig, the presets, the byte sizes of each precision."""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field, replace


PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("sgd", "momentum", "adamw")
ACTIVATION_MODELS = ("rule", "transformer", "engine")
RECOMPUTE = ("none", "selective", "full")

# Bytes per element of the activations and of the parameter copy the model
# computes with. 16-bit policies keep an fp32 master copy for the optimizer.
STORAGE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
MASTER_BYTES = {"fp32": 0, "bf16": 4, "fp16": 4}
# Optimizer state is fp32 in every policy: momentum keeps one buffer, AdamW two.
OPTIMIZER_BUFFERS = {"sgd": 0, "momentum": 1, "adamw": 2}
OPTIMIZER_STATE_BYTES = 4
MASK_BYTES = 1          # a dropout mask element (one byte, as in Korthikanti et al.)
LOGITS_BYTES = 4        # the softmax of the cross-entropy is kept in fp32


class BudgetError(ValueError):
    """An impossible configuration; the message says what is allowed."""


# --------------------------------------------------------------------- config
@dataclass(frozen=True)
class BudgetConfig:
    """Every knob of the budget. Sizes are counts, not bytes.

    Model: a GPT-2 style decoder (learned positions, pre-LN, biases) with
    `n_layer` blocks of width `d_model`, `n_head` heads, an MLP of width
    `d_ff` (0 means 4 * d_model), vocabulary `vocab_size`, position table of
    `block_size` rows (0 means `seq_len`), tied or untied output head. Set
    `n_params` to use a plain parameter count instead of the formula (the
    shape is then only used for the activations and the attention FLOPs).
    """
    n_layer: int = 4
    d_model: int = 128
    n_head: int = 4
    vocab_size: int = 256
    d_ff: int = 0
    block_size: int = 0
    tied_embedding: bool = True
    n_params: int = 0
    micro_batch: int = 16
    seq_len: int = 128
    accumulation: int = 1
    precision: str = "fp32"
    optimizer: str = "adamw"
    activation_model: str = "transformer"
    tensors_per_layer: int = 16
    dropout: bool = False
    recompute: str = "none"
    name: str = field(default="custom", compare=False)

    def __post_init__(self):
        # numpy integers (from an array, a sweep) count as whole numbers; store
        # Python ints so products of sizes never overflow.
        for name, value in vars(self).items():
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                object.__setattr__(self, name, int(value))

    # Sizes read by the formulas; `ffn` and `positions` resolve the 0 defaults.
    @property
    def ffn(self) -> int:
        return self.d_ff or 4 * self.d_model

    @property
    def positions(self) -> int:
        return self.block_size or self.seq_len

    def validate(self) -> "BudgetConfig":
        """Return self, or raise BudgetError naming the knob, its value and the fix."""
        positive = ("n_layer", "d_model", "n_head", "vocab_size", "micro_batch",
                    "seq_len", "accumulation", "tensors_per_layer")
        for knob in positive:
            value = getattr(self, knob)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise BudgetError(f"{knob}={value!r} is not allowed: it must be a "
                                  f"positive whole number (1, 2, 3, ...).")
        for knob in ("d_ff", "block_size", "n_params"):
            value = getattr(self, knob)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise BudgetError(f"{knob}={value!r} is not allowed: it must be a "
                                  f"positive whole number, or 0 for the default.")
        if self.d_model % self.n_head:
            divisors = [h for h in range(1, min(self.d_model, 64) + 1) if self.d_model % h == 0]
            raise BudgetError(
                f"n_head={self.n_head} does not divide d_model={self.d_model}: every head "
                f"gets an equal share of the width. Allowed head counts for d_model="
                f"{self.d_model} include {divisors}.")
        if self.block_size and self.block_size < self.seq_len:
            raise BudgetError(
                f"seq_len={self.seq_len} is longer than block_size={self.block_size}, the "
                f"number of learned positions; use seq_len <= {self.block_size} or a larger "
                f"block_size (0 means block_size = seq_len).")
        for knob, allowed in (("precision", PRECISIONS), ("optimizer", OPTIMIZERS),
                              ("activation_model", ACTIVATION_MODELS),
                              ("recompute", RECOMPUTE)):
            if getattr(self, knob) not in allowed:
                raise BudgetError(f"{knob}={getattr(self, knob)!r} is unknown; allowed: "
                                  f"{', '.join(allowed)}.")
        if self.recompute == "selective" and self.activation_model == "rule":
            raise BudgetError(
                "recompute='selective' needs to know which tensors belong to the attention "
                "core, and the rule of thumb ('rule') does not; choose activation_model "
                "'transformer', or recompute 'none' or 'full'.")
        if self.activation_model == "engine":
            if self.dropout:
                raise BudgetError(
                    "the engine's reference GPT has no dropout; with activation_model="
                    "'engine' set dropout off.")
            if self.d_ff and self.d_ff != 4 * self.d_model:
                raise BudgetError(
                    f"the engine's reference GPT has an MLP of width 4*d_model="
                    f"{4 * self.d_model}, not d_ff={self.d_ff}; set d_ff to 0 or "
                    f"{4 * self.d_model}.")
            if not self.tied_embedding:
                raise BudgetError("the engine's reference GPT ties its output head to the "
                                  "token embedding; set tied_embedding on.")
        return self

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
        # The trainer's tiny config (engine/gpt_config.py tiny_config), as our engine runs it.
        "tiny": BudgetConfig(
            name="tiny", n_layer=4, d_model=128, n_head=4, vocab_size=corpus_vocab_size(),
            block_size=128, micro_batch=16, seq_len=128, precision="fp32",
            activation_model="engine"),
    }


PRESET_NAMES = ("7b-example", "24-layer-example", "gpt2-small", "7b-class", "tiny")


def preset(name: str, **changes) -> BudgetConfig:
    """A named configuration, optionally with some knobs changed."""
    presets = _presets()
    if name not in presets:
        raise BudgetError(f"unknown preset {name!r}; allowed: {', '.join(PRESET_NAMES)}.")
    return presets[name].with_(**changes) if changes else presets[name].validate()
