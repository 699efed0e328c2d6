"""Lesson 12's slots: global-norm clipping and the AdamW update, on the float32
views of one flat buffer the trainer hands them (in place is the contract)."""
from __future__ import annotations

import math

import numpy as np

from .core import SlotError


BETAS, EPS, WEIGHT_DECAY = (0.9, 0.99), 1e-8, 0.1


class SegmentAdamW:
    """AdamW over a model's flat buffers with a learner's `adamw_step`, one tensor (a
    segment of the flat buffer) at a time: matrices decay, biases and gains do not."""

    def __init__(self, params_flat, grads_flat, segments, kernel, betas=BETAS, eps=EPS,
                 weight_decay=WEIGHT_DECAY):
        self.p, self.g = params_flat, grads_flat
        self.m, self.v = np.zeros_like(self.p), np.zeros_like(self.p)
        self.segments = segments
        self.kernel, self.betas, self.eps, self.weight_decay = kernel, betas, eps, weight_decay
        self.t = 0

    def step(self, lr):
        self.t += 1
        for a, b, decays in self.segments:
            self.kernel(self.p[a:b], self.g[a:b], self.m[a:b], self.v[a:b], self.t, lr,
                        self.betas[0], self.betas[1], self.eps,
                        self.weight_decay if decays else 0.0)


class EngineAdamW:
    """The engine's fused AdamW over the same flat buffers, stepped with `.step(lr)`."""

    def __init__(self, params_flat, grads_flat, segments, betas=BETAS, eps=EPS,
                 weight_decay=WEIGHT_DECAY):
        from engine.trainer.optim import AdamW
        self.g = grads_flat
        self.inner = AdamW(params_flat, segments, lr=1e-3, betas=betas, eps=eps,
                           weight_decay=weight_decay)
        self.steps = 0

    def step(self, lr):
        self.steps += 1
        self.inner.step(self.g, lr=lr)


def engine_clip(grads: dict, max_norm: float) -> float:
    """Global-norm clipping of a dict of gradient arrays, in place; the norm before."""
    from engine.trainer.optim import clip_scale, global_norm
    norm = math.sqrt(sum(global_norm(g.reshape(-1)) ** 2 for g in grads.values()))
    scale = clip_scale(norm, max_norm)
    if scale != 1.0:
        for g in grads.values():
            g *= g.dtype.type(scale)
    return norm


def _flat_views(rng, shapes, dtype=np.float32, scale=1.0):
    """One flat buffer and a dict of views into it, as `FusedGPT.named_grads()` gives."""
    sizes = [int(np.prod(s)) for s in shapes.values()]
    flat = (rng.normal(size=sum(sizes)) * scale).astype(dtype)
    views, offset = {}, 0
    for (name, shape), size in zip(shapes.items(), sizes):
        views[name] = flat[offset:offset + size].reshape(shape)
        offset += size
    return flat, views


SHAPES = {"wte": (13, 8), "ln_w": (8,), "fc_w": (8, 32), "fc_b": (32,)}


def _check_clip(fn):
    rng = np.random.default_rng(1201)
    flat, views = _flat_views(rng, SHAPES)
    _, want_views = _flat_views(np.random.default_rng(1201), SHAPES)
    max_norm = 1.0
    want_norm = engine_clip(want_views, max_norm)
    want = np.concatenate([v.reshape(-1) for v in want_views.values()])
    got_norm = fn(views, max_norm)
    if got_norm is None:
        raise SlotError("returned None; the trainer logs the norm before clipping it returns")
    if not math.isclose(float(got_norm), want_norm, rel_tol=1e-5):
        raise SlotError(f"returned {float(got_norm):.6g} on float32 views of one flat buffer, "
                        f"the global norm there is {want_norm:.6g}")
    rebound = [k for k in views if not np.shares_memory(views[k], flat)]
    if not np.allclose(flat, want, rtol=1e-5, atol=1e-7):
        norm_after = float(np.sqrt(np.sum(flat.astype(np.float64) ** 2)))
        if rebound:
            raise SlotError(f"the arrays of the gradient dict were replaced ({rebound[0]!r} is "
                            f"a new array), not scaled in place: the trainer's flat gradient "
                            f"buffer kept norm {norm_after:.4g} after clipping to {max_norm:g}, "
                            f"so the optimizer would train unclipped. Scale each array in "
                            f"place: g *= scale")
        raise SlotError(f"after clipping to {max_norm:g} the flat gradient buffer behind the "
                        f"views has norm {norm_after:.4g}; the engine leaves it at "
                        f"{float(np.sqrt(np.sum(want.astype(np.float64) ** 2))):.4g}")


def _check_adamw(fn):
    from engine.trainer.kernels import adamw_update, work_items
    rng = np.random.default_rng(1202)
    segments = [(0, 104, True), (104, 112, False), (112, 368, True), (368, 400, False)]
    p0 = rng.normal(size=400).astype(np.float32)
    mine = SegmentAdamW(p0.copy(), np.zeros(400, np.float32), segments, fn)
    items = work_items([(a, b, WEIGHT_DECAY if d else 0.0) for a, b, d in segments])
    p, m, v = p0.copy(), np.zeros(400, np.float32), np.zeros(400, np.float32)
    for step in (1, 2):
        g = rng.normal(size=400).astype(np.float32)
        mine.g[...] = g
        mine.step(1e-2)
        adamw_update(p, g, m, v, items, lr=1e-2, step=step, beta1=BETAS[0], beta2=BETAS[1],
                     eps=EPS)
    if np.array_equal(mine.p, p0):
        raise SlotError("the parameters did not change when the kernel ran on slices of the "
                        "flat float32 buffer: update p[i], m[i], v[i] in place (a new array "
                        "bound to the name p never reaches the model)")
    if not (np.allclose(mine.m, m, rtol=1e-5, atol=1e-7) and np.allclose(mine.v, v, rtol=1e-5,
                                                                           atol=1e-9)):
        raise SlotError("the moments m and v in the flat buffers differ from the engine's "
                        "after 2 steps: write them back in place, m[i] = ..., v[i] = ...")
    if not np.allclose(mine.p, p, rtol=1e-5, atol=1e-6):
        i = int(np.argmax(np.abs(mine.p - p)))
        raise SlotError(f"after 2 steps over 4 segments of one flat float32 buffer, p[{i}] = "
                        f"{mine.p[i]:.7g}, the engine's AdamW gives {p[i]:.7g}")


CONTRACTS = {"clip_global_norm": _check_clip, "adamw_step": _check_adamw}
