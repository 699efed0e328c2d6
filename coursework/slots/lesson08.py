"""Lesson 08's slots: the accumulation loop (run through the fused model's view),
the checkpoint replay, and the checkpointed peak's formula."""
from __future__ import annotations

import math

import numpy as np

from engine import F, nn, no_grad, Tensor
from engine.gpt_config import GPTConfig, init_params
from engine.recompute import checkpointed, replay, segments

from .core import SlotError


class _FusedLoss:
    """A micro-batch's loss as lesson 08's loop sees it: `/ K`, `* c`, `.backward()`,
    `.item()`. The forward runs when the scale is known, with `loss_scale` (public API)."""

    def __init__(self, model, ids, targets, scale=1.0, cache=None):
        self.model, self.ids, self.targets, self.scale = model, ids, targets, scale
        self.cache = {} if cache is None else cache

    def _forward(self, scale):
        self.cache["value"] = self.model.forward(self.ids, self.targets, loss_scale=scale)
        self.cache["scale"] = scale
        return self.cache["value"]

    def __truediv__(self, k):
        return _FusedLoss(self.model, self.ids, self.targets, self.scale / float(k), self.cache)

    def __mul__(self, c):
        return _FusedLoss(self.model, self.ids, self.targets, self.scale * float(c), self.cache)

    __rmul__ = __mul__

    def backward(self):
        if self.cache.get("scale") != self.scale:
            self._forward(self.scale)
        self.model.backward()

    def item(self) -> float:
        value = self.cache["value"] if "value" in self.cache else self._forward(1.0)
        return float(value) * self.scale

    __float__ = item


class FusedAccumulationModel:
    """The fused model seen the way lesson 08's `accumulate(model, micro_batches)` sees
    a model: `model(ids, targets)` is a micro-batch's mean loss, `zero_grad()` clears."""

    def __init__(self, model):
        self.model = model

    def zero_grad(self):
        self.model.zero_grad()

    def __call__(self, ids, targets):
        return _FusedLoss(self.model, ids, targets)


def engine_accumulate(model, micro_batches):
    """The engine's loop on the fused model: zero once, backward of loss/K per micro-batch."""
    model.zero_grad()
    k = len(micro_batches)
    total = 0.0
    for ids, targets in micro_batches:
        total += model.forward(ids, targets, loss_scale=1.0 / k)
        model.backward()
    return total / k


def accumulated_gradient(accumulate, cfg, batch, k, seed=0, dtype=np.float32):
    """(mean loss, flat gradient) of `batch` split into k micro-batches, on a fused model
    of micro-batch size B/k; `accumulate` is a learner's lesson 08 loop or None."""
    from engine.trainer.model import FusedGPT
    ids, targets = batch
    micro = ids.shape[0] // k
    model = FusedGPT(cfg, batch_size=micro, seed=seed, dtype=dtype)
    pieces = [(ids[i * micro:(i + 1) * micro], targets[i * micro:(i + 1) * micro])
              for i in range(k)]
    if accumulate is None:
        loss = engine_accumulate(model, pieces)
    else:
        loss = accumulate(FusedAccumulationModel(model), pieces)
        if loss is None:
            raise SlotError("returned None instead of the mean loss")
    return float(loss), model.grads.flat.copy()


def _small_cfg():
    return GPTConfig(vocab_size=13, block_size=8, n_layer=1, n_head=2, n_embd=8)


def _check_accumulate(fn):
    rng = np.random.default_rng(801)
    batch = rng.integers(0, 13, size=(4, 8)), rng.integers(0, 13, size=(4, 8))
    loss, grad = accumulated_gradient(fn, _small_cfg(), batch, k=4)
    want_loss, want_grad = accumulated_gradient(None, _small_cfg(), batch, k=4)
    if not math.isclose(loss, want_loss, rel_tol=1e-5):
        raise SlotError(f"on the fused model the mean loss over 4 micro-batches is {loss:.8g}, "
                        f"the engine's loop gives {want_loss:.8g}")
    if not np.allclose(grad, want_grad, rtol=1e-4, atol=1e-7):
        ratio = float(np.linalg.norm(grad) / max(np.linalg.norm(want_grad), 1e-300))
        raise SlotError(f"on the fused model the accumulated gradient differs from the "
                        f"engine's loop (norm ratio {ratio:.3g})")


