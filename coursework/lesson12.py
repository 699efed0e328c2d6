"""Checks for lesson 12, "Between backward and step".

12.1 global-norm clipping: one norm over every gradient, every tensor scaled
     by the same factor (in place), the norm before clipping returned. The
     check recognises per-tensor clipping, a sum of norms, scaling up small
     gradients, and returning the norm after clipping.
12.2 a fused AdamW step over flat buffers (decoupled weight decay, bias
     correction), compared with the reference over several steps; it names
     L2 regularisation in place of decoupled decay, missing or off-by-one
     bias correction, eps inside the square root, and decay applied after
     the update.
12.3 reading a log of per-group gradient norms: the global norm per step,
     the spikes, the frozen groups (coursework/lesson12_norms.py, with the logs
     that tell the stated rule from its near misses).
12.4 the schedule of gradient buckets on one link during the backward: each
     bucket is sent once its backward is done and the link is free. The
     check recognises sending only after the whole backward, sends that
     overlap on one link, ready times that are not cumulative, a bucket sent
     before it exists and a send rounded down to whole ms, on the lesson's
     cases and generated ones whose sizes are no multiple of the link's rate.
12.5 the failure-mode table as a diagnosis: six runs with symptoms, one
     cause each.

Lesson 12 also runs the learner's lesson 09 pieces in the order between
backward and step with mixed precision: `mixed_precision_pieces()` gives each
piece or the engine's version with the same calling convention
(`engine_update_scale`, `engine_master_weight_step`, round_to_bf16).
"""
from __future__ import annotations

import math

import numpy as np

from engine.timing import median_seconds
from ._core import ExerciseError, attempt, passed
from ._compiled_stubs import uncompile_stubs
from .lesson12_norms import (EX_NORMS, NORM_LOGS, check_summarize_norms,  # noqa: F401
                             norm_log_example, summarize_norms_reference)
from .pieces import save_piece
from .slots import engine_master_weight_step, engine_update_scale

EX_CLIP = "12.1 (clip_global_norm)"
EX_ADAMW = "12.2 (adamw_step)"
EX_BUCKETS = "12.4 (bucket_schedule)"
EX_DIAG = "12.5 (diagnose)"


# --------------------------------------------------------------- 12.1
def _grads():
    rng = np.random.default_rng(121)
    big = rng.normal(size=(4, 5))
    small = rng.normal(size=7) * 0.05
    bias = rng.normal(size=3) * 0.5
    return {"w1": big * 2.0, "b1": bias, "w2": small}


def _global(grads):
    return math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values()))


