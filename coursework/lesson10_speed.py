"""Exercise 10.1 judged on speed: the learner's bias + GELU kernel timed against the
unfused numpy version, the lesson's plain fused loop and the trainer's kernel, on the same
arrays, in cache and out of it.

* Each time is the fastest of several runs, the kernels taking turns run by run, so that a
  moment when the machine is busy slows one run of each, not all runs of one.
* A kernel is refused when, in either regime, it takes more than SLOW_VS_NUMPY times
  numpy's time and more than SLOW_VS_PLAIN times the plain loop's (the same work written
  as the exercise asks; on a machine where even that loses to numpy, the gap to it is the
  learner's). A refusal is measured a second time before it stands.
* The refusal names the cause it sees in the code (`slow_causes`): threads started once
  per row, a serial loop, row-sized temporaries, tanh in place of the exp form.
"""
from __future__ import annotations

import ast
import inspect
import io
import math
import time
import tokenize

import numpy as np
from numba import njit, prange

from ._core import function_syntax, is_call

SLOW_VS_NUMPY = 3.0
SLOW_VS_PLAIN = 2.5
REGIMES = ((2048, "in cache", "the trainer's shape, 4 MB per array, fits in cache"),
           (32768, "out of cache", "64 MB per array, out of cache"))


@njit(parallel=True, cache=True)
def plain_fused_loop(x, b, out):
    """The lesson's answer to 10.1: rows in prange, tanh written with exp. The yardstick of
    the learner's kernel: the same work, so a gap to it is the learner's to find."""
    k, a = 0.7978845608028654, 0.044715
    rows, cols = x.shape
    for i in prange(rows):
        for j in range(cols):
            u = x[i, j] + b[j]
            t = 1.0 - 2.0 / (np.exp(2.0 * k * (u + a * u * u * u)) + 1.0)
            out[i, j] = 0.5 * u * (1.0 + t)
    return out


def fastest_interleaved(kernels: dict, repeats: int) -> dict:
    """name -> the fastest of `repeats` runs of each kernel (after one untimed run each),
    the kernels taking turns."""
    for run in kernels.values():
        run()
    best = {name: math.inf for name in kernels}
    for _ in range(repeats):
        for name, run in kernels.items():
            t0 = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def measure(fn, reference, rng, repeats: int, with_trainer: bool = True) -> dict:
    """regime -> {"yours", "plain", "numpy"[, "trainer", "copy"]} seconds, on the same
    float32 arrays per regime (`reference(x, b)` is the unfused numpy version)."""
    from engine.trainer.kernels import bias_gelu_forward as trainer_kernel
    times = {}
    for rows, regime, _ in REGIMES:
        x = rng.normal(size=(rows, 512)).astype(np.float32)
        b = rng.normal(size=512).astype(np.float32)
        out = np.empty_like(x)
        kernels = {"yours": lambda: fn(x, b, out), "plain": lambda: plain_fused_loop(x, b, out),
                   "numpy": lambda: reference(x, b)}
        if with_trainer:
            kernels["trainer"] = lambda: trainer_kernel(x, b, out=out)
            kernels["copy"] = lambda: np.copyto(out, x)
        times[regime] = fastest_interleaved(kernels, repeats)
    return times


def too_slow(times: dict) -> str | None:
    """The regime where the learner's kernel breaks both limits, or None."""
    for _, regime, _ in REGIMES:
        t = times[regime]
        if t["yours"] > SLOW_VS_NUMPY * t["numpy"] and t["yours"] > SLOW_VS_PLAIN * t["plain"]:
            return regime
    return None


