"""The exercise checks of lessons 06-07: right answers (also those written
another way) pass, typical wrong answers fail with the hint that names them."""
from __future__ import annotations

import pytest

from coursework import lesson07
from engine import budget as bm
from check_tools import fails_with


# ---------------------------------------------------------------- 07.1
def flops_full(P, L, N, d):
    return 3 * (2 * P + 4 * L * N * d)


def flops_causal_half(P, L, N, d):
    return 3 * (2 * P + 2 * L * N * d)


def test_07_1_full_attention_passes(capsys):
    lesson07.check_training_flops(flops_full)
    out = capsys.readouterr().out
    assert "passed" in out and "causal" not in out


def test_07_1_causal_half_passes_and_both_conventions_are_explained(capsys):
    lesson07.check_training_flops(flops_causal_half)
    out = capsys.readouterr().out
    assert "passed" in out and "causal half" in out and "full N x N" in out


def test_07_1_mixed_conventions_fail():
    def mixed(P, L, N, d):
        return flops_full(P, L, N, d) if N > 512 else flops_causal_half(P, L, N, d)
    fails_with(lesson07.check_training_flops, mixed, words=("one convention",))


def test_07_1_forward_only_still_named():
    fails_with(lesson07.check_training_flops, lambda P, L, N, d: 2 * P + 4 * L * N * d,
               words=("forward pass only",))


# ---------------------------------------------------------------- 07.2
def right_bytes(precision, optimizer):
    storage = 4 if precision == "fp32" else 2
    master = 0 if precision == "fp32" else 4
    return storage + master + storage + 4 * {"sgd": 0, "momentum": 1, "adamw": 2}[optimizer]


def bytes_with(**slip):
    def answer(precision, optimizer):
        storage = 4 if precision == "fp32" else 2
        master = 0 if precision == "fp32" or slip.get("no_master") else 4
        grad = 0 if slip.get("no_grad") else (4 if slip.get("fp32_grad") else storage)
        per_buffer = storage if slip.get("state_in_storage") else 4
        return storage + master + grad + per_buffer * {"sgd": 0, "momentum": 1,
                                                        "adamw": 2}[optimizer]
    return answer


def test_07_2_right_answer_passes(capsys):
    lesson07.check_fixed_bytes_per_parameter(right_bytes)
    assert "16 bytes" in capsys.readouterr().out


@pytest.mark.parametrize("slip, words", [
    ("no_grad", ("left out the gradient buffer",)),
    ("no_master", ("master copy",)),
    ("state_in_storage", ("optimizer state in the storage precision",)),
    ("fp32_grad", ("18 bytes", "fp32 gradient")),
])
def test_07_2_each_slip_gets_its_own_hint(slip, words):
    """A forgotten gradient buffer and bf16 optimizer state give the same 10 bytes for
    bf16 + momentum; the hint must still name the right one."""
    message = fails_with(lesson07.check_fixed_bytes_per_parameter, bytes_with(**{slip: True}),
                         words=words)
    others = {"no_grad": "left out the gradient buffer", "no_master": "master copy",
              "state_in_storage": "optimizer state in the storage"}
    for name, phrase in others.items():
        if name != slip and slip != "fp32_grad":
            assert phrase not in message


# ---------------------------------------------------------------- 07.3
def crossover(which):
    def find(cfg):
        fixed = bm.budget(cfg).fixed_total
        b = 1
        while getattr(bm.activations(cfg.with_(micro_batch=b)), which) <= fixed:
            b += 1
        return b
    return find


def test_07_3_peak_passes(capsys):
    lesson07.check_crossover_batch(crossover("peak"))
    assert "passed" in capsys.readouterr().out


def test_07_3_saved_instead_of_peak_is_rejected():
    fails_with(lesson07.check_crossover_batch, crossover("saved"),
               words=("peak", "not only what is saved"))
