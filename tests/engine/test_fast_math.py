"""engine.fast_math: a vectorisable float32 exp, and fused multiply-adds only where the CPU has them."""
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]

_PROBE = textwrap.dedent("""
    import numpy as np, numba
    import engine.fast_math as fm
    @numba.njit(cache=False)
    def exps(x, out):
        for i in range(x.size):
            out[i] = fm.exp(x[i])
    x = np.linspace(-87, 87, 200001).astype(np.float32)
    out = np.empty_like(x)
    exps(x, out)
    ref = np.exp(x.astype(np.float64))
    ir = exps.inspect_llvm(exps.signatures[0])
    print(fm.HAS_FMA, "llvm.fma" in ir, float(np.max(np.abs(out - ref) / ref)))
""")


def _probe(env_extra):
    env = {**os.environ, **env_extra}
    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    has_fma, uses_fma, err = r.stdout.split()
    return has_fma == "True", uses_fma == "True", float(err)


def test_exp_uses_fma_exactly_when_the_cpu_has_it():
    has_fma, uses_fma, err = _probe({})                      # this machine's CPU
    assert uses_fma == has_fma and err < 2e-7


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="compiles for an x86 CPU without FMA (Sandy Bridge)")
def test_exp_without_fma_is_a_multiply_and_an_add_and_as_accurate():
    # numba compiling for a CPU without FMA (a Sandy Bridge): llvm.fma would be a
    # library call per element there, so the exp uses a multiply and an add instead
    no_fma = {"NUMBA_CPU_NAME": "sandybridge",
              "NUMBA_CPU_FEATURES": "+avx,+sse4.2,+sse4.1,+ssse3,+sse3,+sse2,+sse,+popcnt,+cx16"}
    has_fma, uses_fma, err = _probe(no_fma)
    assert not has_fma and not uses_fma and err < 2e-7


def test_float32_exp_matches_numpy_in_process():
    import numba
    from engine.fast_math import exp

    @numba.njit(cache=False)
    def both(x, e, t):
        for i in range(x.size):
            e[i] = exp(x[i])
            t[i] = x[i] / (np.float32(1) + exp(np.float32(-2) * x[i]))   # GELU's sigmoid form

    x = np.linspace(-80, 80, 10001).astype(np.float32)
    e, t = np.empty_like(x), np.empty_like(x)
    both(x, e, t)
    x64 = x.astype(np.float64)
    assert np.max(np.abs(e - np.exp(x64)) / np.exp(x64)) < 2e-7
    want = x64 / (1 + np.exp(-2 * x64))            # = 0.5 x (1 + tanh x), in float64
    assert np.all(np.abs(t - want) <= 3e-7 * np.abs(want) + 1e-30)


def test_float32_exp_saturates_where_its_reciprocal_would_turn_subnormal():
    """Above 87 the float32 exp holds at exp(87) (never inf), so 1 / (1 + exp(x))
    stays at least the smallest normal float32: no kernel built on it (GELU's
    sigmoid) falls onto the CPU's slow subnormal path. Below -87 it holds at
    exp(-87), itself normal."""
    import numba
    from engine.fast_math import exp

    @numba.njit(cache=False)
    def exps(x, e, s):
        for i in range(x.size):
            e[i] = exp(x[i])
            s[i] = np.float32(1) / (np.float32(1) + exp(x[i]))

    x = np.array([87, 87.5, 88, 89, 1e30, np.inf, -87, -100, -np.inf], np.float32)
    e, s = np.empty_like(x), np.empty_like(x)
    exps(x, e, s)
    assert np.all(e[1:6] == e[0]) and np.isfinite(e).all()
    assert abs(e[0] / np.exp(87.0) - 1) < 2e-7
    assert np.all(s >= np.finfo(np.float32).tiny)
    assert np.all(e[6:] == e[6]) and e[6] >= np.finfo(np.float32).tiny
