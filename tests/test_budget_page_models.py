"""The budget page in headless Chromium with a model of your own and the practitioner's
defaults: a Hub model id (from a stand-in of the Hub, HF_ENDPOINT) answered at the page's
sequence length with SDPA, a gated one answered by what to do, and gradient checkpointing
offered in the verdict and turned on by its button; at 1280x800 and 390x844. With
BUDGET_SCREENSHOTS set to a folder it saves pictures there.

Skipped, saying why, without Chromium and playwright, the page's extra or huggingface_hub."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from engine import budget as bm

from budget_page_tools import serving
from hub_stand_in import GATED, LLAMA_FILE, MODEL, stand_in_hub
from lab_tools import REASON, chromium, free_port

pytest.importorskip("starlette", reason="the budget page needs the extra 'page'")
pytest.importorskip("uvicorn", reason="the budget page needs the extra 'page'")
pytest.importorskip("huggingface_hub", reason="a Hub model id needs huggingface_hub")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

from widgets.budget_page import answers, settings  # noqa: E402

VIEWPORTS = {"1280x800": {"width": 1280, "height": 800},
             "390x844": {"width": 390, "height": 844}}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hub-page")
    with stand_in_hub(folder) as env, serving(folder, port=free_port(), env=env) as (url, _):
        yield url


@pytest.fixture(params=list(VIEWPORTS))
def page(request, base):
    with chromium() as browser:
        context = browser.new_context(viewport=VIEWPORTS[request.param])
        context.route("**/*", lambda route: route.continue_()
                      if route.request.url.startswith(base) else route.abort())
        tab = context.new_page()
        errors = []
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.size = request.param
        yield tab
        assert errors == []


def peak_of(**params) -> str:
    cfg = settings.config_from_params({k: str(v) for k, v in params.items()})[0]
    return f"{bm.budget(cfg).peak:,}"


def test_a_hub_model_keeps_the_pages_length_and_runs_sdpa(page, base):
    from playwright.sync_api import expect
    page.goto(f"{base}/?preset=gpt2-small")
    peak = page.locator(".budget-peak-bytes")
    expect(peak).to_have_text(peak_of(preset="gpt2-small"), timeout=30_000)
    length = page.locator("#seq_len").input_value()
    page.locator("#hf_model").fill(MODEL)
    page.locator("#hf_model").press("Enter")
    expect(page).to_have_url(re.compile("hf_model=someone%2Fllama-2-7b"))
    expect(peak).to_have_text(peak_of(config=LLAMA_FILE.read_text(), seq_len=length),
                              timeout=30_000)
    assert page.locator("#seq_len").input_value() == length == "1024"
    assert page.locator("#attention input[value='flash']").is_checked()
    expect(page.locator("#fit")).to_contain_text("Longest sequence at B=1")
    _screenshot(page, f"page-{page.size}-hub.png")
    page.locator("#hf_model").fill(GATED)
    page.locator("#use-hub").click()
    message = page.locator("#message")
    expect(message).to_contain_text("gated model")
    expect(message).to_contain_text("HF_TOKEN")
    expect(peak).to_have_count(0)
    assert [b.get_attribute("data-field") for b in message.locator("button.go").all()] == [
        "hf_model"]


def test_the_verdict_offers_gradient_checkpointing_and_its_button_turns_it_on(page, base):
    from playwright.sync_api import expect
    query = dict(preset="gpt2-small", micro_batch=32, device="rtx-4090")
    page.goto(f"{base}/?" + "&".join(f"{k}={v}" for k, v in query.items()))
    cfg = settings.config_from_params({k: str(v) for k, v in query.items()})[0]
    full = bm.budget(cfg.with_(recompute="full"))
    said = answers.plain_text(answers.checkpointing_html(bm.budget(cfg)))
    assert said.startswith("turn on gradient checkpointing: ") and "fits" in said
    fit = page.locator("#fit")
    expect(fit).to_contain_text(said, timeout=30_000)
    expect(page.locator("#verdict")).to_contain_text(said)  # announced
    _screenshot(page, f"page-{page.size}-checkpointing.png")
    page.locator("#fit button[data-knob='recompute']").click()
    expect(page).to_have_url(re.compile("recompute=full"))
    expect(page.locator(".budget-peak-bytes")).to_have_text(f"{full.peak:,}")
    assert page.locator("#recompute input[value='full']").is_checked()
    expect(fit).not_to_contain_text("turn on gradient checkpointing")


def _screenshot(page, name: str) -> None:
    folder = os.environ.get("BUDGET_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / name))
