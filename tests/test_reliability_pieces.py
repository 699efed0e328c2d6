"""A learner's pieces are never overwritten, a damaged index loses nothing, and a piece
cannot hang the notebook, flood it, or change numpy for the cells after its check."""
import importlib.util
import json
import time
from pathlib import Path
from types import SimpleNamespace

import nbformat
import numpy as np
import pytest

from coursework import _piece_guard, pieces
from coursework._core import ExerciseError
from coursework.solution_pieces import save_solution_pieces

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "course" / "solutions"

RIGHT = ("def central_difference_gradient(f, x, eps=1e-6):\n"
         "    x = np.asarray(x, dtype=float)\n"
         "    g = np.zeros_like(x)\n"
         "    for i in range(x.size):\n"
         "        e = np.zeros_like(x)\n"
         "        e.flat[i] = eps\n"
         "        g.flat[i] = (f(x + e) - f(x - e)) / (2 * eps)\n"
         "    return g\n")


def _header(name, function="central_difference_gradient", exercise="00.1"):
    return pieces._piece_header(name, function, exercise)


def learners_folder(folder: Path) -> dict:
    """A folder of a learner's saved pieces; returns {file name: bytes}."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "central_difference_gradient.py").write_text(
        _header("central_difference_gradient") + "# the learner's own version\n" + RIGHT)
    (folder / "index.json").write_text(json.dumps({"central_difference_gradient": {
        "function": "central_difference_gradient", "exercise": "00.1"}}))
    return snapshot(folder)


def snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _define(tmp_path, source, function):
    """A function defined from a file, as a notebook cell defines one."""
    path = tmp_path / f"cell_{function}.py"
    path.write_text(source)
    namespace = {"np": np}
    exec(compile(source, str(path), "exec"), namespace)
    return namespace[function]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path / "pieces"))
    (tmp_path / "pieces").mkdir()
    return tmp_path / "pieces"


# ---------------------------------------- item 1: the learner's folder is never written
def test_a_solution_run_with_the_variable_set_leaves_the_learners_pieces_alone(
        tmp_path, monkeypatch):
    learner = tmp_path / "mine"
    before = learners_folder(learner)
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(learner))
    monkeypatch.setattr(pieces, "_SOLUTION_RUN_DIR", None)
    monkeypatch.chdir(SOLUTIONS)                       # where `make course` runs them
    save_solution_pieces(["central_difference_gradient"], tmp_path)
    assert pieces.pieces_dir() != learner
    assert (pieces.pieces_dir() / "central_difference_gradient.py").exists()
    assert snapshot(learner) == before


def test_the_test_run_uses_a_folder_of_its_own_even_with_the_variable_set(tmp_path,
                                                                          monkeypatch):
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path / "mine"))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    conftest.pytest_configure(SimpleNamespace(option=SimpleNamespace()))
    import os
    assert os.environ["BACKPROP_PIECES_DIR"] != str(tmp_path / "mine")


def test_make_course_running_a_solution_notebook_leaves_every_learner_file_identical(
        tmp_path, monkeypatch):
    """Lesson 00's solution notebook, executed as `make course` executes it, with the
    learner's BACKPROP_PIECES_DIR in the environment the kernel inherits."""
    build_course = _build_course()
    learner = tmp_path / "mine"
    before = learners_folder(learner)
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(learner))
    source = next((ROOT / "course" / "source").glob("00_*.py")).read_text()
    nb = build_course.make_notebook(build_course.parse_cells(source), student=False)
    nb = build_course.execute(nb, cwd=SOLUTIONS)
    outputs = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "Exercise 00.1 (central_difference_gradient) passed." in outputs   # saved: elsewhere
    assert snapshot(learner) == before


