"""FusedGPT: the GPT of engine.gpt_config on the fused kernels of engine.trainer.kernels.

Memory is laid out once, when the model is built for a micro-batch shape:

* `params.flat` holds every parameter in the order of `param_shapes(cfg)`;
  `params["h0.qkv_w"]` is a view into it. `grads` has the same layout, so the
  optimizer, clipping and the data-parallel all-reduce each see one array.
* `StepBuffers` holds every tensor the backward needs (per layer, or one
  shared layer set when activation checkpointing recomputes them), and
  the backward's scratch. A training step writes into these buffers and
  allocates no new arrays.

One step, with the phases the trainer times separately:

    loss = model.forward(ids, targets, loss_scale=1/K)   # loss; dlogits written in place
    model.backward()                                       # grads += d(loss_scale * loss)
    (optimizer on model.params.flat and model.grads.flat)

Several such models can share one parameter buffer (`shared_params=`): that
is how engine.trainer.parallel.ThreadReplicas runs one replica per core.

Every kernel runs by name through the registry (kernel_registry.py: `KERNELS`,
`use_kernel`, `kernel_owners`, `reset_kernels`, imported here too), so a
learner's kernel can take the engine's place.
"""
from __future__ import annotations

import time

import numpy as np

from . import arena
from . import kernels as fused
# (the lessons import use_kernel, kernel_owners and reset_kernels from here)
from .kernel_registry import (KERNEL_SPECS, KERNELS, kernel_owners,  # noqa: F401
                              reset_kernels, runs_engine_kernel, use_kernel)
from ..fused_buffers import (KEPT, Dims, attention_buffer, buffers, check_attention,
                             layer_sets, model_dims)
from ..gpt_config import GPTConfig, init_params, param_shapes

LN_EPS = 1e-5


