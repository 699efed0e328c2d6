"""The training-step budget: parameters, FLOPs and bytes of one optimizer step.

Pure functions over one frozen `BudgetConfig`. The command line
(`python -m engine.budget`), the widget (`widgets.BudgetWidget`), the tests
and the lessons all call `budget(config)`, so they all read the same numbers.

What one training step costs
----------------------------
FLOPs. A matmul with a (K, M) weight costs 2*K*M FLOPs per token (a
multiply-add is two), so the forward pass costs 2 FLOPs per weight per token,
plus the attention term that has no weights: Q @ K^T and P @ V each cost
2*N*d per token and layer (the full N x N score matrix, as our engine
computes it). The backward pass runs two matmuls for every forward one
(dX = dY W^T and dW = X^T dY), so it costs 2x the forward. Recompute adds
forward work inside the backward: a whole forward with full recompute, the
attention core with selective recompute.

Memory. Three kinds of bytes live through a step:
  * fixed, set by the parameter count P: weights, fp32 master weights (only
    with 16-bit storage), gradients, optimizer state (SGD none, momentum one
    fp32 buffer, AdamW two). Mixed-precision AdamW: 2 + 2 + 4 + 4 + 4 = 16
    bytes per parameter;
  * activations, set by the batch shape: every tensor the backward pass will
    read, kept from the op that made it until that op's VJP runs;
  * small working buffers (the gradient flowing back, one op at a time),
    which we leave out except where the engine measures them.

The peak of a step, and what is resident when:
  1. before the forward: weights, master weights, optimizer state, and the
     gradient buffer (allocated once and accumulated into across the K
     micro-batches, then consumed by the optimizer);
  2. during the forward the saved activations pile up; they are all alive
     when the loss is computed;
  3. the backward walks the tape in reverse and frees each op's saved
     tensors as its VJP runs, while parameter gradients are summed into the
     gradient buffer; with recompute, the head and loss are freed first,
     then one block's (or one attention core's) insides are rebuilt and
     live for a moment on top of what the blocks kept;
  4. the optimizer reads the gradients and updates weights and state.
So the peak is reached at the end of the forward (without recompute) or
while the last block is rebuilt (with it):
    peak = weights + master + gradients + optimizer state + activation peak
    activation peak = saved - freed_first + max(freed_first, one rebuilt block)
(`Activations`; without recompute it is simply what the forward saved).
Accumulating K micro-batches adds tokens per step but not memory: the
activations of one micro-batch are freed before the next begins.

Three models of the activation bytes
------------------------------------
  "rule"        the source texts' rule of thumb: k saved tensors of
                B x N x d per layer. k=4 gives the 7B example's 17 GB,
                k=16 the 24-layer example's 12.9 GB.
  "transformer" a per-op count for a GPT block (see `transformer_layer_ops`)
                that agrees with Korthikanti et al. 2022, "Reducing
                Activation Recomputation in Large Transformer Models": per
                layer s*b*h*(34 + 5*a*s/h) bytes at 16-bit with dropout,
                34*s*b*h with selective recompute, 2*s*b*h with full recompute.
  "engine"      exactly what our tape engine saves for its reference GPT
                (`engine.nn.GPT`), tensor by tensor; `engine.memory` measures
                the same number.

Units: sizes are printed in decimal units (1 MB = 10^6 bytes, 1 GB = 10^9
bytes), FLOPs in G (10^9) and T (10^12), as the source texts do.
"""
from __future__ import annotations

import argparse
import json
import math
import numbers
import re
import sys
from dataclasses import asdict, dataclass, field, replace

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
            if self.recompute == "selective":
                raise BudgetError(
                    "our engine checkpoints whole blocks only; with activation_model="
                    "'engine' choose recompute 'none' or 'full'.")
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


# ----------------------------------------------------------------- parameters
def parameter_breakdown(cfg: BudgetConfig) -> dict[str, int]:
    """Parameter counts by part of the model (the formula, even when
    `n_params` overrides the total)."""
    L, d, V, f = cfg.n_layer, cfg.d_model, cfg.vocab_size, cfg.ffn
    per_layer = {
        "layer norms": 4 * d,
        "attention qkv": 3 * d * d + 3 * d,
        "attention projection": d * d + d,
        "mlp": d * f + f + f * d + d,
    }
    parts = {
        "token embedding": V * d,
        "position embedding": cfg.positions * d,
        **{k: L * v for k, v in per_layer.items()},
        "final layer norm": 2 * d,
    }
    if not cfg.tied_embedding:
        parts["output head"] = d * V
    return parts


