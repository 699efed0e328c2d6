"""Vetting a learner's piece in a child process before the notebook's kernel loads it.

`vet(name, path, function)` loads the piece's file and runs its slot check, exactly as
the kernel would (`pieces.attempt_piece`), in a fresh Python process (`_vet_child`,
started with `-I` in a scratch folder: nothing of the notebook's state comes along but
its import path, so the piece imports what it would import in the kernel), and watches
it from here:

* time: the piece may compute for `_piece_guard.PIECE_SECONDS` of the child's CPU time
  and wait (sleep, read, hold a lock) for `WAIT_FACTOR` times as long on the clock;
  then the child's whole process group is killed (SIGKILL: nothing the piece does in
  Python or C, with its signals or its clocks, can stop that). CPU time, not the
  clock, measures a computing piece, so a right piece on a busy machine (where its
  check's clock time stretches) is not cut short. Two phases do not count: the
  child's start (its imports, up to `STARTUP_SECONDS` on the clock) and numba
  compiling (the child says when a compilation starts and ends; up to
  `COMPILE_SECONDS` in all). A child that cannot start in time is not the piece's
  fault: the piece is then loaded under the kernel's own guard alone, as a note says.
* output: what the child writes to its own stdout and stderr (`sys.__stdout__`, a C
  library) is read here and refused past `OUTPUT_LIMIT` bytes; what it prints through
  `print` is bounded in the child as in the kernel (`guarded`).
* memory: the child may map `MEMORY_BYTES` more than its imports took.
* the process: a piece that exits, forks (a process left in the child's group, or
  `os.fork`), starts a thread that outlives its check, or changes shared state
  (`_kernel_state`) is refused, with the reason.

The child is boxed (`_child_box`): it ends with the kernel, whatever happens to the
kernel, and takes every process it started along; it writes no large file and nothing
outside its scratch folder where the system allows, and cannot signal the kernel. The
piece's file is read once, here: the child vets those bytes, and the kernel loads them.

`vet_ahead(requests)` vets several pieces in one child, one after the other, as the
kernel would load them: the child's imports (most of a second) are paid once. Its
verdicts are kept only when the child answered for every piece and ended cleanly.

A child imports the engine before it learns which pieces to vet, so one can be started
ahead of need: `start_spare()` (when the course's checks are imported, and after every
vetting) leaves one child waiting, and the next vetting hands it its pieces, with the
kernel's import path and environment as they are then, instead of waiting for the
imports. A spare is used once; it ends with the kernel (its stdin closes).

The answer is None (the piece passed: the kernel loads it, still under `guarded`) or
(kind, text) as `attempt_piece` answers: "load", "refused" or "slot". Verdicts are
kept in this process's memory for the kernel's life, keyed by a hash of the piece's
file and of the limits, never on disk: a piece that passed is vetted once per kernel,
a changed file is vetted again, and no file can pass a piece off as vetted.

What the deadline cannot see: it bounds one load and one check, on the check's small
inputs. A piece that is fast there and slow on a lesson's real shapes, or that
misbehaves only on some inputs, passes; later calls run in the kernel, watched by
nothing but the lesson's own cell, and compiled numba code sees no interrupt. And the
verdict comes from the process the piece runs in: a piece written to fool its vetting
(one that writes a passing verdict itself, or behaves otherwise outside the child) is
held by the kernel's own guard alone.
"""
from __future__ import annotations

import atexit
import base64
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import _child_box, _piece_guard

ROOT = Path(__file__).resolve().parents[1]
STARTUP_SECONDS = 120.0     # the child's interpreter and imports, on a busy machine
COMPILE_SECONDS = 300.0     # numba compiling, all compilations of one vetting together
WAIT_FACTOR = _piece_guard.WAIT_FACTOR
OUTPUT_LIMIT = 1_000_000    # bytes the child may write to its own stdout and stderr
MEMORY_BYTES = 4 << 30      # address space the child may add to what its imports mapped
_TICK = 0.05                # seconds between two looks at the child
# the repository's path, enough for the child's imports (the kernel's own import path
# travels with the pieces: a piece may import a module beside the notebook); then the
# child splits into keeper and worker (`_child_box.hold`) before its imports
_CHILD = ("import json, sys; sys.path[:0] = [p for p in json.loads(sys.argv[1]) "
          "if p not in sys.path]; import importlib.util as u; "
          "s = u.spec_from_file_location('coursework._child_box', sys.argv[4]); "
          "box = sys.modules[s.name] = u.module_from_spec(s); s.loader.exec_module(box); "
          "box.hold(*map(int, sys.argv[5:7]), int(sys.argv[2])); "
          "from coursework._vet_child import main; main(sys.argv[2:4])")
