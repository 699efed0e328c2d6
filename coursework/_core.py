"""The small machinery every exercise check shares.

* `ExerciseError`: what a failed check raises. Its message always starts with
  "Exercise NN.k (title):" so a learner (and the test that runs the untouched
  student notebooks) can see which exercise is not done, followed by a hint.
  In a notebook it shows only that message, not the checker's traceback.
* `attempt`: call the learner's function, turning `NotImplementedError` into
  the exercise's own "not done yet" message.
* `name_unfinished_exercises`: in a notebook, a cell that needs an exercise
  the learner has not finished says which, in one line, instead of a
  NameError or NotImplementedError traceback.
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


class UnfinishedExercise(Exception):
    """A lesson's cell needs an exercise's function that is missing or still a stub."""

    def __init__(self, exercise: str, name: str, never_ran: bool):
        self.exercise = exercise
        why = (f"needs `{name}`, whose exercise cell has not run" if never_ran
               else f"runs your `{name}`, which is still the stub")
        super().__init__(f"finish exercise {exercise} first: this cell {why}. Complete it, "
                         f"run it and its check, then run this cell again.")

    def _render_traceback_(self) -> list[str]:
        """One line in a notebook, as ExerciseError shows."""
        red, plain = "\x1b[1;31m", "\x1b[0m"
        return [f"{red}{type(self).__name__}{plain}: {self}"]


def unfinished_exercise(error: BaseException, functions: dict[str, str], namespace: dict):
    """The UnfinishedExercise that `error` stands for, or None when it is some other error.

    `functions` maps each exercise function's name to its exercise ("04.3 (spot_check)"). A
    NameError for one of them means its cell never ran; a NotImplementedError raised in one
    of them, defined in `namespace` (the notebook's), means the stub ran."""
    if isinstance(error, NameError) and getattr(error, "name", None) in functions:
        return UnfinishedExercise(functions[error.name], error.name, never_ran=True)
    if isinstance(error, NotImplementedError):
        tb = error.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None:
            name = tb.tb_frame.f_code.co_name
            if name in functions and tb.tb_frame.f_globals is namespace:
                return UnfinishedExercise(functions[name], name, never_ran=False)
    return None


def name_unfinished_exercises(functions: dict[str, str], shell=None) -> None:
    """In IPython, show a NameError or NotImplementedError that comes from an unfinished
    exercise of `functions` as the one line of `UnfinishedExercise`; every other error shows
    as usual. The cell still fails (so Run All stops there and `pytest --nbval` fails).
    Outside IPython this does nothing."""
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
        if shell is None:
            return

    def show(shell, etype, value, tb, tb_offset=None):
        unfinished = unfinished_exercise(value, functions, shell.user_ns)
        if unfinished is None:
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        else:
            shell.showtraceback((UnfinishedExercise, unfinished, tb))

    shell.set_custom_exc((NameError, NotImplementedError), show)


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
