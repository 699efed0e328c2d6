"""A JupyterLab for the real-browser tests: on 127.0.0.1, a free port, a random token,
over a folder of the test's own; and the headless Debian Chromium that drives it.

Needs /usr/bin/chromium (`apt-get install -y chromium`; `.ci/run` installs it) and the
`playwright` package; without them `REASON` says why and the tests skip. Playwright's
own browser downloads are never used.
"""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-dev-shm-usage"]


def why_not_runnable() -> str | None:
    if not os.path.exists(CHROMIUM):
        return (f"{CHROMIUM} is missing: install Debian's Chromium "
                f"(`apt-get install -y chromium`) to run the real-browser test")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (`pip install -e '.[test]'`)"
    return None


REASON = why_not_runnable()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(url: str, server: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with code {server.returncode} before serving")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"JupyterLab did not answer {url} within {timeout:.0f} s")


def write_notebook(path: Path, cells: list[str]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)


@contextmanager
def serving_lab(folder: Path, extra_args=(), extra_env=None):
    """JupyterLab over `folder` (its runtime and config kept inside it); yields
    (base URL, token) and stops the server and its kernels afterwards."""
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(folder / ".runtime"),
           "JUPYTER_CONFIG_DIR": str(folder / ".config"), **(extra_env or {}),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log = open(folder / "lab.log", "w")
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("jupyter")), "lab", "--allow-root", "--no-browser",
         "--ip=127.0.0.1", f"--port={port}", f"--ServerApp.token={token}",
         "--LabApp.expose_app_in_browser=True", *extra_args, f"--notebook-dir={folder}"],
        cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(f"{base}/api/status?token={token}", server)
        yield base, token
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)  # the session we started: server + kernel
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
        log.close()


@contextmanager
def chromium():
    """Headless Debian Chromium through Playwright."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
