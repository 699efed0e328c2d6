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

from functools import lru_cache

import numpy as np

from ._cases import Case, Slip, compare_over_cases
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


def _mlp_cases() -> list[Case]:
    """The story's MLPs, then three seeded random ones (float32 and float64)."""
    rng = np.random.default_rng(61)
    shapes = list(MLP_SHAPES) + [
        (int(rng.integers(1, 9)), int(rng.integers(1, 21)), int(rng.integers(1, 41)),
         int(rng.integers(1, 6)), int(rng.choice([4, 8]))) for _ in range(3)]
    return [Case(shape, "for batch={}, n_in={}, n_hidden={}, n_out={}, itemsize={}".format(
        *shape)) for shape in shapes]


@lru_cache(maxsize=None)
def measured_mlp_bytes(batch: int, n_in: int, n_hidden: int, n_out: int, itemsize: int) -> int:
    """measure_mlp at the exercise's arguments (itemsize 8 or 4), kept once measured."""
    return measure_mlp(batch, n_in, n_hidden, n_out, {8: np.float64, 4: np.float32}[itemsize])


def _mlp_slips() -> list[Slip]:
    """The usual miscounts, each reproduced from the same arguments."""
    return [
        Slip(lambda b, i, h, o, e: e * b * (i + 2 * h),
             "you counted the ReLU output twice. ReLU saves its output and fc2's matmul saves "
             "its input, but those are the same array: one buffer, counted once."),
        Slip(lambda b, i, h, o, e: measured_mlp_bytes(b, i, h, o, e) + e * (i * h + h * o),
             "you added the weight matrices. The matmuls do keep a reference to their "
             "weights, but weights exist anyway: they are not activation memory."),
        Slip(lambda b, i, h, o, e: measured_mlp_bytes(b, i, h, o, e) + e * (i * h + h * o + h
                                                                            + o),
             "you added the parameters (weights and biases); they are not activations."),
        Slip(lambda b, i, h, o, e: measured_mlp_bytes(b, i, h, o, e) // e,
             "that is the number of elements; multiply by itemsize to get bytes."),
        Slip(lambda b, i, h, o, e: e * b * h,
             "fc1's matmul also keeps its input x: the weight gradient is x^T @ g."),
        Slip(lambda b, i, h, o, e: e * b * (i + h + o),
             "the network's output is not saved: no VJP needs it (the sum saves nothing)."),
        Slip(lambda b, i, h, o, e: e * b * (i + 2 * h + o),
             "count only what a VJP reads: the output is not needed, and ReLU's output is the "
             "same buffer fc2 keeps."),
    ]


def _saved_apart(unit: str):
    def apart(got, want, case: Case) -> str:
        return (f"you say {got:,} {unit}, the engine measured {want:,} (yours is "
                f"{got - want:+,} {unit} off)")
    return apart


def check_mlp_saved_bytes(mlp_saved_bytes) -> None:
    """mlp_saved_bytes(batch, n_in, n_hidden, n_out, itemsize) must equal
    engine.memory's measurement of a ReLU MLP, for every shape."""
    cases = _mlp_cases()
    compare_over_cases(
        EX_MLP, mlp_saved_bytes, measured_mlp_bytes, cases, slips=_mlp_slips(),
        read=lambda value, case: _as_int(EX_MLP, value, "mlp_saved_bytes(...)"),
        difference=_saved_apart("bytes"),
        neutral_hint="Hint: list the ops (matmul, bias add, relu, matmul, bias add, sum) and "
                     "for each one the array its VJP reads.")
    passed(EX_MLP, f"{len(cases)} shapes (the lesson's {len(MLP_SHAPES)} and "
                   f"{len(cases) - len(MLP_SHAPES)} generated), each equal to engine.memory's "
                   f"measurement.")


# ------------------------------------------------------------------ 06.2
BLOCK_SHAPES = [(2, 8, 16, 2), (1, 16, 32, 4), (3, 5, 24, 3)]


