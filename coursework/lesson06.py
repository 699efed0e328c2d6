"""Checks for lesson 06, "Activation memory".

06.1 the bytes a ReLU MLP saves for its backward (predicted before the
lesson shows the measurement), 06.2 the float elements one GPT block saves
(kept as the piece `block_saved_elements`, which lesson 07's budget runs),
06.3 the largest micro-batch whose rule-of-thumb activations fit in a
memory. The first two are checked against what `engine.memory` measures on
our engine for several shapes, the third against `engine.budget`'s own
search, so the answer is the engine's truth, not a formula copied from
somewhere; the checks recognise the usual slips and say which one it is.
"""
from __future__ import annotations

import numpy as np

from ._core import ExerciseError, attempt, passed
from .pieces import save_piece

EX_MLP = "06.1 (mlp_saved_bytes)"
EX_BLOCK = "06.2 (block_saved_elements)"
EX_FIT = "06.3 (micro_batch_that_fits)"


def measure_mlp(batch: int, n_in: int, n_hidden: int, n_out: int, dtype=np.float64) -> int:
    """Activation bytes the tape saves for a forward and backward of
    engine.nn.MLP (ReLU) on an input of shape (batch, n_in)."""
    from engine import memory
    from engine.nn import MLP
    from engine.tensor import Tensor

    mlp = MLP(n_in, n_hidden, n_out, activation="relu", seed=batch + n_in, dtype=dtype)
    x = np.random.default_rng(0).normal(size=(batch, n_in)).astype(dtype)
    with memory.record() as mem:
        mlp(Tensor(x)).sum().backward()
    return mem.saved_bytes


def measure_block_elements(B: int, T: int, C: int, H: int, V: int = 11) -> int:
    """Float elements one engine.nn GPT block saves: the saved bytes of a
    2-block GPT minus those of a 1-block GPT, over 4 bytes (float32)."""
    from engine import memory
    from engine.gpt_config import GPTConfig, init_params
    from engine.nn import GPT

    saved = []
    rng = np.random.default_rng(B * T + C)
    ids = rng.integers(0, V, size=(B, T))
    for L in (1, 2):
        cfg = GPTConfig(vocab_size=V, block_size=T, n_layer=L, n_head=H, n_embd=C)
        model = GPT(cfg, init_params(cfg, seed=1))
        with memory.record() as mem:
            model(ids, ids).backward()
        saved.append(mem.saved_bytes)
    return (saved[1] - saved[0]) // 4


def _as_int(exercise: str, value, what: str) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ExerciseError(exercise, f"{what} should be a number, got {value!r}.") from None
    if number != int(number):
        raise ExerciseError(exercise, f"{what} should be a whole number, got {number!r}; "
                                      f"counts of elements and bytes are integers.")
    return int(number)


# ------------------------------------------------------------------ 06.1
MLP_SHAPES = [(4, 3, 5, 2, 8), (16, 8, 32, 1, 8), (1, 100, 7, 10, 8), (5, 6, 64, 3, 4)]


def check_mlp_saved_bytes(mlp_saved_bytes) -> None:
    """mlp_saved_bytes(batch, n_in, n_hidden, n_out, itemsize) must equal
    engine.memory's measurement of a ReLU MLP, for every shape."""
    for batch, n_in, n_hidden, n_out, itemsize in MLP_SHAPES:
        dtype = {8: np.float64, 4: np.float32}[itemsize]
        want = measure_mlp(batch, n_in, n_hidden, n_out, dtype)
        got = _as_int(EX_MLP, attempt(EX_MLP, mlp_saved_bytes, batch, n_in, n_hidden, n_out,
                                      itemsize), "mlp_saved_bytes(...)")
        if got == want:
            continue
        shape = (f"batch={batch}, n_in={n_in}, n_hidden={n_hidden}, n_out={n_out}, "
                 f"itemsize={itemsize}")
        e = itemsize
        known = {
            e * batch * (n_in + 2 * n_hidden):
                "you counted the ReLU output twice. ReLU saves its output and fc2's matmul "
                "saves its input, but those are the same array: one buffer, counted once.",
            want + e * (n_in * n_hidden + n_hidden * n_out):
                "you added the weight matrices. The matmuls do keep a reference to their "
                "weights, but weights exist anyway: they are not activation memory.",
            want + e * (n_in * n_hidden + n_hidden * n_out + n_hidden + n_out):
                "you added the parameters (weights and biases); they are not activations.",
            want // e:
                "that is the number of elements; multiply by itemsize to get bytes.",
            e * batch * n_hidden:
                "fc1's matmul also keeps its input x: the weight gradient is x^T @ g.",
            e * batch * (n_in + n_hidden + n_out):
                "the network's output is not saved: no VJP needs it (the sum saves nothing).",
            e * batch * (n_in + 2 * n_hidden + n_out):
                "count only what a VJP reads: the output is not needed, and ReLU's output is "
                "the same buffer fc2 keeps.",
        }
        hint = known.get(got, "list the ops (matmul, bias add, relu, matmul, bias add, sum) "
                              "and for each one the array its VJP reads; bias adds and the "
                              "sum need nothing.")
        raise ExerciseError(EX_MLP, f"for {shape} you say {got:,} bytes, the engine measured "
                                    f"{want:,}. Hint: {hint}")
    passed(EX_MLP, f"{len(MLP_SHAPES)} shapes, each equal to engine.memory's measurement.")


