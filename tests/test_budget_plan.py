"""The plan (engine.budget.plan): the settings that fit a device, fastest first."""
import json

import pytest

from engine.budget import cli, compat
from engine.budget.config import BudgetError, preset
from engine.budget.devices import device_figures
from engine.budget.fit import step_peak
from engine.budget.plan import plan

# The brief's case: Llama 3.1 8B with LoRA on every linear layer, 8 H100s, 1M tokens a step.
LLAMA_8B_LORA = preset("llama3.1-8b").with_(
    activation_model="hf", seq_len=2048, micro_batch=1, device="h100", devices=8,
    lora_rank=16, lora_targets="all-linear")
MILLION = 2 ** 20
# A small one: Llama 3.2 1B on two L4s (full fine-tuning).
LLAMA_1B = preset("llama3.2-1b").with_(activation_model="hf", seq_len=1024, micro_batch=1,
                                       device="l4", devices=2)


@pytest.fixture(scope="module")
def big_plan():
    return plan(LLAMA_8B_LORA, tokens_per_step=MILLION)


def test_rows_are_ordered_by_predicted_step_time(big_plan):
    times = [r.step_seconds for r in big_plan.rows]
    assert len(times) > 5
    assert times == sorted(times)
    assert times[-1] > times[0]
    # each row after the first says why it is slower (or ties)
    assert not big_plan.rows[0].why and all(r.why for r in big_plan.rows[1:])


def test_every_row_fits_validates_and_sees_the_tokens(big_plan):
    memory, _ = device_figures(LLAMA_8B_LORA)
    for row in big_plan.rows:
        c = row.config
        assert c.validate() is c
        assert compat.refusal(c) is None
        assert row.peak == step_peak(c)
        assert row.peak + c.headroom <= memory
        assert c.micro_batch * c.accumulation * c.seq_len * c.devices == MILLION


def test_each_row_is_the_largest_micro_batch_that_fits(big_plan):
    memory, _ = device_figures(LLAMA_8B_LORA)
    for row in big_plan.rows[:6]:
        c = row.config
        if c.accumulation > 1:
            larger = c.with_(micro_batch=2 * c.micro_batch, accumulation=c.accumulation // 2)
            assert step_peak(larger) + c.headroom > memory


def test_both_recipes_and_every_stage_are_tried(big_plan):
    settings = [r.settings() for r in big_plan.rows]
    assert {s["fine_tuning"] for s in settings} == {"LoRA r=16", "full"}
    assert {s["zero"] for s in settings} == {0, 1, 2, 3}
    assert {s["recompute"] for s in settings} == {"none", "full"}
    only_lora = plan(LLAMA_8B_LORA, tokens_per_step=MILLION, full_fine_tuning=False)
    assert {r.fine_tuning for r in only_lora.rows} == {"LoRA r=16"}


def test_recompute_loses_by_its_extra_forward(big_plan):
    rows = big_plan.rows
    first_full = next(i for i, r in enumerate(rows) if r.config.recompute == "full")
    assert rows[0].config.recompute == "none"
    assert "repeats every block's forward" in rows[first_full].why


def test_a_refused_combination_never_appears(big_plan):
    # a transformers step has no selective recompute: the table refuses it
    assert all(r.config.recompute != "selective" for r in big_plan.rows)
    assert any("recompute='selective'" in why for why, _ in big_plan.refused)
    # Gemma 2 runs eager attention only
    gemma = preset("gemma2-2b").with_(activation_model="hf", seq_len=512, micro_batch=1,
                                      device="h100", lora_rank=8)
    gemma_plan = plan(gemma)
    assert gemma_plan.rows
    assert {r.config.attention for r in gemma_plan.rows} == {"standard"}
    assert any("gemma2" in why for why, _ in gemma_plan.refused)


def test_selective_recompute_is_listed_where_the_model_allows_it():
    textbook = LLAMA_1B.with_(activation_model="transformer")
    assert "selective" in {r.config.recompute for r in plan(textbook).rows}


def test_one_device_lists_each_step_once():
    one = plan(LLAMA_1B.with_(devices=1))
    assert {r.config.zero for r in one.rows} == {0}
    keys = [tuple(r.settings().items()) for r in one.rows]
    assert len(keys) == len(set(keys))


def test_bad_questions_are_refused_by_name():
    with pytest.raises(BudgetError, match="tokens_per_step=1,000 .*multiple of 2,048"):
        plan(LLAMA_1B, tokens_per_step=1000)
    with pytest.raises(BudgetError, match="a plan needs a device"):
        plan(LLAMA_1B.with_(device="none"))


def _cli(capsys, *args):
    code = cli.main(["--preset", "llama3.2-1b", "--activations", "hf", "--seq", "1024",
                     "--batch", "1", "--device", "l4", "--devices", "2", "--plan", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_plan_prints_the_table_its_assumptions_and_defaults(capsys):
    code, out, _ = _cli(capsys, "--tokens-per-step", "16384")
    assert code == 0
    assert "plan for llama3.2-1b on 2 x L4" in out
    assert "step time = FLOPs per device" in out and "100 GB/s" in out
    assert "8 sequences of 1,024 tokens" in out
    assert "--tokens-per-step 16,384 (given)" in out
    assert "--link-bandwidth 100 GB/s:" in out and "--plan-full-fine-tuning on:" in out


def test_cli_plan_json_is_the_list_of_rows(capsys):
    code, out, _ = _cli(capsys, "--json", "--link-bandwidth", "25GB")
    assert code == 0
    rows = json.loads(out)
    assert isinstance(rows, list) and rows
    assert rows[0].keys() >= {"micro_batch", "accumulation", "recompute", "attention", "zero",
                              "fine_tuning", "step_seconds", "peak", "why"}
    assert [r["step_seconds"] for r in rows] == sorted(r["step_seconds"] for r in rows)
    sent = [r for r in rows if r["sent_per_device"]]
    assert sent and all(r["communication_seconds"] == pytest.approx(r["sent_per_device"] / 25e9)
                        for r in sent)


def test_cli_plan_errors_name_the_flag(capsys):
    code, _, err = _cli(capsys, "--tokens-per-step", "1000")
    assert code == 2 and "--tokens-per-step 1,000" in err


def test_a_huge_step_is_split_within_the_knobs_bounds():
    # 2^30 sequences a device: only splits with B and K at most MAX_BATCH are tried
    from engine.budget.knobs import MAX_BATCH
    small = preset("tiny").with_(device="h100", seq_len=16)
    huge = plan(small, tokens_per_step=2 ** 34)
    assert huge.rows and huge.sequences_per_device == 2 ** 30
    for row in huge.rows:
        assert row.config.micro_batch <= MAX_BATCH and row.config.accumulation <= MAX_BATCH
        assert row.config.micro_batch * row.config.accumulation == 2 ** 30
    with pytest.raises(BudgetError, match="more than micro-batch x accumulation can reach"):
        plan(small.with_(seq_len=4), tokens_per_step=2 ** 44)
