"""The kernel's own guard does again what the vetting child does: a piece that changes a
ufunc's methods or a module entry is refused and put back, and one that behaves
otherwise outside the child meets the same slot check, deadline and thread count."""
import subprocess
import sys
import textwrap
import threading
import types

import numpy as np
import pytest

from coursework import _vetting
from coursework._piece_guard import PieceRefused, guarded

from test_reliability_pieces import RIGHT
from test_vetting import NAME, SKIPPED, _owner_within_seconds, folder  # noqa: F401


@pytest.mark.parametrize("ufunc, method", [("maximum", "reduce"), ("multiply", "reduce"),
                                           ("add", "accumulate"), ("subtract", "outer"),
                                           ("add", "at"), ("add", "reduceat")])
def test_a_ufunc_method_a_piece_replaces_is_put_back_and_named(ufunc, method):
    with pytest.raises(PieceRefused, match=rf"`np\.{ufunc}\.{method}`"):
        with guarded("your piece 'x'"):
            setattr(getattr(np, ufunc), method, lambda *a, **k: -1.0)
    assert method not in vars(getattr(np, ufunc))
    assert np.max(np.arange(3.0)) == 2.0 and np.prod([2.0, 3.0]) == 6.0


def test_a_replaced_module_entry_is_put_back_and_named():
    import engine.gradcheck  # noqa: F401
    real = sys.modules["engine.gradcheck"]
    with pytest.raises(PieceRefused, match=r"sys\.modules\['engine\.gradcheck'\]"):
        with guarded("your piece 'x'"):
            sys.modules["engine.gradcheck"] = types.ModuleType("engine.gradcheck")
    assert sys.modules["engine.gradcheck"] is real


def test_a_piece_that_changes_a_ufunc_in_the_child_is_refused_naming_it(folder):
    fn, owner = _owner_within_seconds(folder, "np.maximum.reduce = lambda *a, **k: -1.0\n"
                                              + RIGHT)
    assert owner.startswith(SKIPPED) and "`np.maximum.reduce`" in owner, owner
    assert np.max(np.arange(3.0)) == 2.0


def test_a_piece_wrong_only_outside_the_child_meets_its_slot_check_in_the_kernel(folder):
    body = RIGHT + ("import os\nif not os.environ.get('BACKPROP_VETTING_CHILD'):\n"
                    "    def central_difference_gradient(f, x, eps=1e-6):\n"
                    "        return np.zeros_like(np.asarray(x, dtype=float))\n")
    fn, owner = _owner_within_seconds(folder, body)
    assert owner.startswith("the engine's, because yours was skipped"), owner


def test_a_thread_hidden_from_threading_is_counted_in_the_kernel():
    stop = threading.Event()
    with pytest.raises(PieceRefused, match="starts a thread"):
        with guarded("your piece 'x'"):
            hidden = threading.Thread(target=stop.wait, args=(30,))
            hidden.start()
            threading._active.pop(hidden.ident)
    threading._active[hidden.ident] = hidden      # listed again, so that it ends cleanly
    stop.set()
    hidden.join()


def test_a_loop_that_catches_the_deadline_in_the_kernel_is_stopped():
    code = textwrap.dedent("""
        from coursework._piece_guard import PieceRefused, guarded
        try:
            with guarded("your piece 'x'", seconds=1.0):
                while True:
                    try:
                        while True:
                            pass
                    except:
                        pass
        except PieceRefused as err:
            print(err)
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=str(_vetting.ROOT))
    assert "ran longer than 1 s" in done.stdout, (done.stdout, done.stderr[-500:])
