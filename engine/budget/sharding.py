"""Data parallelism over N devices with ZeRO sharding: what one device holds,
and what the collectives move per optimizer step.

Each of N devices runs its own micro-batches on a full replica of the model,
so activations are per device and unchanged. ZeRO (Rajbhandari et al. 2020,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models")
partitions the fixed memory instead of replicating it:

    stage 0  plain data parallel: every device holds everything
    stage 1  P_os: the optimizer state is split N ways (with the fp32 master
             weights: the paper's K = 12 bytes/param of mixed-precision Adam
             are master weights + momentum + variance)
    stage 2  P_os+g: the gradients too
    stage 3  P_os+g+p: the weights too

With Psi parameters, 16-bit weights and gradients and K = 12, one device
holds (2 + 2 + K) Psi, 2Psi + 2Psi + K Psi / N, 2Psi + (2 + K) Psi / N and
(2 + 2 + K) Psi / N bytes: the paper's Figure 1.

Communication per optimizer step (Section 7 of the paper), with G the
gradient bytes and W the weight bytes of the whole model:
    stage 0  all-reduce the gradients once, after the K micro-batches
    stage 1  reduce-scatter the gradients once (each device keeps the sum of
             its shard), all-gather the updated weights once
    stage 2  the full gradient is never kept, so the reduce-scatter runs
             after every micro-batch; the all-gather once
    stage 3  the weights are gathered for the forward and again for the
             backward of every micro-batch; gradients reduce-scattered after
             every micro-batch
Under a recipe that freezes the model (LoRA, QLoRA) G is the trained tensors'
gradients, and stages 1 and 2 gather back only those tensors (the frozen
weights are replicated and never change); stage 3 still gathers every weight.
A ring collective on N devices sends (N-1)/N of the buffer per device for a
reduce-scatter or an all-gather, 2(N-1)/N for an all-reduce (one of each).
One device communicates nothing.

Gradients as the engines hold them (stages 2 and 3, the pytorch and hf steps)
------------------------------------------------------------------------------
A device never holds every gradient unsharded: autograd makes each parameter's
gradient whole, and the engine reduces it and keeps only this device's shard while
the backward goes on. What is whole at a moment beyond the shard depends on the
engine (`zero_engine`):
  deepspeed  gradients are copied into a contiguous bucket as autograd makes them
             and reduced whenever it fills, then dropped. The assumption is
             DeepSpeed's defaults (its configuration docs; deepspeed/runtime/zero/
             config.py): `reduce_bucket_size` 5e8 elements, `contiguous_gradients`
             on, `overlap_comm` off at stage 2 and on at stage 3. Stage 2 allocates
             one bucket of 5e8 elements in each backward (two with `overlap_comm`
             on) and frees it after; stage 3 allocates one when it starts and keeps
             it. A parameter larger than the bucket is reduced from its own gradient.
  fsdp       each block is a unit (the transformer auto-wrap policy practitioners
             use); when a unit's backward ends its gradients are reduce-scattered
             into the shard while the next unit's backward runs: one block's whole
             gradients beyond the shard. The embeddings, the final norm and the head
             are the root unit, reduce-scattered at the end of the backward, so the
             head's gradient stays whole from the head's backward to the end.
Either way a tied head's gradient contribution waits in autograd for the
embedding's until the end of the backward. The textbook models (rule,
transformer, engine) keep the paper's shard alone.
"""
from __future__ import annotations

from .config import BudgetConfig
from . import moments as M, recipes
from .moments import SHARDED  # the fixed buffers each ZeRO stage splits (the term table's)

# DeepSpeed's zero_optimization.reduce_bucket_size default, in elements (see above).
REDUCE_BUCKET_ELEMENTS = 500_000_000