IN_CHILD = "BACKPROP_VETTING_CHILD"     # set in a child's environment: it starts no child
_VERDICTS: dict = {}        # key -> verdict, for this kernel's life
ISOLATION: list = []        # what isolated the last child that ran a piece (`_child_box`)


def _key(name: str, source: bytes, function: str, at_save: bool) -> str:
    from .slots import IN_SLOT_ONLY
    digest = hashlib.sha256(source)
    digest.update(json.dumps([name, function, at_save and name in IN_SLOT_ONLY,
                              _piece_guard.PIECE_SECONDS, _piece_guard.PRINT_LIMIT,
                              WAIT_FACTOR, OUTPUT_LIMIT, MEMORY_BYTES]).encode())
    return digest.hexdigest()


class _Unvetted:
    """The answer when no child could run the piece (not the piece's doing)."""

    def __repr__(self) -> str:
        return "UNVETTED"


UNVETTED = _Unvetted()


def read_piece(path: Path) -> bytes:
    """The bytes of a piece's file, read once: what is vetted is what is loaded."""
    path = Path(path)
    if not path.is_file():
        raise OSError(f"{path} is not a regular file")
    return path.read_bytes()


def vet(name: str, path: Path, function: str, at_save: bool = False,
        source: bytes | None = None):
    """None when the piece (`source`, the bytes of its file `path`, read here when not
    given) loads and keeps its slot's contract in a child process, (kind, text) saying
    why not, or UNVETTED when no child could start or import the engine (a note says
    so; the kernel's guard is then the only line). Never raises. The child runs these
    bytes, never the file: the kernel loads the same bytes after."""
    try:
        source = read_piece(path) if source is None else source
    except OSError as err:
        return "load", f"OSError: {err}"
    key = _key(name, source, function, at_save)
    if key in _VERDICTS:
        return _VERDICTS[key]
    if not hasattr(os, "killpg"):         # Windows: no process group to kill
        return UNVETTED
    verdict = _run_child(name, Path(path), function, at_save, source)
    if verdict is not UNVETTED:
        _VERDICTS[key] = verdict
    return verdict


def _run_child(name: str, path: Path, function: str, at_save: bool, source: bytes):
    piece = f"your piece '{name}'"
    with _child([(name, path, function, at_save, source)]) as started:
        if isinstance(started, str):
            return _unvetted(piece, started)
        child, progress = started
        watched = _Watch(child, progress).run(_piece_guard.PIECE_SECONDS, 1)
        return _verdict(piece, child, watched)


def vet_ahead(requests, at_save: bool = False) -> None:
    """Vet in one child, one after the other, every piece of `requests` ((name, path,
    function) each, loaded as the kernel loads them, or as a save checks them when
    `at_save`) that has no verdict yet: one child instead of one per piece, so a lesson
    that loads several pieces waits for one child's work, not one per piece. The
    verdicts are kept only when the child ran every piece and ended cleanly; otherwise
    none is kept, and each piece is vetted on its own when it is loaded or saved, which
    names the one at fault. Never raises."""
    todo, keys = [], []
    for name, path, function in requests:
        try:
            source = read_piece(path)
        except OSError:
            continue
        key = _key(name, source, function, at_save)
        if key not in _VERDICTS and key not in keys:
            todo.append((name, Path(path), function, at_save, source))
            keys.append(key)
    if len(todo) < 2 or not hasattr(os, "killpg"):
        return                                # one piece: `vet` starts its own child
    with _child(todo) as started:
        if isinstance(started, str):
            return
        child, progress = started
        watched = _Watch(child, progress).run(_piece_guard.PIECE_SECONDS, len(todo))
        left = _end(child, kill=bool(watched.late or watched.written > OUTPUT_LIMIT))
        watched.read_rest()
    answers = [watched.answer(i) for i in range(len(todo))]
    if (not left and child.returncode == 0 and len(watched.verdicts) == len(todo)
            and not watched.pending and ... not in answers):
        _VERDICTS.update(zip(keys, answers))


