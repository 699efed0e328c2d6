"""Helpers the notebook tests share: where lessons live and how to run them."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import build_course  # noqa: E402  (tools/ is not a package)


def lesson_stems() -> list[str]:
    return [p.stem for p in build_course.lesson_sources()]


def git_show(path: str) -> str | None:
    """The committed (HEAD) text of a repository file, or None if not committed."""
    result = subprocess.run(["git", "show", f"HEAD:{path}"], cwd=ROOT,
                            capture_output=True, text=True)
    return result.stdout if result.returncode == 0 else None


def in_git_checkout() -> bool:
    return subprocess.run(["git", "rev-parse", "--git-dir"], cwd=ROOT,
                          capture_output=True).returncode == 0


def run_without_the_exercises(stem: str, cwd: Path) -> list:
    """Lesson `stem`'s student notebook, run as a learner who skips every exercise cell
    (its stub never runs) and runs the rest, errors allowed: the executed code cells."""
    source = (ROOT / "course" / "source" / f"{stem}.py").read_text()
    nb = build_course.make_notebook(build_course.parse_cells(source), student=True)
    nb.cells = [c for c in nb.cells
                if c.cell_type == "code" and "raise NotImplementedError()" not in c.source]
    return build_course.execute(nb, cwd=cwd, allow_errors=True).cells


def cell_errors(cell) -> list:
    return [o for o in cell.outputs if o.output_type == "error"]


def cell_stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def names_exercise(cell_source: str, name: str) -> bool:
    """Whether a cell calls or names the exercise function `name` (`.backward()`, a method
    of the same name, does not count)."""
    return re.search(rf"(?<![.\w]){name}\b", cell_source) is not None


def run_judging_unfinished_exercises(stem: str, functions: dict[str, str]) -> list:
    """`run_without_the_exercises`, asserting that each cell either runs or says in one line
    which exercise to finish: a cell that names one of the exercise `functions` ({name:
    exercise id}) that exercise, a cell that needs a value an earlier cell makes with an
    exercise that earlier exercise. Returns the executed cells."""
    cells = run_without_the_exercises(stem, ROOT / "course")
    for cell in cells:
        needs = [ex for name, ex in functions.items() if names_exercise(cell.source, name)]
        errors = cell_errors(cell)
        if not errors:
            continue
        error = errors[0]
        assert error["ename"] == "UnfinishedExercise" and len(error["traceback"]) == 1, (
            f"{cell.source[:200]}\n{error['ename']}: {error['evalue']}")
        if "an earlier cell makes with your exercise" in error["evalue"]:
            # a value an earlier cell did not finish: its exercise comes first
            assert any(f"finish exercise {ex} first" in error["evalue"]
                       for ex in functions.values()), error["evalue"]
        else:
            assert any(f"finish exercise {ex} first" in error["evalue"] for ex in needs), (
                f"{cell.source[:200]}\n{error['evalue']}")
    return cells
