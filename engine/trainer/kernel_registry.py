"""The kernel registry: which function the model runs for each kernel name.

FusedGPT calls every kernel by name (`KERNELS[name](inputs..., outputs=...)`),
so a kernel can be replaced without touching the model. Replace one with
`use_kernel(name, your_function, owner="you")`: your function takes the inputs
listed in `KERNEL_SPECS[name]` and returns the outputs; the registry wraps it so
that the model's buffers receive them (written, or added into).
`kernel_owners()` says whose kernel each name runs, `reset_kernels()` goes back
to the engine's. Lessons 10-13 plug the learner's kernels in here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import kernels as fused

@dataclass(frozen=True)
class KernelSpec:
    """How the model calls a kernel: positional inputs, then keyword outputs.
    Each output is written ("write") or accumulated into ("add")."""
    inputs: tuple[str, ...]
    outputs: tuple[tuple[str, str], ...]
    doc: str


KERNEL_SPECS: dict[str, KernelSpec] = {
    "embedding_forward": KernelSpec(("ids", "wte", "wpe"), (("out", "write"),),
                                    "x = wte[ids] + wpe[:T]"),
    "embedding_backward": KernelSpec(("ids", "dx", "vocab_size"),
                                     (("dwte", "add"), ("dwpe", "add")),
                                     "scatter-add of dx into the rows of dwte; dwpe += sum over "
                                     "batch (pure form: fn(ids (N,), dx (N, C), V) -> dwte)"),
    "layernorm_forward": KernelSpec(("x", "w", "b", "eps"),
                                    (("out", "write"), ("mean", "write"), ("rstd", "write")),
                                    "LayerNorm over the last axis"),
    "layernorm_backward": KernelSpec(("dout", "x", "w", "mean", "rstd"),
                                     (("dx", "add"), ("dw", "add"), ("db", "add")),
                                     "LayerNorm gradients (dx added into the residual's gradient)"),
    "matmul": KernelSpec(("a", "b"), (("out", "write"),),
                         "out = a @ b (the model passes transposes as flags; see use_kernel)"),
    "linear_forward": KernelSpec(("x", "w", "b"), (("out", "write"),), "out = x @ w + b"),
    "bias_gelu_forward": KernelSpec(("h", "bias"), (("out", "write"),), "out = gelu(h + bias)"),
    "bias_gelu_backward": KernelSpec(("dout", "h", "bias"), (("dh", "write"), ("dbias", "add")),
                                     "dh = dout * gelu'(h + bias); dbias += sum of dh"),
    "attention_forward": KernelSpec(("qkv", "n_head"), (("out", "write"), ("probs", "write")),
                                    "causal multi-head attention; probs saved for backward"),
    "attention_backward": KernelSpec(("dout", "qkv", "probs"), (("dqkv", "write"),),
                                     "gradient of attention with respect to qkv"),
    "flash_attention_forward": KernelSpec(("qkv", "n_head"), (("out", "write"), ("lse", "write")),
                                          "causal attention, tiled; one log-sum-exp per row "
                                          "saved for backward (no T x T matrix)"),
    "flash_attention_backward": KernelSpec(("dout", "qkv", "out", "lse"), (("dqkv", "write"),),
                                           "gradient of flash attention, probabilities "
                                           "recomputed tile by tile"),
    "residual_bias_add": KernelSpec(("x", "y", "bias"), (("out", "write"),), "out = x + y + bias"),
    "bias_grad": KernelSpec(("dout",), (("dbias", "add"),), "dbias += dout summed over rows"),
    "crossentropy_softmax": KernelSpec(("logits", "targets", "scale"), (("losses", "write"),),
                                       "per-row losses; logits overwritten with scale * "
                                       "dloss/dlogits (pure form: fn(logits, targets) -> mean "
                                       "loss, logits overwritten with d(mean)/dlogits)"),
}

_ENGINE_KERNELS = {
    "embedding_forward": fused.embedding_forward,
    "embedding_backward": fused.embedding_backward,
    "layernorm_forward": fused.layernorm_forward,
    "layernorm_backward": fused.layernorm_backward,
    "matmul": fused.gemm,
    "linear_forward": fused.linear_forward,
    "bias_gelu_forward": fused.bias_gelu_forward,
    "bias_gelu_backward": fused.bias_gelu_backward,
    "attention_forward": fused.attention_forward,
    "attention_backward": fused.attention_backward,
    "flash_attention_forward": fused.flash_attention_forward,
    "flash_attention_backward": fused.flash_attention_backward,
    "residual_bias_add": fused.residual_bias_add,
    "bias_grad": fused.bias_grad,
    "crossentropy_softmax": fused.crossentropy_softmax,
}

KERNELS: dict[str, object] = dict(_ENGINE_KERNELS)
_OWNERS: dict[str, str] = {name: "engine" for name in KERNELS}


def _adapt_pure(name: str, fn):
    """Wrap a pure function (inputs -> outputs) into the model's in-place convention."""
    spec = KERNEL_SPECS[name]

    if name == "matmul":
        def matmul(a, b, out, *, trans_a=False, trans_b=False, accumulate=False):
            result = np.asarray(fn(a.T if trans_a else a, b.T if trans_b else b))
            _store(name, "out", out, result, "add" if accumulate else "write")
            return out
        return matmul

    if name == "crossentropy_softmax":
        # pure form (lesson 10's): fn(logits, targets) -> mean loss, the logits
        # overwritten with d(mean)/dlogits; the model wants d(scale * sum)/dlogits.
        def crossentropy(logits, targets, scale, *, losses):
            mean = float(fn(logits, targets))
            logits *= logits.dtype.type(scale * logits.shape[0])
            losses[...] = mean
            return mean, losses
        return crossentropy

    if name == "embedding_backward":
        # pure form (lesson 11's): fn(ids (N,), dx (N, C), vocab_size) -> dwte;
        # the position table's gradient, a sum over the batch, is added here.
        def embedding_backward(ids, dx, vocab_size, *, dwte, dwpe):
            B, T = ids.shape
            C = dwte.shape[1]
            _store(name, "dwte", dwte, np.asarray(fn(np.ascontiguousarray(ids).reshape(-1),
                                                     dx.reshape(-1, C), vocab_size)), "add")
            dwpe[:T] += dx.reshape(B, T, C).sum(axis=0)
            return dwte, dwpe
        return embedding_backward

    def adapted(*inputs, **outs):
        results = fn(*inputs)
        results = results if isinstance(results, tuple) else (results,)
        if len(results) != len(spec.outputs):
            raise ValueError(f"{name}: your function returned {len(results)} values; "
                             f"it must return {[o for o, _ in spec.outputs]}")
        for (out_name, mode), value in zip(spec.outputs, results):
            _store(name, out_name, outs[out_name], np.asarray(value), mode)
        return tuple(outs[o] for o, _ in spec.outputs)
    return adapted


