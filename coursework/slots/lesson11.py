"""Lesson 11's slot: the embedding's scatter-add backward."""
from __future__ import annotations

import numpy as np

from .core import SlotError


def embedding_adapter(piece):
    """Your fn(ids (N,), g (N, C), V) -> dE; the model adds it into dwte and the
    positions' gradient (a sum over the batch) into dwpe."""
    def kernel(ids, dx, vocab_size, *, dwte, dwpe):
        b, t = ids.shape
        c = dwte.shape[1]
        d = piece(np.ascontiguousarray(ids).reshape(-1), dx.reshape(-1, c), vocab_size)
        if d is None:
            raise SlotError("returned None instead of the (V, C) gradient table")
        dwte += d
        dwpe[:t] += dx.reshape(b, t, c).sum(axis=0)
        return dwte, dwpe
    return kernel


def _check_embedding(fn):
    from engine.trainer import kernels as fused
    rng = np.random.default_rng(1101)
    ids = rng.integers(0, 13, size=(2, 8))
    dx = rng.normal(size=(2, 8, 16)).astype(np.float32)
    dwte = np.full((13, 16), 0.5, np.float32)                     # the model *adds* into it
    dwpe = np.zeros((8, 16), np.float32)
    embedding_adapter(fn)(ids, dx, 13, dwte=dwte, dwpe=dwpe)
    want, _ = fused.embedding_backward(ids, dx, 13)
    if not np.allclose(dwte - 0.5, want, rtol=1e-4, atol=1e-5):
        raise SlotError("on the model's float32 (B, T) ids the token table's gradient "
                        "differs from the engine's embedding_backward")


CONTRACTS = {"embedding_backward": _check_embedding}
