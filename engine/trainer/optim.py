"""Optimizers over one flat parameter buffer: AdamW, clipping, a learning-rate schedule.

The trainer keeps every parameter in one contiguous array (and every gradient
in another), each named tensor a view into it. The optimizer therefore sees
two flat arrays, and one fused kernel (engine/trainer/kernels/adamw.py) updates all of
them in one pass. Weight decay is per segment of the flat buffer: the
matrices decay, the biases and LayerNorm gains do not.

    opt = AdamW(flat_params, segments, lr=1e-3, weight_decay=0.1)
    norm = global_norm(flat_grads)                # log it: the best health signal
    opt.step(flat_grads, grad_scale=clip_scale(norm, max_norm=1.0))
"""
from __future__ import annotations

import math

import numpy as np

from . import arena
from .kernels.adamw import adamw_update, clip_scale, global_norm, work_items

__all__ = ["AdamW", "global_norm", "clip_scale", "lr_at"]


class AdamW:
    """AdamW (decoupled weight decay, as torch.optim.AdamW) over a flat buffer.

    params: 1-D array updated in place. segments: (start, stop, decays) triples
    covering the buffer, decays a bool (apply weight_decay there or not)."""

    def __init__(self, params: np.ndarray, segments, *, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        if params.ndim != 1 or not params.flags.c_contiguous:
            raise ValueError(f"AdamW: params must be a flat C-contiguous array, got shape "
                             f"{params.shape}; pass the model's flat buffer")
        covered = sum(stop - start for start, stop, _ in segments)
        if covered != params.size:
            raise ValueError(f"AdamW: segments cover {covered} of {params.size} parameters")
        self.params = params
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, weight_decay
        self.segments = [(int(a), int(b), bool(d)) for a, b, d in segments]
        self.items = work_items([(a, b, weight_decay if d else 0.0)
                                 for a, b, d in self.segments])
        self.m = arena.zeros(params.size, params.dtype)     # on huge pages where
        self.v = arena.zeros(params.size, params.dtype)     # they fill one
        self.t = 0

    def step(self, grads: np.ndarray, *, grad_scale: float = 1.0, lr: float | None = None):
        """Update params from grads * grad_scale (grad_scale carries the clipping)."""
        if grads.shape != self.params.shape or grads.dtype != self.params.dtype:
            raise ValueError(f"AdamW.step: grads {grads.shape} {grads.dtype} do not match "
                             f"params {self.params.shape} {self.params.dtype}")
        self.t += 1
        adamw_update(self.params, grads, self.m, self.v, self.items,
                     lr=self.lr if lr is None else lr, step=self.t, beta1=self.betas[0],
                     beta2=self.betas[1], eps=self.eps, grad_scale=grad_scale)

    def load_state_dict(self, state: dict) -> None:
        for key in ("m", "v"):
            if state[key].shape != self.params.shape:
                raise ValueError(f"AdamW.load_state_dict: {key} has shape {state[key].shape}, "
                                 f"the parameters {self.params.shape}")
            getattr(self, key)[...] = state[key]
        self.t = int(state["t"])


def lr_at(step: int, *, lr: float, warmup: int, total: int, min_ratio: float = 0.1) -> float:
    """Linear warm-up for `warmup` steps, then cosine decay to min_ratio * lr at `total`.
    `step` counts optimizer steps from 0."""
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    if total <= warmup:
        return lr
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
