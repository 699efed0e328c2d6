"""Measure a model's activation bytes on the tape (engine.memory), to check the prediction."""
from __future__ import annotations

import time
from contextlib import ExitStack

from ...tensor import TapeObserver
from ..config import BudgetConfig, BudgetError
from ..counts import flops, parameter_count
from ..activations import engine_activations
from ..total import budget
from ..report import human_bytes, human_flops


MEASURE_MAX_ACTIVATION_BYTES = 1_500_000_000
MEASURE_MAX_FLOPS = 3e11
# fp32 weights, all tables together (token and position tables included); gradients take
# as much again, and initialising a table briefly takes twice its size in float64.
MEASURE_MAX_WEIGHT_BYTES = 200_000_000


def measurable(cfg: BudgetConfig) -> BudgetConfig:
    """The configuration `measure` runs: `cfg` as our engine runs it (fp32,
    the engine activation model), or BudgetError saying what to change."""
    cfg.validate()
    if cfg.dropout or not cfg.tied_embedding or (cfg.d_ff and cfg.d_ff != 4 * cfg.d_model):
        raise BudgetError(
            "our engine's GPT has no dropout, a tied head and an MLP of width 4d; turn "
            "dropout off, tie the head and set the MLP width to 0 (4d) to measure.")
    run = cfg.with_(activation_model="engine", precision="fp32", n_params=0)
    weights = 4 * parameter_count(run)
    if weights > MEASURE_MAX_WEIGHT_BYTES:
        raise BudgetError(
            f"this shape is too large to measure here ({human_bytes(weights)} of fp32 weights, "
            f"as much again for their gradients; the limit is "
            f"{human_bytes(MEASURE_MAX_WEIGHT_BYTES)}, every table included: {run.positions:,} "
            f"positions and {run.vocab_size:,} tokens of width {run.d_model:,}). Reduce the "
            f"positions, V, L or d, e.g. the 'tiny' preset.")
    acts = engine_activations(run).peak
    work = flops(run)["per_micro_batch"]["forward"] * 3
    if acts > MEASURE_MAX_ACTIVATION_BYTES or work > MEASURE_MAX_FLOPS:
        raise BudgetError(
            f"this shape is too large to measure here ({human_bytes(acts)} of activations, "
            f"{human_flops(work)} per step; the limits are "
            f"{human_bytes(MEASURE_MAX_ACTIVATION_BYTES)} and {human_flops(MEASURE_MAX_FLOPS)}). "
            f"Reduce B, N, L or d, e.g. the 'tiny' preset.")
    return run


class _StepProgress(TapeObserver):
    """Counts the tape's events (each forward op, each node the backward visits) of a step
    whose total is known, and reports (fraction done, seconds left) at most every 0.2 s."""

    def __init__(self, total: int, report):
        self.total, self.report = max(total, 1), report
        self.done, self.start, self.last = 0, time.perf_counter(), 0.0

    def _tick(self) -> None:
        self.done += 1
        now = time.perf_counter()
        if now - self.last >= 0.2:
            self.last = now
            fraction = min(self.done / self.total, 1.0)
            self.report(fraction, (now - self.start) * (1 - fraction) / fraction)

    def after_forward(self, op, inputs, result, recorded) -> None:
        self._tick()

    def after_backward(self, node, g, grads, released) -> None:
        self._tick()


def _tape_step(run: BudgetConfig, seed: int, observers=()):
    """One forward and backward of `engine.nn.GPT` at `run`'s shape under `engine.memory`
    (and any other observers): (model, loss, the memory record)."""
    import numpy as np

    from ... import memory
    from ...recompute import checkpointed, selective_recompute
    from ...gpt_config import GPTConfig, init_params
    from ...nn import GPT
    from ...tensor import observe

    gcfg = GPTConfig(vocab_size=run.vocab_size, block_size=run.positions,
                     n_layer=run.n_layer, n_head=run.n_head, n_embd=run.d_model)
    model = GPT(gcfg, init_params(gcfg, seed=seed, dtype=np.float32))
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, run.vocab_size, size=(run.micro_batch, run.seq_len))
    targets = rng.integers(0, run.vocab_size, size=(run.micro_batch, run.seq_len))
    policy = "every" if run.recompute == "full" else "none"
    with memory.record() as mem, ExitStack() as watching:
        for observer in observers:
            watching.enter_context(observe(observer))
        with checkpointed(model, policy), selective_recompute(
                model, run.recompute == "selective"):
            loss = model(ids, targets)
        loss.backward()
    return model, loss, mem


def step_events(run: BudgetConfig) -> int:
    """How many tape events one step of `run` has. The count depends on the number of
    blocks and the recompute policy, not on B, N or d, so it is read off two tiny runs
    (1 and 2 blocks) and extended linearly."""
    counts = []
    for n_layer in (1, 2):
        counter = _StepProgress(1, lambda *a: None)
        tiny = run.with_(n_layer=n_layer, micro_batch=1, seq_len=2, block_size=2,
                         vocab_size=3, d_model=run.n_head)
        _tape_step(tiny, 0, observers=(counter,))
        counts.append(counter.done)
    return counts[0] + (counts[1] - counts[0]) * (run.n_layer - 1)


def measure(cfg: BudgetConfig, seed: int = 0, progress=None) -> dict:
    """Run one forward and backward of `engine.nn.GPT` at this shape under
    `engine.memory` (with every block checkpointed by `engine.recompute`
    when recompute='full', with each attention core checkpointed by
    `engine.recompute.selective_recompute` when recompute='selective') and
    return measured bytes beside the engine
    model's prediction:
      * activations alive at the end of the forward, and their peak over the
        step, from the tape's timeline;
      * weights and gradients: the nbytes of the real arrays;
      * the step peak without optimizer state (weights + gradients +
        activation peak): the engine has no optimizer state to measure, so
        that part of `budget(...).peak` is left out on both sides;
      * the timeline itself, as (phase, op, live bytes).
    `progress(fraction, seconds_left)`, if given, is called as the step runs."""
    run = measurable(cfg)
    observers = () if progress is None else (_StepProgress(step_events(run), progress),)
    model, loss, mem = _tape_step(run, seed, observers)
    policy = "every" if run.recompute == "full" else "none"
    timeline = [(p.phase, p.label, p.live_bytes) for p in mem.timeline]
    first_backward = next(i for i, (phase, _, _) in enumerate(timeline) if phase == "backward")
    end_of_forward = timeline[first_backward - 1][2]
    weights = sum(p.data.nbytes for p in model.parameters().values())
    grads = sum(p.grad.nbytes for p in model.parameters().values() if p.grad is not None)
    predicted = budget(run)
    return {
        "shape": (f"L={run.n_layer} d={run.d_model} H={run.n_head} V={run.vocab_size} "
                  f"B={run.micro_batch} N={run.seq_len}, fp32"
                  + (", every block checkpointed" if policy == "every" else "")
                  + (", attention cores recomputed" if run.recompute == "selective" else "")),
        "config": run,
        "predicted_saved": predicted.activations.saved,
        "measured_saved": end_of_forward,
        "predicted_peak": predicted.activations.peak,
        "measured_peak": mem.peak_bytes,
        "predicted_weights": predicted.fixed["weights"],
        "measured_weights": weights,
        "predicted_gradients": predicted.fixed["gradients"],
        "measured_gradients": grads,
        "predicted_step_peak": (predicted.fixed["weights"] + predicted.fixed["gradients"]
                                + predicted.activations.peak),
        "measured_step_peak": weights + grads + mem.peak_bytes,
        "timeline": timeline,
        "loss": float(loss.data),
    }
