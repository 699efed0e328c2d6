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


def run_judging_unfinished_exercises(stem: str, functions: dict[str, str]) -> list:
    """`run_without_the_exercises`, asserting that each cell either runs or, when it names
    one of the exercise `functions` ({name: exercise id}), says in one line which exercise
    to finish. Returns the executed cells."""
    cells = run_without_the_exercises(stem, ROOT / "course")
    for cell in cells:
        needs = [ex for name, ex in functions.items() if re.search(rf"\b{name}\b", cell.source)]
        errors = cell_errors(cell)
        if not needs:
            assert not errors, f"{cell.source[:200]}\n{errors and errors[0]['evalue']}"
            continue
        assert errors, f"{cell.source[:200]}\nran without the exercise it names"
        error = errors[0]
        assert error["ename"] == "UnfinishedExercise" and len(error["traceback"]) == 1, (
            f"{cell.source[:200]}\n{error['ename']}: {error['evalue']}")
        assert any(f"finish exercise {ex} first" in error["evalue"] for ex in needs)
    return cells
