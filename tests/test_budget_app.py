"""The standalone budget page (`python -m widgets.budget_app`, Voila) in a real
browser: it serves the calculator alone, and its controls drive engine.budget's
numbers and the fit line as in the notebook.

Needs the optional extra `app` (voila), /usr/bin/chromium and playwright;
without them the browser test is skipped and says why."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from engine import budget as bm
from widgets import budget_app

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from lab_tools import REASON as BROWSER_REASON, chromium, free_port  # noqa: E402


def _why_not_runnable() -> str | None:
    try:
        import voila  # noqa: F401
    except ImportError:
        return "voila (the optional extra 'app') is not installed: pip install -e '.[app]'"
    return BROWSER_REASON


REASON = _why_not_runnable()


def test_page_holds_only_the_widget_at_a_known_preset(tmp_path):
    import nbformat
    page = nbformat.read(budget_app.write_page(tmp_path, "llama2-7b"), as_version=4)
    assert [c.source for c in page.cells] == [
        "from widgets.budget import BudgetWidget", "BudgetWidget(preset='llama2-7b').ui"]
    with pytest.raises(bm.BudgetError, match="unknown preset"):
        budget_app.write_page(tmp_path, "x'); import os; ('")
    command = budget_app.voila_command(tmp_path / "budget.ipynb", 8870, open_browser=False)
    assert "--Voila.ip=127.0.0.1" in command and "--no-browser" in command


def test_bad_port_is_refused_before_serving():
    run = subprocess.run([sys.executable, "-m", "widgets.budget_app", "--port", "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--port 0" in run.stderr and "Traceback" not in run.stderr


@pytest.fixture
def app(tmp_path):
    port = free_port()
    log = open(tmp_path / "budget-app.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "widgets.budget_app", "--port", str(port), "--no-browser"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the budget app exited with {server.returncode}; "
                                   f"see {log.name}")
            try:
                with urllib.request.urlopen(base + "/api/status", timeout=2):
                    break
            except urllib.error.HTTPError:  # an answer (it wants a login for the API)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the budget app did not answer {base}")
                time.sleep(0.5)
        yield base
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)  # the session we started: app, voila, kernel
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
        log.close()


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_standalone_page_drives_the_budget_and_the_fit_line(app):
    from playwright.sync_api import expect
    start = bm.preset("gpt2-small")
    moved = start.with_(micro_batch=2 * start.micro_batch)
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(app + "/")
        peak = page.locator(".budget-readout .budget-peak-bytes")
        expect(peak).to_have_text(f"{bm.budget(start).peak:,}", timeout=120_000)
        assert page.locator(".jp-InputArea, .CodeMirror, .cm-editor").count() == 0
        tabs = page.locator(".budget-tabs").first.bounding_box()
        plot = page.locator(".budget-readout ~ .widget-hbox img").first.bounding_box()
        assert tabs["x"] + tabs["width"] <= plot["x"] + 1
        assert plot["x"] + plot["width"] <= 1280 and plot["y"] + plot["height"] <= 800

        page.locator(".budget-tabs .lm-TabBar-tab", has_text="training").click()
        page.locator(".budget-step-micro-batch .noUi-handle").first.focus()
        page.keyboard.press("ArrowRight")
        expect(peak).to_have_text(f"{bm.budget(moved).peak:,}", timeout=60_000)

        page.locator(".budget-tabs .lm-TabBar-tab", has_text="devices").click()
        page.locator(".budget-knob-device select").select_option("RTX-4090")
        want = bm.budget(moved.with_(device="RTX-4090")).device
        verdict = "fits" if want.fits else "does not fit"
        expect(page.locator(".budget-fit")).to_contain_text(f"{verdict} on RTX-4090",
                                                            timeout=60_000)
