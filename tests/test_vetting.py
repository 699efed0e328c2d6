"""A learner's piece is vetted in a child process, killed at its deadline, before the
notebook's kernel loads it: whatever the piece does to hang, exit, fork, flood the
output or change the process, the slot runs the engine's version and says why."""
import os
import threading
import time

import numpy as np
import pytest

from coursework import _piece_guard, _vetting, pieces
from coursework._core import ExerciseError

from test_reliability_pieces import RIGHT, _define, _save_raw

NAME = "central_difference_gradient"
SKIPPED = f"the engine's, because yours was skipped: your piece '{NAME}' "


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path / "pieces"))
    monkeypatch.setattr(_piece_guard, "PIECE_SECONDS", 2.0)
    monkeypatch.setattr(_vetting, "_VERDICTS", {})
    (tmp_path / "pieces").mkdir()
    return tmp_path / "pieces"


def _owner_within_seconds(folder, body, limit=30):
    _save_raw(folder, NAME, body)
    start = time.monotonic()
    fn, owner = pieces.central_difference()
    assert time.monotonic() - start < limit
    return fn, owner


NJIT_SPIN = ("@njit\n"
             "def spin(n):\n"
             "    while n >= 0:\n"
             "        n = (n * 7 + 3) % 1000003\n"
             "    return n\n"
             "spin(1)\n")
HANGS = {
    "a loop inside a bare except": "while True:\n    try:\n        pass\n    except:\n"
                                   "        pass\n",
    "a loop after disarming the timer": "import signal\nsignal.setitimer(signal.ITIMER_REAL, 0)\n"
                                        "while True:\n    pass\n",
    "a loop ignoring SIGALRM": "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                               "while True:\n    pass\n",
    "a loop after replacing time.monotonic": "import time\ntime.monotonic = lambda: 0.0\n"
                                             "while True:\n    pass\n",
    "an @njit loop": NJIT_SPIN,
    "one long C call": "total = sum(range(10**12))\n",
}


@pytest.mark.parametrize("case", sorted(HANGS))
def test_a_piece_that_hangs_at_load_is_killed_and_the_engine_runs(folder, case):
    fn, owner = _owner_within_seconds(folder, HANGS[case] + RIGHT)
    assert owner.startswith(SKIPPED + "ran longer than 2 s and was stopped"), owner
    from coursework.slots import engine_central_difference
    assert fn is engine_central_difference


def test_a_piece_that_hangs_in_its_check_inside_a_bare_except_is_killed(folder):
    body = RIGHT.replace("    return g\n", "    while True:\n        try:\n            pass\n"
                                             "        except:\n            pass\n    return g\n")
    fn, owner = _owner_within_seconds(folder, body)
    assert owner.startswith(SKIPPED + "ran longer than 2 s and was stopped"), owner


def test_a_piece_loaded_off_the_main_thread_still_has_its_deadline(folder):
    _save_raw(folder, NAME, "while True:\n    pass\n" + RIGHT)
    answers = []
    worker = threading.Thread(target=lambda: answers.append(pieces.central_difference()),
                              daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive()
    assert answers[0][1].startswith(SKIPPED + "ran longer than 2 s")


def test_a_piece_that_starts_a_thread_that_runs_on_is_refused(folder):
    fn, owner = _owner_within_seconds(
        folder, "import threading\nthreading.Thread(target=lambda: [0 for _ in iter(int, 1)], "
                "daemon=True, name='spinner').start()\n" + RIGHT)
    assert owner.startswith(SKIPPED + "starts a thread (spinner) that still runs"), owner


def test_a_piece_that_starts_a_raw_thread_that_runs_on_is_refused(folder):
    fn, owner = _owner_within_seconds(
        folder, "import _thread\ndef spin():\n    while True:\n        pass\n"
                "_thread.start_new_thread(spin, ())\n" + RIGHT)
    assert owner.startswith(SKIPPED + "starts a thread (spin) that still runs"), owner


def test_a_piece_that_writes_20_mb_to_the_real_stdout_is_refused(folder, capfd):
    fn, owner = _owner_within_seconds(folder, "import sys\nsys.__stdout__.write('x' * 20_000_000)\n"
                                              "sys.__stdout__.flush()\n" + RIGHT)
    assert owner.startswith(SKIPPED + "writes more than 1,000,000 bytes straight to the "
                                      "process's output"), owner
    assert len(capfd.readouterr().out) < 10_000          # nothing of it reached this process


@pytest.mark.parametrize("body, says", [
    ("import os\nos._exit(3)\n", "ended the process with exit code 3"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "was killed by SIGKILL"),
])
def test_a_piece_that_ends_its_process_is_refused_and_this_one_lives_on(folder, body, says):
    fn, owner = _owner_within_seconds(folder, body + RIGHT)
    assert owner.startswith(SKIPPED + says), owner


def test_a_piece_that_forks_is_refused_and_leaves_no_process(folder):
    marker = folder.parent / "the_copy_ran"
    body = (f"import os, time\nif os.fork() == 0:\n    time.sleep(1)\n"
            f"    open({str(marker)!r}, 'w').close()\n    time.sleep(60)\n")
    fn, owner = _owner_within_seconds(folder, body + RIGHT)
    assert owner.startswith(SKIPPED + "forks the process"), owner
    time.sleep(2)
    assert not marker.exists()


def test_a_piece_that_leaves_a_subprocess_running_is_refused_and_it_is_ended(folder):
    marker = folder.parent / "the_subprocess_ran"
    code = f"import time; time.sleep(2); open({str(marker)!r}, 'w').close()"
    body = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {code!r}])\n"
    fn, owner = _owner_within_seconds(folder, body + RIGHT)
    assert owner.startswith(SKIPPED + "leaves a process running"), owner
    time.sleep(3)
    assert not marker.exists()


