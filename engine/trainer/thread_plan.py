"""How a process spends its cores: model replicas, or one model with threaded kernels.

`choose_plan(threads, batch_size, block_size, block_weights=...)` is a pure
function: it reads no machine and sets nothing (`plan_threads` below sets
numba's and BLAS's pools from its answer). The rule, in order:

1. Replicas: R is the largest divisor of the batch, at most the thread count,
   whose replicas each hold at least MIN_REPLICA_TOKENS tokens (rows x T) when
   R > 2, and, when R > CROWD, each do at least MIN_CROWD_FLOPS of matrix
   products a step (6 x the blocks' matrix weights x its tokens).
2. Replicas run (R replicas x 1 kernel thread, B/R rows each) when they keep
   enough of the cores busy: R >= KERNEL_THREAD_WORTH x threads. Otherwise one
   model runs with all the threads in its kernels (1 x threads, B rows).

Why each constant has its value, with the measurements it rests on (two
16-core x86 machines, `python -m engine.bench` beside PyTorch eager in the same
run), is in lab/THREADS.md#what-it-rests-on; in one line each:

* CROWD, MIN_CROWD_FLOPS: beyond eight replicas only large ones pay for their
  memory traffic and gradient sum; 6 GFLOP lies between a size that lost and
  one that won.
* MIN_REPLICA_TOKENS: replicas of one short sequence each have products too
  small to run fast.
* KERNEL_THREAD_WORTH: a kernel thread at 16 threads did about 0.57 of a
  replica's work.

On two cores the rule chooses what the trainer always ran there: two
replicas for an even batch, else one model with both threads.
"""
from __future__ import annotations

from dataclasses import dataclass

CROWD = 8
MIN_CROWD_FLOPS = 6e9
MIN_REPLICA_TOKENS = 256
KERNEL_THREAD_WORTH = 0.57
MODES = ("replicas", "kernels")


@dataclass(frozen=True)
class ThreadPlan:
    """How one process's threads are spent, and why."""
    mode: str                 # "replicas" or "kernels"
    replicas: int             # model copies, each on its own thread
    kernel_threads: int       # threads inside each model's kernels
    rows: int                 # sequences of the micro-batch per replica
    reason: str               # one sentence: why this plan

    def describe(self) -> str:
        """One line for a person: the plan, then why."""
        return f"thread plan: {self.summary()} ({self.reason})"

    def summary(self) -> str:
        if self.mode == "replicas" and self.replicas > 1:
            return f"{self.replicas} replicas x 1 thread, {_rows(self.rows)} each"
        return f"1 model x {self.kernel_threads}-thread kernels, {_rows(self.rows)}"


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def block_matmul_weights(n_layer: int, n_embd: int) -> int:
    """Weights in the blocks' matrix products (qkv, proj, fc, fc-proj): 12 L C^2.
    A replica's matrix products cost 6 x this many FLOPs per token a step."""
    return 12 * n_layer * n_embd * n_embd


def _replicas_for(threads: int, batch_size: int, block_size: int,
                  weights: int | None, limits: bool = True) -> int:
    """The largest divisor of the batch, at most `threads`, whose replicas meet the
    rule's limits (module docstring); without limits, the largest divisor."""
    for r in range(min(threads, batch_size), 0, -1):
        if batch_size % r:
            continue
        tokens = batch_size // r * block_size
        if limits and r > 2 and tokens < MIN_REPLICA_TOKENS:
            continue
        if limits and r > CROWD and (weights is None
                                     or 6 * weights * tokens < MIN_CROWD_FLOPS):
            continue
        return r
    return 1


def choose_plan(threads: int, batch_size: int, block_size: int, mode: str | None = None,
                concurrent: bool = True, block_weights: int | None = None) -> ThreadPlan:
    """The plan for `threads` threads and a micro-batch of batch_size x block_size
    tokens of a model whose blocks hold `block_weights` matrix weights
    (`block_matmul_weights(L, C)`; None: unknown, so never more than CROWD replicas). The
    rule: see the module docstring. `mode` forces one: "replicas" runs
    as many replicas as divide the batch (at most one per thread, no other limit),
    "kernels" one model. Without concurrent kernels (numba's workqueue layer),
    replicas cannot run and the plan is one model."""
    for name, value in (("threads", threads), ("batch_size", batch_size),
                        ("block_size", block_size)):
        if int(value) < 1:
            raise ValueError(f"choose_plan: {name} must be at least 1, got {value}")
    if mode is not None and mode not in MODES:
        raise ValueError(f"choose_plan: mode must be one of {MODES} or None, got {mode!r}")

    def kernels(reason):
        return ThreadPlan("kernels", 1, threads, batch_size, reason)

    def replicas(r, reason):
        if r == 1:       # one replica is one model: its kernels take every thread
            return ThreadPlan("replicas", 1, threads, batch_size, reason)
        return ThreadPlan("replicas", r, 1, batch_size // r, reason)

    if not concurrent:
        return kernels("numba's threading layer cannot run replicas side by side")
    if mode == "kernels":
        return kernels("--thread-mode kernels")
    if mode == "replicas":
        r = _replicas_for(threads, batch_size, block_size, block_weights, limits=False)
        return replicas(r, "--thread-mode replicas: the largest divisor of the batch "
                           f"at most {threads}")
    if threads == 1:
        return kernels("one thread")
    r = _replicas_for(threads, batch_size, block_size, block_weights)
    if r > 1 and r >= KERNEL_THREAD_WORTH * threads:
        return replicas(r, f"{r} of {threads} threads busy as replicas, each meeting the "
                           "others once per step")
    return kernels(f"replicas would keep {r} of {threads} threads busy (a divisor of batch "
                   f"{batch_size}; {MIN_REPLICA_TOKENS}+ tokens each beyond two, "
                   f"{MIN_CROWD_FLOPS / 1e9:g}+ GFLOP each beyond {CROWD}), under "
                   f"{KERNEL_THREAD_WORTH} x {threads}: threaded kernels use every core")


def plan_threads(n_threads: int, batch_size: int, block_size: int,
                 mode: str | None = None, block_weights: int | None = None
                 ) -> tuple[str, int, dict]:
    """Choose how a process spends its n threads (choose_plan: the rule,
    or `mode` when given) and set the pools accordingly: replicas each on one numba
    thread and one BLAS thread, while what runs between them (the gradient norm,
    AdamW) uses all n numba threads; one model (or a single replica) gets every
    thread in numba and BLAS. Returns (the mode used, replicas, what set_threads
    returned, with the ThreadPlan under "plan")."""
    from .kernels.threads import concurrent_kernels_ok, set_threads
    plan = choose_plan(n_threads, batch_size, block_size, mode,
                       concurrent=concurrent_kernels_ok(), block_weights=block_weights)
    info = set_threads(n_threads, blas=1 if plan.replicas > 1 else None)
    info["plan"] = plan
    return plan.mode, plan.replicas, info
