"""The budget page in headless Chromium while its answers are slow (each held back by the
test server, as on a loaded machine): an answer never writes over what the visitor is
typing, a change made before the first answer sends no device of its own, and Back after
a typed number is one press.

Skipped, saying why, without Chromium and playwright or without the page's extra."""
from __future__ import annotations

import re

import pytest

from engine import budget as bm

from budget_page_tools import serving
from lab_tools import REASON, chromium, free_port

pytest.importorskip("starlette", reason="the budget page needs the extra 'page' "
                                        "(pip install -e '.[page]')")
pytest.importorskip("uvicorn", reason="the budget page needs the extra 'page'")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

from widgets.budget_page import settings  # noqa: E402

ANSWER_DELAY = 1.5   # seconds each answer is held back
KEY_DELAY_MS = 80    # a person typing
TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
PHONE, DESK = {"width": 390, "height": 844}, {"width": 1280, "height": 800}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("slow-page"), port=free_port(),
                 delay=ANSWER_DELAY) as (url, _):
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


def peak_of(**knobs) -> str:
    cfg = settings.config_from_params({k: str(v) for k, v in knobs.items()})[0]
    return f"{bm.budget(cfg).peak:,}"


@pytest.mark.parametrize("viewport", [DESK, PHONE], ids=["1280x800", "390x844"])
def test_an_answer_never_writes_over_what_the_visitor_types(browser, base, viewport):
    from playwright.sync_api import expect
    page = new_page(browser, base, viewport)
    page.goto(f"{base}/?preset=llama3.2-1b&lora_rank=16&device=h100")
    peak = page.locator(".budget-peak-bytes")
    expect(peak).to_have_text(peak_of(preset="llama3.2-1b", lora_rank=16, device="h100"),
                              timeout=30_000)
    # the server's normalisation of a control nobody touched is applied
    assert page.locator("#device").input_value() == "H100-80GB-SXM"
    page.locator("#micro_batch").fill("3")       # edited, not committed, then left
    page.locator("#precision label", has_text="fp32").click()  # an answer on its way ...
    page.locator("#lora_targets").click()
    page.keyboard.type(TARGETS, delay=KEY_DELAY_MS)              # ... arrives meanwhile
    before_enter = dict(preset="llama3.2-1b", lora_rank=16, device="h100", precision="fp32",
                        micro_batch=3)
    expect(peak).to_have_text(peak_of(**before_enter), timeout=1)  # it did arrive
    assert page.locator("#lora_targets").input_value() == TARGETS
    assert page.locator("#micro_batch").input_value() == "3"
    page.keyboard.press("Enter")
    expect(peak).to_have_text(peak_of(**before_enter, lora_targets=TARGETS), timeout=30_000)
    expect(page).to_have_url(re.compile("lora_targets=q_proj"))
    assert page.locator("#lora_targets").input_value() == TARGETS
    assert page.errors == []


def test_a_change_before_the_first_answer_keeps_the_default_device(browser, base):
    from playwright.sync_api import expect
    page = new_page(browser, base, DESK)
    asked = []
    page.on("request", lambda r: asked.append(r.url) if "api/budget" in r.url else None)
    page.goto(f"{base}/?preset=gpt2-small")
    page.locator("#micro_batch").fill("4")  # the first answer is still on its way
    page.locator("#micro_batch").press("Enter")
    expect(page.locator(".budget-peak-bytes")).to_have_text(
        peak_of(preset="gpt2-small", micro_batch=4), timeout=30_000)
    assert len(asked) == 2 and not any("device=" in url for url in asked), asked
    expect(page.locator("#fit")).to_contain_text(settings.DEFAULT_DEVICE)
    assert page.locator("#device").input_value() == settings.DEFAULT_DEVICE


def test_back_after_a_typed_number_is_one_press(browser, base):
    from playwright.sync_api import expect
    page = new_page(browser, base, DESK)
    page.goto(f"{base}/?preset=gpt2-small")
    peak = page.locator(".budget-peak-bytes")
    expect(peak).to_have_text(peak_of(preset="gpt2-small"), timeout=30_000)
    page.locator("#micro_batch").fill("4")
    page.locator("#micro_batch").press("Enter")      # commits ...
    expect(peak).to_have_text(peak_of(preset="gpt2-small", micro_batch=4), timeout=30_000)
    page.locator("h1").click()                        # ... and leaving the box says it again
    page.wait_for_timeout(ANSWER_DELAY * 1000 + 500)  # a second answer would be in by now
    page.go_back()
    expect(page).not_to_have_url(re.compile("micro_batch"))
    expect(peak).to_have_text(peak_of(preset="gpt2-small"), timeout=30_000)
    assert page.locator("#micro_batch").input_value() == str(bm.preset("gpt2-small").micro_batch)
