"""A plan: the settings that fit a device, fastest first.

Given a model, a device, the number of devices and the tokens each optimizer step
sees, the plan tries every combination of the knobs a practitioner turns to make a
step fit: recompute, attention, ZeRO stage, LoRA or full fine-tuning, and the split
of each device's sequences into micro-batch x accumulation. Every combination is
built with `BudgetConfig.with_`, so one the compatibility table refuses
(engine.budget.compat) is never listed: the plan counts it among the refusals, with
the table's sentence. A knob the table calls idle in a setting (the ZeRO stage on
one device) is tried at its default only, so no two rows describe the same step.

What a row's step time assumes (stated in `Plan.assumptions`):
  * compute: the step's FLOPs on one device (forward, backward and recompute of its
    K micro-batches, engine.budget.counts.flops) at `mfu` of the device's dense
    FLOP/s, as engine.budget.fit estimates a step;
  * communication: the bytes each device sends in the step's ring collectives
    (engine.budget.sharding.communication) at `link_bandwidth`, added to the compute
    rather than overlapped with it, so the figure is an upper bound that ranks ZeRO's
    traffic;
  * the MFU is the same at every micro-batch: a smaller micro-batch costs only the
    collectives ZeRO 2 and 3 repeat for each one. So for each combination the largest
    micro-batch that fits is never slower than a smaller one, and it is the one listed.
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass, replace

from . import compat
from .config import BudgetConfig, BudgetError
from .counts import fixed_bytes, flops
from .devices import device_figures, find_device
from .fit import largest_fitting, step_peak, without_adapters
from .knobs import (ATTENTIONS, KNOBS, LINK_BANDWIDTH, MAX_BATCH, PLAN_KNOBS, RECOMPUTE,
                    ZERO_STAGES)
from .report import human_bytes, human_flops
from .sharding import communication

# The knobs the plan varies (micro-batch and accumulation besides), in the order a
# row names them.
VARIED = {"recompute": RECOMPUTE, "attention": ATTENTIONS, "zero": ZERO_STAGES}


# What each ZeRO stage sends per optimizer step (engine.budget.sharding), in words.
ZERO_TRAFFIC = {
    0: "the gradients all-reduced once",
    1: "the gradients reduce-scattered and the weights all-gathered once",
    2: "the gradients reduce-scattered after each of {k} micro-batch(es)",
    3: "the weights gathered twice and the gradients reduce-scattered in each of {k} "
       "micro-batch(es)",
}


@dataclass(frozen=True)
class PlanRow:
    """One setting that fits, with its predicted step time and peak."""
    config: BudgetConfig
    compute_seconds: float
    communication_seconds: float
    sent_per_device: int      # bytes each device sends per optimizer step
    flops_per_device: int
    peak: int                 # the larger of the step's peaks, one device's
    why: str = ""             # why it is slower than the row above ("" for the first)

    @property
    def step_seconds(self) -> float:
        return self.compute_seconds + self.communication_seconds

    @property
    def fine_tuning(self) -> str:
        c = self.config
        return ("QLoRA" if c.qlora else "LoRA") + f" r={c.lora_rank}" if c.lora_rank else "full"

    def settings(self) -> dict:
        c = self.config
        return {"micro_batch": c.micro_batch, "accumulation": c.accumulation,
                "recompute": c.recompute, "attention": c.attention, "zero": c.zero,
                "fine_tuning": self.fine_tuning}

    def as_dict(self) -> dict:
        return {**self.settings(), "step_seconds": self.step_seconds,
                "compute_seconds": self.compute_seconds,
                "communication_seconds": self.communication_seconds,
                "sent_per_device": self.sent_per_device,
                "flops_per_device": self.flops_per_device, "peak": self.peak,
                "why": self.why}


@dataclass(frozen=True)
class Plan:
    rows: tuple[PlanRow, ...]            # fastest first
    refused: tuple[tuple[str, int], ...]  # the table's sentence, how many settings it refused
    assumptions: tuple[str, ...]
    tokens_per_step: int                 # all devices together
    sequences_per_device: int            # micro-batch x accumulation of every row

    def as_list(self) -> list[dict]:
        return [row.as_dict() for row in self.rows]


def plan(cfg: BudgetConfig, tokens_per_step: int = 0, link_bandwidth: int = LINK_BANDWIDTH,
         full_fine_tuning: bool = True) -> Plan:
    """The settings of `cfg`'s model on its device(s) that fit, fastest first, each
    seeing `tokens_per_step` tokens per optimizer step (0: `cfg`'s own)."""
    cfg.validate()
    for name, value in (("tokens_per_step", tokens_per_step),
                        ("link_bandwidth", link_bandwidth)):
        problem = PLAN_KNOBS[name].problem(value)
        if problem:
            raise BudgetError(problem)
    figures = device_figures(cfg)
    if not figures or not all(figures):
        raise BudgetError(f"device={cfg.device!r}: a plan needs a device's memory and "
                          f"FLOP/s; choose a device (e.g. device=h100), or set "
                          f"device_memory and device_flops to the card's figures.")
    memory, rate = figures
    sequences = _sequences_per_device(cfg, tokens_per_step)
    usable = memory - cfg.headroom
    recipes = [cfg] + ([without_adapters(cfg)] if cfg.lora_rank and full_fine_tuning else [])
    refused = collections.Counter()
    rows = []
    for recipe in recipes:
        for changes in _combinations(recipe, refused):
            row = _fastest_fitting(recipe, changes, sequences, usable, rate, link_bandwidth,
                                   refused)
            if row is not None:
                rows.append(row)
    rows.sort(key=lambda r: (r.step_seconds, r.peak))
    rows = [replace(r, why=_why(r, rows[i - 1], link_bandwidth)) if i else r
            for i, r in enumerate(rows)]
    total = sequences * cfg.seq_len * cfg.devices
    return Plan(rows=tuple(rows), refused=tuple(refused.most_common()),
                assumptions=_assumptions(cfg, memory, rate, link_bandwidth, total, sequences),
                tokens_per_step=total, sequences_per_device=sequences)


def _sequences_per_device(cfg: BudgetConfig, tokens_per_step: int) -> int:
    """Sequences each device runs per optimizer step (micro-batch x accumulation)."""
    if not tokens_per_step:
        return cfg.micro_batch * cfg.accumulation
    per = cfg.seq_len * cfg.devices
    if tokens_per_step % per:
        fewer = max(per, tokens_per_step // per * per)
        raise BudgetError(
            f"tokens_per_step={tokens_per_step:,} is not a whole number of sequences of "
            f"{cfg.seq_len:,} tokens on each of {cfg.devices} device(s); use a multiple of "
            f"{per:,}, e.g. {fewer:,} or {fewer + per:,}.")
    sequences = tokens_per_step // per
    if not _splits(sequences):
        raise BudgetError(
            f"tokens_per_step={tokens_per_step:,} needs {sequences:,} sequences per device, "
            f"more than micro-batch x accumulation can reach ({MAX_BATCH:,} each); use at "
            f"most {MAX_BATCH * MAX_BATCH * per:,}.")
    return sequences


def _splits(sequences: int) -> list[int]:
    """The micro-batches B that divide `sequences` with B and K = sequences / B both
    within the knobs' bound (MAX_BATCH), ascending: at most 2 x sqrt(sequences) tries."""
    small = [b for b in range(1, math.isqrt(sequences) + 1) if sequences % b == 0]
    every = sorted({*small, *(sequences // b for b in small)})
    return [b for b in every if b <= MAX_BATCH and sequences // b <= MAX_BATCH]


def _combinations(recipe: BudgetConfig, refused: collections.Counter):
    """The changes of VARIED's knobs the table accepts for `recipe`, each step once."""
    seen = set()
    for recompute in VARIED["recompute"]:
        for attention in VARIED["attention"]:
            for zero in VARIED["zero"]:
                changes = dict(recompute=recompute, attention=attention, zero=zero)
                try:
                    cand = recipe.with_(**changes)
                except BudgetError as exc:
                    refused[str(exc)] += 1
                    continue
                # a knob the table greys does nothing here: the same step as its default
                idle = compat.idle_knobs(cand)
                same = tuple((k, KNOBS[k].default if k in idle else v)
                             for k, v in changes.items())
                if same not in seen:
                    seen.add(same)
                    yield dict(same)


def _fastest_fitting(recipe, changes, sequences, usable, rate, bandwidth, refused):
    """The largest micro-batch dividing `sequences` that fits, as a row (None: none)."""
    splits = _splits(sequences)

    def setting(i):
        return recipe.with_(**changes, micro_batch=splits[i],
                            accumulation=sequences // splits[i])

    def fits(i):
        try:
            return step_peak(setting(i)) <= usable
        except BudgetError as exc:
            refused[str(exc)] += 1
            return False

    best = largest_fitting(fits, 0, len(splits) - 1)
    if best is None:
        return None
    cfg = setting(best)
    per_device = flops(cfg)["per_step"]["total"]
    sent = sum(c["sent_per_device"] for c in communication(cfg, fixed_bytes(cfg)))
    return PlanRow(config=cfg, compute_seconds=per_device / (cfg.mfu * rate),
                   communication_seconds=sent / bandwidth, sent_per_device=sent,
                   flops_per_device=per_device, peak=step_peak(cfg))


def _why(row: PlanRow, above: PlanRow, bandwidth: int) -> str:
    """Why `row` is slower than `above` (or ranks below it at the same time)."""
    c, a = row.config, above.config
    parts = []
    extra_flops = row.flops_per_device - above.flops_per_device
    if extra_flops:
        causes = []
        if c.recompute != a.recompute and c.recompute != "none":
            causes.append(f"recompute {c.recompute} repeats "
                          + ("every block's forward" if c.recompute == "full"
                             else "the attention core") + " in the backward")
        if c.lora_rank != a.lora_rank and not c.lora_rank:
            causes.append("full fine-tuning computes every weight's gradient")
        parts.append(f"{extra_flops / above.flops_per_device:+.0%} FLOPs"
                     + (f" ({'; '.join(causes)})" if causes and extra_flops > 0 else ""))
    extra_sent = row.sent_per_device - above.sent_per_device
    if extra_sent:
        parts.append(f"{'+' if extra_sent > 0 else '-'}{human_bytes(abs(extra_sent))} sent "
                     f"per device at {human_bytes(bandwidth)}/s (ZeRO {c.zero}: "
                     f"{ZERO_TRAFFIC[c.zero].format(k=c.accumulation)})")
    slower = row.step_seconds - above.step_seconds
    if slower <= above.step_seconds * 1e-9:
        return (f"same predicted time; peak {human_bytes(row.peak)} against "
                f"{human_bytes(above.peak)}")
    return f"+{_seconds(slower)}: " + "; ".join(parts or ["slower"])


def _seconds(t: float) -> str:
    return f"{t:.3g} s"


def _assumptions(cfg, memory, rate, bandwidth, tokens, sequences) -> tuple[str, ...]:
    return (
        f"tokens per optimizer step: {tokens:,} = {sequences} sequences of {cfg.seq_len:,} "
        f"tokens (micro-batch x accumulation) on each of {cfg.devices} device(s)",
        f"step time = FLOPs per device (forward, backward, recompute) / ({cfg.devices} "
        f"device(s) each at {human_flops(rate)}/s x MFU {cfg.mfu:g}) + bytes sent per device / "
        f"{human_bytes(bandwidth)}/s (link_bandwidth; not overlapped with the compute: an "
        f"upper bound)",
        "the MFU is the same at every micro-batch: each combination lists its largest "
        "micro-batch that fits (a smaller one only repeats ZeRO 2 and 3's collectives)",
        f"fits: the larger of step 1's and later steps' peaks + headroom "
        f"{human_bytes(cfg.headroom)} <= {human_bytes(memory)} per device",
    )


def describe_plan(p: Plan, cfg: BudgetConfig, given: dict) -> str:
    """The plan as the command line prints it: the table, the refusals, what the step
    time assumes and the plan's knobs with their defaults (`given`: the values set)."""
    name = cfg.name if cfg.name != "custom" else f"{cfg.architecture} L={cfg.n_layer}"
    device = find_device(cfg.device)
    lines = [f"plan for {name} on {cfg.devices} x {device.name if device else cfg.device}: "
             f"{len(p.rows)} setting(s) "
             f"fit, fastest first"]
    if p.rows:
        lines.append(f"  {'#':>3}  {'B x K':<9}{'recompute':<11}{'attention':<11}{'ZeRO':<6}"
                     f"{'fine-tuning':<13}{'step':>9}{'peak':>10}  why slower than the row above")
        for i, r in enumerate(p.rows, 1):
            s = r.settings()
            split = f"{s['micro_batch']} x {s['accumulation']}"
            lines.append(f"  {i:>3}  {split:<9}"
                         f"{s['recompute']:<11}{s['attention']:<11}{s['zero']:<6}"
                         f"{s['fine_tuning']:<13}{_seconds(r.step_seconds):>9}"
                         f"{human_bytes(r.peak):>10}  {r.why}")
    else:
        lines.append("  no setting fits: more devices, a shorter sequence, LoRA or a larger "
                     "device would")
    if p.refused:
        lines.append("refused by the compatibility table (never listed):")
        lines += [f"  {n} setting(s): {why}" for why, n in p.refused]
    lines.append("the step time assumes:")
    lines += [f"  {a}" for a in p.assumptions]
    lines.append("plan knobs (default unless given):")
    for k in PLAN_KNOBS.values():
        value = given.get(k.field)
        shown = k.default if value is None else value
        lines.append(f"  {k.flag} {_knob_text(k, shown)}"
                     f"{'' if value is None else ' (given)'}: {k.help}")
    return "\n".join(lines)


def _knob_text(k, value) -> str:
    if k.kind is bool:
        return "on" if value else "off"
    if k.field == "link_bandwidth":
        return f"{human_bytes(value)}/s"
    if value == 0 and k.zero_means:
        return f"0 ({k.zero_means})"
    return f"{value:,}"