def parameter_count(cfg: BudgetConfig) -> int:
    """P: `n_params` when given, else the sum of `parameter_breakdown`."""
    return cfg.n_params or sum(parameter_breakdown(cfg).values())


def matmul_weights(cfg: BudgetConfig) -> int:
    """The weights that multiply an activation once per token: every block's
    four matrices and the output head (the token table, when tied). Biases,
    norm gains and the embedding lookups do no matmul. With a plain parameter
    count, all of `n_params` is taken to be matmul weights."""
    if cfg.n_params:
        return cfg.n_params
    d = cfg.d_model
    return cfg.n_layer * (4 * d * d + 2 * d * cfg.ffn) + d * cfg.vocab_size


# ---------------------------------------------------------------------- FLOPs
def attention_flops_per_token(cfg: BudgetConfig) -> int:
    """Forward FLOPs with no weights: Q @ K^T and P @ V, 2*N*d each per layer
    (per head 2*N*(d/a), times a heads), over the full N x N matrix."""
    return cfg.n_layer * 2 * (2 * cfg.seq_len * cfg.d_model)


def forward_flops_per_token(cfg: BudgetConfig) -> int:
    """2 FLOPs per matmul weight per token, plus the attention term."""
    return 2 * matmul_weights(cfg) + attention_flops_per_token(cfg)


def recompute_flops_per_token(cfg: BudgetConfig) -> int:
    """Forward work redone inside the backward pass."""
    if cfg.recompute == "full":
        return forward_flops_per_token(cfg)
    if cfg.recompute == "selective":
        return attention_flops_per_token(cfg)
    return 0


def tokens_per_micro_batch(cfg: BudgetConfig) -> int:
    return cfg.micro_batch * cfg.seq_len


def tokens_per_step(cfg: BudgetConfig) -> int:
    """K micro-batches of B sequences of N tokens feed one optimizer step."""
    return cfg.accumulation * tokens_per_micro_batch(cfg)


def flops(cfg: BudgetConfig) -> dict[str, dict[str, int]]:
    """Forward, backward (2x forward), recompute and total FLOPs, per token,
    per micro-batch and per optimizer step."""
    fwd = forward_flops_per_token(cfg)
    per_token = {"forward": fwd, "backward": 2 * fwd,
                 "recompute": recompute_flops_per_token(cfg)}
    per_token["total"] = sum(per_token.values())
    scale = {"per_token": 1, "per_micro_batch": tokens_per_micro_batch(cfg),
             "per_step": tokens_per_step(cfg)}
    return {where: {k: v * n for k, v in per_token.items()} for where, n in scale.items()}


# ------------------------------------------------------------- fixed memory
def bytes_per_parameter(precision: str, optimizer: str) -> dict[str, int]:
    """Bytes per parameter of each fixed buffer: weights and gradients in the
    storage precision, an fp32 master copy for 16-bit storage, fp32 optimizer
    state. Mixed-precision (bf16/fp16) AdamW: 2 + 2 + 4 + 8 = 16."""
    if precision not in PRECISIONS:
        raise BudgetError(f"precision={precision!r} is unknown; allowed: {', '.join(PRECISIONS)}.")
    if optimizer not in OPTIMIZERS:
        raise BudgetError(f"optimizer={optimizer!r} is unknown; allowed: {', '.join(OPTIMIZERS)}.")
    return {
        "weights": STORAGE_BYTES[precision],
        "master weights": MASTER_BYTES[precision],
        "gradients": STORAGE_BYTES[precision],
        "optimizer state": OPTIMIZER_BUFFERS[optimizer] * OPTIMIZER_STATE_BYTES,
    }


def fixed_bytes(cfg: BudgetConfig) -> dict[str, int]:
    """Bytes of weights, master weights, gradients and optimizer state."""
    P = parameter_count(cfg)
    return {k: P * b for k, b in bytes_per_parameter(cfg.precision, cfg.optimizer).items()}


# ---------------------------------------------------------------- activations
@dataclass(frozen=True)
class Saved:
    """One kind of tensor kept for the backward pass."""
    op: str             # the op whose VJP reads it
    tensor: str         # what it is
    elements: int       # elements per occurrence
    itemsize: int       # bytes per element
    count: int = 1      # occurrences (e.g. one per layer)
    until_end: bool = False  # kept until the very last VJP (the embedding's)

    @property
    def bytes(self) -> int:
        return self.elements * self.itemsize * self.count


def activation_bytes_per_element(cfg: BudgetConfig) -> int:
    return STORAGE_BYTES[cfg.precision]


