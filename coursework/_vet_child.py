"""The child process `_vetting` starts: it loads pieces and checks each in its slot.

This is the worker of `_child_box.hold`: the process that runs the pieces, in the box
that module describes. `main([fd, memory_bytes])` imports what a check needs, then waits
(it may be started ahead of need) for one line on stdin: the pieces, a JSON list of
[name, path, function, at_save, the file's bytes in base64] (the kernel read the file
once and loads the same bytes), with the kernel's import path and environment as they
are now. It then limits its address space to what the imports mapped plus
`memory_bytes`, confines its writes (`_child_box.confine`), says "i" and what isolates
it (a JSON list on one line) and "r" on the descriptor `fd` when it is ready, "c" and "e" around every numba compilation (the
parent's deadline does not count those), and after each piece "v" and its verdict as
JSON on one line: null, or [kind, text] as `pieces.attempt_piece` gives them. The pieces
run one after the other in this one process, as the notebook's kernel would load them.
The parent kills this process at its deadline; it never has to stop on its own.
"""
from __future__ import annotations

import base64
import json
import os
import sys
import threading

from coursework import _child_box


def _limit_memory(more: int) -> None:
    """Let the process map at most `more` bytes beyond what it has mapped now (Linux)."""
    try:
        import resource
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = mapped + more
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        if soft == resource.RLIM_INFINITY or soft > limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, ValueError, OSError):
        pass


def _say_when_compiling(fd: int) -> None:
    import numba.core.event as event

    class Compiling(event.Listener):
        def on_start(self, _):
            os.write(fd, b"c")

        def on_end(self, _):
            os.write(fd, b"e")

    event.register("numba:compiler_lock", Compiling())


class _Threads:
    """The threads the piece starts, by the threading module, by `_thread` directly, or
    or any other way (a thread removed from `threading._active` still runs Python)."""

    def __init__(self):
        import _thread
        self.before, self.raw = set(threading.enumerate()), []
        self.os_threads = _child_box.threads_now()
        start = _thread.start_new_thread

        def start_new_thread(function, args, kwargs=None):
            token = getattr(function, "__name__", repr(function))
            self.raw.append(token)

            def run(*args, **kwargs):
                try:
                    return function(*args, **kwargs)
                finally:
                    if token in self.raw:
                        self.raw.remove(token)
            return start(run, args, kwargs or {})
        _thread.start_new_thread = start_new_thread

    def next_piece(self) -> None:
        """Count from here: a thread an earlier piece left was that piece's refusal."""
        self.before, self.raw[:] = set(threading.enumerate()), []
        self.os_threads = _child_box.threads_now()

    def left_running(self) -> list[str]:
        alive = [t.name for t in threading.enumerate() if t not in self.before and t.is_alive()]
        alive += list(self.raw)
        unseen = _child_box.threads_now() - self.os_threads - len(alive)
        return alive + [f"{unseen} that Python does not list"] * (unseen > 0)


def _wait_for_request() -> dict | None:
    """The pieces to vet, with the kernel's import path and environment, read from stdin
    (None when the kernel ended first); stdin then reads nothing more."""
    line = sys.stdin.buffer.readline()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    if not line:
        return None
    request = json.loads(line)
    sys.path[:0] = [p for p in request["path"] if p not in sys.path]
    os.environ.clear()
    os.environ.update(request["environ"], BACKPROP_VETTING_CHILD="1", TMPDIR=os.getcwd())
    return request


def main(args: list[str]) -> None:
    fd, memory = int(args[0]), int(args[1])
    from pathlib import Path

    import engine  # noqa: F401  (the kernel has the engine imported when it loads a piece)
    import engine.trainer.model  # noqa: F401  (a trainer slot's import is not its piece's run)
    from coursework import pieces
    _child_box.start_numba_threads()
    request = _wait_for_request()
    if request is None:
        os._exit(0)
    _say_when_compiling(fd)
    _limit_memory(memory)
    _child_box.confine(os.getcwd(), str(Path(pieces.__file__).resolve().parents[1]))
    threads = _Threads()
    mechanisms = list(dict.fromkeys(_child_box.MECHANISMS))
    os.write(fd, b"i" + json.dumps(mechanisms).encode() + b"\n" + b"r")
    requests = request["pieces"]
    for name, path, function, at_save, source in requests:
        threads.next_piece()
        _, kind, text = pieces.attempt_piece(name, Path(path), function, bool(at_save),
                                             timer=False, source=base64.b64decode(source),
                                             threads=False)   # `_Threads` names them
        if kind is None:
            started, left = threads.left_running(), _child_box.children_left()
            if started:
                kind, text = "refused", (
                    f"your piece '{name}' starts a thread ({', '.join(started)}) that still "
                    f"runs after its check, and would run on in the notebook's kernel for the "
                    f"rest of the session. Do the work in the function itself")
            elif left:
                kind, text = "refused", (
                    f"your piece '{name}' leaves a process running after its check (a fork, "
                    f"a subprocess or a daemon); it was ended. Do the work in the function "
                    f"itself")
        for stream in (sys.stdout, sys.stderr):   # before the verdict: the parent may then
            try:                                  # stop reading the output
                stream.flush()
            except (OSError, ValueError):
                pass
        os.write(fd, b"v" + json.dumps(None if kind is None else [kind, text]).encode() + b"\n")
    os._exit(0)