@contextmanager
def _child(requests):
    """(child, the read end of its progress pipe) for a child vetting `requests`, or why
    no child could start. The spare child is taken when it was started as a child would
    be started now; a new spare is started after, for the next vetting."""
    pieces = [[name, str(Path(path).resolve()), function, bool(at_save),
               base64.b64encode(source).decode()]
              for name, path, function, at_save, source in requests]
    with _SPARE_LOCK:
        started = _take_spare() or _start_child()
    if isinstance(started, str):
        yield started
        return
    try:
        _hand(started, pieces)
        yield started.process, started.progress
    finally:
        _let_go(started)
        start_spare()


@dataclass
class _Started:
    """A child process, its progress pipe, the pipe whose closing ends it (the kernel
    holds the write end), its scratch folder, and how it was started."""
    process: subprocess.Popen
    progress: int
    lifeline: int
    scratch: tempfile.TemporaryDirectory
    recipe: tuple


def _recipe() -> tuple:
    """What decides how a child starts: a spare started otherwise is not used."""
    return sys.executable, _CHILD, MEMORY_BYTES, os.getpid()


def _start_child():
    """A new child, importing what a check needs, then waiting for its pieces on stdin;
    or why none could start."""
    if os.environ.get(IN_CHILD):
        return "this process is itself a vetting child"
    progress, report = os.pipe()
    alive, lifeline = os.pipe()
    scratch = tempfile.TemporaryDirectory(prefix="backprop-vetting-")
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", "-c", _CHILD, json.dumps([str(ROOT)]), str(report),
             str(MEMORY_BYTES), _child_box.__file__, str(os.getpid()), str(alive)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            pass_fds=(report, alive), cwd=scratch.name, start_new_session=True,
            env={**os.environ, IN_CHILD: "1"})
    except OSError as err:
        for fd in (progress, lifeline):
            os.close(fd)
        scratch.cleanup()
        return f"no process could be started: {err}"
    finally:
        os.close(report)
        os.close(alive)
    return _Started(process, progress, lifeline, scratch, _recipe())


def _hand(started: _Started, pieces: list) -> None:
    """Give the child its pieces with the kernel's import path and environment as they are
    now. A child that has already ended says why when it is watched."""
    request = {"path": _import_path(), "environ": dict(os.environ), "pieces": pieces}
    try:
        started.process.stdin.write(json.dumps(request).encode() + b"\n")
        started.process.stdin.close()
    except (BrokenPipeError, OSError):
        pass


def _let_go(started: _Started) -> None:
    if started.process.returncode is None:      # left early (an exception): end it here
        _end(started.process, kill=True)
    for stream in (started.process.stdin, started.process.stdout):
        try:
            stream.close()
        except OSError:
            pass
    os.close(started.progress)
    os.close(started.lifeline)
    started.scratch.cleanup()


_SPARE_LOCK = threading.Lock()
_SPARE: list = []           # at most one child started ahead of need, idle until used


def start_spare() -> None:
    """Start a child ahead of need, so that the next vetting finds the engine imported
    (about half a second, a second with the trainer) instead of waiting for it. Never
    raises; does nothing in a vetting child, or where a spare is already waiting."""
    if not hasattr(os, "killpg"):
        return
    with _SPARE_LOCK:
        if _spare_ready():
            return
        _drop_spare()
        started = _start_child()
        if not isinstance(started, str):
            _SPARE.append(started)


def _spare_ready() -> bool:
    """Whether a spare waits that was started as a child would be started now."""
    return bool(_SPARE) and _SPARE[0].recipe == _recipe() and _SPARE[0].process.poll() is None


def _take_spare():
    """The waiting spare when `_spare_ready`; else None (and any spare is ended)."""
    if _spare_ready():
        return _SPARE.pop()
    _drop_spare()
    return None


