"""The exercise pipeline, checked end to end.

* The committed notebooks are what `make course` makes from the committed
  lesson sources (stale notebooks fail). Only what git has committed is
  compared, so a learner's edited notebook never turns `make test` red.
* Every untouched student notebook fails at each `# CHECK NN.k` cell with
  that exercise's own message ("Exercise NN.k ..."), not some other error.
* `pytest --nbval` really fails on an untouched student notebook.
The solution notebooks themselves are replayed by nbval in the same run
(`course/solutions` is on pytest's path with `--nbval`).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import nbformat
import pytest

from notebook_tools import ROOT, build_course, git_show, in_git_checkout, lesson_stems

LESSONS = lesson_stems()
pytestmark = pytest.mark.skipif(not in_git_checkout(),
                                reason="not a git checkout: staleness is judged against HEAD")


def test_there_are_lessons():
    assert LESSONS, "no lesson sources found in course/source"


@pytest.mark.parametrize("stem", LESSONS)
def test_committed_student_notebook_is_fresh(stem):
    source = git_show(f"course/source/{stem}.py")
    if source is None:
        pytest.fail(f"course/source/{stem}.py is not committed; commit it with its notebooks")
    committed = git_show(f"course/{stem}.ipynb")
    assert committed is not None, f"course/{stem}.ipynb is not committed: run `make course LESSONS={stem[:2]}` and commit it"
    assert committed == build_course.student_notebook_text(source, stem), (
        f"course/{stem}.ipynb is stale: run `make course LESSONS={stem[:2]}` and commit the result")


@pytest.mark.parametrize("stem", LESSONS)
def test_committed_solution_notebook_is_fresh(stem):
    source = git_show(f"course/source/{stem}.py")
    committed = git_show(f"course/solutions/{stem}.ipynb")
    assert source is not None and committed is not None, (
        f"lesson {stem}: source or solution notebook not committed; run `make course LESSONS={stem[:2]}`")
    nb = nbformat.reads(committed, as_version=4)
    built = build_course.make_notebook(build_course.parse_cells(source), student=False)
    want = [(c.cell_type, c.source, c.metadata.get("tags")) for c in built.cells]
    have = [(c.cell_type, c.source, c.metadata.get("tags")) for c in nb.cells]
    assert have == want, (f"course/solutions/{stem}.ipynb does not match its source: "
                          f"run `make course LESSONS={stem[:2]}` and commit the result")
    for cell in nb.cells:
        if cell.cell_type == "code":
            errors = [o for o in cell.outputs if o.get("output_type") == "error"]
            assert not errors, f"{stem}: solution cell {cell.id} raised {errors[0]['ename']}"


@pytest.mark.parametrize("stem", LESSONS)
def test_every_check_fails_on_the_untouched_student_notebook(stem):
    source = (ROOT / "course" / "source" / f"{stem}.py").read_text()
    ids = build_course.check_ids(source)
    assert ids, f"{stem} has no '# CHECK NN.k' cell; every lesson has at least one exercise"
    assert all(i.startswith(stem[:2] + ".") for i in ids), f"{stem}: check ids {ids} must start with {stem[:2]}."
    nb = build_course.make_notebook(build_course.parse_cells(source), student=True)
    build_course.execute(nb, cwd=ROOT / "course", allow_errors=True)
    seen = []
    for cell in nb.cells:
        first = cell.source.splitlines()[0] if cell.source else ""
        if cell.cell_type != "code" or not first.startswith("# CHECK "):
            continue
        exercise = first.split()[2]
        errors = [o for o in cell.outputs if o.get("output_type") == "error"]
        assert errors, f"{stem}: check {exercise} passed on the untouched student notebook"
        message = errors[0]["ename"] + ": " + errors[0]["evalue"]
        assert f"Exercise {exercise}" in message, (
            f"{stem}: check {exercise} failed with someone else's message: {message[:300]}")
        shown = "\n".join(errors[0]["traceback"])
        assert len(errors[0]["traceback"]) <= 3 and "coursework" not in shown, (
            f"{stem}: check {exercise} shows a traceback through the checker, not its "
            f"message alone: {shown[:300]}")
        seen.append(exercise)
    assert seen == ids


def test_nbval_fails_on_an_untouched_student_notebook(tmp_path):
    stem = LESSONS[0]
    target = tmp_path / f"{stem}.ipynb"
    target.write_text(build_course.student_notebook_text(
        (ROOT / "course" / "source" / f"{stem}.py").read_text(), stem))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "--nbval", str(target),
                             "-p", "no:cacheprovider"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode != 0, "nbval passed an untouched student notebook"
    assert "NotImplementedError" in result.stdout or "Exercise" in result.stdout


def test_stub_replaces_every_solution_block():
    text = ("# %%\ndef f(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION\n"
            "# %% [markdown]\n# Some *prose*.\n")
    nb = json.loads(build_course.student_notebook_text(text))
    code = "".join(nb["cells"][0]["source"])
    assert "return 2 * x" not in code
    assert "    # YOUR CODE HERE\n    raise NotImplementedError()" in code
    assert "".join(nb["cells"][1]["source"]) == "Some *prose*."


def test_building_twice_gives_identical_bytes():
    source = (ROOT / "course" / "source" / f"{LESSONS[0]}.py").read_text()
    assert build_course.student_notebook_text(source) == build_course.student_notebook_text(source)


@pytest.mark.parametrize("stem", LESSONS)
def test_a_stored_widget_output_carries_its_picture(stem):
    """Where a saved notebook cannot draw a widget (GitHub, nbconvert, an untrusted
    notebook), it shows the output's picture, or else its text form, `VBox(children=...`.
    Every widget output of a committed solution notebook carries a picture."""
    committed = git_show(f"course/solutions/{stem}.ipynb")
    assert committed is not None
    nb = nbformat.reads(committed, as_version=4)
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            text = data.get("text/plain", "")
            if "application/vnd.jupyter.widget-view+json" in data or \
                    text.startswith(("VBox(", "HBox(")):
                assert "image/png" in data, (
                    f"{stem}: a widget output without a picture: {cell.source[:120]!r}")
            assert not text.startswith("<DisplayHandle"), f"{stem}: {cell.source[:120]!r}"