def refusal(times: dict, causes: list[str], repeats: int) -> str | None:
    """The refusal message when the kernel is too slow, else None."""
    regime = too_slow(times)
    if regime is None:
        return None
    t = times[regime]
    seen = ("The cause I see in your code: " + "; ".join(causes) + "." if causes else
            "I see none of the usual causes (threads started per row, a serial loop, "
            "temporaries, tanh) in the code: look for work the plain loop does not do.")
    return (f"the values are right, but the kernel is too slow to train with. {regime}, on "
            f"the same arrays (fastest of {repeats} runs each), yours takes {_ms(t['yours'])}, "
            f"unfused numpy {_ms(t['numpy'])} ({t['yours'] / t['numpy']:.1f}x) and the "
            f"lesson's plain fused loop {_ms(t['plain'])} ({t['yours'] / t['plain']:.1f}x). "
            f"A kernel is refused when it takes more than {SLOW_VS_NUMPY:g}x numpy's time and "
            f"more than {SLOW_VS_PLAIN:g}x the plain loop's. {seen} A refused kernel is not "
            f"saved: lesson 13 runs your last kernel that passed, or the engine's.")


# ------------------------------------------------------------------ causes in the code
_ALLOCATORS = ("empty", "zeros", "ones", "empty_like", "zeros_like", "ones_like", "array",
               "copy", "full", "full_like")


def _row_sized(node, arrays: set[str]) -> bool:
    """x[i], x[i, :], x[:, j] or a bare 2-D array used in arithmetic: a whole row or more."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
            and node.value.id in arrays:
        index = node.slice
        parts = index.elts if isinstance(index, ast.Tuple) else [index]
        return len(parts) < 2 or any(isinstance(p, ast.Slice) for p in parts)
    return False


def slow_causes(fn) -> list[str]:
    """What in the kernel's code makes it slow: the known causes, named."""
    node = function_syntax(fn)
    if node is None:
        return []
    params = [a.arg for a in node.args.args]
    arrays_2d = {params[0], params[2]} if len(params) >= 3 else set()
    loops = [n for n in ast.walk(node) if isinstance(n, ast.For)]
    pranges = [n for n in loops if is_call(n.iter, "prange")]
    causes = []
    nested = [inner for outer in loops for inner in ast.walk(outer)
              if inner is not outer and inner in pranges]
    if nested:
        causes.append("threads started per row: the prange loop sits inside another loop, so "
                      "numba starts the threads and waits for them once per pass of the outer "
                      "loop (once per row, thousands of times a call). Put prange on the "
                      "outer loop over the rows and a plain range inside")
    elif not pranges:
        causes.append("a serial loop: no loop is a prange, so one thread does all the work")
    else:
        var = pranges[0].target.id if isinstance(pranges[0].target, ast.Name) else None
        for sub in ast.walk(pranges[0]):
            if (isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Tuple)
                    and len(sub.slice.elts) == 2 and isinstance(sub.slice.elts[1], ast.Name)
                    and sub.slice.elts[1].id == var and isinstance(sub.value, ast.Name)
                    and sub.value.id in arrays_2d):
                causes.append("the prange runs over the columns, so each thread walks down a "
                              "column, a whole row apart from one element to the next; "
                              "prange over the rows, range over the columns")
                break
    inside = [sub for loop in loops for sub in ast.walk(loop)]
    if any(_row_sized(sub, arrays_2d) for sub in inside) or any(
            any(is_call(sub, name) for name in _ALLOCATORS) for sub in inside):
        causes.append("temporaries: inside the loop it computes on whole rows (like x[i] + b) "
                      "or makes arrays, so every row allocates arrays and passes over them "
                      "again; compute one element at a time, u = x[i, j] + b[j]")
    if calls(fn, "tanh"):
        causes.append("it calls tanh, a scalar library call several times dearer than exp; "
                      "the exercise asks for the exp form of tanh")
    return causes


def calls(fn, name: str) -> bool:
    """Does the code of `fn` (comments and strings aside) call `name`?"""
    try:
        source = inspect.getsource(getattr(fn, "py_func", fn))
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
                  if t.type not in (tokenize.COMMENT, tokenize.STRING)]
    except (OSError, TypeError, tokenize.TokenError, SyntaxError):
        return False
    return any(a.type == tokenize.NAME and a.string == name and b.string == "("
               for a, b in zip(tokens, tokens[1:]))


