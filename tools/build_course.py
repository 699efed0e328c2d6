"""Build the course notebooks from their single source of truth.

Each lesson is written once, as `course/source/NN_topic.py` in the "percent"
format (`# %%` starts a code cell, `# %% [markdown]` a markdown cell whose
lines are comments). Exercise answers sit between `### BEGIN SOLUTION` and
`### END SOLUTION`. From that source this script writes

* `course/NN_topic.ipynb`: the student notebook, each answer replaced by
  `# YOUR CODE HERE` + `raise NotImplementedError()`, no outputs;
* `course/solutions/NN_topic.ipynb`: the full notebook, executed, which
  `pytest --nbval` replays and compares.

Usage: python tools/build_course.py [NN ...]   (no argument: every lesson)
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
COURSE = ROOT / "course"
SOURCE = COURSE / "source"
SOLUTIONS = COURSE / "solutions"

SOLUTION_BLOCK = re.compile(
    r"^([ \t]*)### BEGIN SOLUTION[ \t]*\n.*?^[ \t]*### END SOLUTION[ \t]*(\n|$)", re.M | re.S)
CELL_START = re.compile(r"^# %%(?P<rest>.*)$")
CHECK_MARK = re.compile(r"^# CHECK (?P<id>\d\d\.\d+)\b", re.M)


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


def make_notebook(cells: list[tuple[str, str]], student: bool) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    }
    for i, (kind, src) in enumerate(cells):
        if kind == "markdown":
            cell = nbformat.v4.new_markdown_cell(src)
        else:
            cell = nbformat.v4.new_code_cell(strip_solutions(src) if student else src)
        cell["id"] = f"cell-{i:03d}"  # stable ids keep rebuilds byte-identical
        nb.cells.append(cell)
    return nb


def student_notebook_text(source_text: str) -> str:
    return nbformat.writes(make_notebook(parse_cells(source_text), student=True)) + "\n"


def check_ids(source_text: str) -> list[str]:
    """The exercise ids of the `# CHECK NN.k` cells, in order."""
    return [m.group("id") for m in CHECK_MARK.finditer(source_text)]


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


def build(path: Path, execute_solution: bool = True) -> None:
    text = path.read_text()
    stem = path.stem
    (COURSE / f"{stem}.ipynb").write_text(student_notebook_text(text))
    if execute_solution:
        SOLUTIONS.mkdir(exist_ok=True)
        t0 = time.perf_counter()
        nb = execute(make_notebook(parse_cells(text), student=False), cwd=SOLUTIONS)
        (SOLUTIONS / f"{stem}.ipynb").write_text(nbformat.writes(nb) + "\n")
        print(f"built {stem}: solution executed in {time.perf_counter() - t0:.1f} s")
    else:
        print(f"built {stem}: student notebook only")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lessons", nargs="*", help="two-digit lesson numbers (default: all)")
    ap.add_argument("--student-only", action="store_true",
                    help="write the student notebooks without executing the solutions")
    args = ap.parse_args(argv)
    paths = lesson_sources(set(args.lessons))
    if not paths:
        print(f"no lesson sources match {args.lessons} in {SOURCE}", file=sys.stderr)
        return 2
    for p in paths:
        build(p, execute_solution=not args.student_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
