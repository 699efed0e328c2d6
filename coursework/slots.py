"""The slots of the trainer a learner's piece can fill, and the contract of each.

A slot is the place in `engine.trainer` where a piece runs: a kernel of the
model's registry (`engine.trainer.model.use_kernel`), the clipping function
and the optimizer the training step is handed, the training step itself. Its
contract is what the trainer relies on, checked on the buffers the trainer
will hand the piece (float32 views of one flat buffer for clipping and AdamW:
scaling or updating *in place* is part of the contract) and compared with the
engine's own version. `check(piece, fn)` raises `SlotError` with the reason
when a piece would misbehave there; `adapt(piece, fn)` wraps a piece into the
calling convention of its slot; `seconds(piece, fn, shape)` times a piece and
the engine's version at the trainer's shape.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np


class SlotError(Exception):
    """A piece breaks the contract of its slot. The message says how."""


# piece name -> (exercise, the slot it fills, kernel registry name or None)
TRAINER_SLOTS = {
    "bias_gelu_forward": ("10.1", "the MLP's bias + GELU forward", "bias_gelu_forward"),
    "softmax_cross_entropy": ("10.2", "the loss and its gradient", "crossentropy_softmax"),
    "embedding_backward": ("11.1", "the embedding's scatter-add backward", "embedding_backward"),
    "clip_global_norm": ("12.1", "global-norm clipping", None),
    "adamw_step": ("12.2", "the AdamW update", None),
    "accumulate": ("08.1", "the accumulation loop over micro-batches", None),
}

BETAS, EPS, WEIGHT_DECAY = (0.9, 0.99), 1e-8, 0.1


# ------------------------------------------------------------------ adapters
def gelu_adapter(piece):
    """Your kernel(x 2-D, b, out) -> the model's bias_gelu_forward(h, bias, *, out)."""
    def kernel(h, bias, *, out):
        piece(h.reshape(-1, h.shape[-1]), bias, out.reshape(-1, out.shape[-1]))
        return out
    return kernel


def crossentropy_adapter(piece):
    """Your fn(logits, targets) -> mean, logits overwritten by d(mean)/dlogits; the model
    wants d(scale * sum)/dlogits and the per-row losses."""
    def kernel(logits, targets, scale, *, losses):
        n = logits.shape[0]
        mean = piece(logits, targets)
        if mean is None:
            raise SlotError("returned None instead of the mean loss")
        logits *= logits.dtype.type(scale * n)
        losses[...] = mean
        return float(mean), losses
    return kernel


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


ADAPTERS = {"bias_gelu_forward": gelu_adapter, "softmax_cross_entropy": crossentropy_adapter,
            "embedding_backward": embedding_adapter}


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


# ------------------------------------------------------- the tape's rule table
# piece name -> (exercise, the rule it replaces, the op whose VJP runs it)
TAPE_SLOTS = {
    "matmul_vjp": ("03.1", "the matmul VJP (2-D products)", "matmul"),
    "unbroadcast": ("03.2", "the sum back to an input's shape (add's VJP)", "add"),
}


def tape_rule(piece: str, fn, calls: dict):
    """The learner's piece as an override of the tape's rule (`engine.rules.override_vjp`):
    counted in `calls[piece]` each time it runs; ops it does not cover keep their own rule."""
    if piece == "matmul_vjp":
        def vjp(op, g):
            (sa, sb) = op.shapes
            if len(sa) != 2 or len(sb) != 2 or not all(op.needs):
                return op.vjp(g)                 # batched products, frozen operands
            calls[piece] = calls.get(piece, 0) + 1
            return tuple(fn(op.a, op.b, g))
        return vjp
    if piece == "unbroadcast":
        def vjp(op, g):
            calls[piece] = calls.get(piece, 0) + 1
            return tuple(fn(g, shape) if need else None for need, shape in zip(op.needs, op.shapes))
        return vjp
    raise KeyError(f"no tape rule for the piece {piece!r}")


def _check_matmul_vjp(fn):
    rng = np.random.default_rng(301)
    a, b, g = rng.normal(size=(3, 4)), rng.normal(size=(4, 5)), rng.normal(size=(3, 5))
    got = fn(a, b, g)
    if got is None or len(got) != 2:
        raise SlotError("return the pair (dL/da, dL/db)")
    if not (np.allclose(got[0], g @ b.T, rtol=1e-12) and np.allclose(got[1], a.T @ g,
                                                                      rtol=1e-12)):
        raise SlotError("on a (3, 4) @ (4, 5) product the gradients differ from the "
                        "tape's own matmul rule")


