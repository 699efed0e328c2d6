"""Checks for lesson 08, "Accumulation and checkpointing".

08.1 the accumulation loop (zero once, backward loss/K per micro-batch);
08.2 the backward of a checkpointed segment (recompute with recording on,
     backpropagate the incoming gradient, return the input's gradient);
08.3 the activation peak of a checkpointed stack, exactly as the tape
     measures it.
Each check compares with the engine in float64 and recognises the typical
wrong answers (a missing /K, stale gradients, a recompute under no_grad, a
backward seeded with ones, the approximate peak formula) by their numbers.
08.2 and 08.3 compare over generated cases beside the story's (08.2: seeded
segments of one op or several, with and without parameters) and name a slip
only when running it on the same input gives the learner's numbers.
08.1 also runs the loop through the fused model's view (on the tape GPT, so
nothing is compiled): a loop that reads more of a loss than the view offers
(a Tensor sum of the losses, loss.data) is refused here, not in lesson 13.
"""
from __future__ import annotations

import numpy as np

from engine import F, Tensor, enable_grad, memory, nn, no_grad
from engine.tensor import is_grad_enabled
from engine.accumulation import accumulate_gradients, split_batch
from engine.recompute import checkpoint_sequential
from engine.gpt_config import GPTConfig, init_params
from ._cases import (Case, Slip, array_difference, compare_over_cases, number_difference,
                     raise_first_difference)
from ._core import ExerciseError, attempt, passed
from .pieces import save_piece
from .slots import (SlotError, check_accumulate_through_view, checkpointed_gpt_mismatch,
                    exact_checkpoint_peak)

EX_ACCUMULATE = "08.1 (accumulate)"
EX_REPLAY = "08.2 (checkpointed_backward)"
EX_PEAK = "08.3 (checkpoint_peak)"


def _tiny_gpt(n_layer=1, seed=0):
    cfg = GPTConfig(vocab_size=11, block_size=5, n_layer=n_layer, n_head=2, n_embd=8)
    return cfg, init_params(cfg, seed=seed, dtype=np.float64)


#: How close a gradient must be to the reference's (float64, summed in another order).
_RTOL, _ATOL = 1e-9, 1e-14


def _close(a, b, rtol=_RTOL) -> bool:
    return a is not None and np.shape(a) == np.shape(b) and np.allclose(a, b, rtol=rtol,
                                                                        atol=_ATOL)


# ------------------------------------------------------------------ 08.1
#: What an earlier step left in every .grad before the learner's loop runs.
_STALE = 0.5


#: (K micro-batches, seed of the batch): the story's batch of 6 in 3, then other splits.
ACCUMULATE_CASES = ((3, 1), (2, 4), (6, 5))


def _accumulate_case(K: int = 3, seed: int = 1):
    """A batch of 6 split into K micro-batches, and what a right loop gives: the full
    batch's mean loss and gradients, the last micro-batch's gradients alone, and the
    activation peak of one micro-batch's forward + backward."""
    cfg, params = _tiny_gpt()
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, cfg.vocab_size, (6, cfg.block_size))
    targets = rng.integers(0, cfg.vocab_size, (6, cfg.block_size))
    reference = nn.GPT(cfg, params)
    want_loss = accumulate_gradients(reference.parameters(), lambda b: reference(*b),
                                     [(ids, targets)])
    want = reference.grads()
    last = nn.GPT(cfg, params)
    micro = split_batch(ids, targets, K)
    last(*micro[-1]).backward()
    one = nn.GPT(cfg, params)
    with memory.record() as one_mem:
        (one(*micro[0]) / K).backward()
    return cfg, params, micro, K, want_loss, want, last.grads(), one_mem.peak_bytes


def _where_gradients_differ(got, want) -> str:
    """The parameter whose gradient is furthest from the full batch's, with no cause."""
    def gap(name):
        return float(np.max(np.abs(np.asarray(got[name]) - want[name]) /
                            (np.abs(want[name]).max() + 1e-300)))
    name = max(want, key=gap)
    g, w = np.asarray(got[name]), want[name]
    k = np.unravel_index(int(np.argmax(np.abs(g - w))), w.shape)
    at = tuple(int(i) for i in k)
    return (f"the gradient of {name} is furthest off: at {at} yours is {g[k]:.6g}, the full "
            f"batch's {w[k]:.6g}")


