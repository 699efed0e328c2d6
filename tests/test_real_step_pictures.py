"""Lesson 07's real framework step, in pictures (widgets/real_step.py and the lesson).

* per measured step, three bars: measured, the budget's prediction, the textbook formula,
  each as long as its number;
* one strip of memory through the step, whose red part is the vocabulary-sized tensors:
  three fp32 [B*N, V] tensors at the loss's backward, as exercise 07.5 says;
* the table of numbers folded into a closed section whose text form is constant;
* the lesson draws these instead of printing the table, and its MFU prose says what its
  measurement shows (about half) without setting it beside lesson 13's all-core MFU.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from engine import budget as bm  # noqa: E402
from notebook_tools import ROOT  # noqa: E402
from widgets.real_step import (GB, folded_table, moment_parts, plot_measured_steps,  # noqa: E402
                               plot_step_memory)

LESSON = (ROOT / "course" / "source" / "07_training_step_budget.py").read_text()
N_TOKENS, VOCAB = 8 * 1024, 50257


def gpt2_bf16():
    return bm.budget(bm.preset("gpt2-small", activation_model="hf", micro_batch=8,
                               precision="bf16", attention="flash"))


def test_three_bars_per_measured_step_each_as_long_as_its_number():
    ax = Figure().subplots()
    plot_measured_steps(ax, ["a", "b"], [10e9, 20e9], [11e9, 19e9], [5e9, 6e9])
    widths = sorted(round(p.get_width(), 6) for p in ax.patches)
    assert widths == [5, 6, 10, 11, 19, 20]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == \
        ["measured", "budget (this code)", "textbook formula"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]


def test_the_strip_shows_three_fp32_vocabulary_tensors_at_the_loss_backward():
    result = gpt2_bf16()
    step = result.activations.step
    one = 4 * N_TOKENS * VOCAB
    parts = [moment_parts(m, result.activations.items, result.activations.saved, N_TOKENS,
                          VOCAB) for m in step.moments]
    for moment, part in zip(step.moments, parts):
        assert sum(part.values()) == moment.bytes, moment.name    # nothing lost or doubled
    peak = parts[[m.name for m in step.moments].index(step.peak_moment.name)]
    assert peak["[B·N, V] tensors"] == 3 * one                     # 07.5's answer, drawn
    assert parts[-1]["[B·N, V] tensors"] == 0                       # gone by the update
    ax = Figure().subplots()
    plot_step_memory(ax, result, N_TOKENS, VOCAB, measured={step.peak_moment.name: 13.4e9})
    assert [t.get_text().replace("\n", " ") for t in ax.get_xticklabels()] == \
        [m.name.replace("the ", "", 1) for m in step.moments]
    labels = [t.get_text() for t in ax.texts]
    assert f"{3 * one / GB:.1f} GB\n3 x fp32\n[B·N, V]" in labels
    assert any(line.get_label() == "measured" for line in ax.lines)


def test_the_table_is_folded_and_its_text_form_is_constant():
    table = folded_table("numbers <1>", ["a", "b"], [[1, "x<y"]])
    assert table.data.startswith("<details><summary>numbers &lt;1&gt;</summary><table>")
    assert "<td>x&lt;y</td>" in table.data and "<details open" not in table.data
    assert repr(table) == repr(folded_table("other", ["c"], [[2]]))   # nbval sees no numbers


def _section(start: str, end: str) -> str:
    return LESSON[LESSON.index(start):LESSON.index(end)]


def test_lesson_07_draws_the_real_steps_and_folds_the_numbers():
    section = _section("## A real framework's step", "## The command line")
    for call in ("plot_measured_steps(", "plot_step_memory(", "folded_table("):
        assert call in section, call
    assert "print(f\"{row['name']:<34}\"" not in section       # the 10 x 7 printed table
    assert "for what, size in moment.alive[:4]:\n    print" not in section


def test_lesson_07_says_what_its_mfu_measurement_shows():
    after = LESSON[LESSON.index("# CHECK 07.4"):LESSON.index("## A real framework's step")]
    summary = LESSON[LESSON.index("## What you built"):]
    for text in (after, summary):
        assert "far below 1" not in text and "well below 1" not in text
    assert "0.46" in after and "about half" in after
    assert "52%" not in LESSON and "not to be set side by side" in after


def test_the_heads_backward_shows_the_gradient_of_the_logits_in_red():
    """At the head's backward the gradient of the logits has taken the log_softmax output's
    place among the saved tensors: one fp32 [B*N, V] tensor, red and labelled like the
    moments before it; the gradients the backward has made by then are grey, not blue."""
    result = gpt2_bf16()
    step, acts = result.activations.step, result.activations
    one = 4 * N_TOKENS * VOCAB
    parts = {m.name: moment_parts(m, acts.items, acts.saved, N_TOKENS, VOCAB)
             for m in step.moments}
    head = next(name for name in parts if "head" in name)
    assert parts[head]["[B·N, V] tensors"] == one
    assert parts[head]["saved activations"] == acts.saved - one
    end = next(name for name in parts if "end of the backward" in name)
    assert parts[end]["saved activations"] == 0 and parts[end]["[B·N, V] tensors"] == 0
    ax = Figure().subplots()
    plot_step_memory(ax, result, N_TOKENS, VOCAB)
    labels = [t.get_text() for t in ax.texts]
    assert f"{one / GB:.1f} GB\n1 x fp32\n[B·N, V]" in labels
    assert sum("[B·N, V]" in label for label in labels) == 3     # forward end, loss, head


def test_lesson_07_says_which_optimizer_a_real_loop_runs_with_the_budgets_number():
    """The paragraph on torch's for-loop / foreach / fused AdamW and the loop's outputs, and
    its one number: LLaMA-2 7B at B=1 peaks at the optimizer step under foreach and not
    under fused; the committed output is what the budget computes, not typed."""
    import json
    section = _section("### Which optimizer, and which outputs, the loop runs",
                       "## The command line")
    for words in ("for-loop", "foreach", "fused", "adamw_torch_fused",
                  "torch.optim.AdamW(params)", "logits, loss = model(x, y)",
                  "engine/budget/frameworks.py"):
        assert words in section, words
    assert "optimizer_impl=impl" in section
    steps = {impl: bm.budget(bm.preset("llama2-7b", activation_model="hf", micro_batch=1,
                                       seq_len=1024, optimizer_impl=impl))
             for impl in ("fused", "foreach")}
    assert steps["foreach"].activations.step.peak_moment.name == "the optimizer step"
    assert steps["fused"].activations.step.peak_moment.name != "the optimizer step"
    assert steps["foreach"].peak > steps["fused"].peak
    solution = json.loads((ROOT / "course" / "solutions" /
                           "07_training_step_budget.ipynb").read_text())
    printed = "".join("".join(o.get("text", "")) for c in solution["cells"]
                      if c["cell_type"] == "code" and "optimizer_impl=impl" in "".join(c["source"])
                      for o in c["outputs"])
    for impl, step in steps.items():
        assert f"peak {bm.human_bytes(step.peak)}, at " \
               f"{step.activations.step.peak_moment.name}" in printed, (impl, printed)
