"""The budget widget's answers to issue 51 in a real browser (JupyterLab, headless
Chromium through Playwright, 1280 x 800): no dead end, no stale numbers, selected
buttons that can be read and focus that can be seen.

Choosing gradients in fp32 and then activations of hf puts the gradients back to
storage, greys their buttons (drawn disabled in the page, not only in the model),
says so, and shows engine.budget's numbers; an impossible sequence length hides the
numbers and names the controls to change, which are enabled; the table of full
fine-tuning against LoRA at ranks 8 and 64 shows engine.budget's terms. The selected button's
label and fill have at least 4.5:1 contrast as the browser computes them, each button
names its row, and a focused selected button shows a ring. With BUDGET_SCREENSHOTS set
to a folder, it saves pictures there.
"""
from __future__ import annotations

import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from engine import budget as bm

from lab_tools import REASON, chromium, serving_lab, write_notebook
from test_browser import screenshot
from test_budget_widget import contrast

NOTEBOOK_CELLS = ["from widgets.budget import BudgetWidget",
                  "widget = BudgetWidget(preset='gpt2-small')\nwidget.ui"]

if REASON:
    print(f"test_browser_budget_widget skipped: {REASON}", file=sys.stderr)
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture
def page():
    """The widget's notebook run in a 1280 x 800 page, the training tab open."""
    folder = Path(tempfile.mkdtemp(prefix="budget-widget-lab-"))
    write_notebook(folder / "budget.ipynb", NOTEBOOK_CELLS)
    try:
        with serving_lab(folder) as (base, token), chromium() as browser:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"{base}/lab/tree/budget.ipynb?token={token}&reset")
            page.locator("#jp-main-statusbar >> text=Idle").first.wait_for(timeout=120_000)
            page.evaluate("window.jupyterapp.commands.execute('application:toggle-left-area')")
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
            page.locator(".budget-readout .budget-peak-bytes").wait_for(timeout=120_000)
            page.locator(".budget-tabs .lm-TabBar-tab", has_text="training").click()
            yield page
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def button(page, knob: str, text: str):
    return page.locator(f".budget-knob-{knob} button", has_text=re.compile(f"^{text}$"))


def rgb_hex(css: str) -> str:
    r, g, b = (int(x) for x in re.findall(r"\d+", css)[:3])
    return f"#{r:02x}{g:02x}{b:02x}"


def test_a_refused_choice_is_put_back_and_a_message_names_enabled_controls(page):
    from playwright.sync_api import expect
    peak = page.locator(".budget-readout .budget-peak-bytes")
    button(page, "precision", "bf16").click()
    expect(button(page, "grad-precision", "fp32")).to_be_enabled(timeout=30_000)
    button(page, "grad-precision", "fp32").click()
    expect(button(page, "grad-precision", "fp32")).to_have_class(re.compile("mod-active"),
                                                                timeout=30_000)
    button(page, "activation-model", "hf").click()
    real = bm.preset("gpt2-small", precision="bf16", activation_model="hf")
    expect(peak).to_have_text(f"{bm.budget(real).peak:,}", timeout=60_000)
    expect(page.locator(".budget-note")).to_contain_text("set back to 'storage' for you")
    expect(page.locator(".budget-message")).to_have_text("")
    expect(page.locator(".budget-plot-curve")).to_be_visible()
    for text in ("storage", "fp32"):  # drawn disabled, not only disabled in the model
        expect(button(page, "grad-precision", text)).to_be_disabled()
    expect(page.locator(".budget-idle").nth(1)).to_contain_text("gradients in: a hf step")
    screenshot(page, "widget-1280x800-set-back.png")

    box = page.locator(".budget-knob-seq-len input")
    box.fill("4096")
    box.press("Enter")
    message = page.locator(".budget-message")
    expect(message).to_contain_text("Change it here: sequence N (training tab)",
                                    timeout=60_000)
    expect(page.locator(".budget-readout")).to_be_hidden()  # no stale number on screen
    expect(page.locator(".budget-fit")).to_be_hidden()
    expect(box).to_be_enabled()
    screenshot(page, "widget-1280x800-message.png")
    box.fill("512")
    box.press("Enter")
    expect(peak).to_have_text(f"{bm.budget(real.with_(seq_len=512)).peak:,}",
                              timeout=60_000)
    expect(page.locator(".budget-readout")).to_be_visible()
    expect(page.locator(".budget-plot-curve")).to_be_visible()

    # full fine-tuning against LoRA at two ranks, for the model on screen
    button(page, "precision", "fp32").click()
    on_screen = real.with_(seq_len=512, precision="fp32")
    expect(peak).to_have_text(f"{bm.budget(on_screen).peak:,}", timeout=60_000)
    table = page.locator("table.budget-lora")
    for rank in (8, 64):
        expect(table).to_contain_text(f"LoRA r={rank}")
        gradients = bm.budget(on_screen.with_(lora_rank=rank)).fixed["gradients"]
        expect(table).to_contain_text(bm.human_bytes(gradients))
    table.scroll_into_view_if_needed()
    screenshot(page, "widget-1280x800-lora.png")


def test_selected_buttons_can_be_read_and_focus_can_be_seen(page):
    selected = page.locator(".budget-knob-activation-model button.mod-active")
    style = selected.evaluate("e => { const s = getComputedStyle(e); "
                              "return [s.color, s.backgroundColor]; }")
    ratio = contrast(*(rgb_hex(c) for c in style))
    assert ratio >= 4.5, (style, ratio)
    assert selected.get_attribute("title") == "activations of: transformer"
    # keyboard focus on the selected button: a ring outside its fill
    page.locator(".budget-knob-activation-model button").first.focus()  # "rule"
    page.keyboard.press("Tab")  # to the next button, "transformer", from the keyboard
    ring = page.evaluate("() => { const e = document.activeElement, s = getComputedStyle(e);"
                         " return [e.textContent, e.matches(':focus-visible'), s.outlineStyle,"
                         " s.outlineWidth, s.outlineColor]; }")
    assert ring[0] == "transformer" and ring[1], ring
    assert ring[2] == "solid" and ring[3] == "2px", ring
    assert rgb_hex(ring[4]) == "#000000", ring
    screenshot(page, "widget-1280x800-focus.png")
