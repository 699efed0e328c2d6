"""`make lab` serves JupyterLab on course/ with the notebooks listed."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
    assert f"127.0.0.1:{port}" in out, "make lab should print the URL"
