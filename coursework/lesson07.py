"""Checks for lesson 07, "The training-step budget".

07.1 the FLOPs of a training step per token, 07.2 the bytes per parameter
of the fixed memory, 07.3 the micro-batch at which activations overtake
the fixed memory, 07.4 the floor of a step's time and the MFU a measured step
reached, 07.5 the bytes alive in a Hugging Face step at the loss's backward. Each
is checked against `engine.budget` (the numbers the
widget and the command line show) on several configurations, and the usual
slips (forward only, no attention term, no master weights, an off-by-one
search) are named.
"""
from __future__ import annotations

import math

import numpy as np

from . import _core
from ._cases import Case, Slip, compare_over_cases, raise_first_difference
from ._core import ExerciseError, attempt, passed

EX_FLOPS = "07.1 (training_flops_per_token)"
EX_BYTES = "07.2 (fixed_bytes_per_parameter)"
EX_CROSS = "07.3 (find_crossover_batch)"


def _number(exercise: str, value, what: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ExerciseError(exercise, f"{what} should be a number, got {value!r}.") from None


# ------------------------------------------------------------------ 07.1
def _flops_configs():
    """The story's models, then four seeded random small GPTs."""
    from engine import budget as bm
    rng = np.random.default_rng(71)
    generated = []
    for i in range(4):
        H = int(rng.integers(1, 5))
        generated.append(bm.BudgetConfig(
            n_layer=int(rng.integers(1, 13)), d_model=16 * H * int(rng.integers(1, 9)),
            n_head=H, vocab_size=int(rng.integers(50, 2000)),
            seq_len=int(rng.choice([64, 256, 1000, 2048])), name=f"random GPT {i + 1}"))
    return [bm.preset("gpt2-small"), bm.preset("7b-class"), bm.preset("tiny"),
            bm.BudgetConfig(n_layer=2, d_model=64, n_head=2, vocab_size=50, seq_len=256)
            ] + generated


def _flops_cases() -> list[Case]:
    from engine import budget as bm
    cases = []
    for cfg in _flops_configs():
        args = (bm.matmul_weights(cfg), cfg.n_layer, cfg.seq_len, cfg.d_model)
        cases.append(Case(args, "for P={:,}, L={}, N={}, d={}".format(*args)))
    return cases


def _full_attention(P, L, N, d) -> float:
    """engine.budget's count: 2 per weight and the full N x N attention (4*N*d per layer)
    forward, twice that backward."""
    return 3 * (2 * P + 4 * L * N * d)


def _causal_half(P, L, N, d) -> float:
    """The same with the causal half of attention, 2*N*d per layer forward."""
    return 3 * (2 * P + 2 * L * N * d)


def _flops_slips() -> list[Slip]:
    """The usual miscounts, under either convention for attention (`per_layer` = 4 or 2)."""
    slips = []
    for per_layer in (4, 2):
        def fwd(P, L, N, d, per_layer=per_layer):
            return 2 * P + per_layer * L * N * d
        slips += [
            Slip(fwd, "that is the forward pass only; the backward costs two more forwards."),
            Slip(lambda P, L, N, d, fwd=fwd: 2 * fwd(P, L, N, d),
                 "the backward is two matmuls per forward matmul (dX and dW): 2x the forward, "
                 "so the step is 3x, not 2x."),
            Slip(lambda P, L, N, d, p=per_layer: 6 * P + p * L * N * d,
                 "the attention term also has a backward (2x): it counts three times in a "
                 "step, as the weights' term does."),
            Slip(lambda P, L, N, d, fwd=fwd: 4 * fwd(P, L, N, d),
                 "that is a step with recompute (an extra forward); without recompute it is "
                 "forward + 2 x forward."),
        ]
    slips.insert(0, Slip(lambda P, L, N, d: 6 * P,
                         "6 per weight is right for the matmuls, but attention's Q @ K^T and "
                         "P @ V have no weights: a count by weights leaves them out."))
    return slips


def _close_count(got, want) -> bool:
    return abs(float(got) - float(want)) <= 1e-9 * max(abs(float(want)), 1.0)


def _flops_apart(got: float, want: float, case: Case) -> str:
    return (f"you have {got:.6g} FLOPs per token, engine.budget says {want:.6g} (yours is "
            f"{got / want:.4g} times it)")


def check_training_flops(training_flops_per_token) -> None:
    """training_flops_per_token(matmul_weights, n_layer, seq_len, d_model):
    forward (2 per weight + attention) plus backward (2x forward). A kernel that skips the
    masked upper triangle does half of attention's work (each query meets N/2 keys on
    average): that count is right too, as long as every case uses it."""
    from engine import budget as bm
    cases = _flops_cases()
    answers = [_number(EX_FLOPS, attempt(EX_FLOPS, training_flops_per_token, *case.args),
                       "training_flops_per_token(...)") for case in cases]
    full = [_close_count(a, _full_attention(*c.args)) for a, c in zip(answers, cases)]
    half = [_close_count(a, _causal_half(*c.args)) for a, c in zip(answers, cases)]
    if all(full) or all(half):
        g = bm.preset("gpt2-small")
        P, L, N, d = bm.matmul_weights(g), g.n_layer, g.seq_len, g.d_model
        if all(half):
            passed(EX_FLOPS, f"you count the causal half of attention (2*N*d per layer "
                             f"forward: each query meets N/2 keys on average), right for a "
                             f"kernel that skips the masked half, as lesson 13's trainer does. "
                             f"engine.budget counts the full N x N (4*N*d) that our tape "
                             f"engine computes before masking. GPT-2 small at N={N}: "
                             f"{bm.human_flops(_causal_half(P, L, N, d))} per token your way, "
                             f"{bm.human_flops(bm.flops(g)['per_token']['total'])} "
                             f"engine.budget's.")
        else:
            passed(EX_FLOPS, f"GPT-2 small at N={g.seq_len}: "
                             f"{bm.human_flops(bm.flops(g)['per_token']['total'])} per token.")
        return
    if all(f or h for f, h in zip(full, half)):
        raise ExerciseError(EX_FLOPS, "your count of attention changes from one configuration "
                                      "to the next (the full N x N on some, the causal half on "
                                      "others). Hint: pick one convention, 4*N*d per layer "
                                      "(what engine.budget counts) or 2*N*d (the causal half).")
    raise_first_difference(EX_FLOPS, cases, answers,
                           [_full_attention(*case.args) for case in cases],
                           slips=_flops_slips(), same=_close_count, difference=_flops_apart)


# ------------------------------------------------------------------ 07.2
def check_fixed_bytes_per_parameter(fixed_bytes_per_parameter) -> None:
    """fixed_bytes_per_parameter(precision, optimizer) = weights + master
    weights + gradients + optimizer state, in bytes per parameter."""
    from engine import budget as bm
    for precision in bm.PRECISIONS:
        for optimizer in bm.OPTIMIZERS:
            parts = bm.bytes_per_parameter(precision, optimizer)
            want = sum(parts.values())
            got = _number(EX_BYTES, attempt(EX_BYTES, fixed_bytes_per_parameter, precision,
                                            optimizer), "fixed_bytes_per_parameter(...)")
            if got == want:
                continue
            hint = _diagnose_bytes(fixed_bytes_per_parameter, precision, optimizer)
            raise ExerciseError(EX_BYTES, f"{precision} + {optimizer}: you say {got:g} bytes "
                                          f"per parameter, expected {want} (yours is "
                                          f"{got - want:+g} bytes off)."
                                          + (f" Hint: {hint}" if hint else ""))
    passed(EX_BYTES, "mixed-precision AdamW: 16 bytes per parameter "
                     f"({' + '.join(str(v) for v in bm.bytes_per_parameter('bf16', 'adamw').values())}).")


#: Typical slips in 07.2, each a rule giving bytes per parameter from (storage bytes,
#: master-copy bytes, number of optimizer buffers), with the hint it deserves.
_BYTES_SLIPS = [
    (lambda st, ma, nb: st + st + 4 * nb,
     "you left out the fp32 master copy of the weights (4 bytes in 16-bit training): without "
     "it, updates too small for bf16 vanish."),
    (lambda st, ma, nb: st + ma + 4 * nb,
     "you left out the gradient buffer: the backward writes one gradient per parameter, in the "
     "storage precision."),
    (lambda st, ma, nb: st + ma + st + st * nb,
     "you keep the optimizer state in the storage precision; it is kept in fp32 (4 bytes per "
     "buffer) whatever the weights are stored in."),
    (lambda st, ma, nb: ma + st + 4 * nb,
     "count the weights themselves, in the storage precision."),
    (lambda st, ma, nb: st + ma + 4 + 4 * nb,
     "you count an fp32 gradient (4 bytes). Many mixed-precision setups do accumulate "
     "gradients in fp32, and then mixed-precision AdamW costs 18 bytes per parameter; this "
     "exercise, engine.budget and the source texts count the gradient in the storage "
     "precision (2 bytes in bf16), the 16 of the lesson."),
]


def _diagnose_bytes(fixed_bytes_per_parameter, precision, optimizer) -> str | None:
    """The hint of the slip that explains the learner's answers on *every* combination, so
    two slips that give the same number on one combination are told apart by the others;
    None when no slip does."""
    from engine import budget as bm
    answers = {}
    for p in bm.PRECISIONS:
        for o in bm.OPTIMIZERS:
            try:
                answers[p, o] = float(fixed_bytes_per_parameter(p, o))
            except Exception:  # the learner's code; a failure elsewhere just rules slips out
                answers[p, o] = None

    def rule_args(p, o):
        parts = bm.bytes_per_parameter(p, o)
        return bm.STORAGE_BYTES[p], parts["master weights"], bm.OPTIMIZER_BUFFERS[o]

    for rule, hint in _BYTES_SLIPS:
        if all(answers[k] == rule(*rule_args(*k)) for k in answers):
            return hint
    for rule, hint in _BYTES_SLIPS:  # right on some combinations, this slip on the others
        if answers[precision, optimizer] == rule(*rule_args(precision, optimizer)) and all(
                answers[k] in (rule(*rule_args(*k)), sum(bm.bytes_per_parameter(*k).values()))
                for k in answers):
            return hint
    return None


# ------------------------------------------------------------------ 07.3
def _first_exceeding(cfg, threshold: int, which: str, limit: int = 1 << 20):
    """The first micro-batch whose activations (`which`: 'saved' or 'peak')
    exceed `threshold`, by bisection; the answers of typical slips."""
    from engine import budget as bm

    def over(b: int) -> bool:
        return getattr(bm.activations(cfg.with_(micro_batch=b)), which) > threshold

    if not over(limit):
        return None
    lo, hi = 0, limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if over(mid) else (mid, hi)
    return hi


def _crossover_cases():
    from engine import budget as bm
    return [bm.preset("gpt2-small", seq_len=128), bm.preset("gpt2-small", recompute="full"),
            bm.preset("24-layer-example", seq_len=256), bm.preset("7b-class", seq_len=512),
            bm.preset("tiny", micro_batch=1),
            # with full recompute the peak (saved + one block rebuilt) is well above what the
            # forward saves, so a search on `.saved` gives another answer here (30, not 9)
            bm.preset("tiny", recompute="full"),
            # four sequences' activations equal the fixed memory to the byte: B=4 does not
            # exceed it, so a search with >= stops one batch early
            bm.BudgetConfig(n_layer=2, d_model=64, n_head=2, vocab_size=420, seq_len=64,
                            activation_model="rule", tensors_per_layer=16, name="exact-tie"),
            # one sequence of 4096 tokens already exceeds a small model's fixed memory: a
            # search that starts at B=2 misses it
            bm.BudgetConfig(n_layer=2, d_model=64, n_head=2, vocab_size=50, seq_len=4096,
                            name="long-sequence")] + _generated_crossover_cases()


def _generated_crossover_cases():
    """Seeded random GPT-2 small steps: other sequence lengths, precisions and recompute."""
    from engine import budget as bm
    rng = np.random.default_rng(73)
    return [bm.preset("gpt2-small", seq_len=int(rng.choice([64, 192, 384, 768])),
                      precision=str(rng.choice(["fp32", "bf16"])),
                      recompute=str(rng.choice(["none", "full"]))) for _ in range(3)]


def _fixed_without(b, part: str) -> int:
    return b.fixed_total - b.fixed[part]


def check_crossover_batch(find_crossover_batch) -> None:
    """find_crossover_batch(cfg) = the smallest micro-batch B whose
    activation peak exceeds weights + master + gradients + optimizer state."""
    from engine import budget as bm
    for cfg in _crossover_cases():
        want = bm.crossover_batch(cfg)
        got = attempt(EX_CROSS, find_crossover_batch, cfg)
        if got is not None:
            got = int(_number(EX_CROSS, got, "find_crossover_batch(cfg)"))
        if got == want:
            continue
        b = bm.budget(cfg)
        fixed = b.fixed_total
        missing = [part for part, size in b.fixed.items()   # parts of equal size tie
                   if size and got == _first_exceeding(cfg, _fixed_without(b, part), "peak")]
        if want == 1 and got is not None and got > 1:
            hint = (f"here a single sequence already exceeds the fixed memory, so the answer "
                    f"is B=1; your search never looks at B=1.")
        elif want is not None and got == want - 1 and got >= 1 and \
                bm.activations(cfg.with_(micro_batch=got)).peak == fixed:
            hint = (f"at B={got} the activation peak equals the fixed memory to the byte; "
                    f"equal is not larger (the question is the first B that *exceeds* it).")
        elif want is not None and got == want - 1:
            hint = (f"B={got} is the last batch where the activations still fit under the "
                    f"fixed memory; the question is the first one that exceeds it.")
        elif got == _first_exceeding(cfg, b.fixed["weights"], "peak"):
            hint = ("you compared with the weights alone; the fixed memory is weights + "
                    "master weights + gradients + optimizer state (Budget.fixed_total).")
        elif missing:
            which = " or the ".join(missing) + (" (the same size here)" if missing[1:] else "")
            hint = (f"your fixed memory leaves out the {which}; the fixed memory is "
                    f"everything in Budget.fixed (Budget.fixed_total).")
        elif got == _first_exceeding(cfg, fixed, "saved"):
            hint = ("compare the activation *peak* (saved + what recompute rebuilds for one "
                    "block), not only what is saved.")
        elif want is not None and got is not None and got > want and got & (got - 1) == 0 \
                and got // 2 < want:
            hint = (f"B={got} is the first power of two that is over, but so is B={want}: "
                    f"after doubling, search between the last B that was not over and the "
                    f"first that was.")
        else:
            hint = None
        raise ExerciseError(EX_CROSS, f"for {cfg.name} (N={cfg.seq_len}, recompute "
                                      f"{cfg.recompute}) you say B={got}, expected B={want} "
                                      f"(fixed memory {bm.human_bytes(fixed)})."
                                      + (f" Hint: {hint}" if hint else ""))
    first = _crossover_cases()[0]
    passed(EX_CROSS, f"GPT-2 small at N={first.seq_len}: activations overtake the fixed memory "
                     f"at B={bm.crossover_batch(first)}.")


# ------------------------------------------------------------------ 07.4
EX_STEP = "07.4 (step_floor_and_mfu)"


def check_step_floor_and_mfu(step_floor_and_mfu) -> None:
    """step_floor_and_mfu(step_flops, device_flops, measured_seconds) -> (the fastest the
    step could run on that device, in seconds; the fraction of it the measured step reached)."""
    # (FLOPs of a step, the device's dense FLOP/s, a measured step in seconds)
    rng = np.random.default_rng(74)
    cases = [(1.2e12, 1.0e11, 40.0), (6.0e9, 2.0e11, 0.3), (3.12e17, 3.12e14, 2500.0)] + [
        (float(10 ** rng.uniform(8, 18)), float(10 ** rng.uniform(10, 15)), 0.0)
        for _ in range(4)]
    # each generated step is measured 1.2 to 16 times slower than its floor (MFU 0.06-0.8)
    slower = iter([1.2, 1.8, 4.0, 15.0])
    cases = [(f, r, m or f / r * next(slower) * float(rng.uniform(1.0, 1.05)))
             for f, r, m in cases]
    for step_flops, device_flops, measured in cases:
        got = attempt(EX_STEP, step_floor_and_mfu, step_flops, device_flops, measured)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise ExerciseError(EX_STEP, f"return the pair (floor_seconds, mfu), got {got!r}.")
        floor = _number(EX_STEP, got[0], "the floor")
        mfu = _number(EX_STEP, got[1], "the MFU")
        want_floor = step_flops / device_flops
        want_mfu = want_floor / measured
        where = (f"for {step_flops:.3g} FLOPs per step on a device of {device_flops:.3g} "
                 f"FLOP/s, measured {measured:g} s per step")
        if not math.isclose(floor, want_floor, rel_tol=1e-9):
            if math.isclose(floor, device_flops / step_flops, rel_tol=1e-9):
                hint = "seconds are FLOPs divided by FLOP/s, not the other way round."
            elif math.isclose(floor, 1e3 * want_floor, rel_tol=1e-9):
                hint = "give the floor in seconds, not milliseconds."
            elif math.isclose(floor, measured, rel_tol=1e-9):
                hint = ("the floor is a prediction from the FLOP count alone, the step at the "
                        "device's full rate; the measured time is the other half of the story.")
            else:
                hint = _scaling_hint(step_floor_and_mfu, (step_flops, device_flops, measured),
                                     0, "floor", (2.0, 0.5, 1.0))
            raise ExerciseError(EX_STEP, f"{where}, your floor is {floor:.4g} s, expected "
                                         f"{want_floor:.4g} s. Hint: {hint}")
        if not math.isclose(mfu, want_mfu, rel_tol=1e-9):
            if math.isclose(mfu, 1 / want_mfu, rel_tol=1e-9):
                hint = ("yours is the inverse: an MFU is at most 1, the share of the device's "
                        "rate the step reached (a step can be slower than the floor, never "
                        "faster).")
            elif math.isclose(mfu, 100 * want_mfu, rel_tol=1e-9):
                hint = "give the MFU as a fraction between 0 and 1, not a percentage."
            else:
                hint = _scaling_hint(step_floor_and_mfu, (step_flops, device_flops, measured),
                                     1, "MFU", (2.0, 0.5, 0.5))
            raise ExerciseError(EX_STEP, f"{where}, your MFU is {mfu:.4g}, expected "
                                         f"{want_mfu:.4g}. Hint: {hint}")
    passed(EX_STEP, "a step of 1.2 TFLOP on a 100 GFLOP/s device takes at least 12 s; "
                    "measured at 40 s, it ran at MFU 0.30.")


_ARGUMENTS = ("the step's FLOPs", "the device's FLOP/s", "the measured time")


def _scaling_hint(fn, args, index: int, name: str, ratios) -> str:
    """Which argument the learner's `name` (entry `index` of the pair) follows wrongly:
    doubling each argument alone must scale it by `ratios`; else a constant factor is off."""
    base = _number(EX_STEP, attempt(EX_STEP, fn, *args)[index], f"the {name}")
    for k, want in enumerate(ratios):
        doubled = list(args)
        doubled[k] *= 2.0
        value = _number(EX_STEP, attempt(EX_STEP, fn, *doubled)[index], f"the {name}")
        got = value / base if base else float("nan")
        if not math.isclose(got, want, rel_tol=1e-6):
            change = {2.0: "double", 0.5: "halve", 1.0: "stay the same"}[want]
            return (f"doubling {_ARGUMENTS[k]} changes your {name} by a factor of {got:.4g}, "
                    f"where it must {change}. Let the units say which quantity divides which.")
    want = args[0] / args[1] if index == 0 else args[0] / args[1] / args[2]
    return (f"your {name} follows every argument the right way but is {base / want:.4g} times "
            f"the right value: a constant factor crept in (a unit, or a count of FLOPs that "
            f"the step's FLOPs already include).")


# ------------------------------------------------------------------ 07.5
EX_LOSS = "07.5 (loss_peak)"


def _loss_configs():
    """Steps of transformers' GPT-2 and LLaMA, fp32 and bf16 autocast, whose peak is the
    loss's backward: the story's four, then seeded random micro-batches, sequence lengths
    and precisions of GPT-2 small."""
    from engine import budget as bm
    llama = dict(architecture="llama", n_layer=4, d_model=512, n_head=8, n_kv_head=2,
                 d_ff=1408, vocab_size=32000, tied_embedding=False, block_size=0)
    story = [bm.preset("gpt2-small", activation_model="hf", precision="fp32"),
             bm.preset("gpt2-small", activation_model="hf", precision="bf16",
                       attention="flash"),
             bm.preset("gpt2-medium", activation_model="hf", precision="bf16", micro_batch=2),
             bm.preset("tiny", activation_model="hf", precision="bf16", attention="flash",
                       micro_batch=4, seq_len=2048, **llama)]
    rng = np.random.default_rng(75)
    generated = [bm.preset("gpt2-small", activation_model="hf",
                           precision=str(rng.choice(["fp32", "bf16"])), attention="flash",
                           micro_batch=int(rng.integers(1, 9)),
                           seq_len=int(rng.choice([128, 256, 512, 1024])))
                 for _ in range(4)]
    return story + generated


def _loss_cases() -> tuple[list[Case], dict]:
    """The cases of 07.5 (the learner's arguments) and, for each, the bytes the budget's
    step holds at the loss's backward."""
    from engine import budget as bm
    cases, wants = [], {}
    for cfg in _loss_configs():
        step = bm.budget(cfg).activations.step
        n, V = cfg.micro_batch * cfg.seq_len, cfg.vocab_size
        moment = next(m for m in step.moments if m.name == "the loss's backward")
        alive = dict(moment.alive)
        resident = alive["weights"] + alive["optimizer state"]
        other = alive["saved by the forward"] - n * V * 4
        args = (n, V, cfg.precision, other, resident)
        cases.append(Case(args, f"for {cfg.name} ({cfg.precision}, n={n:,} tokens, V={V:,})"))
        wants[args] = moment.bytes
    return cases, wants


def _loss_slips() -> list[Slip]:
    """The usual miscounts of the moment, each reproduced from the same arguments."""
    def tensors(count, itemsize=None):
        return lambda n, V, p, o, r: r + o + count * n * V * (
            itemsize(p) if itemsize else 4)

    def one_short(case, got, want):
        n, V = case.args[:2]
        return (f"you are one fp32 [n, V] tensor ({n * V * 4:,} bytes) short: while "
                f"log_softmax's backward runs, count what it reads and what it writes, not "
                f"only what it reads.")

    return [
        Slip(tensors(1), "that is what the loss keeps at the end of the forward (log_softmax's "
                         "output); its backward then allocates more [n, V] tensors while "
                         "that output is still alive."),
        Slip(tensors(2), one_short),
        Slip(tensors(4), "transformers' loss holds no reference to the logits once the "
                         "forward returns (the caller keeps only .loss); a nanoGPT-style "
                         "loop that keeps `logits` would hold one more."),
        Slip(tensors(3, lambda p: 4 if p == "fp32" else 2),
             "under autocast the loss still works in fp32: log_softmax is on autocast's fp32 "
             "list, and transformers calls logits.float() before it."),
        Slip(lambda n, V, p, o, r: 3 * n * V * 4, "the peak is a moment of the whole step: add "
                                                  "what is resident and what the rest of the "
                                                  "forward saved."),
        Slip(lambda n, V, p, o, r: r + o, "you left out the loss's own [n, V] tensors, the "
                                          "largest ones alive at that moment."),
    ]


def _loss_bytes_apart(got: float, want: int, case: Case) -> str:
    """How far a count is from the step's, in bytes and in fp32 [n, V] tensors."""
    n, V = case.args[:2]
    return (f"you have {got:,.0f} bytes, the step holds {want:,} then (yours is "
            f"{got - want:+,.0f} bytes off, {(got - want) / (n * V * 4):+.3g} fp32 [n, V] "
            f"tensors)")


def check_loss_peak(loss_peak) -> None:
    """loss_peak(n_tokens, vocab, precision, other_saved, resident) -> the bytes alive at
    the moment of the loss's backward in a Hugging Face transformers step: what is
    resident (weights, optimizer state), what the forward saved outside the loss, and
    the loss's own [n_tokens, vocab] tensors."""
    from engine import budget as bm
    cases, wants = _loss_cases()
    compare_over_cases(EX_LOSS, loss_peak, lambda *args: wants[args], cases,
                       slips=_loss_slips(), difference=_loss_bytes_apart,
                       read=lambda value, case: _number(EX_LOSS, value, "loss_peak(...)"))
    g = bm.budget(_loss_configs()[1])
    passed(EX_LOSS, f"GPT-2 small, bf16 autocast, B=8 N=1024: three fp32 [8192, 50257] "
                    f"tensors of {bm.human_bytes(8192 * 50257 * 4)} each at the peak, "
                    f"{bm.human_bytes(g.peak)} in all.")


# ------------------------------------------------------------------ the notebook
#: Each exercise function of the lesson, and its exercise.
EXERCISE_FUNCTIONS = {"training_flops_per_token": EX_FLOPS, "fixed_bytes_per_parameter": EX_BYTES,
                      "find_crossover_batch": EX_CROSS, "step_floor_and_mfu": EX_STEP,
                      "loss_peak": EX_LOSS}


def name_unfinished_exercises() -> None:
    """In the notebook, a cell that needs an unfinished exercise of this lesson says which."""
    _core.name_unfinished_exercises(EXERCISE_FUNCTIONS)
