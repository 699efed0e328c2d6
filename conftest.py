"""Project-wide pytest settings, also used by `pytest --nbval course/...`.

nbval replays a notebook and compares each cell's text output with the stored
one. Two things would make honest notebooks fail, so we adjust narrowly:
* stderr (warnings, progress bars from libraries) is not compared;
* the patterns in tests/nbval_sanitize.cfg blank out object addresses and
  timings; every other printed number is compared exactly.
Passed exercises are saved as pieces; under pytest they go to a temporary
folder, even when BACKPROP_PIECES_DIR is set, so tests never touch the
learner's own pieces. OpenMP threads wait asleep, not spinning (two test workers
share the cores), because engine/numba_config.py asks for it wherever the engine is
imported, and the lessons import it first.
"""
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"


def pytest_configure(config):
    opt = config.option
    if hasattr(opt, "nbval_sanitize_with") and opt.nbval_sanitize_with is None:
        opt.nbval_sanitize_with = str(SANITIZE)
    # Always a folder of the test run's own, even where the learner set the variable
    # to keep their pieces: a test worker keeps the one its controller made.
    if "PYTEST_XDIST_WORKER" not in os.environ or "BACKPROP_PIECES_DIR" not in os.environ:
        os.environ["BACKPROP_PIECES_DIR"] = tempfile.mkdtemp(prefix="backprop-pieces-")
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        notebook = getattr(item, "parent", None)
        skip = getattr(notebook, "skip_compare", None)
        if skip is not None and "stderr" not in skip:
            notebook.skip_compare = tuple(skip) + ("stderr",)