def tensor_bytes(cfg: BudgetConfig) -> int:
    """One B x N x d activation tensor (the source texts' unit)."""
    return cfg.micro_batch * cfg.seq_len * cfg.d_model * activation_bytes_per_element(cfg)


def transformer_layer_ops(cfg: BudgetConfig) -> list[Saved]:
    """What one pre-LN GPT block saves for its backward, op by op, with s=N,
    b=B, h=d, a heads, e bytes per element, f = MLP width:

        op                 saved tensor                 elements   bytes
        layer norm 1       its input                    sbh        e
        qkv matmul         its input (LN1 output)       sbh        e
        Q @ K^T            Q and K                      2sbh       e
        softmax            its output                   as^2b      e
        attention dropout  mask                         as^2b      1   (dropout)
        P @ V              P (dropout output) and V     as^2b+sbh  e   (P: dropout only;
                                                                    else the softmax output)
        projection matmul  its input                    sbh        e
        residual dropout   mask                         sbh        1   (dropout)
        layer norm 2       its input                    sbh        e
        fc matmul          its input (LN2 output)       sbh        e
        GELU               its input                    sbf        e
        fc-proj matmul     its input (GELU output)      sbf        e
        residual dropout   mask                         sbh        1   (dropout)

    With e=2, f=4h and dropout this is 34*sbh + 5*as^2*b bytes, the per-layer
    total of Korthikanti et al. 2022. Selective recompute drops the three
    as^2b tensors (rebuilt in the backward); full recompute keeps only the
    block input (the next block's saved LN input is that same tensor, so we
    count it once per block: 2*sbh at 16-bit).
    """
    s, b, h, a, f = cfg.seq_len, cfg.micro_batch, cfg.d_model, cfg.n_head, cfg.ffn
    e = activation_bytes_per_element(cfg)
    sbh, scores = s * b * h, a * s * s * b
    ops = [
        Saved("layer norm 1", "input", sbh, e),
        Saved("qkv matmul", "input", sbh, e),
        Saved("Q @ K^T", "Q and K", 2 * sbh, e),
        Saved("softmax", "output", scores, e, 1),
    ]
    if cfg.dropout:
        ops += [Saved("attention dropout", "mask", scores, MASK_BYTES),
                Saved("P @ V", "P (dropout output)", scores, e)]
    ops += [
        Saved("P @ V", "V", sbh, e),
        Saved("projection matmul", "input", sbh, e),
    ]
    if cfg.dropout:
        ops.append(Saved("residual dropout (attention)", "mask", sbh, MASK_BYTES))
    ops += [
        Saved("layer norm 2", "input", sbh, e),
        Saved("fc matmul", "input", sbh, e),
        Saved("GELU", "input", s * b * f, e),
        Saved("fc-proj matmul", "input", s * b * f, e),
    ]
    if cfg.dropout:
        ops.append(Saved("residual dropout (mlp)", "mask", sbh, MASK_BYTES))
    return ops


ATTENTION_CORE = ("softmax", "attention dropout")  # rebuilt by selective recompute


def _is_attention_core(item: Saved) -> bool:
    return item.op in ATTENTION_CORE or item.tensor.startswith("P (")


def transformer_outside_ops(cfg: BudgetConfig) -> list[Saved]:
    """What the model saves outside its blocks (our own count; the paper's
    per-layer formula covers the blocks only): the embedding dropout mask,
    the final layer norm's input, the head matmul's input and the
    cross-entropy's softmax over the vocabulary, kept in fp32."""
    s, b, h = cfg.seq_len, cfg.micro_batch, cfg.d_model
    e = activation_bytes_per_element(cfg)
    ops = []
    if cfg.dropout:
        ops.append(Saved("embedding dropout", "mask", s * b * h, MASK_BYTES, until_end=True))
    ops += [
        Saved("final layer norm", "input", s * b * h, e),
        Saved("head matmul", "input", s * b * h, e),
        Saved("cross-entropy", "softmax over the vocabulary", s * b * cfg.vocab_size,
              LOGITS_BYTES),
    ]
    return ops


def korthikanti_layer_bytes(s: int, b: int, h: int, a: int, recompute: str = "none") -> int:
    """The published per-layer activation bytes (16-bit, with dropout):
    s*b*h*(34 + 5*a*s/h) with no recompute, 34*s*b*h with selective
    recompute, 2*s*b*h with full recompute. Exact integers."""
    if recompute == "none":
        return 34 * s * b * h + 5 * a * s * s * b
    if recompute == "selective":
        return 34 * s * b * h
    if recompute == "full":
        return 2 * s * b * h
    raise BudgetError(f"recompute={recompute!r} is unknown; allowed: {', '.join(RECOMPUTE)}.")