# ------------------------------------------------------------------ 06.2
BLOCK_SHAPES = [(2, 8, 16, 2), (1, 16, 32, 4), (3, 5, 24, 3)]


def check_block_saved_elements(block_saved_elements) -> None:
    """block_saved_elements(B, T, C, H) must equal the float elements one
    engine.nn block saves, as measured."""
    for B, T, C, H in BLOCK_SHAPES:
        want = measure_block_elements(B, T, C, H)
        got = _as_int(EX_BLOCK, attempt(EX_BLOCK, block_saved_elements, B, T, C, H),
                      "block_saved_elements(...)")
        if got == want:
            continue
        btc, bt, att = B * T * C, B * T, B * H * T * T
        known = {
            want - att: "causal_attention keeps its probabilities att, one T x T matrix per "
                        "head and sequence: B*H*T*T elements.",
            want - att + B * T * T: "att has one T x T matrix per head: B*H*T*T, not B*T*T.",
            want - 2 * bt: "each layer norm also keeps rstd, one number per row (B*T each).",
            want - 4 * btc: "the GELU keeps its input u and fc-proj keeps GELU's output: two "
                            "different (B,T,4C) arrays.",
            want + 3 * btc: "q, k and v are views of the one qkv buffer (B,T,3C); the tape "
                            "keeps that buffer once.",
            want - 6 * btc: "the MLP is 4C wide: its hidden arrays are (B,T,4C).",
            want + 2 * btc: "the residual stream x itself is not saved: layer norm keeps xhat "
                            "and rstd, and the adds save nothing.",
            4 * want: "that looks like bytes (x4); the exercise asks for elements.",
        }
        hint = known.get(got, "go through Block.forward op by op: ln1, qkv matmul, attention, "
                              "proj matmul, ln2, fc matmul, gelu, fcproj matmul; write down "
                              "what each VJP reads and its shape.")
        raise ExerciseError(EX_BLOCK, f"for B={B}, T={T}, C={C}, H={H} you say {got:,} "
                                      f"elements, the engine measured {want:,} "
                                      f"({want / btc:.3g} x B*T*C). Hint: {hint}")
    save_piece("block_saved_elements", block_saved_elements, EX_BLOCK)
    passed(EX_BLOCK, f"{len(BLOCK_SHAPES)} shapes, each equal to engine.memory's measurement.")


# ------------------------------------------------------------------ 06.3
GB = 10 ** 9


def _fit_cases():
    """(memory bytes, BudgetConfig on the 'rule' model): the two worked examples, an exact
    fit (the memory is 5 sequences to the byte), a memory smaller than one sequence."""
    from engine import budget
    odd = budget.BudgetConfig(n_layer=3, d_model=96, n_head=4, seq_len=40,
                              activation_model="rule", tensors_per_layer=7)
    one_odd = 40 * 96 * 7 * 3 * budget.STORAGE_BYTES[odd.precision]
    return [(80 * GB, budget.preset("7b-example")), (16 * GB, budget.preset("24-layer-example")),
            (40 * GB, budget.preset("24-layer-example")), (5 * one_odd, odd),
            (one_odd - 1, odd)]


def engine_micro_batch_that_fits(memory_bytes: int, cfg) -> int:
    """engine.budget's answer: its search for the largest micro-batch whose activations
    (cfg's 'rule' model, nothing else resident) fit in memory_bytes; 0 if none does."""
    from engine import budget
    return budget.largest_micro_batch(cfg, 0, memory_bytes) or 0


