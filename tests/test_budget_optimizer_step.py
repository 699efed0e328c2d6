"""The optimizer step's temporaries and the end of the backward
(`engine.budget.optimizer_step`): the pure functions, then torch's own
allocator on this CPU (skipped without torch or transformers) at shapes where
each term decides the peak."""
from __future__ import annotations

import dataclasses
import importlib.util

import pytest

import engine.budget as bm
from engine.budget import optimizer_step as opt
from engine.budget.config import BudgetConfig
from engine.budget import moments as M
from engine.budget.counts import fixed_bytes, parameter_count
from engine.budget.framework_step import framework_step

SIZES = [1_000_000, 300_000, 200_000, 50_000]   # P = 1.55M, largest 1M


# ------------------------------------------------------------ torch-free
@pytest.mark.parametrize("changes", [
    dict(), dict(tied_embedding=False), dict(d_ff=200, block_size=96),
    dict(architecture="llama", n_kv_head=2, tied_embedding=False),
    dict(architecture="llama", n_kv_head=1, tied_embedding=True, d_head=48),
])
def test_the_parameter_tensors_add_up_to_the_parameter_count(changes):
    cfg = BudgetConfig(n_layer=3, d_model=96, n_head=4, vocab_size=500, seq_len=64,
                       **changes).validate()
    tensors = opt.parameter_tensors(cfg)
    assert sum(t.numel for t in tensors) == parameter_count(cfg)
    assert tensors[0].numel == cfg.vocab_size * cfg.d_model  # the token embedding
    heads = [t for t in tensors if t.name == "lm_head.weight"]
    assert len(heads) == (0 if cfg.tied_embedding else 1)


def test_the_trainer_groups_biases_and_norms_apart_and_a_plain_loop_uses_one_group():
    cfg = BudgetConfig(n_layer=2, d_model=64, n_head=4, vocab_size=100, seq_len=32,
                       activation_model="hf").validate()
    decay, no_decay = opt.param_groups(cfg, opt.parameter_tensors(cfg))
    C = 64
    # per block: 2 layer norms (2C each) and the qkv, projection, fc, fc-proj biases
    assert sum(no_decay) == 2 * (4 * C + 3 * C + C + 4 * C + C) + 2 * C
    assert sum(decay) + sum(no_decay) == parameter_count(cfg)
    plain = cfg.with_(activation_model="pytorch")
    assert opt.param_groups(plain, opt.parameter_tensors(plain)) == [
        [t.numel for t in opt.parameter_tensors(plain)]]


@pytest.mark.parametrize("optimizer, impl, groups, weight_decay, elements", [
    ("adamw", "for-loop", [SIZES], False, 2 * 1_000_000),       # sqrt and quotient, largest
    ("adamw", "foreach", [SIZES], False, 1_550_000),            # _foreach_sqrt, whole group
    ("adamw", "foreach", [SIZES[:1], SIZES[1:]], False, 1_000_000),  # the larger group
    ("adamw", "fused", [SIZES], False, 0),
    ("sgd", "for-loop", [SIZES], False, 0),
    ("momentum", "foreach", [SIZES], False, 0),
    ("momentum", "fused", [SIZES], True, 0),
    ("sgd", "for-loop", [SIZES], True, 1_000_000),             # grad.add(param), largest
    ("momentum", "foreach", [SIZES], True, 1_550_000),         # _foreach_add, whole group
])
def test_each_implementation_allocates_what_its_code_does(optimizer, impl, groups,
                                                           weight_decay, elements):
    terms = opt.optimizer_temporaries(optimizer, impl, groups, 4, weight_decay)
    assert sum(b for _, b in terms) == 4 * elements


def test_an_unknown_implementation_is_named():
    with pytest.raises(ValueError, match="'loop'.*for-loop, foreach, fused"):
        opt.optimizer_temporaries("adamw", "loop", [SIZES])


def test_the_for_loop_keeps_todays_adamw_term_and_foreach_costs_a_whole_model_at_7b():
    cfg = bm.preset("gpt2-small", activation_model="pytorch")
    loop = opt.optimizer_temporaries("adamw", "for-loop",
                                     opt.param_groups(cfg, opt.parameter_tensors(cfg)))
    assert sum(b for _, b in loop) == 2 * 4 * 50257 * 768
    # LLaMA-2-7B under the Trainer: foreach's sqrt list is the decay group, all but
    # the norm gains: about 27 GB (25 GiB) on top of weights, gradients and state
    llama = bm.preset("llama2-7b", activation_model="hf")
    decay, norms = opt.param_groups(llama, opt.parameter_tensors(llama))
    assert sum(norms) == (2 * 32 + 1) * 4096
    foreach = opt.optimizer_temporaries("adamw", "foreach", [decay, norms])
    assert sum(b for _, b in foreach) == 4 * (parameter_count(llama) - sum(norms))


P, E = 3_000_000, 2_000_000   # parameters, of which the token embedding (V x C)


