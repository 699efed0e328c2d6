"""tools/build_course.py: never replaces a learner's work, writes the start page,
and a failed check shows its own message alone.

The overwrite tests build a one-lesson course in a temporary folder (the module's
folder constants pointed there), so the real course/ is never touched."""
from __future__ import annotations

import json
import re

import nbformat
import pytest

from notebook_tools import ROOT, build_course, git_show, in_git_checkout, lesson_stems

LESSON = ("# %% [markdown]\n# # 00 · A tiny lesson\n"
          "# %%\ndef double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION\n")


@pytest.fixture
def course(tmp_path, monkeypatch):
    """A course folder with one lesson source, the build tool pointed at it."""
    course = tmp_path / "course"
    (course / "source").mkdir(parents=True)
    (course / "source" / "00_tiny.py").write_text(LESSON)
    (course / "source" / "start_here.md").write_text("# Start here\n")
    for name, value in {"ROOT": tmp_path, "COURSE": course, "SOURCE": course / "source",
                        "SOLUTIONS": course / "solutions", "BACKUPS": course / "backups",
                        "START_PAGE": course / "00_start_here.ipynb",
                        "START_PAGE_SOURCE": course / "source" / "start_here.md"}.items():
        monkeypatch.setattr(build_course, name, value)
    assert build_course.main(["--student-only"]) == 0
    return course


def _edit(path):
    nb = nbformat.read(path, as_version=4)
    nb.cells[-1].source = "def double(x):\n    return x + x  # my answer"
    nbformat.write(nb, path)
    return path.read_text()


def test_rebuild_replaces_an_untouched_notebook_even_after_running_it(course):
    student = course / "00_tiny.ipynb"
    nb = nbformat.read(student, as_version=4)
    nb.cells[-1].outputs = [nbformat.v4.new_output("stream", text="ran\n")]
    nb.metadata["language_info"]["version"] = "3.11"  # what JupyterLab adds on save
    nbformat.write(nb, student)
    assert build_course.main(["--student-only"]) == 0
    assert student.read_text() == build_course.student_notebook_text(LESSON, "00_tiny")
    assert not (course / "backups").exists()


def test_rebuild_refuses_to_replace_an_edited_notebook(course, capsys):
    student = course / "00_tiny.ipynb"
    mine = _edit(student)
    assert build_course.main(["--student-only"]) == 3
    err = capsys.readouterr().err
    assert "course/00_tiny.ipynb" in err and "FORCE=1" in err, err
    assert student.read_text() == mine, "the learner's notebook was changed"


def test_forced_rebuild_keeps_the_edited_notebook_as_a_backup(course):
    student = course / "00_tiny.ipynb"
    mine = _edit(student)
    assert build_course.main(["--student-only", "--force"]) == 0
    backups = list((course / "backups").glob("00_tiny-*.ipynb"))
    assert len(backups) == 1 and backups[0].read_text() == mine
    assert student.read_text() == build_course.student_notebook_text(LESSON, "00_tiny")


def test_an_unreadable_notebook_counts_as_edited(course):
    (course / "00_tiny.ipynb").write_text("{ half a notebook")
    assert build_course.main(["--student-only"]) == 3
    assert (course / "00_tiny.ipynb").read_text() == "{ half a notebook"


def test_every_student_notebook_starts_with_how_to_work(course):
    nb = json.loads((course / "00_tiny.ipynb").read_text())
    how_to = "".join(nb["cells"][1]["source"])
    assert nb["cells"][0]["source"][0].startswith("# 00 · A tiny lesson")
    assert "Run the cells in order" in how_to and "# CHECK" in how_to
    assert "`pytest --nbval 00_tiny.ipynb`" in how_to and "solutions/00_tiny.ipynb" in how_to


def test_start_page_lists_the_lessons_in_order():
    text = "".join(nbformat.reads(build_course.start_page_text(), as_version=4).cells[0].source)
    listed = re.findall(r"\]\(([0-9][0-9]_\w+)\.ipynb\)", text)
    assert listed == lesson_stems()
    for word in ("solutions/", "source/", "pytest --nbval", "# CHECK"):
        assert word in text, f"the start page does not explain {word!r}"
    assert build_course.START_PAGE.name < min(f"{s}.ipynb" for s in lesson_stems()), (
        "the start page must sort before lesson 00 in the file browser")


@pytest.mark.skipif(not in_git_checkout(), reason="staleness is judged against HEAD")
def test_committed_start_page_is_fresh():
    committed = git_show("course/00_start_here.ipynb")
    assert committed == build_course.start_page_text(), (
        "course/00_start_here.ipynb is stale: run `make course LESSONS=00` and commit it")


def test_make_lab_opens_the_start_page():
    makefile = (ROOT / "Makefile").read_text()
    assert f"default_url=/lab/tree/{build_course.START_PAGE.name}" in makefile


def test_a_failed_check_renders_as_its_message_alone():
    from coursework import ExerciseError
    err = ExerciseError("00.1 (demo)", "not done yet. Hint: read the cell above.")
    shown = err._render_traceback_()
    assert len(shown) == 1 and "ExerciseError" in shown[0]
    assert shown[0].endswith("Exercise 00.1 (demo): not done yet. Hint: read the cell above.")
    assert isinstance(err, AssertionError)  # still a failure for pytest and nbval


def test_nbval_markers_become_cell_tags_the_learner_does_not_see(tmp_path):
    source = ("# %% [markdown]\n# # 00 · Tags\n"
              "# %%\n# NBVAL_IGNORE_OUTPUT\nimport time\nprint(time.time())\n"
              "# %%\nprint(1)\n")
    nb = nbformat.reads(build_course.student_notebook_text(source, "00_tags"), as_version=4)
    timed, plain = [c for c in nb.cells if c.cell_type == "code"]
    assert timed.source == "import time\nprint(time.time())"
    assert timed.metadata["tags"] == ["nbval-ignore-output"]
    assert "tags" not in plain.metadata
    # nbval reads the tag as it read the comment: the output is not compared
    from nbval.plugin import find_metadata_tags
    assert dict(find_metadata_tags(timed.metadata)) == {"check": False}


def test_no_committed_notebook_shows_an_nbval_marker():
    for path in sorted((ROOT / "course").rglob("*.ipynb")):
        if "backups" in path.parts or ".ipynb_checkpoints" in path.parts:
            continue
        for cell in nbformat.read(path, as_version=4).cells:
            assert "NBVAL_" not in cell.source, f"{path.name}: a cell shows an nbval marker"
