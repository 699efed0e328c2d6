"""The fit's searches start from a guess the step's moments predict (engine.budget.fit):
whatever the guess, they give the answer a plain bisection gives, and they evaluate a
step a handful of times rather than once per bisection step. No timings are asserted
here: tools/budget_speed.py measures them."""
import itertools

import pytest

import engine.budget as bm
from engine.budget import fit


@pytest.mark.parametrize("low, high", [(1, 1), (1, 2), (1, 37), (3, 1 << 20)])
def test_a_guess_never_changes_the_answer(low, high):
    for edge, guess in itertools.product(range(low - 1, min(high, low + 40) + 1),
                                         (None, low - 5, low, low + 1, high // 2, high - 1,
                                          high, high + 9)):
        asked = []

        def fits(n):
            asked.append(n)
            assert low <= n <= high, n
            return n <= edge

        largest = edge if edge >= low else None
        assert fit.largest_fitting(fits, low, high, guess) == largest, (edge, guess)
        smallest = edge + 1 if edge < high else None
        assert fit.smallest_fitting(lambda n: not fits(n), low, high, guess) == smallest, \
            (edge, guess)


def _bisected(cfg, usable):
    """fit_answers by plain bisection over full evaluations, as the searches ran before
    they had a guess."""
    def fits(**changes):
        try:
            return fit.step_peak(cfg.with_(**changes)) <= usable
        except bm.BudgetError:
            return False
    fewest = []
    for stage in bm.ZERO_STAGES:
        n = fit.smallest_fitting(lambda d: fits(devices=d, zero=stage), 1,
                                 min(1 << 20, bm.parameter_count(cfg)))
        if n is not None:
            fewest.append((n, stage))
    return dict(fits=fits(), largest_micro_batch=fit.largest_fitting(
                    lambda b: fits(micro_batch=b), 1, 1 << 20),
                longest_sequence=fit.largest_fitting(
                    lambda n: fits(micro_batch=1, seq_len=n), 1, cfg.block_size or 1 << 24),
                fewest_devices=dict(zip(("devices", "zero"), min(fewest))) if fewest else None)


@pytest.mark.parametrize("preset, changes", [
    ("gpt2-small", dict(activation_model="hf")),
    ("gpt2-small", dict(activation_model="transformer", recompute="selective")),
    ("llama3.2-1b", dict(activation_model="hf", lora_rank=16, recompute="full")),
    ("mistral-7b", dict(activation_model="hf", attention="flash")),   # sliding window
    ("llama3.1-8b", dict(activation_model="hf", recompute="full", devices=8, zero=2)),
    ("gpt2-xl", dict(activation_model="pytorch", accumulation=4, devices=4, zero=3)),
])
def test_the_searches_answer_as_bisection_does(preset, changes):
    cfg = bm.preset(preset, **changes)
    for usable in (20 * 10**9, 80 * 10**9):
        fit.clear_caches()
        assert fit.fit_answers(cfg, usable) == _bisected(cfg, usable), usable


def test_a_device_fit_evaluates_few_steps(monkeypatch):
    """Llama 3.1 8B on 8 H100s at ZeRO 2: the fits, the largest micro-batch, the longest
    sequence and the fewest devices from at most 25 evaluations of a step (a bisection
    over each range took 108)."""
    evaluated = []
    real = fit.activations
    monkeypatch.setattr(fit, "activations", lambda cfg: evaluated.append(cfg) or real(cfg))
    fit.clear_caches()
    cfg = bm.preset("llama3.1-8b", activation_model="hf", recompute="full", attention="flash",
                    devices=8, zero=2, device="h100")
    d = bm.budget(cfg).device
    assert d.largest_micro_batch and d.longest_sequence and d.fewest_devices
    assert len(evaluated) <= 25


@pytest.mark.parametrize("preset, changes", [
    ("llama2-7b", dict(lora_rank=16, lora_targets="all-linear", dora=True)),
    ("llama2-7b", dict(lora_rank=8, modules_to_save="lm_head", qlora=True, precision="bf16")),
    ("gpt2-small", {}),
])
def test_what_a_shape_computes_once_is_what_each_setting_computes(preset, changes):
    """The trained tensors and ZeRO 3's gathered weights are computed once per shape and
    read for every batch size and device count the searches try: each equals what that
    setting computes on its own, the caches emptied."""
    from engine.budget import optimizer_step as opt
    from engine.budget import recipes, sharding
    base = bm.preset(preset, activation_model="hf", **changes)
    for micro_batch, devices, zero, accumulation in [(1, 1, 0, 1), (7, 8, 3, 4), (3, 2, 2, 2)]:
        cfg = base.with_(micro_batch=micro_batch, devices=devices, zero=zero,
                         accumulation=accumulation)
        shared = (opt.trainable_tensors(cfg), sharding.weights_gathered(cfg))
        fit.clear_caches()
        alone = (recipes.tensors(cfg, opt.parameter_tensors(cfg), opt.ParamTensor),
                 sharding._gathered.__wrapped__(cfg, False) if sharding.gathers_weights(cfg)
                 else {})
        assert shared == alone
