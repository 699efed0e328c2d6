"""The step as moments: one table of the terms a step can hold, and one peak rule.

A training step's memory is not a sum: tensors come and go, so the step has a peak
*moment*, and the budget's peak is the largest of the step's moments, whatever the
model of the step (the textbook ones, this engine's, a real framework's). Each moment
lists what is alive then; each thing alive is a term of `STEP_TERMS`:

    name                                category          alive in           ZeRO shards it
    weights                             weights           every moment       from stage 3
    master weights                      master weights    every moment       from stage 1
    optimizer state                     optimizer state   every moment (a    from stage 1
                                                          real step: from its
                                                          first step() on)
    gradients                           gradients         from the first     from stage 2
                                                          weight gradient on
    gradients of earlier micro-batches  gradients         a later micro-     from stage 2
                                                          batch's forward and
                                                          backward
    gradients in flight                 gradients         wherever the ZeRO  never (the
                                                          engine holds them  unsharded part
                                                          (sharding.py)      beyond a shard)
    gathered weights                    weights           wherever ZeRO 3's  never (whole
                                                          engine holds them  weights beyond
                                                          (sharding.py)      the shard)
    saved by the forward                activations       the forward's end  never
                                                          to the first
                                                          block's backward
                                                          (its checkpoints
                                                          under checkpointing)
    the loop's output                   activations       where the loop     never
                                                          holds it
    the forward's output                activations       the forward's end  never
    recompute                           recompute         a rebuilt block    never
                                        transient
    the block's backward                step transient    a block's backward never
                                                          (block_backward.py)
    loss                                step transient    the forward's end  never
                                                          and the loss's
                                                          backward
    autocast cache                      step transient    the forward's end  never
    forward transient                   step transient    the last block's   never
                                                          forward
    backward's last gradients           step transient    the head's         never
                                                          backward to the
                                                          end of the
                                                          backward (a tied
                                                          head's gradient
                                                          waits for the
                                                          embedding's)
    optimizer temporaries               step transient    the optimizer step never

Each term's `alive_in` holds its column as data; `tests/test_budget_moments.py`
checks that every moment a model builds holds only terms alive in it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

# The moments of a step, in the order they happen.
LAST_BLOCK = "the last block's forward"
FORWARD_END = "the loss at the end of the forward"
LOSS_BACKWARD = "the loss's backward"
HEAD_BACKWARD = "the head's backward"
LAST_BLOCK_BACKWARD = "the last block's backward"
FIRST_BLOCK_BACKWARD = "the first block's backward"
BACKWARD_END = "the end of the backward"
OPTIMIZER_STEP = "the optimizer step"
# The textbook models' moments: the forward's end and the backward's rebuilt block.
SAVED_ALL = "the end of the forward"
REBUILT = "the backward's rebuilt block"
MOMENTS = (SAVED_ALL, REBUILT, LAST_BLOCK, FORWARD_END, LOSS_BACKWARD, HEAD_BACKWARD,
           LAST_BLOCK_BACKWARD, FIRST_BLOCK_BACKWARD, BACKWARD_END, OPTIMIZER_STEP)
EVERY = frozenset(MOMENTS)
CATEGORIES = ("weights", "master weights", "gradients", "optimizer state", "activations",
              "recompute transient", "step transient")


@dataclass(frozen=True)
class StepTerm:
    name: str
    category: str          # where it goes in the stacked bar (CATEGORIES)
    alive_in: frozenset    # the moments it can be alive in
    sharded_from: int | None  # the ZeRO stage from which the devices split it


def _term(name, category, alive_in, sharded_from=None) -> StepTerm:
    return StepTerm(name, category, frozenset(alive_in), sharded_from)


_BLOCK_BACKWARDS = (LAST_BLOCK_BACKWARD, FIRST_BLOCK_BACKWARD)
_BACKWARD = (LOSS_BACKWARD, HEAD_BACKWARD, *_BLOCK_BACKWARDS, REBUILT, BACKWARD_END)
STEP_TERMS = {t.name: t for t in (
    _term("weights", "weights", EVERY, 3),
    _term("master weights", "master weights", EVERY, 1),
    _term("optimizer state", "optimizer state", EVERY, 1),
    _term("gradients", "gradients", (HEAD_BACKWARD, *_BLOCK_BACKWARDS, BACKWARD_END,
                                     OPTIMIZER_STEP, SAVED_ALL, REBUILT), 2),
    _term("gradients of earlier micro-batches", "gradients",
          (LAST_BLOCK, FORWARD_END, LOSS_BACKWARD, HEAD_BACKWARD, *_BLOCK_BACKWARDS,
           BACKWARD_END), 2),
    _term("gradients in flight", "gradients", EVERY),
    _term("gathered weights", "weights", EVERY),
    _term("saved by the forward", "activations", (SAVED_ALL, REBUILT, LAST_BLOCK, FORWARD_END,
                                                  LOSS_BACKWARD, HEAD_BACKWARD,
                                                  *_BLOCK_BACKWARDS)),
    _term("the loop's output", "activations", (LAST_BLOCK, FORWARD_END, *_BACKWARD,
                                               OPTIMIZER_STEP)),
    _term("the forward's output", "activations", (FORWARD_END,)),
    _term("recompute", "recompute transient", (REBUILT, *_BLOCK_BACKWARDS)),
    _term("the block's backward", "step transient", _BLOCK_BACKWARDS),
    _term("loss", "step transient", (FORWARD_END, LOSS_BACKWARD)),
    _term("autocast cache", "step transient", (LAST_BLOCK, FORWARD_END)),
    _term("forward transient", "step transient", (LAST_BLOCK,)),
    _term("backward's last gradients", "step transient",
          (HEAD_BACKWARD, LAST_BLOCK_BACKWARD, FIRST_BLOCK_BACKWARD, BACKWARD_END)),
    _term("optimizer temporaries", "step transient", (OPTIMIZER_STEP,)),
)}
# The fixed buffers (one per parameter, set before the step) and, read from the
# table, those each ZeRO stage splits among the devices.
FIXED = ("weights", "master weights", "gradients", "optimizer state")
SHARDED = {stage: tuple(name for name in FIXED
                        if STEP_TERMS[name].sharded_from is not None
                        and STEP_TERMS[name].sharded_from <= stage)
           for stage in (0, 1, 2, 3)}


@dataclass(frozen=True)
class Alive:
    """One thing alive at a moment: its term in STEP_TERMS, what it is, its bytes.
    The models that know a term emit it as an Alive; read as a pair it is
    (what, bytes), what a report shows."""
    term: str
    what: str
    bytes: int

    def __post_init__(self):
        if self.term not in STEP_TERMS:
            raise KeyError(f"{self.term!r} is not a term of STEP_TERMS")

    def __iter__(self):
        return iter((self.what, self.bytes))


@dataclass(frozen=True)
class Moment:
    """One moment of the step and what is alive then, largest first. A moment that is
    the largest of several arrangements (a block's backward, op by op) keeps every
    arrangement's bytes in `arrangements`: each is a plain sum of tensors, which the
    fit searches extrapolate (fit.py), where their largest is not."""
    name: str
    terms: tuple  # Alive entries
    arrangements: tuple = ()  # bytes of each arrangement, the largest being `bytes`

    @property
    def alive(self) -> tuple:
        """(what, bytes) pairs, largest first."""
        return tuple(tuple(a) for a in self.terms)

    @functools.cached_property
    def bytes(self) -> int:
        return sum(a.bytes for a in self.terms)

    def by_category(self) -> dict[str, int]:
        parts = dict.fromkeys(CATEGORIES, 0)
        for a in self.terms:
            parts[STEP_TERMS[a.term].category] += a.bytes
        return parts


def moment(name: str, entries) -> Moment:
    """A Moment from Alive entries and (term, what, bytes) or (term, bytes) tuples:
    empty ones dropped, the largest first."""
    alive = []
    for entry in entries:
        if not isinstance(entry, Alive):
            term, what, size = entry if len(entry) == 3 else (entry[0], entry[0], entry[1])
            entry = Alive(term, what, size)
        if entry.bytes:
            alive.append(entry)
    return Moment(name, tuple(sorted(alive, key=lambda a: -a.bytes)))


def with_arrangements(found: Moment, arrangements) -> Moment:
    """`found`, the largest of `arrangements` (their bytes, `found`'s among them)."""
    arrangements = tuple(arrangements)
    assert max(arrangements) == found.bytes, (max(arrangements), found.bytes)
    return Moment(found.name, found.terms, arrangements)


def peak(moments) -> Moment:
    """The peak rule, one for every model of a step: the largest moment."""
    return max(moments, key=lambda m: m.bytes)


@dataclass(frozen=True)
class StepMoments:
    """A step's moments in the steady state and in step 1, and the tensors the
    forward saves (Saved entries)."""
    items: tuple          # Saved entries alive at the end of the forward
    moments: tuple        # Moment, steady state (the optimizer state exists)
    first_step: tuple     # Moment, the first step

    @property
    def saved(self) -> int:
        return sum(x.bytes for x in self.items)

    @property
    def peak_moment(self) -> Moment:
        return peak(self.moments)

    @property
    def first_step_peak_moment(self) -> Moment:
        return peak(self.first_step)


def textbook_moments(fixed: dict[str, int], saved: int, activation_peak: int,
                     items: tuple = ()) -> StepMoments:
    """The moments of a textbook model (rule, transformer, engine): everything fixed
    is resident throughout, the forward's end holds what it saved, and with recompute
    the backward's rebuilt block holds the activation peak."""
    resident = [(name, size) for name, size in fixed.items()]
    found = [moment(SAVED_ALL, resident + [("saved by the forward", saved)])]
    if activation_peak != saved:
        found.append(moment(REBUILT, resident + [
            ("saved by the forward", "kept by the blocks and the head", saved),
            ("recompute", "rebuilt on top of them", activation_peak - saved)]))
    return StepMoments(items, tuple(found), tuple(found))
