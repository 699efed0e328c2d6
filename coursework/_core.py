"""The small machinery every exercise check shares.

* `ExerciseError`: what a failed check raises. Its message always starts with
  "Exercise NN.k (title):" so a learner (and the test that runs the untouched
  student notebooks) can see which exercise is not done, followed by a hint.
  In a notebook it shows only that message, not the checker's traceback.
* `attempt`: call the learner's function, turning `NotImplementedError` into
  the exercise's own "not done yet" message.
(The pieces a passed check saves are kept by `coursework.pieces`.)
"""
from __future__ import annotations

import numpy as np


class ExerciseError(AssertionError):
    """A check found a wrong (or missing) answer. The message carries a hint."""

    def __init__(self, exercise: str, message: str):
        self.exercise = exercise
        super().__init__(f"Exercise {exercise}: {message}")

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for this error: the message alone, in red, without the
        traceback through the checker (whose source would also show the hints of
        other wrong answers). The cell still fails, so `pytest --nbval` still does."""
        red, plain = "\x1b[1;31m", "\x1b[0m"
        first, *rest = str(self).splitlines() or [""]
        return [f"{red}{type(self).__name__}{plain}: {first}", *rest]


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