def _check_unbroadcast(fn):
    from engine.rules import unbroadcast
    rng = np.random.default_rng(302)
    for grad_shape, shape in (((4, 3), (3,)), ((4, 3), (4, 1)), ((2, 4, 3), (4, 3)),
                              ((4, 3), (1, 3)), ((4, 3), (4, 3))):
        g = rng.normal(size=grad_shape)
        got = fn(g.copy(), shape)
        if got is None:
            raise SlotError("returned None instead of the summed gradient")
        if np.shape(got) != shape or not np.allclose(got, unbroadcast(g, shape), rtol=1e-12):
            raise SlotError(f"a gradient of shape {grad_shape} brought back to {shape} "
                            f"differs from the tape's own unbroadcast")


# ------------------------------------------------------ the gradient checker
class Spot(NamedTuple):
    """One checked element: what the backward said, what central differences say."""
    index: tuple
    analytic: float
    numeric: float
    rel_err: float
    abs_err: float
    ok: bool


def engine_spot_check(f, x, analytic_grad, n_checks=6, eps=1e-6, rtol=1e-6, atol=1e-8, seed=0):
    """The engine's spot check, with the calling convention of exercise 04.3: central
    differences of the scalar f(x) at n_checks seeded random elements of the array x
    (x itself is left unchanged), each compared with analytic_grad there."""
    from engine.gradcheck import relative_error
    rng = np.random.default_rng(seed)
    rows = []
    for flat in rng.choice(x.size, size=min(n_checks, x.size), replace=False):
        index = tuple(int(i) for i in np.unravel_index(flat, x.shape))
        shifted = x.copy()
        shifted[index] = x[index] + eps
        plus = float(f(shifted))
        shifted[index] = x[index] - eps
        minus = float(f(shifted))
        numeric = (plus - minus) / (2 * eps)
        a = float(analytic_grad[index])
        ab, rel = abs(a - numeric), float(relative_error(a, numeric))
        rows.append(Spot(index, a, numeric, rel, ab, ab <= atol or rel <= rtol))
    return rows


def _check_spot_check(fn):
    # Where later lessons run it: on an array the loss reads, once with the right gradient
    # (every row passes) and once with a gradient wrong in one element (that row fails).
    rng = np.random.default_rng(304)
    x = rng.normal(size=(3, 4))
    c = rng.normal(size=(3, 4))
    f = lambda a: float(np.sum(np.tanh(a * c)))
    right = c * (1 - np.tanh(x * c) ** 2)
    before = x.copy()
    rows = list(fn(f, x, right.copy(), n_checks=x.size, eps=1e-6, rtol=1e-6, atol=1e-8, seed=0))
    if not np.allclose(x, before, rtol=0, atol=1e-12):
        raise SlotError("left the checked array changed: put each nudged element back")
    if len(rows) != x.size or not all(bool(r.ok) for r in rows):
        raise SlotError("did not pass a right gradient on every element of a (3, 4) array")
    wrong = right.copy()
    wrong[1, 2] *= 1.5
    rows = list(fn(f, x, wrong, n_checks=x.size, eps=1e-6, rtol=1e-6, atol=1e-8, seed=0))
    bad = [tuple(int(i) for i in r.index) for r in rows if not bool(r.ok)]
    if bad != [(1, 2)]:
        raise SlotError(f"with one element of the gradient wrong, at (1, 2), it flagged "
                        f"{bad or 'nothing'}")


# ------------------------------------------------------------ lesson 08's loop
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
    from engine.gpt_config import GPTConfig
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


# ----------------------------------------------------------------- contracts
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


def _check_gelu(fn):
    from engine.trainer import kernels as fused
    rng = np.random.default_rng(1001)
    h = rng.normal(size=(2, 8, 32)).astype(np.float32)           # (B, T, 4C), as the model
    bias = rng.normal(size=32).astype(np.float32)
    out = np.full_like(h, np.nan)
    gelu_adapter(fn)(h, bias, out=out)
    want = fused.bias_gelu_forward(h, bias)
    if not np.allclose(out, want, rtol=1e-4, atol=1e-5):
        raise SlotError("on the model's float32 (B*T, 4C) activations the output buffer "
                        "differs from the engine's bias_gelu_forward")


