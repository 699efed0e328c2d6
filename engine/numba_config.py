"""How numba is set up for both kernel folders (engine/kernels/ of the tape and
engine/trainer/kernels/ of the fused trainer), in one place, set once on import.

* `kernel` compiles a serial function, `parallel_kernel` one whose `prange`
  loops run on all cores, or serially when the caller has one numba thread
  (`ParallelKernel`: two builds, each compiled on first use). Both cache the
  machine code on disk (`cache=True`), so only the first run on a machine
  pays the compile.
* Nothing is declared with a fixed signature: numba compiles one version per
  dtype on first call, so the same source runs in float32 (training) and in
  float64 (the gradient checks).
* No fast-math in the trainer's kernels: every flag of it lets LLVM change
  the rounding (reorder a sum, fuse a multiply-add, use a reciprocal) where
  it sees fit, and it did not decide alike for a fresh compile and for the
  machine code loaded back from the on-disk cache. With the flags, a first
  run and a later run on the same machine gave different bits
  (tests/trainer/test_reproducible_bits.py), so a run stopped and resumed
  did not continue bit for bit. The price was the row sums that no
  longer vectorised (LayerNorm about 2x slower alone, softmax's exp loop
  scalar); engine/trainer/kernels/cpu/lanes.py wins it back with the
  reordering written into the program (sixteen partial sums in one LLVM
  vector, combined in a fixed order), which every compile honours alike.
  (Without fast-math's "no NaN, no Inf" assumptions a NaN in the loss
  survives to be reported, as before.)
* Vectors: numba's loops may use 512-bit registers where the CPU has them
  (`_full_width_vectors`).
* Stale caches: numba checks a cached kernel against its own file only, so
  `drop_stale_caches` deletes the engine's cached machine code whenever any
  engine source changed (a hash kept beside the caches).
* Idle threads sleep instead of spinning (`_quiet_idle_threads`) unless the
  user chose: the one place the project sets OMP_WAIT_POLICY; the tests, the
  lessons and the trainer's processes get it by importing the engine.
* Threads: the `omp` threading layer starts a parallel loop in about 2 us
  against about 70 us for numba's own `workqueue`; with dozens of parallel
  loops per training step that difference is visible, so we ask for it when
  it is installed and fall back silently when it is not.
"""
from __future__ import annotations

import functools
import os
import types


# The variables this module set because the user had not (name -> value).
_SET_HERE: dict[str, str] = {}


def _set_default(name: str, value: str) -> None:
    if name not in os.environ:
        os.environ[name] = _SET_HERE[name] = value


def users_environment() -> dict[str, str]:
    """The environment as the user gave it: os.environ without the variables
    this module set for the engine's own threads and vectors. For a child process
    that should run another library (PyTorch, in the benchmark) under that
    library's own defaults, not under ours."""
    return {k: v for k, v in os.environ.items() if _SET_HERE.get(k) != v}


def _quiet_idle_threads() -> None:
    """Make idle worker threads sleep instead of spinning (unless the user chose).

    A step alternates two thread pools: numba's OpenMP threads and OpenBLAS's.
    By default an idle OpenMP thread spins for a while before it sleeps, and
    an idle OpenBLAS thread spins for about 2**28 cycles (a tenth of a second).
    Spinning threads of one pool then steal the cores the other pool is
    computing on, and every barrier waits for a descheduled thread: on two
    busy cores steps took ten times as long. Both
    libraries read these variables once, when they load, which is why this
    runs before numba starts its threads and before SciPy loads its BLAS."""
    _set_default("OMP_WAIT_POLICY", "PASSIVE")
    _set_default("OPENBLAS_THREAD_TIMEOUT", "4")   # 2**4 cycles, then sleep


def target_cpu_features() -> str:
    """The CPU features numba compiles for, by numba's own rule: NUMBA_CPU_FEATURES
    when set, else the host CPU's (comma-separated, "+avx2,-avx512f,...")."""
    features = os.environ.get("NUMBA_CPU_FEATURES")
    if features:
        return features
    import llvmlite.binding as llvm
    return llvm.get_host_cpu_features().flatten()