def test_a_piece_that_changes_numpy_in_its_child_is_refused_and_the_kernel_never_sees_it(folder):
    fn, owner = _owner_within_seconds(
        folder, "import gc\ngc.get_referents(np.ufunc.__dict__)[0]['reduce'] = "
                "lambda *a, **k: 0\n" + RIGHT)
    assert owner.startswith(SKIPPED + "replaces `np.ufunc.reduce`"), owner
    assert np.sum([1, 2]) == 3


def test_a_loop_at_save_is_killed_and_fails_the_check(tmp_path, folder):
    source = RIGHT.replace("    return g\n", "    while True:\n        try:\n            pass\n"
                                             "        except:\n            pass\n    return g\n")
    fn = _define(tmp_path, source, NAME)
    with pytest.raises(ExerciseError, match="ran longer than 2 s and was stopped"):
        pieces.save_piece(NAME, fn, "00.1")


def test_numba_compiling_does_not_count_against_the_deadline(folder):
    body = ("import time\nimport numba.core.event as event\n"
            "with event.trigger_event('numba:compiler_lock'):\n    time.sleep(4)\n")
    fn, owner = _owner_within_seconds(folder, body + RIGHT)
    assert owner == "yours (00.1)", owner


def test_a_verdict_is_kept_in_memory_only_and_a_changed_file_is_vetted_again(folder,
                                                                             monkeypatch):
    _save_raw(folder, NAME, RIGHT)
    assert pieces.central_difference()[1] == "yours (00.1)"
    assert sorted(p.name for p in folder.iterdir()) == [f"{NAME}.py", "index.json"]

    def no_child(*args):
        raise AssertionError("vetted again")
    monkeypatch.setattr(_vetting, "_run_child", no_child)
    assert pieces.central_difference()[1] == "yours (00.1)"
    _save_raw(folder, NAME, "import os\nos._exit(3)\n" + RIGHT)
    with pytest.raises(AssertionError, match="vetted again"):
        pieces.central_difference()


def test_a_piece_that_forges_the_child_s_verdict_and_hangs_is_refused(folder):
    """The child's answer counts only when the child then ends by itself."""
    forge = ("import os, sys\nos.write(int(sys.argv[2]), b'vnull\\n')\n"
             "while True:\n    pass\n")
    fn, owner = _owner_within_seconds(folder, forge + RIGHT)
    assert owner.startswith(SKIPPED + "did not let the process end after its check"), owner


def test_a_child_that_cannot_start_leaves_the_kernel_s_guard_in_charge(folder, monkeypatch,
                                                                      capsys):
    monkeypatch.setattr(_vetting, "_CHILD", "raise SystemExit('no engine here')")
    _save_raw(folder, NAME, RIGHT)
    assert pieces.central_difference()[1] == "yours (00.1)"
    said = capsys.readouterr().out
    assert f"your piece '{NAME}' could not be vetted in a separate process" in said
    assert "no engine here" in said
    assert not _vetting._VERDICTS or all(v is None for v in _vetting._VERDICTS.values())


def test_the_save_s_vetting_serves_the_first_load(tmp_path, folder, monkeypatch):
    fn = _define(tmp_path, RIGHT, NAME)
    assert pieces.save_piece(NAME, fn, "00.1") is not None
    monkeypatch.setattr(_vetting, "_run_child", lambda *a: ("refused", "vetted again"))
    assert pieces.central_difference()[1] == "yours (00.1)"


def test_exiting_at_save_fails_the_check_with_the_reason(tmp_path, folder):
    source = RIGHT.replace("    return g\n", "    import os\n    os._exit(5)\n")
    fn = _define(tmp_path, source, NAME)
    with pytest.raises(ExerciseError, match="ended the process with exit code 5"):
        pieces.save_piece(NAME, fn, "00.1")
    assert os.getpid()                           # still here


