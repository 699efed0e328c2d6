"""Lessons 10-13: hints that name a slip only where the check reproduced it, checks over
generated cases at the shapes later lessons run, and cells that never fail raw.

For each named slip, a learner's answer that makes it gets its name (the check computes
what the slip returns on the same input); a plausible wrong answer that matches no slip
gets the neutral "where it differs" hint, never another slip's name.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from numba import njit, prange

from check_tools import fails_with
from coursework import lesson10, lesson10_speed
from coursework._cases import differing_digits
from coursework._compiled_stubs import is_stub, uncompile_stubs


# ------------------------------------------------------------------ the shared pieces
def test_differing_digits_show_where_two_numbers_part():
    assert differing_digits(2.773763214, 2.773763221) == ("2.77376321", "2.77376322")
    assert differing_digits(1.5, 1.5) == ("1.5", "1.5")
    assert differing_digits(0.1, 0.1 + 1e-16)[0] != differing_digits(0.1, 0.1 + 1e-16)[1]


@njit(parallel=True)
def _stub_kernel(x, b, out):
    """A student's stub as the notebook holds it."""
    k = 1.0
    # YOUR CODE HERE
    raise NotImplementedError()


def _early_return(x):
    if x:
        return x
    raise NotImplementedError()


def test_a_stub_is_told_from_a_kernel():
    assert is_stub(_stub_kernel)
    assert not is_stub(lesson10_speed.plain_fused_loop)
    assert is_stub(_early_return)       # its top-level raise ends every call that gets there
    assert not is_stub(lambda x: x)


@pytest.fixture()
def shell():
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    yield shell
    shell.set_custom_exc((), None)
    for name in ("_after_each_cell_of_stubs", "_before_each_cell_of_exercises"):
        for event in ("post_run_cell", "pre_run_cell"):
            hook = getattr(shell, name, None)
            if hook in shell.events.callbacks[event]:
                shell.events.unregister(event, hook)
        if hasattr(shell, name):
            delattr(shell, name)


def test_a_cell_after_a_compiled_stub_says_which_exercise_in_one_line(shell, capsys):
    """Without the swap, numba raises the stub's NotImplementedError from compiled code
    (no frame in the notebook): the cell shows an empty NotImplementedError traceback."""
    from coursework import _core
    functions = {"bias_gelu_fused": "10.1 (bias_gelu_fused)"}
    _core.name_unfinished_exercises(functions, shell=shell)
    uncompile_stubs(functions, shell=shell)
    uncompile_stubs(functions, shell=shell)                 # the first cell run twice
    assert shell.events.callbacks["post_run_cell"].count(shell._after_each_cell_of_stubs) == 1
    shell.run_cell("import numpy as np\nfrom numba import njit, prange\n"
                   "@njit(parallel=True)\ndef bias_gelu_fused(x, b, out):\n"
                   "    k = 1.0\n    # YOUR CODE HERE\n    raise NotImplementedError()\n")
    capsys.readouterr()
    assert not shell.run_cell("measured = bias_gelu_fused(np.ones((2, 2)), np.ones(2), "
                              "np.ones((2, 2)))").success
    said = capsys.readouterr().out
    assert "UnfinishedExercise" in said and said.count("\n") == 1, said
    assert "finish exercise 10.1 (bias_gelu_fused) first" in said
    assert not shell.run_cell("print(measured)").success
    assert "an earlier cell makes with your exercise" in capsys.readouterr().out
    # a finished kernel stays compiled
    shell.run_cell("@njit(parallel=True)\ndef bias_gelu_fused(x, b, out):\n"
                   "    for i in prange(x.shape[0]):\n        out[i] = x[i]\n    return out\n")
    assert hasattr(shell.user_ns["bias_gelu_fused"], "py_func")


# ------------------------------------------------------------------ 10.1
@njit(parallel=True)
def bias_gelu_two_chunks(x, b, out):
    """Right values, rows split into two hard-coded chunks: two threads at most."""
    k, a = 0.7978845608028654, 0.044715
    rows, cols = x.shape
    half = (rows + 1) // 2
    for c in prange(2):
        for i in range(c * half, min(rows, (c + 1) * half)):
            for j in range(cols):
                u = x[i, j] + b[j]
                out[i, j] = 0.5 * u * (2.0 - 2.0 / (np.exp(2.0 * k * (u + a * u * u * u))
                                                    + 1.0))
    return out