# LLVM's names of the x86 CPUs whose cores have AVX-512 (NUMBA_CPU_NAME may name one)
_AVX512_CPUS = ("skylake-avx512", "cascadelake", "cooperlake", "cannonlake", "icelake-client",
                "icelake-server", "tigerlake", "rocketlake", "sapphirerapids", "emeraldrapids",
                "graniterapids", "graniterapids-d", "znver4", "znver5", "x86-64-v4", "knl",
                "knm")


def target_has_avx512() -> bool:
    """Whether the CPU numba compiles for has AVX-512. With NUMBA_CPU_NAME naming
    a CPU (CI's run as an AVX2 CPU names haswell on an AVX-512 machine) and no
    NUMBA_CPU_FEATURES, numba compiles for that CPU's own features, which
    llvmlite cannot list: a table of names answers. Else target_cpu_features()."""
    name = os.environ.get("NUMBA_CPU_NAME", "host")
    if name != "host" and not os.environ.get("NUMBA_CPU_FEATURES"):
        return name in _AVX512_CPUS
    return "+avx512f" in target_cpu_features().split(",")


def _full_width_vectors() -> None:
    """Let LLVM use the CPU's full vector width (512 bits with AVX-512).

    LLVM's tuning for Intel's AVX-512 server CPUs prefers 256-bit vectors
    (older ones lowered their clock for 512-bit code), so numba's loops used
    half the registers' width; the full width makes the GELU kernels about 1.3x
    faster (trainer/kernels/cpu/README.md#full-width-vectors). Same bits either
    way: without fast-math the vector width changes how many elements a loop
    does at once, never the order of any sum (the lanes of
    trainer/kernels/cpu/lanes.py are fixed in the IR). Skipped when
    the user chose a CPU (NUMBA_CPU_NAME) or its features (NUMBA_CPU_FEATURES),
    as CI's run on the AVX2 code paths does, and on CPUs without AVX-512."""
    if os.environ.get("NUMBA_CPU_NAME") or os.environ.get("NUMBA_CPU_FEATURES"):
        return
    import numba.core.config
    if target_has_avx512():
        _set_default("NUMBA_CPU_FEATURES", target_cpu_features() + ",-prefer-256-bit")
        numba.core.config.reload_config()     # numba read its settings when engine imported it


def drop_stale_caches(root) -> None:
    """Delete numba's cached machine code under engine/ when any engine source changed.

    numba keys a cached kernel by its own file: when a function it calls or
    inlines changes in another file (a lane reduction in cpu/lanes.py, the tile
    product of cpu/register_tiles.py), the old machine code is loaded again, old
    helper and all, and a helper whose arguments changed would be called
    wrongly. So a hash of every engine source is kept beside the caches, and
    when it differs (a `git pull`, an edited kernel) the engine's cache files
    (*.nbi, *.nbc in engine/**/__pycache__) are deleted before any is loaded:
    the next first step compiles again. Nothing else is touched (run on
    engine/ at import, unless NUMBA_CACHE_DIR is set: numba caches there)."""
    import hashlib
    digest = hashlib.sha256()
    for source in sorted(root.rglob("*.py")):
        digest.update(str(source.relative_to(root)).encode() + b"\0" + source.read_bytes())
    stamp = root / "__pycache__" / "kernel_sources.sha256"
    try:
        if stamp.read_text() == digest.hexdigest():
            return
    except OSError:
        pass
    for pattern in ("*.nbi", "*.nbc"):
        for cached in root.rglob(f"__pycache__/{pattern}"):
            try:
                cached.unlink()
            except OSError:            # another process got there first, or read-only
                pass
    try:
        stamp.parent.mkdir(exist_ok=True)
        stamp.write_text(digest.hexdigest())
    except OSError:                    # a read-only install: numba caches elsewhere
        pass


