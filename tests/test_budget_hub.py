"""A model by its Hub id (`--hf-model ID`, the page's `hf_model`), against a stand-in of
the Hub's file API served here (HF_ENDPOINT): the config.json read as `--hf-config`
reads the file, cached on disk (read again offline), a gated model and a machine offline
each answered by one line saying what to do, an id that is not owner/name refused before
any request, and huggingface_hub missing named with its install line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine import budget as bm
from engine.budget import hub

from budget_page_tools import ROOT, get_json, serving
from hub_stand_in import GATED, LLAMA_FILE, MODEL, StandInHub, stand_in_hub
from lab_tools import free_port


@pytest.fixture
def hub_env(tmp_path):
    pytest.importorskip("huggingface_hub", reason="--hf-model needs huggingface_hub")
    with stand_in_hub(tmp_path) as env:
        yield env


def budget_cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine.budget", *args, "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


@pytest.mark.parametrize("bad", ["llama", "a/b/c", "../../etc/passwd", "meta llama/Llama",
                                 "-x/y", "owner/..", "x" * 97 + "/y", ""])
def test_an_id_that_is_not_owner_slash_name_is_refused_before_any_request(bad):
    with pytest.raises(bm.BudgetError, match="is not a Hub model id; write owner/name"):
        hub.hub_config(bad)
    assert hub.check_model_id("meta-llama/Llama-3.1-8B") == "meta-llama/Llama-3.1-8B"


def test_without_huggingface_hub_it_says_how_to_install(monkeypatch):
    monkeypatch.setattr(hub, "available", lambda: False)
    with pytest.raises(bm.BudgetError, match=r"pip install huggingface_hub"):
        hub.hub_config(MODEL)


def test_hf_model_reads_the_config_as_hf_config_does_and_caches_it(hub_env):
    from_file = budget_cli("--hf-config", str(LLAMA_FILE), "--seq", "1024", env={})
    from_hub = budget_cli("--hf-model", MODEL, "--seq", "1024", env=hub_env)
    assert from_hub.returncode == 0, from_hub.stderr
    assert (json.loads(from_hub.stdout)["memory"]["peak"]
            == json.loads(from_file.stdout)["memory"]["peak"])
    assert f"/{MODEL}/resolve/main/config.json" in StandInHub.seen
    asked = len(StandInHub.seen)
    offline = budget_cli("--hf-model", MODEL, "--seq", "1024",
                         env={**hub_env, "HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 0, offline.stderr  # from the disk cache
    assert json.loads(offline.stdout)["memory"]["peak"] == json.loads(from_hub.stdout)[
        "memory"]["peak"]
    assert len(StandInHub.seen) == asked


def test_a_gated_model_says_to_set_hf_token_or_paste_the_file(hub_env):
    run = budget_cli("--hf-model", GATED, env=hub_env)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    line, = run.stderr.strip().splitlines()
    assert "gated" in line and "HF_TOKEN" in line and "paste the model's config.json" in line
    assert "--hf-model gated-org/llama-2-7b" in line


def test_offline_with_nothing_cached_is_one_clear_line(hub_env):
    run = budget_cli("--hf-model", MODEL, env={**hub_env, "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 2 and "Traceback" not in run.stderr
    line, = run.stderr.strip().splitlines()
    assert "cannot be reached" in line and "not in the cache" in line
    assert StandInHub.seen == []


def test_a_bad_id_on_the_command_line_asks_nothing_of_the_hub(hub_env):
    run = budget_cli("--hf-model", "Llama-3.1-8B", env=hub_env)
    assert run.returncode == 2
    assert "--hf-model 'Llama-3.1-8B' is not a Hub model id" in run.stderr
    assert StandInHub.seen == []


def test_the_page_reads_a_hub_model(hub_env, tmp_path):
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from urllib.parse import quote
    from widgets.budget_page import settings
    with serving(tmp_path, port=free_port(), env=hub_env) as (base, _):
        status, data = get_json(f"{base}/api/budget?hf_model={quote(MODEL)}")
        assert status == 200, data
        pasted = settings.config_from_params({"config": LLAMA_FILE.read_text()})[0]
        assert data["panels"]["peak"] == bm.budget(pasted).peak
        assert data["query"].startswith("hf_model=someone%2Fllama-2-7b")
        assert MODEL in data["panels"]["model"]
        status, data = get_json(f"{base}/api/budget?hf_model={quote(GATED)}")
        assert status == 400 and "HF_TOKEN" in data["error"]
        assert data["knobs"] == ["hf_model"]
        status, data = get_json(f"{base}/api/budget?hf_model=not-an-id")
        assert status == 400 and "is not a Hub model id" in data["error"]
