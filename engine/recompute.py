"""Activation checkpointing: remember a segment's input, recompute its insides.

    from engine.recompute import checkpoint, checkpoint_sequential, checkpointed

    y = checkpoint(block, x)                  # one segment
    y = checkpoint_sequential(blocks, x, 2)   # segments of 2 blocks each
    with checkpointed(model, "every"):        # a GPT whose blocks are checkpointed
        loss = model(ids, targets)
    loss.backward()
    with selective_recompute(model):          # only attention's softmax is rebuilt
        loss = model(ids, targets)

How it works on the tape. `checkpoint(fn, *inputs)` records ONE node, a
`Checkpoint` op, in place of everything `fn` does:

* forward: run `fn` under `no_grad()`, so none of its ops is recorded and
  nothing inside is saved; the node saves only the segment's inputs.
* backward: when the walk reaches the node, run `fn` again on the saved
  inputs with recording on (the recompute), call backward on its output
  with the incoming gradient, hand the inputs' gradients on to the outer
  tape and let the inner graph go. Parameters used inside `fn` are leaf
  tensors, so the inner backward accumulates their gradients directly.

`replay` is that backward for a one-input segment, written out in six lines;
lesson 08 has you write it, and `replay_fn=` runs your version instead.

`engine.memory` sees exactly this: the forward saves the inputs; during
backward the recomputed insides of one segment appear, are consumed by
their VJPs and are freed, before the next segment is recomputed.

What the recompute must reproduce (or the gradient belongs to another
function): the same inputs (an in-place change of a saved input is caught
by the tape's version check), the same parameters, the same randomness
(`F.dropout` takes an explicit seed, so a rerun draws the same mask) and no
side effects inside `fn`. Every tensor that needs a gradient enters `fn` as
an input or is a parameter (a leaf): a result of the outer tape read from
`fn`'s closure would make the recompute's backward run through the outer
graph a second time, so the first forward refuses it.

The cost: each checkpointed segment's forward runs twice, so a training step
costs about 4 forward passes instead of 3 (+33%) when every block is
checkpointed.

Selective recompute (Korthikanti et al. 2022) checkpoints a much smaller
segment: the attention core, softmax(q k^T / sqrt(hs)) v (with its dropout,
where a model has one). Its inputs q, k, v are views of the qkv buffer the
block keeps anyway, so the node adds nothing, and the (B, H, T, T)
probabilities, the block's only tensor that grows with T^2, are never kept:
the backward rebuilds them, one block at a time, for two products of
T^2 * hs multiply-adds per head, a few percent of a block's work at short T.
"""
from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np

from .rules import Op
from .tensor import (TapeObserver, Tensor, apply, enable_grad, name_scope, no_grad, observe,
                     op_label)

__all__ = ["Checkpoint", "checkpoint", "replay", "checkpoint_sequential", "segment_size",
           "segments", "checkpointed", "CheckpointedSegment", "POLICIES",
           "selective_recompute"]

POLICIES = ("none", "every", "sqrt")


class _OuterResultGuard(TapeObserver):
    """Watches a segment's first forward (run under no_grad, so everything made
    inside needs no gradient) for an op reading a non-leaf that does: a result
    of the outer tape that is not an input of the segment."""

    def __init__(self, label: str):
        self.label = label

    def after_forward(self, op, inputs, result, recorded) -> None:
        for x in inputs:
            if isinstance(x, Tensor) and x.requires_grad and x._node is not None:
                name = f" '{x.name}'" if x.name else ""
                raise RuntimeError(
                    f"checkpoint({self.label}): the segment reads a tensor made outside it by "
                    f"{op_label(x._node)}{name}, shape {x.shape}, which needs a gradient but is "
                    f"not one of its inputs (it comes from the function's closure). The "
                    f"recompute would backpropagate through the outer graph a second time. "
                    f"Pass it as an input, checkpoint(fn, x, z) with fn(x, z), or use "
                    f"z.detach() inside if no gradient should flow through it")


def replay(fn, saved_input: np.ndarray, grad_output: np.ndarray) -> np.ndarray:
    """The backward of a one-input checkpointed segment: run `fn` again on the
    saved input with recording on, backpropagate `grad_output` through the
    recomputed graph (which frees it as it goes, and accumulates the
    gradients of the parameters inside `fn`), return dL/d(input)."""
    x = Tensor._from_op(saved_input, True)   # a fresh leaf that catches dL/dinput
    with enable_grad():
        out = fn(x)
    out.backward(grad_output)
    return x.grad


