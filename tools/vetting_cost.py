"""What vetting a learner's pieces in a child process costs a lesson's Run All.

Runs solution notebooks top to bottom (as `make test` does: cwd course/solutions, the
pieces in a fresh temporary folder) in alternating rounds, once as they are and once with
vetting switched off (a first hidden cell makes `_vetting` answer "passed" without a
child). Prints, per notebook, the median wall time of each and the median of the
per-round differences, and the cells whose time changed most.

    python tools/vetting_cost.py 13 --rounds 3
    python tools/vetting_cost.py 10 11 12 13 --rounds 2

Run it on a quiet machine: the differences are a few seconds in a minute.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "course" / "solutions"
VETTING_OFF = """\
import coursework._vetting as _v, coursework.pieces as _p
_v.vet = _p.vet = lambda *args, **kwargs: None
_v.vet_ahead = _p.vet_ahead = lambda *args, **kwargs: None
"""


def run_once(path: Path, vetting: bool) -> tuple[float, list[float]]:
    """(wall seconds, seconds per code cell) of one Run All of the notebook at `path`."""
    nb = nbformat.read(path, as_version=4)
    if not vetting:
        nb.cells.insert(0, nbformat.v4.new_code_cell(VETTING_OFF))
    client = NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(SOLUTIONS)}})
    start = time.perf_counter()
    client.execute()
    wall = time.perf_counter() - start
    cells = [c for c in nb.cells if c.cell_type == "code"][0 if vetting else 1:]
    return wall, [_cell_seconds(c) for c in cells]


def _cell_seconds(cell) -> float:
    timing = cell.metadata.get("execution", {})
    try:
        begin = datetime.fromisoformat(timing["iopub.execute_input"].replace("Z", "+00:00"))
        end = datetime.fromisoformat(timing["shell.execute_reply"].replace("Z", "+00:00"))
        return (end - begin).total_seconds()
    except (KeyError, ValueError):
        return float("nan")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lessons", nargs="+", help="two-digit lesson numbers, e.g. 13")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    for lesson in args.lessons:
        matches = sorted(SOLUTIONS.glob(f"{lesson}_*.ipynb"))
        if not matches:
            sys.exit(f"no solution notebook for lesson {lesson!r} in {SOLUTIONS}")
        path = matches[0]
        on, off, cells_on, cells_off = [], [], [], []
        for r in range(args.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            for vetting in order:
                wall, cells = run_once(path, vetting)
                (on if vetting else off).append(wall)
                (cells_on if vetting else cells_off).append(cells)
                print(f"  {path.name} round {r + 1} vetting {'on ' if vetting else 'off'}: "
                      f"{wall:.1f} s", flush=True)
        diffs = [a - b for a, b in zip(on, off)]
        print(f"{path.name}: vetting on {statistics.median(on):.1f} s, off "
              f"{statistics.median(off):.1f} s, difference per round median "
              f"{statistics.median(diffs):+.1f} s (range {min(diffs):+.1f} to {max(diffs):+.1f})")
        per_cell = [statistics.median(a - b for a, b in zip(x, y))
                    for x, y in zip(zip(*cells_on), zip(*cells_off))]
        worst = sorted(range(len(per_cell)), key=lambda i: -abs(per_cell[i]))[:5]
        for i in worst:
            print(f"    code cell {i + 1}: {per_cell[i]:+.2f} s")


if __name__ == "__main__":
    main()