_quiet_idle_threads()
try:
    import numba  # noqa: E402  (after the thread settings: numba loads SciPy's BLAS)
except ImportError as exc:
    from ._versions import numba_import_error
    raise numba_import_error(exc) from exc
_full_width_vectors()
if not os.environ.get("NUMBA_CACHE_DIR"):
    import pathlib
    drop_stale_caches(pathlib.Path(__file__).resolve().parent)

FASTMATH = False
# The tape's kernels (engine/kernels/fast.py) reorder sums and fuse multiply-adds
# only: -inf starts their row maxima, and their results are compared digit for
# digit with the numpy reference in the lessons.
TAPE_FASTMATH = {"reassoc", "contract"}


def _prefer_omp_threads() -> str:
    """Pick the `omp` threading layer unless the user chose one already."""
    if os.environ.get("NUMBA_THREADING_LAYER") or numba.config.THREADING_LAYER != "default":
        return numba.config.THREADING_LAYER
    try:
        from numba.np.ufunc import omppool  # noqa: F401  (present when numba has OpenMP)
    except ImportError:
        return numba.config.THREADING_LAYER
    numba.config.THREADING_LAYER = "omp"
    return "omp"


THREADING_LAYER = _prefer_omp_threads()

# error_model="numpy": x / 0 gives inf (as in numpy) instead of raising, which
# takes a branch out of every division and lets those loops vectorise.
# nogil: kernels release Python's lock, so several threads can run them at once.
_OPTIONS = dict(cache=True, fastmath=FASTMATH, error_model="numpy", nogil=True)
kernel = functools.partial(numba.njit, **_OPTIONS)
# A small helper called once per row (a row's sum, its softmax): numba compiles
# every function on its own and calls it as a function, which costs tens of ns a
# call (arguments packed, each array view's reference count touched twice, the
# status checked), as much as the helper's own work on a 128-wide row. Inlined
# into its caller, in numba's IR before LLVM sees it, the call disappears and the
# helper's loops are optimised together with the caller's.
row_kernel = functools.partial(numba.njit, inline="always", **_OPTIONS)
prange = numba.prange


class ParallelKernel:
    """A `prange` kernel in two builds, each compiled on first use: parallel
    (numba's threads), and serial for callers that run on one thread.

    The trainer's default runs one single-threaded model replica per core, so
    every one of its kernel calls sees one numba thread; there the parallel
    build would only pay its set-up, and compiling it (the parfor passes, the
    gufunc around each loop) costs several times what the serial build does.
    Both builds run the same arithmetic in the same order (reductions go
    through fixed chunks, never through prange's own), so they give the same
    bits. The serial build is compiled from a copy of the function under
    another name: numba's on-disk cache files are named by the function and
    do not tell a parallel build from a serial one."""

    def __init__(self, fn):
        twin = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_serial",
                                  fn.__defaults__, fn.__closure__)
        twin.__qualname__ = fn.__qualname__ + "_serial"
        twin.__module__ = fn.__module__
        self.parallel = numba.njit(parallel=True, **_OPTIONS)(fn)
        self.serial = numba.njit(**_OPTIONS)(twin)
        functools.update_wrapper(self, fn)

    def __call__(self, *args):
        if numba.get_num_threads() == 1:
            return self.serial(*args)
        return self.parallel(*args)

    def dispatchers(self):
        return (self.serial, self.parallel)


def parallel_kernel(fn):
    """Decorator: fn as a ParallelKernel (see there)."""
    return ParallelKernel(fn)


# The parallel build alone, for a kernel whose one-thread build is written
# apart (attention's: a prange over the heads against a plain loop).
parallel_only_kernel = functools.partial(numba.njit, parallel=True, **_OPTIONS)
njit = numba.njit

# Column reductions (bias gradients, LayerNorm gains) are summed in this many
# fixed row chunks, then the chunks in order: the result does not depend on
# how many threads ran, so a run and its resumed copy agree bit for bit.
REDUCE_CHUNKS = 16