# --------------------------------------------------------------- flat parameters
class FlatBuffer:
    """One contiguous array holding named tensors, each a view into it."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], dtype):
        self.layout: dict[str, tuple[int, int, tuple[int, ...]]] = {}
        offset = 0
        for name, shape in shapes.items():
            size = int(np.prod(shape))
            self.layout[name] = (offset, offset + size, tuple(shape))
            offset += size
        self.flat = arena.zeros(offset, dtype)      # on huge pages where it fills one
        self.views = {name: self.flat[a:b].reshape(shape)
                      for name, (a, b, shape) in self.layout.items()}

    def __getitem__(self, name: str) -> np.ndarray:
        return self.views[name]

    def names(self):
        return list(self.layout)

    def span(self, prefix: str) -> tuple[int, int]:
        """[start, stop) of the flat range holding every tensor whose name starts with prefix."""
        spans = [(a, b) for name, (a, b, _) in self.layout.items() if name.startswith(prefix)]
        if not spans:
            raise KeyError(f"FlatBuffer.span: no tensor name starts with {prefix!r}")
        return min(a for a, _ in spans), max(b for _, b in spans)

    def to_dict(self) -> dict[str, np.ndarray]:
        return {name: view.copy() for name, view in self.views.items()}


def gradient_buckets(buffer: FlatBuffer, n_layer: int) -> list[tuple[int, int]]:
    """Flat ranges in the order the backward finishes them: the final LayerNorm,
    blocks L-1 ... 0, then the embeddings (wte and wpe sit together in front;
    wte also gets the tied head's gradient first, but is final only at the end)."""
    return ([buffer.span("lnf_")] + [buffer.span(f"h{i}.") for i in reversed(range(n_layer))]
            + [buffer.span("w")])


def decay_segments(buffer: FlatBuffer):
    """(start, stop, decays) per tensor: weight decay on matrices, not on biases or gains."""
    return [(a, b, len(shape) >= 2) for a, b, shape in buffer.layout.values()]


# --------------------------------------------------------------------- activations
def _fill(owner, zeros, group: str, d: Dims, attention: str) -> None:
    """owner.<name> = zeros(*shape) for each buffer of `group` in engine.fused_buffers."""
    for b in buffers(group, attention):
        setattr(owner, b.name, zeros(*b.shape(d)))


class LayerBuffers:
    """What one block's backward needs, for a micro-batch of N = B*T rows: the
    "layer" entries of engine.fused_buffers (probs with the standard attention
    kernel, lse with the flash one)."""

    def __init__(self, cfg: GPTConfig, B: int, T: int, dtype, attention: str = "standard",
                 zeros=None):
        z = zeros or (lambda *shape: np.zeros(shape, dtype))  # noqa: E731
        check_attention("LayerBuffers", attention)
        _fill(self, z, "layer", model_dims(cfg, B, T), attention)

    def nbytes(self) -> int:
        return sum(v.nbytes for v in vars(self).values())


class StepBuffers:
    """Every buffer a training step uses (the table engine.fused_buffers), allocated
    once for (B, T), all of them views of one block of memory on huge pages where
    the OS gives them (arena.py says why)."""

    def __init__(self, cfg: GPTConfig, B: int, T: int, dtype, checkpointing: bool,
                 attention: str = "standard"):
        allocate = lambda zeros: self._allocate(zeros, cfg, B, T, dtype,  # noqa: E731
                                                checkpointing, attention)
        arena.carve(allocate, dtype)          # runs allocate twice: to measure, then to carve

    def _allocate(self, z, cfg, B, T, dtype, checkpointing, attention):
        d = model_dims(cfg, B, T)
        self.B, self.T, self.checkpointing, self.attention = B, T, checkpointing, attention
        _fill(self, z, "stream", d, attention)
        self.layer_sets = [LayerBuffers(cfg, B, T, dtype, attention, z)
                           for _ in range(layer_sets(d.L, checkpointing))]
        _fill(self, z, "final", d, attention)
        _fill(self, z, "scratch", d, attention)

    def layer(self, index: int) -> LayerBuffers:
        return self.layer_sets[0 if self.checkpointing else index]

    def saved_nbytes(self) -> int:
        """Bytes kept from forward to backward (the activation memory): the
        KEPT groups of engine.fused_buffers, each layer set counted."""
        outside = [b for g in KEPT if g != "layer" for b in buffers(g, self.attention)]
        return (sum(getattr(self, b.name).nbytes for b in outside)
                + sum(s.nbytes() for s in self.layer_sets))


def activation_bytes(models) -> dict:
    """Bytes the step keeps from forward to backward, over the given FusedGPTs
    (the replicas of one step), and attention's own share of them: the
    probabilities (standard kernel) or the row log-sum-exps (flash kernel)."""
    total = attention = 0
    for m in models:
        total += m.acts.saved_nbytes()
        kept = attention_buffer(m.attention).name
        attention += sum(getattr(layer, kept).nbytes for layer in m.acts.layer_sets)
    return {"activation_bytes": total, "attention_saved_bytes": attention}


# ---------------------------------------------------------------------------- model
class FusedGPT:
    """FusedGPT(cfg, batch_size) -> a model whose training step allocates nothing.

    params: a dict name -> array (e.g. from init_params), or None for
    init_params(cfg, seed). dtype float32 trains; float64 checks gradients.
    checkpointing=True keeps only each block's input and recomputes the block
    in the backward (less memory, one more forward's worth of compute).
    attention="flash" runs the tiled attention kernels, which keep O(T) numbers
    per head instead of the (T x T) probabilities ("standard")."""

    def __init__(self, cfg: GPTConfig, batch_size: int, *, params=None, seed: int = 0,
                 dtype=np.float32, checkpointing: bool = False, seq_len: int | None = None,
                 shared_params: "FlatBuffer | None" = None, attention: str = "standard"):
        self.cfg = cfg
        self.attention = check_attention("FusedGPT", attention)
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise TypeError(f"FusedGPT: dtype {self.dtype} is not supported; "
                            f"use float32 or float64")
        self.B, self.T = int(batch_size), int(seq_len or cfg.block_size)
        if self.B < 1 or not 1 <= self.T <= cfg.block_size:
            raise ValueError(f"FusedGPT: need batch_size >= 1 and 1 <= seq_len <= "
                             f"{cfg.block_size}, got {batch_size} and {seq_len}")
        shapes = param_shapes(cfg)
        self.grads = FlatBuffer(shapes, self.dtype)
        if shared_params is not None:          # a replica: read another model's weights
            if shared_params.layout != self.grads.layout or shared_params.flat.dtype != self.dtype:
                raise ValueError("FusedGPT: shared_params has another layout or dtype "
                                 "than this config")
            self.params = shared_params
        else:
            self.params = FlatBuffer(shapes, self.dtype)
            self.load_params(init_params(cfg, seed, self.dtype) if params is None else params)
        self.checkpointing = checkpointing
        self.acts = StepBuffers(cfg, self.B, self.T, self.dtype, checkpointing, attention)
        self._ids = self._targets = None
        self._grad_ready = None

    # -- parameters
    def load_params(self, params: dict[str, np.ndarray]) -> None:
        for name, view in self.params.views.items():
            if name not in params:
                raise KeyError(f"FusedGPT.load_params: {name!r} missing; build params with "
                               f"engine.gpt_config.init_params(cfg)")
            value = np.asarray(params[name])
            if value.shape != view.shape:
                raise ValueError(f"FusedGPT.load_params: {name} has shape {value.shape}, "
                                 f"the config needs {view.shape}")
            view[...] = value

    def zero_grad(self) -> None:
        self.grads.flat[...] = 0

    # -- kernel calls
    def _k(self, name: str, *args, **kwargs):
        """Run kernel `name` of the registry (what use_kernel set, else the engine's)."""
        return KERNELS[name](*args, **kwargs)

    def _check_batch(self, ids, targets=None):
        ids = np.asarray(ids)
        if ids.shape != (self.B, self.T):
            raise ValueError(f"FusedGPT: ids has shape {ids.shape}; this model was laid out for "
                             f"(B, T) = ({self.B}, {self.T}); build one per batch shape")
        if targets is not None and np.shape(targets) != ids.shape:
            raise ValueError(f"FusedGPT: targets shape {np.shape(targets)} != ids shape "
                             f"{ids.shape}")
        return ids

    # -- forward
    def _block_forward(self, i: int) -> None:
        p, a, A = self.params, self.acts, self.acts.layer(i)
        pre, H = f"h{i}.", self.cfg.n_head
        x = a.res[i]
        self._k("layernorm_forward", x, p[pre + "ln1_w"], p[pre + "ln1_b"], LN_EPS,
                out=A.ln1, mean=A.ln1_mean, rstd=A.ln1_rstd)
        self._k("linear_forward", A.ln1, p[pre + "qkv_w"], p[pre + "qkv_b"],
                out=A.qkv.reshape(-1, A.qkv.shape[-1]))
        if self.attention == "flash":
            self._k("flash_attention_forward", A.qkv, H, out=A.atty, lse=A.lse)
        else:
            self._k("attention_forward", A.qkv, H, out=A.atty, probs=A.probs)
        self._k("matmul", A.atty.reshape(-1, A.atty.shape[-1]), p[pre + "proj_w"], out=a.proj)
        self._k("residual_bias_add", x, a.proj, p[pre + "proj_b"], out=A.res_mid)
        self._k("layernorm_forward", A.res_mid, p[pre + "ln2_w"], p[pre + "ln2_b"], LN_EPS,
                out=A.ln2, mean=A.ln2_mean, rstd=A.ln2_rstd)
        self._k("matmul", A.ln2, p[pre + "fc_w"], out=A.fc)
        self._k("bias_gelu_forward", A.fc, p[pre + "fc_b"], out=a.gelu)
        self._k("matmul", a.gelu, p[pre + "fcproj_w"], out=a.proj)
        self._k("residual_bias_add", A.res_mid, a.proj, p[pre + "fcproj_b"], out=a.res[i + 1])

    def forward(self, ids, targets=None, *, loss_scale: float = 1.0):
        """With targets: the mean cross-entropy (a float); the logits' buffer then
        holds d(loss_scale * loss)/dlogits, ready for backward(). Without
        targets: the logits, shape (B, T, V) (a view of the model's buffer)."""
        ids = self._check_batch(ids, targets)
        p, a, L = self.params, self.acts, self.cfg.n_layer
        self._k("embedding_forward", ids, p["wte"], p["wpe"],
                out=a.res[0].reshape(self.B, self.T, -1))
        for i in range(L):
            self._block_forward(i)
        self._k("layernorm_forward", a.res[L], p["lnf_w"], p["lnf_b"], LN_EPS,
                out=a.lnf, mean=a.lnf_mean, rstd=a.lnf_rstd)
        self._k("matmul", a.lnf, p["wte"], out=a.logits, trans_b=True)   # tied head
        if targets is None:
            self._ids = None
            return a.logits.reshape(self.B, self.T, -1)
        self._ids = ids
        scale = loss_scale / (self.B * self.T)
        loss, _ = self._k("crossentropy_softmax", a.logits, np.asarray(targets).reshape(-1),
                          scale, losses=a.losses)
        return loss

    def loss(self, ids, targets) -> float:
        """Mean cross-entropy without preparing a backward (evaluation)."""
        self.forward(ids)
        mean, _ = fused.crossentropy_loss(self.acts.logits, np.asarray(targets).reshape(-1),
                                          losses=self.acts.losses)
        return mean

    # -- backward
    def _weight_gradient(self, name: str, x, dy) -> None:
        """grads[name] += x^T dy."""
        self._k("matmul", x, dy, out=self.grads[name], trans_a=True, accumulate=True)

    def _gelu_backward(self, fc, fc_b, dfc_b) -> None:
        """dgelu becomes the gradient at the fc output (in place), and a.gelu holds
        GELU's output again, for fcproj's weight gradient. The forward does not
        keep that output (4C numbers a row, the largest activation of a block).
        The engine's backward has each element's sigmoid in hand and writes
        u * sigmoid in the same sweep, with the forward's bits. A replacement
        backward (use_kernel) writes no such output, so the registered forward
        runs again; so it does when the forward is the replacement, since the
        engine's formula need not give that forward's output."""
        a = self.acts
        if runs_engine_kernel("bias_gelu_backward") and runs_engine_kernel("bias_gelu_forward"):
            self._k("bias_gelu_backward", a.dgelu, fc, fc_b, dh=a.dgelu, dbias=dfc_b,
                    out=a.gelu)
        else:
            self._k("bias_gelu_forward", fc, fc_b, out=a.gelu)
            self._k("bias_gelu_backward", a.dgelu, fc, fc_b, dh=a.dgelu, dbias=dfc_b)

    def _block_backward(self, i: int) -> None:
        p, g, a, A = self.params, self.grads, self.acts, self.acts.layer(i)
        pre = f"h{i}."
        dres = a.dres
        # MLP branch: res[i+1] = res_mid + gelu(ln2 @ fc_w + fc_b) @ fcproj_w + fcproj_b
        self._k("bias_grad", dres, dbias=g[pre + "fcproj_b"])
        self._k("matmul", dres, p[pre + "fcproj_w"], out=a.dgelu, trans_b=True)
        self._gelu_backward(A.fc, p[pre + "fc_b"], g[pre + "fc_b"])    # a.gelu refilled
        self._weight_gradient(pre + "fcproj_w", a.gelu, dres)
        self._weight_gradient(pre + "fc_w", A.ln2, a.dgelu)
        self._k("matmul", a.dgelu, p[pre + "fc_w"], out=a.dln, trans_b=True)
        self._k("layernorm_backward", a.dln, A.res_mid, p[pre + "ln2_w"], A.ln2_mean,
                A.ln2_rstd, dx=dres, dw=g[pre + "ln2_w"], db=g[pre + "ln2_b"])
        # attention branch: res_mid = res[i] + attention(ln1 @ qkv_w + qkv_b) @ proj_w + proj_b
        self._k("bias_grad", dres, dbias=g[pre + "proj_b"])
        atty = A.atty.reshape(-1, A.atty.shape[-1])
        self._weight_gradient(pre + "proj_w", atty, dres)
        self._k("matmul", dres, p[pre + "proj_w"], out=a.datty.reshape(atty.shape), trans_b=True)
        if self.attention == "flash":
            self._k("flash_attention_backward", a.datty, A.qkv, A.atty, A.lse, dqkv=a.dqkv)
        else:
            self._k("attention_backward", a.datty, A.qkv, A.probs, dqkv=a.dqkv)
        dqkv = a.dqkv.reshape(-1, a.dqkv.shape[-1])
        self._k("bias_grad", dqkv, dbias=g[pre + "qkv_b"])
        self._weight_gradient(pre + "qkv_w", A.ln1, dqkv)
        self._k("matmul", dqkv, p[pre + "qkv_w"], out=a.dln, trans_b=True)
        self._k("layernorm_backward", a.dln, a.res[i], p[pre + "ln1_w"], A.ln1_mean,
                A.ln1_rstd, dx=dres, dw=g[pre + "ln1_w"], db=g[pre + "ln1_b"])

    def backward(self, grad_ready=None) -> None:
        """Add d(loss_scale * loss)/dparams into self.grads (call zero_grad() between
        optimizer steps). grad_ready(start, stop), if given, is called as soon as a
        flat range of gradients is final: last block first, embeddings last (this
        is what lets a data-parallel all-reduce overlap the rest of the backward)."""
        if self._ids is None:
            raise RuntimeError("FusedGPT.backward: call forward(ids, targets) first (a forward "
                               "without targets, or loss(), prepares no gradient)")
        p, g, a, L = self.params, self.grads, self.acts, self.cfg.n_layer
        # head: logits = lnf @ wte^T, a.logits already holds dlogits
        self._k("matmul", a.logits, p["wte"], out=a.dln)
        self._weight_gradient("wte", a.logits, a.lnf)
        a.dres[...] = 0
        self._k("layernorm_backward", a.dln, a.res[L], p["lnf_w"], a.lnf_mean, a.lnf_rstd,
                dx=a.dres, dw=g["lnf_w"], db=g["lnf_b"])
        buckets = iter(gradient_buckets(g, L))
        if grad_ready is not None:
            grad_ready(*next(buckets))             # lnf
        for i in reversed(range(L)):
            if self.checkpointing:
                self._block_forward(i)             # recompute this block's activations
            self._block_backward(i)
            if grad_ready is not None:
                grad_ready(*next(buckets))         # block i
        self._k("embedding_backward", self._ids, a.dres.reshape(self.B, self.T, -1),
                self.cfg.vocab_size, dwte=g["wte"], dwpe=g["wpe"])
        if grad_ready is not None:
            grad_ready(*next(buckets))             # wte and wpe
        self._ids = None

    def forward_backward(self, ids, targets, *, loss_scale: float = 1.0, grad_ready=None,
                         last: bool = True):
        """One micro-batch: forward, then backward (grad_ready: see backward).
        Returns (loss, forward seconds, backward seconds). (`last` matters to
        engine.trainer.parallel.ThreadReplicas, which has the same method; one
        model has nothing to do at the last micro-batch.)"""
        t0 = time.perf_counter()
        loss = self.forward(ids, targets, loss_scale=loss_scale)
        t1 = time.perf_counter()
        self.backward(grad_ready)
        return loss, t1 - t0, time.perf_counter() - t1

    # -- conveniences
    def named_params(self) -> dict[str, np.ndarray]:
        return dict(self.params.views)

    def named_grads(self) -> dict[str, np.ndarray]:
        return dict(self.grads.views)

    def num_params(self) -> int:
        return self.params.flat.size

    def flops_per_step(self) -> dict[str, float]:
        """Multiply-add FLOPs of one forward+backward (matmuls counted as 2mnk)."""
        return step_flops(self.cfg, self.B, self.T)


def step_flops(cfg: GPTConfig, B: int, T: int) -> dict[str, float]:
    """FLOPs of one training step (forward + backward): the linear layers'
    matmuls (6 per weight per token, the head included) and attention's causal
    products (forward 2, backward 4 products of T(T+1)/2 * hs multiply-adds)."""
    N, C, L, V, H = B * T, cfg.n_embd, cfg.n_layer, cfg.vocab_size, cfg.n_head
    linear = 6.0 * N * (L * 12 * C * C + V * C)
    attention = L * B * H * (T * (T + 1) / 2) * (C // H) * 2 * 6.0
    return {"linear": linear, "attention": attention, "total": linear + attention}
