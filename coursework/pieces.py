"""The learner's pieces: where passed exercises are kept and how they are loaded.

A passed check calls `save_piece(name, fn, exercise)`: the learner's function
is stored in `course/my_pieces/` (or $BACKPROP_PIECES_DIR), so later lessons
and the capstone trainer can run on the learner's own code and say, per piece,
whose code ran (`pieces_report`). The library never looks here: a lesson loads
a piece and hands it to the engine explicitly.
"""
from __future__ import annotations

import inspect
import json
import os
import textwrap
from pathlib import Path

import numpy as np


def pieces_dir() -> Path:
    """Where passed exercises are kept: $BACKPROP_PIECES_DIR or course/my_pieces."""
    env = os.environ.get("BACKPROP_PIECES_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1] / "course" / "my_pieces"


def save_piece(name: str, fn, exercise: str) -> Path | None:
    """Store the source of a learner's function that passed `exercise`.

    Returns the file written, or None when the source cannot be recovered
    (for example a function typed into a plain Python prompt).
    """
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    folder = pieces_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    header = (f"# Your solution to exercise {exercise}, saved when its check passed.\n"
              f"# Later lessons load `{fn.__name__}` from here as the piece '{name}'.\n")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(header + source)
    os.replace(tmp, path)  # atomic: never a half-written piece
    meta = folder / "index.json"
    index = json.loads(meta.read_text()) if meta.exists() else {}
    index[name] = {"function": fn.__name__, "exercise": exercise}
    meta.write_text(json.dumps(index, indent=1, sort_keys=True))
    return path


def load_piece(name: str):
    """Return the learner's saved function for `name`, or None if not saved."""
    folder = pieces_dir()
    meta = folder / "index.json"
    if not meta.exists():
        return None
    entry = json.loads(meta.read_text()).get(name)
    path = folder / f"{name}.py"
    if entry is None or not path.exists():
        return None
    import math
    import numba
    # The names a lesson's exercise cell may use without importing them itself:
    # saved numba kernels keep their @njit decorator.
    namespace: dict = {"np": np, "math": math, "numba": numba, "njit": numba.njit,
                       "prange": numba.prange}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace.get(entry["function"])


def pieces_report(names) -> list[tuple[str, str]]:
    """For each piece name, whose code will run: 'yours', 'reference' (never
    saved), or 'reference (yours does not load: <error>)'."""
    report = []
    for name in names:
        try:
            owner = "yours" if load_piece(name) is not None else "reference"
        except Exception as err:  # e.g. a kernel that used a notebook variable
            owner = f"reference (yours does not load: {type(err).__name__}: {err})"
        report.append((name, owner))
    return report