def _block_cases() -> list[Case]:
    """The story's blocks, then two seeded random small ones."""
    rng = np.random.default_rng(62)
    shapes = list(BLOCK_SHAPES)
    for _ in range(2):
        H = int(rng.integers(1, 4))
        shapes.append((int(rng.integers(1, 4)), int(rng.integers(2, 13)),
                       H * int(rng.integers(2, 7)), H))
    return [Case(shape, "for B={}, T={}, C={}, H={}".format(*shape)) for shape in shapes]


@lru_cache(maxsize=None)
def measured_block_elements(B: int, T: int, C: int, H: int) -> int:
    """measure_block_elements, kept once measured."""
    return measure_block_elements(B, T, C, H)


def _block_slips() -> list[Slip]:
    """The usual miscounts, each reproduced from the same arguments."""
    def off(delta):
        return lambda B, T, C, H: measured_block_elements(B, T, C, H) + delta(B, T, C, H)
    return [
        Slip(off(lambda B, T, C, H: -B * H * T * T),
             "causal_attention keeps its probabilities att, one T x T matrix per head and "
             "sequence: B*H*T*T elements."),
        Slip(off(lambda B, T, C, H: -B * H * T * T + B * T * T),
             "att has one T x T matrix per head: B*H*T*T, not B*T*T."),
        Slip(off(lambda B, T, C, H: -2 * B * T),
             "each layer norm also keeps rstd, one number per row (B*T each)."),
        Slip(off(lambda B, T, C, H: -4 * B * T * C),
             "the GELU keeps its input u and fc-proj keeps GELU's output: two different "
             "(B,T,4C) arrays."),
        Slip(off(lambda B, T, C, H: 3 * B * T * C),
             "q, k and v are views of the one qkv buffer (B,T,3C); the tape keeps that buffer "
             "once."),
        Slip(off(lambda B, T, C, H: -6 * B * T * C),
             "the MLP is 4C wide: its hidden arrays are (B,T,4C)."),
        Slip(off(lambda B, T, C, H: 2 * B * T * C),
             "the residual stream x itself is not saved: layer norm keeps xhat and rstd, and "
             "the adds save nothing."),
        Slip(lambda B, T, C, H: 4 * measured_block_elements(B, T, C, H),
             "that looks like bytes (x4); the exercise asks for elements."),
    ]


def check_block_saved_elements(block_saved_elements) -> None:
    """block_saved_elements(B, T, C, H) must equal the float elements one
    engine.nn block saves, as measured."""
    cases = _block_cases()
    compare_over_cases(
        EX_BLOCK, block_saved_elements, measured_block_elements, cases,
        slips=_block_slips(),
        read=lambda value, case: _as_int(EX_BLOCK, value, "block_saved_elements(...)"),
        difference=lambda got, want, case: _saved_apart("elements")(got, want, case) + (
            f"; the measurement is {want / (case.args[0] * case.args[1] * case.args[2]):.3g} "
            f"x B*T*C"),
        neutral_hint="Hint: go through Block.forward op by op: ln1, qkv matmul, attention, "
                     "proj matmul, ln2, fc matmul, gelu, fcproj matmul; write down what each "
                     "VJP reads and its shape.")
    save_piece("block_saved_elements", block_saved_elements, EX_BLOCK)
    passed(EX_BLOCK, f"{len(cases)} shapes (the lesson's {len(BLOCK_SHAPES)} and "
                     f"{len(cases) - len(BLOCK_SHAPES)} generated), each equal to "
                     f"engine.memory's measurement.")


# ------------------------------------------------------------------ 06.3
GB = 10 ** 9


def _rule_config(N: int, d: int, L: int, k: int, e: int):
    """engine.budget's 'rule' model of a stack: L layers keeping k tensors of N x d each,
    at e bytes per element."""
    from engine import budget
    precision = {4: "fp32", 2: "bf16"}[e]
    return budget.BudgetConfig(n_layer=L, d_model=d, n_head=1, seq_len=N, precision=precision,
                               activation_model="rule", tensors_per_layer=k)


def _fit_args(memory: int, cfg) -> tuple:
    from engine import budget
    return (memory, cfg.seq_len, cfg.d_model, cfg.n_layer, cfg.tensors_per_layer,
            budget.STORAGE_BYTES[cfg.precision])


