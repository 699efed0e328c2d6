"""The page's plan panel (engine.budget.plan on the page): api/plan answers the same
settings as api/budget, and in headless Chromium (Debian's /usr/bin/chromium) the panel
opens, shows the plan's first row as the library computes it, and scrolls inside its
own box on a phone. With BUDGET_SCREENSHOTS set to a folder it saves pictures there.

Skipped, saying why, without Chromium and playwright or without the page's extra."""
from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlencode

import pytest

from engine import budget as bm
from engine.budget.plan import plan

from budget_page_tools import get_json, serving
from lab_tools import REASON, chromium, free_port

pytest.importorskip("starlette", reason="the budget page needs the extra 'page' "
                                        "(pip install -e '.[page]')")
pytest.importorskip("uvicorn", reason="the budget page needs the extra 'page'")

from widgets.budget_page import settings  # noqa: E402

# Llama 3.1 8B, LoRA on every linear layer, 8 H100s, 64 sequences of 2,048 tokens a step.
QUERY = {"preset": "llama3.1-8b", "lora_rank": "16", "lora_targets": "all-linear",
         "device": "H100-80GB-SXM", "devices": "8", "seq_len": "2048", "micro_batch": "1",
         "accumulation": "64"}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("page"), port=free_port()) as (url, _):
        yield url


def expected_plan():
    cfg, _ = settings.config_from_params(dict(QUERY))
    return plan(cfg)


def test_api_plan_answers_the_pages_settings(base):
    status, data = get_json(f"{base}/api/plan?{urlencode(QUERY)}")
    assert status == 200 and data["ok"]
    first = expected_plan().rows[0]
    assert f"{first.step_seconds:.3g} s" in data["plan"]
    assert "The step time assumes" in data["plan"]
    status, data = get_json(f"{base}/api/plan?{urlencode({**QUERY, 'device': 'none'})}")
    assert status == 400 and "a plan needs a device" in data["error"]


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
@pytest.mark.parametrize("width,height", [(1280, 800), (390, 844)])
def test_the_plan_panel_shows_the_fastest_setting_first(base, width, height):
    from playwright.sync_api import expect
    first = expected_plan().rows[0]
    want = [f"{first.config.micro_batch} x {first.config.accumulation}",
            first.config.recompute, first.config.attention, str(first.config.zero),
            first.fine_tuning, f"{first.step_seconds:.3g} s", bm.human_bytes(first.peak)]
    with chromium() as browser:
        tab = browser.new_context(viewport={"width": width, "height": height}).new_page()
        errors = []
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.goto(f"{base}/?{urlencode(QUERY)}")
        tab.locator(".budget-peak-bytes").wait_for(timeout=30_000)
        tab.locator("#plan-panel > summary").click()
        row = tab.locator("#plan table.plan-table tbody tr").first
        row.wait_for(timeout=30_000)
        cells = [c.strip() for c in row.locator("td").all_inner_texts()]
        assert cells[0] == "1" and cells[1:8] == want
        scroller = tab.locator("#plan .plan-scroll")
        box = scroller.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= width
        if width < 700:  # a phone: the table scrolls inside its panel, not the page
            assert tab.evaluate("document.scrollingElement.scrollWidth") <= width
            assert scroller.evaluate("e => e.scrollWidth > e.clientWidth")
        scroller.scroll_into_view_if_needed()
        tab.locator("#plan-panel > summary").scroll_into_view_if_needed()
        _screenshot(tab, f"plan-{width}x{height}.png")
        expect(tab.locator("#plan .plan-count")).to_contain_text("fastest first")
        assert errors == []


def _screenshot(page, name: str) -> None:
    folder = os.environ.get("BUDGET_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / name))
