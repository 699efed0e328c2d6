"""What one training step of the fused trainer (engine.trainer's FusedGPT)
allocates, as one table: StepBuffers and LayerBuffers allocate from it, the
trainer's memory preflight sums it, and the budget's model of the fused trainer
(`engine.budget.activations.fused_trainer_saved`) reads what it keeps. A test
compares its bytes with the buffers a model really allocates.

It lies outside engine/trainer/ because the budget, on the tape's side of the
library, reads it too: both engines may import it (tests/test_layering.py).

Each entry is one array: its name (the attribute of StepBuffers or of
LayerBuffers), its group, its shape as a function of the step's `Dims`, and why
the step needs it. The groups, in the order they are allocated:

    stream    the residual stream entering each block and leaving the last
    layer     what one block's backward reads: one set per block, or one set
              shared by all blocks with checkpointing (refilled in the backward)
    final     the final layer norm and the logits
    scratch   kept from forward to backward by no one: the per-row losses and
              the backward's working buffers, shared by all blocks

The first three (`KEPT`) are the step's activations. Attention keeps its
probabilities, (B, H, T, T), with the standard kernel, and one log-sum-exp per
row, (B, H, T), with the flash kernel: O(T^2) against O(T) per head. GELU's
output is not kept: the backward writes it again (FusedGPT._gelu_backward).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

ATTENTION_KINDS = ("standard", "flash")
GROUPS = ("stream", "layer", "final", "scratch")
KEPT = ("stream", "layer", "final")


@dataclass(frozen=True)
class Dims:
    """What a buffer's shape depends on: micro-batch B, sequence T, width C,
    heads H, vocabulary V, blocks L; N = B*T rows."""
    B: int
    T: int
    C: int
    H: int
    V: int
    L: int

    @property
    def N(self) -> int:
        return self.B * self.T


def model_dims(cfg, B: int, T: int) -> Dims:
    """The Dims of a micro-batch of B sequences of T tokens for a GPTConfig."""
    return Dims(B, T, cfg.n_embd, cfg.n_head, cfg.vocab_size, cfg.n_layer)


@dataclass(frozen=True)
class Buffer:
    name: str                          # the attribute of StepBuffers or LayerBuffers
    group: str                         # one of GROUPS
    shape: Callable[[Dims], tuple]
    why: str
    attention: str | None = None       # allocated only with this attention kernel


BUFFERS = (
    Buffer("res", "stream", lambda d: (d.L + 1, d.N, d.C),
           "the residual stream entering each block and leaving the last"),
    Buffer("ln1", "layer", lambda d: (d.N, d.C), "layer norm 1's output: the qkv matmul's input"),
    Buffer("ln1_mean", "layer", lambda d: (d.N,), "its mean per row, for its backward"),
    Buffer("ln1_rstd", "layer", lambda d: (d.N,), "its 1/std per row, for its backward"),
    Buffer("qkv", "layer", lambda d: (d.B, d.T, 3 * d.C), "Q, K and V: attention's inputs"),
    Buffer("probs", "layer", lambda d: (d.B, d.H, d.T, d.T),
           "the attention probabilities, which the standard backward reads", "standard"),
    Buffer("lse", "layer", lambda d: (d.B, d.H, d.T),
           "one log-sum-exp per row: the flash backward rebuilds the probabilities "
           "tile by tile", "flash"),
    Buffer("atty", "layer", lambda d: (d.B, d.T, d.C),
           "attention's output: the projection's input"),
    Buffer("res_mid", "layer", lambda d: (d.N, d.C),
           "the residual stream after attention: layer norm 2's input"),
    Buffer("ln2", "layer", lambda d: (d.N, d.C), "layer norm 2's output: the fc matmul's input"),
    Buffer("ln2_mean", "layer", lambda d: (d.N,), "its mean per row, for its backward"),
    Buffer("ln2_rstd", "layer", lambda d: (d.N,), "its 1/std per row, for its backward"),
    Buffer("fc", "layer", lambda d: (d.N, 4 * d.C),
           "the fc matmul's output, bias not yet added: GELU's backward reads it"),
    Buffer("lnf", "final", lambda d: (d.N, d.C), "the final layer norm's output: the head's input"),
    Buffer("lnf_mean", "final", lambda d: (d.N,), "its mean per row, for its backward"),
    Buffer("lnf_rstd", "final", lambda d: (d.N,), "its 1/std per row, for its backward"),
    Buffer("logits", "final", lambda d: (d.N, d.V),
           "the logits, which the loss overwrites with their gradient"),
    Buffer("losses", "scratch", lambda d: (d.N,), "the loss of each row"),
    Buffer("proj", "scratch", lambda d: (d.N, d.C), "a projection's bias-free output"),
    Buffer("dres", "scratch", lambda d: (d.N, d.C), "the gradient of the residual stream"),
    Buffer("dln", "scratch", lambda d: (d.N, d.C), "the gradient at a layer norm's output"),
    Buffer("datty", "scratch", lambda d: (d.B, d.T, d.C), "the gradient at attention's output"),
    Buffer("dqkv", "scratch", lambda d: (d.B, d.T, 3 * d.C), "the gradient at Q, K and V"),
    Buffer("dgelu", "scratch", lambda d: (d.N, 4 * d.C),
           "the gradient at GELU's output, then (in place) at the fc output"),
    Buffer("gelu", "scratch", lambda d: (d.N, 4 * d.C),
           "GELU's output: written in the forward, and again in the backward"),
)


def check_attention(owner: str, attention: str) -> str:
    """`attention`, or a ValueError naming `owner` when it is not a kernel."""
    if attention not in ATTENTION_KINDS:
        raise ValueError(f"{owner}: attention={attention!r} is not a kernel; choose "
                         f"'standard' (saves the T x T probabilities) or 'flash' (saves one "
                         f"number per row)")
    return attention


def buffers(group: str, attention: str) -> list[Buffer]:
    """The entries of `group` allocated with this attention kernel, in order."""
    check_attention("fused_buffers", attention)
    return [b for b in BUFFERS if b.group == group and b.attention in (None, attention)]


def attention_buffer(attention: str) -> Buffer:
    """The one layer entry that depends on the attention kernel."""
    return next(b for b in buffers("layer", attention) if b.attention is not None)


def layer_sets(n_layer: int, checkpointing: bool) -> int:
    """How many sets of layer buffers a step holds: checkpointing shares one."""
    return 1 if checkpointing else n_layer


def elements(group: str, d: Dims, attention: str) -> dict[str, int]:
    """name -> elements of one set of `group`'s buffers."""
    return {b.name: math.prod(b.shape(d)) for b in buffers(group, attention)}


def step_elements(d: Dims, attention: str, checkpointing: bool) -> int:
    """Elements of every buffer of a step, each layer set counted."""
    return sum(sum(elements(g, d, attention).values())
               * (layer_sets(d.L, checkpointing) if g == "layer" else 1) for g in GROUPS)