def _check_checkpoint_replay(fn):
    # Where the checkpoint runs it: in the backward pass (recording may be off), on the
    # ndarray the node kept, with the gradient reaching the segment; it must return the
    # input's gradient as an ndarray and leave the parameters' gradients accumulated.
    rng = np.random.default_rng(802)
    w = Tensor(rng.normal(size=(4, 4)) / 2, requires_grad=True, name="w")
    segment = lambda t: F.tanh(t @ w) + t
    saved, g = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    want = replay(segment, saved.copy(), g)
    want_w, w.grad = w.grad, None
    kept = saved.copy()
    with no_grad():                           # the backward pass does not record
        got = fn(segment, kept, g)
    if not isinstance(got, np.ndarray) or got.shape != saved.shape:
        raise SlotError(f"returned {type(got).__name__}"
                        f"{'' if not hasattr(got, 'shape') else ' of shape ' + str(got.shape)}"
                        f"; the tape needs the input's gradient as an ndarray of shape "
                        f"{saved.shape} (the .grad of the Tensor made from saved_input)")
    if not np.array_equal(kept, saved):
        raise SlotError("changed the saved input it was handed, which the tape still owns")
    if not np.allclose(got, want, rtol=1e-10, atol=1e-14) or w.grad is None or \
            not np.allclose(w.grad, want_w, rtol=1e-10, atol=1e-14):
        raise SlotError("called under no_grad on a (3, 4) segment, the input's or the "
                        "parameter's gradient differs from engine.recompute.replay's")
    name = checkpointed_gpt_mismatch(fn)
    if name is not None:
        raise SlotError(f"in a 2-block GPT checkpointed at every block the gradient of "
                        f"{name} differs from the plain model's")


def checkpointed_gpt_mismatch(replay_fn):
    """The first parameter whose gradient differs (rtol 1e-10) between a plain 2-block
    GPT and the same GPT checkpointed at every block with `replay_fn`; None if none."""
    cfg = GPTConfig(vocab_size=11, block_size=5, n_layer=2, n_head=2, n_embd=8)
    params = init_params(cfg, seed=3, dtype=np.float64)
    rng = np.random.default_rng(4)
    ids, targets = rng.integers(0, 11, (2, 5)), rng.integers(0, 11, (2, 5))
    plain = nn.GPT(cfg, params)
    plain(ids, targets).backward()
    mine = nn.GPT(cfg, params)
    with checkpointed(mine, "every", replay_fn=replay_fn):
        loss = mine(ids, targets)
    loss.backward()
    for name, want_grad in plain.grads().items():
        got_grad = mine.grads()[name]
        if got_grad is None or not np.allclose(got_grad, want_grad, rtol=1e-10, atol=1e-14):
            return name
    return None


class TapeAsFused:
    """The tape GPT with the fused model's calling convention (`forward(ids, targets,
    loss_scale)` returns the mean loss and keeps the scaled one for `backward()`;
    `zero_grad()`), so `FusedAccumulationModel` can wrap it: lesson 08 runs a loop
    through the very view lesson 13 uses, without compiling the fused kernels."""

    def __init__(self, model):
        self.model, self._scaled = model, None

    def zero_grad(self):
        self.model.zero_grad()

    def forward(self, ids, targets, loss_scale=1.0):
        loss = self.model(ids, targets)
        self._scaled = loss * loss_scale
        return float(loss.item())

    def backward(self):
        scaled, self._scaled = self._scaled, None
        scaled.backward()


def check_accumulate_through_view(fn) -> None:
    """The contract of the `accumulate` slot (4 micro-batches through the fused model's
    view, against the engine's loop), on the tape GPT in float64: lesson 08 checks the
    calling convention here; lesson 13 runs the same view on the fused kernels."""
    cfg = _small_cfg()
    rng = np.random.default_rng(801)
    ids, targets = rng.integers(0, 13, size=(4, 8)), rng.integers(0, 13, size=(4, 8))
    micro = [(ids[i:i + 1], targets[i:i + 1]) for i in range(4)]
    runs = {}
    for who, loop in (("engine", None), ("yours", fn)):
        model = nn.GPT(cfg, init_params(cfg, seed=0, dtype=np.float64))
        tape = TapeAsFused(model)
        if loop is None:
            loss = engine_accumulate(tape, micro)
        else:
            try:
                loss = loop(FusedAccumulationModel(tape), micro)
            except Exception as err:
                raise SlotError(f"raised {type(err).__name__} through the fused model's view "
                                f"({err}). There a model offers model(ids, targets) and "
                                f"model.zero_grad(), and a loss offers / K, * c, .backward() "
                                f"and .item(), nothing else") from None
            if loss is None:
                raise SlotError("returned None instead of the mean loss")
        runs[who] = float(loss), model.grads()
    (loss, grads), (want_loss, want) = runs["yours"], runs["engine"]
    if not math.isclose(loss, want_loss, rel_tol=1e-9):
        raise SlotError(f"through the fused model's view the mean loss over 4 micro-batches "
                        f"is {loss:.8g}, the engine's loop gives {want_loss:.8g}")
    if not all(grads[n] is not None and np.allclose(grads[n], g, rtol=1e-9, atol=1e-14)
               for n, g in want.items()):
        raise SlotError("through the fused model's view the accumulated gradient differs "
                        "from the engine's loop")


def exact_checkpoint_peak(n_blocks: int, k: int, a: int, b: int) -> int:
    """max over segments j (forward order) of (j+1)*a + len_j*b."""
    return max((j + 1) * a + len(seg) * b for j, seg in enumerate(segments(n_blocks, k)))


CONTRACTS = {"accumulate": _check_accumulate, "checkpoint_replay": _check_checkpoint_replay}
