"""The page's knobs greyed from the budget's compatibility table, without a browser:
each answer carries every page knob that `engine.budget.compat.idle_knobs` greys,
with the table's own reason; a value the settings refuse that the visitor set is put
back, saying so; the recipes' knobs (QLoRA, DoRA, trained modules, the ZeRO engine)
are page settings; and the assumptions served are the docstrings of the modules that
model the step answered.

Needs the optional extra `page` (starlette, uvicorn)."""
from __future__ import annotations

from urllib.parse import parse_qsl

import pytest

from engine import budget as bm
from engine.budget import compat
from engine.budget.knobs import KNOBS

from budget_page_tools import get, get_json, serving
from lab_tools import free_port

pytest.importorskip("starlette", reason="the budget page needs the extra 'page' "
                                        "(pip install -e '.[page]')")
pytest.importorskip("uvicorn", reason="the budget page needs the extra 'page'")
from widgets.budget_page import settings  # noqa: E402

# Settings that between them grey every page knob the compatibility table can grey.
CASES = [
    "preset=gpt2-small",                                        # hf, full fine-tuning
    "preset=gpt2-small&activation_model=transformer&devices=4",  # no framework loop
    "preset=gpt2-small&activation_model=rule&device=none",
    "preset=gpt2-small&activation_model=engine",
    "preset=gpt2-small&activation_model=pytorch",
    "preset=gpt2-small&activation_model=pytorch&architecture=gpt2&precision=bf16",
    "preset=llama3.2-1b&lora_rank=16&qlora=on",
    "preset=llama3.2-1b&lora_rank=16&optimizer=adafactor",
    "preset=llama3.2-1b&lora_rank=16&lora_targets=all-linear&dora=on&devices=8&zero=3"
    "&zero_engine=fsdp",
    "preset=llama3.2-1b&precision=fp32",
]
# The recipes the page must offer (issue 59, item 4).
RECIPE_KNOBS = ("qlora", "dora", "modules_to_save", "optimizer", "lora_targets",
                "autocast_mode", "outputs", "zero_engine")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("page"), port=free_port()) as (url, _):
        yield url


def page_greyed(cfg) -> dict[str, str]:
    """What the compatibility table greys among the page's knobs, with its reasons."""
    return {f: rule.why(cfg) for f, rule in compat.idle_knobs(cfg).items()
            if "page" in KNOBS[f].fronts}


def test_every_recipe_knob_is_a_page_setting_with_its_choices():
    shown = {k["field"]: k for k in settings.describe_knobs()}
    assert set(RECIPE_KNOBS) <= set(shown)
    assert {"adafactor", "adamw-8bit"} <= set(shown["optimizer"]["choices"])
    assert "freed-after-backward" in shown["outputs"]["choices"]
    assert shown["autocast_mode"]["choices"] == ["on", "off"]
    assert shown["zero_engine"]["choices"] == ["deepspeed", "fsdp"]
    assert shown["qlora"]["kind"] == shown["dora"]["kind"] == "bool"
    assert "all-linear" in shown["lora_targets"]["suggestions"]


def test_every_page_knob_the_table_greys_is_greyed_in_the_answer_with_its_reason(base):
    seen = set()
    for query in CASES:
        status, data = get_json(f"{base}/api/budget?{query}")
        assert status == 200 and data["ok"], (query, data.get("error"))
        cfg = settings.config_from_params(dict(parse_qsl(query)))[0]
        assert data["idle"] == page_greyed(cfg), query
        seen |= set(data["idle"])
    can_grey = {r.knob for r in compat.RULES if r.greys and "page" in KNOBS[r.knob].fronts}
    assert can_grey <= seen, sorted(can_grey - seen)