def _drop_spare() -> None:
    while _SPARE:
        _let_go(_SPARE.pop())


@atexit.register
def _end_spare_at_exit() -> None:
    with _SPARE_LOCK:
        _drop_spare()


def _import_path() -> list[str]:
    """The kernel's sys.path, relative entries (the notebook's folder) made absolute,
    the repository first: the child imports what the kernel would."""
    try:
        here = os.getcwd()
    except OSError:
        here = str(ROOT)
    entries = [str(ROOT)] + [os.path.join(here, p) for p in sys.path if isinstance(p, str)]
    return list(dict.fromkeys(entries))


def _unvetted(piece: str, why: str):
    print(f"({piece} could not be vetted in a separate process ({why}); it is loaded under "
          f"the notebook's own guard only.)")
    return UNVETTED


def _cpu_seconds(pid: int) -> float | None:
    """CPU time the process `pid` has used (all its threads), or None where /proc
    does not say (then the clock measures the piece)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class _Watch:
    """The child's progress (p: the worker's process id, one line; i: what isolates it,
    one line; r: imported; c/e: a compilation starts/ends; v: a piece's verdict, one
    line) and output, read until it has answered for every piece, exits or
    runs out of time. Each piece's time, compile time and wait start again at zero."""

    def __init__(self, child, progress: int):
        self.child, self.progress, self.output = child, progress, child.stdout.fileno()
        self.verdicts: list[bytes] = []
        self.pending, self.shown, self.written = b"", b"", 0
        self.ready = self.compiling = False
        self.waited = self.computed = self.compiled = 0.0
        self.late = None
        self.worker = child.pid

    def run(self, seconds: float, count: int) -> "_Watch":
        start = last = time.monotonic()
        cpu = last_cpu = 0.0
        counted = self.worker           # the process whose CPU time `last_cpu` is
        open_fds = [self.progress, self.output]
        while len(self.verdicts) < count:
            readable, _, _ = select.select(open_fds, [], [], _TICK)
            now, cpu = time.monotonic(), _cpu_seconds(self.worker)
            if self.worker != counted:  # the keeper named its worker: count from here, not
                counted = self.worker   # the worker's start-up (its imports) as the piece's
                last_cpu = 0.0 if cpu is None else cpu
            if self.ready:
                if self.compiling:
                    self.compiled += now - last
                else:
                    self.waited += now - last
                    self.computed += (now - last) if cpu is None else max(cpu - last_cpu, 0)
            last, last_cpu = now, (last_cpu if cpu is None else cpu)
            for fd in readable:
                self._read(fd, open_fds)
            if not readable and self.child.poll() is not None:
                break
            self.late = ("start" if not self.ready and now - start > STARTUP_SECONDS else
                         "compile" if self.compiled > COMPILE_SECONDS else
                         "run" if self.computed > seconds else
                         "wait" if self.waited > WAIT_FACTOR * seconds else None)
            if self.late or self.written > OUTPUT_LIMIT:
                break
        return self

    def _read(self, fd: int, open_fds: list) -> None:
        data = os.read(fd, 1 << 16)
        if not data:
            open_fds.remove(fd)
        elif fd == self.progress:
            self._progress(data)
        else:
            self.written += len(data)
            self.shown = (self.shown + data)[-2000:]

    def _progress(self, data: bytes) -> None:
        self.pending += data
        while self.pending:
            if self.pending[:1] in (b"v", b"p", b"i"):
                line, newline, rest = self.pending[1:].partition(b"\n")
                if not newline:
                    return                    # the rest of the line is still on its way
                self._line(self.pending[:1], line)
                self.pending = rest
                continue
            mark, self.pending = chr(self.pending[0]), self.pending[1:]
            self.ready = self.ready or mark == "r"
            self.compiling = {"c": True, "e": False}.get(mark, self.compiling)

    def _line(self, mark: bytes, line: bytes) -> None:
        if mark == b"v":
            self.verdicts.append(line)
            self.waited = self.computed = self.compiled = 0.0
        elif mark == b"p" and self.worker == self.child.pid and line.isdigit():
            self.worker = int(line)           # the keeper says it first, before any piece
        elif mark == b"i" and not self.ready:
            try:
                ISOLATION[:] = [str(m) for m in json.loads(line)]
            except (ValueError, TypeError):
                pass

    def read_rest(self) -> None:
        """What the child wrote after its last awaited verdict (it has ended)."""
        os.set_blocking(self.progress, False)
        try:
            while data := os.read(self.progress, 1 << 16):
                self.pending += data
        except (BlockingIOError, OSError):
            pass

    def answer(self, i: int = 0):
        """Piece i's verdict as the child reported it, or ... when it reported none."""
        if i >= len(self.verdicts):
            return ...
        try:
            answer = json.loads(self.verdicts[i])
            return None if answer is None else (str(answer[0]), str(answer[1]))
        except (ValueError, TypeError, IndexError):
            return ...


