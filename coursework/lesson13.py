"""Checks and helpers for lesson 13, "The fused CPU trainer".

13.1 one training step with its four phases in the right order: zero the
     gradient buffer, the loss (forward), the backward, then, in the
     optimizer phase, the global norm with clipping and the AdamW update.
     The check runs the learner's step and a reference step side by side on
     two copies of a small GPT and names the usual slips: no zero_grad (the
     gradients of earlier steps pile up), zeroing after the backward, no
     clipping, clipping after the update, the norm after clipping returned,
     a backward run twice, phases missing, out of order or opened inside
     one another.

`TRAINER_PIECES` lists the pieces of lessons 10-12 the trainer can run;
`plug_in_pieces()` checks each saved piece in its slot (coursework.slots),
plugs in those that keep the slot's contract and returns a `Trainer` whose
`clip`, `make_optimizer` and `slot_table` say and do whose code runs.
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager

import numpy as np

from ._core import ExerciseError, attempt, passed
from .pieces import piece_for_slot, piece_or_engine, vet_saved_pieces
from .slots import (ADAPTERS, TRAINER_SLOTS, SegmentAdamW, accumulated_gradient, engine_clip,
                    seconds)

EX_STEP = "13.1 (train_step)"

# piece name -> (exercise that saves it, what it replaces in the trainer)
# the pieces this lesson loads further down, where they run: vetted with the slots' pieces
LATER_PIECES = ("checkpoint_peak", "to_bf16")
TRAINER_PIECES = {name: (exercise, role) for name, (exercise, role, _) in TRAINER_SLOTS.items()}


# What makes the engine's version of a slot faster than the plain loop its exercise asked
# for: the gap a learner sees in the timing table, explained.
ENGINE_ADVANTAGE = {
    "bias_gelu_forward": "its exp is made of multiplies and adds, so the loop vectorises "
                         "(lesson 10, \"A third limit: exp\"), where a plain loop calls the "
                         "scalar exp of the C library once per element",
    "softmax_cross_entropy": "it writes a row's exponentials into a scratch row with the same "
                             "vectorised exp and sums them in vector lanes; a running "
                             "`total += exp(...)` keeps the loop, and its exp, scalar",
    "embedding_backward": "it adds into the model's table in place, where the exercise "
                          "returns a fresh (V, C) table, zeroed and then added into the "
                          "model's (two more passes over the table), and the slot sums the "
                          "positions' gradient in numpy",
    "clip_global_norm": "it sums the squares of each tensor in blocks, in vector lanes, in "
                        "one compiled pass",
    "adamw_step": "it runs one parallel loop over the whole flat buffer, and splits each "
                  "block's update into two loops that vectorise; yours is called once per "
                  "parameter tensor (a start of the threads each time), and one loop that "
                  "writes p, m and v while it reads g stays scalar",
    "accumulate": "it runs the same forward and backward, so a gap is the machine's load, or "
                  "a forward run twice: `loss.item()` before `(loss / K).backward()` runs it "
                  "at scale 1, then again at 1/K",
}

# How often a training step of lesson 13 calls each slot (the MLP's GELU runs in the
# forward and again in the backward, per layer); the accumulation loop is not in the step.
CALLS_PER_STEP = {"bias_gelu_forward": lambda cfg: 2 * cfg.n_layer,
                  "softmax_cross_entropy": lambda cfg: 1, "embedding_backward": lambda cfg: 1,
                  "clip_global_norm": lambda cfg: 1, "adamw_step": lambda cfg: 1}


class Trainer:
    """What `plug_in_pieces` assembled: per slot, the learner's function or why not."""

    def __init__(self, pieces: dict, skipped: dict):
        self.pieces, self.skipped = pieces, skipped

    def owner(self, name: str) -> str:
        exercise = TRAINER_SLOTS[name][0]
        if name in self.pieces:
            return f"yours ({exercise})"
        return f"engine's: {self.skipped[name]}"

    @property
    def clip(self):
        """The clipping function the training step is handed."""
        return self.pieces.get("clip_global_norm", engine_clip)

    def make_optimizer(self, model):
        """The learner's AdamW kernel over the model's segments, else the engine's."""
        from engine.trainer.model import decay_segments
        if "adamw_step" in self.pieces:
            return SegmentAdamW(model.params.flat, model.grads.flat,
                                decay_segments(model.params), self.pieces["adamw_step"])
        return FlatAdamW(model)

    def slot_table(self, cfg=None, batch_size: int = 16, train_step_owner: str | None = None,
                   slow_ratio: float = 2.0, timer=seconds) -> list[str]:
        """One line per slot: owner, and with `cfg` your time against the engine's at the
        trainer's shape (`timer(piece, fn, cfg, batch_size)` -> (yours, engine's) seconds);
        a piece slower than `slow_ratio` times the engine's is named."""
        lines, slow = [], []
        for name, (exercise, role, _) in TRAINER_SLOTS.items():
            line = f"{role:>40} ({exercise}): {self.owner(name)}"
            if cfg is not None and name in self.pieces:
                yours, engines = timer(name, self.pieces[name], cfg, batch_size)
                line += (f"; {yours * 1e3:.3g} ms vs the engine's "
                         f"{engines * 1e3:.3g} ms")
                if yours > slow_ratio * engines:
                    slow.append(f"{name} ({yours / engines:.1f}x the engine's time)")
                    line += "\n" + _slower_because(name, yours, engines, cfg)
            lines.append(line)
        if train_step_owner is not None:
            lines.append(f"{'the training step':>40} (13.1): {train_step_owner}")
        if cfg is not None and self.pieces:
            lines.append("slow pieces: " + (", ".join(slow) if slow else
                                            f"none (each within {slow_ratio:g}x the engine's)"))
        return lines