def test_10_1_a_prange_over_chunks_fixed_in_the_code_is_named():
    fails_with(lesson10.check_bias_gelu, bias_gelu_two_chunks, 1,
               words=("prange runs over 2 pieces of work fixed in the code",
                      "at most 2 threads"))


def test_10_1_the_plain_loop_is_blamed_only_when_it_is_slower_than_numpy_too():
    """Yours 1.4x numpy, the plain loop 0.95x: the gap is the learner's, not the exp's."""
    text = " ".join(lesson10.bias_gelu_speed_verdict(
        {"yours": 0.133, "plain": 0.095, "numpy": 0.1, "trainer": 0.02}, calls_tanh=False))
    assert "SLOWER THAN NUMPY" in text and "and so does" not in text
    assert "scalar exp" not in text and "the gap is your kernel's (1.4x" in text
    slow_plain = " ".join(lesson10.bias_gelu_speed_verdict(
        {"yours": 0.133, "plain": 0.12, "numpy": 0.1, "trainer": 0.02}, calls_tanh=False))
    assert "slower than numpy too (1.2x)" in slow_plain and "scalar exp" in slow_plain


# ------------------------------------------------------------------ 10.2
def xent_slip(**slip):
    """A learner's loss making one of the check's slips, written as a learner would."""
    def xent(logits, targets):
        loss, grad = lesson10._xent_slip(logits.copy(), targets, **slip)
        logits[...] = grad
        return loss
    return xent


@pytest.mark.parametrize("index", range(len(lesson10._XENT_SLIPS)))
def test_10_2_each_slip_reproduced_gets_its_own_name(index):
    slip, hint = lesson10._XENT_SLIPS[index]
    message = fails_with(lesson10.check_softmax_cross_entropy, xent_slip(**slip))
    assert hint in message, message
    for other_slip, other in lesson10._XENT_SLIPS:
        if other != hint:
            assert other not in message


def test_10_2_a_shift_by_the_targets_logit_is_not_told_to_work_in_the_log_domain():
    message = fails_with(lesson10.check_softmax_cross_entropy,
                         xent_slip(shift="target logit"), words=("the target's logit",))
    assert "log domain" not in message and "first logit" not in message


def xent_shift_by_row_min(logits, targets):
    """A plausible slip no hint names: the row's smallest logit as the shift."""
    n = logits.shape[0]
    rows = np.arange(n)
    m = logits.min(axis=1, keepdims=True)
    with np.errstate(all="ignore"):
        e = np.exp(logits - m)
        s = e.sum(axis=1, keepdims=True)
        loss = float(np.mean(np.log(s[:, 0]) + m[:, 0] - logits[rows, targets]))
        logits[...] = e / s / n
    logits[rows, targets] -= 1.0 / n
    return loss


def test_10_2_a_slip_that_matches_none_gets_where_it_differs():
    message = fails_with(lesson10.check_softmax_cross_entropy, xent_shift_by_row_min,
                         words=("your mean loss is", "(in nats)"))
    for _, hint in lesson10._XENT_SLIPS:
        assert hint not in message


@njit
def xent_float32_sum(logits, targets):
    """Right but for the sum of exps, accumulated in float32."""
    n, v = logits.shape
    total = 0.0
    for i in range(n):
        top = logits[i].max()
        s = np.float32(0.0)
        for j in range(v):
            s += np.float32(np.exp(logits[i, j] - top))
        total += np.log(s) + top - logits[i, targets[i]]
        for j in range(v):
            logits[i, j] = np.exp(logits[i, j] - top) / s / n
        logits[i, targets[i]] -= 1.0 / n
    return total / n


def test_10_2_a_float32_accumulator_is_printed_with_the_digits_that_differ():
    message = fails_with(lesson10.check_softmax_cross_entropy, xent_float32_sum,
                         words=("significant digits only",))
    loss, expected = message.split("the loss is ")[1].split("; ")[0].split(", expected ")
    assert loss != expected and math.isclose(float(loss), float(expected), rel_tol=1e-6)