def _end(child, kill: bool) -> bool:
    """End the child and whatever it started in its group; True when something of the
    group was still running after the child itself had ended."""
    if not kill:
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    left = False
    if child.returncode is None:              # the keeper is alive: all it holds is below it
        for _ in range(50):
            below = _child_box.descendants(child.pid)
            if not below:
                break
            for pid in below:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
    try:
        if child.returncode is not None:
            os.killpg(child.pid, 0)           # anyone left in the group?
            left = True
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child.wait()
    return left


def _why_stopped(late: str, computed: float, waited: float, seconds: float) -> str:
    """Why a piece past its deadline was stopped. On a busy machine a loop that never ends
    gets a share of a core, so the clock's limit comes first; a piece that sleeps or blocks
    computes almost nothing, so a tenth of the clock spent computing tells the two apart."""
    if late == "run":
        return "a loop that never ends?"
    if computed >= waited / 10:
        return (f"it computed for {computed:.1f} s of CPU time in {waited:.0f} s on the clock, "
                f"on a busy machine: a loop that never ends?")
    return (f"it waited {WAIT_FACTOR * seconds:g} s: a sleep, a read or a lock that never "
            f"returns?")


def _verdict(piece: str, child, watched: _Watch):
    left = _end(child, kill=bool(watched.late or watched.written > OUTPUT_LIMIT))
    seconds = _piece_guard.PIECE_SECONDS
    if watched.late == "start" or not watched.ready:
        said = watched.shown.decode("utf-8", "replace").strip().splitlines()
        return _unvetted(piece, f"its start took longer than {STARTUP_SECONDS:g} s"
                         if watched.late else f"it ended before the piece ran: "
                         f"{said[-1][:200] if said else child.returncode}")
    if watched.late in ("run", "wait"):
        why = _why_stopped(watched.late, watched.computed, watched.waited, seconds)
        return "refused", (f"{piece} ran longer than {seconds:g} s and was stopped ({why}). "
                           f"Fix the loop and run its exercise's check again")
    if watched.late == "compile":
        return "refused", (f"{piece} took longer than {COMPILE_SECONDS:g} s to compile with "
                           f"numba and was stopped")
    if watched.written > OUTPUT_LIMIT:
        return "refused", (f"{piece} writes more than {OUTPUT_LIMIT:,} bytes straight to the "
                           f"process's output (sys.__stdout__, sys.__stderr__ or a C library), "
                           f"past the notebook's bound; print what you need with print()")
    answer = watched.answer()
    if answer is not ... and answer is not None:
        return answer
    if left:
        return "refused", (f"{piece} leaves a process running after its check (a fork or a "
                           f"subprocess); it was ended. Do the work in the function itself")
    code = child.returncode
    if answer is None and code == 0:
        return None
    if answer is None:
        return "refused", (f"{piece} did not let the process end after its check (exit code "
                           f"{code}); it was ended. A piece must leave nothing running")
    how = (f"was killed by {_signal_name(-code)}" if code < 0 else
           f"ended the process with exit code {code} (os._exit, or a crash)")
    said = watched.shown.decode("utf-8", "replace").strip().splitlines()
    return "refused", (f"{piece} {how} while it was loaded and checked"
                       + (f"; its last line: {said[-1][:200]}" if said else "")
                       + ". A piece must return, not end the notebook's process")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
