"""The MPI job: several processes, each the whole model, gradients summed.

Launch with `mpiexec -n 2 python -m engine.train --data-parallel ...`.

Every process (rank) holds the whole model and takes rows
[rank * B/n, (rank + 1) * B/n) of each micro-batch of B sequences
(`shard_rows`). Its loss is scaled by 1/n (on top of the 1/K of gradient
accumulation), so the SUM of the ranks' gradients is the gradient of the
mean loss over the global batch: one all-reduce with op SUM, no division
afterwards. All ranks then hold the same gradient, clip it the same way and
take the same AdamW step, so their weights stay identical without ever being
sent.

Overlap: the backward reports each block's gradient range as soon as it is
final (last block first). `GradientAllReduce.start` hands that bucket to a
non-blocking `Iallreduce` right away, so the network (here shared memory)
works while the backward computes the blocks below. `wait()` before the
optimizer step is the only synchronisation. (With several thread replicas per
process, parallel.py sums the replicas' gradients first, and the MPI buckets
start once all are summed: no overlap with MPI then.)

Accumulation: with K micro-batches per step, only the last backward starts
all-reduces; the first K-1 add into the local gradient buffer. Reducing
after every micro-batch would send K times the bytes for the same sum.

A job either starts together or not at all: every check before step 1 runs
on every rank, and a failure on any one stops them all (`agree`); a failure
after step 1 aborts the whole job (`abort_job_on_failure`), since the others
would wait for it in the next all-reduce forever.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time

import numpy as np

from .config import Diverged, ParallelUnavailable, TrainError

INSTALL_HINT = ("pip install -e '.[mpi]'   (installs mpi4py and MPICH; with conda: "
                "conda install -c conda-forge mpi4py mpich)")


class MPIUnavailable(RuntimeError):
    """mpi4py is missing: says how to install it."""


def import_mpi():
    """The mpi4py MPI module, or MPIUnavailable with the install command."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise MPIUnavailable(
            f"--data-parallel needs mpi4py, which is not installed ({exc}). Install it with "
            f"{INSTALL_HINT}, then launch: mpiexec -n 2 python -m engine.train "
            f"--data-parallel ...") from None
    return MPI


class GradientAllReduce:
    """Sums gradient buckets (ranges of a flat buffer) over all ranks, in place."""

    def __init__(self, comm, flat_grads: np.ndarray):
        self.MPI = import_mpi()
        self.comm = comm
        self.flat = flat_grads
        self.requests = []
        self.buckets: list[tuple[int, int]] = []

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    def start(self, start: int, stop: int) -> None:
        """Begin summing flat[start:stop] across ranks; returns at once."""
        bucket = self.flat[start:stop]
        self.requests.append(self.comm.Iallreduce(self.MPI.IN_PLACE, bucket, op=self.MPI.SUM))
        self.buckets.append((start, stop))
        # MPICH advances non-blocking collectives inside MPI calls: poke it.
        self.MPI.Request.Testall(self.requests)

    def wait(self) -> None:
        """Block until every started bucket is summed."""
        if self.requests:
            self.MPI.Request.Waitall(self.requests)
        self.requests.clear()
        self.buckets.clear()

    def mean(self, value: float) -> float:
        """Average of a Python float over the ranks (losses for the log)."""
        return self.comm.allreduce(float(value), op=self.MPI.SUM) / self.size


def world():
    """(comm, rank, size) of MPI.COMM_WORLD."""
    MPI = import_mpi()
    comm = MPI.COMM_WORLD
    return comm, comm.Get_rank(), comm.Get_size()


def launch_rank() -> int:
    """This process's rank as the MPI launcher set it in the environment (0 when
    not launched by mpiexec), known before MPI starts: the command line prints
    an error every process hit alike only on rank 0."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def shard_rows(batch_size: int, rank: int, size: int) -> slice:
    """The rows of a micro-batch this rank processes."""
    if batch_size % size:
        raise ValueError(f"--data-parallel: the micro-batch of {batch_size} sequences does not "
                         f"split over {size} processes; use a batch size divisible by {size}")
    per = batch_size // size
    return slice(rank * per, (rank + 1) * per)


def join(data_parallel: bool):
    """(comm, rank, world size) of this process: MPI's under --data-parallel (comm
    None when the job has one process), else (None, 0, 1)."""
    if not data_parallel:
        return None, 0, 1
    try:
        comm, rank, size = world()
    except MPIUnavailable as exc:
        raise ParallelUnavailable(str(exc)) from None
    return (comm if size > 1 else None), rank, size


def agree(comm, prepare):
    """prepare() on every process; if it raised a TrainError on any, raise one on all
    (the lowest failing rank's), so that no process starts step 1 alone and waits
    forever for the others. Without MPI (comm None): just prepare()."""
    if comm is None:
        return prepare()
    failure = None
    try:
        result = prepare()
    except TrainError as exc:
        failure = exc
    reports = comm.allgather(None if failure is None else
                             (type(failure).__name__, failure.exit_code, str(failure)))
    failed = [(r, report) for r, report in enumerate(reports) if report is not None]
    if not failed:
        return result
    r, (_, code, message) = failed[0]
    error = failure if r == comm.Get_rank() else TrainError(f"process {r}: {message}")
    error.exit_code = code
    error.on_every_rank = True          # the command line prints it once, on rank 0
    raise error


@contextlib.contextmanager
def abort_job_on_failure(comm, rank, world_size):
    """Under MPI with several processes: an exception on this one (other than a
    divergence, which every process sees at the same step) prints the error and
    aborts the whole job with a non-zero exit, instead of leaving the others
    blocked in the next all-reduce."""
    try:
        yield
    except BaseException as exc:
        if comm is None or getattr(exc, "on_every_rank", False) or isinstance(exc, Diverged):
            raise
        code = getattr(exc, "exit_code", 130 if isinstance(exc, KeyboardInterrupt) else 1)
        print(f"error on process {rank} of {world_size}: {type(exc).__name__}: {exc}; "
              f"aborting all {world_size} processes", file=sys.stderr, flush=True)
        # The launcher forwards each process's output through a pipe, and Abort
        # kills every process at once: on a loaded machine the message was once
        # lost before it was forwarded (the job ended with an empty stderr).
        time.sleep(0.5)
        comm.Abort(code)
        raise
