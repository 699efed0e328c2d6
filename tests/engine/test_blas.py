"""engine.blas: which library runs the trainer's matrix products, chosen by
ENGINE_BLAS, and the thread counts engine.timing sets on it.

Each choice is checked in a fresh process (the library is chosen once per
process, when the trainer's linear layers are imported). Where MKL is not
installed (CI's bare run) the test of ENGINE_BLAS=mkl checks the error that
says how to install it; where it is (the full run), that MKL computes the
products."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# In a child process: the chosen library, and the trainer's gemm checked against numpy.
_PROBE = """
import json
import numpy as np
from engine.blas import library
from engine.timing import blas_threads, fixed_threads
from engine.trainer.kernels.linear import gemm
rng = np.random.default_rng(0)
a = rng.standard_normal((70, 50)).astype(np.float32)
b = rng.standard_normal((60, 50)).astype(np.float32)
out = np.full((70, 60), 1.0, np.float32)
gemm(a, b, out, trans_b=True, accumulate=True)
ref = a.astype(np.float64) @ b.T.astype(np.float64) + 1.0
with fixed_threads(1):
    inside = blas_threads()
print(json.dumps({"name": library().name, "description": library().description,
                  "err": float(np.abs(out - ref).max() / np.abs(ref).max()),
                  "threads_inside": inside, "threads_after": blas_threads()}))
"""


def _probe(blas: str):
    env = dict(os.environ, ENGINE_BLAS=blas)
    return subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def _mkl_installed() -> bool:
    from engine import blas
    return blas._load_mkl()[0] is not None


def test_an_unknown_choice_names_the_variable_the_value_and_the_choices(monkeypatch):
    from engine import blas
    monkeypatch.setenv("ENGINE_BLAS", "atlas")
    with pytest.raises(ValueError, match=r"ENGINE_BLAS='atlas'.*auto, openblas, mkl"):
        blas.choice()


def test_openblas_when_asked_computes_the_products():
    done = _probe("openblas")
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["name"] == "openblas" and got["description"].startswith("OpenBLAS")
    assert got["err"] < 1e-5
    assert got["threads_inside"] == 1


def test_mkl_when_asked_computes_the_products_or_says_how_to_install_it():
    done = _probe("mkl")
    if not _mkl_installed():
        assert done.returncode != 0
        assert "ENGINE_BLAS=mkl" in done.stderr and "pip install -e '.[mkl]'" in done.stderr
        return
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["name"] == "mkl" and got["description"].startswith("oneMKL")
    assert got["err"] < 1e-5
    # engine.timing reaches MKL's threads too, and gives them back
    assert got["threads_inside"] == 1 and got["threads_after"] >= 1


def test_auto_takes_mkl_only_on_an_intel_cpu(monkeypatch):
    from engine import blas
    monkeypatch.delenv("ENGINE_BLAS", raising=False)
    monkeypatch.setattr(blas, "_load_mkl", lambda: (object(), ["libmkl_rt.so.3"]))
    monkeypatch.setattr(blas, "_mkl", lambda lib: "mkl")
    monkeypatch.setattr(blas, "_openblas", lambda: "openblas")
    blas.library.cache_clear()
    try:
        monkeypatch.setattr(blas, "_cpu_vendor", lambda: "GenuineIntel")
        assert blas.library() == "mkl"
        blas.library.cache_clear()
        monkeypatch.setattr(blas, "_cpu_vendor", lambda: "AuthenticAMD")
        assert blas.library() == "openblas"
        blas.library.cache_clear()
        monkeypatch.setenv("ENGINE_BLAS", "mkl")        # asked for: used on any CPU
        assert blas.library() == "mkl"
    finally:
        blas.library.cache_clear()


def test_sgemm_into_checks_its_arguments_and_multiplies():
    from engine.blas import library
    rng = np.random.default_rng(1)
    a = rng.standard_normal((9, 7)).astype(np.float32)
    b = rng.standard_normal((7, 5)).astype(np.float32)
    out = np.empty((9, 5), np.float32)
    library().sgemm_into(a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="cannot go into"):
        library().sgemm_into(a, b, np.empty((5, 9), np.float32))
    with pytest.raises(ValueError, match="C-contiguous float32"):
        library().sgemm_into(a.astype(np.float64), b, out)
