"""Recipes of a real step beside AdamW and the usual loops: the terms the optimizer and
the loop emit, transformers' Adafactor, bitsandbytes' 8-bit AdamW, a loop that frees
its output after the backward, and bf16 weights trained without autocast. Each is
modelled from the library's code and measured on this CPU (skipped, with the reason,
where the library is missing)."""
from __future__ import annotations

import importlib.util

import pytest

import engine.budget as bm
from engine.budget import framework_step as fs
from engine.budget import moments as M
from engine.budget import optimizer_step as opt
from engine.budget.config import BudgetConfig
from engine.budget.real_step import kept_output_terms

SMALL = dict(n_layer=2, d_model=64, n_head=4, vocab_size=3000, seq_len=32, micro_batch=2)


def _missing(*modules) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


# ------------------------------------------------ terms emitted by their makers
@pytest.mark.parametrize("changes", [
    dict(activation_model="pytorch"), dict(activation_model="hf", outputs="kept"),
    dict(activation_model="hf", accumulation=2, optimizer_impl="foreach"),
])
def test_the_optimizer_and_the_loop_name_their_own_terms(changes):
    cfg = BudgetConfig(**SMALL, **changes).validate()
    tensors = opt.trainable_tensors(cfg)
    made = [*opt.optimizer_temporaries("adamw", "for-loop", [[t.numel for t in tensors]]),
            *opt.backward_end_terms([t.numel for t in tensors], 4, tensors[0].numel,
                                    True, cfg.accumulation > 1, False),
            *(a for terms in kept_output_terms(cfg, "cpu").values() for a in terms)]
    assert made and all(isinstance(a, M.Alive) for a in made)
    assert {a.term for a in made} <= set(M.STEP_TERMS)
    # every other parameter's gradient is a gradient, not one of the backward's last
    assert any(a.term == "gradients" and a.what.startswith("gradients of every other")
               for a in made) == (cfg.accumulation == 1)
    assert not hasattr(fs, "_tag")