def _fit_cases() -> list[Case]:
    """The two worked examples and the 24-layer one in 40 GB; an exact fit (the memory is 5
    sequences to the byte) and a memory one byte short of one sequence; then seeded random
    stacks, each with a memory that fits B sequences exactly, B and a remainder, one byte
    short of B, one byte over B, or less than one."""
    from engine import budget
    story = [(80 * GB, budget.preset("7b-example")), (16 * GB, budget.preset("24-layer-example")),
             (40 * GB, budget.preset("24-layer-example"))]
    args = [_fit_args(m, cfg) for m, cfg in story]
    one_odd = 40 * 96 * 7 * 3 * 2
    args += [(5 * one_odd, 40, 96, 3, 7, 2), (one_odd - 1, 40, 96, 3, 7, 2)]
    rng = np.random.default_rng(63)
    for shape in range(15):
        N, d = int(rng.choice([16, 100, 512, 2048])), int(rng.integers(1, 65)) * 32
        L, k, e = int(rng.integers(1, 49)), int(rng.integers(1, 35)), int(rng.choice([2, 4]))
        one, B = N * d * k * L * e, int(rng.integers(2, 65))
        memory = [B * one, B * one + int(rng.integers(1, one)), B * one - 1, B * one + 1,
                  int(rng.integers(1, one))][shape % 5]
        args.append((memory, N, d, L, k, e))
    return [Case(a, f"for {budget.human_bytes(a[0])} ({a[0]:,} bytes), N={a[1]}, d={a[2]}, "
                    f"L={a[3]}, k={a[4]}, {a[5]} bytes per element") for a in args]


def engine_micro_batch_that_fits(memory_bytes: int, N: int, d: int, L: int, k: int,
                                 e: int) -> int:
    """engine.budget's answer: its search for the largest micro-batch whose activations
    (the 'rule' model, nothing else resident) fit in memory_bytes; 0 if none does."""
    from engine import budget
    return budget.largest_micro_batch(_rule_config(N, d, L, k, e), 0, memory_bytes) or 0


def _one_sequence(N, d, L, k, e) -> int:
    return N * d * k * L * e


