"""Exercise 12.3 of lesson 12, reading a log of per-group gradient norms.

The learner returns, per step, the global norm (the groups' squares add up),
the steps of a spike (a global norm above `spike_factor` times the median of
all earlier steps) and the groups whose norm is exactly 0.0 at every step.

The check reads the lesson's log and six more, each built so that a rule a
learner might write in place of the stated one gives a different answer on
it: the step before, the mean, a trimmed mean or a short rolling median in
place of the median of all earlier steps; the whole log's median; a median
one step short; a rule that starts at step 2; "at least" in place of
"exceeds"; a tolerance or one zero step in place of "exactly 0.0 at every
step"; then ten logs generated with a fixed seed (spikes on consecutive steps,
jumps below the factor, groups far below any threshold). A hint names a rule
only when that rule gives the learner's answer on every log; otherwise it says
which step is missing or is no spike, and by what ratio.
"""
from __future__ import annotations

import numpy as np

from ._core import ExerciseError, attempt, passed

EX_NORMS = "12.3 (summarize_norms)"
FACTOR = 10.0


def summarize_norms_reference(group_norms, spike_factor=FACTOR):
    """(global norm per step, spike steps, groups exactly zero at every step)."""
    per_group = np.array([np.asarray(v, dtype=np.float64) for v in group_norms.values()])
    total = np.sqrt(np.sum(per_group ** 2, axis=0))
    spikes = [t for t in range(1, total.size)
              if total[t] > spike_factor * float(np.median(total[:t]))]
    frozen = sorted(k for k, v in group_norms.items() if np.all(np.asarray(v) == 0.0))
    return total, spikes, frozen