# ------------------------------------------------------------------ the report
def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def speed_report(times: dict, calls_tanh: bool, x_nbytes_out_of_cache: int) -> list[str]:
    """The passed check's timing lines, then what the numbers say (`bias_gelu_speed_verdict`)."""
    lines = []
    for rows, regime, where in REGIMES:
        t = times[regime]
        lines.append(f"({rows}, 512), {where}: yours {_ms(t['yours'])}, the lesson's plain "
                     f"fused loop {_ms(t['plain'])}, unfused numpy {_ms(t['numpy'])} "
                     f"(speed-up {t['numpy'] / t['yours']:.1f}x); the trainer's fused kernel "
                     f"with a vectorised exp {_ms(t['trainer'])} "
                     f"({t['numpy'] / t['trainer']:.1f}x)")
    # the roof: a fused kernel must read x and write out, 8 bytes per element; no kernel
    # moves those bytes faster than a plain copy of them
    t = times["out of cache"]
    roof = 2 * x_nbytes_out_of_cache / t["copy"]
    yours = 2 * x_nbytes_out_of_cache / t["yours"]
    lines.append(f"out of cache your kernel moves {yours / 1e9:.1f} GB/s, {yours / roof:.0%} "
                 f"of this machine's copy bandwidth ({roof / 1e9:.1f} GB/s), the roof for "
                 f"8 bytes per element.")
    return lines + bias_gelu_speed_verdict(t, calls_tanh)


def bias_gelu_speed_verdict(times, calls_tanh: bool) -> list[str]:
    """What the out-of-cache times say: a gap between the learner's kernel and the plain
    fused loop is the learner's own (named where the code shows it); a gap between the plain
    loop and numpy is the scalar exp, which the lesson's next section removes."""
    lines = []
    mine = times["yours"] / times["plain"]
    if mine > 1.5:
        cause = ("your kernel calls tanh, a scalar library call dearer than exp: write "
                 "tanh(z) with exp, as the exercise asks" if calls_tanh else
                 "look for work your loop does that the plain loop does not (a temporary "
                 "array per row, a float64 constant array in a float32 kernel, a division "
                 "where a multiply would do)")
        lines.append(f"yours takes {mine:.1f}x the time of the lesson's plain fused loop (the "
                     f"same work, rows in prange, tanh written with exp): {cause}.")
    elif calls_tanh:
        lines.append("note: your kernel calls tanh. The values are right, but the lesson (and "
                     "the trainer) write tanh with exp, the form the next section turns into "
                     "a vectorised exp.")
    versus_numpy = times["yours"] / times["numpy"]
    if versus_numpy <= 1.0:
        lines.append(f"out of cache yours beats the unfused numpy version "
                     f"{1 / versus_numpy:.1f}x: one pass over memory instead of ten.")
    elif mine > 1.5:
        lines.append(f"SLOWER THAN NUMPY: out of cache, where fusion should win, yours takes "
                     f"{versus_numpy:.1f}x the unfused numpy time; fix the cause above first.")
    elif times["plain"] < times["numpy"]:
        lines.append(f"SLOWER THAN NUMPY: out of cache yours takes {versus_numpy:.1f}x the "
                     f"unfused numpy time, while the plain fused loop, the same work, beats "
                     f"numpy ({times['plain'] / times['numpy']:.1f}x its time): the gap is "
                     f"your kernel's ({mine:.1f}x the plain loop's time). Look for work your "
                     f"loop does that the plain loop does not.")
    else:
        lines.append(f"SLOWER THAN NUMPY: out of cache yours takes {versus_numpy:.1f}x the "
                     f"unfused numpy time, and the plain fused loop, the same work, is slower "
                     f"than numpy too ({times['plain'] / times['numpy']:.1f}x): on this machine its scalar exp, "
                     f"one C library call per element where numpy's tanh handles 8 or 16 "
                     f"floats per instruction, is the limit, not memory. The next section's "
                     f"exp of multiplies and adds vectorises and removes it.")
    return lines