def _store(kernel, out_name, buf, value, mode):
    if value.size != buf.size:
        raise ValueError(f"{kernel}: output {out_name} has shape {value.shape}, the model "
                         f"expects {buf.shape}")
    if mode == "add":
        buf += value.reshape(buf.shape)
    else:
        buf[...] = value.reshape(buf.shape)


def use_kernel(name: str, fn, owner: str = "you", *, pure: bool = True) -> None:
    """Run the model's `name` kernel through `fn` from now on.

    pure=True: fn(*inputs) returns the outputs of KERNEL_SPECS[name] (the
    model writes or adds them into its buffers). pure=False: fn has the
    engine's in-place signature (inputs, then outputs as keywords)."""
    if name not in KERNEL_SPECS:
        raise KeyError(f"use_kernel: no kernel named {name!r}; choose from {sorted(KERNEL_SPECS)}")
    KERNELS[name] = _adapt_pure(name, fn) if pure else fn
    _OWNERS[name] = owner


def reset_kernels(*names: str) -> None:
    """Back to the engine's kernels (all of them, or the ones named)."""
    for name in names or tuple(_ENGINE_KERNELS):
        KERNELS[name] = _ENGINE_KERNELS[name]
        _OWNERS[name] = "engine"


def kernel_owners() -> dict[str, str]:
    """name -> whose kernel the model runs ("engine" or the owner given to use_kernel)."""
    return dict(_OWNERS)


def runs_engine_kernel(name: str) -> bool:
    """Whether the model runs the engine's own kernel for `name` (not a replacement)."""
    return KERNELS[name] is _ENGINE_KERNELS[name]