def _check_accumulated_gradients(got, want, last_only, K) -> None:
    """Every gradient is the full batch's; if not, name the wrong loop only when its numbers
    are exactly what that loop gives."""
    missing = [k for k, g in got.items() if g is None]
    if missing:
        raise ExerciseError(EX_ACCUMULATE, f"after your loop {missing[0]} has no gradient "
                            f"(.grad is None): no backward reached it.")
    shapes = [k for k in want if np.shape(got[k]) != np.shape(want[k])]
    if shapes:
        raise ExerciseError(EX_ACCUMULATE, f"after your loop the gradient of {shapes[0]} has "
                            f"shape {np.shape(got[shapes[0]])}, the parameter "
                            f"{np.shape(want[shapes[0]])}.")

    def all_close(scale=1.0, shift=0.0, ref=want):
        return all(_close(got[k], scale * ref[k] + shift) for k in want)

    if all_close():
        return
    split = f"with the batch of 6 in K={K} micro-batches"
    if all_close(K):
        raise ExerciseError(EX_ACCUMULATE, f"{split}, every gradient is exactly {K} times the "
                            f"full-batch gradient, the missing /K: .grad adds the {K} "
                            f"micro-batch gradients, and nothing turned their sum into a "
                            f"mean.")
    if all_close(1.0, _STALE) or all_close(K, _STALE):
        raise ExerciseError(EX_ACCUMULATE, f"{split}, the gradients still contain the "
                            f"{_STALE} that was in every .grad before your loop (stale "
                            f"gradients): nothing cleared them before the first "
                            f"micro-batch.")
    if all_close(1.0 / K):
        raise ExerciseError(EX_ACCUMULATE, f"{split}, every gradient is 1/{K} of the "
                            f"full-batch gradient: you divided by K twice (each micro-batch "
                            f"loss is already a mean over its own examples).")
    if all_close(1.0 / K, ref=last_only) or all_close(1.0, ref=last_only):
        raise ExerciseError(EX_ACCUMULATE, f"{split}, the gradients are those of the last "
                            f"micro-batch only: zeroing inside the loop throws away the "
                            f"earlier ones.")
    raise ExerciseError(EX_ACCUMULATE, f"{split}, the gradients differ from the full-batch "
                        f"gradient: {_where_gradients_differ(got, want)}.")


def _check_accumulation_peak(peak: int, one_peak: int, K: int) -> None:
    """The loop frees each micro-batch's graph before the next forward."""
    if peak > 1.5 * one_peak:
        raise ExerciseError(EX_ACCUMULATE, f"the gradients are right, but the activation peak "
                            f"of your loop is {peak:,} bytes, {peak / one_peak:.1f} times the "
                            f"{one_peak:,} bytes of one micro-batch: the graphs of "
                            f"all {K} micro-batches were alive at once (a sum of the losses "
                            f"with one backward at the end, or losses kept in a list). That "
                            f"saves no memory over the full batch: each micro-batch's graph "
                            f"has to be gone before the next forward starts.")


def _check_mean_loss(loss, want_loss: float, K: int) -> None:
    """The loop returns the mean of the micro-batch losses, as a number."""
    try:
        loss = float(loss)
    except (TypeError, ValueError):
        raise ExerciseError(EX_ACCUMULATE, f"return the mean loss as a number, got "
                            f"{type(loss).__name__}.") from None
    if np.isclose(loss, K * want_loss, rtol=1e-9):
        raise ExerciseError(EX_ACCUMULATE, f"the gradients are right, but you returned the sum "
                            f"of the {K} micro-batch losses; return their mean.")
    if not np.isclose(loss, want_loss, rtol=1e-9):
        raise ExerciseError(EX_ACCUMULATE, f"the gradients are right, but with K={K} the "
                            f"returned loss {loss:.6g} is not the mean loss {want_loss:.6g}.")


