"""Data parallelism inside one process: model replicas on threads.

`ThreadReplicas` runs single-threaded model replicas, one per thread, when
thread_plan.py's rule picks them (see its docstring for why, and
lab/THREADS.md), each on its slice of the micro-batch, and sums their
gradients. The same arithmetic across processes is the MPI job (mpi_job.py).
"""
from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from ..gpt_config import param_shapes
from .kernels.threads import concurrent_kernels_ok, one_numba_thread
from .model import FlatBuffer, FusedGPT, gradient_buckets

MIN_PIECE = 1 << 14      # elements: below this a piece costs more in locking than it saves


def sum_pieces(buckets: list[tuple[int, int]], n_replicas: int,
               min_piece: int | None = None) -> list[list[tuple[int, int]]]:
    """Each bucket cut into at most n_replicas contiguous pieces of at least min_piece
    elements (a smaller bucket stays whole), so that idle replicas sum one bucket
    together: the thread that sums a piece reads n_replicas x size / pieces elements,
    about one bucket's worth whatever the replica count, where one thread summing
    the whole bucket reads n_replicas times it. Every element is still added in
    replica order, so the bits do not depend on the cut."""
    min_piece = MIN_PIECE if min_piece is None else min_piece
    cut = []
    for start, stop in buckets:
        k = max(1, min(n_replicas, (stop - start) // min_piece))
        edges = [start + (stop - start) * i // k for i in range(k + 1)]
        cut.append(list(zip(edges[:-1], edges[1:])))
    return cut


class ThreadReplicas:
    """Data parallelism inside one process: n replicas of the model, one per thread.

    Replica r takes rows [r * B/n, (r + 1) * B/n) of every micro-batch and runs
    its whole forward and backward on one thread, single-threaded kernels and
    single-threaded BLAS, reading the one shared parameter buffer and adding
    into its own gradient buffer. In the last micro-batch, a replica whose
    backward is over sums the replicas' gradients into `grads` (`_BucketSum`),
    bucket by bucket as soon as every replica has finished one, always in
    replica order, so the bits do not depend on which replica ran ahead.

    Why not one model with multi-threaded kernels? Each kernel then ends at a
    barrier where every thread waits for the slowest; a step has about a
    hundred of them, and two thread pools (numba's and BLAS's) take turns on
    the same cores. On an idle machine that costs little; on a shared one a
    barrier waits for a descheduled thread every time. Replicas meet once
    per step: on a busy machine they ran several times faster
    (kernels/cpu/README.md#replicas-not-threaded-kernels).

    Invariant: `_replicas_zero` is true only while every replica's gradient
    buffer holds zeros. zero_grad makes it so, and so does a last
    micro-batch, whose sum clears each replica as it takes it (_sum_bucket);
    zero_grad then has nothing to write. (With one replica its buffer is
    `grads` itself.)

    Building the replicas starts nothing; on a cold numba cache the caller
    starts compile_ahead's helper (`compile_ahead.start_if_cold(replicas)`).
    """

    def __init__(self, cfg, batch_size: int, n_replicas: int, **gpt_kwargs):
        if n_replicas < 1 or batch_size % n_replicas:
            raise ValueError(f"ThreadReplicas: batch_size {batch_size} does not split into "
                             f"{n_replicas} replicas; use a divisor of the batch size")
        if n_replicas > 1 and not concurrent_kernels_ok():
            raise RuntimeError("ThreadReplicas: numba's threading layer "
                               f"{numba_layer()!r} cannot run kernels from several threads at "
                               "once; install OpenMP (libgomp) or TBB for numba, or use one "
                               "replica (--thread-mode kernels)")
        self.cfg, self.B, self.n = cfg, batch_size, n_replicas
        per = batch_size // n_replicas
        first = FusedGPT(cfg, per, **gpt_kwargs)
        extra = {k: v for k, v in gpt_kwargs.items() if k in ("dtype", "checkpointing",
                                                               "seq_len", "attention")}
        self.replicas = [first] + [FusedGPT(cfg, per, shared_params=first.params, **extra)
                                   for _ in range(n_replicas - 1)]
        self.params, self.dtype = first.params, first.dtype
        self.grads = first.grads if n_replicas == 1 else FlatBuffer(param_shapes(cfg),
                                                                    first.dtype)
        self.rows = [slice(r * per, (r + 1) * per) for r in range(n_replicas)]
        self.buckets = gradient_buckets(self.grads, cfg.n_layer)
        self.pieces = sum_pieces(self.buckets, n_replicas)
        self._pool = None
        self._replicas_zero = False            # the class's invariant: see its docstring

    def _workers(self):
        """The n - 1 helper threads (started on first use, again after close())."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.n - 1, initializer=_one_thread_per_replica,
                                            thread_name_prefix="gpt-replica")
        return self._pool

    def zero_grad(self) -> None:
        """Every replica's gradient to zero, unless they are zero already (a last
        micro-batch's sum leaves them zero: see _sum_bucket)."""
        if not self._replicas_zero:
            for m in self.replicas:
                m.zero_grad()
            self._replicas_zero = True

    def _each(self, fn):
        """fn(replica index) on every replica, replica 0 on the calling thread."""
        futures = [self._workers().submit(fn, r) for r in range(1, self.n)]
        with one_numba_thread():               # replica 0 runs here, on the calling thread
            first = fn(0)
        return [first] + [f.result() for f in futures]

    def forward_backward(self, ids, targets, *, loss_scale: float = 1.0, last: bool = True,
                         grad_ready=None):
        """Forward and backward of one micro-batch over all replicas; returns
        (loss, forward s, backward s) with the timings of replica 0's thread. When
        `last`, the replicas' gradients are summed into self.grads, bucket by
        bucket while the backward runs (_BucketSum); then grad_ready, if given,
        is called once per bucket: the MPI all-reduce starts from here."""
        scale = loss_scale / self.n
        self._replicas_zero = False            # (also when a replica raises)
        if self.n == 1:             # one model: its kernels use the caller's threads
            return self.replicas[0].forward_backward(ids, targets, loss_scale=scale,
                                                     grad_ready=grad_ready)
        summing = _BucketSum(self) if last else None

        def one(r):
            model, rows = self.replicas[r], self.rows[r]
            if summing is None:
                return model.forward_backward(ids[rows], targets[rows], loss_scale=scale)
            with summing.failing():
                result = model.forward_backward(ids[rows], targets[rows], loss_scale=scale,
                                                grad_ready=summing.grad_ready(r))
                summing.help()
            return result

        results = self._each(one)
        self._replicas_zero = last             # the sum cleared each replica it summed
        if last and grad_ready is not None:
            for start, stop in self.buckets:
                grad_ready(start, stop)
        loss = sum(r[0] for r in results) / self.n
        return loss, results[0][1], results[0][2]

    def _sum_bucket(self, start: int, stop: int) -> None:
        """grads[start:stop] = replica 0's + replica 1's + ..., always in that order,
        so the bits do not depend on which thread sums. Each replica's range is
        then set to zero, while its lines are still in the caches: the next
        step's zero_grad has nothing left to do, and the clearing overlaps the
        slower replica's backward (kernels/cpu/README.md#replicas-not-threaded-kernels)."""
        total = self.grads.flat[start:stop]
        np.copyto(total, self.replicas[0].grads.flat[start:stop])
        for m in self.replicas[1:]:
            total += m.grads.flat[start:stop]
        for m in self.replicas:
            m.grads.flat[start:stop] = 0

    def loss(self, ids, targets) -> float:
        if self.n == 1:
            return self.replicas[0].loss(ids, targets)
        losses = self._each(lambda r: self.replicas[r].loss(ids[self.rows[r]],
                                                            targets[self.rows[r]]))
        return float(np.mean(losses))

    def named_params(self):
        return self.replicas[0].named_params()

    def num_params(self) -> int:
        return self.params.flat.size

    def close(self) -> None:
        """Stop the helper threads (they restart if the replicas are used again)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


class _BucketSum:
    """The last micro-batch's sum of the replicas' gradients, bucket by bucket, by
    whichever replicas are idle.

    Each replica's backward reports a bucket (a flat range: the final LayerNorm,
    blocks L-1 ... 0, the embeddings) as soon as it is final. Once every replica
    has reported it, the bucket's pieces (sum_pieces: up to one per replica) are
    summed into `grads`, each in replica order, by the replicas whose backward
    is over, which claim them one by one. So the sum overlaps the slower
    replica's backward, and what is left when it ends is its last bucket (the
    embeddings), summed by all the replicas together, each reading about one
    bucket's worth."""

    def __init__(self, owner: "ThreadReplicas"):
        self.owner = owner
        self.index = {span: i for i, span in enumerate(owner.buckets)}
        self.reported = [0] * len(owner.buckets)   # replicas whose bucket i is final
        self.claimed = 0                      # buckets whose pieces are all handed out
        self.piece = 0                        # pieces of bucket `claimed` handed out
        self.failed = False
        self.cond = threading.Condition()

    def grad_ready(self, r: int):
        """FusedGPT.backward's `grad_ready` for replica r."""
        def report(start, stop):
            with self.cond:
                i = self.index[(start, stop)]
                self.reported[i] += 1
                if self.reported[i] == self.owner.n:
                    self.cond.notify_all()
        return report

    def _next_piece(self):
        """The next piece to sum, or None when every piece is claimed; waits while
        the next bucket is not final on every replica. Called holding cond."""
        pieces = self.owner.pieces
        while not self.failed and self.claimed < len(pieces):
            if self.reported[self.claimed] == self.owner.n:
                span = pieces[self.claimed][self.piece]
                self.piece += 1
                if self.piece == len(pieces[self.claimed]):
                    self.claimed, self.piece = self.claimed + 1, 0
                return span
            self.cond.wait()
        return None

    def help(self) -> None:
        """Called by each replica once its own backward is over: sum pieces until
        none is left."""
        while True:
            with self.cond:
                span = self._next_piece()
            if span is None:
                return
            self.owner._sum_bucket(*span)

    @contextlib.contextmanager
    def failing(self):
        """A replica that raises wakes the others (no one waits forever)."""
        try:
            yield
        except BaseException:
            with self.cond:
                self.failed = True
                self.cond.notify_all()
            raise


def numba_layer() -> str:
    return numba.config.THREADING_LAYER


def _one_thread_per_replica():
    numba.set_num_threads(1)
