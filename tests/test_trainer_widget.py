"""TrainerDashboard without a browser: feed it records, read its models back.

The dashboard must show what it is given (the status line, the progress with the
steps and time left, the figure with the loss and the gradient norm, the MFU),
write it into its widget models during the run (that is what the browser
receives while the cell runs; nothing is printed), redraw only when asked to
(every `redraw_every` steps, on evaluation steps, at the end), never stop a run
(its callback returns None), reject records without the fields it needs, and
work as the real trainer's callback.
"""
from __future__ import annotations

import pytest

ipywidgets = pytest.importorskip("ipywidgets")

from widgets import TrainerDashboard  # noqa: E402  (the lazy package export)
from widgets.trainer import PHASES  # noqa: E402


def record(step, loss=3.0, val=None, **extra):
    r = {"step": step, "loss": loss, "tokens_per_s": 2048 / 0.1, "step_time": 0.1,
         "grad_norm": 0.5, "phases": {"loss": 0.03, "backward": 0.06, "optimizer": 0.01,
                                      "evaluation": 0.0}}
    if val is not None:
        r["val_loss"] = val
        r["phases"]["evaluation"] = 0.05
    r.update(extra)
    return r


def test_status_shows_the_last_record():
    dash = TrainerDashboard(total_steps=100, redraw_every=50)
    assert "waiting" in dash.status.value
    dash(record(1, loss=4.2))
    dash(record(2, loss=3.9876))
    text = dash.summary()
    assert "step 2/100" in text and "loss 3.9876" in text
    assert "20,480 tokens/s" in text and "100 ms/step" in text and "grad norm 0.500" in text
    assert "3.9876" in dash.status.value


def test_validation_loss_and_phase_shares():
    dash = TrainerDashboard(redraw_every=1000)
    dash(record(1))
    dash(record(2, val=2.5))
    assert "validation 2.5000 (step 2)" in dash.summary()
    s = dash.series()
    assert s["val_step"] == [2] and s["val_loss"] == [2.5]
    total = sum(s["phases"].values())
    assert s["phases"]["backward"] == pytest.approx(0.12)
    assert total == pytest.approx(0.03 * 2 + 0.06 * 2 + 0.01 * 2 + 0.05)
    assert "backward" in dash.summary() and "%" in dash.summary()
    assert set(s["phases"]) == set(PHASES)


def test_redraws_only_when_due():
    dash = TrainerDashboard(total_steps=25, redraw_every=10)
    for step in range(1, 10):
        dash(record(step))
    assert dash.redraws == 0 and dash.plot.value == b""
    dash(record(10))
    assert dash.redraws == 1
    dash(record(11, val=2.0))            # evaluation steps always redraw
    assert dash.redraws == 2
    for step in range(12, 26):           # 20 (every 10) and 25 (the last step)
        dash(record(step))
    assert dash.redraws == 4
    dash.finish()
    assert dash.redraws == 5 and dash.status.value.startswith("<code>done: ")


def test_the_figure_is_one_png_in_the_image_widget():
    dash = TrainerDashboard(redraw_every=1, reference_loss=3.25)
    dash(record(1, val=3.0))
    first = dash.plot.value
    dash(record(2, grad_norm=0.25))
    assert bytes(dash.plot.value).startswith(b"\x89PNG") and bytes(dash.plot.value) == dash.png
    assert bytes(dash.plot.value) != bytes(first)   # replaced in place by the new picture
    fig = dash.make_figure()
    loss_ax, norm_ax = fig.axes[:2]
    labels = [line.get_label() for line in loss_ax.get_lines()]
    assert "validation" in labels and "unigram entropy" in labels
    assert list(loss_ax.get_lines()[0].get_ydata()) == [3.0, 3.0]
    assert "gradient norm" in norm_ax.get_title()
    assert list(norm_ax.get_lines()[0].get_ydata()) == [0.5, 0.25]


def test_callback_never_stops_the_run():
    dash = TrainerDashboard()
    assert dash(record(1)) is None


def test_a_record_without_a_step_is_refused_with_its_keys():
    dash = TrainerDashboard()
    with pytest.raises(KeyError, match="needs 'step'"):
        dash({"loss": 1.0})
    with pytest.raises(ValueError, match="redraw_every"):
        TrainerDashboard(redraw_every=0)