@dataclass(frozen=True)
class Activations:
    """Activation bytes of one micro-batch under one model.

    `saved` is what is alive when the forward pass ends; `peak` the most that
    is alive at any moment of the step. They differ only with recompute: the
    backward first frees what lies after the last block (the head, the loss),
    then rebuilds one block (or one attention core) at a time on top of what
    the blocks kept, so

        peak = saved - freed_before_blocks + max(freed_before_blocks, rebuilt)

    where `rebuilt` is one block's (or attention core's) saved tensors.
    """
    model: str
    saved: int            # alive at the end of the forward pass
    peak: int             # most alive at any moment of the forward and backward
    items: tuple = ()     # the Saved entries behind `saved`

    @property
    def transient(self) -> int:
        """What recompute adds on top of `saved` at the peak."""
        return self.peak - self.saved


def _with_recompute_peak(model: str, kept: list, outside: list, rebuilt: int) -> Activations:
    """Activations whose peak follows the backward's order (see Activations)."""
    items = tuple(kept + outside)
    saved = sum(x.bytes for x in items)
    freed_first = sum(x.bytes for x in outside if not x.until_end)
    peak = saved - freed_first + max(freed_first, rebuilt) if rebuilt else saved
    return Activations(model, saved, peak, items)


def _rule_activations(cfg: BudgetConfig) -> Activations:
    e = activation_bytes_per_element(cfg)
    unit = tensor_bytes(cfg) // e
    k, L = cfg.tensors_per_layer, cfg.n_layer
    if cfg.recompute == "full":  # keep each block's input, rebuild one block's k tensors
        kept = [Saved("block", "input (checkpoint)", unit, e, L)]
        return _with_recompute_peak("rule", kept, [], k * unit * e)
    return _with_recompute_peak("rule", [Saved("block", f"{k} tensors of B x N x d",
                                               k * unit, e, L)], [], 0)


def _transformer_activations(cfg: BudgetConfig) -> Activations:
    L = cfg.n_layer
    layer = transformer_layer_ops(cfg)
    outside = transformer_outside_ops(cfg)
    e = activation_bytes_per_element(cfg)
    sbh = cfg.seq_len * cfg.micro_batch * cfg.d_model
    if cfg.recompute == "full":
        kept = [Saved("block", "input (checkpoint)", sbh, e, L)]
        rebuilt = sum(x.bytes for x in layer)
    elif cfg.recompute == "selective":
        kept = [replace(x, count=L) for x in layer if not _is_attention_core(x)]
        rebuilt = sum(x.bytes for x in layer if _is_attention_core(x))
    else:
        kept, rebuilt = [replace(x, count=L) for x in layer], 0
    return _with_recompute_peak("transformer", kept, outside, rebuilt)


def activations(cfg: BudgetConfig) -> Activations:
    """Activation bytes of one micro-batch under `cfg.activation_model`."""
    cfg.validate()
    if cfg.activation_model == "rule":
        return _rule_activations(cfg)
    if cfg.activation_model == "transformer":
        return _transformer_activations(cfg)
    return engine_activations(cfg)


# ----------------------------------------------------- "this engine" model
INDEX_BYTES = 8  # the engine keeps token ids and targets as int64


def engine_block_saved(cfg: BudgetConfig) -> list[Saved]:
    """What one block of `engine.nn.GPT` saves (the list in engine/nn.py's
    docstring), per block, with f bytes per float element:

        ln1 layer_norm        xhat (B,T,C), rstd (B,T)
        attn qkv matmul       its input ln1(x) (B,T,C)
             causal_attention q, k, v: views of one (B,T,3C) buffer, att (B,H,T,T)
             proj matmul      the merged heads (B,T,C)
        ln2 layer_norm        xhat (B,T,C), rstd (B,T)
        mlp fc matmul         its input ln2(x) (B,T,C)
             gelu             its input (B,T,4C)
             fcproj matmul    gelu's output (B,T,4C)

    = f * (16*B*T*C + 2*B*T + B*H*T*T). The weights the matmuls keep for dx
    are parameters, not activations; bias and residual adds save nothing.
    """
    B_, T, C, H = cfg.micro_batch, cfg.seq_len, cfg.d_model, cfg.n_head
    f = activation_bytes_per_element(cfg)
    btc, bt = B_ * T * C, B_ * T
    return [
        Saved("ln1 layer_norm", "xhat", btc, f), Saved("ln1 layer_norm", "rstd", bt, f),
        Saved("attn qkv matmul", "input ln1(x)", btc, f),
        Saved("attn causal_attention", "q, k, v (one buffer)", 3 * btc, f),
        Saved("attn causal_attention", "att", B_ * H * T * T, f),
        Saved("attn proj matmul", "merged heads", btc, f),
        Saved("ln2 layer_norm", "xhat", btc, f), Saved("ln2 layer_norm", "rstd", bt, f),
        Saved("mlp fc matmul", "input ln2(x)", btc, f),
        Saved("mlp gelu", "input", 4 * btc, f),
        Saved("mlp fcproj matmul", "gelu output", 4 * btc, f),
    ]