def _slower_because(name: str, yours: float, engines: float, cfg) -> str:
    """The indented lines under a slow piece: why the engine's is faster, what it costs a
    training step, and how to train on the engine's version instead."""
    calls = CALLS_PER_STEP.get(name)
    cost = (f" Per training step ({calls(cfg)} call{'s' if calls(cfg) > 1 else ''}) yours "
            f"adds about {(yours - engines) * calls(cfg) * 1e3:.3g} ms." if calls else "")
    return (f"      the engine's is faster because {ENGINE_ADVANTAGE[name]}.{cost} To train "
            f"on the engine's instead, add \"{name}\" to ENGINE_FOR and run from there again.")


def plug_in_pieces(engine_for=()) -> Trainer:
    """Check every saved trainer piece in its slot and plug in those that pass: kernels
    into the model's registry, clipping and AdamW into `Trainer`. A missing or broken
    piece, or one whose slot is named in `engine_for` (the learner's choice), leaves the
    engine's version in place, and `Trainer.skipped` says why."""
    from engine.trainer.model import reset_kernels, use_kernel
    unknown = sorted(set(engine_for) - set(TRAINER_SLOTS))
    if unknown:
        raise ValueError(f"ENGINE_FOR names {', '.join(map(repr, unknown))}, which is not a "
                         f"slot of the trainer; the slots are "
                         f"{', '.join(map(repr, TRAINER_SLOTS))}.")
    vet_saved_pieces([name for name in (*TRAINER_SLOTS, *LATER_PIECES) if name not in engine_for])
    pieces, skipped = {}, {}
    for name, (exercise, _, kernel) in TRAINER_SLOTS.items():
        if kernel is not None:
            reset_kernels(kernel)
        if name in engine_for:
            skipped[name] = "you chose it (ENGINE_FOR)"
            continue
        fn, why = piece_for_slot(name)
        if fn is None:
            skipped[name] = why
            continue
        pieces[name] = fn
        if kernel is not None:
            use_kernel(kernel, ADAPTERS[name](fn), owner=f"you ({exercise})", pure=False)
    return Trainer(pieces, skipped)


# --------------------------------------------------------------- 13.1
class PhaseLog:
    """`phase(name)` as a context manager: records the order and the seconds of each phase,
    and each phase opened inside another (whose seconds the dashboard would count twice)."""

    def __init__(self):
        self.order: list[str] = []
        self.seconds: dict[str, float] = {}
        self.nested: list[tuple[str, str]] = []  # (the phase opened, the phase it was in)
        self._open: list[str] = []

    @property
    def current(self) -> str | None:
        """The innermost phase open now, if any."""
        return self._open[-1] if self._open else None

    @contextmanager
    def __call__(self, name: str):
        self.order.append(name)
        if self._open:
            self.nested.append((name, self._open[-1]))
        self._open.append(name)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._open.pop()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0


