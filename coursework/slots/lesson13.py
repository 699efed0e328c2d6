"""Lesson 13: the trainer's slots (which piece fills which), the pieces timed in
their slots, and the checkpointed peak where lesson 13 runs it."""
from __future__ import annotations

import numpy as np

from engine.timing import median_seconds

from .core import SlotError
from .lesson08 import FusedAccumulationModel, engine_accumulate, exact_checkpoint_peak
from .lesson10 import crossentropy_adapter, gelu_adapter
from .lesson11 import embedding_adapter
from .lesson12 import EngineAdamW, SegmentAdamW, engine_clip


# piece name -> (exercise, the slot it fills, kernel registry name or None)
TRAINER_SLOTS = {
    "bias_gelu_forward": ("10.1", "the MLP's bias + GELU forward", "bias_gelu_forward"),
    "softmax_cross_entropy": ("10.2", "the loss and its gradient", "crossentropy_softmax"),
    "embedding_backward": ("11.1", "the embedding's scatter-add backward", "embedding_backward"),
    "clip_global_norm": ("12.1", "global-norm clipping", None),
    "adamw_step": ("12.2", "the AdamW update", None),
    "accumulate": ("08.1", "the accumulation loop over micro-batches", None),
}


ADAPTERS = {"bias_gelu_forward": gelu_adapter, "softmax_cross_entropy": crossentropy_adapter,
            "embedding_backward": embedding_adapter}


def seconds(piece: str, fn, cfg, batch_size: int, repeats: int = 5) -> tuple[float, float]:
    """(yours, the engine's) median seconds of one call in the slot at the trainer's shape."""
    from engine.trainer import kernels as fused
    rng = np.random.default_rng(0)
    B, T, C, V = batch_size, cfg.block_size, cfg.n_embd, cfg.vocab_size
    if piece == "bias_gelu_forward":
        h = rng.normal(size=(B, T, 4 * C)).astype(np.float32)
        bias = rng.normal(size=4 * C).astype(np.float32)
        out = np.empty_like(h)
        kernel = gelu_adapter(fn)
        return (median_seconds(lambda: kernel(h, bias, out=out), repeats),
                median_seconds(lambda: fused.bias_gelu_forward(h, bias, out=out), repeats))
    if piece == "softmax_cross_entropy":
        logits = rng.normal(size=(B * T, V)).astype(np.float32)
        targets = rng.integers(0, V, size=B * T)
        buf, losses = logits.copy(), np.empty(B * T, np.float32)
        kernel = crossentropy_adapter(fn)

        def run(k):
            buf[...] = logits
            return k(buf, targets, 1 / (B * T), losses=losses)
        return (median_seconds(lambda: run(kernel), repeats),
                median_seconds(lambda: run(lambda *a, **k: fused.crossentropy_softmax(*a, **k)),
                               repeats))
    if piece == "embedding_backward":
        ids = rng.integers(0, V, size=(B, T))
        dx = rng.normal(size=(B, T, C)).astype(np.float32)
        dwte, dwpe = np.zeros((V, C), np.float32), np.zeros((T, C), np.float32)
        kernel = embedding_adapter(fn)
        return (median_seconds(lambda: kernel(ids, dx, V, dwte=dwte, dwpe=dwpe), repeats),
                median_seconds(lambda: fused.embedding_backward(ids, dx, V, dwte=dwte,
                                                                dwpe=dwpe), repeats))
    from engine.trainer.model import FusedGPT, decay_segments
    if piece == "accumulate":                     # one batch as 4 micro-batches
        model = FusedGPT(cfg, batch_size=max(1, B // 4), seed=0)
        ids, targets = rng.integers(0, V, size=(B, T)), rng.integers(0, V, size=(B, T))
        m = model.B
        micro = [(ids[i:i + m], targets[i:i + m]) for i in range(0, 4 * m, m)]
        view = FusedAccumulationModel(model)
        return (median_seconds(lambda: fn(view, micro), 3),
                median_seconds(lambda: engine_accumulate(model, micro), 3))
    model = FusedGPT(cfg, batch_size=1, seed=0)
    model.grads.flat[...] = rng.normal(size=model.grads.flat.size) * 1e-2
    if piece == "clip_global_norm":
        grads = model.named_grads()
        return (median_seconds(lambda: fn(grads, 1e9), repeats),
                median_seconds(lambda: engine_clip(grads, 1e9), repeats))
    if piece == "adamw_step":
        segments = decay_segments(model.params)
        mine = SegmentAdamW(model.params.flat.copy(), model.grads.flat, segments, fn)
        engine = EngineAdamW(model.params.flat.copy(), model.grads.flat, segments)
        return (median_seconds(lambda: mine.step(1e-9), repeats),
                median_seconds(lambda: engine.step(1e-9), repeats))
    raise KeyError(f"no timing for the piece {piece!r}")


def _check_checkpoint_peak(fn):
    # Where lesson 13 runs it: the fused trainer's sizes, a checkpoint at every block and
    # one segment over all of them.
    a, b = 1 << 20, 17 << 20              # a residual stream, one block's buffers
    for n_blocks, k in ((4, 1), (4, 4), (12, 1), (6, 4)):
        got, want = fn(n_blocks, k, a, b), exact_checkpoint_peak(n_blocks, k, a, b)
        if got is None or float(got) != want:
            raise SlotError(f"checkpoint_peak({n_blocks}, {k}, {a}, {b}) gives {got!r}, the "
                            f"peak is {want}")


CONTRACTS = {"checkpoint_peak": _check_checkpoint_peak}