def engine_outside_saved(cfg: BudgetConfig) -> list[Saved]:
    """What `engine.nn.GPT` saves outside its blocks: the token ids, the final
    layer norm, the tied head's input, the loss's probabilities and targets."""
    B_, T, C, V = cfg.micro_batch, cfg.seq_len, cfg.d_model, cfg.vocab_size
    f = activation_bytes_per_element(cfg)
    return [
        Saved("embed embedding", "ids", B_ * T, INDEX_BYTES, until_end=True),
        Saved("lnf layer_norm", "xhat", B_ * T * C, f),
        Saved("lnf layer_norm", "rstd", B_ * T, f),
        Saved("head matmul", "input lnf(x)", B_ * T * C, f),
        Saved("loss cross_entropy", "probs", B_ * T * V, f),
        Saved("loss cross_entropy", "targets", B_ * T, INDEX_BYTES),
    ]


def engine_saved_tensors(cfg: BudgetConfig) -> list[Saved]:
    """Every tensor `engine.nn.GPT` keeps for its backward, one entry per kind
    (`count` = number of blocks). With recompute='full' each block keeps only
    its input (B,T,C), and its insides are rebuilt during the backward."""
    block = engine_block_saved(cfg)
    if cfg.recompute == "full":
        f = activation_bytes_per_element(cfg)
        kept = [Saved("block", "input (checkpoint)", cfg.micro_batch * cfg.seq_len
                      * cfg.d_model, f, cfg.n_layer)]
    else:
        kept = [replace(x, count=cfg.n_layer) for x in block]
    return kept + engine_outside_saved(cfg)


def engine_activations(cfg: BudgetConfig) -> Activations:
    """Exactly the bytes our tape engine saves for `engine.nn.GPT` (float
    tensors at the policy's bytes per element: fp32 = 4, as the engine runs;
    ids and targets at 8). `engine.memory` measures the same number."""
    items = engine_saved_tensors(cfg)
    n_kept = 1 if cfg.recompute == "full" else len(engine_block_saved(cfg))
    rebuilt = sum(x.bytes for x in engine_block_saved(cfg)) if cfg.recompute == "full" else 0
    return _with_recompute_peak("engine", items[:n_kept], items[n_kept:], rebuilt)


# Largest run `measure` starts: a few seconds of numpy on a laptop.
MEASURE_MAX_ACTIVATION_BYTES = 1_500_000_000
MEASURE_MAX_FLOPS = 3e11


def measurable(cfg: BudgetConfig) -> BudgetConfig:
    """The configuration `measure` runs: `cfg` as our engine runs it (fp32,
    the engine activation model), or BudgetError saying what to change."""
    cfg.validate()
    if cfg.dropout or not cfg.tied_embedding or (cfg.d_ff and cfg.d_ff != 4 * cfg.d_model):
        raise BudgetError(
            "our engine's GPT has no dropout, a tied head and an MLP of width 4d; turn "
            "dropout off, tie the head and set the MLP width to 0 (4d) to measure.")
    if cfg.recompute == "selective":
        raise BudgetError("our engine checkpoints whole blocks only; set recompute 'none' "
                          "or 'full' to measure.")
    run = cfg.with_(activation_model="engine", precision="fp32", n_params=0)
    acts = engine_activations(run).peak
    work = flops(run)["per_micro_batch"]["forward"] * 3
    if acts > MEASURE_MAX_ACTIVATION_BYTES or work > MEASURE_MAX_FLOPS:
        raise BudgetError(
            f"this shape is too large to measure here ({human_bytes(acts)} of activations, "
            f"{human_flops(work)} per step; the limits are "
            f"{human_bytes(MEASURE_MAX_ACTIVATION_BYTES)} and {human_flops(MEASURE_MAX_FLOPS)}). "
            f"Reduce B, N, L or d, e.g. the 'tiny' preset.")
    return run