def check_clip_global_norm(clip_global_norm) -> None:
    """Scale every gradient by min(1, max_norm / global_norm), in place; return the norm."""
    grads = _grads()
    before = {k: v.copy() for k, v in grads.items()}
    norm = _global(before)
    max_norm = 1.0
    got = attempt(EX_CLIP, clip_global_norm, grads, max_norm)
    if got is None:
        raise ExerciseError(EX_CLIP, "the function returned None; return the global norm "
                                     "measured before clipping (a float), it is what you log.")
    try:
        got = float(got)
    except (TypeError, ValueError):
        raise ExerciseError(EX_CLIP, f"return one number, the global norm, got "
                                     f"{type(got).__name__}.") from None
    if all(np.array_equal(grads[k], before[k]) for k in grads):
        raise ExerciseError(EX_CLIP, f"the gradients were not changed, though their global norm "
                                     f"{norm:.4g} exceeds max_norm={max_norm}. Scale every "
                                     f"tensor in place (g *= scale), as the optimizer reads "
                                     f"these same arrays.")
    sum_norms = sum(float(np.linalg.norm(v)) for v in before.values())
    if math.isclose(got, max_norm, rel_tol=1e-4):
        raise ExerciseError(EX_CLIP, f"you returned {got:.4g}, the norm after clipping. Return "
                                     f"the norm measured before clipping ({norm:.4g}): a spike "
                                     f"in it is the warning you want in the log.")
    if math.isclose(got, sum_norms, rel_tol=1e-6):
        raise ExerciseError(EX_CLIP, f"{got:.4g} is the sum of the tensors' norms. The global "
                                     f"norm is the norm of every entry of every tensor taken "
                                     f"together, as one long vector, and norms of parts do "
                                     f"not add up to the norm of the whole ({norm:.4g} here).")
    if not math.isclose(got, norm, rel_tol=1e-6):
        raise ExerciseError(EX_CLIP, f"you returned {got:.6g}; the global norm of these "
                                     f"gradients is {norm:.6g}: the norm of every entry of "
                                     f"every tensor taken together.")
    scale = max_norm / norm
    per_tensor = {k: v * min(1.0, max_norm / max(float(np.linalg.norm(v)), 1e-12))
                  for k, v in before.items()}
    if all(np.allclose(grads[k], per_tensor[k], rtol=1e-6) for k in grads):
        raise ExerciseError(EX_CLIP, "each tensor was clipped to max_norm on its own. That "
                                     "changes the direction of the whole gradient (the big "
                                     "tensor shrinks, the small ones do not). Scale *every* "
                                     "tensor by the same factor, set by the global norm.")
    for k in grads:
        if not np.allclose(grads[k], before[k] * scale, rtol=1e-5, atol=1e-12):
            ratio = float(np.linalg.norm(grads[k]) / np.linalg.norm(before[k]))
            raise ExerciseError(EX_CLIP, f"tensor {k!r} was scaled by {ratio:.4g}; every tensor "
                                         f"must be scaled by the same factor, {scale:.4g} "
                                         f"here.")
    # below the threshold nothing changes (clipping never scales up)
    grads = {k: v * (0.5 / norm) for k, v in before.items()}
    small = {k: v.copy() for k, v in grads.items()}
    got = float(attempt(EX_CLIP, clip_global_norm, grads, max_norm))
    if not all(np.array_equal(grads[k], small[k]) for k in grads):
        raise ExerciseError(EX_CLIP, "gradients with global norm 0.5 < max_norm = 1 were "
                                     "changed. Clipping only ever shrinks: gradients whose "
                                     "global norm is within max_norm stay as they are.")
    if not math.isclose(got, 0.5, rel_tol=1e-6):
        raise ExerciseError(EX_CLIP, f"for gradients of global norm 0.5 you returned {got:.6g}.")
    save_piece("clip_global_norm", clip_global_norm, EX_CLIP)
    passed(EX_CLIP, f"norm {norm:.4f} clipped to {max_norm:g}, direction kept.")


# --------------------------------------------------------------- 12.2
def adamw_reference(p, g, m, v, step, lr, beta1, beta2, eps, weight_decay):
    """torch.optim.AdamW's update, in numpy, in place."""
    m[...] = beta1 * m + (1 - beta1) * g
    v[...] = beta2 * v + (1 - beta2) * g * g
    m_hat = m / (1 - beta1 ** step)
    v_hat = v / (1 - beta2 ** step)
    p *= 1 - lr * weight_decay
    p -= lr * m_hat / (np.sqrt(v_hat) + eps)


def _variants():
    """Typical wrong AdamW steps and the hint each deserves."""
    def l2(p, g, m, v, step, lr, b1, b2, eps, wd):
        adamw_reference(p, g + wd * p, m, v, step, lr, b1, b2, eps, 0.0)

    def no_bias(p, g, m, v, step, lr, b1, b2, eps, wd):
        m[...] = b1 * m + (1 - b1) * g
        v[...] = b2 * v + (1 - b2) * g * g
        p *= 1 - lr * wd
        p -= lr * m / (np.sqrt(v) + eps)

    def off_by_one(p, g, m, v, step, lr, b1, b2, eps, wd):
        adamw_reference(p, g, m, v, step + 1, lr, b1, b2, eps, wd)

    def eps_inside(p, g, m, v, step, lr, b1, b2, eps, wd):
        m[...] = b1 * m + (1 - b1) * g
        v[...] = b2 * v + (1 - b2) * g * g
        p *= 1 - lr * wd
        p -= lr * (m / (1 - b1 ** step)) / np.sqrt(v / (1 - b2 ** step) + eps)

    def decay_after(p, g, m, v, step, lr, b1, b2, eps, wd):
        adamw_reference(p, g, m, v, step, lr, b1, b2, eps, 0.0)
        p *= 1 - lr * wd

    def no_decay(p, g, m, v, step, lr, b1, b2, eps, wd):
        adamw_reference(p, g, m, v, step, lr, b1, b2, eps, 0.0)

    def decay_without_lr(p, g, m, v, step, lr, b1, b2, eps, wd):
        m[...] = b1 * m + (1 - b1) * g
        v[...] = b2 * v + (1 - b2) * g * g
        p *= 1 - wd
        p -= lr * (m / (1 - b1 ** step)) / (np.sqrt(v / (1 - b2 ** step)) + eps)

    def step_late(p, g, m, v, step, lr, b1, b2, eps, wd):
        with np.errstate(divide="ignore", invalid="ignore"):
            adamw_reference(p, g, m, v, step - 1, lr, b1, b2, eps, wd)

    return [
        (l2, "this is Adam with L2 regularisation: the decay was added to the gradient, so it "
             "passes through m and v and is rescaled by them. AdamW decouples it: the "
             "weights shrink beside the Adam step, not through it."),
        (no_bias, "the bias correction is missing: early on both moments are still near their "
                  "zero start, and the correction is what makes up for it."),
        (off_by_one, "the bias correction is off by one step: `step` counts from 1 at the first "
                     "update, and the correction uses it as it is."),
        (step_late, "the bias correction uses the step before this one: at the first update "
                    "(step 1) that divides by zero. `step` already counts this update."),
        (eps_inside, "eps is inside the square root; it is added after the root is taken."),
        (decay_after, "the decay was applied after the Adam step: decoupled decay shrinks the "
                      "weights as they were before this step's update."),
        (no_decay, "no weight decay was applied: every step shrinks the weights a little, "
                   "apart from the gradient."),
        (decay_without_lr, "the decay is not scaled by the learning rate; in decoupled decay "
                           "the weights shrink by lr * weight_decay of themselves per step."),
    ]


