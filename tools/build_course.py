"""Build the course notebooks from their single source of truth.

Each lesson is written once, as `course/source/NN_topic.py` in the "percent"
format (`# %%` starts a code cell, `# %% [markdown]` a markdown cell whose
lines are comments). Exercise answers sit between `### BEGIN SOLUTION` and
`### END SOLUTION`. From that source this script writes

* `course/NN_topic.ipynb`: the student notebook, each answer replaced by
  `# YOUR CODE HERE` + `raise NotImplementedError()`, no outputs, and a short
  "how to work through this notebook" cell after the title;
* `course/solutions/NN_topic.ipynb`: the full notebook, executed, which
  `pytest --nbval` replays and compares.

A student notebook is a learner's work: the build refuses to replace one whose
cells differ from what the build last wrote (it keeps a fingerprint of its
cells in the notebook's metadata), before executing anything. `--force`
(`make course FORCE=1`) first moves the learner's version to
`course/backups/NN_topic-<time>.ipynb`, so nothing a learner wrote is lost.

Usage: python tools/build_course.py [--force] [NN ...]   (no argument: every lesson)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
COURSE = ROOT / "course"
SOURCE = COURSE / "source"
SOLUTIONS = COURSE / "solutions"
BACKUPS = COURSE / "backups"
START_PAGE_SOURCE = SOURCE / "start_here.md"
START_PAGE = COURSE / "00_start_here.ipynb"  # sorts before lesson 00; `make lab` opens it
STAMP_KEY = "course_build"  # notebook metadata: the fingerprint of the cells as built

SOLUTION_BLOCK = re.compile(
    r"^([ \t]*)### BEGIN SOLUTION[ \t]*\n.*?^[ \t]*### END SOLUTION[ \t]*(\n|$)", re.M | re.S)
CELL_START = re.compile(r"^# %%(?P<rest>.*)$")
CHECK_MARK = re.compile(r"^# CHECK (?P<id>\d\d\.\d+)\b", re.M)
# nbval reads a cell's instructions from a comment line or from the cell's tags. The
# sources use the comment (it reads well in a .py file); the notebooks get the tag, so
# the learner sees code, not instructions for the test runner.
NBVAL_TAGS = {"# NBVAL_IGNORE_OUTPUT": "nbval-ignore-output", "# NBVAL_SKIP": "nbval-skip",
              "# NBVAL_RAISES_EXCEPTION": "raises-exception",
              "# NBVAL_CHECK_OUTPUT": "nbval-check-output"}


def lesson_sources(selected=None) -> list[Path]:
    paths = sorted(SOURCE.glob("[0-9][0-9]_*.py"))
    if selected:
        paths = [p for p in paths if p.name[:2] in selected]
    return paths


def parse_cells(text: str) -> list[tuple[str, str]]:
    """Split percent-format text into (kind, source) pairs."""
    cells: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        m = CELL_START.match(line)
        if m:
            kind = "markdown" if "[markdown]" in m.group("rest") else "code"
            cells.append((kind, []))
        elif cells:
            cells[-1][1].append(line)
        elif line.strip() and not line.startswith("#"):
            raise ValueError(f"code before the first '# %%' cell marker: {line!r}")
    out = []
    for kind, lines in cells:
        if kind == "markdown":
            lines = [ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in lines]
        src = "\n".join(lines).strip("\n")
        if src:
            out.append((kind, src))
    return out


def strip_solutions(source: str) -> str:
    """Replace every solution block with the stub a learner starts from."""
    return SOLUTION_BLOCK.sub(
        lambda m: f"{m.group(1)}# YOUR CODE HERE\n{m.group(1)}raise NotImplementedError()\n",
        source).rstrip("\n")


def how_to_cell_text(stem: str) -> str:
    """The cell every student notebook has after its title: how to work through it."""
    return (
        "**How to work through this notebook.** Run the cells in order from the top "
        "(Shift+Enter runs one and moves on; *Run > Run All Cells* runs them all).\n"
        "\n"
        "* An exercise is a cell with `# YOUR CODE HERE` and `raise NotImplementedError()`: "
        "replace those two lines with your code and run the cell.\n"
        "* The cell after it starts with `# CHECK` and checks your answer. If it is not right "
        "yet, it stops with one red line, `ExerciseError: Exercise NN.k (...): what is wrong. "
        "Hint: ...`; fix your code, run your cell again, then the check. When it is right it "
        "prints `Exercise NN.k passed.`\n"
        "* To check the whole notebook at once, open a terminal (*File > New > Terminal*; it "
        f"starts in this folder) and run `pytest --nbval {stem}.ipynb`; it fails until every "
        "exercise is done.\n"
        f"* Stuck? `solutions/{stem}.ipynb` is the finished notebook with every output.")


def nbval_tags(source: str) -> tuple[str, list[str]]:
    """A code cell's source without its nbval comment lines, and the tags that replace them."""
    kept, tags = [], []
    for line in source.split("\n"):
        tag = NBVAL_TAGS.get(line.strip())
        if tag is None:
            kept.append(line)
        elif tag not in tags:
            tags.append(tag)
    return "\n".join(kept).strip("\n"), tags