def measure(cfg: BudgetConfig, seed: int = 0) -> dict:
    """Run one forward and backward of `engine.nn.GPT` at this shape under
    `engine.memory` (with every block checkpointed by `engine.recompute`
    when recompute='full') and return measured bytes beside the engine
    model's prediction:
      * activations alive at the end of the forward, and their peak over the
        step, from the tape's timeline;
      * weights and gradients: the nbytes of the real arrays;
      * the step peak without optimizer state (weights + gradients +
        activation peak): the engine has no optimizer state to measure, so
        that part of `budget(...).peak` is left out on both sides;
      * the timeline itself, as (phase, op, live bytes)."""
    import numpy as np

    from . import memory
    from .recompute import checkpointed
    from .gpt_config import GPTConfig, init_params
    from .nn import GPT

    run = measurable(cfg)
    gcfg = GPTConfig(vocab_size=run.vocab_size, block_size=run.positions,
                     n_layer=run.n_layer, n_head=run.n_head, n_embd=run.d_model)
    model = GPT(gcfg, init_params(gcfg, seed=seed, dtype=np.float32))
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, run.vocab_size, size=(run.micro_batch, run.seq_len))
    targets = rng.integers(0, run.vocab_size, size=(run.micro_batch, run.seq_len))
    policy = "every" if run.recompute == "full" else "none"
    with memory.record() as mem:
        with checkpointed(model, policy):
            loss = model(ids, targets)
        loss.backward()
    timeline = [(p.phase, p.label, p.live_bytes) for p in mem.timeline]
    first_backward = next(i for i, (phase, _, _) in enumerate(timeline) if phase == "backward")
    end_of_forward = timeline[first_backward - 1][2]
    weights = sum(p.data.nbytes for p in model.parameters().values())
    grads = sum(p.grad.nbytes for p in model.parameters().values() if p.grad is not None)
    predicted = budget(run)
    return {
        "shape": (f"L={run.n_layer} d={run.d_model} H={run.n_head} V={run.vocab_size} "
                  f"B={run.micro_batch} N={run.seq_len}, fp32"
                  + (", every block checkpointed" if policy == "every" else "")),
        "config": run,
        "predicted_saved": predicted.activations.saved,
        "measured_saved": end_of_forward,
        "predicted_peak": predicted.activations.peak,
        "measured_peak": mem.peak_bytes,
        "predicted_weights": predicted.fixed["weights"],
        "measured_weights": weights,
        "predicted_gradients": predicted.fixed["gradients"],
        "measured_gradients": grads,
        "predicted_step_peak": (predicted.fixed["weights"] + predicted.fixed["gradients"]
                                + predicted.activations.peak),
        "measured_step_peak": weights + grads + mem.peak_bytes,
        "timeline": timeline,
        "loss": float(loss.data),
    }


# --------------------------------------------------------------- the budget
@dataclass(frozen=True)
class Budget:
    """Everything one training step costs, in integers (FLOPs and bytes)."""
    config: BudgetConfig
    parameters: int
    parameter_breakdown: dict
    flops: dict
    fixed: dict
    activations: Activations
    one_tensor_bytes: int

    @property
    def fixed_total(self) -> int:
        return sum(self.fixed.values())

    @property
    def peak(self) -> int:
        return self.fixed_total + self.activations.peak

    def memory(self) -> dict[str, int]:
        """The categories of the stacked bar, in the order they are resident."""
        return {**self.fixed, "activations": self.activations.saved,
                "recompute transient": self.activations.transient}

    def as_dict(self) -> dict:
        cfg = asdict(self.config)
        return {
            "config": cfg,
            "parameters": self.parameters,
            "parameter_breakdown": self.parameter_breakdown,
            "tokens": {"per_micro_batch": tokens_per_micro_batch(self.config),
                       "per_step": tokens_per_step(self.config)},
            "flops": self.flops,
            "bytes_per_parameter": bytes_per_parameter(self.config.precision,
                                                       self.config.optimizer),
            "memory": {**self.memory(), "fixed_total": self.fixed_total,
                       "activations_peak": self.activations.peak, "peak": self.peak},
            "one_tensor_bytes": self.one_tensor_bytes,
            "activation_items": [{**asdict(x), "bytes": x.bytes} for x in self.activations.items],
        }


def budget(cfg: BudgetConfig) -> Budget:
    """The whole training-step budget for one configuration."""
    cfg.validate()
    return Budget(config=cfg, parameters=parameter_count(cfg),
                  parameter_breakdown=parameter_breakdown(cfg), flops=flops(cfg),
                  fixed=fixed_bytes(cfg), activations=activations(cfg),
                  one_tensor_bytes=tensor_bytes(cfg))