class Checkpoint(Op):
    """The tape node of a checkpointed segment (see the module docstring).

    Its inputs are the segment's inputs followed by the parameters the
    segment uses (`n_inputs` tells them apart). The parameters are inputs
    only so that the node is recorded whenever one of them needs a
    gradient; their gradients arrive through the recompute's own backward,
    so the node returns None for them.
    """
    name = "checkpoint"

    def forward(self, *arrays, fn, label, n_inputs, replay_fn):
        self.fn, self.label, self.n_inputs, self.replay_fn = fn, label, n_inputs, replay_fn
        # Keep the inputs, by name, so engine.memory counts them and the
        # tape's version check protects them (and the parameters) from
        # in-place changes before the recompute.
        self.save(**{f"input{i}": a for i, a in enumerate(arrays)})
        with no_grad(), observe(_OuterResultGuard(label)):
            out = fn(*[Tensor._from_op(a, False) if isinstance(a, np.ndarray) else a
                       for a in arrays[:n_inputs]])
        if not isinstance(out, Tensor):
            raise TypeError(f"checkpoint({label}): the function must return one Tensor, "
                            f"got {type(out).__name__}; wrap several outputs in separate "
                            f"checkpoints, or return a single tensor")
        return out.data

    def vjp(self, g):
        arrays = [getattr(self, f"input{i}") for i in range(self.n_inputs)]
        needs = self.needs[:self.n_inputs]
        no_params = (None,) * (len(self.needs) - self.n_inputs)
        with name_scope(f"recompute {self.label}"):
            if self.replay_fn is not None:
                return (self.replay_fn(self.fn, arrays[0], g),) + no_params
            # Every float input becomes a leaf that requires grad, even one the
            # outer tape needs no gradient for: the rules then see the same
            # `needs` as in a plain run whose input came from earlier layers.
            inputs = [Tensor._from_op(a, need or np.issubdtype(a.dtype, np.floating))
                      if isinstance(a, np.ndarray) else a
                      for a, need in zip(arrays, needs)]
            with enable_grad():
                out = self.fn(*inputs)     # the second forward: records the insides
            if out.requires_grad:
                out.backward(g)            # frees the insides as it goes
        grads = tuple(x.grad if isinstance(x, Tensor) and need else None
                      for x, need in zip(inputs, needs))
        return grads + no_params


def _label_of(fn) -> str:
    return getattr(fn, "label", None) or getattr(fn, "__name__", None) or type(fn).__name__


def checkpoint(fn, *inputs, params=(), label: str | None = None, replay_fn=None) -> Tensor:
    """fn(*inputs), recorded as one node that saves only `inputs`.

    fn: takes the inputs (Tensors, or constants such as integer arrays) and
        returns one Tensor. It may use parameters from its closure.
    params: the parameters fn uses. Pass them when no input needs a
        gradient (e.g. the first block after a frozen embedding): the node is
        recorded if any input or parameter needs a gradient. Without them,
        a segment whose inputs need no gradient is not recorded and its
        parameters get no gradient (as with PyTorch's reentrant checkpoint).
    replay_fn: a replacement for `replay` (same signature), e.g. your own
        from lesson 08; only for segments with exactly one input.
    """
    if not callable(fn):
        raise TypeError(f"checkpoint: the first argument must be a function (the segment), "
                        f"got {type(fn).__name__}")
    if replay_fn is not None and len(inputs) != 1:
        raise ValueError(f"checkpoint: replay_fn handles one-input segments, this one has "
                         f"{len(inputs)} inputs; drop replay_fn to use the built-in replay")
    params = list(params.values()) if isinstance(params, dict) else list(params)
    return apply(Checkpoint, *inputs, *params, fn=fn, label=label or _label_of(fn),
                 n_inputs=len(inputs), replay_fn=replay_fn)


