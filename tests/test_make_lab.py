"""`make lab` serves JupyterLab on course/ with the notebooks listed, opens the
start page, and its terminals find the course's own pytest (.venv/bin first on
PATH), so `pytest --nbval NN_topic.ipynb` typed there works."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = ROOT / ".venv" / "bin"

from lab_tools import free_port


def _run_in_lab_terminal(port: int, token: str, command: str, timeout: float = 30) -> str:
    """Start a terminal through the server's REST API, run `command` in it over its
    websocket, and return what it printed."""
    import websocket  # websocket-client, a dependency of jupyter_server
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/terminals?token={token}",
                                     method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=10) as r:
        name = json.load(r)["name"]
    ws = websocket.create_connection(
        f"ws://127.0.0.1:{port}/terminals/websocket/{name}?token={token}", timeout=timeout)
    try:
        # the terminal echoes what is typed: only the output has the sum worked out
        ws.send(json.dumps(["stdin", f"{command}; echo END-OF-$((40 + 2))\r"]))
        printed, deadline = "", time.time() + timeout
        while time.time() < deadline and "END-OF-42" not in printed:
            kind, *data = json.loads(ws.recv())
            if kind == "stdout":
                printed += data[0]
        return printed
    finally:
        ws.close()


def test_make_lab_serves_the_course():
    port, token = free_port(), "course-test-token"
    args = f"--no-browser --ip=127.0.0.1 --port={port} --ServerApp.token={token}"
    proc = subprocess.Popen(["make", "lab", f"LAB_ARGS={args}"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}/api/contents?token={token}"
        deadline, listing = time.time() + 120, None
        while time.time() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    listing = json.load(r)
                break
            except OSError:
                time.sleep(0.5)
        assert listing is not None, f"JupyterLab did not answer on port {port}: " + (
            proc.stdout.read() if proc.poll() is not None else "still starting")
        names = {item["name"] for item in listing["content"]}
        assert "00_why_backprop.ipynb" in names, sorted(names)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={token}", timeout=10) as r:
            assert r.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/?token={token}", timeout=10) as r:
            assert r.url.split("?")[0].endswith("/lab/tree/00_start_here.ipynb"), r.url
        assert "00_start_here.ipynb" in names
        assert min(n for n in names if n.endswith(".ipynb")) == "00_start_here.ipynb"
        notices = (f"http://127.0.0.1:{port}/lab/api/settings/"
                   f"@jupyterlab/apputils-extension:notification?token={token}")
        with urllib.request.urlopen(notices, timeout=10) as r:
            schema = json.load(r)["schema"]["properties"]  # overrides become the defaults
        assert schema["fetchNews"]["default"] == "false", (
            f"the course's lab should not ask about or fetch Jupyter news: {schema['fetchNews']}")
        found = _run_in_lab_terminal(port, token, "which pytest python; pwd")
        assert f"{ROOT / 'course'}\r\n" in found, f"the terminal does not start in course/: {found!r}"
        assert f"{VENV_BIN}/pytest" in found and f"{VENV_BIN}/python" in found, (
            f"a JupyterLab terminal finds another pytest/python: {found!r}")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
    assert f"127.0.0.1:{port}" in out, "make lab should print the URL"