def _check_through_fused_view(accumulate) -> None:
    """Lesson 13 runs the loop on the fused model, through a thin view of it."""
    try:
        check_accumulate_through_view(accumulate)
    except SlotError as err:
        if "attribute 'parameters'" in str(err) or "attribute 'grad'" in str(err):
            hint = ("the fused model keeps its gradients in one flat buffer, with no "
                    "parameters() and no .grad to divide after the loop: divide each loss by "
                    "K before its backward instead")
        else:
            hint = "add up loss.item() (a float), not the loss Tensors or their .data"
        raise ExerciseError(EX_ACCUMULATE, f"your loop is right on the tape's GPT, but lesson "
                            f"13 runs it on the fused model, through a view that offers only "
                            f"what the exercise's contract lists, and there it fails: {err}. "
                            f"Hint: {hint}.") from None


def check_accumulate(accumulate) -> None:
    """accumulate(model, micro_batches) must leave in every p.grad the gradient
    of the mean loss over all micro-batches, and return that mean loss."""
    for K, seed in ACCUMULATE_CASES:
        cfg, params, micro, K, want_loss, want, last_only, one_peak = _accumulate_case(K, seed)
        model = nn.GPT(cfg, params)
        for p in model.parameters().values():
            p.grad = np.full(p.shape, _STALE)
        with memory.record() as mem:
            loss = attempt(EX_ACCUMULATE, accumulate, model, micro)
        _check_accumulated_gradients(model.grads(), want, last_only, K)
        _check_accumulation_peak(mem.peak_bytes, one_peak, K)
        _check_mean_loss(loss, want_loss, K)
    _check_through_fused_view(accumulate)
    save_piece("accumulate", accumulate, EX_ACCUMULATE)
    passed(EX_ACCUMULATE, "K=3 micro-batches of 2 give the gradient of the batch of 6 (and "
                          "K=2 and K=6 too).")


# ------------------------------------------------------------------ 08.2
#: The segments 08.2 replays: how a message writes each, its parameters' shapes from
#: (the input's width d, a hidden width h), and the segment as a function of them and x.
_SEGMENT_FORMS = {
    "tanh(gelu(x @ w) @ v) + x": (
        {"w": lambda d, h: (d, h), "v": lambda d, h: (h, d)},
        lambda p, x: F.tanh(F.gelu(x @ p["w"]) @ p["v"]) + x),
    "x @ w": ({"w": lambda d, h: (d, h)}, lambda p, x: x @ p["w"]),
    "gelu(x) * x": ({}, lambda p, x: F.gelu(x) * x),
    "tanh(x @ w + b)": (
        {"w": lambda d, h: (d, h), "b": lambda d, h: (h,)},
        lambda p, x: F.tanh(x @ p["w"] + p["b"])),
    "x + relu(layer_norm(x, a, c) @ w) @ v": (
        {"a": lambda d, h: (d,), "c": lambda d, h: (d,), "w": lambda d, h: (d, h),
         "v": lambda d, h: (h, d)},
        lambda p, x: x + F.relu(F.layer_norm(x, p["a"], p["c"]) @ p["w"]) @ p["v"]),
}


def _segment_cases() -> list[Case]:
    """The story's segment (3 rows of width 4, hidden width 5), then one generated segment
    of each form at seeded random sizes: one op or several, with parameters that get
    gradients (matrices, a bias, a layer norm's weights) and with none."""
    story = Case(("tanh(gelu(x @ w) @ v) + x", 2, 3, 4, 5),
                 "on the story's segment fn(x) = tanh(gelu(x @ w) @ v) + x, x of shape (3, 4)")
    rng = np.random.default_rng(82)
    generated = []
    for i, form in enumerate(("x @ w", "gelu(x) * x", "tanh(x @ w + b)",
                              "x + relu(layer_norm(x, a, c) @ w) @ v",
                              "tanh(gelu(x @ w) @ v) + x"), start=1):
        n, d, h = (int(v) for v in rng.integers(2, 7, 3))
        generated.append(Case((form, 820 + i, n, d, h), f"on generated segment {i}, fn(x) = "
                                                        f"{form}, x of shape ({n}, {d})"))
    return [story] + generated