def _run_steps(fn, p0, grads, hp, exercise=None):
    p, m, v = p0.copy(), np.zeros_like(p0), np.zeros_like(p0)
    for step, g in enumerate(grads, start=1):
        args = (p, g, m, v, step, hp["lr"], hp["beta1"], hp["beta2"], hp["eps"],
                hp["weight_decay"])
        if exercise is None:
            fn(*args)
        else:
            attempt(exercise, fn, *args)
    return p, m, v


def check_adamw_step(adamw_step, repeats: int = 5) -> None:
    """Three AdamW steps in float64 equal torch's formula; then float32 and a timing."""
    rng = np.random.default_rng(122)
    p0 = rng.normal(size=257)
    grads = [rng.normal(size=257) * s for s in (1.0, 0.3, 2.0)]
    hp = dict(lr=0.05, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.2)
    p, m, v = _run_steps(adamw_step, p0, grads, hp, EX_ADAMW)
    pr, mr, vr = _run_steps(adamw_reference, p0, grads, hp)
    if np.array_equal(p, p0):
        raise ExerciseError(EX_ADAMW, "the parameters did not change: update p, m and v in "
                                      "place (p[i] = ..., m[i] = ...), the caller keeps these "
                                      "same arrays.")
    moments_right = np.allclose(m, mr, rtol=1e-10) and np.allclose(v, vr, rtol=1e-10)
    if not (moments_right and np.allclose(p, pr, rtol=1e-10, atol=1e-12)):
        for fn, hint in _variants():
            pw, _, _ = _run_steps(fn, p0, grads, hp)
            if np.allclose(p, pw, rtol=1e-10, atol=1e-12, equal_nan=True):
                raise ExerciseError(EX_ADAMW, f"after 3 steps the parameters differ from AdamW; "
                                              f"{hint}")
    if not moments_right:
        raise ExerciseError(EX_ADAMW, "the moments m and v are off after 3 steps: each is a "
                                      "running average (m of g, v of g squared, with their own "
                                      "beta), written back into the m and v arrays you were "
                                      "given, which carry over to the next step.")
    if not np.allclose(p, pr, rtol=1e-10, atol=1e-12):
        i = int(np.argmax(np.abs(p - pr)))
        raise ExerciseError(EX_ADAMW, f"after 3 steps p[{i}] = {p[i]:.10g}, AdamW gives "
                                      f"{pr[i]:.10g}, though your moments are right. Compare "
                                      f"your update with the lesson's, part by part: the "
                                      f"decay, the two bias corrections, where eps goes.")
    # float32 buffers, the size of the tiny trainer
    n = 822_912
    p32 = rng.normal(size=n).astype(np.float32)
    g32 = rng.normal(size=n).astype(np.float32)
    m32, v32 = np.zeros_like(p32), np.zeros_like(p32)
    want = p32.astype(np.float64)
    mw, vw = np.zeros(n), np.zeros(n)
    attempt(EX_ADAMW, adamw_step, p32, g32, m32, v32, 1, 1e-3, 0.9, 0.95, 1e-8, 0.1)
    adamw_reference(want, g32.astype(np.float64), mw, vw, 1, 1e-3, 0.9, 0.95, 1e-8, 0.1)
    if p32.dtype != np.float32 or not np.allclose(p32, want, rtol=1e-5, atol=1e-6):
        raise ExerciseError(EX_ADAMW, "float32 buffers of 822 912 parameters: the result is "
                                      "off. Loop over every element of p (p.size).")
    t_yours = median_seconds(
        lambda: adamw_step(p32, g32, m32, v32, 2, 1e-3, 0.9, 0.95, 1e-8, 0.1), repeats)
    t_ref = median_seconds(
        lambda: adamw_reference(p32, g32, m32, v32, 2, 1e-3, 0.9, 0.95, 1e-8, 0.1), repeats)
    save_piece("adamw_step", adamw_step, EX_ADAMW)
    passed(EX_ADAMW, f"3 steps match AdamW. 822 912 float32 parameters: yours "
                     f"{t_yours * 1e3:.3g} ms, unfused numpy {t_ref * 1e3:.3g} ms"
                     f", speedup {t_ref / t_yours:.1f}x.")


