"""The small machinery every exercise check shares.

* `ExerciseError`: what a failed check raises. Its message always starts with
  "Exercise NN.k (title):" so a learner (and the test that runs the untouched
  student notebooks) can see which exercise is not done, followed by a hint.
* `attempt`: call the learner's function, turning `NotImplementedError` into
  the exercise's own "not done yet" message.
* `save_piece` / `load_piece`: a passed exercise stores the learner's code in
  `course/my_pieces/`, so later lessons (and the capstone trainer) can run on
  the learner's own pieces and say which ones they are.
"""
from __future__ import annotations

import inspect
import json
import os
import textwrap
from pathlib import Path

import numpy as np


class ExerciseError(AssertionError):
    """A check found a wrong (or missing) answer. The message carries a hint."""

    def __init__(self, exercise: str, message: str):
        self.exercise = exercise
        super().__init__(f"Exercise {exercise}: {message}")


def attempt(exercise: str, fn, *args, **kwargs):
    """Call the learner's `fn`, naming the exercise if it is still a stub."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise ExerciseError(
            exercise,
            "not done yet. Replace the lines `# YOUR CODE HERE` and "
            "`raise NotImplementedError()` in the exercise cell with your code, "
            "run that cell, then run this check again.") from None


def close(exercise: str, what: str, got, want, rtol: float = 1e-7, atol: float = 0.0,
          hint: str = "") -> None:
    """Raise ExerciseError unless `got` matches `want` in shape and value."""
    got_a = np.asarray(got)
    want_a = np.asarray(want)
    if got_a.shape != want_a.shape:
        raise ExerciseError(exercise, f"{what} has shape {got_a.shape}, expected "
                                      f"{want_a.shape}. {hint}".rstrip())
    if not np.allclose(got_a, want_a, rtol=rtol, atol=atol, equal_nan=False):
        err = np.abs(got_a - want_a)
        i = np.unravel_index(int(np.argmax(err)), err.shape) if err.ndim else ()
        raise ExerciseError(
            exercise,
            f"{what} is off: at index {tuple(int(k) for k in i)} you have "
            f"{got_a[i]!r}, expected {want_a[i]!r}. {hint}".rstrip())


def passed(exercise: str, detail: str = "") -> None:
    """Print the one deterministic line a passed check shows."""
    print(f"Exercise {exercise} passed." + (f" {detail}" if detail else ""))


# ---------------------------------------------------------------- pieces
def pieces_dir() -> Path:
    """Where passed exercises are kept: $BACKPROP_PIECES_DIR or course/my_pieces."""
    env = os.environ.get("BACKPROP_PIECES_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "course" / "my_pieces"


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
