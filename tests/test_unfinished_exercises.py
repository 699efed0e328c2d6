"""Every lesson, run as a learner who has not done the exercises yet.

Each lesson's first code cell calls `lessonNN.name_unfinished_exercises()`, so that a cell
needing an unfinished exercise says which, in one line, instead of a NameError or a
NotImplementedError traceback; every cell that needs no exercise runs. Lessons 04 and 07
are judged the same way in their own test modules, with more to say about them. Lesson
07's calculator comes before its first check, so Run All on the untouched notebook
reaches it. And in every lesson, Run All on the untouched notebook makes each check say
"not done yet" for its own exercise.
"""
from __future__ import annotations

import importlib
import re

import pytest

from notebook_tools import ROOT, build_course, cell_errors, lesson_stems, \
    run_judging_unfinished_exercises

JUDGED_ELSEWHERE = ("04", "07")
STEMS = [s for s in lesson_stems() if s[:2] not in JUDGED_ELSEWHERE]


@pytest.mark.parametrize("stem", lesson_stems())
def test_every_lesson_names_its_unfinished_exercises_in_its_first_code_cell(stem):
    module = importlib.import_module(f"coursework.lesson{stem[:2]}")
    source = (ROOT / "course" / "source" / f"{stem}.py").read_text()
    first = next(c for kind, c in build_course.parse_cells(source) if kind == "code")
    assert f"lesson{stem[:2]}.name_unfinished_exercises()" in first, stem
    ids = set(build_course.check_ids(source))
    assert {ex.split()[0] for ex in module.EXERCISE_FUNCTIONS.values()} <= ids
    for kind, cell in build_course.parse_cells(source):
        for chunk in re.split(r"^(?=def |class )", cell, flags=re.M):
            name = re.match(r"def (\w+)", chunk)
            if kind == "code" and name and "### BEGIN SOLUTION" in chunk:
                assert name.group(1) in module.EXERCISE_FUNCTIONS, (stem, name.group(1))


@pytest.mark.parametrize("stem", STEMS)
def test_demonstrations_run_without_the_exercises(stem, tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path / "pieces"))
    module = importlib.import_module(f"coursework.lesson{stem[:2]}")
    run_judging_unfinished_exercises(stem, module.EXERCISE_FUNCTIONS)


def test_run_all_on_lesson_07_reaches_the_calculator(tmp_path, monkeypatch):
    """Run All stops at the first cell that fails: on the untouched notebook, a check."""
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path / "pieces"))
    stem = "07_training_step_budget"
    source = (ROOT / "course" / "source" / f"{stem}.py").read_text()
    nb = build_course.make_notebook(build_course.parse_cells(source), student=True)
    widget = next(i for i, c in enumerate(nb.cells) if "BudgetWidget(" in c.source
                  and c.cell_type == "code" and "import" not in c.source)
    first_check = next(i for i, c in enumerate(nb.cells) if c.source.startswith("# CHECK"))
    assert widget < first_check
    nb.cells = nb.cells[:widget + 1]
    ran = build_course.execute(nb, cwd=ROOT / "course", allow_errors=True).cells
    assert not any(cell_errors(c) for c in ran if c.cell_type == "code")


@pytest.mark.parametrize("stem", lesson_stems())
def test_each_check_of_the_untouched_notebook_says_not_done_yet(stem, tmp_path, monkeypatch):
    """Run All on the untouched student notebook (every stub in place, cells after the
    last check left out): each check fails with its own exercise's "not done yet", never
    with a hint about a wrong answer or someone else's error."""
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path / "pieces"))
    source = (ROOT / "course" / "source" / f"{stem}.py").read_text()
    nb = build_course.make_notebook(build_course.parse_cells(source), student=True)
    checks = [i for i, c in enumerate(nb.cells) if c.source.startswith("# CHECK ")]
    nb.cells = nb.cells[:checks[-1] + 1]
    ran = build_course.execute(nb, cwd=ROOT / "course", allow_errors=True).cells
    said = {}
    for cell in ran:
        if cell.cell_type == "code" and cell.source.startswith("# CHECK "):
            exercise = cell.source.split()[2]
            errors = cell_errors(cell)
            said[exercise] = errors[0]["evalue"] if errors else "passed"
    assert list(said) == build_course.check_ids(source)
    for exercise, message in said.items():
        assert re.match(rf"Exercise {re.escape(exercise)} \(.*?\): not done yet\.",
                        message), f"{stem} {exercise}: {message[:300]}"


# ------------------------------------------------------------------ the mechanism
@pytest.fixture()
def shell():
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    yield shell
    shell.set_custom_exc((), None)


def test_a_value_an_unfinished_exercise_left_half_made_is_named(shell, capsys):
    """A cell stopped by an unfinished exercise loses the names it made in that run (its
    half-filled list); a later cell needing one says which exercise, in one line; a name
    that existed before the cell keeps its value; unrelated errors show as usual."""
    from coursework import _core
    _core.name_unfinished_exercises({"forward": "01.1 (forward pass)"}, shell=shell)
    _core.name_unfinished_exercises({"forward": "01.1 (forward pass)"}, shell=shell)  # twice
    shell.run_cell("kept = 'mine'")
    capsys.readouterr()
    assert not shell.run_cell("sizes = []\nkept = 'overwritten?'\n"
                              "for n in (1, 2):\n    sizes.append(forward(n))").success
    stopped = capsys.readouterr().out
    assert "finish exercise 01.1 (forward pass) first" in stopped and stopped.count("\n") == 1
    assert "sizes" not in shell.user_ns and shell.user_ns["kept"] == "overwritten?"
    assert not shell.run_cell("print(len(sizes))").success
    later = capsys.readouterr().out
    assert later.count("\n") == 1 and "UnfinishedExercise" in later
    assert "finish exercise 01.1 (forward pass) first: this cell needs `sizes`, which an " \
           "earlier cell makes with your exercise" in later
    assert not shell.run_cell("undefined_thing").success
    assert "NameError" in capsys.readouterr().out
    assert shell.events.callbacks["pre_run_cell"].count(
        shell._before_each_cell_of_exercises) == 1


def test_assigned_names_are_the_cells_own():
    from coursework._core import assigned_names
    code = ("def f(x):\n    inner = 1\n    return inner\nnorms = {n: f(n) for n in (1,)}\n"
            "for a, (b, c) in []:\n    pass\nclass K:\n    attr = 2\n")
    assert {"f", "norms", "a", "b", "c", "K"} <= assigned_names(code)
    assert not {"inner", "attr", "x"} & assigned_names(code)
    assert assigned_names("%timeit 1 +") == set()