def _build_course():
    spec = importlib.util.spec_from_file_location("build_course",
                                                  ROOT / "tools" / "build_course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------ item 2: a damaged index loses no piece
def _two_pieces(folder):
    for name in ("central_difference_gradient", "other"):
        (folder / f"{name}.py").write_text(_header(name) + RIGHT)


@pytest.mark.parametrize("damage", ['{"central_difference_gradient": {"function": '
                                    '"central_difference_gradient", "exercise": "00.1"},}',
                                    '["central_difference_gradient"]',
                                    '{"other": 3}',
                                    "[" * 200_000])
def test_a_damaged_index_is_kept_aside_and_rebuilt_from_the_piece_files(folder, damage,
                                                                         capsys):
    _two_pieces(folder)
    (folder / "index.json").write_text(damage)
    fn, why = pieces.piece_for_slot("central_difference_gradient")
    assert why is None and fn.__name__ == "central_difference_gradient"
    said = capsys.readouterr().out
    assert "index.json" in said and "is damaged" in said and "new index was written" in said
    kept = list(folder.glob("index.damaged-*.json"))
    assert len(kept) == 1 and kept[0].read_text() == damage
    index = json.loads((folder / "index.json").read_text())
    assert set(index) == {"central_difference_gradient", "other"}
    assert pieces.piece_for_slot("other")[1] is None            # not "not written yet"


def test_a_passed_exercise_after_a_damaged_index_keeps_every_other_piece(folder, tmp_path):
    _two_pieces(folder)
    (folder / "index.json").write_text("[1, 2]")              # valid JSON, wrong type
    fn = _define(tmp_path, RIGHT.replace("central_difference_gradient", "third"), "third")
    assert pieces.save_piece("third", fn, "00.1") is not None
    assert set(json.loads((folder / "index.json").read_text())) == {
        "central_difference_gradient", "other", "third"}


@pytest.mark.parametrize("index", ['["spot_check"]', '{"spot_check": "spot_check"}'])
def test_piece_for_slot_never_raises_on_an_index_of_the_wrong_shape(folder, index):
    (folder / "spot_check.py").write_text("def spot_check(f, x, g):\n    return []\n")
    (folder / "index.json").write_text(index)
    assert pieces.piece_for_slot("spot_check") == (None, "not written yet")   # no header
    assert pieces.load_piece("spot_check") is None


# ---------------------------- item 4: a piece that loops or floods ends within seconds
def _save_raw(folder, name, body, function=None):
    function = function or name
    (folder / f"{name}.py").write_text(_header(name, function) + body)
    index = json.loads((folder / "index.json").read_text()) if (folder / "index.json").exists() \
        else {}
    index[name] = {"function": function, "exercise": "00.1"}
    (folder / "index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("where", ["at load", "in its slot check"])
def test_a_piece_that_loops_falls_back_within_seconds_naming_the_piece(folder, monkeypatch,
                                                                       where):
    monkeypatch.setattr(_piece_guard, "PIECE_SECONDS", 1.0)
    loop = "while True:\n    pass\n"
    body = (loop + RIGHT) if where == "at load" else RIGHT.replace(
        "    return g\n", "    while True:\n        try:\n            pass\n"
                            "        except Exception:\n            pass\n    return g\n")
    _save_raw(folder, "central_difference_gradient", body)
    start = time.monotonic()
    fn, owner = pieces.central_difference()
    assert time.monotonic() - start < 10
    assert owner.startswith("the engine's, because yours was skipped: your piece "
                            "'central_difference_gradient' ran longer than 1 s")


def test_a_loop_at_save_fails_the_check_with_the_reason(tmp_path, folder, monkeypatch):
    monkeypatch.setattr(_piece_guard, "PIECE_SECONDS", 1.0)
    source = RIGHT.replace("    return g\n", "    while f is not None:\n        pass\n"
                                             "    return g\n")
    fn = _define(tmp_path, source, "central_difference_gradient")
    with pytest.raises(ExerciseError, match="ran longer than 1 s and was stopped"):
        pieces.save_piece("central_difference_gradient", fn, "00.1")


def test_what_a_piece_prints_is_bounded(folder, capsys):
    _save_raw(folder, "central_difference_gradient",
              "print('x' * 50_000_000)\n" + RIGHT)
    fn, owner = pieces.central_difference()
    assert owner == "yours (00.1)"
    out = capsys.readouterr().out
    assert len(out) < 5_000 and "printed 50,000,001 characters" in out


# ------------------------------- item 5: numpy is as the check found it; no library swap
def test_a_piece_leaves_numpy_s_random_state_and_error_handling_as_found(folder):
    _save_raw(folder, "central_difference_gradient",
              "np.random.seed(123)\nnp.seterr(all='raise')\nnp.set_printoptions(precision=2)\n"
              + RIGHT)
    np.random.seed(7)
    want = np.random.get_state()[1].copy()
    errors, options = np.geterr(), np.get_printoptions()
    fn, owner = pieces.central_difference()
    assert owner == "yours (00.1)"
    assert np.array_equal(np.random.get_state()[1], want)
    assert np.geterr() == errors and np.get_printoptions() == options


@pytest.mark.parametrize("swap", ["np.sqrt = lambda x: 0.0\n", "math.exp = abs\n",
                                  "np.random.seed = print\n"])
def test_a_piece_that_replaces_a_library_function_is_refused_and_put_back(folder, swap):
    import math
    originals = np.sqrt, math.exp, np.random.seed
    _save_raw(folder, "central_difference_gradient", swap + RIGHT)
    fn, owner = pieces.central_difference()
    name = swap.split(" =")[0]
    assert owner.startswith("the engine's, because yours was skipped: your piece "
                            f"'central_difference_gradient' replaces `{name}`")
    assert (np.sqrt, math.exp, np.random.seed) == originals


def test_a_timer_of_the_caller_survives_a_guarded_block(folder):
    import signal
    if not hasattr(signal, "setitimer"):
        pytest.skip("no interval timers here")
    def callers_handler(signum, frame):
        pass
    old = signal.signal(signal.SIGALRM, callers_handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)
        with _piece_guard.guarded("a piece"):
            pass
        assert signal.getsignal(signal.SIGALRM) is callers_handler
        remaining, _ = signal.setitimer(signal.ITIMER_REAL, 0)
        assert 0 < remaining <= 30.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_in_a_notebook_a_looping_piece_ends_the_cell_with_the_fallback(folder):
    """The deadline works where learners meet it: a cell of a Jupyter kernel."""
    build_course = _build_course()
    _save_raw(folder, "central_difference_gradient", "while True:\n    pass\n" + RIGHT)
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(
        "import time\n"
        "from coursework import _piece_guard, pieces\n"
        "_piece_guard.PIECE_SECONDS = 2.0\n"
        "start = time.monotonic()\n"
        "fn, owner = pieces.central_difference()\n"
        "print(owner)\n"
        "print('ended within seconds:', time.monotonic() - start < 20)"))
    nb = build_course.execute(nb, cwd=ROOT, timeout=120)
    out = nb.cells[0].outputs[0]["text"]
    assert "the engine's, because yours was skipped: your piece " \
           "'central_difference_gradient' ran longer than 2 s" in out
    assert "ended within seconds: True" in out
