"""The standalone budget page (`python -m widgets.budget_app`) without a browser: its
settings read through the knob table, a link's query normalised and reproduced, bad
values named with their knob, a pasted config.json read as the command line reads the
file, and the server's limits: the Host allow-list, the same security headers on every
answer, the address at fault named, SIGTERM, and a flood of half-open connections and
parallel requests that leaves a visitor answered and nothing held.

Everything but the first test needs the optional extra `page` (starlette, uvicorn)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine import budget as bm
from widgets import budget_app

from budget_page_tools import ROOT, flooding, get, get_json, open_files, serving
from lab_tools import free_port

LLAMA_FILE = ROOT / "tests" / "fixtures" / "llama2_7b_config.json"


def test_without_the_page_extra_it_says_how_to_install_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(budget_app, "missing_extras", lambda: ["starlette", "uvicorn"])
    assert budget_app.main(["--no-browser"]) == 2
    err = capsys.readouterr().err
    assert "starlette and uvicorn" in err and "pip install -e '.[page]'" in err
    assert "Traceback" not in err


pytest.importorskip("starlette", reason="the budget page needs the extra 'page' "
                                        "(pip install -e '.[page]')")
pytest.importorskip("uvicorn", reason="the budget page needs the extra 'page'")
from widgets.budget_page import settings  # noqa: E402
from widgets.budget_page.server import host_names  # noqa: E402


def config_of(query: str) -> bm.BudgetConfig:
    from urllib.parse import parse_qsl
    return settings.config_from_params(dict(parse_qsl(query, keep_blank_values=True)))


def test_every_page_knob_of_the_table_is_a_control_with_its_help_and_bounds(monkeypatch):
    shown = {k["field"]: k for k in settings.describe_knobs()}
    assert list(shown) == [k.field for k in bm.shown_on("page")]
    assert shown["micro_batch"]["high"] == bm.knob("micro_batch").high
    assert shown["activation_model"]["help"] == bm.knob("activation_model").help
    assert set(shown["activation_model"]["choice_help"]) == set(bm.ACTIVATION_MODELS)
    assert "n_params" not in shown  # a command-line knob only
    extra = bm.Knob("warmup", "--warmup", int, 0, "a knob added to the table", "batch",
                    low=1, high=9)
    monkeypatch.setitem(bm.KNOBS, "warmup", extra)
    assert "warmup" in {k["field"] for k in settings.describe_knobs()}


@pytest.mark.parametrize("preset", ["gpt2-small", "llama2-7b", "tiny"])
def test_every_page_knob_reads_back_what_the_page_writes(preset):
    cfg, _ = config_of(f"preset={preset}")
    for k in bm.shown_on("page"):
        assert settings.read_value(k, settings.cfg_value(cfg, k.field)) == getattr(
            cfg, k.field), k.field
    everything = "&".join(f"{f}={v}" for f, v in settings.control_values(cfg).items())
    assert config_of(f"preset={preset}&{everything}")[0] == cfg


def test_a_link_reproduces_its_settings_and_keeps_only_what_differs():
    cfg, query = config_of("preset=llama2-7b&micro_batch=2&precision=bf16&devices=8&zero=3"
                           "&device=A100-80GB&attention=flash")
    assert cfg == bm.preset("llama2-7b", micro_batch=2, devices=8, zero=3, device="A100-80GB",
                            attention="flash", activation_model="hf")
    assert "precision" not in query  # the preset's own value
    assert config_of(query) == (cfg, query)
    start, _ = config_of("")
    assert start.name == settings.DEFAULT_PRESET and start.activation_model == "hf"
    assert start.device == settings.DEFAULT_DEVICE  # a device chosen by default
    assert config_of("preset=tiny")[0].activation_model == "engine"  # the preset's choice


def test_a_card_of_your_own_and_short_device_names():
    cfg, query = config_of("device=custom&device_memory=24GiB&device_flops=100T&headroom=1GiB")
    assert (cfg.device_memory, cfg.device_flops, cfg.headroom) == (24 * 2**30, 10**14, 2**30)
    assert bm.budget(cfg).device.memory == 24 * 2**30
    assert config_of("device=h100-80gb")[0].device == "H100-80GB-SXM"  # as the CLI reads it
    with pytest.raises(bm.BudgetError) as error:
        config_of("device=custom")
    assert {"device_memory", "device_flops"} <= set(settings.named_knobs(str(error.value)))


@pytest.mark.parametrize("query, knob, says", [
    (f"micro_batch={10 ** 300}", "micro_batch", "up to 1,048,576"),
    ("micro_batch=two", "micro_batch", "is not a whole number"),
    ("zero=7", "zero", "allowed: 0, 1, 2, 3"),
    ("precision=fp8", "precision", "allowed: fp32, bf16, fp16"),
    ("mfu=nan", "mfu", "not a finite number"),
    ("device=bogus", "device", "is not a device of this page"),
    ("device_memory=lots", "device_memory", "is not a memory size"),
    ("preset=x'%3Bimport", "preset", "is not a model of this page"),
    ("n_params=5", "n_params", "is not a setting of this page"),
    ("preset=llama2-7b&activation_model=pytorch", "architecture", "set architecture 'gpt2'"),
])
def test_a_bad_setting_is_named_with_its_fix(query, knob, says):
    with pytest.raises(bm.BudgetError) as error:
        config_of(query)
    assert says in str(error.value)
    assert knob in settings.named_knobs(str(error.value)) or knob in str(error.value)


def test_a_pasted_config_is_read_as_the_command_line_reads_the_file():
    """... with the page's defaults: SDPA, and MODEL_SEQ_LEN tokens, not the whole context."""
    text = LLAMA_FILE.read_text()
    cfg, query = config_of("config=" + __import__("urllib.parse").parse.quote(text))
    run = subprocess.run([sys.executable, "-m", "engine.budget", "--hf-config", str(LLAMA_FILE),
                          "--activations", "hf", "--device", settings.DEFAULT_DEVICE,
                          "--attention", "flash", "--seq", str(settings.MODEL_SEQ_LEN), "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert bm.budget(cfg).peak == json.loads(run.stdout)["memory"]["peak"]
    with pytest.raises(bm.BudgetError, match="config: the pasted text is not JSON"):
        config_of("config=" + text[:50])
    with pytest.raises(bm.BudgetError, match="more than a config.json's"):
        config_of("config=" + " " * (settings.MAX_CONFIG_CHARS + 1))


def test_host_names_with_or_without_a_port():
    names = host_names("127.0.0.1", ["mybox.lan:8866", "fe80::1"])
    assert {"127.0.0.1", "localhost", "[::1]", "mybox.lan", "[fe80::1]"} <= set(names)
    assert "[::1]" in host_names("::1")
    with pytest.raises(ValueError, match="--allow-host 'not a host'"):
        host_names("0.0.0.0", ["not a host"])


def _start_fails(*args: str) -> str:
    run = subprocess.run([sys.executable, "-m", "widgets.budget_app", "--no-browser", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    return run.stderr


def test_the_fault_is_named_before_serving():
    assert "--port 0" in _start_fails("--port", "0")
    said = _start_fails("--listen", "not a host", "--port", str(free_port()))
    assert "--listen 'not a host'" in said and "--port" not in said
    said = _start_fails("--listen", "192.0.2.1", "--port", str(free_port()))
    assert "--listen 192.0.2.1" in said and "--port" not in said  # not this machine's
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert f"port {port} is in use" in _start_fails("--port", str(port))
    assert "--allow-host" in _start_fails("--allow-host", "not a host")


@pytest.fixture
def page(tmp_path):
    with serving(tmp_path, port=free_port()) as served:
        yield served


HEADERS = ("content-security-policy", "x-content-type-options", "referrer-policy",
           "x-frame-options", "cache-control")


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs Linux's /proc")
def test_server_answers_its_own_host_with_headers_everywhere_and_stops_on_sigterm(page):
    base, server = page
    port = base.rsplit(":", 1)[1]
    answers = {"page": get(base + "/"), "rebinding": get(base + "/", host=f"evil.example:{port}"),
               "missing": get(base + "/nothing"),
               "huge": get(base + f"/api/budget?micro_batch={10 ** 300}"),
               "cross-site": get(base + "/api/budget", headers={"Sec-Fetch-Site": "cross-site"}),
               "script": get(base + "/static/page.js")}
    assert [answers[k][0] for k in answers] == [200, 400, 404, 400, 403, 200]
    for name, (status, headers, body) in answers.items():
        have = {h.lower() for h in headers}
        assert set(HEADERS) <= have, (name, headers)
        assert "default-src 'none'" in headers["content-security-policy"]
    assert "budget" not in answers["rebinding"][2].lower()
    huge = json.loads(answers["huge"][2])
    assert huge["knobs"] == ["micro_batch"] and "up to 1,048,576" in huge["error"]
    assert "<script src=\"static/page.js\">" in answers["page"][2]
    assert "//" not in answers["page"][2].split("<body>")[1].replace("</", "")  # nothing remote
    status, data = get_json(base + "/api/budget?preset=tiny&micro_batch=4")
    assert status == 200 and data["panels"]["peak"] == bm.budget(
        bm.preset("tiny", micro_batch=4, device=settings.DEFAULT_DEVICE)).peak
    assert data["query"] == "preset=tiny&micro_batch=4"
    children = subprocess.run(["ps", "--ppid", str(server.pid), "-o", "pid="],
                              capture_output=True, text=True).stdout.split()
    assert children == []  # no kernel, no process per visitor
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=15) == 0
    with pytest.raises(OSError):
        get(base + "/", timeout=5)


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs Linux's /proc")
def test_a_flood_leaves_a_visitor_answered_and_nothing_held(page):
    """400 half-open connections and 200 parallel requests for distinct settings: a
    visitor still gets the page and its answer within 2 s (settings nobody asked for
    before: an answer or a prompt 503, which the page retries); the half-open ones are
    closed by the server; once the flood ends the server holds what it held before."""
    base, server = page
    get(base + "/api/budget")  # the default answer, cached as the page opens
    before = open_files(server.pid)
    with flooding(base) as flood:
        for what in ("/", "/api/budget", "/static/page.js"):
            started = time.monotonic()
            status, _, _ = get(base + what, timeout=10)
            assert status == 200 and time.monotonic() - started < 2.0, what
        started = time.monotonic()  # settings of its own: an answer, or "busy" at once
        status, _, _ = get(base + "/api/budget?preset=gpt2-small&micro_batch=3", timeout=10)
        assert status in (200, 503) and time.monotonic() - started < 2.0
    results, slow = flood.results, flood.slow
    assert len(results) == 200 and set(results) <= {200, 503}, set(results)
    slow[0].settimeout(20)
    assert slow[0].recv(1024) == b""  # closed by the server: a head must come in time
    for s in slow:
        s.close()
    deadline = time.monotonic() + 20
    while open_files(server.pid) > before + 5 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert open_files(server.pid) <= before + 5, sorted(
        os.readlink(f"/proc/{server.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{server.pid}/fd"))


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 on this machine")
def test_ipv6_loopback_is_served(tmp_path):
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("::1 is not configured here")
    with serving(tmp_path, "--listen", "::1", port=free_port(), host="[::1]") as (base, _):
        status, data = get_json(base + "/api/budget?preset=tiny")
        assert status == 200 and data["ok"]


def test_a_wildcard_listen_mentions_allow_host(tmp_path):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "widgets.budget_app", "--listen",
                               "0.0.0.0", "--port", str(port), "--no-browser"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = [server.stdout.readline() for _ in range(2)]
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=15)
    assert "--allow-host" in lines[1], lines


def test_the_page_shows_full_fine_tuning_against_lora():
    pytest.importorskip("starlette")
    from widgets.budget_page import answers
    cfg = bm.preset("llama3.2-1b", activation_model="hf", lora_rank=16, device="h200")
    lora = answers._panels(cfg)["lora"]
    assert "full fine-tuning" in lora and "LoRA r=16 (set)" in lora
    assert "choose activations of <b>hf</b>" in answers._panels(
        bm.preset("tiny", device="h200"))["lora"]