def _fit_slips() -> list[Slip]:
    """The usual wrong answers, each reproduced from the same arguments, with a hint that
    works through the case's own numbers."""
    def one_layer(case, got, want):
        m, N, d, L, k, e = case.args
        return (f"B={got} sequences would fit if the stack had one layer; this one has L={L}, "
                f"and every layer keeps its own k={k} tensors of N x d, so one sequence costs "
                f"{L} times what you priced.")

    def one_tensor(case, got, want):
        m, N, d, L, k, e = case.args
        return (f"you priced one tensor of N x d per layer; each of the {L} layers keeps k={k} "
                f"of them, so one sequence costs {k} times more.")

    def elements(case, got, want):
        m, N, d, L, k, e = case.args
        return (f"you divided bytes by a count of elements: each element takes {e} bytes, so "
                f"one sequence costs {e} times what you priced.")

    def bits(case, got, want):
        m, N, d, L, k, e = case.args
        return (f"a factor of 8 (bits per byte) crept in: e={e} is already bytes per element "
                f"and the memory is in bytes, so no unit needs converting.")

    def rounded(direction):
        def hint(case, got, want):
            m, N, d, L, k, e = case.args
            one = _one_sequence(N, d, L, k, e)
            return (f"B={got} does not fit: it needs {got * one:,} bytes, more than the "
                    f"{m:,} available. A part of a sequence does not run, so the division "
                    f"rounds down, not {direction}.")
        return hint

    def strict(case, got, want):
        m, N, d, L, k, e = case.args
        one = _one_sequence(N, d, L, k, e)
        return (f"B={want} fits too: {want} x {one:,} = {want * one:,} bytes is exactly the "
                f"{m:,} available, and a batch that fills the memory to the byte still runs. "
                f"Your test turned it away (<, where the memory allows <=).")

    def at_least_one(case, got, want):
        m, N, d, L, k, e = case.args
        one = _one_sequence(N, d, L, k, e)
        return (f"not even one sequence fits ({one:,} bytes > {m:,}): a micro-batch of 1 "
                f"cannot run there, so the answer is 0.")

    def power_of_two(case, got, want):
        return (f"B={got} is the largest power of two that fits, and B={want} fits too: the "
                f"question is the largest micro-batch of any size.")

    def slip(price, hint):
        return Slip(lambda m, N, d, L, k, e: m // price(N, d, L, k, e), hint)

    return [
        slip(lambda N, d, L, k, e: N * d * k * e, one_layer),
        slip(lambda N, d, L, k, e: N * d * L * e, one_tensor),
        slip(lambda N, d, L, k, e: N * d * k * L, elements),
        slip(lambda N, d, L, k, e: 8 * _one_sequence(N, d, L, k, e), bits),
        Slip(lambda m, N, d, L, k, e: 8 * m // _one_sequence(N, d, L, k, e), bits),
        Slip(lambda m, N, d, L, k, e: max(1, m // _one_sequence(N, d, L, k, e)), at_least_one),
        Slip(lambda m, N, d, L, k, e: round(m / _one_sequence(N, d, L, k, e)),
             rounded("to the nearest")),
        Slip(lambda m, N, d, L, k, e: -(-m // _one_sequence(N, d, L, k, e)), rounded("up")),
        Slip(lambda m, N, d, L, k, e: (m - 1) // _one_sequence(N, d, L, k, e), strict),
        Slip(lambda *args: _largest_power_of_two(engine_micro_batch_that_fits(*args)),
             power_of_two),
    ]


def _largest_power_of_two(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n > 0 else 0


def _sequences(value, case: Case) -> int:
    """The learner's answer as a whole number of sequences, or the error that says why not."""
    if value is None:
        raise ExerciseError(EX_FIT, f"{case.label}, you return None. Hint: when not even one "
                                    f"sequence fits, the answer is the number 0.")
    try:
        whole = float(value) == int(float(value))
    except (TypeError, ValueError, OverflowError):
        whole = True                      # _as_int below says what is wrong
    if not whole:
        raise ExerciseError(EX_FIT, f"{case.label}, you say B={float(value):.6g}. Hint: a "
                                    f"micro-batch is a whole number of sequences, and a part "
                                    f"of one does not run: how many *whole* sequences fit? "
                                    f"(floor division, //)")
    return _as_int(EX_FIT, value, "micro_batch_that_fits(...)")


def _sequences_apart(got: int, want: int, case: Case) -> str:
    gap = abs(got - want)
    side = "more than fit" if got > want else "fewer than fit"
    return (f"you say B={got}, engine.budget finds B={want} ({gap} sequence"
            f"{'s' if gap != 1 else ''} {side})")


def check_micro_batch_that_fits(micro_batch_that_fits) -> None:
    """micro_batch_that_fits(memory_bytes, N, d, L, k, bytes_per_element) = the largest
    B whose B x N x d x k x L x bytes fit, as engine.budget's search finds it."""
    cases = _fit_cases()
    compare_over_cases(EX_FIT, micro_batch_that_fits, engine_micro_batch_that_fits, cases,
                       slips=_fit_slips(), read=_sequences, difference=_sequences_apart)
    passed(EX_FIT, f"the 7B example fits {engine_micro_batch_that_fits(*cases[0].args)} "
                   f"sequences of activations in 80 GB; the 24-layer example "
                   f"{engine_micro_batch_that_fits(*cases[1].args)} in 16 GB.")


# ------------------------------------------------------------------ the notebook
#: Each exercise function of the lesson, and its exercise.
EXERCISE_FUNCTIONS = {"mlp_saved_bytes": EX_MLP, "block_saved_elements": EX_BLOCK,
                      "micro_batch_that_fits": EX_FIT}


def name_unfinished_exercises() -> None:
    """In the notebook, a cell that needs an unfinished exercise of this lesson says which."""
    from . import _core
    _core.name_unfinished_exercises(EXERCISE_FUNCTIONS)
