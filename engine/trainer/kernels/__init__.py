"""Fused CPU kernels for the GPT trainer, each backward beside its forward.

    module          forward                     backward
    embedding       embedding_forward           embedding_backward   (deterministic scatter-add)
    layernorm       layernorm_forward           layernorm_backward   (one pass per row)
    gelu            bias_gelu_forward           bias_gelu_backward
    attention       attention_forward           attention_backward   (causal, O(T^2) softmax bwd)
    flash_attention flash_attention_forward     flash_attention_backward (tiled, O(T) saved)
    crossentropy    crossentropy_softmax (loss and gradient in one kernel), crossentropy_loss
    residual        residual_bias_add           bias_grad
    linear          linear_forward, gemm        linear_backward      (BLAS or register tiles)
    adamw           adamw_update, global_norm, clip_scale

Beneath them, cpu/ is the back end that numba alone does not give (lane
reductions, register tiles, BLAS from inside a kernel, prefetch, streaming
stores), with its measurements in cpu/README.md; threads.py sets the thread
pools.

Every function takes its inputs positionally and its outputs as keywords
(`out=`, `dx=`, ...). Leave an output out and it is allocated, so a lesson can
call `out, mean, rstd = layernorm_forward(x, w, b)`; pass buffers and the
kernel writes (or, for gradients marked "added into", accumulates) in place,
which is how `engine.trainer.model` runs a step without allocating.

All kernels run in float32 (training) and float64 (gradient checks): numba
compiles one version per dtype on first use and caches it on disk. Each
`prange` kernel has a parallel and a serial build (engine.numba_config.
ParallelKernel); a caller on one numba thread, as every model replica is,
runs and compiles only the serial one. Attention's one-thread build is a
different algorithm, not a copy: blocked products on each head's slices
with the output tile in vector registers (cpu/register_tiles.py). Row
reductions go through the vector lanes of cpu/lanes.py (same bits on every
compile and every CPU), and the small per-row helpers are inlined into
their kernels (`numba_config.row_kernel`). Two hints about memory change no
number: the one-thread attention builds ask for their next rows ahead
(cpu/prefetch.py), and attention's forward writes P, which only the backward
reads, past the caches (cpu/streaming.py).

`engine.trainer.kernels.threads.set_threads(n)` sets both thread pools a step uses
(numba's and BLAS's); see engine/trainer/parallel.py for why the trainer prefers one
single-threaded model replica per core.
"""
from ...numba_config import THREADING_LAYER
from .adamw import adamw_update, clip_scale, global_norm, work_items
from .attention import attention_backward, attention_forward
from .crossentropy import crossentropy_loss, crossentropy_softmax
from .embedding import embedding_backward, embedding_forward
from .flash_attention import flash_attention_backward, flash_attention_forward
from .gelu import bias_gelu_backward, bias_gelu_forward
from .layernorm import layernorm_backward, layernorm_forward
from .linear import gemm, linear_backward, linear_forward
from .residual import bias_grad, residual_bias_add

__all__ = [
    "embedding_forward", "embedding_backward", "layernorm_forward", "layernorm_backward",
    "bias_gelu_forward", "bias_gelu_backward", "attention_forward",
    "attention_backward", "flash_attention_forward", "flash_attention_backward",
    "crossentropy_softmax", "crossentropy_loss", "residual_bias_add",
    "bias_grad", "gemm", "linear_forward", "linear_backward", "adamw_update", "global_norm",
    "clip_scale", "work_items", "THREADING_LAYER",
]
