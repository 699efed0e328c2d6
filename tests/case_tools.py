"""Test helpers for checks built on `coursework._cases`: each named slip's reproduction,
fed to its check as a learner's answer, gets that slip's own hint."""
import pytest

from coursework import ExerciseError
from coursework._cases import slip_reproduced


def assert_each_slip_named(check, cases, slips, reference, same=None):
    """Feed every slip's reproduction to `check` and assert the message carries the hint of
    the slip `slip_reproduced` finds for it, written at the first case where it differs."""
    kwargs = {} if same is None else {"same": same}
    for slip in slips:
        answers = [slip.reproduce(*case.args) for case in cases]
        wants = [reference(*case.args) for case in cases]
        named = slip_reproduced(slips, cases, answers, wants, **kwargs)
        assert named is not None
        is_same = same or (lambda a, b: a == b)
        bad = next(i for i, (case, answer) in enumerate(zip(cases, answers))
                   if not is_same(answer, reference(*case.args)))
        with pytest.raises(ExerciseError) as info:
            check(slip.reproduce)
        hint = named.says(cases[bad], answers[bad], reference(*cases[bad].args))
        assert hint in str(info.value), (hint, str(info.value))
