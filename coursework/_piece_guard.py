"""Running a learner's piece inside the notebook without letting it take the session along.

A piece is a function the engine will call in the notebook's own process, so it is
loaded there. `guarded(piece)` bounds what the learner's code can do to the session
while it is loaded (and checked, where no child process could check it first):

* time: a piece that loops is stopped after `PIECE_SECONDS` and the slot falls
  back to the engine's version, saying why. The deadline is a SIGALRM timer in
  the main thread, where a notebook runs its cells: the interrupt lands in the
  learner's own Python loop, so the loop really ends (a thread could only stop
  waiting for it, and it would keep a core busy for the rest of the session). A
  loop that catches the interrupt (a bare `except:`) gets it again on every line it
  runs from the next tick on (a trace function), so it cannot catch its way out.
  Time numba spends compiling (the engine's kernels, the first time a check
  runs them) does not count, and a compilation is never interrupted. Compiled
  numba code does not see signals until it returns; elsewhere than the main
  thread, or without SIGALRM (Windows), the piece runs without a deadline.
* output: what it prints is kept up to `PRINT_LIMIT` characters per stream and
  shown after, with how much was cut, so a piece printing in a loop cannot flood
  the notebook.
* numpy: the global random state, the floating-point error handling (seterr) and
  the print options are put back as they were found.
* threads: a piece that leaves a thread running (one Python lists, or one hidden from the
  threading module) is refused; the thread itself cannot be stopped.
* the kernel: whatever a piece could change in the process (the functions of numpy,
  math, numba and the builtins, numpy's array and ufunc methods, the engine's and the
  course's modules and classes, the working directory, environment variables, the
  recursion limit, warning filters, signal handlers and timers: `_kernel_state`) is put
  back, and the piece is refused, naming what it changed. A fork is ended in the copy
  at once, and refused.

This guard is the second line: `_vetting` first runs the load and the slot check in a
child process that is killed at its deadline, so a piece that would hang, exit or fork
here is refused before the kernel ever loads it.

Anything that breaks a bound leaves the block as `PieceRefused`, whose message
says what the piece did and what to change.
"""
from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time

import numba
import numba.core.event
import numpy as np

from ._child_box import start_numba_threads, threads_now
from ._kernel_state import KernelState

PIECE_SECONDS = 20.0     # loading plus a slot check takes well under 5 s on a laptop
WAIT_FACTOR = 3.0        # clock seconds a piece may take per CPU second it may use
PRINT_LIMIT = 2_000      # characters of a piece's output shown per stream
_REPEAT_SECONDS = 0.5    # the timer fires again until the deadline, net of compiling, passes
_COMPILING = "numba:compiler_lock"     # numba's event around every compilation



class PieceRefused(Exception):
    """A piece broke one of `guarded`'s bounds; the message says which and the fix."""


class _Deadline(BaseException):
    """Raised into the piece's code when its time is up. A BaseException, so the
    learner's `except Exception:` (and the slot check's) does not swallow it."""


class _BoundedText(io.TextIOBase):
    """A text stream that keeps its first `limit` characters and counts the rest."""

    def __init__(self, limit: int):
        self.limit, self.kept, self.total = limit, [], 0

    def writable(self) -> bool:
        return True

    def write(self, text) -> int:
        text = str(text)
        room = self.limit - min(self.total, self.limit)
        if room:
            self.kept.append(text[:room])
        self.total += len(text)
        return len(text)

    def show(self, stream, piece: str) -> None:
        """Write what was kept to `stream`, and how much was cut."""
        if self.total:
            stream.write("".join(self.kept))
            if self.total > self.limit:
                stream.write(f"\n({piece} printed {self.total:,} characters; the first "
                             f"{self.limit:,} are shown.)\n")


class _CompileClock(numba.core.event.Listener):
    """Whether numba is compiling now, and for how many seconds it has compiled."""

    def __init__(self):
        self.depth, self.seconds, self.started = 0, 0.0, 0.0

    def on_start(self, event):
        if self.depth == 0:
            self.started = time.monotonic()
        self.depth += 1

    def on_end(self, event):
        self.depth -= 1
        if self.depth == 0:
            self.seconds += time.monotonic() - self.started


_forks = {"guarding": False, "count": 0}


def _fork_in_guard_parent() -> None:
    if _forks["guarding"]:
        _forks["count"] += 1


def _fork_in_guard_child() -> None:
    if _forks["guarding"]:      # a copy of the notebook's process: end it before it runs on
        os._exit(0)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_parent=_fork_in_guard_parent,
                        after_in_child=_fork_in_guard_child)


def _refusal(piece: str, changed: list[str]) -> str:
    """The reason a piece that changed the kernel's state is refused."""
    replaced = [f"`{name}`" for name in changed if not name.startswith(("the ", "gc.", "sys."))]
    other = [name for name in changed if name.startswith(("the ", "gc.", "sys."))]
    what = " and ".join(part for part in (
        f"replaces {', '.join(replaced)}" if replaced else "",
        f"changes {', '.join(other)}" if other else "") if part)
    return (f"{piece} {what}, which every other cell and the engine use (they were put "
            f"back). Give your own function a name of its own instead of assigning to a "
            f"library's, and leave the process's settings as you found them")