def _segment(form: str, seed: int, n: int, d: int, h: int):
    """A fresh segment of `form` (its parameters with no gradient yet), the saved input and
    the gradient reaching its output, all drawn from `seed`."""
    shapes, apply_form = _SEGMENT_FORMS[form]
    rng = np.random.default_rng(seed)
    params = {name: Tensor(rng.normal(size=shape(d, h)) / 2, requires_grad=True, name=name)
              for name, shape in shapes.items()}

    def segment(x):
        return apply_form(params, x)

    saved = rng.normal(size=(n, d))
    with no_grad():
        out_shape = segment(Tensor(saved)).shape
    return segment, params, saved, rng.normal(size=out_shape)


def _replayed(replay, form, seed, n, d, h):
    """What `replay` gives on the segment, called as the backward pass calls it (under
    no_grad): the input gradient it returns and each parameter's gradient afterwards."""
    segment, params, saved, g = _segment(form, seed, n, d, h)
    with no_grad():
        got = replay(segment, saved, g)
    return _replay_answer(got, params)


def _replay_answer(got, params):
    got = got.data if isinstance(got, Tensor) else got
    return (None if got is None else np.asarray(got),
            tuple((name, None if p.grad is None else p.grad.copy())
                  for name, p in params.items()))


def _segment_gradients(form, seed, n, d, h):
    """The reference: one plain backward through the segment, recording on."""
    segment, params, saved, g = _segment(form, seed, n, d, h)
    x = Tensor(saved, requires_grad=True)
    segment(x).backward(g)
    return _replay_answer(x.grad, params)


def _same_gradients(got, want) -> bool:
    (gx, gp), (wx, wp) = got, want
    return (_close(gx, wx) and
            all((g is None and w is None) or (g is not None and w is not None and _close(g, w))
                for (_, g), (_, w) in zip(gp, wp)))


def _gradient_difference(got, want) -> str:
    """Where a gradient differs from the plain backward's, its values to the digits that
    tell them apart, an entry counted as differing by `_close`'s tolerance."""
    return array_difference(got, want, theirs="the plain backward has", digits=4, rtol=_RTOL,
                            atol=_ATOL)


def _where_replay_differs(got, want, case: Case) -> str:
    """The first gradient that differs from the segment's (the input's, then each
    parameter's), and where, with no cause."""
    (gx, gp), (wx, wp) = got, want
    if not _close(gx, wx):
        if gx.shape != wx.shape:
            return (f"you returned an array of shape {gx.shape}; the input's gradient has the "
                    f"input's shape {wx.shape}")
        return f"the input gradient is off: {_gradient_difference(gx, wx)}"
    for (name, g), (_, w) in zip(gp, wp):
        if g is None:
            return (f"the parameter {name} got no gradient (its .grad is None), though fn "
                    f"uses it: the backward through the recomputed segment is what fills it")
        if not _close(g, w):
            return f"the gradient of the parameter {name} is off: {_gradient_difference(g, w)}"
    return "the gradients differ"


def _unrecorded_hint(recording: list, returned: list) -> str:
    """Why backward found nothing to walk, from whether recording was on while the
    segment ran and whether its outputs require grad."""
    if recording and all(recording) and all(o.requires_grad for o in returned):
        return ("You ran fn with recording on (good), and its output requires grad, "
                "but what you called backward on does not: it was made from fn's "
                "output after the `with engine.enable_grad():` block, where recording "
                "is off again (a .sum(), a product), or cut from it (.detach(), a new "
                "Tensor of its .data). The backward has to start at fn's own output, "
                "carrying the gradient that reached the segment.")
    if recording and all(recording):
        return ("You ran fn with recording on (good), yet its output does not require "
                "grad, so nothing of the recompute was tracked: was the output detached, "
                "or its .data wrapped in a new Tensor? Or is the input one the tape does "
                "not track?")
    return ("fn ran with recording switched off: the backward pass that calls your "
            "function runs under no_grad, so the recompute recorded nothing. Recording "
            "must be on while fn runs again (engine.enable_grad() is the switch).")


