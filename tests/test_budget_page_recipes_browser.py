"""The fine-tuning recipes on the budget page, in headless Chromium (Debian's
/usr/bin/chromium through Playwright) at 1280x800 and 390x844: a knob the budget's
compatibility table greys is disabled with its reason beside it (DoRA while the LoRA
rank is 0, then under QLoRA), QLoRA turned on from the page gives engine.budget's
peak, the assumptions link follows the answer, and a value the settings refuse is put
back, saying so. With BUDGET_SCREENSHOTS set to a folder it saves pictures there.

Skipped, saying why, without Chromium and playwright or without the page's extra."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from engine import budget as bm
from engine.budget import compat

from budget_page_tools import serving
from lab_tools import REASON, chromium, free_port

pytest.importorskip("starlette", reason="the budget page needs the extra 'page' "
                                        "(pip install -e '.[page]')")
pytest.importorskip("uvicorn", reason="the budget page needs the extra 'page'")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

from widgets.budget_page import settings  # noqa: E402

PHONE, DESK = {"width": 390, "height": 844}, {"width": 1280, "height": 800}
# A practitioner's QLoRA: Llama 3.1 8B, rank 16 on every linear layer, checkpointing, a 4090.
START = "preset=llama3.1-8b&recompute=full&device=RTX-4090"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("page"), port=free_port()) as (url, _):
        yield url


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def new_page(browser, base, viewport):
    context = browser.new_context(viewport=viewport)
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base)
                  else route.abort())
    tab = context.new_page()
    tab.errors = []
    tab.on("pageerror", lambda e: tab.errors.append(str(e)))
    return tab


def cfg_of(query: str) -> bm.BudgetConfig:
    from urllib.parse import parse_qsl
    return settings.config_from_params(dict(parse_qsl(query)))[0]


def reason(query: str, knob: str) -> str:
    cfg = cfg_of(query)
    return compat.idle_knobs(cfg)[knob].why(cfg)


def expect_greyed(page, knob: str, why: str) -> None:
    from playwright.sync_api import expect
    for option in page.locator(f"#{knob} input").all():
        expect(option).to_be_disabled()
    expect(page.locator(f"#why-{knob}")).to_be_visible()
    expect(page.locator(f"#why-{knob}")).to_have_text(f"Greyed out: {why}.")
    # a screen reader hears the reason with the control
    assert f"why-{knob}" in page.locator(f"#{knob}").get_attribute("aria-describedby")


@pytest.mark.parametrize("viewport", [DESK, PHONE], ids=["1280x800", "390x844"])
def test_qlora_from_the_page_and_a_greyed_knob_with_its_reason(browser, base, viewport):
    from playwright.sync_api import expect
    page = new_page(browser, base, viewport)
    page.goto(f"{base}/?{START}")
    peak = page.locator(".budget-peak-bytes")
    peak.wait_for(timeout=30_000)
    # LoRA rank 0: DoRA and QLoRA do nothing, and the page says why beside each
    expect_greyed(page, "dora", reason(START, "dora"))
    expect_greyed(page, "qlora", "no adapters: LoRA rank is 0 (full fine-tuning)")
    expect(page.locator("#lora_targets")).to_be_disabled()
    page.locator("#lora_rank").fill("16")
    page.locator("#lora_rank").press("Enter")
    expect(page).to_have_url(re.compile(r"lora_rank=16"))
    page.locator("#lora_targets").fill("all-linear")  # the box offers it as you type
    assert page.locator("#list-lora_targets option[value='all-linear']").count() == 1
    page.locator("#lora_targets").press("Enter")
    expect(page).to_have_url(re.compile(r"lora_targets=all-linear"))
    expect(page.locator("#qlora input[value='on']")).to_be_enabled()
    page.locator("#qlora label", has_text="on").click()
    expect(page).to_have_url(re.compile(r"qlora=on"))
    qlora = f"{START}&lora_rank=16&lora_targets=all-linear&qlora=on"
    expect(peak).to_have_text(f"{bm.budget(cfg_of(qlora)).peak:,}")
    expect(page.locator("#fit")).to_contain_text("fits")
    # QLoRA greys DoRA for a reason of its own
    expect_greyed(page, "dora", "DoRA over 4-bit weights was not measured")
    assert "qlora=on" in page.locator("#assumptions").get_attribute("href")
    expect(page.locator("#why-qlora")).to_be_hidden()
    assert page.evaluate("document.scrollingElement.scrollWidth") <= viewport["width"]
    if viewport == DESK:
        _screenshot(page, "qlora-1280x800.png")
    else:
        page.locator("#qlora").scroll_into_view_if_needed()
        _screenshot(page, "qlora-390x844.png")
    # the rank back to 0: QLoRA and the targets are put back, and the page says so
    page.locator("#lora_rank").fill("0")
    page.locator("#lora_rank").press("Enter")
    why = "for you: no adapters: LoRA rank is 0 (full fine-tuning)."
    expect(page.locator("#notes p")).to_have_text([f"lora targets set back to empty {why}",
                                                    f"qlora set back to off {why}"])
    expect(page.locator("#lora_targets")).to_have_value("")
    expect(page.locator("#qlora input[value='off']")).to_be_checked()
    expect(page).not_to_have_url(re.compile(r"qlora"))
    expect(page.locator("#verdict")).to_contain_text("qlora set back to off")
    expect_greyed(page, "qlora", "no adapters: LoRA rank is 0 (full fine-tuning)")
    assert page.errors == []


def _screenshot(page, name: str) -> None:
    folder = os.environ.get("BUDGET_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / name))
