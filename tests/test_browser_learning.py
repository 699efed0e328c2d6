"""What a learner sees in JupyterLab, in a real browser.

Starts JupyterLab (tests/lab_tools.py: 127.0.0.1, a free port, a random
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
Playwright (see tests/lab_tools.py).
"""
from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import pytest

from lab_tools import REASON, chromium, serving_lab, write_notebook

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
    write_notebook(folder / "learning.ipynb", CELLS)
    try:
        with serving_lab(folder, extra_args=[f"--LabApp.default_url={_default_url()}"],
                         extra_env={"BACKPROP_PIECES_DIR": str(folder / ".pieces")}) as (
                base, token):
            yield base, token, folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


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
