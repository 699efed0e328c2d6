"""Compare a learner's function with the lesson's reference over generated cases, and name a
slip only when the check has reproduced it.

A check lists its cases (`Case`: the arguments, and how a message names the call), its
reference, and the typical slips (`Slip`: a function that makes the slip's answer from the
same arguments, and the hint for whoever made it). `compare_over_cases` runs the learner's
function on every case. At the first case where the answer differs from the reference it
names the slip whose reproduction gives the learner's answer on *every* case the answer
gets wrong; when no slip does, it says where the answer differs (which entry, by how
much, on which case, in the exercise's units) and names no cause. A hint is then never a
guess: a learner told "you rounded up" did round up.

Cases come from a seeded generator (`np.random.default_rng(seed)`), so a notebook's printed
output never changes, beside the hand-picked cases that tell the lesson's story.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ._core import ExerciseError, attempt


@dataclass(frozen=True)
class Case:
    """One input of an exercise: the arguments of the call, and how a message names it."""
    args: tuple
    label: str


@dataclass(frozen=True)
class Slip:
    """A typical wrong answer. `reproduce` takes the case's arguments and returns what the
    slip returns; `hint` is the sentence for whoever made it, or a function of
    (case, learner's answer, reference's answer) that writes it with the case's numbers."""
    reproduce: Callable[..., Any]
    hint: str | Callable[[Case, Any, Any], str]

    def says(self, case: Case, got, want) -> str:
        return self.hint(case, got, want) if callable(self.hint) else self.hint


def equal(got, want) -> bool:
    """Exact agreement of two numbers or arrays (the default of `compare_over_cases`)."""
    try:
        return bool(np.array_equal(np.asarray(got), np.asarray(want)))
    except (TypeError, ValueError):
        return False


def close_within(rtol: float, atol: float = 0.0) -> Callable[[Any, Any], bool]:
    """Agreement of arrays of the same shape within rtol and atol."""
    def close(got, want) -> bool:
        a, b = np.asarray(got), np.asarray(want)
        return a.shape == b.shape and bool(np.allclose(a, b, rtol=rtol, atol=atol))
    return close


def slip_reproduced(slips: Sequence[Slip], cases: Sequence[Case], answers: Sequence,
                    wants: Sequence, same: Callable[[Any, Any], bool] = equal) -> Slip | None:
    """The first slip whose reproduction gives the learner's answer on every case where that
    answer differs from the reference's (`wants`), or None. A learner right on some cases
    (a square-only fix, a special case) is still told the slip made on the others; a
    reproduction that cannot run on a case (its shapes do not fit) does not match it."""
    wrong = [(case, answer) for case, answer, want in zip(cases, answers, wants)
             if not same(answer, want)]
    for slip in slips:
        try:
            if wrong and all(same(answer, slip.reproduce(*case.args)) for case, answer in wrong):
                return slip
        except (ValueError, TypeError, ZeroDivisionError, IndexError, ArithmeticError):
            continue
    return None


def number_difference(got: float, want: float, unit: str = "",
                      theirs: str = "the reference has") -> str:
    """Where a number differs from the reference's, with no cause: both values and the gap."""
    unit = f" {unit}" if unit else ""
    off = float(got) - float(want)
    return (f"you have {_show(got)}{unit}, {theirs} {_show(want)}{unit} (yours is "
            f"{'+' if off > 0 else ''}{_show(off)}{unit} off)")


def array_difference(got, want, unit: str = "", *, theirs: str = "the reference has",
                     digits: int | None = None, rtol: float = 1e-12, atol: float = 0.0) -> str:
    """Where an array differs from the reference's, with no cause: the entry that differs
    most, the two values, and how many entries differ. `theirs` names the reference as
    `number_difference` does; `digits` prints the two values with the fewest significant
    digits, at least `digits`, that tell them apart (`differing_digits`) instead of in
    full; an entry differs when it is not within `rtol` and `atol` of the reference's."""
    a, b = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if a.shape != b.shape:
        return f"your result has shape {a.shape}, {theirs} shape {b.shape}"
    err = np.abs(a - b)
    err = np.where(np.isnan(err), np.inf, err)
    i = np.unravel_index(int(np.argmax(err)), err.shape) if err.ndim else ()
    unit = f" {unit}" if unit else ""
    yours, right = (repr(float(a[i])), repr(float(b[i]))) if digits is None else \
        differing_digits(float(a[i]), float(b[i]), least=digits)
    n_off = int(np.count_nonzero(~np.isclose(a, b, rtol=rtol, atol=atol)))
    return (f"entry {tuple(int(k) for k in i)} is {yours}{unit} where {theirs} {right}{unit} "
            f"(off by {a[i] - b[i]:+.3g}{unit}); {n_off} of {a.size} "
            f"entr{'y' if a.size == 1 else 'ies'} differ")


def _show(x) -> str:
    x = float(x)
    return f"{x:,.0f}" if x == int(x) and abs(x) < 1e15 else f"{x:.6g}"


def compare_over_cases(exercise: str, fn, reference, cases: Sequence[Case], *,
                       slips: Sequence[Slip] = (), same=equal,
                       read: Callable[[Any, Case], Any] = lambda value, case: value,
                       difference: Callable[[Any, Any, Case], str] | None = None,
                       neutral_hint: str = "") -> list:
    """Run `fn` on every case and compare with `reference`; raise ExerciseError at the first
    case that differs (`raise_first_difference`). `read` turns the learner's return value
    into what is compared (raising ExerciseError for a value of the wrong kind). Returns the
    learner's answers, one per case."""
    answers = [read(attempt(exercise, fn, *case.args), case) for case in cases]
    wants = [reference(*case.args) for case in cases]
    raise_first_difference(exercise, cases, answers, wants, slips=slips, same=same,
                           difference=difference, neutral_hint=neutral_hint)
    return answers


def raise_first_difference(exercise: str, cases: Sequence[Case], answers: Sequence,
                           wants: Sequence, *, slips: Sequence[Slip] = (), same=equal,
                           difference: Callable[[Any, Any, Case], str] | None = None,
                           neutral_hint: str = "") -> None:
    """Raise ExerciseError at the first case whose answer differs from the reference's,
    naming a slip only when `slip_reproduced` finds it; `difference(got, want, case)` says
    where they differ (`number_difference` or `array_difference` by default), and
    `neutral_hint` ends a message that names no slip. Nothing when every answer agrees."""
    bad = next((i for i, (got, want) in enumerate(zip(answers, wants))
                if not same(got, want)), None)
    if bad is None:
        return
    case, got, want = cases[bad], answers[bad], wants[bad]
    if difference is not None:
        where = difference(got, want, case)
    else:
        where = (number_difference if np.ndim(want) == 0 else array_difference)(got, want)
    slip = slip_reproduced(slips, cases, answers, wants, same)
    hint = f" Hint: {slip.says(case, got, want)}" if slip else (
        f" {neutral_hint}" if neutral_hint else "")
    raise ExerciseError(exercise, f"{case.label}: {where}.{hint}")


def differing_digits(a: float, b: float, least: int = 8) -> tuple[str, str]:
    """`a` and `b` with the fewest significant digits (at least `least`, at most 17) that
    print them differently; equal numbers print alike."""
    for digits in range(least, 18):
        x, y = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if x != y:
            return x, y
    return f"{a:.17g}", f"{b:.17g}"