class guarded:
    """`with guarded("the piece 'x'"):` runs the learner's code within the bounds
    the module docstring lists; a broken bound leaves the block as PieceRefused."""

    def __init__(self, piece: str, seconds: float | None = None, timer: bool = True,
                 threads: bool = True):
        self.piece, self.timer, self.watch_threads = piece, timer, threads
        self.seconds = PIECE_SECONDS if seconds is None else seconds

    def __enter__(self):
        self.random_state, self.errors = np.random.get_state(), np.geterr()
        self.error_call, self.print_options = np.geterrcall(), np.get_printoptions()
        self.state = KernelState()
        start_numba_threads()             # its pool is the engine's, not the piece's
        self.threads, self.os_threads = set(threading.enumerate()), threads_now()
        self.forks, _forks["guarding"] = _forks["count"], True
        self.streams = sys.stdout, sys.stderr
        self.out, self.err = _BoundedText(PRINT_LIMIT), _BoundedText(PRINT_LIMIT)
        sys.stdout, sys.stderr = self.out, self.err
        self.armed = self._arm()
        return self

    def _arm(self) -> bool:
        if not self.timer or not hasattr(signal, "setitimer") or \
                threading.current_thread() is not threading.main_thread():
            return False

        compiling = self.compiling = _CompileClock()
        start, cpu = time.monotonic(), time.process_time()
        self.overdue = 0

        def time_is_up(signum, frame):
            # the child's deadline: CPU time, or the clock past WAIT_FACTOR times as long
            waited = time.monotonic() - start - compiling.seconds
            computed = time.process_time() - cpu - compiling.seconds
            if self.armed and not compiling.depth and \
                    (computed >= self.seconds or waited >= WAIT_FACTOR * self.seconds):
                self.overdue += 1
                if self.overdue == 2:          # the first one was caught: every line now
                    self._raise_on_every_line(frame)
                raise _Deadline
        numba.core.event.register(_COMPILING, compiling)
        self.old_handler = signal.signal(signal.SIGALRM, time_is_up)
        self.old_timer = signal.setitimer(signal.ITIMER_REAL, self.seconds, _REPEAT_SECONDS)
        return True

    def _raise_on_every_line(self, frame) -> None:
        """Trace the main thread so that each line it runs raises _Deadline, until
        `__exit__` starts (the piece's `except:` bodies are lines too)."""
        own = {guarded.__exit__.__code__}

        self.raising = True

        def trace(frame, event, arg):
            if frame.f_code in own:
                self.raising = False
            if not self.raising:
                return None
            if event in ("line", "call"):
                raise _Deadline
            return trace
        self.traced = (sys.gettrace(), [])
        sys.settrace(trace)
        while frame is not None:
            self.traced[1].append((frame, frame.f_trace))
            frame.f_trace, frame.f_trace_lines = trace, True
            frame = frame.f_back

    def _disarm(self) -> None:
        traced = getattr(self, "traced", None)
        if traced is not None:
            self.traced = None
            sys.settrace(traced[0])
            for frame, old in traced[1]:
                frame.f_trace = old
        if self.armed:
            self.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.old_handler)
            numba.core.event.unregister(_COMPILING, self.compiling)
            if self.old_timer[0]:          # someone else's timer was running: set it again
                signal.setitimer(signal.ITIMER_REAL, *self.old_timer)

    def __exit__(self, kind, err, tb):
        self.raising, late = False, False
        while True:                       # the timer may fire once more while it is stopped
            try:
                self._disarm()
                break
            except _Deadline:
                late = True
        sys.stdout, sys.stderr = self.streams
        self.out.show(sys.stdout, self.piece)
        self.err.show(sys.stderr, self.piece)
        np.random.set_state(self.random_state)
        np.seterr(**self.errors)
        np.seterrcall(self.error_call)
        np.set_printoptions(**self.print_options)
        _forks["guarding"] = False
        changed = self.state.restore()
        if changed:
            raise PieceRefused(_refusal(self.piece, changed)) from None
        if _forks["count"] != self.forks:
            raise PieceRefused(
                f"{self.piece} forks the process (os.fork), which would leave a second "
                f"notebook kernel running (the copy was ended at once). Run the work in "
                f"the function itself") from None
        started = [t.name for t in threading.enumerate()
                   if t not in self.threads and t.is_alive()] if self.watch_threads else []
        unseen = threads_now() - self.os_threads - len(started) if self.watch_threads else 0
        started += [f"{unseen} that Python does not list"] * (unseen > 0)
        if started and not (late or kind is _Deadline):
            raise PieceRefused(
                f"{self.piece} starts a thread ({', '.join(started)}) that still runs after "
                f"it returned, and runs on in the notebook's kernel. Do the work in the "
                f"function itself") from None
        if late or kind is _Deadline:
            raise PieceRefused(
                f"{self.piece} ran longer than {self.seconds:g} s and was stopped (a loop "
                f"that never ends?). Fix the loop and run its exercise's check again") from None
        return False