def _learner_replay(checkpointed_backward, case: Case):
    """Run the learner's replay on the case's segment as the backward pass does (under
    no_grad), watching the segment it recomputes. Errors the run itself shows (a backward
    with nothing recorded, the saved input edited, nothing returned) end the check here;
    otherwise returns the gradients, as `_replayed` does."""
    segment, params, saved, g = _segment(*case.args)
    recording = []   # was recording on while the learner's code ran the segment?
    returned = []    # what the segment gave back, to tell a cut graph from an unrecorded op

    def watched_segment(x):
        recording.append(is_grad_enabled())
        returned.append(segment(x))
        return returned[-1]

    probe = saved.copy()
    try:
        with no_grad():  # backward does not have to record; your recompute must
            got = attempt(EX_REPLAY, checkpointed_backward, watched_segment, probe, g)
    except RuntimeError as err:
        if "does not require grad" in str(err):
            raise ExerciseError(EX_REPLAY, f"{case.label}: the recomputed output does not "
                                f"require grad, so backward has nothing to walk. "
                                + _unrecorded_hint(recording, returned)) from None
        raise
    if not np.array_equal(probe, saved):
        raise ExerciseError(EX_REPLAY, "saved_input was changed by your function; the tape "
                            "still owns it. Wrap it in a new Tensor instead of editing it.")
    if got is None:
        raise ExerciseError(EX_REPLAY, "you returned None: return the input's gradient, an "
                            "array. If None is an input Tensor's .grad, the backward never "
                            "filled it: the backward fills .grad only on Tensors it tracks.")
    return _replay_answer(got, params)


# The usual wrong replays, each run on the same segment as the learner's to reproduce it.
def _replay_seeded_with_ones(fn, saved_input, grad_output):
    x = Tensor(saved_input, requires_grad=True)
    with enable_grad():
        fn(x).sum().backward()
    return x.grad


def _replay_handing_back(fn, saved_input, grad_output):
    return grad_output


def _replay_twice(fn, saved_input, grad_output, zero_input_between=True):
    x = Tensor(saved_input, requires_grad=True)
    with enable_grad():
        fn(x).backward(grad_output)
        if zero_input_between:
            x.zero_grad()
        fn(x).backward(grad_output)
    return x.grad


def _replay_slips() -> list[Slip]:
    """The usual wrong replays, each reproduced by running it on the case's segment."""
    def reproduce(replay):
        return lambda *args: _replayed(replay, *args)

    twice = ("every parameter's gradient is exactly twice the segment's, as a second "
             "recompute with its own backward gives: run the recompute and its backward once.")
    return [
        Slip(reproduce(_replay_seeded_with_ones),
             "you backpropagated a gradient of ones (as .sum() or backward() with no "
             "argument does), a fresh gradient, not the one that reached the segment."),
        Slip(reproduce(_replay_handing_back),
             "you returned grad_output itself: the segment's input gradient needs the "
             "recompute and a backward through it."),
        Slip(reproduce(_replay_twice), twice),
        Slip(reproduce(lambda *a: _replay_twice(*a, zero_input_between=False)), twice),
    ]


def check_checkpointed_backward(checkpointed_backward) -> None:
    """checkpointed_backward(fn, saved_input, grad_output) -> dL/d(input), with the
    segment's parameters' gradients accumulated as a side effect: equal to one plain
    backward through the segment, on the story's segment and generated ones."""
    cases = _segment_cases()
    answers = [_learner_replay(checkpointed_backward, case) for case in cases]
    raise_first_difference(
        EX_REPLAY, cases, answers, [_segment_gradients(*case.args) for case in cases],
        slips=_replay_slips(), same=_same_gradients, difference=_where_replay_differs,
        neutral_hint="It is none of the usual slips (a gradient of ones, grad_output handed "
                     "back, a second backward). Check which Tensor's gradient you return and "
                     "which gradient you sent into the backward.")
    # and in the engine: a checkpointed GPT that uses your replay
    name = checkpointed_gpt_mismatch(checkpointed_backward)
    if name is not None:
        raise ExerciseError(EX_REPLAY, f"your function passes on {len(cases)} segments, but "
                            f"in a checkpointed GPT the gradient of {name} differs from the "
                            f"plain one. Does it depend on anything but its arguments?")
    save_piece("checkpoint_replay", checkpointed_backward, EX_REPLAY)
    passed(EX_REPLAY, f"{len(cases)} segments (the lesson's and {len(cases) - 1} generated) "
                      f"have the plain backward's gradients, and a 2-block GPT checkpointed "
                      f"with your replay has the plain gradients.")


