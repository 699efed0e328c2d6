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

Weights as the engines gather them (stage 3, the pytorch and hf steps)
----------------------------------------------------------------------
Under stage 3 a device stores only its shard of the weights, but every op computes
with whole ones: the engine all-gathers a part of the model into a buffer of its own
before the part's forward and again before its backward, and frees it after. Beyond
the shard a device then holds (`weights_gathered`, terms named "gathered weights"):
  fsdp       FSDP1 (`FullyShardedDataParallel`) with the transformer auto-wrap policy
             and its defaults: each block a unit, the root unit the rest (embeddings,
             final norm, head). A block's unit is gathered for its forward and freed
             after it (FULL_SHARD reshards after forward), gathered again for its
             backward and freed after it. The root unit is not freed after the forward
             (torch/distributed/fsdp/_runtime_utils.py, `_post_forward_reshard`: "Do
             not free the root's parameters in the post-forward for FULL_SHARD"), so it
             stays whole from the start of the forward to the end of the backward.
             `backward_prefetch=BACKWARD_PRE` (the default) issues the next unit's
             all-gather in the current unit's pre-backward hook, before its gradients
             are computed, the next being the unit before it in the forward's
             post-forward order (`_exec_order_utils.get_handle_to_backward_prefetch`):
             the root's pre-backward, at the loss's backward, prefetches the last
             block; a block's prefetches the block before it. So the loss's and the
             head's backward hold the root and the last block whole, a block's backward
             (the last's or the first's, rebuilt first under checkpointing) the root
             and two blocks, the end of the backward (the
             token embedding's gradient, after the first block's unit was freed) the
             root alone. Nothing is whole at the optimizer step.
  deepspeed  DeepSpeed gathers each module's own parameters (a Linear, a norm, the
             embedding) before the module runs and releases them after, replaying the
             order of modules recorded in the first step. Its defaults
             (deepspeed/runtime/zero/config.py, `DeepSpeedZeroConfig`):
             `stage3_prefetch_bucket_size` 5e7 elements gathered ahead of use, no more
             while `stage3_max_live_parameters` (1e9 elements) are whole, and a module
             used again within `stage3_max_reuse_distance` (1e9 elements of the
             modules in between) is not released: around the turn from the forward to
             the backward the last blocks and the head stay whole. The step is
             replayed module by module with these three rules (`_deepspeed_replay`);
             each moment holds what is whole at its module: the head's at the end of
             the forward, the head's backward, the block's backward that holds the
             most (with recompute: its modules rerun, then their backward; the last
             block's and the first's both read it) and the token embedding's
             backward. Step 1 records that order (partitioned_param_coordinator.py: no
             prefetch and every module released until the trace is complete): it
             holds only the module running. Parameters under
             `stage3_param_persistence_threshold` (1e5 elements: the norm gains) are
             never partitioned; their few elements are left out. (transformers'
             DeepSpeed integration fills a config's "auto" with other values, e.g. a
             prefetch bucket of 0.9 x width^2: not modelled.)
