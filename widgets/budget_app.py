"""The budget calculator as a page of its own: `python -m widgets.budget_app`.

Serves `BudgetWidget` with Voila (the optional extra `app`:
`pip install -e '.[app]'`): a web page with only the calculator, no code
and no notebook around it, on http://127.0.0.1:8866 by default. The page is
a two-cell notebook written into a temporary folder at start and removed at
exit; only a preset name chosen from `engine.budget.PRESET_NAMES` goes into
it.

    python -m widgets.budget_app                  # opens the browser
    python -m widgets.budget_app --preset llama2-7b --port 8870 --no-browser
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from engine import budget as B

ROOT = Path(__file__).resolve().parents[1]
PAGE = "budget.ipynb"


def write_page(folder: Path, preset: str) -> Path:
    """The notebook Voila renders: the widget at `preset`, nothing else."""
    import nbformat
    if preset not in B.PRESET_NAMES:
        raise B.BudgetError(f"unknown preset {preset!r}; allowed: {', '.join(B.PRESET_NAMES)}.")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from widgets.budget import BudgetWidget"),
                nbformat.v4.new_code_cell(f"BudgetWidget(preset={preset!r}).ui")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    path = folder / PAGE
    nbformat.write(nb, path)
    return path


def voila_command(page: Path, port: int, open_browser: bool) -> list[str]:
    return [sys.executable, "-m", "voila", str(page), f"--port={port}",
            "--Voila.ip=127.0.0.1", "--strip_sources=True", "--theme=light",
            *([] if open_browser else ["--no-browser"])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m widgets.budget_app",
                                 description="The training-step budget calculator as a "
                                             "standalone page (Voila).")
    ap.add_argument("--preset", default="gpt2-small", choices=B.PRESET_NAMES,
                    help="the configuration the page starts from (default: gpt2-small)")
    ap.add_argument("--port", type=int, default=8866, help="port on 127.0.0.1 (default 8866)")
    ap.add_argument("--no-browser", action="store_true", help="only serve; open no browser")
    args = ap.parse_args(argv)
    if not 0 < args.port < 65536:
        ap.error(f"--port {args.port}: choose a port between 1 and 65535, e.g. 8866")
    try:
        import voila  # noqa: F401
    except ImportError:
        print("error: the standalone page needs Voila, the optional extra 'app': "
              "pip install -e '.[app]' (or: make budget-app, which installs it).",
              file=sys.stderr)
        return 2
    folder = Path(tempfile.mkdtemp(prefix="budget-app-"))
    try:
        page = write_page(folder, args.preset)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        print(f"the budget calculator: http://127.0.0.1:{args.port}/ (Ctrl-C stops it)",
              flush=True)
        try:
            return subprocess.call(voila_command(page, args.port, not args.no_browser),
                                   cwd=folder, env=env)
        except KeyboardInterrupt:
            return 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