class FlatAdamW:
    """The engine's fused AdamW over a model's flat buffers, stepped with `.step(lr)`."""

    def __init__(self, model, weight_decay: float = 0.1, betas=(0.9, 0.99)):
        from engine.trainer.model import decay_segments
        from engine.trainer.optim import AdamW
        self.model = model
        self.inner = AdamW(model.params.flat, decay_segments(model.params), lr=1e-3,
                           betas=betas, weight_decay=weight_decay)
        self.steps = 0
        self.rates: list[float] = []             # the lr of each step, as it was handed

    def step(self, lr: float) -> None:
        self.steps += 1
        self.rates.append(lr)
        self.inner.step(self.model.grads.flat, lr=lr)


def reference_train_step(model, optimizer, clip, x, y, lr, max_norm, phase):
    model.zero_grad()
    with phase("loss"):
        loss = model.forward(x, y)
    with phase("backward"):
        model.backward()
    with phase("optimizer"):
        norm = clip(model.named_grads(), max_norm)
        optimizer.step(lr)
    return loss, norm


def _variants():
    """Typical wrong steps, each with the hint it deserves."""
    def no_zero(model, opt, clip, x, y, lr, max_norm, phase):
        with phase("loss"):
            loss = model.forward(x, y)
        with phase("backward"):
            model.backward()
        with phase("optimizer"):
            norm = clip(model.named_grads(), max_norm)
            opt.step(lr)
        return loss, norm

    def no_clip(model, opt, clip, x, y, lr, max_norm, phase):
        model.zero_grad()
        with phase("loss"):
            loss = model.forward(x, y)
        with phase("backward"):
            model.backward()
        with phase("optimizer"):
            norm = float(np.sqrt(np.sum(model.grads.flat.astype(np.float64) ** 2)))
            opt.step(lr)
        return loss, norm

    def clip_after(model, opt, clip, x, y, lr, max_norm, phase):
        model.zero_grad()
        with phase("loss"):
            loss = model.forward(x, y)
        with phase("backward"):
            model.backward()
        with phase("optimizer"):
            opt.step(lr)
            norm = clip(model.named_grads(), max_norm)
        return loss, norm

    return [
        (no_zero, "the gradients of earlier steps were still in the buffer: the backward *adds* "
                  "into it, so each step must start from an empty one."),
        (no_clip, "the update was not clipped: the gradients reached the optimizer at their "
                  "full size. `clip` scales them in place, and the optimizer reads that same "
                  "buffer."),
        (clip_after, "the gradients were clipped after the optimizer's step had already "
                     "used them, so the clipping changed nothing the update read."),
    ]


def _setup(seed=3):
    from engine.trainer.model import FusedGPT
    from engine.gpt_config import GPTConfig
    cfg = GPTConfig(vocab_size=13, block_size=8, n_layer=1, n_head=2, n_embd=8)
    model = FusedGPT(cfg, batch_size=2, seed=seed, dtype=np.float32)
    return model, FlatAdamW(model)


def _batches(n=3):
    rng = np.random.default_rng(131)
    return [(rng.integers(0, 13, size=(2, 8)), rng.integers(0, 13, size=(2, 8)))
            for _ in range(n)]


LR, MAX_NORM = 3e-2, 0.05                        # what the check hands each step


def _count_model_calls(model) -> list[str]:
    """The model's forward and backward calls, in order, as a list the step's check reads."""
    calls = []
    forward, backward = model.forward, model.backward

    def counted_forward(*args, **kwargs):
        calls.append("forward")
        return forward(*args, **kwargs)

    def counted_backward(*args, **kwargs):
        calls.append("backward")
        return backward(*args, **kwargs)
    model.forward, model.backward = counted_forward, counted_backward
    return calls


def _model_refusal_hint(err, calls) -> str:
    """What the model's refusal of a backward means, read from the calls of this step."""
    if calls[-1:] == ["backward"] and "forward" not in calls:
        return (f"the model said: {err}. The loss phase (model.forward(x, y)) comes before "
                f"the backward phase.")
    last_forward = len(calls) - 1 - calls[::-1].index("forward") if "forward" in calls else -1
    backwards = calls[last_forward + 1:].count("backward")
    if backwards > 1:
        return (f"the backward ran {backwards} times after one forward, and the model "
                f"refused the second: a backward uses up what its forward kept for it. Each "
                f"step runs one backward.")
    return f"the model refused a call of your step: {err}."


