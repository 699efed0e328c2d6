"""The table of step terms holds for every step the budget builds: each thing alive at a
moment is a term of STEP_TERMS alive in that moment, the peak is the largest moment, and
ZeRO's shards are read from the same table."""
import itertools

import pytest

import engine.budget as bm
from engine.budget import moments as M
from engine.budget.knobs import ACTIVATION_MODELS, OPTIMIZER_IMPLS, OPTIMIZERS, OUTPUTS, RECOMPUTE

SHAPES = {"gpt2": "gpt2-small", "llama": "llama2-7b"}


def _grid():
    """Every model of a step, with the knobs that change which moments it has and what is
    alive in them; a real step's loop knobs (optimizer, its implementation, outputs) too."""
    loops = [dict()] + [dict(optimizer=o) for o in OPTIMIZERS if o != "adamw"]
    real_loops = [dict(optimizer_impl=i, outputs=o) for i in OPTIMIZER_IMPLS for o in OUTPUTS]
    real_loops += [dict(optimizer=o, optimizer_impl="foreach") for o in OPTIMIZERS]
    for shape, recompute, accumulation, precision, lora_rank in itertools.product(
            SHAPES, RECOMPUTE, (1, 3), ("fp32", "bf16"), (0, 8)):
        for model in ACTIVATION_MODELS:
            for loop in (real_loops if model in ("pytorch", "hf") else loops):
                yield shape, dict(activation_model=model, recompute=recompute,
                                  accumulation=accumulation, precision=precision,
                                  lora_rank=lora_rank, micro_batch=2, seq_len=256, **loop)


@pytest.fixture(scope="module")
def steps():
    found = []
    for shape, changes in _grid():
        try:
            found.append(((shape, changes), bm.budget(bm.preset(SHAPES[shape], **changes))))
        except bm.BudgetError:
            pass            # a combination the budget refuses, with its reason
    assert len(found) > 300, f"only {len(found)} combinations were budgets"
    return found


def test_every_moment_holds_only_terms_alive_in_it(steps):
    for case, found in steps:
        step = found.activations.step
        for moment in (*step.moments, *step.first_step):
            for alive in moment.terms:
                term = M.STEP_TERMS[alive.term]
                assert moment.name in term.alive_in, (case, moment.name, alive)


def test_the_peak_is_the_largest_moment_in_every_step(steps):
    for case, found in steps:
        step = found.activations.step
        assert found.peak == max(m.bytes for m in step.moments), case
        assert found.peak_first_step == max(m.bytes for m in step.first_step), case


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_shards_what_the_table_says(stage):
    shards = {name for name, term in M.STEP_TERMS.items()
              if name in M.FIXED and term.sharded_from is not None and term.sharded_from <= stage}
    assert set(M.SHARDED[stage]) == shards
    cfg = bm.preset("gpt2-small", devices=4, zero=stage)
    found = bm.budget(cfg)
    for name in M.FIXED:
        whole, mine = found.fixed[name], found.fixed_per_device[name]
        assert mine == (-(-whole // 4) if name in shards else whole), (stage, name)