@pytest.mark.parametrize("tied, later, autocast, elements", [
    (True, False, False, P + 2 * E),     # other grads, head's, embedding's, their sum
    (True, True, False, P + 3 * E),      # earlier grads and the three
    (True, False, True, P + E),          # autocast: the sum goes in place
    (True, True, True, P + 2 * E),
    (False, False, False, P),            # an untied embedding's gradient is stolen
    (False, True, False, P + E),         # ... or added in place, beside the earlier ones
])
def test_the_end_of_the_backward(tied, later, autocast, elements):
    terms = opt.backward_end_terms(P * 4, E * 4, tied, later, autocast)
    assert sum(b for _, b in terms) == 4 * elements
    assert any("sum" in what for what, _ in terms) == (tied and not autocast)


def _with_impl(cfg: BudgetConfig, impl: str) -> BudgetConfig:
    """`cfg` running `impl` (the config's own knob when it has one)."""
    if "optimizer_impl" in {f.name for f in dataclasses.fields(BudgetConfig)}:
        return cfg.with_(optimizer_impl=impl)
    object.__setattr__(cfg, "optimizer_impl", impl)
    return cfg


def test_the_moments_hold_the_resident_bytes_and_step_one_has_no_state():
    cfg = _with_impl(BudgetConfig(n_layer=2, d_model=64, n_head=4, vocab_size=5000,
                                  seq_len=8, micro_batch=1, activation_model="hf",
                                  optimizer="momentum").validate(), "foreach")
    fixed = fixed_bytes(cfg)
    P, E = parameter_count(cfg), 5000 * 64
    step = framework_step(cfg, fixed)
    step2 = {m.name: m for m in step.moments}
    step1 = {m.name: m for m in step.first_step}
    # weights, state, every gradient and the tied head's two contributions
    assert step2[M.BACKWARD_END].bytes == 4 * (P + P + P + 2 * E)
    assert "optimizer state" not in dict(step1[M.BACKWARD_END].alive)
    temporaries = opt.optimizer_temporaries(
        "momentum", "foreach", opt.param_groups(cfg, opt.trainable_tensors(cfg)), 4)
    assert temporaries == []    # momentum's foreach update runs in place
    assert step2[M.OPTIMIZER_STEP].bytes == 3 * 4 * P
    assert step1[M.OPTIMIZER_STEP].bytes == step2[M.OPTIMIZER_STEP].bytes


# -------------------------------------------------- measured on this CPU
def _missing(*modules):
    return [m for m in modules if importlib.util.find_spec(m) is None]


needs_torch = pytest.mark.skipif(bool(_missing("torch")), reason="PyTorch is not installed "
                                 "(pip install -e '.[torch]')")


@needs_torch
@pytest.mark.parametrize("optimizer", ["adamw", "sgd", "momentum"])
@pytest.mark.parametrize("impl", opt.IMPLS)
@pytest.mark.parametrize("weight_decay", [False, True])
def test_the_temporaries_are_what_the_cpu_allocator_sees_inside_step(optimizer, impl,
                                                                     weight_decay):
    """Inside `step()` alone, above what was alive before it: step 1 creates the
    state, step 2 only the temporaries (two param groups, as the Trainer's)."""
    import torch
    params = [torch.nn.Parameter(torch.randn(n)) for n in SIZES]
    for p in params:
        p.grad = torch.randn_like(p)
    groups = [{"params": params[:1]}, {"params": params[1:]}]
    decay = 0.1 if weight_decay else 0.0
    if optimizer == "adamw":
        o = torch.optim.AdamW(groups, lr=1e-3, weight_decay=decay, **opt.TORCH_SWITCHES[impl])
    else:
        o = torch.optim.SGD(groups, lr=1e-3, weight_decay=decay, **opt.TORCH_SWITCHES[impl],
                            momentum=opt.MOMENTUM if optimizer == "momentum" else 0.0)
    _peak_inside(o)  # step 1: the state appears
    predicted = sum(b for _, b in opt.optimizer_temporaries(
        optimizer, impl, [SIZES[:1], SIZES[1:]], 4, weight_decay and optimizer != "adamw"))
    assert _peak_inside(o) == pytest.approx(predicted, abs=64)  # step tensors: bytes


@needs_torch
@pytest.mark.parametrize("sizes", [[1_000_000] * 4, [50_000, 1_000_000, 300_000],
                                   [300_000, 1_000_000, 1_000_000, 200_000]])
def test_the_for_loops_denominators_overlap_the_previous_parameters(sizes):
    """`denom` still holds the previous parameter's quotient while the next one's
    sqrt and quotient are made: equal sizes hold three at once, not two."""
    import torch
    params = [torch.nn.Parameter(torch.randn(n)) for n in sizes]
    for p in params:
        p.grad = torch.randn_like(p)
    o = torch.optim.AdamW(params, lr=1e-3, **opt.TORCH_SWITCHES["for-loop"])
    _peak_inside(o)
    predicted = sum(b for _, b in opt.optimizer_temporaries("adamw", "for-loop", [sizes], 4))
    assert _peak_inside(o) == pytest.approx(predicted, abs=64)