def _run(step_fn, exercise=None, clip=engine_clip):
    model, opt = _setup()
    calls = _count_model_calls(model)
    results, logs = [], []
    for step, (x, y) in enumerate(_batches()):
        calls.clear()
        phase = PhaseLog()
        phase.clips = []                         # (the phase open, max_norm) of each clip call

        def watched_clip(grads, *args, _phase=phase, **kwargs):
            max_norm = args[0] if args else kwargs.get("max_norm")
            _phase.clips.append((_phase.current, max_norm))
            return clip(grads, *args, **kwargs)
        if exercise is None:
            out = step_fn(model, opt, watched_clip, x, y, LR, MAX_NORM, phase)
        else:
            try:
                out = attempt(exercise, step_fn, model, opt, watched_clip, x, y, LR, MAX_NORM,
                              phase)
            except RuntimeError as err:
                if "forward" in str(err) and calls:
                    raise ExerciseError(exercise, _model_refusal_hint(err, calls)) from None
                raise
        results.append(out)
        logs.append(phase)
    return model, opt, results, logs


def _where(phase: str | None) -> str:
    return f'inside `phase("{phase}")`' if phase else "outside every phase"


def _handed_values_hint(opt, logs) -> str | None:
    """A step that passes on other values than the lr and max_norm it was handed."""
    for lr in opt.rates:
        if lr != LR:
            return (f"optimizer.step got lr={lr!r}, but this step was handed lr={LR!r}: "
                    f"pass on the learning rate the loop gives the step (it changes with "
                    f"the schedule).")
    for log in logs:
        for _, max_norm in log.clips:
            if max_norm != MAX_NORM:
                return (f"clip got max_norm={max_norm!r}, but this step was handed "
                        f"max_norm={MAX_NORM!r}: pass on the limit the loop gives the step.")
    return None


def _zero_norm_hint(model) -> str:
    """A norm of 0 has two causes, told apart by the buffer the learner's last step left."""
    if not np.any(model.grads.flat):
        return ("the gradient norm is 0 and the buffer is empty after your step: it was zeroed "
                "after the backward had filled it, so clipping and the optimizer saw no "
                "gradient. Zeroing belongs where it cannot wipe out this step's work.")
    return ("the gradient norm is 0, yet the backward did fill the buffer: clipping ran before "
            "the backward, on an empty buffer, so it measured nothing and scaled nothing, and "
            "the optimizer then used the unclipped gradient. Clipping needs this step's "
            "gradient, so it can only come after the backward.")


def _unknown_slip_hint(losses, norms, ref_losses, ref_norms) -> str:
    """Where a wrong step first parts from the reference, for a slip no variant explains."""
    first = next((i for i, (a, b) in enumerate(zip(losses, ref_losses))
                  if not math.isclose(a, b, rel_tol=1e-6)), len(losses))
    # the steps before `first` started from the reference's weights: their norms compare
    norm_right = all(math.isclose(a, b, rel_tol=1e-5) for a, b in
                     zip(norms[:first], ref_norms[:first]))
    where = (f"the losses agree up to step {first} and differ from step {first + 1} on"
             if first < len(losses) else "the losses of all 3 steps agree")
    look = ("the gradient norms you returned agree too, so each gradient was right and the "
            "update made from it differs: look at what the optimizer phase does, and how "
            "often" if norm_right else
            "the gradient norm you returned already differs, so the gradient the optimizer "
            "phase received was not this step's alone: look at what happens to the buffer "
            "before it")
    return (f"after 3 steps the weights differ from the reference in a way none of the usual "
            f"slips explains (no zeroing, zeroing after the backward, clipping before the "
            f"backward, no clipping, clipping after the update). {where}; {look}.")