# --------------------------------------------------------------- the logs
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
    zero at its first step only, `vanishing` 1e-12 and falling (tiny, never zero: within
    np.allclose's default tolerance of 0)."""
    steps = np.arange(30)
    return {"embed": list(0.97 ** steps), "adapter": [0.0] * 30,
            "late": [0.0 if t == 29 else 0.002 for t in steps],
            "early": [0.0 if t == 0 else 0.002 for t in steps],
            "vanishing": list(1e-12 * 0.9 ** steps)}


def early_spike_log():
    """12 steps in whole numbers (3-4-5 triangles, so every global norm is exact): a spike
    at step 1, whose only earlier step is step 0; a second at step 3, which clears the
    median of steps 0-2 but not of steps 0-1 or 1-2; a third at step 4, which clears the
    median of steps 0-3 but not of steps 1-4; at step 8 a norm of exactly 10 times the
    median before it, which does not exceed it."""
    pairs = {1: (60, 80), 3: (36, 48), 4: (240, 320), 8: (30, 40)}  # norms 100, 60, 400, 50
    embed, block = zip(*(pairs.get(t, (3, 4)) for t in range(12)))   # else 5
    return {"embed": [float(v) for v in embed], "block": [float(v) for v in block]}


def falling_log():
    """50 steps: a large first step (the untrained model), then norms near 1 until step 23,
    then 20 times smaller (the loss has settled). Step 2's norm of 15 is not 10 times the
    median of steps 0-1 (3.5), though it is of step 1 alone. Step 45's norm of 8 is eight
    times the median of all earlier steps (the large ones are the majority), so no spike;
    the mean, a trimmed mean and the median of the last 2-43 steps all fall below 0.8 and
    flag it."""
    steps = np.arange(50)
    level = np.where(steps < 24, 1.0 + 0.01 * np.sin(steps), 0.05)
    level[[0, 2, 45]] = 6.0, 15.0, 8.0
    return {"embed": list(0.6 * level), "block": list(0.8 * level)}


def long_run_log():
    """20 steps: six quiet ones, then fourteen 30 times larger. The first six large steps
    are spikes; from step 12 on, the large steps are half of all earlier ones and their
    median has risen to meet them. A median that leaves earlier spikes out never rises."""
    steps = np.arange(20)
    level = np.where(steps < 6, 1.0, 30.0) * (1.0 + 0.01 * np.cos(steps))
    return {"embed": list(0.6 * level), "block": list(0.8 * level)}


def generated_norm_logs(count: int = 10, seed: int = 1203):
    """(what, log) for `count` logs drawn with a fixed seed: a slowly wandering norm with
    spikes of 12-60x (some on two consecutive steps), jumps of 3-9x that are no spikes,
    quiet steps, and groups that are cut (zero at every step), tiny (1e-20 to 1e-35, far
    below any threshold, never zero) or zero on a few steps only."""
    rng = np.random.default_rng(seed)
    logs = []
    for k in range(count):
        steps = int(rng.integers(8, 41))
        level = np.exp(np.cumsum(rng.normal(0.0, 0.05, size=steps)))
        for t in rng.choice(np.arange(1, steps), size=3, replace=False):
            level[t:t + 1 + int(rng.integers(0, 2))] *= rng.uniform(12.0, 60.0)
        for t in rng.choice(np.arange(1, steps), size=2, replace=False):
            level[t] *= rng.uniform(3.0, 9.0) if rng.random() < 0.7 else 0.01
        log = {"embed": list(0.6 * level), "block": list(0.8 * level)}
        if k % 2 == 0:
            log["cut"] = [0.0] * steps
        if k % 3 == 0:
            log["tiny"] = list(10.0 ** rng.uniform(-35.0, -20.0) * level)
        if k % 3 == 1:
            blinks = set(rng.choice(steps, size=2, replace=False).tolist())
            log["blinking"] = [0.0 if t in blinks else 0.004 for t in range(steps)]
        logs.append((f"generated log {k + 1} of {count} ({steps} steps, seed {seed})", log))
    return logs


NORM_LOGS = (("the example log", norm_log_example),
             ("a log with a second spike two steps after the first", second_spike_log),
             ("a log whose norms grow 5% a step (a warm-up)", warm_up_log),
             ("a log with groups zero only at their first or last step, or tiny",
              late_zero_log),
             ("a log with a spike at step 1 and a step of exactly 10 times the median",
              early_spike_log),
             ("a log whose norms fall twentyfold after step 23", falling_log),
             ("a log with a long run of large steps after six quiet ones", long_run_log))


def all_norm_logs():
    """(what, log) of every log the check reads: the lesson's, then the generated ones."""
    return [(what, make()) for what, make in NORM_LOGS] + generated_norm_logs()


# --------------------------------------------------------------- the hints
def _trimmed_mean(values, share):
    cut = int(share * len(values))
    kept = np.sort(values)[cut:len(values) - cut]
    return float(np.mean(kept)) if kept.size else float("nan")


def _median_variant_rules(total, factor, flagged):
    """The rules of a yardstick that is almost the median of all earlier steps: its lower
    or upper middle value, the median of the squares, the median without the earlier
    spikes. `flagged(yardstick)` gives the steps a yardstick flags."""
    steps = range(1, total.size)

    def low_or_high(t, pick):
        ordered = np.sort(total[:t])
        return float(ordered[(t - 1) // 2] if pick == "low" else ordered[t // 2])

    seen = []                                       # the spikes it has flagged so far

    def without_spikes(t):                          # called for t = 1, 2, ... in order
        kept = [total[u] for u in range(t) if u not in seen]
        yardstick = float(np.median(kept)) if kept else float("nan")
        if total[t] > factor * yardstick:
            seen.append(t)
        return yardstick

    squares = total ** 2
    return [
        (flagged(lambda t: low_or_high(t, "low")),
         "your median is the lower of the two middle values (median_low) where the earlier "
         "steps are even in number; the median of an even count is the mean of the two."),
        (flagged(lambda t: low_or_high(t, "high")),
         "your median is the upper of the two middle values where the earlier steps are even "
         "in number; the median of an even count is the mean of the two."),
        ([t for t in steps if squares[t] > factor * float(np.median(squares[:t]))],
         "your test compares squared norms with spike_factor times their median: a step "
         "only sqrt(spike_factor) times the median then passes for a spike. Compare the "
         "norms themselves."),
        (flagged(without_spikes),
         "your median leaves the earlier spikes out: after a long run of large steps, the "
         "rule's median of all earlier steps rises to meet them and they stop being spikes, "
         "while yours keeps flagging them."),
    ]


def _spike_rules(total, factor):
    """(spike steps under the rule, what is wrong with it) for the rules learners write in
    place of "above factor times the median of all earlier steps"."""
    steps = range(1, total.size)

    def flagged(yardstick, start=1, strict=True):
        out = []
        for t in range(start, total.size):
            limit = factor * yardstick(t)
            if total[t] > limit or (not strict and total[t] == limit):
                out.append(t)
        return out

    def median(lo, hi):
        return float(np.median(total[lo:hi])) if hi > lo else float("nan")

    rules = _median_variant_rules(total, factor, flagged) + [
        (flagged(lambda t: median(0, t), start=2),
         "your rule starts at step 2, but step 1 has an earlier step, step 0, to compare with: "
         "start at t = 1."),
        (flagged(lambda t: median(0, t), strict=False),
         "your rule flags a norm of exactly spike_factor times the median; a spike *exceeds* "
         "it (> , not >=)."),
        (flagged(lambda t: median(0, t - 1)),
         "your median leaves out step t-1, the step just before: use every step from 0 to "
         "t-1."),
        (flagged(lambda t: median(1, t)),
         "your median leaves out step 0: use every step from 0 to t-1."),
        (flagged(lambda t: median(0, t + 1)),
         "that median includes step t itself; compare with the median of the steps before it "
         "only."),
        ([t for t in steps if total[t] > factor * float(np.median(total))],
         "that compares with the median of the whole log, later steps included. A monitor "
         "reads the log while the run trains and cannot see the future: at step t use only "
         "steps 0 to t-1 (here the later, larger norms hide an early spike)."),
    ]
    for window in range(2, 44):
        rules.append((flagged(lambda t, w=window: median(max(0, t - w), t)),
                      "that is the median of a rolling window, the last few steps only. The "
                      "rule takes the median of *all* earlier steps: after the norms fall, a "
                      "window forgets the long run and flags a step the rule does not."))
    rules.append((flagged(lambda t: float(np.mean(total[:t]))),
                  "that is the mean of the earlier steps, not their median: one spike lifts "
                  "the mean, and many quiet steps pull it down; the median of the earlier "
                  "steps is their middle value and stays put."))
    for share in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4):
        rules.append((flagged(lambda t, s=share: _trimmed_mean(total[:t], s)),
                      "that is a trimmed mean of the earlier steps: it drops the extremes but "
                      "still averages what it keeps, so a long quiet stretch pulls it down. "
                      "The rule takes the median, the middle value."))
    rules.append((flagged(lambda t: float(total[t - 1])),
                  "that compares each step with the step before it: an ordinary step after a "
                  "quiet one (step 21 of the example log follows the small batch of step 20) "
                  "looks like a spike. Compare each step with the median of all the steps "
                  "before it, which one odd step does not move."))
    return rules


def _spike_hint(spikes, want, total, factor, elsewhere=()):
    """Name the rule behind `spikes` (the learner's, where `want` is right): a rule that
    gives `spikes` here and gives the learner's answers on every other log (`elsewhere`,
    their (spikes, global norms)). Where no rule does, the hint says where the answer
    differs instead."""
    here = _spike_rules(total, factor)
    matches = [k for k, (rule, _) in enumerate(here) if spikes == rule != want]
    for their_spikes, their_total in elsewhere:
        if not matches:
            break
        there = _spike_rules(their_total, factor)
        matches = [k for k in matches if there[k][0] == their_spikes]
    if len({here[k][1] for k in matches}) == 1:
        return here[matches[0]][1]
    if spikes in ([t - 1 for t in want], [t + 1 for t in want]):
        return "name the step whose own norm jumped (its index in the log)."
    if 0 in spikes:
        return "step 0 has no earlier steps to compare with: start at step 1."
    missed = [t for t in want if t not in spikes]
    if missed:
        t = missed[0]
        return (f"step {t} is missing: its global norm is "
                f"{total[t] / np.median(total[:t]):.4g} times the median of the steps before "
                f"it, and that exceeds spike_factor.")
    t = next(t for t in spikes if t not in want)
    return (f"step {t} is no spike: its global norm is {total[t] / np.median(total[:t]):.4g} "
            f"times the median of all the steps before it, which does not exceed "
            f"spike_factor.")


def _spikes_elsewhere(summarize_norms, what):
    """(spikes, reference global norms) of the learner's answer on the other logs, where
    it runs and gives a list of steps: the evidence that names the rule it follows."""
    found = []
    for other, log in all_norm_logs():
        if other == what:
            continue
        try:
            _, spikes, _ = summarize_norms({k: list(v) for k, v in log.items()}, FACTOR)
            found.append((sorted(int(t) for t in spikes),
                          summarize_norms_reference(log, FACTOR)[0]))
        except Exception:       # the learner's code; its failure here is not the question
            continue
    return found


def _frozen_hint(frozen, want, log):
    for name in frozen:
        if name in want or name not in log:
            continue
        norms = np.asarray(log[name], dtype=np.float64)
        zeros = [int(t) for t in np.flatnonzero(norms == 0.0)]
        if not zeros:
            return (f"'{name}' has tiny norms ({norms.max():.0e}), not zero ones: a converged "
                    f"or slow group. A cut graph gives exactly 0.0; compare with == 0, not "
                    f"with a tolerance (np.allclose and np.isclose have one).")
        where = "its last step" if zeros == [norms.size - 1] else (
            "its first step" if zeros == [0] else f"step {zeros[0]}" if len(zeros) == 1
            else f"steps {zeros}")
        return (f"'{name}' is zero at {where} only (there its gradient happened to "
                f"vanish); a frozen group is zero at every step, so test every entry.")
    missing = [name for name in want if name not in frozen]
    if missing:
        return f"'{missing[0]}' is 0.0 at every step: its gradient never arrives."
    return "give each frozen group once, by the name it has in the log."


def _global_hint(total, want, log):
    """What a wrong global norm is, or where it is off."""
    groups = np.array([np.asarray(v, dtype=np.float64) for v in log.values()])
    known = ((groups.sum(axis=0), "that is the sum of the groups' norms; the groups split one "
                                  "gradient vector, so their *squares* add up."),
             ((groups ** 2).sum(axis=0), "that is the squared norm: one step is missing."),
             (np.sqrt((groups ** 2).mean(axis=0)), "that divides by the number of groups: "
                                                   "the global norm is not an average."),
             (groups.max(axis=0), "that is the largest group's norm, not the norm of all "
                                  "groups together."))
    for values, hint in known:
        if np.allclose(total, values, rtol=1e-6):
            return hint
    err = np.abs(total - want) / np.maximum(np.abs(want), 1e-300)
    t = int(np.argmax(err))
    if err[t] < 1e-2:
        return (f"it agrees to only {-np.log10(err[t]):.0f} digits (step {t}: {total[t]!r} "
                f"against {want[t]!r}): the sums were done in a precision lower than float32; "
                f"compute in float64.")
    return f"step {t} is the first to look at: {total[t]:.8g} against {want[t]:.8g}."


def _check_norm_log(summarize_norms, what, log):
    got = attempt(EX_NORMS, summarize_norms, {k: list(v) for k, v in log.items()}, FACTOR)
    if not (isinstance(got, tuple) and len(got) == 3):
        raise ExerciseError(EX_NORMS, f"return three things (global norms per step, spike "
                                      f"steps, frozen groups), got {type(got).__name__}.")
    total, spikes, frozen = got
    want_total, want_spikes, want_frozen = summarize_norms_reference(log, FACTOR)
    try:
        total = np.asarray(total, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ExerciseError(EX_NORMS, f"give the global norms as one number per step, got "
                                      f"{type(total).__name__}.") from None
    if total.shape != want_total.shape:
        raise ExerciseError(EX_NORMS, f"one global norm per step: {want_total.size} steps in "
                                      f"{what}, got {total.size} numbers.")
    # float32 sums agree to about 7 digits, and a float32 answer is as right as a float64 one
    if not np.allclose(total, want_total, rtol=2e-6, atol=0.0):
        raise ExerciseError(EX_NORMS, f"in {what}, the global norms are off: "
                                      f"{_global_hint(total, want_total, log)}")
    try:
        spikes = sorted(int(t) for t in spikes)
    except (TypeError, ValueError):
        raise ExerciseError(EX_NORMS, f"give the spikes as a list of step numbers, got "
                                      f"{spikes!r}") from None
    if spikes != want_spikes:
        hint = _spike_hint(spikes, want_spikes, want_total, FACTOR,
                           _spikes_elsewhere(summarize_norms, what))
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
    logs = all_norm_logs()
    (spikes, frozen), *_ = [_check_norm_log(summarize_norms, what, log) for what, log in logs]
    generated = len(logs) - len(NORM_LOGS)
    passed(EX_NORMS, f"global norms right; spike at step {spikes[0]}; frozen: "
                     f"{', '.join(frozen)}; and right on {len(NORM_LOGS) - 1} more logs (a "
                     f"second spike, a warm-up, groups zero at one end only or tiny, a spike "
                     f"at step 1 and a tie, norms that fall, a long run of large steps) and "
                     f"on {generated} generated ones (spikes on consecutive steps, jumps "
                     f"below the factor, groups far below any threshold).")
