"""Was an array left as the learner's function found it?

A nudge-and-restore loop (`x[i] += eps; ...; x[i] -= 2*eps; ...; x[i] += eps`) is right
in exact arithmetic, but every addition rounds, so the value can come back one rounding
step (one unit in the last place) away from where it started. The checks accept that,
explain it, and reject anything larger with the fix that restores exactly.
"""
from __future__ import annotations

import numpy as np

from ._core import ExerciseError


def check_restored(exercise: str, before, after, eps: float, name: str) -> str:
    """Raise ExerciseError if `after` moved from `before` by more than rounding; return
    a note for the passed line when it moved by rounding only ("" when unchanged)."""
    before, after = np.asarray(before), np.asarray(after)
    if np.array_equal(before, after):
        return ""
    steps = np.abs(after - before) / np.spacing(np.maximum(np.abs(before), eps))
    if np.all(steps <= 2):
        off = int(np.count_nonzero(after != before))
        return (f" Note: {off} of the {before.size} entries of {name} came back one rounding "
                f"step off (x + eps - 2*eps + eps is not exactly x in floating point); saving "
                f"the value and assigning it back restores it exactly.")
    i = np.unravel_index(int(np.argmax(np.abs(after - before))), before.shape)
    where = f"{name}[{', '.join(str(int(k)) for k in i)}]"
    raise ExerciseError(
        exercise, f"{name} was changed by your function: {where} was {before[i]!r} and is now "
                  f"{after[i]!r}. Nudge a copy, or save the original value (`old = {name}[i]`) "
                  f"and assign it back (`{name}[i] = old`) after each pair of evaluations.")
