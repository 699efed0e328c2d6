"""Whatever a piece changes in the kernel that loads it is put back, and the piece is
refused naming it; SystemExit, KeyboardInterrupt and GeneratorExit never escape
`piece_or_engine`; a fork under the guard leaves no second kernel."""
import os
import signal
import sys
import time
import warnings

import numpy as np
import pytest

from coursework import _vetting, pieces
from coursework._piece_guard import PieceRefused, guarded

from test_reliability_pieces import RIGHT, _save_raw

NAME = "central_difference_gradient"

# what a piece does -> what the refusal names
CHANGES = {
    "np.add.reduce through gc": ("import gc\ngc.get_referents(np.ufunc.__dict__)[0]['reduce'] = "
                                 "lambda *a, **k: 0\n", "`np.ufunc.reduce`"),
    "np.ndarray.sum through gc": ("import gc\ngc.get_referents(np.ndarray.__dict__)[0]['sum'] = "
                                  "lambda *a, **k: 0\n", "`np.ndarray.sum`"),
    # `engine.gradcheck` is also the name of a function the package exports: the module
    # is reached through sys.modules, as a piece would reach it
    "engine.gradcheck.relative_error": ("import sys, engine.gradcheck\n"
                                        "sys.modules['engine.gradcheck'].relative_error = "
                                        "lambda *a: 0.0\n",
                                        "`engine.gradcheck.relative_error`"),
    # ...and the package's own attribute of that name, the function, is watched as well
    "the package's engine.gradcheck": ("import engine\nengine.gradcheck = print\n",
                                       "`engine.gradcheck`"),
    "Tensor.__add__": ("from engine.tensor import Tensor\nTensor.__add__ = lambda a, b: a\n",
                       "`engine.tensor.Tensor.__add__`"),
    "numba.njit.__code__": ("import numba\nnumba.njit.__code__ = (lambda *a, **k: None).__code__\n",
                            "`numba.core.decorators.njit.__code__`"),
    "the working directory": ("import os\nos.chdir('/')\n", "the working directory"),
    "BACKPROP_PIECES_DIR": ("import os\nos.environ['BACKPROP_PIECES_DIR'] = '/tmp/elsewhere'\n",
                            "the environment variable BACKPROP_PIECES_DIR"),
    "a new environment variable": ("import os\nos.environ['PIECE_WAS_HERE'] = '1'\n",
                                   "the environment variable PIECE_WAS_HERE"),
    "the recursion limit": ("import sys\nsys.setrecursionlimit(60)\n", "the recursion limit"),
    "the warning filters": ("import warnings\nwarnings.simplefilter('ignore')\n",
                            "the warning filters"),
    "a signal handler": ("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n",
                         "the handler of SIGINT"),
    "a timer": ("import signal\nsignal.setitimer(signal.ITIMER_PROF, 100)\n",
                "the timer ITIMER_PROF"),
    "time.monotonic": ("import time\ntime.monotonic = lambda: 0.0\n", "`time.monotonic`"),
}


def _observed():
    """What the CHANGES would change, as this process sees it now."""
    import importlib

    import numba
    from engine.tensor import Tensor
    import engine
    gradcheck = importlib.import_module("engine.gradcheck")
    return (np.sum(np.ones(3)), np.ones(3).sum(), gradcheck.relative_error, engine.gradcheck,
            Tensor.__add__, numba.njit.__code__, os.getcwd(),
            os.environ.get("BACKPROP_PIECES_DIR"), os.environ.get("PIECE_WAS_HERE"),
            sys.getrecursionlimit(), list(warnings.filters), signal.getsignal(signal.SIGINT),
            signal.getitimer(signal.ITIMER_PROF), time.monotonic)


@pytest.mark.parametrize("case", sorted(CHANGES))
def test_what_a_piece_changes_in_the_kernel_is_put_back_and_named(case):
    code, named = CHANGES[case]
    before = _observed()
    with pytest.raises(PieceRefused) as refused:
        with guarded("your piece 'x'"):
            exec(code, {"np": np})
    assert named in str(refused.value) and "they were put back" in str(refused.value)
    assert _observed() == before


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path / "pieces"))
    monkeypatch.setattr(_vetting, "_VERDICTS", {})
    (tmp_path / "pieces").mkdir()
    return tmp_path / "pieces"


@pytest.mark.parametrize("case", ["np.add.reduce through gc", "Tensor.__add__",
                                  "BACKPROP_PIECES_DIR", "the recursion limit"])
def test_a_piece_that_changes_the_kernel_is_refused_before_the_kernel_loads_it(folder, case):
    code, named = CHANGES[case]
    _save_raw(folder, NAME, code + RIGHT)
    before = _observed()
    fn, owner = pieces.central_difference()
    assert owner.startswith("the engine's, because yours was skipped: your piece "
                            f"'{NAME}' "), owner
    assert named in owner
    assert _observed() == before


@pytest.mark.parametrize("error", ["SystemExit", "KeyboardInterrupt", "GeneratorExit"])
@pytest.mark.parametrize("where", ["at load", "in its check"])
def test_piece_or_engine_never_raises_what_a_piece_raises(folder, error, where):
    raising = f"raise {error}()\n"
    body = raising + RIGHT if where == "at load" else RIGHT.replace("    return g\n",
                                                                   "    " + raising)
    _save_raw(folder, NAME, body)
    fn, owner = pieces.central_difference()
    assert owner.startswith("the engine's, because yours "), owner
    assert error in owner
    # the kernel's own guard answers the same when a piece reaches it
    path = folder / f"{NAME}.py"
    fn, kind, text = pieces.attempt_piece(NAME, path, NAME)
    assert fn is None and error in text


def test_a_fork_under_the_guard_ends_the_copy_at_once(tmp_path):
    marker = tmp_path / "the_copy_ran_on"
    with pytest.raises(PieceRefused, match="forks the process"):
        with guarded("your piece 'x'"):
            pid = os.fork()
            if pid == 0:                       # never reached: the copy ends in the fork
                marker.write_text("a second kernel")
                os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and not marker.exists()
