"""What a learner sees in JupyterLab, in a real browser.

Starts JupyterLab (as tests/test_browser.py does: 127.0.0.1, a free port, a random
token, headless Debian Chromium through Playwright) over a temporary folder
holding a copy of the course's start page and a small notebook, and checks

* the start page is what `/` opens (the Makefile's default URL) and shows the
  lessons and the folders;
* a failing exercise check shows its one-line message, not a traceback;
* the eps sweep redraws in place: a slider move changes the picture within a
  moment and the cell's height never drops, not even for one frame;
* the training dashboard is drawn while its cell still runs: its progress bar
  moves step by step before the cell ends; it shows smoothed tokens/s and, at
  the end, that the run stopped early and why.

Screenshots go to /tmp/learning_*.png. Skipped, saying why, without Chromium or
Playwright (see tests/test_browser.py).
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

from test_browser import (CHROMIUM, CHROMIUM_ARGS, REASON, _free_port,  # noqa: F401
                          _wait_until_serving)

ROOT = Path(__file__).resolve().parents[1]
SHOTS = Path("/tmp")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

CELLS = [
    # 0: the eps sweep
    "from widgets.eps_sweep import EpsSweep\nsweep = EpsSweep(eps=1e-6)\nsweep.ui",
    # 1: a dashboard fed a short run that stops early
    "import time\nfrom widgets.trainer import TrainerDashboard\n"
    "dash = TrainerDashboard(total_steps=40, redraw_every=5, title='a short run')\n"
    "display(dash.ui)\n"
    "for step in range(1, 13):\n"
    "    time.sleep(0.5)\n"
    "    dash({'step': step, 'loss': 4.0 - 0.1 * step, 'step_time': 0.5,\n"
    "          'tokens_per_s': 8192.0, 'grad_norm': 1.0})\n"
    "dash.finish(reason='the test time limit')",
    # 2: a check on a stub, as in an untouched student notebook (last: run-all stops here)
    "from coursework import lesson00\n"
    "def central_difference_gradient(loss, theta, eps):\n"
    "    # YOUR CODE HERE\n"
    "    raise NotImplementedError()\n"
    "lesson00.check_central_difference(central_difference_gradient)",
]


def _default_url() -> str:
    found = re.search(r"--LabApp\.default_url=(\S+)", (ROOT / "Makefile").read_text())
    assert found, "the Makefile's lab recipe sets no --LabApp.default_url"
    return found.group(1)


@pytest.fixture
def lab():
    """JupyterLab over a folder with the start page and learning.ipynb; yields
    (base URL, token, the folder)."""
    folder = Path(tempfile.mkdtemp(prefix="learning-lab-"))
    shutil.copy(ROOT / "course" / "00_start_here.ipynb", folder)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, folder / "learning.ipynb")
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(folder / ".runtime"),
           "JUPYTER_CONFIG_DIR": str(folder / ".config"),
           "BACKPROP_PIECES_DIR": str(folder / ".pieces"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log = open(folder / "lab.log", "w")
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("jupyter")), "lab", "--allow-root", "--no-browser",
         "--ip=127.0.0.1", f"--port={port}", f"--ServerApp.token={token}",
         "--LabApp.expose_app_in_browser=True", f"--LabApp.default_url={_default_url()}",
         f"--notebook-dir={folder}"],
        cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_until_serving(f"{base}/api/status?token={token}", server)
        yield base, token, folder
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)  # the session we started: server + kernel
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def test_the_start_page_opens_first(lab, browser):
    from playwright.sync_api import expect
    base, token, _ = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{base}/?token={token}")
    panel = page.locator(".jp-NotebookPanel").first
    panel.wait_for(timeout=120_000)
    expect(panel.locator("h1")).to_contain_text("start here", ignore_case=True, timeout=60_000)
    text = panel.inner_text()
    for shown in ("00", "13", "solutions/", "source/", "pytest --nbval", "# CHECK"):
        assert shown in text, f"the start page does not show {shown!r}"
    assert page.url.split("?")[0].endswith("/lab/tree/00_start_here.ipynb"), page.url
    page.screenshot(path=str(SHOTS / "learning_start_page.png"))


def _open_learning(browser, base, token, before_the_rest=None):
    """Open learning.ipynb, run its first cell, and once its widget is drawn (and
    `before_the_rest(page)` has run, if given), the rest.
    (JupyterLab's widget manager starts with the first widget it draws and asks the
    kernel for its state; a kernel busy with the next cells would answer only when
    they are all done, so a live view would show nothing until then.)"""
    from playwright.sync_api import expect
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(f"{base}/lab/tree/learning.ipynb?token={token}&reset")
    page.locator(".jp-NotebookPanel").first.wait_for(timeout=120_000)
    page.locator("#jp-main-statusbar >> text=Idle").first.wait_for(timeout=120_000)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-cell-and-select-next')")
    first = page.locator(".jp-NotebookPanel .jp-CodeCell").nth(0)
    expect(first.locator(".widget-label").filter(has_text="eps = ")).to_be_visible(
        timeout=180_000)
    if before_the_rest is not None:
        before_the_rest(page)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-below')")
    return page


def test_what_a_learner_sees(lab, browser):
    from playwright.sync_api import expect
    base, token, _ = lab

    def watch_the_dashboard(page):
        # every change of the dashboard cell, before and after its run ends: the
        # progress bar's width and whether the cell shows the end of the run yet
        page.evaluate("""(el) => {
            window.__bar = [];
            new MutationObserver(() => {
                const bar = el.querySelector('.widget-hprogress .progress-bar');
                if (bar) window.__bar.push([bar.style.width,
                                            el.innerText.includes('stopped early')]);
            }).observe(el, {subtree: true, childList: true, attributes: true,
                            characterData: true});
        }""", page.locator(".jp-NotebookPanel .jp-CodeCell").nth(1).element_handle())

    page = _open_learning(browser, base, token, before_the_rest=watch_the_dashboard)
    cells = page.locator(".jp-NotebookPanel .jp-CodeCell")

    # the dashboard: progress while the cell runs, speed, and why the run stopped
    dash = cells.nth(1)
    expect(dash.locator(".widget-hprogress")).to_have_count(1, timeout=180_000)
    expect(dash).to_contain_text("stopped early at step 12 of 40: the test time limit",
                                 timeout=60_000)
    during = {width for width, ended in page.evaluate("window.__bar") if not ended}
    assert len(during) >= 2, (f"the progress bar did not move while its cell ran (widths "
                              f"seen before the end: {sorted(during)})")
    expect(dash).to_contain_text("tokens/s (smoothed)")
    expect(dash.locator(".jp-OutputArea-output img")).to_have_count(1)
    dash.scroll_into_view_if_needed()
    dash.screenshot(path=str(SHOTS / "learning_dashboard_stopped.png"))

    # the eps sweep: the picture changes in place, the cell never shrinks
    sweep = cells.nth(0)
    label = sweep.locator(".widget-label").filter(has_text="eps = ").first
    expect(label).to_contain_text("eps = 1.0e-06", timeout=120_000)
    image = sweep.locator(".jp-OutputArea-output img").first
    image.wait_for(timeout=60_000)
    src_before = image.get_attribute("src")
    sweep.scroll_into_view_if_needed()
    sweep.screenshot(path=str(SHOTS / "learning_eps_before.png"))
    page.evaluate("""(el) => {
        window.__heights = [];
        const record = () => window.__heights.push(el.getBoundingClientRect().height);
        new ResizeObserver(record).observe(el);
        (function frame() { record(); window.__sampling = requestAnimationFrame(frame); })();
    }""", sweep.element_handle())
    height_before = sweep.bounding_box()["height"]
    handle = sweep.locator(".widget-hslider .noUi-handle").last  # the eps slider
    handle.focus()
    for _ in range(4):                     # four steps of 0.25 decade: 1e-6 -> 1e-5
        page.keyboard.press("ArrowRight")
    expect(label).to_contain_text("eps = 1.0e-05", timeout=30_000)
    expect(image).not_to_have_attribute("src", src_before, timeout=30_000)
    page.wait_for_timeout(500)
    heights = page.evaluate("cancelAnimationFrame(window.__sampling), window.__heights")
    assert heights, "no height was sampled during the slider move"
    assert min(heights) >= height_before - 2, (
        f"the eps sweep cell shrank from {height_before:.0f} px to {min(heights):.0f} px "
        f"while redrawing")
    assert abs(sweep.bounding_box()["height"] - height_before) <= 2
    sweep.screenshot(path=str(SHOTS / "learning_eps_after.png"))

    # a failing check: its message, one line, no traceback through the checker
    error = cells.nth(2).locator(".jp-OutputArea-output[data-mime-type="
                                 "'application/vnd.jupyter.stderr']")
    expect(error).to_contain_text("Exercise 00.1", timeout=120_000)
    shown = error.inner_text().strip()
    assert shown.startswith("ExerciseError: Exercise 00.1") and "not done yet" in shown, shown
    assert "Traceback" not in shown and "coursework" not in shown and len(shown.splitlines()) <= 2
    cells.nth(2).screenshot(path=str(SHOTS / "learning_failed_check.png"))
