"""The reference solutions as pieces: what a learner who did every exercise has saved.

`SOLUTION_PIECES` names, for each piece, the lesson and the solution function that
fills it. `solution_namespace(lesson, scratch)` defines a lesson's solution cells the
way its notebook does: the lesson's imports, then each solution cell run from a file of
its own (so the source of every function can be read back, as in a notebook).
`save_solution_pieces(names, scratch)` saves them through `save_piece`, with the same
fresh-namespace reload and slot contract a passed check runs.

Two users, one builder: tests/test_pieces_end_to_end.py trains lesson 13 on these
pieces against the engine, and lesson 13's solution notebook runs its trainer on them,
in a temporary pieces folder, in place of a learner's (`use_solution_pieces`).
"""
from __future__ import annotations

import importlib.util
import os
import re
import tempfile
from pathlib import Path

from . import pieces

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "course" / "source"

# piece -> (lesson, the solution's function, exercise)
SOLUTION_PIECES = {
    "central_difference_gradient": ("00", "central_difference_gradient", "00.1"),
    "matmul_vjp": ("03", "matmul_vjp", "03.1"),
    "unbroadcast": ("03", "unbroadcast", "03.2"),
    "scalar_backward": ("02", "backward", "02.2"),
    "numerical_partial": ("04", "numerical_partial", "04.1"),
    "gradient_errors": ("04", "gradient_errors", "04.2"),
    "spot_check": ("04", "spot_check", "04.3"),
    "block_saved_elements": ("06", "block_saved_elements", "06.2"),
    "accumulate": ("08", "accumulate", "08.1"),
    "checkpoint_replay": ("08", "checkpointed_backward", "08.2"),
    "checkpoint_peak": ("08", "checkpoint_peak", "08.3"),
    "to_bf16": ("09", "to_bf16", "09.1"),
    "update_scale": ("09", "update_scale", "09.3"),
    "master_weight_step": ("09", "master_weight_step", "09.2"),
    "bias_gelu_forward": ("10", "bias_gelu_fused", "10.1"),
    "softmax_cross_entropy": ("10", "softmax_cross_entropy_fused", "10.2"),
    "embedding_backward": ("11", "embedding_backward", "11.1"),
    "clip_global_norm": ("12", "clip_global_norm", "12.1"),
    "adamw_step": ("12", "adamw_step", "12.2"),
}
IMPORT = re.compile(r"^(import |from )\S+")


def _parse_cells(text: str):
    """The course build's own cell parser (tools/build_course.py), so a lesson is read
    here exactly as its notebooks are built."""
    spec = importlib.util.spec_from_file_location("build_course", ROOT / "tools" / "build_course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.parse_cells(text)


def solution_namespace(lesson: str, scratch: Path) -> dict:
    """A lesson's imports and its solution cells, each run from a file in `scratch` as a
    notebook cell is (the files must outlive the save of the pieces they define)."""
    source = next(SOURCE.glob(f"{lesson}_*.py")).read_text()
    cells = [src for kind, src in _parse_cells(source) if kind == "code"]
    namespace: dict = {"__name__": f"lesson{lesson}_notebook"}
    for cell in cells:
        for line in cell.splitlines():
            if IMPORT.match(line) and "mpi4py" not in line:    # an optional extra
                exec(line, namespace)
    for i, cell in enumerate(cells):
        if "### BEGIN SOLUTION" in cell:
            path = Path(scratch) / f"lesson{lesson}_cell{i}.py"
            path.write_text(cell)
            try:
                exec(compile(cell, str(path), "exec"), namespace)
            except NameError:      # a solution cell that uses an earlier cell's result
                pass
    return namespace


def save_solution_pieces(names, scratch: Path) -> list[str]:
    """Save the reference solution of each piece in `names` through `save_piece` into the
    current pieces folder; returns the names saved, in order."""
    spaces: dict = {}
    items = []
    for name in names:
        lesson, function, exercise = SOLUTION_PIECES[name]
        if lesson not in spaces:
            spaces[lesson] = solution_namespace(lesson, scratch)
        items.append((name, spaces[lesson][function], exercise))
    pieces.vet_before_saving(items)      # one child for all, not one per save
    saved = []
    for name, fn, exercise in items:
        if pieces.save_piece(name, fn, exercise) is None:
            raise RuntimeError(f"the reference solution of {name!r} ({exercise}) could not "
                               f"be saved in {pieces.pieces_dir()}")
        saved.append(name)
    return saved


def use_solution_pieces(before_lesson: str) -> Path:
    """Point this process at a new temporary pieces folder holding the reference solution
    of every piece of the lessons before `before_lesson` ("13": lessons 00-12), and
    return it. The learner's own folder is never read or written."""
    folder = Path(tempfile.mkdtemp(prefix="backprop-reference-pieces-"))
    os.environ["BACKPROP_PIECES_DIR"] = str(folder / "pieces")
    names = [n for n, (lesson, _, _) in SOLUTION_PIECES.items() if lesson < before_lesson]
    scratch = folder / "cells"
    scratch.mkdir()
    save_solution_pieces(names, scratch)
    return pieces.pieces_dir()       # in a solution notebook, its own temporary folder


def in_solution_notebook() -> bool:
    """True when the running notebook is a solution notebook (its folder, the kernel's
    working directory, is course/solutions), as `make course` and nbval run them."""
    try:
        return Path.cwd().resolve() == (pieces.COURSE / "solutions").resolve()
    except OSError:
        return False