def _check_xent(fn):
    from engine.trainer import kernels as fused
    rng = np.random.default_rng(1002)
    logits = rng.normal(size=(16, 13)).astype(np.float32)
    targets = rng.integers(0, 13, size=16)
    mine, engines = logits.copy(), logits.copy()
    mean, _ = crossentropy_adapter(fn)(mine, targets, 1 / 16, losses=np.empty(16, np.float32))
    ref_mean, _ = fused.crossentropy_softmax(engines, targets, 1 / 16)
    if not math.isclose(mean, ref_mean, rel_tol=1e-4):
        raise SlotError(f"on float32 logits the mean loss is {mean:.6g}, the engine's "
                        f"{ref_mean:.6g}")
    if not np.allclose(mine, engines, atol=1e-6):
        raise SlotError("on float32 logits the gradient left in the logits' buffer differs "
                        "from the engine's")


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


CONTRACTS = {"matmul_vjp": _check_matmul_vjp, "unbroadcast": _check_unbroadcast,
             "accumulate": _check_accumulate, "clip_global_norm": _check_clip, "adamw_step": _check_adamw,
             "bias_gelu_forward": _check_gelu, "softmax_cross_entropy": _check_xent,
             "embedding_backward": _check_embedding, "spot_check": _check_spot_check}


# Contracts that need the trainer's compiled kernels run where the slot is (lesson 13),
# not in the early lesson's check, where compiling them would cost a minute or more.
IN_SLOT_ONLY = {"accumulate"}


def check(piece: str, fn, at_save: bool = False) -> None:
    """Run `fn` in the slot of `piece` beside the engine; SlotError says what went wrong.
    `at_save`: called by the exercise's own check (skips the IN_SLOT_ONLY contracts)."""
    contract = CONTRACTS.get(piece)
    if contract is None or (at_save and piece in IN_SLOT_ONLY):
        return
    try:
        contract(fn)
    except SlotError:
        raise
    except Exception as err:
        raise SlotError(f"raised {type(err).__name__} where the engine runs it: "
                        f"{str(err).splitlines()[0] if str(err) else ''}".rstrip(": ")) from None


# -------------------------------------------------------------------- speed
def seconds(piece: str, fn, cfg, batch_size: int, repeats: int = 5) -> tuple[float, float]:
    """(yours, the engine's) median seconds of one call in the slot at the trainer's shape."""
    from engine.timing import median_seconds
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


# ------------------------------------------------- lesson 08's checkpoint replay
def _check_checkpoint_replay(fn):
    # Where the checkpoint runs it: in the backward pass (recording may be off), on the
    # ndarray the node kept, with the gradient reaching the segment; it must return the
    # input's gradient as an ndarray and leave the parameters' gradients accumulated.
    from engine import F, Tensor, no_grad
    from engine.recompute import replay
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
    from engine import nn
    from engine.gpt_config import GPTConfig, init_params
    from engine.recompute import checkpointed
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


# ---------------------------------------------------------- lesson 09's pieces
def _bf16_probe() -> np.ndarray:
    """float32 values a training step rounds, and the ones that test a rounding: ties,
    subnormals, NaN payloads, values past bf16's max, random bit patterns."""
    rng = np.random.default_rng(901)
    special = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x00008000, 0x00018000,
                        0x7F7F8000, 0x7F800001, 0xFF800001, 0x7FC00000, 0x7F800000,
                        0x00000000, 0x80000000], dtype=np.uint32).view(np.float32)
    random = rng.integers(0, 2 ** 32, 4084, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values = rng.normal(size=3072).astype(np.float32) * np.float32(1e-3)
    return np.concatenate([special, random, values])


def _same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.all((a.view(np.uint32) == b.view(np.uint32))
                                              | (np.isnan(a) & np.isnan(b))))