def test_a_piece_imports_in_the_child_what_it_imports_in_the_kernel(folder, tmp_path,
                                                                   monkeypatch):
    """A module beside the notebook (on the kernel's sys.path) is found in the child too."""
    beside = tmp_path / "notebook"
    beside.mkdir()
    (beside / "my_helpers.py").write_text("STEP = 1e-6\n")
    monkeypatch.syspath_prepend(str(beside))
    fn, owner = _owner_within_seconds(folder, "from my_helpers import STEP\n" + RIGHT)
    assert owner == "yours (00.1)", owner


def test_a_check_slowed_by_a_busy_machine_is_not_cut_short(folder):
    """The child's deadline counts CPU time: a check whose clock time stretches (here a
    3 s wait, past the 2 s of computing allowed) still passes, within 3 x 2 s."""
    body = RIGHT.replace("    return g\n", "    import time\n    time.sleep(3)\n    return g\n")
    fn, owner = _owner_within_seconds(folder, body)
    assert owner == "yours (00.1)", owner


def test_a_piece_that_waits_forever_is_stopped_on_the_clock(folder):
    body = RIGHT.replace("    return g\n", "    import time\n    time.sleep(3600)\n"
                                             "    return g\n")
    fn, owner = _owner_within_seconds(folder, body)
    assert owner.startswith(SKIPPED + "ran longer than 2 s and was stopped (it waited 6 s"), \
        owner



@pytest.mark.parametrize("computed, says", [
    (0.01, "it waited 6 s: a sleep, a read or a lock"),
    (1.5, "it computed for 1.5 s of CPU time in 6 s on the clock, on a busy machine: a loop"),
])
def test_a_loop_on_a_busy_machine_is_not_called_a_wait(computed, says):
    """Past the clock's limit, a piece that computed for a share of it is a loop slowed by
    other processes, not a sleep: the reason follows the CPU time it used."""
    from coursework._vetting import _why_stopped
    assert _why_stopped("wait", computed, 6.0, 2.0).startswith(says)
    assert _why_stopped("run", 2.1, 2.5, 2.0) == "a loop that never ends?"


def test_the_workers_start_up_is_not_counted_as_the_pieces_computing(monkeypatch):
    """The keeper names its worker ("p") and the worker says it is ready ("r") in one read
    on a busy machine: the worker's imports before it was ready are not the piece's CPU
    time, so a piece that then sleeps is stopped as a wait, not as a loop."""
    import types

    from coursework import _vetting
    keeper, worker = 1000, 2000
    monkeypatch.setattr(_vetting, "_cpu_seconds", {keeper: 0.05, worker: 0.7}.get)
    progress, write_progress = os.pipe()
    output, write_output = os.pipe()
    child = types.SimpleNamespace(pid=keeper, stdout=types.SimpleNamespace(fileno=lambda: output),
                                  poll=lambda: None)
    try:
        os.write(write_progress, f"p{worker}\nr".encode())
        watched = _vetting._Watch(child, progress).run(0.1, 1)
    finally:
        for fd in (progress, write_progress, output, write_output):
            os.close(fd)
    assert watched.worker == worker and watched.late == "wait", watched.late
    assert watched.computed == 0.0

# ------------------------------------------------------------------ several pieces, one child
FUNCTION = "central_difference_gradient"
THREAD = ("import threading\nthreading.Thread(target=lambda: [0 for _ in iter(int, 1)], "
          "daemon=True, name='spinner').start()\n")


def _saved(folder, bodies: dict) -> list:
    for name, body in bodies.items():
        _save_raw(folder, name, body, function=FUNCTION)
    return [(name, folder / f"{name}.py", FUNCTION) for name in bodies]


def _children(monkeypatch) -> list:
    """The children handed pieces to vet from here on, one entry each."""
    started, hand = [], _vetting._hand

    def counted(child, pieces):
        started.append([p[0] for p in pieces])
        return hand(child, pieces)
    monkeypatch.setattr(_vetting, "_hand", counted)
    return started


def test_pieces_vetted_ahead_share_one_child_and_their_loads_start_none(folder, monkeypatch):
    requests = _saved(folder, {"piece_a": RIGHT, "piece_b": THREAD + RIGHT, "piece_c": RIGHT})
    started = _children(monkeypatch)
    _vetting.vet_ahead(requests)
    assert len(started) == 1
    verdicts = [_vetting.vet(*request) for request in requests]
    assert len(started) == 1                       # every load found its verdict ready
    assert verdicts[0] is None and verdicts[2] is None     # b's thread is b's alone
    assert verdicts[1][0] == "refused" and "starts a thread (spinner)" in verdicts[1][1]