# ------------------------------------------- lesson 09's pieces, in order
def _engine_to_bf16(x):
    # The engine's rounding, imported when called, so that this function stands alone
    # (exercise 09.1's check can save it as a piece, as it saves the learner's).
    from engine.precision import round_to_bf16
    return round_to_bf16(x)


# piece name -> (exercise, the engine's version with the same calling convention)
PRECISION_PIECES = {"to_bf16": ("09.1", _engine_to_bf16),
                    "update_scale": ("09.3", engine_update_scale),
                    "master_weight_step": ("09.2", engine_master_weight_step)}


def mixed_precision_pieces() -> dict:
    """name -> (function, owner) for lesson 09's pieces: the learner's saved piece when it
    loads (and keeps its slot's contract, where the slot has one), else the engine's
    version, with the reason. Never raises."""
    from .pieces import piece_or_engine
    return {name: piece_or_engine(name, exercise, engine_version)
            for name, (exercise, engine_version) in PRECISION_PIECES.items()}


# --------------------------------------------------------------- 12.4
# a right schedule kept in float32 agrees to about 7 digits; every slip is further off
MS_TOLERANCE = dict(rtol=1e-6, atol=1e-6)


def bucket_schedule_reference(backward_ms, bucket_bytes, link_bytes_per_ms):
    """(start, end) in ms of each bucket's send, one link, buckets in backward order."""
    schedule, ready, link_free = [], 0.0, 0.0
    for compute, size in zip(backward_ms, bucket_bytes):
        ready += compute
        start = max(ready, link_free)
        link_free = start + size / link_bytes_per_ms
        schedule.append((start, link_free))
    return schedule


def _schedule_variants(backward_ms, bucket_bytes, link):
    """Typical wrong schedules and the hint each deserves."""
    total = float(sum(backward_ms))
    after, t = [], total
    for size in bucket_bytes:
        after.append((t, t + size / link))
        t += size / link
    overlapping, ready = [], 0.0
    for compute, size in zip(backward_ms, bucket_bytes):
        ready += compute
        overlapping.append((ready, ready + size / link))
    own, free = [], 0.0
    for compute, size in zip(backward_ms, bucket_bytes):
        start = max(float(compute), free)
        free = start + size / link
        own.append((start, free))
    early, free = [], float(backward_ms[0])
    for size in bucket_bytes:
        early.append((free, free + size / link))
        free += size / link
    begins, free, ready = [], 0.0, 0.0
    for compute, size in zip(backward_ms, bucket_bytes):
        start = max(ready, free)            # ready still holds the end of the bucket before
        free = start + size / link
        begins.append((start, free))
        ready += compute
    whole_ms = [bucket_schedule_reference(backward_ms, [size // link * link for size in
                                                        bucket_bytes], link),
                "each send lasts a whole number of ms, rounded down: `//` is floor division, "
                "and a bucket whose bytes are not a multiple of the link's bytes per ms takes "
                "a fraction of a ms more."]
    return [
        tuple(whole_ms),
        (begins, "each bucket goes when its backward begins; a bucket is ready only when its "
                 "backward has ended."),
        (after, "every send starts after the whole backward: no overlap. A bucket can go as "
                "soon as its own backward is done, while the backward of the layers below "
                "still runs."),
        (overlapping, "two sends overlap in time, but one link carries one bucket at a time: "
                      "a bucket that is ready while the link is busy waits for the previous "
                      "send to end."),
        (own, "a bucket is ready when the backward *up to it* is done: the backward runs the "
              "buckets one after another, so a bucket's own backward_ms alone is not the "
              "time it is ready."),
        (early, "a bucket was sent before its backward had produced it: a send never starts "
                "before its bucket is ready."),
    ]