def crossover_batch(cfg: BudgetConfig, max_batch: int = 1 << 20) -> int | None:
    """The smallest micro-batch B (at this N) whose activation peak exceeds
    the fixed memory (weights + master + gradients + optimizer state), or
    None if none up to `max_batch` does. Activations grow with B; the fixed
    memory does not."""
    fixed = budget(cfg).fixed_total

    def over(b: int) -> bool:
        return activations(replace(cfg, micro_batch=b)).peak > fixed

    if not over(max_batch):
        return None
    lo, hi = 1, max_batch  # over(hi) is true; find the first b with over(b)
    if over(lo):
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if over(mid) else (mid, hi)
    return hi


def batch_sweep(cfg: BudgetConfig, batches) -> dict[str, list[int]]:
    """Memory against B x N: for each micro-batch B (at this N) the tokens
    B*N, the fixed bytes (flat) and the activation peak (growing)."""
    fixed = budget(cfg).fixed_total
    rows = {"micro_batch": [], "tokens": [], "fixed": [], "activations": [], "peak": []}
    for b in batches:
        acts = activations(cfg.with_(micro_batch=int(b))).peak
        rows["micro_batch"].append(int(b))
        rows["tokens"].append(int(b) * cfg.seq_len)
        rows["fixed"].append(fixed)
        rows["activations"].append(acts)
        rows["peak"].append(fixed + acts)
    return rows


def recompute_tradeoff(cfg: BudgetConfig) -> dict[str, int]:
    """What `cfg.recompute` buys against no recompute: activation-peak bytes
    saved and FLOPs per step added."""
    base = budget(cfg.with_(recompute="none"))
    this = budget(cfg)
    return {"bytes_saved": base.activations.peak - this.activations.peak,
            "flops_added": this.flops["per_step"]["total"] - base.flops["per_step"]["total"],
            "base_activation_peak": base.activations.peak,
            "base_flops_per_step": base.flops["per_step"]["total"]}


# ------------------------------------------------------------ human output
_BYTE_UNITS = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_FLOP_UNITS = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def _scaled(value: float, units, suffix: str) -> str:
    """Three significant digits in the largest unit the value reaches."""
    for scale, unit in units:
        if value >= scale:
            shown = value / scale
            text = f"{shown:.3g}" if shown < 999.5 else f"{shown:.0f}"
            return f"{text} {unit}{suffix}"
    return f"{value:.3g} {suffix}"


def human_bytes(n: float) -> str:
    """Decimal units, three significant digits: 134217728 -> '134 MB'."""
    return _scaled(float(n), _BYTE_UNITS, "B")


def human_flops(n: float) -> str:
    """FLOPs with G/T prefixes, three significant digits: 7.5e11 -> '750 GFLOP'."""
    return _scaled(float(n), _FLOP_UNITS, "FLOP")


def describe(b: Budget) -> str:
    """The human-readable report the command line prints."""
    c = b.config
    shape = (f"L={c.n_layer} d={c.d_model} heads={c.n_head} V={c.vocab_size} "
             f"d_ff={c.ffn} positions={c.positions} "
             f"{'tied' if c.tied_embedding else 'untied'} head")
    source = "given" if c.n_params else "from the shape"
    lines = [
        f"model      {c.name}: {shape}",
        f"parameters {b.parameters:,} ({human_count(b.parameters)}, {source})",
        f"batch      B={c.micro_batch} x N={c.seq_len}, accumulation K={c.accumulation}: "
        f"{tokens_per_micro_batch(c):,} tokens per micro-batch, "
        f"{tokens_per_step(c):,} per optimizer step",
        f"policy     {c.precision} storage"
        + (" + fp32 master weights" if MASTER_BYTES[c.precision] else "")
        + f", {c.optimizer}, activations: {c.activation_model} model"
        + (f" ({c.tensors_per_layer} tensors per layer)" if c.activation_model == "rule" else "")
        + (", dropout" if c.dropout else "") + f", recompute {c.recompute}",
        "",
        f"{'FLOPs':<12}{'per token':>14}{'per micro-batch':>18}{'per step':>16}",
    ]
    for k in ("forward", "backward", "recompute", "total"):
        row = [b.flops[w][k] for w in ("per_token", "per_micro_batch", "per_step")]
        lines.append(f"  {k:<10}" + "".join(f"{human_flops(v):>{w}}"
                                            for v, w in zip(row, (14, 18, 16))))
    bpp = bytes_per_parameter(c.precision, c.optimizer)
    lines += ["", "memory"]
    for k, v in b.fixed.items():
        lines.append(f"  {k:<22}{human_bytes(v):>12}   ({bpp[k]} bytes/param)")
    lines.append(f"  {'fixed total':<22}{human_bytes(b.fixed_total):>12}   "
                 f"({sum(bpp.values())} bytes/param)")
    lines.append(f"  {'one B x N x d tensor':<22}{human_bytes(b.one_tensor_bytes):>12}")
    lines.append(f"  {'activations (saved)':<22}{human_bytes(b.activations.saved):>12}")
    if b.activations.transient:
        lines.append(f"  {'recompute transient':<22}{human_bytes(b.activations.transient):>12}")
    lines.append(f"  {'peak of the step':<22}{human_bytes(b.peak):>12}   "
                 f"(fixed total + activation peak)")
    return "\n".join(lines)


