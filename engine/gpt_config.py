"""The GPT's shape and its parameters, shared by every implementation.

Two models compute the same function: the reference model on the tape engine
(`engine.nn`) and the fused numba trainer (`engine.trainer.model`). Both take their
weights from `init_params`, so the same seed gives the same weights, and
gradients can be compared name by name.

Layout (GPT-2 style): learned position embedding, pre-LayerNorm blocks,
causal multi-head attention, tanh-GELU MLP of width 4C, biases everywhere,
output projection tied to the token embedding `wte`. Weights are stored as
(in, out) so a linear layer is `x @ w + b`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int       # V: number of distinct tokens (characters)
    block_size: int = 128  # T: context length
    n_layer: int = 4      # L
    n_head: int = 4       # H
    n_embd: int = 128     # C

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPTConfig: n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                f"choose n_head among the divisors of n_embd, e.g. "
                f"{[h for h in range(1, min(self.n_embd, 16) + 1) if self.n_embd % h == 0]}")

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict:
        return asdict(self)


def tiny_config(vocab_size: int) -> GPTConfig:
    """The trainer's `tiny` model: T=128, L=4, H=4, C=128 (micro-batch B=16)."""
    return GPTConfig(vocab_size=vocab_size, block_size=128, n_layer=4, n_head=4, n_embd=128)


def param_shapes(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape, in the fixed order of the flat buffer."""
    V, T, C = cfg.vocab_size, cfg.block_size, cfg.n_embd
    shapes = {"wte": (V, C), "wpe": (T, C)}
    for i in range(cfg.n_layer):
        p = f"h{i}."
        shapes.update({
            p + "ln1_w": (C,), p + "ln1_b": (C,),
            p + "qkv_w": (C, 3 * C), p + "qkv_b": (3 * C,),
            p + "proj_w": (C, C), p + "proj_b": (C,),
            p + "ln2_w": (C,), p + "ln2_b": (C,),
            p + "fc_w": (C, 4 * C), p + "fc_b": (4 * C,),
            p + "fcproj_w": (4 * C, C), p + "fcproj_b": (C,),
        })
    shapes.update({"lnf_w": (C,), "lnf_b": (C,)})
    return shapes


def num_params(cfg: GPTConfig) -> int:
    return sum(int(np.prod(s)) for s in param_shapes(cfg).values())


def init_params(cfg: GPTConfig, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """GPT-2 initialisation: N(0, 0.02) weights, residual projections scaled
    by 1/sqrt(2L) (two residual adds per block), zero biases, unit LN gains."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        leaf = name.split(".")[-1]
        if leaf.endswith("_b"):
            value = np.zeros(shape)
        elif leaf in ("ln1_w", "ln2_w", "lnf_w"):
            value = np.ones(shape)
        else:
            std = 0.02
            if leaf in ("proj_w", "fcproj_w"):
                std /= np.sqrt(2 * cfg.n_layer)
            value = rng.normal(0.0, std, size=shape)
        params[name] = value.astype(dtype)
    return params
