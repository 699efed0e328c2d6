"""Checks for lesson 04, "Gradient checking".

The exercises build a gradient checker from parts and put it to work:
04.1 the central difference of one element, 04.2 the relative and absolute
error with a floor, 04.3 spot checks on random indices, 04.4 the step eps
where truncation and rounding error balance, 04.5 fair checks of a correct
gradient (away from a kink, one dropout mask), 04.6 the local-to-global walk
that names the most local failing part of a network. Each check feeds the learner's
function cases where a typical wrong answer gives itself away (a forward
difference, a missing floor, relative error alone); 04.4 to 04.6 run the lesson's
cases beside seeded generated ones and name a slip only when its reproduction gives
the learner's answer on every case it gets wrong (`coursework._cases`).

Each exercise's check lives in a module of its own (partial.py, errors.py,
spot.py, step.py, fair.py, localize.py); this package gathers the names the
notebook uses, so it reads `lesson04.check_spot_check(spot_check)`.
"""
from __future__ import annotations

from .. import _core
from .errors import EX_ERRORS, check_gradient_errors
from .fair import EX_FAIR, check_fair_checks
from .localize import EX_LOCAL, LEVELS, Part, check_localize, check_part, network_parts
from .partial import EX_PARTIAL, check_numerical_partial
from .spot import EX_SPOT, check_spot_check
from .step import EX_STEP, check_best_step

__all__ = ["check_numerical_partial", "check_gradient_errors", "check_spot_check",
           "check_best_step", "check_fair_checks", "check_localize", "network_parts",
           "check_part", "Part", "LEVELS", "EXERCISE_FUNCTIONS", "name_unfinished_exercises"]

#: Each exercise function of the lesson, and its exercise.
EXERCISE_FUNCTIONS = {"numerical_partial": EX_PARTIAL, "gradient_errors": EX_ERRORS,
                      "spot_check": EX_SPOT, "best_step": EX_STEP, "away_from_kink": EX_FAIR,
                      "same_mask": EX_FAIR, "localize": EX_LOCAL}


def name_unfinished_exercises() -> None:
    """In the notebook, a cell that needs an unfinished exercise of this lesson says which."""
    _core.name_unfinished_exercises(EXERCISE_FUNCTIONS)