# ------------------------------------------------------------------ no cell fails raw
@pytest.mark.parametrize("stem", ["10_fused_kernels", "11_embeddings",
                                  "12_between_backward_and_step"])
def test_run_all_with_the_stubs_run_fails_only_with_one_line_each(stem, tmp_path, monkeypatch):
    """The untouched student notebook, every cell run in order, its @njit stubs included:
    a check says "not done yet"; any other cell that fails says in one line which exercise
    it needs (numba raised the stubs' NotImplementedError empty, and `measured` was then
    a NameError). Lesson 12 takes its in-process data-parallel path (BACKPROP_NO_MPI), so
    the run is the same with or without the MPI extra."""
    import re

    from notebook_tools import ROOT, build_course, cell_errors
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path / "pieces"))
    monkeypatch.setenv("BACKPROP_NO_MPI", "1")
    source = (ROOT / "course" / "source" / f"{stem}.py").read_text()
    nb = build_course.make_notebook(build_course.parse_cells(source), student=True)
    ran = build_course.execute(nb, cwd=ROOT / "course", allow_errors=True).cells
    failed = 0
    for cell in ran:
        if cell.cell_type != "code" or not cell_errors(cell):
            continue
        failed += 1
        error = cell_errors(cell)[0]
        if cell.source.startswith("# CHECK "):
            assert re.match(r"Exercise \d\d\.\d \(.*?\): not done yet\.", error["evalue"]), \
                error["evalue"]
        else:
            assert error["ename"] == "UnfinishedExercise" and len(error["traceback"]) == 1, (
                f"{cell.source[:200]}\n{error['ename']}: {error['evalue']}")
        stderr = "".join(o.get("text", "") for o in cell.outputs
                         if o.output_type == "stream" and o.get("name") == "stderr")
        assert "NumbaPerformanceWarning" not in stderr, cell.source[:200]
    assert failed >= 3


# ------------------------------------------------------------------ 11.1
from coursework import lesson11  # noqa: E402


