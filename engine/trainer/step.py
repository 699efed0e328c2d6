"""The one training step: loss and backward per micro-batch, then the optimizer.

`accumulate_and_step` is what `python -m engine.train` runs every step and what
`python -m engine.bench` times; `evaluate` is the validation loss. Both take
any model that follows `StepModel` (below): the trainer hands them
`parallel.ThreadReplicas`, and one `model.FusedGPT` fits too.

Exercise 13.1 (`train_step(model, optimizer, clip, x, y, lr, max_norm, phase)`)
is this step with the parts spelled out, on one micro-batch: zero the
gradients, forward, backward, clip, update, in that order, each phase timed.
Here `forward_backward` is the forward and the backward together (the fused
loss kernel leaves the logits' gradient in place, so the backward starts where
the loss ends), several micro-batches add into one gradient (lesson 08), the
clip is engine.trainer.optim's global-norm clip and the optimizer AdamW on the
flat buffer, and an MPI all-reduce (mpi_job.py) may run between the backward
and the clip.
"""
from __future__ import annotations

import math
import time
from typing import Protocol

import numpy as np

from .config import TrainConfig
from .data import eval_batches
from .optim import clip_scale, global_norm


class StepModel(Protocol):
    """What a training step needs of a model."""
    grads: object          # .flat: every parameter's gradient in one array

    def zero_grad(self) -> None:
        """Every gradient to zero (the backward adds into them)."""

    def forward_backward(self, ids, targets, *, loss_scale: float = 1.0, last: bool = True,
                         grad_ready=None) -> tuple[float, float, float]:
        """Add d(loss_scale * mean loss)/dparams into grads; returns (mean loss,
        forward seconds, backward seconds). `last`: the step's last micro-batch;
        grad_ready(start, stop): a range of grads.flat is final (the all-reduce)."""

    def loss(self, ids, targets) -> float:
        """The mean loss, preparing no backward (evaluation)."""


def accumulate_and_step(model: StepModel, optimizer, batches, rows: slice = slice(None), *,
                        lr: float, clip: float | None, loss_scale: float = 1.0,
                        allreduce=None) -> dict:
    """One optimizer step over the micro-batches `batches` (a list of (x, y)), in the
    phases the trainer times: loss and backward per micro-batch, then the
    optimizer. Returns {loss, grad_norm, clip_scale, lr, phases}.

    The gradient buffer is zeroed first (backward adds into it). With an
    MPI `allreduce`, only the last micro-batch's backward starts the bucket
    all-reduces; the optimizer phase begins by waiting for them."""
    phases = {"loss": 0.0, "backward": 0.0, "optimizer": 0.0, "evaluation": 0.0}
    model.zero_grad()
    loss_sum = 0.0
    for k, (x, y) in enumerate(batches):
        last = k == len(batches) - 1
        loss_k, t_loss, t_backward = model.forward_backward(
            x[rows], y[rows], loss_scale=loss_scale, last=last,
            grad_ready=allreduce.start if (allreduce is not None and last) else None)
        loss_sum += loss_k
        phases["loss"] += t_loss
        phases["backward"] += t_backward
    t0 = time.perf_counter()
    loss = loss_sum / len(batches)
    if allreduce is not None:
        allreduce.wait()
        loss = allreduce.mean(loss)
    norm = global_norm(model.grads.flat)        # log it before clipping: the health signal
    scale = clip_scale(norm, clip)
    if math.isfinite(norm):
        optimizer.step(model.grads.flat, grad_scale=scale, lr=lr)
    phases["optimizer"] = time.perf_counter() - t0
    return {"loss": loss, "grad_norm": norm, "clip_scale": scale, "lr": lr, "phases": phases}


def evaluate(model: StepModel, data: np.ndarray, config: TrainConfig, rows: slice, allreduce=None) -> float:
    """Mean validation loss over the fixed evaluation windows."""
    losses = [model.loss(x[rows], y[rows])
              for x, y in eval_batches(data, config.batch_size, config.block_size,
                                       config.eval_batches)]
    value = float(np.mean(losses))
    return allreduce.mean(value) if allreduce is not None else value
