"""The budget widget in a real browser.

Starts JupyterLab on 127.0.0.1 (random free port, random token) over a
temporary folder holding a two-cell notebook that shows `BudgetWidget`,
opens it in headless Debian Chromium through Playwright on a 1280 x 800
screen, runs all cells, checks the controls and the plots are side by side
inside the output area with no label cut, steps the micro-batch's
power-of-two slider with the keyboard, checks that the readout shows exactly
the peak `engine.budget` computes for the new batch size and that the plot
keeps its height, picks a device and reads the fit line, then spreads the
run over 8 devices and clicks ZeRO stage 3. With BUDGET_SCREENSHOTS set to a
folder, it saves pictures there.

The server and the browser come from tests/lab_tools.py (without Chromium or
Playwright the test is skipped and says why).
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from engine import budget as bm

from lab_tools import REASON, chromium, serving_lab, write_notebook

PRESET = "gpt2-small"
NOTEBOOK_CELLS = [
    "from widgets.budget import BudgetWidget",
    f"widget = BudgetWidget(preset={PRESET!r})\nwidget.ui",
]

if REASON:
    print(f"test_browser skipped: {REASON}", file=sys.stderr)
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture
def lab():
    """A JupyterLab serving a folder with budget.ipynb; yields (base URL, token)."""
    folder = Path(tempfile.mkdtemp(prefix="budget-lab-"))
    write_notebook(folder / "budget.ipynb", NOTEBOOK_CELLS)
    try:
        with serving_lab(folder) as (base, token):
            yield base, token
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_controls_drive_the_engine_budget_and_the_fit_line(lab):
    """On a 1280 x 800 screen: controls left and plots right, both in view;
    the micro-batch's power-of-two slider steps 8 -> 16 -> 32 and the readout
    shows engine.budget's peak; the plot keeps its height; heads offer only
    divisors of the width; choosing a device in the devices tab shows the
    fit line engine.budget computes for it."""
    from playwright.sync_api import expect
    base, token = lab
    start = bm.preset(PRESET)
    moved = start.with_(micro_batch=4 * start.micro_batch)  # two powers of two up
    on_device = moved.with_(device="A100-40GB")
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"{base}/lab/tree/budget.ipynb?token={token}&reset")
        page.locator(".jp-NotebookPanel").first.wait_for(timeout=120_000)
        page.locator("#jp-main-statusbar >> text=Idle").first.wait_for(timeout=120_000)
        page.evaluate("window.jupyterapp.commands.execute('application:toggle-left-area')")
        page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")

        peak = page.locator(".budget-readout .budget-peak-bytes")
        expect(peak).to_have_text(f"{bm.budget(start).peak:,}", timeout=120_000)
        page.locator(".budget-tabs").first.scroll_into_view_if_needed()
        screenshot(page, "lab-1280x800.png")

        # both halves side by side, inside the output area: nothing cut, no sideways scroll
        tabs = page.locator(".budget-tabs").first.bounding_box()
        fit = page.locator(".budget-fit").first
        image = page.locator(".budget-readout ~ .widget-hbox img").first
        expect(image).to_be_visible(timeout=60_000)
        plot = page.locator(".budget-plot-curve").first.bounding_box()
        area = page.locator(".jp-OutputArea-output").last.bounding_box()
        assert tabs["x"] + tabs["width"] <= image.bounding_box()["x"] + 1, (tabs, plot)
        assert area["x"] <= tabs["x"] and plot["x"] + plot["width"] <= area["x"] + area["width"]
        assert 0 <= plot["y"] < 800, plot  # the pictures start on the first screen
        assert no_sideways_overflow(page, ".jp-OutputArea-output")
        assert cut_labels(page) == []
        heads = page.locator(".budget-knob-n-head select option").all_inner_texts()
        assert [int(h) for h in heads] == [h for h in range(1, 257) if 768 % h == 0]

        page.locator(".budget-tabs .lm-TabBar-tab", has_text="training").click()
        pictures = page.locator(".budget-plot-curve").first
        picture_height = pictures.bounding_box()["height"]
        stepper = page.locator(".budget-step-micro-batch .noUi-handle").first
        stepper.focus()
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowRight")
        expect(page.locator(".budget-knob-micro-batch input")).to_have_value(
            str(moved.micro_batch), timeout=30_000)
        expect(peak).to_have_text(f"{bm.budget(moved).peak:,}", timeout=60_000)
        assert bm.human_bytes(bm.budget(moved).peak) in page.locator(
            ".budget-readout").inner_text()
        after = pictures.bounding_box()["height"]
        assert abs(after - picture_height) <= 1, (picture_height, after)  # no collapse

        expect(fit).to_contain_text("no device chosen")
        page.locator(".budget-tabs .lm-TabBar-tab", has_text="devices").click()
        page.locator(".budget-knob-device select").select_option("A100-40GB")
        want = bm.budget(on_device).device
        verdict = "fits" if want.fits else "does not fit"
        expect(fit).to_contain_text(f"{verdict} on A100-40GB", timeout=60_000)
        expect(fit).to_contain_text(f"B={want.largest_micro_batch}")
        expect(fit).to_contain_text(f"{want.tokens_per_second:,.0f} tokens/s")
        assert page.locator(".budget-knob-zero button").first.is_disabled()  # 1 device
        assert cut_labels(page) == []

        # more devices: the ZeRO stages become clickable and shard one device's bytes
        page.locator(".budget-knob-devices input").fill("8")
        page.locator(".budget-knob-devices input").press("Enter")
        stage3 = page.locator(".budget-knob-zero button", has_text="3")
        expect(stage3).to_be_enabled(timeout=30_000)
        stage3.click()
        sharded = on_device.with_(devices=8, zero=3)
        expect(peak).to_have_text(f"{bm.budget(sharded).peak:,}", timeout=60_000)
        assert bm.budget(sharded).peak < bm.budget(on_device.with_(devices=8)).peak
        screenshot(page, "lab-1280x800-zero3.png")


def cut_labels(page) -> list[str]:
    """Visible labels, buttons and choices of the widget whose text does not fit."""
    return page.evaluate("""() => [...document.querySelectorAll(
        '.budget-widget .widget-label, .budget-widget button, .budget-widget select')]
        .filter(e => e.offsetParent && e.scrollWidth > e.clientWidth + 1)
        .map(e => e.textContent.trim())""")


def no_sideways_overflow(page, selector: str) -> bool:
    """Neither the page nor `selector` scrolls sideways."""
    return page.evaluate("""(selector) => {
        const box = document.querySelector(selector), page = document.scrollingElement;
        return box.scrollWidth <= box.clientWidth + 1 && page.scrollWidth <= page.clientWidth + 1;
    }""", selector)


def screenshot(page, name: str) -> None:
    """A picture for the record when BUDGET_SCREENSHOTS names a folder."""
    folder = os.environ.get("BUDGET_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / name))
