"""Helpers the notebook tests share: where lessons live and how to run them."""
from __future__ import annotations

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