def _peak_inside(optimizer) -> int:
    """The most the CPU allocator held during `optimizer.step()` above before it."""
    import json
    import os
    import tempfile

    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        optimizer.step()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("name") == "[memory]"]
    finally:
        os.remove(path)
    events.sort(key=lambda e: e["ts"])
    if not events:
        return 0
    start = events[0]["args"]["Total Allocated"] - events[0]["args"]["Bytes"]
    return max(0, *(e["args"]["Total Allocated"] - start for e in events))


# Shapes where each term decides a peak: many parameters and few activations
# (micro-batch 1, 16 tokens); a wide model with a small vocabulary for the
# optimizer's temporaries, a large vocabulary for the tied head.
WIDE = dict(n_layer=4, d_model=256, n_head=4, vocab_size=1000, micro_batch=1, seq_len=16,
            attention="flash")
BIG_VOCAB = dict(n_layer=2, d_model=128, n_head=4, vocab_size=20000, micro_batch=1,
                 seq_len=16, attention="flash")
LLAMA = dict(architecture="llama", n_kv_head=2, tied_embedding=False)
AUTOCAST = dict(precision="bf16", backend="cpu")
# (framework, optimizer, implementation, shape, the moment that decides steps 2 and 1)
CPU_CASES = [
    ("pytorch", "adamw", "foreach", WIDE, "the optimizer step", "the optimizer step"),
    ("hf", "adamw", "foreach", WIDE, "the optimizer step", "the optimizer step"),
    ("hf", "adamw", "foreach", {**WIDE, **LLAMA}, "the optimizer step", "the optimizer step"),
    ("pytorch", "adamw", "for-loop", WIDE, None, "the optimizer step"),
    ("hf", "adamw", "fused", {**WIDE, **LLAMA}, None, None),
    ("hf", "adamw", "fused", BIG_VOCAB, "the end of the backward", "the optimizer step"),
    ("hf", "sgd", "for-loop", BIG_VOCAB, "the end of the backward", "the end of the backward"),
    ("pytorch", "sgd", "foreach", BIG_VOCAB, "the end of the backward", "the end of the backward"),
    ("hf", "momentum", "fused", BIG_VOCAB, "the end of the backward", "the end of the backward"),
    ("pytorch", "momentum", "for-loop", BIG_VOCAB, "the end of the backward",
     "the end of the backward"),
    ("hf", "sgd", "for-loop", {**BIG_VOCAB, "accumulation": 2}, "the end of the backward",
     "the end of the backward"),
    ("pytorch", "adamw", "fused", {**BIG_VOCAB, "accumulation": 2}, "the end of the backward",
     "the end of the backward"),
    ("hf", "sgd", "foreach", {**BIG_VOCAB, **LLAMA, "accumulation": 2}, "the head's backward",
     "the head's backward"),
    ("hf", "momentum", "fused", {**BIG_VOCAB, "tied_embedding": False, "accumulation": 2},
     "the head's backward", "the optimizer step"),
    # autocast (bf16 on the CPU backend): the head's contribution is a fresh fp32 copy,
    # so the tied weight's two contributions are summed in place
    ("hf", "sgd", "for-loop", {**BIG_VOCAB, **AUTOCAST}, "the end of the backward",
     "the end of the backward"),
    ("pytorch", "sgd", "foreach", {**BIG_VOCAB, **AUTOCAST, "accumulation": 2},
     "the end of the backward", "the end of the backward"),
]


def _predicted(cfg: BudgetConfig) -> tuple:
    """((bytes, moment) of step 2's peak, the same of step 1's), from the budget's
    own step (engine.budget.framework_step), whose moments use this module's terms."""
    from engine.budget.framework_step import framework_step
    step = framework_step(cfg, fixed_bytes(cfg), device="cpu")
    return ((step.peak_moment.bytes, step.peak_moment.name),
            (step.first_step_peak_moment.bytes, step.first_step_peak_moment.name))


@pytest.mark.parametrize("model, optimizer, impl, shape, decides, decides_first", CPU_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3].get('architecture', 'gpt2')}-"
                              f"V{c[3]['vocab_size']}-acc{c[3].get('accumulation', 1)}"
                              for c in CPU_CASES])
def test_each_optimizer_step_matches_pytorch_on_this_cpu(model, optimizer, impl, shape,
                                                         decides, decides_first):
    if _missing("torch") or (model == "hf" and _missing("transformers")):
        pytest.skip("torch and transformers are not installed (pip install -e "
                    "'.[transformers]')")
    if "backend" in shape and "backend" not in {f.name for f in dataclasses.fields(BudgetConfig)}:
        pytest.skip("the budget has no CPU backend to predict an autocast step on the CPU")
    from engine.budget.lab.torch_step import measure_step
    cfg = _with_impl(BudgetConfig(activation_model=model, optimizer=optimizer,
                                  **shape).validate(), impl)
    m = measure_step(cfg, device="cpu")
    (peak, moment), (first, first_moment) = _predicted(m.config)
    assert peak == pytest.approx(m.peak, rel=0.05)
    assert first == pytest.approx(m.peak_first_step, rel=0.05)
    # where the step's own terms tie (fused AdamW untied: the end of the backward holds
    # what the optimizer step does) any moment names the peak
    if decides:
        assert moment == decides
    if decides_first:
        assert first_moment == decides_first
