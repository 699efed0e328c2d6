"""coursework._cases: a check names a slip only when the slip's reproduction gives the
learner's answer on every case; otherwise it says where the answer differs, with no cause."""
import numpy as np
import pytest

from coursework import ExerciseError
from coursework._cases import (Case, Slip, array_difference, compare_over_cases,
                               number_difference, slip_reproduced)

CASES = [Case((n,), f"double({n})") for n in (0, 1, 2, 5, 7)]
TRIPLE = Slip(lambda n: 3 * n, "you tripled.")
SQUARE = Slip(lambda n: n * n, "you squared.")


def run(fn, slips=(TRIPLE, SQUARE)):
    with pytest.raises(ExerciseError) as info:
        compare_over_cases("99.1 (double)", fn, lambda n: 2 * n, CASES, slips=slips,
                           neutral_hint="Look again.")
    return str(info.value)


def test_a_right_answer_passes_and_its_answers_come_back():
    assert compare_over_cases("99.1 (double)", lambda n: n + n, lambda n: 2 * n,
                              CASES) == [0, 2, 4, 10, 14]


def test_a_slip_reproduced_on_every_case_is_named():
    assert "you tripled." in run(lambda n: 3 * n)


def test_a_slip_made_on_some_cases_only_is_still_named():
    assert "you tripled." in run(lambda n: 3 * n if n > 4 else 2 * n)


def test_an_answer_equal_to_a_slip_on_the_failing_case_only_is_not_named():
    # this answer is the square at n = 1 (where the check first fails) but not at n = 5,
    # where it is wrong too: no slip the check reproduced
    message = run(lambda n: n * n if n < 5 else 2 * n + 1)
    assert "squared" not in message and "tripled" not in message
    assert message == ("Exercise 99.1 (double): double(1): you have 1, the reference has 2 "
                       "(yours is -1 off). Look again.")


def test_a_reproduction_that_cannot_run_does_not_match():
    def fussy(n):
        if n == 1:
            raise ValueError("shapes")
        return 3 * n
    answers = [3 * case.args[0] for case in CASES]
    wants = [2 * case.args[0] for case in CASES]
    assert slip_reproduced([Slip(fussy, "x")], CASES, answers, wants) is None
    assert slip_reproduced([Slip(fussy, "x"), TRIPLE], CASES, answers, wants) is TRIPLE


def test_differences_name_the_entry_and_the_gap_in_units():
    assert number_difference(3000, 2020, "bytes") == (
        "you have 3,000 bytes, the reference has 2,020 bytes (yours is +980 bytes off)")
    text = array_difference(np.array([[1.0, 2.0], [3.0, 4.5]]), np.array([[1.0, 2.0],
                                                                         [3.0, 4.0]]))
    assert text.startswith("entry (1, 1) is 4.5 where the reference has 4.0 (off by +0.5)")
    assert "1 of 4 entries differ" in text


def test_an_array_difference_can_name_its_reference_and_print_the_digits_that_differ():
    got, want = np.array([0.1234567891, 2.0]), np.array([0.1234599999, 2.0 + 1e-10])
    assert array_difference(got, want) == (
        "entry (0,) is 0.1234567891 where the reference has 0.1234599999 (off by -3.21e-06); "
        "2 of 2 entries differ")
    assert array_difference(got, want, theirs="the plain backward has", digits=4, rtol=1e-9) \
        == ("entry (0,) is 0.123457 where the plain backward has 0.12346 (off by -3.21e-06); "
            "1 of 2 entries differ")
    assert array_difference(got[:1], want, theirs="the plain backward has") == (
        "your result has shape (1,), the plain backward has shape (2,)")