def check_micro_batch_that_fits(micro_batch_that_fits) -> None:
    """micro_batch_that_fits(memory_bytes, N, d, L, k, bytes_per_element) = the largest
    B whose B x N x d x k x L x bytes fit, as engine.budget's search finds it."""
    from engine import budget
    for memory, cfg in _fit_cases():
        e = budget.STORAGE_BYTES[cfg.precision]
        N, d, L, k = cfg.seq_len, cfg.d_model, cfg.n_layer, cfg.tensors_per_layer
        want = engine_micro_batch_that_fits(memory, cfg)
        value = attempt(EX_FIT, micro_batch_that_fits, memory, N, d, L, k, e)
        case = (f"for {budget.human_bytes(memory)} ({memory:,} bytes), N={N}, d={d}, L={L}, "
                f"k={k}, {e} bytes per element")
        if value is None:
            raise ExerciseError(EX_FIT, f"{case} you return None. Hint: when not even one "
                                        f"sequence fits, the answer is the number 0.")
        try:
            whole = float(value) == int(float(value))
        except (TypeError, ValueError, OverflowError):
            whole = True                      # _as_int below says what is wrong
        if not whole:
            raise ExerciseError(EX_FIT, f"{case} you say B={float(value):.6g}. Hint: a "
                                        f"micro-batch is a whole number of sequences, and a "
                                        f"part of one does not run: how many *whole* "
                                        f"sequences fit? (floor division, //)")
        got = _as_int(EX_FIT, value, "micro_batch_that_fits(...)")
        if got == want:
            continue
        one = N * d * k * L * e
        slips = [   # (the answer of a typical slip, its hint); the first that matches wins
            (memory // (N * d * k * e), "that is how many sequences fit in one layer; every "
                                        "layer keeps its own k tensors (x L)."),
            (memory // (N * d * L * e), "each layer keeps k tensors of B x N x d, not one."),
            (memory // (N * d * k * L), "that counts elements, not bytes: multiply one "
                                        "sequence's elements by the bytes per element."),
            (memory // (one * 8), f"that counts bits: e = {e} is already bytes per element, "
                                  f"and the memory is in bytes, so no factor of 8."),
            (memory * 8 // one, f"that turns the memory into bits but prices an element in "
                                f"bytes (e = {e}): both are bytes already, no factor of 8."),
            (round(memory / one), f"B={got} does not fit ({got * one:,} bytes > {memory:,}): "
                                  f"round the division down, not to the nearest."),
            (-(-memory // one), f"B={got} does not fit ({got * one:,} bytes > {memory:,}): "
                                f"round the division down, not up."),
            (want - 1, f"B={want} fits too: {want} x {one:,} = {want * one:,} bytes, not more "
                       f"than {memory:,}. A batch that fills the memory exactly fits (<=, "
                       f"not <)."),
        ]
        if want == 0:
            slips.insert(0, (1, f"not even one sequence fits ({one:,} bytes > {memory:,}): the "
                             f"answer is 0, not a micro-batch of 1 that cannot run."))
        elif want > 2 and got == 1 << (want.bit_length() - 1):
            slips.append((got, f"B={got} is the largest power of two that fits, but the "
                               f"question is the largest micro-batch of any size."))
        hint = next((h for v, h in slips if v == got), None)
        if hint is None and got > want:
            hint = f"B={got} needs {got * one:,} bytes, more than {memory:,}."
        raise ExerciseError(EX_FIT, f"{case} you say B={got}, engine.budget finds B={want}. "
                                    "Hint: " + (hint or "one sequence keeps k tensors of "
                                                        "N x d in each of L layers, at the "
                                                        "bytes per element; how many whole "
                                                        "sequences fit?"))
    passed(EX_FIT, f"the 7B example fits {engine_micro_batch_that_fits(*_fit_cases()[0])} "
                   f"sequences of activations in 80 GB; the 24-layer example "
                   f"{engine_micro_batch_that_fits(*_fit_cases()[1])} in 16 GB.")


# ------------------------------------------------------------------ the notebook
#: Each exercise function of the lesson, and its exercise.
EXERCISE_FUNCTIONS = {"mlp_saved_bytes": EX_MLP, "block_saved_elements": EX_BLOCK,
                      "micro_batch_that_fits": EX_FIT}


def name_unfinished_exercises() -> None:
    """In the notebook, a cell that needs an unfinished exercise of this lesson says which."""
    from . import _core
    _core.name_unfinished_exercises(EXERCISE_FUNCTIONS)