@njit(parallel=True)
def scatter_blocks_walk_every_column(ids, g, vocab_size):
    """Blocks of 16 columns, but each block's inner loop walks all C columns: right while
    C <= 16, 8 times the sum (and racing) at lesson 13's C = 128."""
    n, c = g.shape
    d = np.zeros((vocab_size, c), g.dtype)
    for blk in prange((c + 15) // 16):
        for t in range(n):
            for j in range(c):
                d[ids[t], j] += g[t, j]
    return d


@njit(parallel=True)
def scatter_floor_blocks(ids, g, vocab_size):
    """c // block blocks: the last partial block (all of C = 4) is never written."""
    n, c = g.shape
    d = np.zeros((vocab_size, c), g.dtype)
    block = 8
    for blk in prange(c // block):
        for t in range(n):
            for j in range(blk * block, (blk + 1) * block):
                d[ids[t], j] += g[t, j]
    return d


@njit(parallel=True)
def scatter_add_at_in_prange(ids, g, vocab_size):
    d = np.zeros((vocab_size, g.shape[1]), g.dtype)
    for j in prange(g.shape[1]):
        np.add.at(d[:, j], ids, g[:, j])
    return d


def scatter_previous_token(ids, g, vocab_size):
    """A plausible slip no hint names: each token adds its neighbour's gradient."""
    d = np.zeros((vocab_size, g.shape[1]), g.dtype)
    for t in range(len(ids)):
        d[ids[t]] += g[t - 1]
    return d


def test_11_1_a_block_that_walks_every_column_is_refused_at_the_trainers_width():
    # This kernel also races (its blocks write the same columns); the check runs it on one
    # thread, where it cannot, and names the walk whatever the threads did.
    for _ in range(3):
        message = fails_with(lesson11.check_embedding_backward,
                             scatter_blocks_walk_every_column, 2,
                             words=("every entry is 2 times its sum, at C = 17",
                                    "column blocks added every column"))
        assert "differ from run to run" not in message, message


def _loses_on_several_threads(table, ids, g, rng):
    """`table` with some additions lost, as a race does, when numba runs on several threads."""
    import numba
    if numba.get_num_threads() > 1:
        for t in rng.choice(len(ids), size=min(5, len(ids)), replace=False):
            table[ids[t]] -= g[t]
    return table


def simulated_walk_that_races(ids, g, vocab_size, rng=np.random.default_rng(5)):
    """What scatter_blocks_walk_every_column does when its race strikes on every run: each
    block of 16 columns adds every column, and where there are several blocks and several
    threads some additions vanish."""
    blocks = (g.shape[1] + 15) // 16
    table = blocks * lesson11.scatter_add_reference(ids, g, vocab_size)
    return table if blocks == 1 else _loses_on_several_threads(table, ids, g, rng)


def simulated_race(ids, g, vocab_size, rng=np.random.default_rng(6)):
    """A token split whose race strikes on every run with several threads, never on one."""
    return _loses_on_several_threads(lesson11.scatter_add_reference(ids, g, vocab_size),
                                     ids, g, rng)


def test_11_1_the_walk_is_named_even_when_the_race_strikes_every_time():
    import numba
    if numba.get_num_threads() < 2:
        pytest.skip("needs numba on several threads")
    fails_with(lesson11.check_embedding_backward, simulated_walk_that_races, 2,
               words=("every entry is 2 times its sum, at C = 17", "walks all C columns"))


def test_11_1_a_race_that_is_no_walk_is_still_named_a_race():
    import numba
    if numba.get_num_threads() < 2:
        pytest.skip("needs numba on several threads")
    message = fails_with(lesson11.check_embedding_backward, simulated_race, 2,
                         words=("differ from run to run", "updates were lost"))
    assert "column" not in message.split("updates were lost")[0], message
    assert numba.get_num_threads() > 1          # the check put the thread count back


def test_11_1_floor_division_of_the_width_is_not_called_a_race():
    message = fails_with(lesson11.check_embedding_backward, scatter_floor_blocks, 2,
                         words=("no column of the table got anything", "partial block"))
    assert "race" not in message and "threads" not in message


def test_11_1_np_add_at_inside_prange_is_one_named_line():
    message = fails_with(lesson11.check_embedding_backward, scatter_add_at_in_prange, 2,
                         words=("numba could not compile your kernel", "np.add.at"))
    assert "\n" not in message and "During:" not in message


def test_11_1_a_slip_that_matches_none_gets_where_it_differs():
    message = fails_with(lesson11.check_embedding_backward, scatter_previous_token, 2,
                         words=("entry (row", "the sum of its"))
    for named in ("race", "dropped", "never arrived", "column blocks"):
        assert named not in message, message


@pytest.mark.parametrize("C, first", [(33, 32), (130, 128)])
def test_11_1_columns_left_over_by_the_blocks_are_reproduced(C, first):
    want = np.arange(3.0 * C).reshape(3, C) + 1
    short = want.copy()
    short[:, first:] = 0
    assert f"columns {first} to {C - 1} of the table got nothing" in \
        lesson11._column_slip_hint(short, want)
    assert "every entry is 8 times" in lesson11._column_slip_hint(8 * want, want)
    assert lesson11._column_slip_hint(want + 1, want) is None


# ------------------------------------------------------------------ 11.2, 11.3
def test_11_2_a_hard_coded_float32_is_named_as_such():
    message = fails_with(lesson11.check_gradient_bytes,
                         lambda ids, V, w, vb=4, ib=8: (V * w * 4, np.unique(ids).size * (w * 4 + 8)),
                         words=("4 bytes per value whatever value_bytes says",))
    assert "whatever the batch holds" not in message


def test_11_2_a_count_no_slip_gives_gets_how_far_it_is():
    message = fails_with(lesson11.check_gradient_bytes,
                         lambda ids, V, w, vb, ib: (V * w * vb + 64, np.unique(ids).size * (w * vb + ib)),
                         words=("none of the usual slips gives it here", "distinct ids"))
    assert "the table's shape whatever" not in message


@pytest.mark.parametrize("fn", [
    lambda seen, n, lr, wd: (1 - lr * wd * n, 1 - lr * wd * len(seen)),
    lambda seen, n, lr, wd: (math.exp(-lr * wd * n), math.exp(-lr * wd * len(seen))),
    lambda seen, n, lr, wd: ((1 - wd) ** n, (1 - wd) ** len(seen)),
])
def test_11_3_named_slips_do_not_hand_over_the_factor(fn):
    message = fails_with(lesson11.check_decay_factors, fn)
    assert "**" not in message and "(1 - lr * weight_decay)" not in message, message


# ------------------------------------------------------------------ 12.3
from coursework import lesson12  # noqa: E402


def norms_with_yardstick(yardstick, frozen=lambda v: max(v) == 0 == min(v), squared=False):
    """A learner's summarize_norms whose spike test compares step t with
    spike_factor * yardstick(earlier global norms) (of squares when `squared`)."""
    def summarize_norms(group_norms, spike_factor=10.0):
        total = np.sqrt(sum(np.asarray(v, dtype=np.float64) ** 2
                            for v in group_norms.values()))
        values = total ** 2 if squared else total
        spikes, flagged = [], []
        for t in range(1, len(total)):
            if values[t] > spike_factor * yardstick(values[:t], flagged):
                spikes.append(t)
                flagged.append(t)
        return total, spikes, [k for k, v in group_norms.items() if frozen(v)]
    return summarize_norms


def _median_low(earlier, flagged):
    import statistics
    return statistics.median_low(earlier.tolist())


def _median_high(earlier, flagged):
    import statistics
    return statistics.median_high(earlier.tolist())


def _median_without_spikes(earlier, flagged):
    return np.median([v for t, v in enumerate(earlier) if t not in flagged])


@pytest.mark.parametrize("fn, named, not_named", [
    (norms_with_yardstick(_median_low), "(median_low)", "leaves out step 0"),
    (norms_with_yardstick(_median_high), "upper of the two middle values", "rolling window"),
    (norms_with_yardstick(lambda e, f: np.median(e), squared=True), "compares squared norms",
     "not >="),
    (norms_with_yardstick(_median_without_spikes), "leaves the earlier spikes out",
     "rolling window"),
])
def test_12_3_each_slip_is_named_where_it_is_reproduced_and_not_as_another(fn, named,
                                                                          not_named):
    message = fails_with(lesson12.check_summarize_norms, fn, words=(named,))
    assert not_named not in message


def test_12_3_a_tolerance_far_below_the_tiny_groups_is_still_refused():
    """max(v) < 1e-12 passes the example's tiny group (1e-12 and falling, yet not below
    1e-12 at step 0); groups of 1e-20 to 1e-35 are never zero either."""
    fails_with(lesson12.check_summarize_norms,
               norms_with_yardstick(lambda e, f: np.median(e), frozen=lambda v: max(v) < 1e-12),
               words=("tiny norms", "not zero ones"))


def test_12_3_a_yardstick_no_slip_gives_gets_where_it_differs():
    fn = norms_with_yardstick(lambda e, f: np.percentile(e, 40))
    message = fails_with(lesson12.check_summarize_norms, fn,
                         words=("times the median of", "spike_factor"))
    assert "your median" not in message and "rolling window" not in message
    assert "mean" not in message, message


def test_12_3_the_generated_logs_are_the_same_on_every_run():
    from coursework.lesson12_norms import generated_norm_logs
    assert generated_norm_logs() == generated_norm_logs()
    assert {"cut", "tiny", "blinking"} <= {k for _, log in generated_norm_logs() for k in log}


# ------------------------------------------------------------------ 12.4
def schedule_whole_ms(backward_ms, bucket_bytes, link):
    """Right, but each send's length in whole ms: size // link."""
    out, ready, free = [], 0.0, 0.0
    for ms, size in zip(backward_ms, bucket_bytes):
        ready += ms
        start = max(ready, free)
        free = start + size // link
        out.append((start, free))
    return out


def schedule_send_at_half(backward_ms, bucket_bytes, link):
    """A slip no hint names: a bucket goes when half of its backward is done."""
    out, ready, free = [], 0.0, 0.0
    for ms, size in zip(backward_ms, bucket_bytes):
        start = max(ready + ms / 2, free)
        ready += ms
        free = start + size / link
        out.append((start, free))
    return out


def test_12_4_floor_division_of_the_size_is_refused_and_named():
    message = fails_with(lesson12.check_bucket_schedule, schedule_whole_ms,
                         words=("rounded down", "floor division"))
    assert "1500, 2750, 333" in message or "generated" not in message


def test_12_4_a_schedule_no_slip_gives_gets_where_it_differs():
    message = fails_with(lesson12.check_bucket_schedule, schedule_send_at_half,
                         words=("bucket 0 is sent",))
    for _, text in lesson12._schedule_variants([1.0], [100], 10.0):
        assert text not in message


def test_12_4_generated_cases_hold_sizes_that_are_no_multiple_of_the_rate():
    cases = lesson12.generated_bucket_cases()
    assert cases == lesson12.generated_bucket_cases()
    assert any(size % link for _, sizes, link in cases for size in sizes)


# ------------------------------------------------------------------ 13.1
from coursework import lesson13  # noqa: E402


def step_nested_phases(model, optimizer, clip, x, y, lr, max_norm, phase):
    """Right weights, the same order list, but backward and optimizer inside the loss."""
    model.zero_grad()
    with phase("loss"):
        loss = model.forward(x, y)
        with phase("backward"):
            model.backward()
        with phase("optimizer"):
            norm = clip(model.named_grads(), max_norm)
            optimizer.step(lr)
    return loss, norm


def step_double_backward(model, optimizer, clip, x, y, lr, max_norm, phase):
    model.zero_grad()
    with phase("loss"):
        loss = model.forward(x, y)
    with phase("backward"):
        model.backward()
        model.backward()
    with phase("optimizer"):
        norm = clip(model.named_grads(), max_norm)
        optimizer.step(lr)
    return loss, norm


def test_13_1_phases_nested_in_the_loss_phase_are_refused():
    message = fails_with(lesson13.check_train_step, step_nested_phases,
                         words=('`phase("backward")` was opened inside `phase("loss")`',
                                "may not overlap"))
    assert "model.backward()" not in message


def test_13_1_a_double_backward_is_not_told_to_call_forward_first():
    message = fails_with(lesson13.check_train_step, step_double_backward,
                         words=("the backward ran 2 times after one forward",))
    assert "comes before the backward phase" not in message


def test_the_phase_log_records_what_was_open():
    log = lesson13.PhaseLog()
    with log("loss"):
        assert log.current == "loss"
        with log("backward"):
            assert log.current == "backward"
        assert log.current == "loss"
    assert log.current is None and log.nested == [("backward", "loss")]
    assert log.order == ["loss", "backward"] and set(log.seconds) == {"loss", "backward"}


# ------------------------------------------------- each slip's reproduction, held to its name
@pytest.mark.parametrize("which, index", [("dense", k) for k in range(6)] +
                         [("sparse", k) for k in range(9)])
def test_11_2_each_count_slip_reproduced_gets_its_own_name(which, index):
    def gradient_bytes(ids, V, w, vb, ib):
        right = lesson11.gradient_bytes_reference(ids, V, w, vb, ib)
        slip = lesson11._bytes_slips(ids, V, w, vb, ib, which)[index][0]
        return (slip, right[1]) if which == "dense" else (right[0], slip)
    ids = np.arange(3)
    hint = lesson11._bytes_slips(ids, 9, 4, 4, 8, which)[index][1]
    message = fails_with(lesson11.check_gradient_bytes, gradient_bytes)
    named = " ".join(hint.split()[:5])
    assert named in message, message


@pytest.mark.parametrize("index", range(6))
def test_12_4_each_schedule_slip_reproduced_gets_its_own_name(index):
    def bucket_schedule(backward_ms, bucket_bytes, link):
        return lesson12._schedule_variants(backward_ms, bucket_bytes, link)[index][0]
    hint = lesson12._schedule_variants([1.0], [100], 10.0)[index][1]
    message = fails_with(lesson12.check_bucket_schedule, bucket_schedule)
    assert hint in message, message
