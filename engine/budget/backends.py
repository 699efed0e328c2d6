"""Where a real step runs: the facts of a backend that change what the step keeps.

PyTorch runs the same model code on CUDA and on the CPU, but three of its
choices differ, and each changes the bytes a step holds:

  dropout's mask   CUDA's fused kernel (`native_dropout`) keeps a bool mask, one
                   byte an element; on the CPU `at::dropout` is not fused: it
                   draws a noise tensor like its input (`empty_like(input)
                   .bernoulli_(1 - p)`) and multiplies, so the mask is a float
                   of the input's dtype (aten/src/ATen/native/Dropout.cpp,
                   `is_fused_kernel_acceptable` is true only for CUDA-like devices).
  SDPA's kernel    with dropout, CUDA runs the flash or memory-efficient kernel,
                   which keeps one logsumexp per query row and the RNG state. The
                   CPU's flash kernel refuses dropout (`sdp_utils_cpp.cpp`,
                   `check_for_dropout`), so `_fused_sdp_choice` picks the math
                   path (`_scaled_dot_product_attention_math`): it upcasts 16-bit
                   Q, K, V to fp32, repeats K and V to every head, and its ops keep
                   fp32 copies of Q and K^T (scaled) and of V, the probabilities,
                   dropout's mask and the probabilities after dropout (T x T each).
  autocast's lists torch.autocast runs some ops in fp32 whatever their input
                   (`AT_FORALL_FP32`, `AT_FORALL_FP32_SET_OPT_DTYPE` in
                   aten/src/ATen/autocast_mode.h). CUDA's list holds layer_norm,
                   softmax, log_softmax, pow, exp, rsqrt and nll_loss; the CPU's
                   holds the losses (nll_loss, cross_entropy) but none of the
                   others, which run in their input's dtype (bf16 in, bf16 out).
                   Matmuls and SDPA run in 16 bits on both.
  cross_entropy    CUDA's list does not hold `cross_entropy_loss`: it runs as the
                   ops it is written in, `log_softmax(x, dim, x.scalar_type())`
                   then `nll_loss` (aten/src/ATen/native/LossNLL.cpp). That
                   log_softmax is handed a dtype, and autocast's
                   `fp32_set_opt_dtype` policy leaves a dtype that is already set
                   alone, so on 16-bit logits it runs in 16 bits and keeps its
                   16-bit output; `nll_loss` is on the fp32 list, so autocast
                   hands it an fp32 copy of that output, which it keeps too. The
                   CPU's list casts cross_entropy's input first: one fp32
                   log_softmax output, read by both. A loss written
                   `F.cross_entropy(logits, y)` on 16-bit logits (nanoGPT's)
                   therefore keeps one more 16-bit B x T x V tensor on CUDA.

One difference is left out on purpose: for some shapes the CPU's bf16 matmul
(oneDNN) allocates scratch while it runs, an fp32 buffer of its output and a pack of
its input for each thread (a LoRA adapter's A over a 352-wide input, 96 tokens: 95 KB
on two threads, 49 KB on one). It depends on the thread count, so a prediction that
counted it would change with the machine; CUDA's cuBLAS keeps its workspace from
step to step. It is most of what the budget misses of small LoRA steps on the CPU.

Measured on this CPU (torch 2.13) by running each op under
`torch.autocast("cpu", torch.bfloat16)` and by walking the autograd graph of
SDPA with dropout; the CUDA facts are the ten measured H200 steps' and the lists
of the installed torch's `ATen/autocast_mode.h` (`tests/test_budget_backend.py`
reads them, and runs CUDA's cross_entropy decomposition under the CPU's autocast,
where the same two policies apply).
"""
from __future__ import annotations

from dataclasses import dataclass

FP32 = 4

# The ops a step runs whose output dtype autocast decides (torch's own names).
AUTOCAST_OPS = ("matmul", "scaled_dot_product_attention", "layer_norm", "softmax",
                "log_softmax", "pow", "exp", "rsqrt", "gelu", "silu", "tanh", "nll_loss",
                "cross_entropy")


@dataclass(frozen=True)
class Backend:
    """What one backend does differently, for the terms that depend on it."""
    name: str
    mask_bytes: int              # a dropout mask element; 0: the input's own dtype
    sdpa_dropout_math: bool      # SDPA with dropout takes the math path
    math_bytes: int              # the math path's compute dtype (fp32: it upcasts 16-bit)
    autocast_fp32_ops: frozenset  # ops autocast runs in fp32 whatever their input

    def dropout_mask_bytes(self, input_bytes: int) -> int:
        """Bytes of one dropout mask element for an input of `input_bytes` per element."""
        return self.mask_bytes or input_bytes

    def output_bytes(self, op: str, input_bytes: int, autocast: bool) -> int:
        """Bytes per element of `op`'s output for an input of `input_bytes`:
        fp32 when autocast lists the op as fp32, else the input's dtype."""
        if op not in AUTOCAST_OPS:
            raise ValueError(f"op={op!r} is not one the budget follows; known: "
                             f"{', '.join(AUTOCAST_OPS)}.")
        return FP32 if autocast and op in self.autocast_fp32_ops else input_bytes

    def sdpa_math(self, dropout: bool) -> bool:
        """Whether SDPA runs its math path (keeping T x T tensors) here."""
        return dropout and self.sdpa_dropout_math


BACKENDS = {b.name: b for b in (
    Backend("cuda", mask_bytes=1, sdpa_dropout_math=False, math_bytes=FP32,
            autocast_fp32_ops=frozenset({"layer_norm", "softmax", "log_softmax", "pow", "exp",
                                         "rsqrt", "nll_loss"})),
    Backend("cpu", mask_bytes=0, sdpa_dropout_math=True, math_bytes=FP32,
            autocast_fp32_ops=frozenset({"nll_loss", "cross_entropy"})),
)}


def backend(name: str) -> Backend:
    """The record of backend `name` ("cuda" or "cpu")."""
    if name not in BACKENDS:
        raise ValueError(f"backend={name!r} is unknown; allowed: {', '.join(BACKENDS)} "
                         f"(the device a real step runs on).")
    return BACKENDS[name]