def check_train_step(train_step) -> None:
    """Three steps on a small GPT equal the reference step's, phase by phase."""
    model, opt, results, logs = _run(train_step, EX_STEP)
    ref_model, _, ref_results, _ = _run(reference_train_step)
    for r in results:
        if not (isinstance(r, tuple) and len(r) == 2):
            raise ExerciseError(EX_STEP, f"return the pair (loss, grad_norm), got {r!r}")
    if opt.steps != 3:
        raise ExerciseError(EX_STEP, f"optimizer.step(lr) ran {opt.steps} times in 3 training "
                                     f"steps; call it exactly once per step, in the optimizer "
                                     f"phase.")
    losses = [float(r[0]) for r in results]
    norms = [float(r[1]) for r in results]
    ref_losses = [float(r[0]) for r in ref_results]
    ref_norms = [float(r[1]) for r in ref_results]
    if not math.isclose(losses[0], ref_losses[0], rel_tol=1e-6):
        raise ExerciseError(EX_STEP, f"the first step's loss is {losses[0]:.6g}, the model's "
                                     f"loss on that batch is {ref_losses[0]:.6g}: return what "
                                     f"model.forward(x, y) returned.")
    if norms[0] == 0.0:
        raise ExerciseError(EX_STEP, _zero_norm_hint(model))
    handed = _handed_values_hint(opt, logs)
    if handed:
        raise ExerciseError(EX_STEP, handed)
    if all(math.isclose(n, MAX_NORM, rel_tol=1e-4) for n in norms):
        raise ExerciseError(EX_STEP, "you returned the norm after clipping (it always equals "
                                     "max_norm here); return what clip(...) returned, the norm "
                                     "before clipping: that is the number to log.")
    if not np.allclose(model.params.flat, ref_model.params.flat, rtol=1e-6, atol=1e-7):
        for wrong, hint in _variants():
            w_model, _, _, _ = _run(wrong)
            # the gradient buffer tells "never clipped" from "clipped too late"
            if np.allclose(model.params.flat, w_model.params.flat, rtol=1e-6, atol=1e-7) and \
                    np.allclose(model.grads.flat, w_model.grads.flat, rtol=1e-6, atol=1e-9):
                raise ExerciseError(EX_STEP, f"after 3 steps the weights differ from the "
                                             f"reference; {hint}")
        raise ExerciseError(EX_STEP, _unknown_slip_hint(losses, norms, ref_losses, ref_norms))
    if not all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(norms, ref_norms)):
        raise ExerciseError(EX_STEP, f"the weights are right but the returned norms "
                                     f"{[round(n, 5) for n in norms]} differ from the norms "
                                     f"before clipping {[round(n, 5) for n in ref_norms]}.")
    want = ["loss", "backward", "optimizer"]
    for i, log in enumerate(logs):
        if log.order != want:
            raise ExerciseError(EX_STEP, f"step {i + 1} went through the phases {log.order}; "
                                         f"wrap the work in `with phase(\"loss\"):`, "
                                         f"`with phase(\"backward\"):` and "
                                         f"`with phase(\"optimizer\"):`, in that order, once "
                                         f"each, so the trainer can time them.")
    for i, log in enumerate(logs):
        if log.nested:
            inner, outer = log.nested[0]
            raise ExerciseError(EX_STEP, f"the weights are right, but in step {i + 1} "
                                         f"`phase(\"{inner}\")` was opened inside "
                                         f"`phase(\"{outer}\")`: phases may not overlap. The "
                                         f"trainer times each phase on its own, so the "
                                         f"{outer} phase's bar would also hold the {inner}'s "
                                         f"seconds, counted twice. Close each phase before "
                                         f"the next one opens.")
    for i, log in enumerate(logs):
        elsewhere = [p for p, _ in log.clips if p != "optimizer"]
        if elsewhere:
            raise ExerciseError(EX_STEP, f"the weights are right, but in step {i + 1} `clip` "
                                         f"ran {_where(elsewhere[0])}: the trainer times "
                                         f"clipping with the update, so the phase bars would "
                                         f"count it elsewhere. Move it into the optimizer "
                                         f"phase.")
    passed(EX_STEP, "zero, loss, backward, clip and step, in order; 3 steps equal the "
                    "reference.")


# ------------------------------------------------------- what a step achieves
def step_flops(cfg, batch_size: int) -> float:
    """FLOPs of one training step as lesson 07's budget counts them (`engine.budget`):
    6 per matmul weight per token (2 forward, 4 backward), plus attention's Q @ K^T and
    P @ V over the full T x T square, forward and backward."""
    from engine import budget
    return float(budget.flops(_budget_config(cfg, batch_size))["per_step"]["total"])


def _budget_config(cfg, batch_size: int, **knobs):
    """The budget's description (lesson 07) of a GPT config at micro-batch `batch_size`."""
    from engine import budget
    return budget.BudgetConfig(n_layer=cfg.n_layer, d_model=cfg.n_embd, n_head=cfg.n_head,
                               vocab_size=cfg.vocab_size, block_size=cfg.block_size,
                               micro_batch=batch_size, seq_len=cfg.block_size, **knobs)


