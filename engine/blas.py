"""The BLAS behind the engine's matrix products: which library, and its threads.

The fused trainer's linear layers (engine.trainer.kernels.linear) call the
Fortran routines `sgemm` and `dgemm` by address. Two libraries provide them:

* "openblas": SciPy's OpenBLAS (scipy.linalg.cython_blas), always installed;
* "mkl": Intel's oneMKL, from the optional `mkl` package
  (`pip install -e '.[mkl]'`; conda: `conda install mkl`), loaded as libmkl_rt.

The environment variable ENGINE_BLAS chooses: "openblas", "mkl", or "auto"
(the default), which takes MKL when it is installed and the CPU is Intel's,
and OpenBLAS otherwise. Why it matters: on an Intel core MKL ran the tiny
GPT's products about 1.2x as fast as OpenBLAS (both libraries in one
process; engine/trainer/kernels/cpu/README.md#mkl). MKL is tuned for Intel's
CPUs; on another CPU it is used only when asked for.

Threads: MKL runs on the GNU OpenMP layer (libgomp), the runtime numba's
kernels use, so both draw on one pool of threads instead of two fighting
over the cores; without libgomp it runs sequentially (one thread).
`threads()` and `set_threads(n)` reach it; engine.timing sets every BLAS
in the process through them.

Kernels: OpenBLAS picks its kernels for the CPU when it loads, unless
OPENBLAS_CORETYPE names others (some machines set it, e.g. to Haswell, so that
every CPU of a fleet runs the same code and gets the same bits). The
description names the kernels that run ("OpenBLAS 0.3.30, Haswell kernels"),
and `kernel_bits` says how wide their vectors are: OpenBLAS's Haswell kernels
use 256 of an AVX-512 CPU's 512 bits, which halves what a product can reach
(engine/trainer/kernels/cpu/README.md#openblas-kernel-width).
engine.trainer.kernels.linear reads
it to choose between BLAS and the engine's own register tiles.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
import sys
from dataclasses import dataclass

ENV_VAR = "ENGINE_BLAS"
CHOICES = ("auto", "openblas", "mkl")
MKL_INSTALL = "pip install -e '.[mkl]'   (conda: conda install mkl)"

# sgemm's Fortran interface: 13 arguments, every one a pointer
_FORTRAN_GEMM = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 13))
# oneMKL's threading layers (mkl_service.h)
_MKL_THREADING_SEQUENTIAL, _MKL_THREADING_GNU = 1, 3


@dataclass(frozen=True)
class Blas:
    """One BLAS library: the addresses of its sgemm and dgemm (Fortran
    interface, 32-bit integers), and how to reach its thread count."""
    name: str                 # "openblas" or "mkl"
    description: str          # e.g. "oneMKL 2026.2 (GNU OpenMP threads)"
    sgemm: int
    dgemm: int
    _lib: object = None       # the ctypes library, for MKL's thread calls
    kernel_bits: int | None = None   # vector width of its float32 kernels, where known

    def threads(self) -> int | None:
        """MKL's thread count (None for OpenBLAS: engine.timing reaches every
        OpenBLAS in the process by itself)."""
        return int(self._lib.MKL_Get_Max_Threads()) if self.name == "mkl" else None

    def set_threads(self, n: int) -> None:
        if self.name == "mkl":
            self._lib.MKL_Set_Num_Threads(ctypes.c_int(int(n)))

    def sgemm_into(self, a, b, out) -> None:
        """out = a @ b for C-ordered float32 matrices, through this library's
        sgemm (for reference timings; the trainer calls it from compiled code).
        Column-major, out^T = b^T a^T: the C-ordered arrays as they are."""
        m, k = a.shape
        n = b.shape[1]
        for x in (a, b, out):
            if x.dtype.name != "float32" or not x.flags.c_contiguous:
                raise ValueError("Blas.sgemm_into: a, b and out must be C-contiguous float32")
        if b.shape[0] != k or out.shape != (m, n):
            raise ValueError(f"Blas.sgemm_into: {a.shape} @ {b.shape} cannot go into {out.shape}")
        ref, i, f, no = ctypes.byref, ctypes.c_int, ctypes.c_float, ctypes.c_char(b"N")
        _FORTRAN_GEMM(self.sgemm)(ref(no), ref(no), ref(i(n)), ref(i(m)), ref(i(k)),
                                  ref(f(1.0)), b.ctypes.data, ref(i(n)), a.ctypes.data,
                                  ref(i(k)), ref(f(0.0)), out.ctypes.data, ref(i(n)))


def choice() -> str:
    """ENGINE_BLAS, checked: "auto", "openblas" or "mkl"."""
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV_VAR}={os.environ[ENV_VAR]!r} names no BLAS the engine knows; "
                         f"set it to one of {', '.join(CHOICES)} (or unset it for auto)")
    return value


@functools.cache
def library() -> Blas:
    """The BLAS the engine's matrix products use in this process (chosen once)."""
    wanted = choice()
    if wanted in ("auto", "mkl"):
        lib, tried = _load_mkl()
        if lib is not None and (wanted == "mkl" or _cpu_vendor() == "GenuineIntel"):
            return _mkl(lib)
        if wanted == "mkl":
            raise RuntimeError(f"{ENV_VAR}=mkl, but no MKL library loads here (looked for "
                               f"{', '.join(tried) or 'libmkl_rt'}). Install it with "
                               f"{MKL_INSTALL}, or unset {ENV_VAR} to use SciPy's OpenBLAS")
    return _openblas()


