"""Lesson 12's data-parallel cells without MPI: the in-process stand-in checks the same claims.

The notebook run by nbval takes the MPI path where mpi4py and mpiexec exist; this test takes
the other path (BACKPROP_NO_MPI=1, as on a machine without MPI) by running the lesson's own
launch cell, and asserts the claims the compared cell after it prints: the two gradient
equalities and the counted bytes (K times the gradient when syncing every micro-batch).
"""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from notebook_tools import ROOT

SOURCE = ROOT / "course" / "source" / "12_between_backward_and_step.py"


def code_cell(text: str, marker: str) -> str:
    """The code cell of the lesson source that contains `marker`."""
    cells = text.split("\n# %%")
    found = [c for c in cells if marker in c and not c.startswith(" [markdown]")]
    assert len(found) == 1, f"expected one code cell with {marker!r}, found {len(found)}"
    return found[0].split("\n", 1)[1]


def test_launch_cell_without_mpi_checks_both_claims(monkeypatch, tmp_path):
    from engine.trainer.model import FusedGPT
    from engine.gpt_config import tiny_config

    monkeypatch.setenv("BACKPROP_NO_MPI", "1")
    text = SOURCE.read_text()
    ns = {"np": np, "FusedGPT": FusedGPT, "tiny_config": tiny_config, "os": os, "sys": sys,
          "json": json, "shutil": shutil, "subprocess": subprocess, "Path": Path,
          "DEMO_DIR": tmp_path, "DP_SCRIPT": tmp_path / "dp_demo.py"}
    exec(code_cell(text, "def data_parallel_in_process"), ns)
    progress = io.StringIO()
    with contextlib.redirect_stdout(progress):
        exec(code_cell(text, "MPI_OK = mpi_available()"), ns)
    assert ns["MPI_OK"] is False
    assert "thread replicas" in progress.getvalue()     # says what it waits for, first
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code_cell(text, "bytes reduced per rank"), ns)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and all(line.endswith(": True") for line in lines[:2]), lines
    assert "sync every micro-batch 4 x the" in lines[2] and lines[2].endswith("last only 1 x")
    dp = ns["dp"]
    assert dp["ranks"] == 2 and dp["micro_batches"] == 4
    assert dp["parallel_vs_single"] < 1e-5
    assert dp["every_vs_last"] < 1e-5
