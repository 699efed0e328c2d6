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


class FakeClock:
    """The dashboard's clock, moved by the test: `clock.now += seconds`."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_progress_bar_time_left_and_smoothed_speed():
    clock = FakeClock()
    dash = TrainerDashboard(total_steps=100, redraw_every=1000, clock=clock)
    dash(record(1, step_time=0.2, tokens_per_s=10_000))
    for step in range(2, 21):
        clock.now += 0.2 if step < 4 else 0.1
        dash(record(step, step_time=0.1, tokens_per_s=20_000))
    assert dash.progress.value == 20 and dash.progress.max == 100
    line = dash.progress_line()
    assert line.startswith("step 20 of 100 (20%), 80 steps left, about ") and \
        line.endswith(" s left")
    # 80 steps at the run's pace so far, between 0.1 and 0.2 s a step
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


# ------------------------------------------------------------ the estimate and the speed
def _estimates(dash, clock, durations):
    """Feed one record per duration (the clock moves by it); the time-left estimate after
    each step."""
    out = []
    for step, seconds in enumerate(durations, start=1):
        clock.now += seconds
        dash(record(step, step_time=seconds, tokens_per_s=2048 / seconds))
        out.append(dash.time_left())
    return out


def test_the_time_left_moves_steadily_when_the_step_time_is_noisy():
    """A busy machine slows a few steps to 3x; an evaluation step takes a second. The
    estimate may drift, but it never jumps up by more than 5% from one step to the next
    (a moving average of the last step times jumped by half)."""
    durations = [0.1] * 200
    for busy in range(40, 46):
        durations[busy] = 0.3
    for evaluation in range(24, 200, 25):
        durations[evaluation] = 1.0
    clock = FakeClock()
    estimates = _estimates(TrainerDashboard(total_steps=200, redraw_every=1000, clock=clock),
                           clock, durations)
    rises = [later / earlier - 1 for earlier, later in zip(estimates[9:], estimates[10:-1])]
    assert max(rises) <= 0.05 + 1e-9, f"the estimate rose by {max(rises):.0%} in one step"
    # and it is right about the rest of the run, give or take a fifth
    for step in (50, 100, 150):
        truth = sum(durations[step:])
        assert abs(estimates[step - 1] / truth - 1) < 0.2, (step, estimates[step - 1], truth)


def test_over_a_minute_the_estimate_is_shown_to_five_seconds():
    from widgets.trainer import _seconds
    assert _seconds(42) == "42 s" and _seconds(91) == "1 min 30 s" and _seconds(93) == "1 min 35 s"


def test_the_plotted_speed_is_the_smoothed_speed_the_status_names():
    dash = TrainerDashboard(total_steps=10, redraw_every=1000)
    for step, speed in enumerate((10_000, 30_000, 10_000, 30_000), start=1):
        dash(record(step, tokens_per_s=speed))
    fig = dash.make_figure()
    ax = next(a for a in fig.axes if "tokens per second" in a.get_title())
    assert "smoothed" in ax.get_title() and "(smoothed)" in dash.summary()
    plotted = list(ax.lines[0].get_ydata())
    assert plotted == dash.series()["smoothed_tokens_per_s"]
    assert plotted[-1] == dash._smooth_speed and f"{plotted[-1]:,.0f} tokens/s" in dash.summary()
    assert max(plotted) < 30_000        # not the raw speeds


def test_every_phase_bar_is_visible_and_says_its_share():
    from widgets.trainer import MIN_BAR_PERCENT
    dash = TrainerDashboard(total_steps=10, redraw_every=1000)
    dash(record(1, phases={"loss": 0.3, "backward": 0.6, "optimizer": 0.002,
                           "evaluation": 0.098}))
    fig = dash.make_figure()
    ax = next(a for a in fig.axes if a.get_title() == "where the time goes")
    widths = [bar.get_width() for bar in ax.patches]
    labels = [t.get_text() for t in ax.texts]
    assert len(widths) == 4 and min(widths) >= MIN_BAR_PERCENT
    assert labels == ["30%", "60%", "0.2%", "10%"]
    assert all(bar.get_width() < ax.get_xlim()[1] for bar in ax.patches)


# ------------------------------------------------------------ stopping
def test_the_stop_button_ends_the_loop_and_says_who_stopped_it():
    import asyncio
    dash = TrainerDashboard(total_steps=100, redraw_every=1000)

    async def loop():
        with dash.running():
            for step in range(1, 101):
                if not await dash.keep_going():
                    break
                dash(record(step))
                if step == 7:
                    dash.stop_button.click()        # what a click in the browser does
    asyncio.run(loop())
    assert dash.last_step() == 7 and dash.stop_button.disabled
    assert dash.progress_line(done=True) == \
        "stopped early at step 7 of 100: stopped by you at step 7"
    assert dash.progress.bar_style == "warning"


def test_an_interrupt_inside_running_is_caught_into_one_line():
    dash = TrainerDashboard(total_steps=100, redraw_every=1000)
    with dash.running():
        for step in range(1, 101):
            dash(record(step))
            if step == 12:
                raise KeyboardInterrupt
    assert "stopped by you at step 12" in dash.progress_text.value
    full = TrainerDashboard(total_steps=3)
    with full.running():
        for step in range(1, 4):
            full(record(step))
    assert full.progress_line(done=True) == "finished: step 3 of 3"
    with pytest.raises(ValueError):                  # other errors are not swallowed
        with TrainerDashboard(total_steps=3).running():
            raise ValueError("a broken step")


def test_the_saved_output_becomes_the_final_picture(monkeypatch):
    """show() displays the dashboard with a display id; finish() updates that output with
    the dashboard's bundle, which then carries the PNG (what a saved notebook shows where
    the widget cannot be drawn, instead of `VBox(children=...`)."""
    import IPython.display
    updates = []

    class Handle:
        def update(self, obj):
            updates.append(obj._repr_mimebundle_())
    monkeypatch.setattr(IPython.display, "display", lambda obj, display_id=None: Handle())
    dash = TrainerDashboard(total_steps=2)
    assert dash.show() is None              # no handle's text under the cell
    dash(record(1))
    dash(record(2))
    assert not updates
    dash.finish()
    data = updates[-1][0] if isinstance(updates[-1], tuple) else updates[-1]
    assert "image/png" in data