# ------------------------------------------------------------ runs of blocks
def segment_size(n_blocks: int, policy) -> int:
    """Blocks per checkpointed segment for a policy.

    "every" -> 1 (checkpoint each block), "sqrt" -> round(sqrt(n_blocks))
    (about sqrt(L) segments of about sqrt(L) blocks), an integer k -> k,
    "none" -> 0 (no checkpointing).
    """
    if n_blocks < 1:
        raise ValueError(f"segment_size: n_blocks must be >= 1, got {n_blocks}")
    if policy == "none" or policy is None:
        return 0
    if policy == "every":
        return 1
    if policy == "sqrt":
        return max(1, round(math.sqrt(n_blocks)))
    if isinstance(policy, (int, np.integer)) and not isinstance(policy, bool) and policy >= 1:
        return int(policy)
    raise ValueError(f"checkpoint policy {policy!r} is not one of {POLICIES} or a positive "
                     f"integer k (checkpoint every k blocks)")


def segments(n_blocks: int, policy) -> list[range]:
    """The runs of block indices each checkpoint covers (empty list for "none")."""
    k = segment_size(n_blocks, policy)
    if k == 0:
        return []
    return [range(start, min(start + k, n_blocks)) for start in range(0, n_blocks, k)]


class CheckpointedSegment:
    """A callable that runs several blocks in a row as one checkpoint."""

    def __init__(self, blocks, replay_fn=None):
        self.blocks = list(blocks)
        self.replay_fn = replay_fn
        names = [getattr(b, "prefix", "").rstrip(".") or type(b).__name__ for b in self.blocks]
        self.label = names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"

    def run(self, x):
        for block in self.blocks:
            x = block(x)
        return x

    def __call__(self, x):
        return checkpoint(self.run, x, params=self.parameters(), label=self.label,
                          replay_fn=self.replay_fn)

    def parameters(self) -> dict:
        found = {}
        for b in self.blocks:
            if hasattr(b, "parameters"):
                found.update(b.parameters())
        return found


def checkpoint_sequential(blocks, x, policy="every", replay_fn=None):
    """Run x through `blocks` in order, checkpointing segments chosen by `policy`.

    Blocks with a `parameters()` method (engine.nn modules) hand their
    parameters to the checkpoint, so they train even when x needs no gradient.
    """
    blocks = list(blocks)
    if segment_size(len(blocks), policy) == 0:
        for block in blocks:
            x = block(x)
        return x
    for seg in segments(len(blocks), policy):
        x = CheckpointedSegment((blocks[i] for i in seg), replay_fn)(x)
    return x


@contextmanager
def checkpointed(model, policy="every", replay_fn=None):
    """Inside the `with`, the model's forward checkpoints its blocks.

    Works with any model that runs `for block in self.blocks: x = block(x)`,
    as engine.nn.GPT does: the list is swapped for checkpointed segments and
    restored on exit. Build the loss inside the `with`; backward may run
    after it (the recompute uses the blocks themselves).
    """
    if not hasattr(model, "blocks"):
        raise TypeError(f"checkpointed: {type(model).__name__} has no `blocks` list to "
                        f"checkpoint; use checkpoint_sequential(blocks, x, policy) instead")
    original = model.blocks
    if segment_size(len(original), policy) > 0:
        model.blocks = [CheckpointedSegment((original[i] for i in seg), replay_fn)
                        for seg in segments(len(original), policy)]
    try:
        yield model
    finally:
        model.blocks = original


@contextmanager
def selective_recompute(model, enabled: bool = True):
    """Inside the `with`, each block of the model checkpoints its attention core
    only (see the module docstring): the probabilities are rebuilt in the
    backward instead of kept. Works with models whose blocks have a
    `recompute_attention` switch, as engine.nn.GPT's do; restored on exit.
    Build the loss inside the `with`; backward may run after it.
    enabled=False leaves the model as it is (so callers can pass a flag)."""
    if not enabled:
        yield model
        return
    blocks = getattr(model, "blocks", None)
    if blocks is None or not all(hasattr(b, "recompute_attention") for b in blocks):
        raise TypeError(f"selective_recompute: {type(model).__name__} has no blocks with a "
                        f"`recompute_attention` switch (engine.nn.Block has one); use "
                        f"checkpoint(F.causal_attention, q, k, v) inside your own block")
    before = [b.recompute_attention for b in blocks]
    for b in blocks:
        b.recompute_attention = True
    try:
        yield model
    finally:
        for b, was in zip(blocks, before):
            b.recompute_attention = was