def _first_wrong_send(got, want, backward_ms) -> str:
    """The first bucket whose send is off, and what about it: its start against the moment
    its backward ends and the link frees, or its length. Names the slip, not the rule."""
    i = next(k for k, (a, b) in enumerate(zip(got, want))
             if not np.allclose(a, b, **MS_TOLERANCE))
    (start, end), (want_start, want_end) = got[i], want[i]
    said = f"bucket {i} is sent {start:g}-{end:g} ms, expected {want_start:g}-{want_end:g} ms: "
    ends = np.cumsum(backward_ms)
    ready = float(ends[i])
    previous_end = float(want[i - 1][1]) if i else 0.0
    if math.isclose(start, want_start, rel_tol=1e-6, abs_tol=1e-6):
        return said + ("it starts at the right moment but lasts the wrong time; a send's "
                       "length follows from its bytes and the link's speed (let the units, "
                       "bytes and bytes per ms, say which divides which).")
    if i and math.isclose(start, float(ends[i - 1]), rel_tol=1e-6, abs_tol=1e-6) \
            and start < ready:
        return said + ("it goes when its backward begins; a bucket is ready only when its "
                       "backward has ended.")
    if start < ready:
        return said + "it starts before its backward has produced it."
    if start < previous_end:
        return said + f"it starts while bucket {i - 1} is still on the link."
    if i + 1 < len(ends) and math.isclose(start, float(ends[i + 1]), rel_tol=1e-6,
                                          abs_tol=1e-6):
        return said + (f"it waits for the backward of bucket {i + 1}, the next one; a bucket "
                       f"can go as soon as its own backward has ended.")
    return said + ("it waits longer than it has to: once its backward has ended and the link "
                   "is free, nothing holds it back.")


def generated_bucket_cases(count: int = 8, seed: int = 124):
    """(backward_ms, bucket_bytes, link_bytes_per_ms) drawn with a fixed seed: 1 to 7
    buckets, backward times in tenths of a ms, sizes that are no multiple of the link's
    bytes per ms, links fast and slow (the link idle, or a queue of sends)."""
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(count):
        n = int(rng.integers(1, 8))
        backward_ms = [float(v) for v in np.round(rng.uniform(0.1, 12.0, size=n), 1)]
        bucket_bytes = [int(v) for v in rng.integers(100, 40_000, size=n)]
        cases.append((backward_ms, bucket_bytes, float(rng.choice([150.0, 700.0, 3000.0]))))
    return cases


def check_bucket_schedule(bucket_schedule) -> None:
    """Start and end of each bucket's all-reduce on one link during the backward."""
    cases = [([4.0, 10.0, 10.0, 1.0], [2000, 8000, 8000, 30000], 1000.0),
             ([3.0, 1.0, 1.0, 6.0, 2.0], [6000, 500, 500, 500, 4000], 500.0),
             ([5.0], [1000], 100.0),
             ([2.5, 7.0, 1.5], [1500, 2750, 333], 400.0)] + generated_bucket_cases()
    for backward_ms, bucket_bytes, link in cases:
        got = attempt(EX_BUCKETS, bucket_schedule, list(backward_ms), list(bucket_bytes), link)
        try:
            got = [(float(a), float(b)) for a, b in got]
        except (TypeError, ValueError):
            raise ExerciseError(EX_BUCKETS, f"return one (start_ms, end_ms) pair per bucket, "
                                            f"got {got!r}") from None
        want = bucket_schedule_reference(backward_ms, bucket_bytes, link)
        where = (f"backward_ms={backward_ms}, bucket_bytes={bucket_bytes}, "
                 f"link_bytes_per_ms={link:g}")
        if len(got) != len(want):
            raise ExerciseError(EX_BUCKETS, f"{len(got)} pairs for {len(want)} buckets ({where}).")
        if np.allclose(got, want, **MS_TOLERANCE):
            continue
        named = {text for variant, text in _schedule_variants(backward_ms, bucket_bytes, link)
                 if np.allclose(got, variant, **MS_TOLERANCE)}
        hint = named.pop() if len(named) == 1 else None
        if hint is None:
            hint = _first_wrong_send(got, want, backward_ms)
        raise ExerciseError(EX_BUCKETS, f"{where}: {hint}")
    passed(EX_BUCKETS, f"each bucket goes when its backward is done and the link is free, "
                       f"on the {len(cases)} cases (the lesson's, sizes that are no multiple "
                       f"of the link's rate, {len(cases) - 4} generated).")