def _check_to_bf16(fn):
    # engine.precision hands it float32 arrays of any shape: a weight matrix, the
    # transposed view a matmul reads, a 0-d scalar; it must not write into them.
    from engine import precision as P
    probe = _bf16_probe()
    cases = [probe.reshape(64, 112), probe.reshape(112, 64).T, np.float32(1.0001).reshape(())]
    for x in cases:
        before = x.copy()
        with P.use_bf16_rounding(None):
            want = P.round_to_bf16(x)
        with np.errstate(all="ignore"):   # the probe holds NaNs and infinities on purpose
            got = fn(x)
        if not _same_bits(x, before):
            raise SlotError(f"changed the float32 array of shape {x.shape} it was handed: the "
                            f"engine rounds weights and activations it still needs, so work on "
                            f"a copy (bits + ... makes a new array; bits += ... does not)")
        if not isinstance(got, np.ndarray) or got.dtype != np.float32 or got.shape != x.shape:
            raise SlotError(f"on a float32 array of shape {x.shape} it returned "
                            f"{getattr(got, 'dtype', type(got).__name__)} of shape "
                            f"{getattr(got, 'shape', '?')}; the engine needs float32 of the "
                            f"same shape")
        if not _same_bits(got, want):
            layout = "a transposed view" if not x.flags.c_contiguous else f"shape {x.shape}"
            raise SlotError(f"on a float32 array ({layout}) its values differ from "
                            f"engine.precision.round_to_bf16's")


def _check_master_weight_step(fn):
    # A training step hands it a parameter's fp32 master copy, its fp32 gradient and the
    # learning rate as a Python float; compared with engine.precision's
    # MixedPrecisionWeights over two steps.
    from engine import precision as P
    rng = np.random.default_rng(902)
    master = (1.0 + 0.1 * rng.normal(size=(16, 8))).astype(np.float32)
    engine = P.MixedPrecisionWeights({"w": master}, "bf16", master_weights=True)
    mine = master.copy()
    for step in (1, 2):
        grad = rng.normal(size=(16, 8)).astype(np.float32)
        kept = grad.copy()
        with P.use_bf16_rounding(None):
            engine.sgd_step({"w": grad}, 1e-3)
            got = fn(mine.copy(), grad, 1e-3)
            try:
                mine, weights = got
            except (TypeError, ValueError):
                raise SlotError(f"returned {type(got).__name__}, not the pair (new_master, "
                                f"weights)") from None
            mine, weights = np.asarray(mine), np.asarray(weights)
            if not _same_bits(grad, kept):
                raise SlotError("changed the gradient it was handed (the trainer still logs "
                                "and clips it): compute the update into a new array")
            if mine.dtype != np.float32 or mine.shape != master.shape:
                raise SlotError(f"the new master weights are {mine.dtype} of shape "
                                f"{mine.shape}; the optimizer keeps float32 {master.shape}")
            if not np.allclose(mine, engine.master["w"], rtol=1e-6, atol=0):
                raise SlotError(f"after step {step} the fp32 master weights differ from "
                                f"engine.precision.MixedPrecisionWeights' (lr 1e-3)")
            if not _same_bits(weights.astype(np.float32), P.round_to_bf16(mine)):
                raise SlotError(f"after step {step} the weights for the forward are not the "
                                f"bf16 rounding of the new master weights")


def _check_update_scale(fn):
    # A training loop calls it once a step and feeds back what it returns; compared with
    # engine.precision.DynamicLossScaler over 40 steps with overflows mixed in.
    from engine.precision import DynamicLossScaler
    engine = DynamicLossScaler(init_scale=2.0 ** 16, growth_interval=4)
    scale, good = 2.0 ** 16, 0
    pattern = [True] * 9 + [False, False] + [True] * 4 + [False] + [True] * 25
    for step, finite in enumerate(pattern):
        got = fn(scale, good, finite, 4)
        try:
            scale, good, apply = got
        except (TypeError, ValueError):
            raise SlotError(f"returned {got!r}, not (new_scale, new_good_steps, "
                            f"apply_step)") from None
        applied = engine.update(finite)
        if (float(scale), int(good), bool(apply)) != (engine.scale, engine.good_steps, applied):
            raise SlotError(f"at step {step} of a run (growth_interval 4, "
                            f"{'finite' if finite else 'overflowed'} gradients) it gave "
                            f"scale {float(scale):g}, good steps {good}, apply {bool(apply)}; "
                            f"engine.precision.DynamicLossScaler gives {engine.scale:g}, "
                            f"{engine.good_steps}, {applied}")