# ------------------------------------------------------------------ 08.3
def _measured_stack_peak(n_blocks: int, k: int):
    """Measure a stack of GPT blocks (input needs no gradient, loss = sum)."""
    cfg = GPTConfig(vocab_size=4, block_size=6, n_layer=n_blocks, n_head=2, n_embd=8)
    params = {name: Tensor(v, requires_grad=True, name=name)
              for name, v in init_params(cfg, seed=5, dtype=np.float32).items()}
    blocks = [nn.Block(cfg, params, i) for i in range(n_blocks)]
    x0 = np.random.default_rng(6).normal(size=(2, 6, 8)).astype(np.float32)
    with memory.record() as mem:
        checkpoint_sequential(blocks, Tensor(x0), k).sum().backward()
    return mem.peak_bytes, x0.nbytes, nn.block_saved_bytes(2, 6, 8, 2, np.float32)


def _segment_sizes(L: int, k: int, n_segments: int | None = None) -> list[int]:
    """Blocks in each segment, forward order; `n_segments` forces a (wrong) count of them."""
    n = -(-L // k) if n_segments is None else n_segments
    return [max(0, min(k, L - j * k)) for j in range(n)]


def _segment_walk(L: int, k: int, a: int, b: int, own_boundary: bool = True,
                  n_segments: int | None = None) -> int:
    """The peak segment by segment; own_boundary=False is the slip that leaves out the
    boundary starting the segment being recomputed, `n_segments` a wrong count of segments."""
    sizes = _segment_sizes(L, k, n_segments)
    return max((j + own_boundary) * a + blocks * b for j, blocks in enumerate(sizes))


def _ceil(L, k):
    return -(-L // k)


def _peak_cases() -> list[Case]:
    """The story's cases, then every (L, k) up to 8 with a boundary much larger than a
    block's insides, much smaller, and a seeded random pair of sizes."""
    story = [(8, 1, 100, 1000), (8, 2, 100, 1000), (8, 4, 100, 1000), (8, 8, 100, 1000),
             (16, 4, 500, 500), (10, 3, 100, 1000), (10, 4, 64, 640), (7, 5, 10, 1000),
             (5, 2, 1000, 10), (4, 2, 1000, 10), (9, 9, 3, 7)]
    rng = np.random.default_rng(83)
    grid = [(L, k, a, b) for L in range(1, 9) for k in range(1, 9)
            for a, b in ((1000, 10), (10, 1000), tuple(int(v) for v in rng.integers(1, 5000, 2)))]
    return [Case(args, f"checkpoint_peak({', '.join(map(str, args))})") for args in story + grid]


def _peak_slips() -> list[Slip]:
    """The usual wrong peaks, each reproduced from the same arguments."""
    def estimate_hint(case, got, want):
        L, k, a, b = case.args
        sizes = _segment_sizes(L, k)
        return (f"that is the usual estimate ceil(L/k)*a + k*b, exact only when k divides L. "
                f"Here the segments hold {sizes} blocks: while "
                f"the backward recomputes a segment, only the boundaries up to and including "
                f"that segment's own input are still kept, not all {len(sizes)} of them. Find "
                f"the moment of the backward at which the most bytes are alive.")

    def extra_segment_hint(case, got, want):
        L, k, a, b = case.args
        return (f"you count L // k + 1 = {L // k + 1} segments; {L} blocks in segments of "
                f"{k} make {_ceil(L, k)}. A last, shorter segment exists only when k does not "
                f"divide L, so the count rounds up only when blocks are left over.")

    def own_boundary_hint(case, got, want):
        L, k, a, b = case.args
        return (f"you left out the boundary that starts the segment being recomputed: it is "
                f"that segment's input, so it stays kept until its backward is done. With "
                f"{L} blocks in segments of {k}, recomputing the first segment still holds "
                f"its own input ({a} bytes).")

    def no_checkpoint_hint(case, got, want):
        L, k, a, b = case.args
        return (f"{L} x {b} is every block's insides kept at once, the peak without "
                f"checkpointing: with segments of {k}, at most {k} blocks' insides are "
                f"recomputed at a time.")

    def boundaries_only_hint(case, got, want):
        L, k, a, b = case.args
        return (f"you counted the kept boundaries only: while the backward is inside a "
                f"segment, that segment's recomputed insides (up to {k} blocks of {b} bytes) "
                f"are alive too.")

    def not_whole_hint(case, got, want):
        L, k, a, b = case.args
        return (f"{L} blocks in segments of {k} make {_ceil(L, k)} segments, a whole number "
                f"rounded up (the last one may be shorter), not L/k = {L / k:.4g} or "
                f"L // k = {L // k}.")

    return [
        Slip(lambda L, k, a, b: _ceil(L, k) * a, boundaries_only_hint),
        Slip(lambda L, k, a, b: _ceil(L, k) * a + k * b, estimate_hint),
        Slip(lambda L, k, a, b: L / k * a + k * b, not_whole_hint),
        Slip(lambda L, k, a, b: (L // k) * a + k * b, not_whole_hint),
        Slip(lambda L, k, a, b: L * b, no_checkpoint_hint),
        Slip(lambda L, k, a, b: _segment_walk(L, k, a, b, own_boundary=False), own_boundary_hint),
        Slip(lambda L, k, a, b: _segment_walk(L, k, a, b, n_segments=L // k + 1),
             extra_segment_hint),
        Slip(lambda L, k, a, b: (L // k + 1) * a + k * b, extra_segment_hint),
    ]


def _bytes(value, case: Case) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ExerciseError(EX_PEAK, f"{case.label} should be a number of bytes, got "
                                     f"{value!r}.") from None


def check_checkpoint_peak(checkpoint_peak) -> None:
    """checkpoint_peak(n_blocks, k, boundary_bytes, block_bytes): the tape's peak, on the
    story's cases and every (L, k) up to 8."""
    compare_over_cases(
        EX_PEAK, checkpoint_peak, exact_checkpoint_peak, _peak_cases(), slips=_peak_slips(),
        read=_bytes,
        difference=lambda got, want, case: number_difference(got, want, "bytes",
                                                              "the tape measures"),
        neutral_hint="Hint: walk the backward segment by segment, last first, and at each "
                     "one add up the boundaries still kept and the insides being recomputed.")
    for L, k in ((5, 2), (6, 4)):
        measured, a, b = _measured_stack_peak(L, k)
        got = float(checkpoint_peak(L, k, a, b))
        if got != measured:
            raise ExerciseError(EX_PEAK, f"on the engine, {L} GPT blocks checkpointed every "
                                f"{k} peak at {measured} bytes; your formula says {got:.0f}.")
    save_piece("checkpoint_peak", checkpoint_peak, EX_PEAK)
    passed(EX_PEAK, "Your formula matches the tape's measured peak byte for byte.")


# ------------------------------------------------------------------ the notebook
#: Each exercise function of the lesson, and its exercise.
EXERCISE_FUNCTIONS = {"accumulate": EX_ACCUMULATE, "checkpointed_backward": EX_REPLAY,
                      "checkpoint_peak": EX_PEAK}


def name_unfinished_exercises() -> None:
    """In the notebook, a cell that needs an unfinished exercise of this lesson says which."""
    from . import _core
    _core.name_unfinished_exercises(EXERCISE_FUNCTIONS)