def _openblas() -> Blas:
    from numba.extending import get_cython_function_address
    import scipy
    address = lambda name: get_cython_function_address("scipy.linalg.cython_blas", name)  # noqa: E731
    sgemm, dgemm = address("sgemm"), address("dgemm")      # SciPy's OpenBLAS is loaded now
    build, core = _openblas_build()
    return Blas("openblas", f"{build} (SciPy {scipy.__version__})", sgemm, dgemm,
                kernel_bits=openblas_kernel_bits(core))


# OpenBLAS's x86 kernel sets by the width of their float32 vectors (its core names,
# lower case); a name not listed (another architecture, a newer set) is not guessed.
_OPENBLAS_KERNEL_BITS = {
    512: ("skylakex", "cooperlake", "sapphirerapids"),
    256: ("haswell", "zen", "sandybridge", "excavator", "steamroller", "piledriver",
          "bulldozer"),
    128: ("prescott", "core2", "penryn", "dunnington", "nehalem", "atom", "opteron",
          "opteron_sse3", "barcelona", "bobcat", "nano", "katmai", "coppermine",
          "northwood"),
}


def openblas_kernel_bits(core: str) -> int | None:
    """Vector bits of OpenBLAS's float32 kernels for its core name ("Haswell" ->
    256), or None for a name this table does not list."""
    core = core.strip().lower()
    return next((bits for bits, names in _OPENBLAS_KERNEL_BITS.items() if core in names),
                None)


def _openblas_build() -> tuple[str, str]:
    """("OpenBLAS 0.3.30, Haswell kernels", "Haswell"): SciPy's OpenBLAS asked
    its version and the kernels it runs ("OpenBLAS" and "" where it cannot be asked)."""
    text = {}
    for key, names in (("config", ("scipy_openblas_get_config", "openblas_get_config")),
                       ("core", ("scipy_openblas_get_corename", "openblas_get_corename"))):
        for _, fn in openblas_entry_points(names)[:1]:      # SciPy's copy comes first
            fn.restype = ctypes.c_char_p
            text[key] = fn().decode(errors="replace")
    words = text.get("config", "").split()              # "OpenBLAS 0.3.30 DYNAMIC_ARCH ..."
    version = f" {words[1]}" if len(words) > 1 and words[0] == "OpenBLAS" else ""
    core = text.get("core", "")
    return f"OpenBLAS{version}" + (f", {core} kernels" if core else ""), core


def openblas_entry_points(names):
    """(library path, function) for every OpenBLAS mapped into this process that
    has one of `names`, SciPy's first (it runs the engine's matrix products);
    numpy and SciPy each load their own copy."""
    import scipy.linalg.blas  # noqa: F401  (load SciPy's BLAS as well as numpy's)
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f
                     if "openblas" in line.lower() and line.split()[-1].startswith("/")}
    except OSError:                      # not Linux: leave BLAS as it is
        return []
    found = []
    for path in sorted(paths, key=lambda p: ("scipy.libs" not in p, p)):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        fn = next((getattr(lib, n) for n in names if hasattr(lib, n)), None)
        if fn is not None:
            found.append((path, fn))
    return found


def _mkl_candidates() -> list[str]:
    """Where libmkl_rt may be: the pip package puts it in <prefix>/lib, conda
    in the environment's lib, a system install on the loader's path."""
    found = sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")), reverse=True)
    system = ctypes.util.find_library("mkl_rt")
    return found + ([system] if system else [])


def _load_mkl():
    """(the loaded libmkl_rt or None, the paths tried)."""
    tried = _mkl_candidates()
    for path in tried:
        try:
            return ctypes.CDLL(path), tried
        except OSError:
            continue
    return None, tried


def _mkl(lib) -> Blas:
    # The threading layer must be chosen before any other MKL call.
    lib.MKL_Set_Threading_Layer.argtypes = [ctypes.c_int]
    gomp = _has_libgomp()
    lib.MKL_Set_Threading_Layer(_MKL_THREADING_GNU if gomp else _MKL_THREADING_SEQUENTIAL)
    text = ctypes.create_string_buffer(256)
    lib.MKL_Get_Version_String(text, ctypes.c_int(len(text)))
    version = text.value.decode(errors="replace")
    # "Intel(R) oneAPI Math Kernel Library Version 2026.2-Product Build ..."
    version = version.split("Version")[-1].split("Product")[0].strip(" ,-") or version
    threads = "GNU OpenMP threads" if gomp else "sequential"
    address = lambda name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value  # noqa: E731
    return Blas("mkl", f"oneMKL {version} ({threads})", address("sgemm"), address("dgemm"),
                lib)


def _has_libgomp() -> bool:
    try:
        ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1")
        return True
    except OSError:
        return False


def _cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