# --------------------------------------------------------------- 12.5
CAUSES = {
    "activations": "the activation cache (tensors saved for backward), not the weights",
    "attention_scores": "the [N, N] attention scores",
    "bf16_swallowed": "updates swallowed by bf16 weights",
    "fp16_overflow": "overflow in fp16, or a bad loss scale",
    "missing_div_k": "the missing /K of gradient accumulation",
    "unordered_scatter": "an unordered (racy) scatter-add",
}

FIRST_MOVES = {
    "activations": "checkpoint blocks, or halve the micro-batch",
    "attention_scores": "a fused attention backward that never stores the scores",
    "bf16_swallowed": "keep fp32 master weights",
    "fp16_overflow": "switch to bf16 (or fix the loss scaler)",
    "missing_div_k": "scale each micro-batch's loss by 1/K; zero the buffer between steps",
    "unordered_scatter": "a deterministic embedding kernel",
}

# The runs of the lesson, by letter, and the cause each one shows.
_ANSWERS = {"A": "missing_div_k", "B": "attention_scores", "C": "unordered_scatter",
            "D": "bf16_swallowed", "E": "activations", "F": "fp16_overflow"}

# What a wrong pick overlooks, per run.
_CLUES = {
    "A": "run A's symptom is a gradient norm exactly K = 8 times the one-batch norm, with "
         "memory and precision fine: the accumulated sum was never divided by K.",
    "B": "run B is fine at short sequences and runs out of memory only as N grows, growing "
         "with N squared: that is the one tensor of size N x N per head.",
    "C": "run C's two identical runs differ only in the last bits of the embedding gradient: "
         "additions into the same rows happened in a different order.",
    "D": "run D's loss is flat and the weights did not move at all, in bf16 storage, with "
         "healthy gradients: each update was smaller than bf16's spacing near the weight.",
    "E": "run E dies at step 1, after the forward finished, with weights a small share of "
         "memory: what fills it is what the forward kept for the backward.",
    "F": "run F's activations exceed 65 504, fp16's largest number, and the loss turns NaN.",
}


def check_diagnose(diagnose) -> None:
    """Each run mapped to the cause key that explains its symptoms."""
    got = attempt(EX_DIAG, diagnose)
    if not isinstance(got, dict):
        raise ExerciseError(EX_DIAG, f"return a dict run -> cause, like {{'A': "
                                     f"'missing_div_k', ...}}; got {type(got).__name__}.")
    missing = sorted(set(_ANSWERS) - set(got))
    if missing:
        raise ExerciseError(EX_DIAG, f"no diagnosis for run(s) {', '.join(missing)}; give "
                                     f"each of the runs {', '.join(sorted(_ANSWERS))} a cause.")
    for run in sorted(_ANSWERS):
        cause = got[run]
        if cause not in CAUSES:
            raise ExerciseError(EX_DIAG, f"run {run}: {cause!r} is not one of the causes; "
                                         f"choose from {', '.join(sorted(CAUSES))}.")
    wrong = [run for run in sorted(_ANSWERS) if got[run] != _ANSWERS[run]]
    if wrong:
        run = wrong[0]
        raise ExerciseError(EX_DIAG, f"{len(wrong)} of {len(_ANSWERS)} diagnoses are wrong, "
                                     f"among them run {run} ({got[run]!r}). Look again: "
                                     f"{_CLUES[run]}")
    lines = [f"  run {run}: {CAUSES[_ANSWERS[run]]} -> first move: {FIRST_MOVES[_ANSWERS[run]]}"
             for run in sorted(_ANSWERS)]
    passed(EX_DIAG, "all six runs diagnosed.\n" + "\n".join(lines))


# ------------------------------------------------------------------ the notebook
#: Each exercise function of the lesson, and its exercise.
EXERCISE_FUNCTIONS = {"clip_global_norm": EX_CLIP, "adamw_step": EX_ADAMW, "summarize_norms":
                      EX_NORMS, "bucket_schedule": EX_BUCKETS, "diagnose": EX_DIAG}


def name_unfinished_exercises() -> None:
    """In the notebook, a cell that needs an unfinished exercise of this lesson says which."""
    from . import _core
    _core.name_unfinished_exercises(EXERCISE_FUNCTIONS)
    uncompile_stubs(EXERCISE_FUNCTIONS)
