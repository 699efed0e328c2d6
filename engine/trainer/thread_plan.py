"""How a process spends its cores: model replicas, or one model with threaded kernels.

`choose_plan(threads, batch_size, block_size)` is a pure function: it reads no
machine and sets nothing (kernels/threads.py sets the pools from its answer).
The rule, in order:

1. Replicas, at most MAX_REPLICAS of them: R is the largest divisor of the
   batch that is at most min(threads, MAX_REPLICAS), and, when R > 2, whose
   replicas each hold at least MIN_REPLICA_TOKENS tokens (rows x T).
2. Replicas run (R replicas x 1 kernel thread, B/R rows each) when they keep
   enough of the cores busy: R >= KERNEL_THREAD_WORTH x threads. Otherwise one
   model runs with all the threads in its kernels (1 x threads, B rows).

What the constants rest on (tiny GPT T=128 L=4 H=4 C=128, a 16-core x86 with
OpenBLAS, one run each against PyTorch eager; THREADS.md has the table):

* 2, 4 and 8 replicas x 1 thread at batch 64 ran 1.27x, 1.13x and 1.23x
  PyTorch; 8 replicas on 8 cores was the fastest plan up to 8 cores.
* 16 replicas at batch 64 were slower (122.8 ms/step) than 8 replicas on 8
  cores (102.0): the gradient sum and the memory traffic grow with the replica
  count. Hence MAX_REPLICAS = 8.
* 16 replicas of one 128-token sequence each (batch 16) ran 0.34x PyTorch:
  each replica's matrix products are too small. Hence MIN_REPLICA_TOKENS =
  256 (two such sequences) once there are more than two replicas; with two,
  the sum is a single addition and replicas stay the better plan.
* One model with 16-thread kernels at batch 64 took 89.2 ms/step, the work of
  16 x 102.0 / 89.2 / 8 ~ 0.57 of a replica per thread (8 replicas did it in
  102.0 ms). Hence KERNEL_THREAD_WORTH = 0.57: 8 replicas on 16 cores lose to
  16 kernel threads, 8 replicas on 8 cores win.

On two cores the rule chooses what the trainer always ran there: two
replicas for an even batch, else one model with both threads.
"""
from __future__ import annotations

from dataclasses import dataclass

MAX_REPLICAS = 8
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


def _replicas_for(threads: int, batch_size: int, block_size: int, cap: int,
                  min_tokens: int) -> int:
    """The largest divisor of the batch at most min(threads, cap) whose replicas, when
    there are more than two, each hold at least min_tokens tokens."""
    for r in range(min(threads, cap, batch_size), 0, -1):
        if batch_size % r == 0 and (r <= 2 or batch_size // r * block_size >= min_tokens):
            return r
    return 1


def choose_plan(threads: int, batch_size: int, block_size: int, mode: str | None = None,
                concurrent: bool = True) -> ThreadPlan:
    """The plan for `threads` threads and a micro-batch of batch_size x block_size
    tokens (the rule: see the module docstring). `mode` forces one: "replicas" runs
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
        r = _replicas_for(threads, batch_size, block_size, threads, 0)
        return replicas(r, "--thread-mode replicas: the largest divisor of the batch "
                           f"at most {threads}")
    if threads == 1:
        return kernels("one thread")
    r = _replicas_for(threads, batch_size, block_size, MAX_REPLICAS, MIN_REPLICA_TOKENS)
    if r > 1 and r >= KERNEL_THREAD_WORTH * threads:
        return replicas(r, f"{r} of {threads} threads busy as replicas, each meeting the "
                           "others once per step")
    return kernels(f"replicas would keep {r} of {threads} threads busy (a divisor of batch "
                   f"{batch_size}, at most {MAX_REPLICAS}, {MIN_REPLICA_TOKENS}+ tokens each "
                   f"beyond two), under {KERNEL_THREAD_WORTH} x {threads}: threaded kernels "
                   "use every core")