def cells_fingerprint(nb: nbformat.NotebookNode) -> str:
    """sha256 of the cells' kinds and sources: what a learner edits (outputs are
    regenerated by running, so running cells is not an edit)."""
    cells = [[c.get("cell_type"), c.get("source")] for c in nb.cells]
    return hashlib.sha256(json.dumps(cells).encode()).hexdigest()


def make_notebook(cells: list[tuple[str, str]], student: bool,
                  stem: str | None = None) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    }
    for i, (kind, src) in enumerate(cells):
        if kind == "markdown":
            cell = nbformat.v4.new_markdown_cell(src)
        else:
            code, tags = nbval_tags(strip_solutions(src) if student else src)
            cell = nbformat.v4.new_code_cell(code)
            if tags:
                cell.metadata["tags"] = tags
        cell["id"] = f"cell-{i:03d}"  # stable ids keep rebuilds byte-identical
        nb.cells.append(cell)
        if student and stem and i == 0:
            how_to = nbformat.v4.new_markdown_cell(how_to_cell_text(stem))
            how_to["id"] = "how-to-work"
            nb.cells.append(how_to)
    if student:
        nb.metadata[STAMP_KEY] = {"cells_sha256": cells_fingerprint(nb)}
    return nb


def student_notebook_text(source_text: str, stem: str | None = None) -> str:
    """The student notebook as written to disk (`stem` names the lesson in the how-to cell)."""
    nb = make_notebook(parse_cells(source_text), student=True, stem=stem)
    return nbformat.writes(nb) + "\n"


def _committed_text(path: Path) -> str | None:
    """The git HEAD version of a file, or None (not committed, or no git)."""
    try:
        rel = path.resolve().relative_to(ROOT)
        result = subprocess.run(["git", "show", f"HEAD:{rel.as_posix()}"], cwd=ROOT,
                                capture_output=True, text=True)
    except (OSError, ValueError):
        return None
    return result.stdout if result.returncode == 0 else None


def learner_edited(path: Path, new_text: str) -> bool:
    """True if the student notebook at `path` holds cells the build did not write.

    Unchanged means: missing, identical to what the build writes now, or its cells
    still match the fingerprint the build stored in it (or, for a notebook built
    before fingerprints, identical to the committed version)."""
    if not path.exists():
        return False
    text = path.read_text(errors="replace")
    if text == new_text:
        return False
    try:
        nb = nbformat.reads(text, as_version=4)
    except Exception:  # unreadable: certainly not what the build wrote
        return True
    stamp = nb.metadata.get(STAMP_KEY, {}).get("cells_sha256")
    if stamp is not None:
        return stamp != cells_fingerprint(nb)
    return text != _committed_text(path)


def back_up(path: Path) -> Path:
    """Move a learner's notebook to course/backups/<stem>-<time>.ipynb."""
    BACKUPS.mkdir(exist_ok=True)
    target = BACKUPS / f"{path.stem}-{time.strftime('%Y%m%d-%H%M%S')}.ipynb"
    n = 1
    while target.exists():
        target = BACKUPS / f"{path.stem}-{time.strftime('%Y%m%d-%H%M%S')}-{n}.ipynb"
        n += 1
    path.replace(target)
    return target


