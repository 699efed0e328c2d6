"""Gradient accumulation: the gradient of a big batch from K small ones.

The loss is a mean over examples and differentiation is linear, so the
gradient of the mean is the mean of the gradients. Split a batch of K x b
examples into K micro-batches of b, backpropagate each micro-batch's mean
loss divided by K, and let `.grad` add them up (leaf gradients accumulate
until `zero_grad()`): the sum is the full batch's gradient, while the tape
only ever holds one micro-batch's activations.

    micro = split_batch(ids, targets, K)
    loss = accumulate_gradients(model.parameters(), lambda b: model(*b), micro)
    # every p.grad now equals the gradient of model(ids, targets)

Forgetting the /K makes the gradient (and its norm) exactly K times too
large, the same as a K times larger learning rate.
"""
from __future__ import annotations


import numpy as np

from .tensor import Tensor

__all__ = ["split_batch", "accumulate_gradients", "grad_norm"]


def split_batch(ids, targets, n_micro: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Split (B, ...) ids and targets into `n_micro` equal micro-batches.

    Equal sizes matter: the mean of K micro-batch means is the full-batch
    mean only when every micro-batch has the same number of examples.
    """
    ids = np.asarray(ids)
    targets = np.asarray(targets)
    B = ids.shape[0]
    if targets.shape[0] != B:
        raise ValueError(f"split_batch: ids have {B} rows but targets have "
                         f"{targets.shape[0]}; they must describe the same examples")
    if n_micro < 1 or B % n_micro:
        divisors = [k for k in range(1, B + 1) if B % k == 0]
        raise ValueError(f"split_batch: a batch of {B} cannot be split into {n_micro} equal "
                         f"micro-batches; choose K among {divisors}")
    b = B // n_micro
    return [(ids[i * b:(i + 1) * b], targets[i * b:(i + 1) * b]) for i in range(n_micro)]


def accumulate_gradients(parameters: dict, loss_of, micro_batches,
                         divide_by_k: bool = True) -> float:
    """Zero the gradients, then backpropagate loss_of(batch) / K for each of
    the K micro-batches. Returns the mean loss over the micro-batches.

    parameters: name -> Tensor (e.g. model.parameters()).
    loss_of: batch -> scalar Tensor, the mean loss over that micro-batch.
    divide_by_k=False reproduces the classic bug (K-times gradient).
    """
    micro_batches = list(micro_batches)
    K = len(micro_batches)
    if K == 0:
        raise ValueError("accumulate_gradients: no micro-batches given")
    for p in parameters.values():
        p.zero_grad()
    total = 0.0
    for batch in micro_batches:
        loss = loss_of(batch)
        if not isinstance(loss, Tensor) or loss.size != 1:
            raise TypeError(f"accumulate_gradients: loss_of must return a scalar Tensor, got "
                            f"{type(loss).__name__} of shape {getattr(loss, 'shape', '?')}")
        total += loss.item()
        (loss / K if divide_by_k else loss).backward()   # .grad adds up across calls
    return total / K


def grad_norm(parameters: dict) -> float:
    """Global L2 norm of all gradients (parameters without a gradient count as zero)."""
    return float(np.sqrt(sum(float(np.sum(np.square(p.grad, dtype=np.float64)))
                             for p in parameters.values() if p.grad is not None)))


