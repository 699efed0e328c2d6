"""The vetting child is boxed (`coursework._child_box`): it ends with the kernel, takes
every process it started along (detached or not), cannot signal the kernel, writes no
large file and nothing outside its scratch folder; and the kernel loads the very bytes
it vetted. Where the system lacks a mechanism (no Landlock, no PID namespace) the tests
that need it are skipped, saying which."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from coursework import _child_box, _vetting, pieces

from test_reliability_pieces import RIGHT, _save_raw
from test_vetting import NAME, SKIPPED, _owner_within_seconds, _pid_alive, folder  # noqa: F401

ROOT = str(_vetting.ROOT)


def _mechanisms() -> list[str]:
    """What isolates a child on this machine (one vetting of a right piece)."""
    if not _vetting.ISOLATION:
        from pathlib import Path
        import tempfile
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / "piece.py"
            path.write_text(RIGHT)
            _vetting.vet(NAME, path, NAME)
    return _vetting.ISOLATION


def _needs(word: str) -> None:
    if not any(word in m for m in _mechanisms()):
        pytest.skip(f"this system gives the vetting child no {word}: {_mechanisms()}")


def _gone_within(pids, seconds=5.0) -> bool:
    deadline = time.monotonic() + seconds
    while any(_pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(_pid_alive(p) for p in pids)


def _kernel(folder, body, code):
    """A notebook kernel of its own (a Python process) that loads the piece `body`, then
    runs `code`; its CompletedProcess (60 s at most: a stopped kernel fails the test)."""
    _save_raw(folder, NAME, body + RIGHT)
    script = textwrap.dedent("""
        from coursework import _piece_guard, pieces
        _piece_guard.PIECE_SECONDS = 5.0
        """) + textwrap.dedent(code)
    env = dict(os.environ, BACKPROP_PIECES_DIR=str(folder),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=env)


def _cpu_seconds(pid) -> float:
    return _vetting._cpu_seconds(pid) or 0.0


def test_the_child_of_a_killed_kernel_ends_within_seconds(folder):
    _save_raw(folder, NAME, "while True:\n    pass\n" + RIGHT)
    env = dict(os.environ, BACKPROP_PIECES_DIR=str(folder),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    kernel = subprocess.Popen([sys.executable, "-c", "from coursework import _piece_guard, "
                               "pieces; _piece_guard.PIECE_SECONDS = 600.0; "
                               "pieces.central_difference()"], cwd=ROOT, env=env)
    try:
        deadline, spinning = time.monotonic() + 90, []
        while not spinning and time.monotonic() < deadline:     # the piece's loop runs
            time.sleep(0.5)
            spinning = [p for p in _child_box.descendants(kernel.pid) if _cpu_seconds(p) > 2]
        assert spinning, "the piece never ran in a child"
        below = _child_box.descendants(kernel.pid)
        kernel.kill()
        kernel.wait()
        assert _gone_within(below), "the vetting child outlived its kernel"
    finally:
        kernel.kill()
        kernel.wait()


def _running_with(token: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    found.append(int(entry))
        except (OSError, ValueError):
            pass
    return [p for p in found if _pid_alive(p)]


DAEMONS = {
    "Popen(start_new_session=True)":
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', {code!r}], start_new_session=True)\n",
    "os.posix_spawn(setsid=True)":
        "import os, sys\n"
        "os.posix_spawn(sys.executable, [sys.executable, '-c', {code!r}], dict(os.environ),"
        " setsid=True)\n",
    "a double fork and setsid":
        "import os, sys\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        os.execv(sys.executable, [sys.executable, '-c', {code!r}])\n    os._exit(0)\n"
        "os.wait()\n",
}


@pytest.mark.parametrize("how", sorted(DAEMONS))
def test_a_detached_daemon_is_refused_and_gone_after_the_vetting(folder, how):
    token = f"daemon-{os.getpid()}-{time.monotonic_ns()}"
    code = f"import time; time.sleep(120)  # {token}"
    body = DAEMONS[how].format(code=code) + "import time\ntime.sleep(1)\n"
    fn, owner = _owner_within_seconds(folder, body + RIGHT)
    refused = ("forks the process", "leaves a process running") if "fork" in how else \
        ("leaves a process running",)
    assert owner.startswith(tuple(SKIPPED + why for why in refused)), owner
    assert _gone_within_seconds(token), "the daemon outlived the vetting"


def _gone_within_seconds(token: str, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while _running_with(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _running_with(token)


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1,
                                    signal.SIGSTOP])
def test_a_piece_cannot_signal_the_kernel(folder, number):
    body = (f"import os\nfor pid in (os.getppid(), 0):\n    try:\n"
            f"        os.kill(pid, {int(number)})\n    except OSError:\n        pass\n")
    done = _kernel(folder, body, "print(pieces.central_difference()[1]); print('alive')")
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "alive", \
        (done.returncode, done.stdout[-500:], done.stderr[-500:])


def test_a_200_mb_write_is_refused_and_leaves_nothing_behind(folder):
    _needs("RLIMIT_FSIZE")
    _needs("Landlock")
    outside = folder.parent / "big"
    body = (f"errors = []\n"
            f"for where in ({str(outside)!r}, 'big-here'):\n"
            f"    try:\n"
            f"        with open(where, 'wb') as f:\n"
            f"            for _ in range(200):\n"
            f"                f.write(bytes(1 << 20))\n"
            f"    except OSError as err:\n"
            f"        errors.append(f'{{where}}: {{err}}')\n"
            f"if errors:\n    raise RuntimeError('; '.join(errors))\n")
    fn, owner = _owner_within_seconds(folder, body + RIGHT)
    assert fn is not pieces.central_difference and "does not load" in owner, owner
    assert "File too large" in owner and "Permission denied" in owner, owner
    assert not outside.exists()


def test_a_piece_cannot_delete_the_index_or_another_piece(folder):
    _needs("Landlock")
    _save_raw(folder, "other_piece", RIGHT, function="central_difference_gradient")
    before = (folder / "other_piece.py").read_text()
    # in the child only: the kernel runs a piece's file with the learner's own rights
    body = (f"import os\nif os.environ.get('BACKPROP_VETTING_CHILD'):\n"
            f"    for name in ('index.json', 'other_piece.py'):\n"
            f"        try:\n            os.remove(os.path.join({str(folder)!r}, name))\n"
            f"        except OSError:\n            pass\n"
            f"    try:\n        open(os.path.join({str(folder)!r}, 'index.json'), 'w').close()\n"
            f"    except OSError:\n        pass\n")
    _owner_within_seconds(folder, body + RIGHT)
    assert (folder / "other_piece.py").read_text() == before
    assert "other_piece" in json.loads((folder / "index.json").read_text())


WRONG = RIGHT.replace("return g", "return g * 0")


def test_a_file_swapped_during_vetting_is_not_what_the_kernel_loads(folder, monkeypatch):
    real = _vetting._run_child

    def swapped_meanwhile(name, path, *args):
        path.write_text(path.read_text().replace("return g", "return g * 0"))
        return real(name, path, *args)
    monkeypatch.setattr(_vetting, "_run_child", swapped_meanwhile)
    fn, owner = _owner_within_seconds(folder, RIGHT)
    assert owner == "yours (00.1)", owner
    assert float(fn(lambda x: float((x ** 2).sum()), [3.0])[0]) == pytest.approx(6.0)


def test_a_piece_that_rewrites_its_own_file_in_the_child_is_not_loaded_rewritten(folder):
    path = folder / f"{NAME}.py"
    body = (f"import os\nif os.environ.get('BACKPROP_VETTING_CHILD'):\n"
            f"    try:\n        text = open({str(path)!r}).read()\n"
            f"        open({str(path)!r}, 'w').write(text.replace('return g\\n', "
            f"'return g * 0\\n'))\n    except OSError:\n        pass\n")
    fn, owner = _owner_within_seconds(folder, body + RIGHT)
    if fn is not None and owner.startswith("yours"):
        assert float(fn(lambda x: float((x ** 2).sum()), [3.0])[0]) == pytest.approx(6.0)


def test_what_isolates_the_child_is_said():
    said = _mechanisms()
    assert any("PR_SET_PDEATHSIG" in m for m in said) or not sys.platform.startswith("linux")
    print("vetting child isolation here:", said)