def check_ids(source_text: str) -> list[str]:
    """The exercise ids of the `# CHECK NN.k` cells, in order."""
    return [m.group("id") for m in CHECK_MARK.finditer(source_text)]


def lesson_title(source_text: str) -> str:
    """"Why backprop" from a source whose first heading is "# 00 · Why backprop"."""
    for kind, src in parse_cells(source_text):
        if kind == "markdown":
            first = src.splitlines()[0].lstrip("# ").strip()
            return first.split("·", 1)[-1].strip()
    return ""


def start_page_text() -> str:
    """The start page notebook: course/source/start_here.md and the lesson list."""
    lines = [START_PAGE_SOURCE.read_text().rstrip("\n"), ""]
    for p in lesson_sources():
        lines.append(f"{int(p.name[:2]):2d}. [{lesson_title(p.read_text())}]({p.stem}.ipynb)"
                     f" (solved: [solutions/{p.stem}.ipynb](solutions/{p.stem}.ipynb))")
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                  "language": "python"}, "language_info": {"name": "python"}}
    cell = nbformat.v4.new_markdown_cell("\n".join(lines))
    cell["id"] = "start-here"
    nb.cells.append(cell)
    return nbformat.writes(nb) + "\n"


def execute(nb: nbformat.NotebookNode, cwd: Path, allow_errors: bool = False,
            timeout: int = 900) -> nbformat.NotebookNode:
    from nbclient import NotebookClient
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            allow_errors=allow_errors,
                            resources={"metadata": {"path": str(cwd)}})
    client.execute()
    for cell in nb.cells:  # wall-clock metadata would make every build differ
        cell.metadata.pop("execution", None)
    return nb


def build(path: Path, execute_solution: bool = True, force: bool = False) -> None:
    text = path.read_text()
    stem = path.stem
    student = COURSE / f"{stem}.ipynb"
    student_text = student_notebook_text(text, stem)
    if learner_edited(student, student_text):
        if not force:
            raise SystemExit(edited_refusal([student]))
        print(f"kept your edited {student.relative_to(ROOT)} as {back_up(student).relative_to(ROOT)}")
    student.write_text(student_text)
    if execute_solution:
        SOLUTIONS.mkdir(exist_ok=True)
        t0 = time.perf_counter()
        nb = execute(make_notebook(parse_cells(text), student=False), cwd=SOLUTIONS)
        (SOLUTIONS / f"{stem}.ipynb").write_text(nbformat.writes(nb) + "\n")
        print(f"built {stem}: solution executed in {time.perf_counter() - t0:.1f} s")
    else:
        print(f"built {stem}: student notebook only")


def edited_refusal(paths: list[Path]) -> str:
    names = ", ".join(str(p.relative_to(ROOT)) for p in paths)
    lessons = " ".join(p.name[:2] for p in paths)
    return (f"make course: not replacing {names}: it holds your edits (its cells differ from "
            f"what make course last wrote). Keep it under another name, or run "
            f"`make course LESSONS=\"{lessons}\" FORCE=1`, which first moves your version to "
            f"course/backups/ and then rebuilds.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lessons", nargs="*", help="two-digit lesson numbers (default: all)")
    ap.add_argument("--student-only", action="store_true",
                    help="write the student notebooks without executing the solutions")
    ap.add_argument("--force", action="store_true",
                    help="replace edited student notebooks, moving them to course/backups/ first")
    args = ap.parse_args(argv)
    paths = lesson_sources(set(args.lessons))
    if not paths:
        print(f"no lesson sources match {args.lessons} in {SOURCE}", file=sys.stderr)
        return 2
    edited = [COURSE / f"{p.stem}.ipynb" for p in paths
              if learner_edited(COURSE / f"{p.stem}.ipynb",
                                student_notebook_text(p.read_text(), p.stem))]
    if edited and not args.force:  # found before any lesson is executed
        print(edited_refusal(edited), file=sys.stderr)
        return 3
    for p in paths:
        build(p, execute_solution=not args.student_only, force=args.force)
    START_PAGE.write_text(start_page_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
