"""Running a learner's piece inside the notebook without letting it take the session along.

Loading a saved piece and checking it in its slot run the learner's code in the
notebook's own process (a piece is a function the engine will call there, so it
is checked there). `guarded(piece)` bounds what that code can do to the session:

* time: a piece that loops is stopped after `PIECE_SECONDS` and the slot falls
  back to the engine's version, saying why. The deadline is a SIGALRM timer in
  the main thread, where a notebook runs its cells: the interrupt lands in the
  learner's own Python loop, so the loop really ends (a thread could only stop
  waiting for it, and it would keep a core busy for the rest of the session).
  Time numba spends compiling (the engine's kernels, the first time a check
  runs them) does not count, and a compilation is never interrupted. Compiled
  numba code does not see signals until it returns; elsewhere than the main
  thread, or without SIGALRM (Windows), the piece runs without a deadline.
* output: what it prints is kept up to `PRINT_LIMIT` characters per stream and
  shown after, with how much was cut, so a piece printing in a loop cannot flood
  the notebook.
* numpy: the global random state, the floating-point error handling (seterr) and
  the print options are put back as they were found.
* libraries: a piece that replaces a function of numpy, math, numba or the
  builtins (`np.sqrt = ...`) would change every later cell; the original is put
  back and the piece is refused.

Anything that breaks a bound leaves the block as `PieceRefused`, whose message
says what the piece did and what to change.
"""
from __future__ import annotations

import builtins
import io
import math
import signal
import sys
import threading
import time

import numba
import numba.core.event
import numpy as np

PIECE_SECONDS = 20.0     # loading plus a slot check takes well under 5 s on a laptop
PRINT_LIMIT = 2_000      # characters of a piece's output shown per stream
_REPEAT_SECONDS = 0.5    # the timer fires again until the deadline, net of compiling, passes
_COMPILING = "numba:compiler_lock"     # numba's event around every compilation

WATCHED_MODULES = {"np": np, "np.random": np.random, "np.linalg": np.linalg, "math": math,
                   "numba": numba, "builtins": builtins}


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


def _library_snapshot() -> dict:
    return {label: dict(vars(module)) for label, module in WATCHED_MODULES.items()}


def _restore_libraries(before: dict) -> list[str]:
    """Put back every watched attribute the piece replaced, removed or (in builtins)
    added; return their names, e.g. ['np.sqrt']."""
    changed = []
    for label, module in WATCHED_MODULES.items():
        now = vars(module)
        for key, value in before[label].items():
            if now.get(key, _MISSING) is not value:
                changed.append(f"{label}.{key}")
                setattr(module, key, value)
        if module is builtins:
            for key in set(now) - set(before[label]):
                changed.append(f"builtins.{key}")
                delattr(module, key)
    return sorted(changed)


_MISSING = object()


class guarded:
    """`with guarded("the piece 'x'"):` runs the learner's code within the bounds
    the module docstring lists; a broken bound leaves the block as PieceRefused."""

    def __init__(self, piece: str, seconds: float | None = None):
        self.piece = piece
        self.seconds = PIECE_SECONDS if seconds is None else seconds

    def __enter__(self):
        self.random_state, self.errors = np.random.get_state(), np.geterr()
        self.error_call, self.print_options = np.geterrcall(), np.get_printoptions()
        self.libraries = _library_snapshot()
        self.streams = sys.stdout, sys.stderr
        self.out, self.err = _BoundedText(PRINT_LIMIT), _BoundedText(PRINT_LIMIT)
        sys.stdout, sys.stderr = self.out, self.err
        self.armed = self._arm()
        return self

    def _arm(self) -> bool:
        if not hasattr(signal, "setitimer") or threading.current_thread() is not \
                threading.main_thread():
            return False

        compiling = self.compiling = _CompileClock()
        start = time.monotonic()

        def time_is_up(signum, frame):
            if self.armed and not compiling.depth and \
                    time.monotonic() - start - compiling.seconds >= self.seconds:
                raise _Deadline
        numba.core.event.register(_COMPILING, compiling)
        self.old_handler = signal.signal(signal.SIGALRM, time_is_up)
        self.old_timer = signal.setitimer(signal.ITIMER_REAL, self.seconds, _REPEAT_SECONDS)
        return True

    def _disarm(self) -> None:
        if self.armed:
            self.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.old_handler)
            numba.core.event.unregister(_COMPILING, self.compiling)
            if self.old_timer[0]:          # someone else's timer was running: set it again
                signal.setitimer(signal.ITIMER_REAL, *self.old_timer)

    def __exit__(self, kind, err, tb):
        late = False
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
        replaced = _restore_libraries(self.libraries)
        if replaced:
            names = ", ".join(f"`{name}`" for name in replaced)
            raise PieceRefused(
                f"{self.piece} replaces {names}, which every other cell and the engine use "
                f"(they were put back). Give your own function a name of its own instead "
                f"of assigning to a library's") from None
        if late or kind is _Deadline:
            raise PieceRefused(
                f"{self.piece} ran longer than {self.seconds:g} s and was stopped (a loop "
                f"that never ends?). Fix the loop and run its exercise's check again") from None
        return False
