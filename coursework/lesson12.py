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
     the steps of a spike (against the median of the steps before), the
     groups whose norm is exactly zero at every step, on the lesson's log and
     three more that separate the rules. The check recognises a sum of norms,
     a spike judged against the step before, the mean of the steps before or
     the median of the whole log, a spike flagged a step late, and a small
     norm, or one zero step (anywhere, or only the last), taken for a cut
     graph.
12.4 the schedule of gradient buckets on one link during the backward: each
     bucket is sent once its backward is done and the link is free. The
     check recognises sending only after the whole backward, sends that
     overlap on one link, ready times that are not cumulative, and a bucket
     sent before it exists.
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
from .pieces import save_piece
from .slots import engine_master_weight_step, engine_update_scale

EX_CLIP = "12.1 (clip_global_norm)"
EX_ADAMW = "12.2 (adamw_step)"
EX_NORMS = "12.3 (summarize_norms)"
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
                                     f"norm is sqrt of the sum of *squares* of every entry: "
                                     f"sqrt(sum over tensors of ||g||^2) = {norm:.4g}.")
    if not math.isclose(got, norm, rel_tol=1e-6):
        raise ExerciseError(EX_CLIP, f"you returned {got:.6g}; the global norm of these "
                                     f"gradients is {norm:.6g} = sqrt(sum over tensors of "
                                     f"sum(g**2)).")
    scale = max_norm / norm
    per_tensor = {k: v * min(1.0, max_norm / max(float(np.linalg.norm(v)), 1e-12))
                  for k, v in before.items()}
    if all(np.allclose(grads[k], per_tensor[k], rtol=1e-6) for k in grads):
        raise ExerciseError(EX_CLIP, "each tensor was clipped to max_norm on its own. That "
                                     "changes the direction of the whole gradient (the big "
                                     "tensor shrinks, the small ones do not). Scale *every* "
                                     "tensor by the same factor max_norm / global_norm.")
    for k in grads:
        if not np.allclose(grads[k], before[k] * scale, rtol=1e-5, atol=1e-12):
            ratio = float(np.linalg.norm(grads[k]) / np.linalg.norm(before[k]))
            raise ExerciseError(EX_CLIP, f"tensor {k!r} was scaled by {ratio:.4g}; every tensor "
                                         f"must be scaled by max_norm / global_norm = "
                                         f"{scale:.4g}.")
    # below the threshold nothing changes (clipping never scales up)
    grads = {k: v * (0.5 / norm) for k, v in before.items()}
    small = {k: v.copy() for k, v in grads.items()}
    got = float(attempt(EX_CLIP, clip_global_norm, grads, max_norm))
    if not all(np.array_equal(grads[k], small[k]) for k in grads):
        raise ExerciseError(EX_CLIP, "gradients with global norm 0.5 < max_norm = 1 were "
                                     "changed. Clipping only ever shrinks: scale by "
                                     "min(1, max_norm / norm).")
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

    return [
        (l2, "this is Adam with L2 regularisation: weight_decay * p was added to the gradient, "
             "so it passes through m and v. AdamW decouples it: p *= (1 - lr * weight_decay), "
             "apart from the Adam step."),
        (no_bias, "the bias correction is missing: divide m by (1 - beta1**step) and v by "
                  "(1 - beta2**step); early on both moments are still near their zero start."),
        (off_by_one, "the bias correction is off by one step: `step` counts from 1 at the first "
                     "update, so use beta1**step, not beta1**(step + 1)."),
        (eps_inside, "eps is inside the square root: the update is m_hat / (sqrt(v_hat) + eps)."),
        (decay_after, "the decay was applied after the Adam step: decoupled decay shrinks the "
                      "weights as they were before this step, p *= (1 - lr * weight_decay), then "
                      "p -= lr * m_hat / (sqrt(v_hat) + eps)."),
        (no_decay, "no weight decay was applied: multiply p by (1 - lr * weight_decay)."),
        (decay_without_lr, "the decay is p *= (1 - weight_decay); decoupled decay is scaled by "
                           "the learning rate: p *= (1 - lr * weight_decay)."),
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
            if np.allclose(p, pw, rtol=1e-10, atol=1e-12):
                raise ExerciseError(EX_ADAMW, f"after 3 steps the parameters differ from AdamW; "
                                              f"{hint}")
    if not moments_right:
        raise ExerciseError(EX_ADAMW, "the moments m and v are off after 3 steps. Per element: "
                                      "m = beta1 m + (1 - beta1) g and v = beta2 v + "
                                      "(1 - beta2) g^2, written back into the m and v arrays "
                                      "you were given (they carry over to the next step).")
    if not np.allclose(p, pr, rtol=1e-10, atol=1e-12):
        i = int(np.argmax(np.abs(p - pr)))
        raise ExerciseError(EX_ADAMW, f"after 3 steps p[{i}] = {p[i]:.10g}, AdamW gives "
                                      f"{pr[i]:.10g}. Per element: decay p by (1 - lr * wd), "
                                      f"then subtract lr * m_hat / (sqrt(v_hat) + eps) with "
                                      f"m_hat = m / (1 - beta1**step), "
                                      f"v_hat = v / (1 - beta2**step).")
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


# --------------------------------------------------------------- 12.3
def summarize_norms_reference(group_norms, spike_factor=10.0):
    """(global norm per step, spike steps, groups exactly zero at every step)."""
    per_group = np.array([np.asarray(v, dtype=np.float64) for v in group_norms.values()])
    total = np.sqrt(np.sum(per_group ** 2, axis=0))
    spikes = [t for t in range(1, total.size)
              if total[t] > spike_factor * float(np.median(total[:t]))]
    frozen = sorted(k for k, v in group_norms.items() if np.all(np.asarray(v) == 0.0))
    return total, spikes, frozen


def norm_log_example():
    """A log of per-group norms over 30 steps: a spike at step 12, a quiet step at 20 (a
    small batch), `adapter` cut from the graph, `head` converged to tiny norms, `gain`
    zero on one step only."""
    steps = np.arange(30)
    base = 0.97 ** steps
    quiet = np.where(steps == 20, 0.01, 1.0)
    spike = np.where(steps == 12, 50.0, 1.0)
    return {"embed": list(1.0 * base * quiet * spike), "block": list(2.0 * base * quiet * spike),
            "head": list(1e-7 * base), "adapter": [0.0] * 30,
            "gain": [0.0 if t == 5 else 0.003 for t in steps]}


def second_spike_log():
    """20 steps with a spike of 50x at step 8 and a second one of 15x at step 10: the
    first spike lifts the mean of the earlier steps above the second, not their median."""
    steps = np.arange(20)
    spike = np.select([steps == 8, steps == 10], [50.0, 15.0], 1.0)
    return {"embed": list(1.0 * 0.99 ** steps * spike), "block": list(2.0 * 0.99 ** steps * spike)}


def warm_up_log():
    """30 steps whose norms grow 5% a step (a warm-up), with a spike of 15x at step 4: the
    median of the whole log, later steps included, is twice the early norms and hides it."""
    steps = np.arange(30)
    spike = np.where(steps == 4, 15.0, 1.0)
    return {"embed": list(1.0 * 1.05 ** steps * spike), "block": list(2.0 * 1.05 ** steps * spike)}


def late_zero_log():
    """30 steps: `adapter` cut from the graph, `late` zero at its last step only, `early`
    zero at its first step only."""
    steps = np.arange(30)
    return {"embed": list(0.97 ** steps), "adapter": [0.0] * 30,
            "late": [0.0 if t == 29 else 0.002 for t in steps],
            "early": [0.0 if t == 0 else 0.002 for t in steps]}


NORM_LOGS = (("the example log", norm_log_example),
             ("a log with a second spike two steps after the first", second_spike_log),
             ("a log whose norms grow 5% a step (a warm-up)", warm_up_log),
             ("a log with groups zero only at their first or last step", late_zero_log))


def _spike_rules(total, factor):
    """The spike rules learners often write in place of the median of the earlier steps,
    each with what is wrong with it."""
    steps = range(1, total.size)
    return (
        ([t for t in steps if total[t] > factor * total[t - 1]],
         "that compares each step with the step before it: an ordinary step after a quiet one "
         "(step 21 of the example log follows the small batch of step 20) looks like a spike. "
         "Compare each step with the median of all the steps before it, which one odd step "
         "does not move."),
        ([t for t in steps if total[t] > factor * float(np.mean(total[:t]))],
         "that is the mean of the earlier steps, not their median: one spike lifts the mean, "
         "and a second spike soon after no longer clears it. The median of the earlier steps "
         "stays put when one of them is odd."),
        ([t for t in steps if total[t] > factor * float(np.median(total))],
         "that compares with the median of the whole log, later steps included. A monitor "
         "reads the log while the run trains and cannot see the future: at step t use only "
         "steps 0 to t-1 (here the later, larger norms hide an early spike)."),
        ([t for t in steps if total[t] > factor * float(np.median(total[:t + 1]))],
         "that median includes step t itself; compare with the median of the steps before "
         "it only."),
    )


def _spike_hint(spikes, want, total, factor):
    for rule, hint in _spike_rules(total, factor):
        if spikes == rule != want:
            return hint
    if spikes in ([t - 1 for t in want], [t + 1 for t in want]):
        return "name the step whose own norm jumped (its index in the log)."
    if 0 in spikes:
        return "step 0 has no earlier steps to compare with: start at step 1."
    missed = [t for t in want if t not in spikes]
    if missed:
        t = missed[0]
        return (f"step {t}'s global norm is {total[t] / np.median(total[:t]):.1f} times the "
                f"median of the steps before it.")
    return ("a spike is a step whose global norm exceeds spike_factor times the median of the "
            "global norms of all earlier steps.")


def _frozen_hint(frozen, want, log):
    for name in frozen:
        if name in want or name not in log:
            continue
        norms = np.asarray(log[name], dtype=np.float64)
        zeros = [int(t) for t in np.flatnonzero(norms == 0.0)]
        if not zeros:
            return (f"'{name}' has tiny norms ({norms.max():.0e}), not zero ones: a converged "
                    f"or slow group. A cut graph gives exactly 0.0; compare with == 0, not "
                    f"with a tolerance.")
        where = "its last step" if zeros == [norms.size - 1] else (
            "its first step" if zeros == [0] else f"step {zeros[0]}")
        return (f"'{name}' is zero at {where} only (that step its gradient happened to "
                f"vanish); a frozen group is zero at every step, so test every entry.")
    missing = [name for name in want if name not in frozen]
    if missing:
        return f"'{missing[0]}' is 0.0 at every step: its gradient never arrives."
    return "give each frozen group once, by the name it has in the log."


def _check_norm_log(summarize_norms, what, log):
    got = attempt(EX_NORMS, summarize_norms, {k: list(v) for k, v in log.items()}, 10.0)
    if not (isinstance(got, tuple) and len(got) == 3):
        raise ExerciseError(EX_NORMS, f"return three things (global norms per step, spike "
                                      f"steps, frozen groups), got {type(got).__name__}.")
    total, spikes, frozen = got
    want_total, want_spikes, want_frozen = summarize_norms_reference(log, 10.0)
    total = np.asarray(total, dtype=np.float64).reshape(-1)
    if total.shape != want_total.shape:
        raise ExerciseError(EX_NORMS, f"one global norm per step: {want_total.size} steps in "
                                      f"{what}, got {total.size} numbers.")
    if not np.allclose(total, want_total, rtol=1e-9):
        groups = np.array([v for v in log.values()])
        if np.allclose(total, groups.sum(axis=0), rtol=1e-9):
            hint = ("that is the sum of the groups' norms. The global norm is the norm of all "
                    "gradients together: sqrt(sum over groups of norm**2).")
        elif np.allclose(total, (groups ** 2).sum(axis=0), rtol=1e-9):
            hint = "that is the squared norm: take the square root of the sum of squares."
        else:
            hint = "the global norm of step t is sqrt(sum over groups of norm[t]**2)."
        raise ExerciseError(EX_NORMS, f"in {what}, the global norm at step 0 is "
                                      f"{total[0]:.6g}, expected {want_total[0]:.6g}; {hint}")
    try:
        spikes = sorted(int(t) for t in spikes)
    except (TypeError, ValueError):
        raise ExerciseError(EX_NORMS, f"give the spikes as a list of step numbers, got "
                                      f"{spikes!r}") from None
    if spikes != want_spikes:
        hint = _spike_hint(spikes, want_spikes, want_total, 10.0)
        raise ExerciseError(EX_NORMS, f"in {what}, the spike steps are {spikes}, expected "
                                      f"{want_spikes}; {hint}")
    try:
        frozen = sorted(str(k) for k in frozen)
    except TypeError:
        raise ExerciseError(EX_NORMS, f"give the frozen groups as a list of names, got "
                                      f"{frozen!r}") from None
    if frozen != want_frozen:
        raise ExerciseError(EX_NORMS, f"in {what}, the frozen groups are {frozen}, expected "
                                      f"{want_frozen}; {_frozen_hint(frozen, want_frozen, log)}")
    return want_spikes, want_frozen


def check_summarize_norms(summarize_norms) -> None:
    """The global norm per step, the spikes, the frozen groups: on the lesson's example
    log, then on one log per rule that the example alone cannot tell apart."""
    (spikes, frozen), *_ = [_check_norm_log(summarize_norms, what, make())
                            for what, make in NORM_LOGS]
    passed(EX_NORMS, f"global norms right; spike at step {spikes[0]}; frozen: "
                     f"{', '.join(frozen)}; and right on {len(NORM_LOGS) - 1} more logs (a "
                     f"second spike, a warm-up, a group zero at one end only).")


# --------------------------------------------------------------- 12.4
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
    return [
        (after, "every send starts after the whole backward: no overlap. A bucket can go as "
                "soon as its own backward is done, while the backward of the layers below "
                "still runs."),
        (overlapping, "two sends overlap in time, but one link carries one bucket at a time: "
                      "a bucket that is ready while the link is busy waits for the previous "
                      "send to end, start = max(ready, end of the previous send)."),
        (own, "a bucket is ready when the backward *up to it* is done: the backward runs the "
              "buckets one after another, so bucket i is ready at sum(backward_ms[:i + 1])."),
        (early, "a bucket was sent before its backward had produced it: start = max(ready, "
                "end of the previous send), never earlier than ready."),
    ]


def check_bucket_schedule(bucket_schedule) -> None:
    """Start and end of each bucket's all-reduce on one link during the backward."""
    cases = [([4.0, 10.0, 10.0, 1.0], [2000, 8000, 8000, 30000], 1000.0),
             ([3.0, 1.0, 1.0, 6.0, 2.0], [6000, 500, 500, 500, 4000], 500.0),
             ([5.0], [1000], 100.0)]
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
        if np.allclose(got, want, rtol=1e-9, atol=1e-9):
            continue
        hint = None
        for variant, text in _schedule_variants(backward_ms, bucket_bytes, link):
            if np.allclose(got, variant, rtol=1e-9, atol=1e-9):
                hint = text
                break
        if hint is None:
            i = next(k for k, (a, b) in enumerate(zip(got, want))
                     if not np.allclose(a, b, rtol=1e-9, atol=1e-9))
            hint = (f"bucket {i} is sent {got[i][0]:g}-{got[i][1]:g} ms, expected "
                    f"{want[i][0]:g}-{want[i][1]:g} ms. Ready at the end of its backward "
                    f"(a running sum of backward_ms), sent when ready and the link is free, "
                    f"for bytes / link_bytes_per_ms.")
        raise ExerciseError(EX_BUCKETS, f"{where}: {hint}")
    passed(EX_BUCKETS, "each bucket goes when its backward is done and the link is free.")


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
