"""The standalone budget page (`python -m widgets.budget_app`): a link's settings,
the numbers engine.budget gives for them, the server's safety (its own Host only,
no process per visitor, SIGTERM stops it) and, in a real browser with the network
cut, every control and the URL kept in step.

The browser part needs /usr/bin/chromium and playwright; without them it is
skipped and says why. With BUDGET_SCREENSHOTS set to a folder it saves pictures."""
from __future__ import annotations

import os
import re
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


def shown_peak(page_html: str) -> int:
    m = re.search(r"class='budget-peak-bytes'>([\d,]+)<", page_html)
    assert m, page_html[:500]
    return int(m.group(1).replace(",", ""))


def test_a_link_reproduces_its_settings():
    cfg = bm.preset("llama2-7b", micro_batch=2, precision="bf16", devices=8, zero=3,
                    device="A100-80GB", activation_model="hf", attention="flash")
    query = budget_app.query_of(cfg)
    assert budget_app.config_from_query(query) == cfg
    assert budget_app.config_from_query("") == bm.preset(budget_app.DEFAULT_PRESET)
    assert budget_app.config_from_query("preset=tiny&seq_len=32") == bm.preset("tiny", seq_len=32)


@pytest.mark.parametrize("query, says", [
    ("preset=x'%3Bimport", "preset=\"x';import\" is not one of"),
    ("zero=7", "zero='7' is not one of 0, 1, 2, 3"),
    ("micro_batch=two", "micro_batch='two' is not a whole number"),
    ("devices=0", "devices=0 must be at least 1"),
    ("n_layer=3", "'n_layer' is not a setting of this page"),
])
def test_a_bad_link_is_named_not_obeyed(query, says):
    with pytest.raises(bm.BudgetError) as error:
        budget_app.config_from_query(query)
    assert says in str(error.value)
    html = budget_app.page(query)  # the page still opens, at the default, and says why
    assert "were not understood" in html
    assert shown_peak(html) == bm.budget(bm.preset(budget_app.DEFAULT_PRESET)).peak


def test_the_page_shows_engine_budget_for_its_url_and_fetches_nothing_else():
    html = budget_app.page("preset=llama2-7b&micro_batch=2&device=A100-80GB")
    want = bm.budget(bm.preset("llama2-7b", micro_batch=2, device="A100-80GB"))
    assert shown_peak(html) == want.peak
    assert "<title>Training-step memory budget</title>" in html and "<h1>" in html
    assert "does not fit" in html and "(80 GiB)" in html
    assert 'href="assumptions"' in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # nothing remote
    assert "What the budget assumes" in budget_app.assumptions_page()


def test_only_its_own_host_names_are_answered():
    names = budget_app.host_names("127.0.0.1", 8866)
    assert {"127.0.0.1:8866", "localhost:8866", "[::1]:8866"} <= names
    assert "evil.example:8866" not in names and "127.0.0.1:8867" not in names
    assert "mybox.lan:80" in budget_app.host_names("0.0.0.0", 80, ["mybox.lan"])


def test_bad_port_is_refused_before_serving():
    run = subprocess.run([sys.executable, "-m", "widgets.budget_app", "--port", "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--port 0" in run.stderr and "Traceback" not in run.stderr


def _get(url: str, host: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.fixture
def app(tmp_path):
    """The page served on 127.0.0.1 at a free port; yields (base URL, server process)."""
    port = free_port()
    log = open(tmp_path / "budget-app.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "widgets.budget_app", "--port", str(port), "--no-browser"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the budget app exited with {server.returncode}; "
                                   f"see {log.name}")
            try:
                _get(base + "/assumptions")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the budget app did not answer {base}")
                time.sleep(0.2)
        yield base, server
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
def test_server_answers_its_own_host_only_spawns_nothing_and_stops_on_sigterm(app):
    base, server = app
    port = base.rsplit(":", 1)[1]
    status, body = _get(base + "/", host=f"evil.example:{port}")  # DNS rebinding
    assert status == 403 and "budget" not in body.lower()
    for _ in range(20):  # twenty visitors: still one process, no kernel, no child
        status, body = _get(base + "/?preset=tiny&micro_batch=4")
        assert status == 200 and shown_peak(body) == bm.budget(
            bm.preset("tiny", micro_batch=4)).peak
    assert _children(server.pid) == []
    status, body = _get(base + "/api/budget?preset=tiny&zero=9")
    assert status == 200 and "zero=&#x27;9&#x27; is not one of" in body
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=10) == 0
    with pytest.raises(OSError):
        _get(base + "/")


@pytest.mark.skipif(BROWSER_REASON is not None, reason=BROWSER_REASON or "")
def test_page_in_a_browser_with_the_network_cut(app):
    """ZeRO stages clickable and sharding one device's bytes; the URL follows the
    knobs and opening it reproduces them; nothing overflows at 1280 x 800; one
    column in a narrow window; no request leaves the machine."""
    from playwright.sync_api import expect
    base, _ = app
    start = bm.preset("llama2-7b", device="A100-80GB")
    sharded = start.with_(devices=8, zero=3)
    outside = []
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        context.route("**/*", lambda route: route.continue_()
                      if route.request.url.startswith(base)
                      else (outside.append(route.request.url), route.abort()))
        page = context.new_page()
        page.goto(base + "/?" + budget_app.query_of(start))
        peak = page.locator(".budget-peak-bytes")
        expect(peak).to_have_text(f"{bm.budget(start).peak:,}")
        expect(page.locator("#fit")).to_contain_text("does not fit on A100-80GB")
        assert page.evaluate("document.scrollingElement.scrollWidth") <= 1280
        form, results = page.locator("#knobs").bounding_box(), page.locator(
            ".results").bounding_box()
        assert form["x"] + form["width"] <= results["x"]  # side by side
        _screenshot(page, "page-1280x800.png")

        page.locator("#devices").fill("8")
        page.locator("#devices").press("Tab")
        expect(peak).to_have_text(f"{bm.budget(start.with_(devices=8)).peak:,}")
        page.locator("#zero label", has_text="3").click()
        expect(peak).to_have_text(f"{bm.budget(sharded).peak:,}")
        assert bm.budget(sharded).peak < bm.budget(start.with_(devices=8)).peak
        expect(page).to_have_url(re.compile(r"devices=8&zero=3"))
        assert page.evaluate("document.scrollingElement.scrollWidth") <= 1280
        _screenshot(page, "page-1280x800-zero3.png")

        again = context.new_page()  # the link, opened afresh, shows the same
        again.set_viewport_size({"width": 700, "height": 900})
        again.goto(page.url)
        expect(again.locator(".budget-peak-bytes")).to_have_text(f"{bm.budget(sharded).peak:,}")
        assert again.locator("#zero input[value='3']").is_checked()
        form, results = again.locator("#knobs").bounding_box(), again.locator(
            ".results").bounding_box()
        assert form["y"] + form["height"] <= results["y"]  # one column
        assert again.evaluate("document.scrollingElement.scrollWidth") <= 700
    assert outside == []


def _screenshot(page, name: str) -> None:
    folder = os.environ.get("BUDGET_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / name))