def human_count(n: int) -> str:
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


# ------------------------------------------------------------ command line
_KNOBS = {  # flag -> (config field, type, help)
    "--layers": ("n_layer", int, "number of blocks L"),
    "--width": ("d_model", int, "model width d (C)"),
    "--heads": ("n_head", int, "attention heads a; must divide the width"),
    "--vocab": ("vocab_size", int, "vocabulary size V"),
    "--mlp-width": ("d_ff", int, "MLP width (0: 4 x width)"),
    "--positions": ("block_size", int, "learned positions (0: the sequence length)"),
    "--params": ("n_params", int, "plain parameter count instead of the formula (0: formula)"),
    "--batch": ("micro_batch", int, "micro-batch B (sequences)"),
    "--seq": ("seq_len", int, "sequence length N (tokens)"),
    "--accum": ("accumulation", int, "micro-batches per optimizer step K"),
    "--tensors-per-layer": ("tensors_per_layer", int, "k of the rule of thumb"),
}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m engine.budget",
        description="The training-step budget of a GPT-style model: parameters, FLOPs "
                    "(forward, backward, recompute; per token, micro-batch and step) and "
                    "bytes (weights, master weights, gradients, optimizer state, "
                    "activations, peak). Start from a preset and change any knob.",
        epilog="examples:\n  python -m engine.budget --preset 7b-example\n"
               "  python -m engine.budget --preset gpt2-small --batch 4 --precision bf16 "
               "--recompute full\n  python -m engine.budget --preset tiny --json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny",
                    help=f"starting configuration: {', '.join(PRESET_NAMES)} (default: tiny)")
    for flag, (_, typ, text) in _KNOBS.items():
        ap.add_argument(flag, type=typ, help=text)
    ap.add_argument("--untied", action="store_true", help="separate output head (default tied)")
    ap.add_argument("--precision", help=f"one of {', '.join(PRECISIONS)} "
                    "(16-bit ones keep fp32 master weights)")
    ap.add_argument("--optimizer", help=f"one of {', '.join(OPTIMIZERS)}")
    ap.add_argument("--activations", dest="activation_model",
                    help=f"activation model: {', '.join(ACTIVATION_MODELS)}")
    ap.add_argument("--dropout", choices=("on", "off"), help="dropout masks in the "
                    "transformer model")
    ap.add_argument("--recompute", help=f"one of {', '.join(RECOMPUTE)}")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    return ap


def config_from_args(args: argparse.Namespace) -> BudgetConfig:
    changes = {field_: getattr(args, flag.lstrip("-").replace("-", "_"))
               for flag, (field_, _, _) in _KNOBS.items()}
    changes = {k: v for k, v in changes.items() if v is not None}
    for knob in ("precision", "optimizer", "activation_model", "recompute"):
        if getattr(args, knob) is not None:
            changes[knob] = getattr(args, knob)
    if args.untied:
        changes["tied_embedding"] = False
    if args.dropout is not None:
        changes["dropout"] = args.dropout == "on"
    return preset(args.preset, **changes)


_FLAG_OF = {**{field_: flag for flag, (field_, _, _) in _KNOBS.items()},
            "activation_model": "--activations", "precision": "--precision",
            "optimizer": "--optimizer", "recompute": "--recompute", "dropout": "--dropout",
            "tied_embedding": "--untied"}


def _with_flags(message: str) -> str:
    """Say `--batch 0` where the library says `micro_batch=0`."""
    for field_, flag in _FLAG_OF.items():
        message = re.sub(rf"(?<![\w-]){field_}[= ]", f"{flag} ", message)
    return message


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        b = budget(config_from_args(args))
    except BudgetError as exc:
        print(f"error: {_with_flags(str(exc))}", file=sys.stderr)
        return 2
    try:
        print(json.dumps(b.as_dict(), indent=1) if args.json else describe(b))
    except BrokenPipeError:  # `... | head` closed the pipe early: not an error of ours
        sys.stderr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
