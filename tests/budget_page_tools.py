"""The budget page served for a test: `python -m widgets.budget_app` on 127.0.0.1 at a
free port, in a session of its own; and small HTTP helpers. Tests that use it skip
when the page's extra (starlette, uvicorn) is not installed."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def get(url: str, host: str | None = None, headers=None, timeout: float = 30):
    """(status, headers, body text) of a GET; HTTP errors are answers too."""
    request = urllib.request.Request(url, headers={**({"Host": host} if host else {}),
                                                   **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, dict(reply.headers), reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


def get_json(url: str, **kw):
    status, headers, body = get(url, **kw)
    return status, json.loads(body)


@contextmanager
def serving(folder: Path, *args: str, port: int, host: str = "127.0.0.1",
            delay: float = 0.0, env: dict | None = None):
    """The page on `host`:`port` (`args` say more; `env`, variables beside this
    process's); with `delay`, every budget answer held back that many seconds
    (tests/budget_page_slow.py). Yields (base URL, process)."""
    log = open(folder / "budget-page.log", "w")
    start = ([sys.executable, str(ROOT / "tests" / "budget_page_slow.py"), str(delay)] if delay
             else [sys.executable, "-m", "widgets.budget_app"])
    server = subprocess.Popen(
        [*start, "--port", str(port), "--no-browser", *args], cwd=ROOT, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **(env or {})})
    base = f"http://{host}:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the budget page exited with {server.returncode}: "
                                   f"{(folder / 'budget-page.log').read_text()}")
            try:
                get(base + "/assumptions", timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the budget page did not answer {base}")
                time.sleep(0.2)
        yield base, server
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def open_files(pid: int) -> int:
    """How many file descriptors process `pid` holds (Linux /proc)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


class Flood:
    """What `flooding` left: the half-open sockets and the 200 requests' statuses."""

    def __init__(self):
        self.slow: list = []
        self.results: list = []


@contextmanager
def flooding(base: str, half_open: int = 400, parallel: int = 200):
    """`half_open` connections that send half a request head and stop, and `parallel`
    requests for settings nobody asked for before, all under way while the body runs;
    the requests are awaited after it. Yields a Flood."""
    port = int(base.rsplit(":", 1)[1])
    flood = Flood()
    for _ in range(half_open):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # and never the rest
        flood.slow.append(s)

    def ask(i: int) -> None:
        try:
            flood.results.append(get(base + f"/api/budget?preset=gpt2-medium&micro_batch="
                                            f"{i + 1}", timeout=60)[0])
        except OSError as exc:
            flood.results.append(type(exc).__name__)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(parallel)]
    for t in threads:
        t.start()
    try:
        yield flood
    finally:
        for t in threads:
            t.join(timeout=120)