def test_displaying_it_shows_the_box():
    dash = TrainerDashboard(title="run <1>")
    bundle = dash._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert "text/plain" in data
    assert "run &lt;1&gt;" in dash.title.value     # the title is escaped


def test_as_the_real_trainers_callback():
    """A few steps of engine.train on a very small model feed the dashboard."""
    train = pytest.importorskip("engine.train")
    dash = TrainerDashboard(total_steps=4, redraw_every=2)
    result = train.train(train.TrainConfig(steps=4, batch_size=2, block_size=16, n_layer=1,
                                           n_head=2, n_embd=16, eval_every=2, eval_batches=1,
                                           warmup=1, log_every=100),
                         callback=dash)
    dash.finish()
    assert [r["step"] for r in dash.records] == [1, 2, 3, 4]
    assert dash.series()["val_step"] == [2, 4]
    assert dash.records[-1]["loss"] == result.history[-1]["loss"]
    assert "step 4/4" in dash.summary() and "tokens/s" in dash.summary()
    assert bytes(dash.plot.value).startswith(b"\x89PNG")


def test_progress_bar_time_left_and_smoothed_speed():
    dash = TrainerDashboard(total_steps=100, redraw_every=1000)
    dash(record(1, step_time=0.2, tokens_per_s=10_000))
    for step in range(2, 21):
        dash(record(step, step_time=0.1, tokens_per_s=20_000))
    assert dash.progress.value == 20 and dash.progress.max == 100
    line = dash.progress_line()
    assert line.startswith("step 20 of 100 (20%), 80 steps left, about ") and \
        line.endswith(" s left")
    # 80 steps at a smoothed step time between 0.1 and 0.2 s
    assert 80 * 0.1 <= dash.time_left() <= 80 * 0.2
    smoothed = dash._smooth_speed
    assert 10_000 < smoothed < 20_000 and f"{smoothed:,.0f} tokens/s (smoothed)" in dash.summary()
    dash(record(21, time_left=5.0))  # the trainer's own estimate wins
    assert dash.time_left() == 5.0 and "about 5 s left" in dash.progress_text.value


def test_a_run_that_stops_early_says_so_and_why():
    dash = TrainerDashboard(total_steps=600)
    for step in range(1, 4):
        dash(record(step))
    dash.finish(reason="the 300 s time limit")
    assert dash.progress_line(done=True) == "stopped early at step 3 of 600: the 300 s time limit"
    assert "stopped early" in dash.progress_text.value and dash.progress.bar_style == "warning"
    full = TrainerDashboard(total_steps=2)
    full(record(1))
    full(record(2))
    full.finish()
    assert full.progress_line(done=True) == "finished: step 2 of 2" and full.stopped_early is None
    assert full.progress.bar_style == "success"
    unexplained = TrainerDashboard(total_steps=10)
    unexplained(record(1))
    unexplained.finish()
    assert "stopped early at step 1 of 10" in unexplained.progress_line(done=True)


def test_mfu_is_shown_when_the_record_has_it():
    dash = TrainerDashboard(total_steps=10)
    dash(record(1))
    assert "MFU" not in dash.summary()
    dash(record(2, mfu=0.234))
    assert "MFU 23%" in dash.summary() and "MFU 23%" in dash.status.value


def test_without_a_total_the_progress_says_only_the_step():
    dash = TrainerDashboard()
    dash(record(7))
    assert dash.progress_line() == "step 7"


def test_the_widgets_change_during_the_run_and_nothing_is_printed(capsys):
    """What the browser is sent while the cell runs: every change of a widget's value
    (each becomes a comm message at once). The progress bar and the text move with every
    step, the picture with every redraw, all before finish()."""
    dash = TrainerDashboard(total_steps=30, redraw_every=10)
    sent = {"progress": [], "progress_text": [], "status": [], "plot": []}
    for name in sent:
        getattr(dash, name).observe(lambda change, name=name: sent[name].append(change["new"]),
                                    names="value")
    for step in range(1, 21):
        dash(record(step, loss=4.0 - 0.05 * step))
    assert sent["progress"] == [float(s) for s in range(1, 21)]
    assert len(set(sent["progress_text"])) == 20 and len(set(sent["status"])) == 20
    assert len(sent["plot"]) == 2 and sent["plot"][0] != sent["plot"][1]   # steps 10 and 20
    assert "10 steps left" in sent["progress_text"][-1]
    dash.finish()
    assert capsys.readouterr().out == ""