@pytest.mark.parametrize("trouble", ["a hang", "an extra verdict", "an exit"])
def test_a_batch_that_does_not_end_cleanly_keeps_no_verdict_and_each_piece_is_vetted_alone(
        folder, monkeypatch, trouble):
    body = {"a hang": "while True:\n    pass\n",
            "an extra verdict": "import os, sys\nos.write(int(sys.argv[2]), b'vnull\\n')\n",
            "an exit": "import os\nos._exit(0)\n"}[trouble]
    requests = _saved(folder, {"piece_a": RIGHT, "piece_b": body + RIGHT, "piece_c": RIGHT})
    started = _children(monkeypatch)
    _vetting.vet_ahead(requests)
    assert len(started) == 1 and _vetting._VERDICTS == {}
    assert _vetting.vet(*requests[0]) is None and _vetting.vet(*requests[2]) is None
    assert len(started) == 3
    if trouble != "an extra verdict":            # a forged verdict fools one piece's child
        assert _vetting.vet(*requests[1])[0] == "refused"


def test_lesson_13_vets_every_piece_it_loads_in_its_one_batch():
    """The pieces lesson 13 loads after plugging in the slots are in LATER_PIECES."""
    import re
    from pathlib import Path
    from coursework import lesson13
    source = Path(lesson13.__file__).read_text()
    loaded = set(re.findall(r'piece_or_engine\("(\w+)"', source))
    assert loaded and loaded <= set(lesson13.LATER_PIECES)


# ------------------------------------------------------------------ a child started ahead
def _spare_pid():
    with _vetting._SPARE_LOCK:
        return _vetting._SPARE[0].process.pid if _vetting._SPARE else None


def test_a_vetting_takes_the_spare_child_and_leaves_a_new_one(folder, monkeypatch):
    _vetting.start_spare()
    spare = _spare_pid()
    assert spare is not None
    used = []
    hand = _vetting._hand
    monkeypatch.setattr(_vetting, "_hand", lambda child, p: (used.append(child.process.pid),
                                                             hand(child, p)))
    _owner_within_seconds(folder, RIGHT)
    assert used == [spare]
    assert _spare_pid() not in (None, spare)


def test_the_spare_sees_the_kernel_s_path_and_environment_as_they_are_when_it_is_used(
        folder, tmp_path, monkeypatch):
    _vetting.start_spare()
    beside = tmp_path / "later"
    beside.mkdir()
    (beside / "later_helpers.py").write_text("import os\nSTEP = float(os.environ['MY_STEP'])\n")
    monkeypatch.syspath_prepend(str(beside))
    monkeypatch.setenv("MY_STEP", "1e-6")
    fn, owner = _owner_within_seconds(folder, "from later_helpers import STEP\n" + RIGHT)
    assert owner == "yours (00.1)", owner


def test_a_spare_started_otherwise_is_not_used(folder, monkeypatch):
    _vetting.start_spare()
    spare = _spare_pid()
    monkeypatch.setattr(_vetting, "MEMORY_BYTES", _vetting.MEMORY_BYTES + 4096)
    started = _children(monkeypatch)
    _owner_within_seconds(folder, RIGHT)
    assert len(started) == 1
    assert not _pid_alive(spare)


def test_a_child_starts_no_spare_of_its_own(monkeypatch):
    monkeypatch.setenv(_vetting.IN_CHILD, "1")
    with _vetting._SPARE_LOCK:
        _vetting._drop_spare()
    _vetting.start_spare()
    assert _spare_pid() is None


def test_the_spare_ends_with_the_kernel():
    import subprocess
    import sys
    code = ("import coursework._vetting as v; print(v._SPARE[0].process.pid, flush=True); "
            "import os; os._exit(0)")      # no atexit: the spare must see its stdin close
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=str(_vetting.ROOT))
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 60
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _pid_alive(pid)


def _pid_alive(pid) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:                                  # a zombie of this process has ended
        waited, _ = os.waitpid(pid, os.WNOHANG)
        return waited == 0
    except ChildProcessError:
        return _status(pid) not in ("Z", "X")


def _status(pid) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def test_pieces_vetted_before_saving_share_one_child_and_their_saves_start_none(
        tmp_path, folder, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _define(tmp_path / "a", RIGHT, NAME)
    second = _define(tmp_path / "b", RIGHT.replace("eps=1e-6", "eps=1e-5"), NAME)
    started = _children(monkeypatch)
    pieces.vet_before_saving([(NAME, first, "00.1"), ("another_piece", second, "00.1")])
    assert len(started) == 1 and sorted(started[0]) == ["another_piece", NAME]
    assert pieces.save_piece(NAME, first, "00.1") is not None
    assert pieces.save_piece("another_piece", second, "00.1") is not None
    assert len(started) == 1                       # both saves found their verdicts ready