# The engine's versions, with the calling conventions of exercises 09.3 and 09.2.
def engine_update_scale(scale, good_steps, finite, growth_interval):
    """The engine's loss-scaler rule (engine.precision.DynamicLossScaler) with the calling
    convention of exercise 09.3: (new_scale, new_good_steps, apply_step)."""
    from engine.precision import DynamicLossScaler
    scaler = DynamicLossScaler(init_scale=scale, growth_interval=growth_interval,
                               min_scale=0.0)
    scaler.good_steps = int(good_steps)
    apply = scaler.update(bool(finite))
    return scaler.scale, scaler.good_steps, apply


def engine_master_weight_step(master, grad, lr):
    """The engine's master-weight SGD step (engine.precision.MixedPrecisionWeights) with the
    calling convention of exercise 09.2: (new fp32 master, bf16 weights for the forward)."""
    from engine.precision import MixedPrecisionWeights
    weights = MixedPrecisionWeights({"w": master}, storage="bf16", master_weights=True)
    weights.sgd_step({"w": grad}, lr)
    return weights.master["w"], weights.weights["w"]


CONTRACTS.update({"checkpoint_replay": _check_checkpoint_replay, "to_bf16": _check_to_bf16,
                  "master_weight_step": _check_master_weight_step,
                  "update_scale": _check_update_scale})


# ------------------------------------- lesson 08's loop through the fused model's view
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
    from engine import nn
    from engine.gpt_config import init_params
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

# ------------------------------------------------- the activation model's block count
def engine_block_saved_elements(B: int, T: int, C: int, H: int) -> int:
    """The engine's count, with the calling convention of exercise 06.2: the float
    elements one block of `engine.nn.GPT` keeps (`engine.budget.engine_block_saved`)."""
    from engine import budget
    cfg = budget.BudgetConfig(n_layer=1, d_model=C, n_head=H, micro_batch=B, seq_len=T,
                              block_size=T, vocab_size=11, activation_model="engine")
    return sum(item.elements * item.count for item in budget.engine_block_saved(cfg))


# (B, T, C, H): the shapes of lesson 06's check and of lesson 07's budget (the tiny preset
# at B=16 and B=4, at T=64, and with 8 heads), where the budget runs the piece
BLOCK_COUNT_SHAPES = [(2, 8, 16, 2), (1, 16, 32, 4), (3, 5, 24, 3), (16, 128, 128, 4),
                      (4, 128, 128, 4), (16, 64, 128, 4), (16, 128, 128, 8)]


def _check_block_saved_elements(fn):
    for B, T, C, H in BLOCK_COUNT_SHAPES:
        got, want = fn(B, T, C, H), engine_block_saved_elements(B, T, C, H)
        try:
            same = float(got) == want
        except (TypeError, ValueError):
            raise SlotError(f"returned {got!r} for B={B}, T={T}, C={C}, H={H} instead of a "
                            f"count of elements") from None
        if not same:
            raise SlotError(f"for B={B}, T={T}, C={C}, H={H} it counts {got!r} elements, the "
                            f"engine's block keeps {want:,}")


CONTRACTS["block_saved_elements"] = _check_block_saved_elements

# ---------------------------------------------- lesson 00's finite differences
def engine_central_difference(loss, theta, eps=1e-6):
    """The engine's central difference (`engine.eps_sweep.finite_difference`), with the
    calling convention of exercise 00.1: loss(theta) -> float, theta a float64 vector."""
    from engine.eps_sweep import finite_difference
    return finite_difference(loss, theta, eps, method="central")


def _check_central_difference(fn):
    # Where lesson 01 runs it: a smooth loss of a float64 vector, with an exact gradient;
    # theta must come back as it was, after two loss evaluations per parameter.
    a = np.array([0.4, -1.1, 0.7])
    theta = np.array([0.9, -0.3, 1.6])
    calls = [0]

    def loss(t):
        calls[0] += 1
        return float(np.sum(np.cos(t) * t) + 0.5 * (t @ a) ** 2)

    want = np.cos(theta) - np.sin(theta) * theta + (theta @ a) * a
    probe = theta.copy()
    got = fn(loss, probe, 1e-5)
    if got is None:
        raise SlotError("returned None instead of the gradient")
    if not np.allclose(probe, theta, rtol=0, atol=1e-12):
        raise SlotError("left theta changed: put each nudged parameter back")
    if np.shape(got) != theta.shape or not np.allclose(got, want, rtol=1e-7, atol=1e-9):
        raise SlotError("on a smooth loss of 3 parameters the gradient differs from the "
                        "exact one by more than a central difference's error")
    if calls[0] not in (2 * theta.size, 2 * theta.size + 1):
        raise SlotError(f"called the loss {calls[0]} times for {theta.size} parameters; a "
                        f"central difference needs 2 per parameter")