def shard(total: int, devices: int) -> int:
    """One device's part of a buffer split `devices` ways (rounded up)."""
    return -(-total // devices)


def per_device_fixed(cfg: BudgetConfig, fixed: dict[str, int]) -> dict[str, int]:
    """The fixed bytes one device holds under `cfg.zero` over `cfg.devices`."""
    sharded = SHARDED[cfg.zero] if cfg.devices > 1 else ()
    return {k: shard(v, cfg.devices) if k in sharded else v for k, v in fixed.items()}


def communication(cfg: BudgetConfig, fixed: dict[str, int]) -> list[dict]:
    """The collectives of one optimizer step: for each, its name, the buffer,
    its bytes, how many times it runs per step and the bytes each device
    sends per step (ring algorithm). Empty on one device."""
    n, k = cfg.devices, cfg.accumulation
    if n == 1:
        return []
    grads, weights = fixed["gradients"], fixed["weights"]
    # ZeRO 1 and 2 gather back only what the optimizer updated: under a recipe that
    # freezes the model, its trained tensors, whose gradients have their own dtype
    # (a PyTorch gradient takes its parameter's), so they are as large as the gradients.
    # ZeRO 3 shards every weight, frozen or not, and gathers them all for each pass.
    updated = grads if recipes.freezes_base(cfg) else weights
    if cfg.zero == 0:
        plan = [("all-reduce", "gradients", grads, 1)]
    elif cfg.zero == 1:
        plan = [("reduce-scatter", "gradients", grads, 1),
                ("all-gather", "weights", updated, 1)]
    elif cfg.zero == 2:
        plan = [("reduce-scatter", "gradients", grads, k),
                ("all-gather", "weights", updated, 1)]
    else:
        plan = [("all-gather", "weights (forward)", weights, k),
                ("all-gather", "weights (backward)", weights, k),
                ("reduce-scatter", "gradients", grads, k)]
    rows = []
    for collective, buffer, size, times in plan:
        factor = 2 if collective == "all-reduce" else 1
        rows.append({"collective": collective, "buffer": buffer, "bytes": size,
                     "times_per_step": times,
                     "sent_per_device": times * factor * (n - 1) * size // n})
    return rows


# ------------------------------------------- ZeRO-2 and ZeRO-3 gradients in a real step
def shards_gradients(cfg: BudgetConfig) -> bool:
    """Whether each device keeps only a shard of the gradients (ZeRO 2 or 3 over several)."""
    return cfg.devices > 1 and cfg.zero >= 2


def shards_optimizer(cfg: BudgetConfig) -> bool:
    """Whether each device steps the optimizer over its own shard (ZeRO 1 and up)."""
    return cfg.devices > 1 and cfg.zero >= 1


def block_of(name: str) -> str | None:
    """The block a parameter belongs to ("h.3", "layers.3"), None for the root's."""
    parts = name.split(".")
    if len(parts) > 2 and parts[0] in ("h", "layers") and parts[1].isdigit():
        return ".".join(parts[:2])
    return None


def engine_name(cfg: BudgetConfig) -> str:
    """How the output names the engine whose gradients a sharded step follows."""
    if cfg.zero_engine == "fsdp":
        return "FSDP: each block's gradients reduce-scattered as its backward ends"
    return (f"DeepSpeed: reduced in buckets of {REDUCE_BUCKET_ELEMENTS:.0e} elements "
            f"(reduce_bucket_size)").replace("e+0", "e")


def gradients_in_flight(cfg: BudgetConfig, tensors, grad_bytes: int,
                        head: int) -> dict[str, list[tuple[str, int]]]:
    """Moment -> the (what, bytes) of whole gradients one device holds beyond its shard
    under ZeRO 2 or 3 (see the module's doc), besides the gradient autograd is making
    (the head's at the head's backward, the token embedding's at the end). `tensors`:
    the trained parameters (optimizer_step.ParamTensor), the backward's last first;
    `head`: the head's weight elements when it is trained (0 under LoRA)."""
    tied_head = [("a tied head's gradient contribution, waiting for the embedding's",
                  head * grad_bytes)] if cfg.tied_embedding else []
    if cfg.zero_engine == "fsdp":
        blocks: dict[str, int] = {}
        for t in tensors:
            unit = block_of(t.name)
            if unit is not None:
                blocks[unit] = blocks.get(unit, 0) + t.numel
        block = [("one block's gradients, whole until its reduce-scatter ends",
                  max(blocks.values(), default=0) * grad_bytes)]
        root = sum(t.numel for t in tensors[1:] if block_of(t.name) is None)
        return {M.RECOMPUTED: [*block, ("the head's gradient (the root unit's, whole until "
                                        "the end of the backward)", head * grad_bytes)],
                M.BACKWARD_END: [*block, ("the root unit's other gradients (head, norms), "
                                          "whole until the end of the backward",
                                          root * grad_bytes)]}
    bucket = [("DeepSpeed's gradient bucket (reduce_bucket_size elements)",
               REDUCE_BUCKET_ELEMENTS * grad_bytes)]
    found = {M.HEAD_BACKWARD: bucket, M.RECOMPUTED: [*bucket, *tied_head],
             M.BACKWARD_END: bucket}
    if cfg.zero == 3:  # allocated once at the start: alive in every moment
        for at in (M.FORWARD_END, M.LOSS_BACKWARD, M.OPTIMIZER_STEP):
            found[at] = bucket
    return found
