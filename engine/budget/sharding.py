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
A ring collective on N devices sends (N-1)/N of the buffer per device for a
reduce-scatter or an all-gather, 2(N-1)/N for an all-reduce (one of each).
One device communicates nothing.
"""
from __future__ import annotations

from .config import BudgetConfig
from .moments import SHARDED  # the fixed buffers each ZeRO stage splits (the term table's)


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
    if cfg.zero == 0:
        plan = [("all-reduce", "gradients", grads, 1)]
    elif cfg.zero == 1:
        plan = [("reduce-scatter", "gradients", grads, 1),
                ("all-gather", "weights", weights, 1)]
    elif cfg.zero == 2:
        plan = [("reduce-scatter", "gradients", grads, k),
                ("all-gather", "weights", weights, 1)]
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