CONTRACTS["central_difference_gradient"] = _check_central_difference


# ------------------------------------------------------ lesson 02's scalar engine
class ScalarNode:
    """A scalar of a recorded computation, in the convention of lesson 02's `Node`: the
    value `.data`, the gradient `.grad`, the inputs `.parents` and the op name `.op`
    ("+", "-", "*", "square", "relu"). These are the nodes the slot of lesson 02's walk
    hands a piece. `.inputs` is `.parents` under the name `engine.scalar` uses, so
    `engine.scalar.topological_order` can count a graph of either kind."""

    def __init__(self, data, parents=(), op=""):
        self.data = float(data)
        self.grad = 0.0
        self.parents = tuple(parents)
        self.op = op

    @property
    def inputs(self):
        return self.parents

    def __add__(self, other):
        other = _scalar_node(other)
        return ScalarNode(self.data + other.data, (self, other), "+")

    def __sub__(self, other):
        other = _scalar_node(other)
        return ScalarNode(self.data - other.data, (self, other), "-")

    def __mul__(self, other):
        other = _scalar_node(other)
        return ScalarNode(self.data * other.data, (self, other), "*")

    def __radd__(self, other):
        return _scalar_node(other) + self

    def __rsub__(self, other):
        return _scalar_node(other) - self

    def __rmul__(self, other):
        return _scalar_node(other) * self

    def square(self):
        return ScalarNode(self.data ** 2, (self,), "square")

    def relu(self):
        return ScalarNode(self.data if self.data > 0 else 0.0, (self,), "relu")


def _scalar_node(value):
    return value if isinstance(value, ScalarNode) else ScalarNode(value)


def _scalar_case(leaf, square):
    """A graph with every op of lesson 02, a ReLU on and one off, and fan-out; the leaves
    (a, b, c) and the root. `leaf` makes a leaf, `square(v)` squares a value."""
    a, b, c = leaf(1.5), leaf(-2.0), leaf(0.5)
    h = a * b + c                       # -2.5: the first ReLU is off
    s = square(a - c) * b + h.relu() * a + (a * c).relu()
    return (a, b, c), s * a + square(b)


def _check_scalar_backward(fn):
    # Where lesson 03 runs it: `fn(root)` on a graph of ScalarNodes, with the walk's own
    # rules (its default); compared with engine.scalar on the same graph, run twice.
    from engine.scalar import Value
    (va, vb, vc), vroot = _scalar_case(Value, lambda v: v ** 2)
    vroot.backward()
    want = [va.grad, vb.grad, vc.grad]
    leaves, root = _scalar_case(ScalarNode, ScalarNode.square)
    for times in (1, 2):
        fn(root)
        got = [leaf.grad for leaf in leaves]
        if not np.allclose(got, [times * w for w in want], rtol=1e-12, atol=1e-12):
            shown = ", ".join(f"{g:.6g}" for g in got)
            raise SlotError(f"after backward #{times} on a graph of +, -, *, square and relu "
                            f"with a shared input the leaves hold ({shown}); engine.scalar "
                            f"gives ({', '.join(f'{times * w:.6g}' for w in want)})")


CONTRACTS["scalar_backward"] = _check_scalar_backward

# ------------------------------------------- lesson 13's other pieces, in their slots
def _check_checkpoint_peak(fn):
    # Where lesson 13 runs it: the fused trainer's sizes, a checkpoint at every block and
    # one segment over all of them.
    from .lesson08 import exact_checkpoint_peak
    a, b = 1 << 20, 17 << 20              # a residual stream, one block's buffers
    for n_blocks, k in ((4, 1), (4, 4), (12, 1), (6, 4)):
        got, want = fn(n_blocks, k, a, b), exact_checkpoint_peak(n_blocks, k, a, b)
        if got is None or float(got) != want:
            raise SlotError(f"checkpoint_peak({n_blocks}, {k}, {a}, {b}) gives {got!r}, the "
                            f"peak is {want}")


CONTRACTS["checkpoint_peak"] = _check_checkpoint_peak
