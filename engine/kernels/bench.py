"""Time each numba kernel against its numpy oracle at a trainer-sized shape.

    python -m engine.kernels.bench                 # B=16 T=128 C=128 H=4 V=96, float32
    python -m engine.kernels.bench --B 4 --json

Reports the best and the median of several runs after a warm-up call
(which also compiles or loads the numba cache), in milliseconds, and the
speed-up of the best runs.
A benchmark reports; it never fails on a time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from . import reference


def _times_ms(fn, repeats: int) -> tuple[float, float]:
    """(best, median) wall time in ms. On a shared machine the best run is the
    least disturbed one; the median shows the noise."""
    fn()  # warm-up: compile or load from cache, touch the memory
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times), 1e3 * statistics.median(times)


def cases(B: int, T: int, C: int, H: int, V: int, dtype):
    """(name, arguments) for every kernel, at the shapes the GPT uses them."""
    rng = np.random.default_rng(0)

    def r(*shape):
        return rng.standard_normal(shape).astype(dtype)

    N, hs = B * T, C // H
    x, w, b, g = r(N, C), r(C), r(C), r(N, C)
    _, xhat, rstd = reference.layer_norm_xhat_forward(x, w, b, 1e-5)
    logits = r(N, V)
    targets = rng.integers(0, V, N)
    _, probs = reference.cross_entropy_forward(logits, targets)
    u, gu = r(N, 4 * C), r(N, 4 * C)
    q, k, v, ga = r(B * H, T, hs), r(B * H, T, hs), r(B * H, T, hs), r(B * H, T, hs)
    scale = 1.0 / np.sqrt(hs)
    _, att = reference.attention_probs_forward(q, k, v, scale)
    ids = rng.integers(0, V, N)
    return [
        ("layer_norm_xhat_forward", (x, w, b, 1e-5)),
        ("layer_norm_xhat_backward", (g, xhat, rstd, w)),
        ("softmax_forward", (logits,)),
        ("cross_entropy_forward", (logits, targets)),
        ("cross_entropy_backward", (probs, targets, 1.0 / N)),
        ("gelu_forward", (u,)),
        ("gelu_backward", (gu, u)),
        ("attention_probs_forward", (q, k, v, scale)),
        ("attention_probs_backward", (ga, q, k, v, att, scale)),
        ("embedding_table_grad", (ids, g, V)),
    ]


def run(B=16, T=128, C=128, H=4, V=96, dtype=np.float32, repeats=20) -> list[dict]:
    from . import fast
    rows = []
    for name, args in cases(B, T, C, H, V, dtype):
        numpy_best, numpy_median = _times_ms(lambda: getattr(reference, name)(*args), repeats)
        numba_best, numba_median = _times_ms(lambda: getattr(fast, name)(*args), repeats)
        rows.append({"kernel": name, "numpy_ms": numpy_best, "numba_ms": numba_best,
                     "numpy_median_ms": numpy_median, "numba_median_ms": numba_median,
                     "speedup": numpy_best / numba_best})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in (("B", 16), ("T", 128), ("C", 128), ("H", 4), ("V", 96)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = parser.parse_args(argv)
    if a.C % a.H:
        parser.error(f"C={a.C} must be divisible by H={a.H}")
    rows = run(a.B, a.T, a.C, a.H, a.V, np.dtype(a.dtype), a.repeats)
    if a.json:
        print(json.dumps({"shape": vars(a), "kernels": rows}, indent=1))
        return
    import numba
    print(f"B={a.B} T={a.T} C={a.C} H={a.H} V={a.V} {a.dtype}, numba threads: "
          f"{numba.get_num_threads()}, best (median) of {a.repeats} runs, ms")
    print(f"{'kernel':<24}{'numpy':>18}{'numba':>18}{'speed-up':>10}")
    for row in rows:
        print(f"{row['kernel']:<24}{row['numpy_ms']:>8.3f} ({row['numpy_median_ms']:>7.3f})"
              f"{row['numba_ms']:>8.3f} ({row['numba_median_ms']:>7.3f}){row['speedup']:>9.1f}x")


if __name__ == "__main__":
    main()
