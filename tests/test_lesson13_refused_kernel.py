"""A 10.1 kernel that the speed check refuses never runs in lesson 13 as "yours (10.1)".

The refusal is decided on times (`coursework.lesson10_speed.refusal`), so these tests
hand the check fixed times instead of timing a kernel on a busy machine: what they test
is the path from a refusal to the owner lesson 13 prints and the kernel its model runs.
Each kernel is defined from a file, as a notebook cell defines it, so a passed check
really saves it.
"""
from __future__ import annotations

import inspect

import pytest

from check_tools import fails_with, fixed_times
from coursework import lesson10, lesson13

KERNEL = '''
import numpy as np
from numba import njit, prange


@njit(parallel=True)
def bias_gelu_fused(x, b, out):
    k, a = 0.7978845608028654, 0.044715
    rows, cols = x.shape
{loops}
            u = x[i, j] + b[j]
            t = 1.0 - 2.0 / (np.exp(2.0 * k * (u + a * u * u * u)) + 1.0)
            out[i, j] = 0.5 * u * (1.0 + t)
    return out
'''
ROWS_IN_PRANGE = "    for i in prange(rows):\n        for j in range(cols):"
THREADS_PER_ROW = "    for i in range(rows):\n        for j in prange(cols):"


def kernel_from_a_cell(tmp_path, loops: str, name: str):
    source = KERNEL.format(loops=loops)
    path = tmp_path / f"{name}_cell.py"
    path.write_text(source)
    namespace = {"__name__": "notebook"}
    exec(compile(source, str(path), "exec"), namespace)
    return namespace["bias_gelu_fused"]


@pytest.fixture()
def pieces_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path / "pieces"))
    from engine.trainer.model import reset_kernels
    reset_kernels()
    yield tmp_path / "pieces"
    reset_kernels()


def _gelu_in_lesson_13():
    """What lesson 13 prints as the owner of the bias + GELU slot, the model registry's
    owner of that kernel, and the source of the function it plugged in (or None)."""
    from engine.trainer.model import kernel_owners
    trainer = lesson13.plug_in_pieces()
    fn = trainer.pieces.get("bias_gelu_forward")
    source = inspect.getsource(getattr(fn, "py_func", fn)) if fn is not None else None
    return trainer.owner("bias_gelu_forward"), kernel_owners()["bias_gelu_forward"], source


def test_a_refused_kernel_with_none_passed_before_leaves_the_engines_kernel(
        pieces_folder, tmp_path, monkeypatch):
    slow = kernel_from_a_cell(tmp_path, THREADS_PER_ROW, "slow")
    monkeypatch.setattr(lesson10, "measure", fixed_times(yours_ms=150.0))
    fails_with(lesson10.check_bias_gelu, slow, 1,
               words=("Exercise 10.1", "too slow", "threads started per row", "not saved"))
    owner, registry_owner, source = _gelu_in_lesson_13()
    assert owner.startswith("engine's") and "10.1" not in registry_owner
    assert registry_owner == "engine" and source is None


def test_a_refused_kernel_never_replaces_the_last_one_that_passed(pieces_folder, tmp_path,
                                                                  monkeypatch):
    fast = kernel_from_a_cell(tmp_path, ROWS_IN_PRANGE, "fast")
    monkeypatch.setattr(lesson10, "measure", fixed_times(yours_ms=6.0))
    lesson10.check_bias_gelu(fast, 1)
    owner, registry_owner, source = _gelu_in_lesson_13()
    assert owner == "yours (10.1)" and registry_owner == "you (10.1)"
    assert "prange(rows)" in source

    slow = kernel_from_a_cell(tmp_path, THREADS_PER_ROW, "slow")
    monkeypatch.setattr(lesson10, "measure", fixed_times(yours_ms=150.0))
    fails_with(lesson10.check_bias_gelu, slow, 1, words=("too slow", "not saved"))
    owner, registry_owner, source = _gelu_in_lesson_13()
    assert owner == "yours (10.1)" and registry_owner == "you (10.1)"
    assert "prange(rows)" in source and "prange(cols)" not in source    # the one that passed
