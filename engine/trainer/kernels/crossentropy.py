"""Softmax + cross-entropy, fused: the logits become their own gradient.

For one row of logits z (V classes) and its target y:

    loss = logsumexp(z) - z[y]
    dloss/dz = softmax(z) - onehot(y)

So the gradient is "the probabilities, minus one at the target". The fused
kernel computes the row's max and sum of exponentials, writes the loss, then
overwrites the row of logits with (softmax(z) - onehot(y)) * scale in the same
buffer. The (rows, V) logits are the largest activation of a language model's
head; this way neither the probabilities nor the logits' gradient ever take a
second (rows, V) array, and the row is read twice and written once.

`scale` is the factor the loss is multiplied by before differentiation:
1/N for the mean over N rows, times 1/K with K micro-batches of gradient
accumulation.
"""
from __future__ import annotations

import numpy as np

from ._buffers import float_dtype, output, rows
from .cpu.lanes import row_max, row_sum
from ...numba_config import REDUCE_CHUNKS, parallel_kernel, prange
from ...fast_math import exp


@parallel_kernel
def crossentropy_softmax_kernel(logits, targets, scale, losses, write_grad):
    N, V = logits.shape
    chunk = (N + REDUCE_CHUNKS - 1) // REDUCE_CHUNKS
    for c in prange(REDUCE_CHUNKS):
        # The exponentials go to a scratch row and are summed in vector lanes
        # (`cpu.lanes`): a running `total += exp(..)` would keep the loop scalar,
        # the exp with it.
        e = np.empty(V, logits.dtype)
        for n in range(c * chunk, min(N, (c + 1) * chunk)):
            row = logits[n]
            m = row_max(row, V)
            for v in range(V):
                e[v] = exp(row[v] - m)
            total = row_sum(e, V)
            y = targets[n]
            losses[n] = m + np.log(total) - row[y]
            if write_grad:
                weight = scale / total                 # p_v = e_v / total, times scale
                for v in range(V):
                    row[v] = e[v] * weight
                row[y] -= scale


def _check_targets(kernel, targets, n_rows, vocab_size):
    targets = np.ascontiguousarray(targets).reshape(-1)
    if targets.shape[0] != n_rows:
        raise ValueError(f"{kernel}: {targets.shape[0]} targets for {n_rows} rows of logits")
    if not np.issubdtype(targets.dtype, np.integer):
        raise TypeError(f"{kernel}: targets must be integers, got dtype {targets.dtype}")
    if n_rows and (targets.min() < 0 or targets.max() >= vocab_size):
        raise ValueError(f"{kernel}: targets must lie in [0, {vocab_size}), got values from "
                         f"{targets.min()} to {targets.max()}")
    return targets


def crossentropy_softmax(logits, targets, scale=None, *, losses=None):
    """Mean cross-entropy of the rows of `logits`; OVERWRITES logits with
    d(scale * sum of row losses)/dlogits. scale defaults to 1/rows (the mean).

    Returns (mean_loss, losses) with losses the per-row values. Pass a copy of
    the logits if you still need them."""
    name = "crossentropy_softmax"
    dtype = float_dtype(name, logits)
    z = rows(name, "logits", logits)
    targets = _check_targets(name, targets, z.shape[0], z.shape[1])
    losses = output(name, "losses", losses, (z.shape[0],), dtype)
    scale = 1.0 / max(1, z.shape[0]) if scale is None else scale
    crossentropy_softmax_kernel(z, targets, dtype.type(scale), losses, True)
    return float(losses.sum(dtype=np.float64) / max(1, z.shape[0])), losses


def crossentropy_loss(logits, targets, *, losses=None):
    """Mean cross-entropy without touching the logits (evaluation). Returns (mean, losses)."""
    name = "crossentropy_loss"
    dtype = float_dtype(name, logits)
    z = rows(name, "logits", logits)
    targets = _check_targets(name, targets, z.shape[0], z.shape[1])
    losses = output(name, "losses", losses, (z.shape[0],), dtype)
    crossentropy_softmax_kernel(z, targets, dtype.type(0), losses, False)
    return float(losses.sum(dtype=np.float64) / max(1, z.shape[0])), losses