def test_dora_is_greyed_with_lora_rank_0_and_by_qlora_each_with_its_own_reason(base):
    _, full = get_json(f"{base}/api/budget?preset=llama3.2-1b")
    assert full["idle"]["dora"] == compat.idle_knobs(bm.preset("llama3.2-1b"))["dora"].why(
        bm.preset("llama3.2-1b")) == "no adapters: LoRA rank is 0 (full fine-tuning)"
    _, qlora = get_json(f"{base}/api/budget?preset=llama3.2-1b&lora_rank=16&qlora=on")
    assert qlora["idle"]["dora"] == "DoRA over 4-bit weights was not measured"
    assert "qlora" not in qlora["idle"] and "lora_targets" not in qlora["idle"]


def test_the_zero_engine_is_greyed_until_gradients_are_sharded(base):
    _, one = get_json(f"{base}/api/budget?preset=llama3.2-1b&devices=8&zero=1")
    assert one["idle"]["zero_engine"] == ("only ZeRO stages 2 and 3 over several devices "
                                          "shard the gradients")
    _, sharded = get_json(f"{base}/api/budget?preset=llama3.2-1b&devices=8&zero=2")
    assert "zero_engine" not in sharded["idle"]


def test_a_refused_value_the_visitor_set_is_put_back_saying_so(base):
    """DoRA and QLoRA left on when the rank goes back to 0: both set back to off, as the
    widget does, and the answer says so; the link keeps neither."""
    status, data = get_json(f"{base}/api/budget?preset=llama3.2-1b&lora_rank=0&dora=on"
                            f"&qlora=on")
    assert status == 200 and data["ok"]
    assert data["values"]["dora"] == data["values"]["qlora"] == "off"
    assert "dora" not in data["query"] and "qlora" not in data["query"]
    why = "no adapters: LoRA rank is 0 (full fine-tuning)"
    assert sorted(data["notes"]) == [f"dora set back to off for you: {why}.",
                                     f"qlora set back to off for you: {why}."]
    assert data["panels"]["peak"] == bm.budget(settings.config_from_params(
        {"preset": "llama3.2-1b"})[0]).peak


def test_a_conflict_with_the_model_itself_is_still_refused_by_name(base):
    """Only what the visitor set is put back: a LLaMA model under the plain PyTorch GPT
    is refused, naming architecture, not silently turned into GPT-2."""
    status, data = get_json(f"{base}/api/budget?preset=llama2-7b&activation_model=pytorch")
    assert status == 400 and "architecture" in data["knobs"]


def _sections(page: str) -> list[str]:
    return [part.split("</code>")[0] for part in page.split("<h2><code>")[1:]]


@pytest.mark.parametrize("query, modules", [
    ("preset=llama3.2-1b&lora_rank=16&qlora=on",
     ["real_step", "moments", "block_backward", "optimizer_step", "lora", "qlora"]),
    ("preset=llama3.2-1b&lora_rank=16&dora=on&modules_to_save=lm_head&tied_embedding=off"
     "&devices=8&zero=3", ["real_step", "moments", "block_backward", "optimizer_step", "lora",
                           "dora", "trained_modules", "sharding"]),
    ("preset=gpt2-small&activation_model=transformer", [""]),
])
def test_the_assumptions_are_the_docs_of_the_modules_of_the_step_answered(base, query,
                                                                          modules):
    import importlib
    status, _, page = get(f"{base}/assumptions?{query}")
    names = [f"engine.budget.{m}".rstrip(".") for m in modules]
    assert status == 200 and _sections(page) == names
    for name in names:
        first = importlib.import_module(name).__doc__.strip().splitlines()[0]
        assert first.replace("'", "&#x27;").replace('"', "&quot;") in page
    back = f"href='./?{settings.config_from_params(dict(parse_qsl(query)))[1]}'"
    assert back in page.replace("&amp;", "&")  # back to the same answer


def test_refused_settings_get_the_general_assumptions_and_the_refusal(base):
    status, _, page = get(f"{base}/assumptions?preset=nonesuch")
    assert status == 200 and _sections(page) == ["engine.budget"]
    assert "is not a model of this page" in page