Each module or unit is gathered in the dtype its weights are stored in (an engine
that computes in 16 bits over fp32 weights under autocast, as the budget's step does,
gathers the fp32 weights and autocast casts them, its 16-bit copies counted where they
are kept; FSDP's `MixedPrecision(param_dtype=bf16)` would gather 16-bit ones and is not
modelled); a QLoRA layer's 4-bit weight in its packed bytes. Under LoRA and QLoRA the
frozen weights are sharded too and gathered like the rest, beside the adapters.
"""
from __future__ import annotations

import functools

from .config import BudgetConfig
from . import moments as M, recipes
from .counts import bytes_per_parameter
from .moments import SHARDED  # the fixed buffers each ZeRO stage splits (the term table's)
from .optimizer_step import block_of, parameter_tensors, trainable_tensors
from .qlora import NF4_BLOCK
from .weights_dtype import bf16_weights, frozen_weight_bytes, training_bytes

# DeepSpeed's zero_optimization.reduce_bucket_size default, in elements (see above).
REDUCE_BUCKET_ELEMENTS = 500_000_000
# DeepSpeed's stage-3 defaults, in elements (deepspeed/runtime/zero/config.py).
PREFETCH_BUCKET_ELEMENTS = 50_000_000       # stage3_prefetch_bucket_size
MAX_LIVE_ELEMENTS = 1_000_000_000           # stage3_max_live_parameters
MAX_REUSE_ELEMENTS = 1_000_000_000          # stage3_max_reuse_distance


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
        return {M.FIRST_BLOCK_BACKWARD: [*block, ("the head's gradient (the root unit's, "
                                                  "whole until the end of the backward)",
                                                  head * grad_bytes)],
                M.BACKWARD_END: [*block, ("the root unit's other gradients (head, norms), "
                                          "whole until the end of the backward",
                                          root * grad_bytes)]}
    bucket = [("DeepSpeed's gradient bucket (reduce_bucket_size elements)",
               REDUCE_BUCKET_ELEMENTS * grad_bytes)]
    found = {M.HEAD_BACKWARD: bucket, M.FIRST_BLOCK_BACKWARD: [*bucket, *tied_head],
             M.BACKWARD_END: bucket}
    if cfg.zero == 3:  # allocated once at the start: alive in every moment
        for at in (M.FORWARD_END, M.LOSS_BACKWARD, M.OPTIMIZER_STEP):
            found[at] = bucket
    return found


# ------------------------------------------------------- ZeRO-3 weights gathered whole
def gathers_weights(cfg: BudgetConfig) -> bool:
    """Whether each device stores only a shard of the weights (ZeRO 3 over several)."""
    return cfg.devices > 1 and cfg.zero == 3


def _module_of(name: str) -> str:
    """The module that owns a parameter: its name without the last part ("weight")."""
    return name.rsplit(".", 1)[0]


def weight_modules(cfg: BudgetConfig) -> list[tuple[str, int, int]]:
    """Every module holding weights, in the order the forward runs them: (name, elements,
    bytes as stored). Under a recipe that freezes the model, the frozen weights (in the
    dtype they were loaded in, a QLoRA layer's packed 4 bits) and right after each the
    trained tensors that sit in it (LoRA's A and B, DoRA's magnitudes, a trained
    copy). Their bytes add up to `counts.fixed_bytes(cfg)["weights"]`."""
    trained = training_bytes(cfg, bytes_per_parameter(
        cfg.precision, cfg.optimizer, cfg.grad_precision, cfg.real_16bit))["weights"]
    frozen = recipes.freezes_base(cfg)
    base = (frozen_weight_bytes(cfg) if bf16_weights(cfg) else trained) if frozen else trained
    modules: dict[str, list[int]] = {}
    for t in parameter_tensors(cfg):
        quantized = cfg.qlora and frozen and t.rows_and_columns and block_of(t.name)
        size = ((t.numel + 1) // 2 + -(-t.numel // NF4_BLOCK) * 4 if quantized
                else t.numel * base)
        entry = modules.setdefault(_module_of(t.name), [0, 0])
        entry[0] += t.numel
        entry[1] += size
    if frozen:
        order = list(modules)
        for t in trainable_tensors(cfg):  # each after the module it sits in
            owner = max((m for m in order if t.name.startswith(m + ".")), key=len, default=None)
            name = _module_of(t.name)
            if name not in modules:
                order.insert(order.index(owner) + 1 if owner else len(order), name)
                modules[name] = [0, 0]
            modules[name][0] += t.numel
            modules[name][1] += t.numel * trained
        modules = {m: modules[m] for m in order}
    return [(m, n, b) for m, (n, b) in modules.items()]


def _unit(module: str) -> str | None:
    """The FSDP unit of a module: its block, None for the root's."""
    return block_of(module + ".weight")


def _fsdp_gathered(cfg: BudgetConfig, modules) -> dict[str, list[tuple[str, int]]]:
    root = sum(b for m, _, b in modules if _unit(m) is None)
    blocks: dict[str, int] = {}
    for m, _, b in modules:
        if _unit(m) is not None:
            blocks[_unit(m)] = blocks.get(_unit(m), 0) + b
    block = max(blocks.values(), default=0)
    kept = [("the root unit's weights (embeddings, final norm, head), whole all forward "
             "and backward", root)]
    ahead = [("the last block's weights, gathered ahead of its backward "
              "(backward_prefetch=BACKWARD_PRE)", block)]
    found = {M.FORWARD_END: kept, M.LOSS_BACKWARD: kept + ahead,
             M.HEAD_BACKWARD: kept + ahead, M.BACKWARD_END: kept}
    # any block's backward, the last's as the first's
    found[M.FIRST_BLOCK_BACKWARD] = found[M.LAST_BLOCK_BACKWARD] = kept + [
        ("the block's weights, gathered again for its backward", block),
        ("the block before it, gathered ahead of its backward (BACKWARD_PRE)", block)]
    return found


# Why DeepSpeed holds a module whole (`_deepspeed_replay`), as the output says it.
_WHY = {"used": "the weights of the module running now, gathered whole",
        "ahead": "weights gathered ahead of use (stage3_prefetch_bucket_size "
                 f"{PREFETCH_BUCKET_ELEMENTS:.0e} elements)".replace("e+0", "e"),
        "kept": "weights kept whole for their use again soon (stage3_max_reuse_distance "
                f"{MAX_REUSE_ELEMENTS:.0e} elements)".replace("e+0", "e")}


def deepspeed_trace(cfg: BudgetConfig, modules) -> tuple[list[str], dict[str, int]]:
    """The modules in the order DeepSpeed fetches them in one forward and backward, and
    where the backward starts, the first block's backward starts and ends, and the
    token embedding's backward is (indices into the trace)."""
    names = [m for m, _, _ in modules]
    tied_head = [m for m in names if _unit(m) is None][0] if cfg.tied_embedding else None
    forward = names + ([tied_head] if tied_head else [])
    blocks: dict[str, list[str]] = {}
    for m in names:
        if _unit(m) is not None:
            blocks.setdefault(_unit(m), []).append(m)
    backward, where = [], {}
    seen = set()
    for m in reversed(forward):
        unit = _unit(m)
        if unit is None:
            backward.append(m)
        elif unit not in seen:  # a block's backward, after its modules rerun under recompute
            seen.add(unit)
            start = len(forward) + len(backward)
            if cfg.recompute == "full":
                backward += blocks[unit]
            backward += list(reversed(blocks[unit]))
            if "block" not in where:
                where["block"] = (start, len(forward) + len(backward))
    where["backward"] = len(forward)
    where["embedding"] = len(forward) + len(backward) - 1 - backward[::-1].index(names[0])
    return forward + backward, where


def _deepspeed_replay(trace: list[str], numel: dict[str, int], size: dict[str, int],
                      recorded: bool = True, read=None):
    """DeepSpeed's parameter coordinator (partitioned_param_coordinator.py), module by
    module: fetch the module, prefetch the next modules of the trace up to the bucket
    while fewer than the live limit are whole, run it, then release it unless it is used
    again within the reuse distance, or the prefetcher passed its next use by while it
    was whole (DeepSpeed keeps those, not to lose the prefetch). Before the order is
    `recorded` (step 1) nothing is prefetched and every module is released after use.
    Returns, for each step of `read` (every step when None), the bytes whole while it
    runs and after its release, by why (`_WHY`)."""
    whole: dict[str, str] = {}       # module -> why it is whole
    passed: dict[str, int] = {}      # module -> the latest use the prefetcher passed by
    running, released = {}, {}
    read = range(len(trace)) if read is None else read
    queue = 0                        # the next step of the trace not yet looked at
    live = 0                         # elements whole now
    for step, m in enumerate(trace):
        if m not in whole:
            live += numel[m]
        whole[m] = "used"
        queue = max(queue, step + 1)
        budget, fetched = min(MAX_LIVE_ELEMENTS - live, PREFETCH_BUCKET_ELEMENTS), 0
        if not recorded:
            budget, queue = 0, len(trace)
        while queue < len(trace) and fetched < budget:
            if trace[queue] not in whole:
                whole[trace[queue]] = "ahead"
                fetched += numel[trace[queue]]
                live += numel[trace[queue]]
            else:  # whole already: the prefetcher passes this use by, so it stays whole
                passed[trace[queue]] = queue
            queue += 1
        if step in read:
            running[step] = _by_why(whole, size)
        traversed, again = 0, False
        for later in trace[step + 1:]:
            if traversed >= MAX_REUSE_ELEMENTS:
                break
            if later == m:
                again = True
                break
            traversed += numel[later]
        if again and recorded:
            whole[m] = "kept"
        elif passed.get(m, -1) > step:  # its next use was passed by: not released
            whole[m] = "ahead"
        else:
            del whole[m]
            live -= numel[m]
        if step in read:
            released[step] = _by_why(whole, size)
    return running, released


def _by_why(whole: dict[str, str], size: dict[str, int]) -> dict[str, int]:
    found = dict.fromkeys(_WHY, 0)
    for m, why in whole.items():
        found[why] += size[m]
    return found


def _deepspeed_gathered(cfg: BudgetConfig, modules,
                        first_step: bool) -> dict[str, list[tuple[str, int]]]:
    trace, where = deepspeed_trace(cfg, modules)
    numel = {m: n for m, n, _ in modules}
    size = {m: b for m, _, b in modules}
    turn, head, embedding = where["backward"] - 1, where["backward"], where["embedding"]
    first, end = where["block"]
    running, released = _deepspeed_replay(trace, numel, size, recorded=not first_step,
                                          read={turn, head, embedding, *range(first, end)})

    def terms(held: dict[str, int]) -> list[tuple[str, int]]:
        return [(_WHY[why], held[why]) for why in _WHY]

    at_turn = terms(released[turn])  # the forward done, the loss runs
    found = {M.FORWARD_END: at_turn, M.LOSS_BACKWARD: at_turn,
             M.HEAD_BACKWARD: terms(running[head]),
             M.BACKWARD_END: terms(running[embedding])}
    # the most held in any block's backward (its modules rerun first under
    # checkpointing), the last's as the first's
    found[M.FIRST_BLOCK_BACKWARD] = found[M.LAST_BLOCK_BACKWARD] = terms(
        max((running[k] for k in range(first, end)), key=lambda h: sum(h.values())))
    return found


def clear_caches() -> None:
    """Forget every shape's gathered weights (a benchmark's uncached run starts here)."""
    _gathered.cache_clear()


def weights_gathered(cfg: BudgetConfig,
                     first_step: bool = False) -> dict[str, list[tuple[str, int]]]:
    """Moment -> the (what, bytes) of whole weights one device holds beyond its shard
    under ZeRO 3 over several devices, as `cfg.zero_engine` gathers them (see the
    module's doc); empty otherwise. Nothing is gathered at the optimizer step. In
    `first_step` DeepSpeed is still recording the order of the modules: it gathers
    only the module running (FSDP reads its order from the same step's forward)."""
    if not gathers_weights(cfg):
        return {}
    return _gathered(cfg.one_shape(), first_step)


@functools.lru_cache(maxsize=256)
def _gathered(shape: BudgetConfig, first_step: bool) -> dict[str, list[tuple[str, int]]]:
    modules = weight_modules(shape)
    if shape.zero_engine == "fsdp":
        return _fsdp_gathered(shape, modules)
    return _deepspeed_gathered(shape, modules, first_step)