def sgemm_flops_per_s(m: int, k: int, n: int, repeats: int = 30, seed: int = 0) -> float:
    """The machine's measured float32 matmul rate: FLOP/s (2*m*k*n per product) of the
    fastest of `repeats` (m, k) @ (k, n) products through the trainer's own code: one
    BLAS call on all cores (engine.blas: SciPy's OpenBLAS, or MKL where it is installed
    on an Intel CPU), or every core its share of the rows at once, as the trainer's
    replicas run them (on the engine's register tiles where those are faster).
    engine.trainer.lab.machine.product_peak_flops measures it."""
    from engine.trainer.lab.machine import product_peak_flops
    return product_peak_flops(m, k, n, repeats=repeats, seed=seed)


def mfu(flops_per_step: float, step_seconds: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: the FLOP/s a training step achieves (the model's FLOPs
    per step over the step's seconds) as a fraction of the machine's peak FLOP/s."""
    return flops_per_step / step_seconds / peak_flops_per_s


# --------------------------------------------- more of the learner's pieces
def checkpoint_peak_piece():
    """(checkpoint_peak, owner): the learner's 08.3 formula when saved and keeping its
    slot's contract, else the course's reference formula, and why. Never raises."""
    from .lesson08 import exact_checkpoint_peak
    return piece_or_engine("checkpoint_peak", "08.3", exact_checkpoint_peak,
                           fallback="the reference formula's")


def bf16_piece():
    """(to_bf16, owner): the learner's 09.1 rounding when saved and keeping its slot's
    contract, else the engine's `engine.precision.round_to_bf16`, and why. Never raises."""
    from engine.precision import round_to_bf16
    return piece_or_engine("to_bf16", "09.1", round_to_bf16)


def fused_activation_sizes(cfg, batch_size: int) -> dict:
    """Bytes of the fused trainer's activation buffers (float32), from lesson 07's budget
    of the fused trainer (`engine.budget.fused_trainer_saved`): `boundary`, one residual
    stream (a block's input, what a checkpoint keeps); `block`, what one block's backward
    reads beyond its input; `outside`, what no checkpoint touches (the last block's
    output, the final layer norm, the logits)."""
    from engine.budget.activations import fused_trainer_saved
    config = _budget_config(cfg, batch_size, recompute="full")
    stream, block, attention, final_ln, head = fused_trainer_saved(config)
    one = stream.elements * stream.itemsize
    return {"boundary": one, "block": block.bytes + attention.bytes,
            "outside": one + final_ln.bytes + head.bytes}


def predicted_checkpointed_bytes(checkpoint_peak, cfg, batch_size: int) -> int:
    """The checkpointed fused trainer's activation bytes by lesson 08's formula: its L
    blocks checkpointed every block (k = 1), plus what lies outside every segment."""
    sizes = fused_activation_sizes(cfg, batch_size)
    return int(checkpoint_peak(cfg.n_layer, 1, sizes["boundary"], sizes["block"])
               + sizes["outside"])


def bf16_bits(to_bf16, x: np.ndarray) -> np.ndarray:
    """float32 -> its bf16 rounding (by `to_bf16`) stored as 16-bit integers: the upper
    half of each rounded float32, half the bytes."""
    rounded = np.asarray(to_bf16(np.ascontiguousarray(x, dtype=np.float32)), np.float32)
    return (rounded.view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """16-bit bf16 patterns -> float32 (exact: bf16 is the upper half of a float32)."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def export_bf16(to_bf16, params_flat: np.ndarray, folder) -> dict:
    """Write the trained weights twice, as float32 and as bf16 (rounded by `to_bf16`),
    each a .npy file in `folder`; read the bf16 file back. Returns the two paths, their
    sizes in bytes and the float32 weights read back from the bf16 file."""
    from pathlib import Path
    folder = Path(folder)
    f32, b16 = folder / "weights_fp32.npy", folder / "weights_bf16.npy"
    np.save(f32, np.asarray(params_flat, np.float32))
    np.save(b16, bf16_bits(to_bf16, params_flat))
    return {"fp32_path": f32, "bf16_path": b16, "fp32_bytes": f32.stat().st_size,
            "bf16_bytes": b16.stat().st_size, "weights": from_bf16_bits(np.load(b16))}


# ------------------------------------------------------------------ the notebook
#: Each exercise function of the lesson, and its exercise.
EXERCISE_FUNCTIONS = {"train_step": EX_STEP}


def name_unfinished_exercises() -> None:
    """In the notebook, a cell that needs an unfinished exercise of this lesson says which."""
    from . import _core
    _core.name_unfinished_exercises(EXERCISE_FUNCTIONS)
