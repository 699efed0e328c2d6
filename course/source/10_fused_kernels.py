# %% [markdown]
# # 10 · Fused kernels
#
# **Goals.** By the end of this lesson you will have
# 1. measured how many bytes per second this machine can move and how many FLOPs per second
#    it can multiply, and drawn the *roofline* those two numbers make;
# 2. counted the bytes an unfused bias + GELU moves against a fused one, and measured what
#    that costs in time and in GB/s;
# 3. written a fused bias + GELU kernel in numba (exercise 10.1), checked and timed against
#    the unfused version, and measured beside the trainer's own kernel;
# 4. decided, with numbers, whether GELU's backward should *save* its tanh or *recompute* it;
# 5. seen layer-norm backward done in one pass over memory instead of a dozen, and checked
#    it (and your 10.2 gradient) with your own gradient checker of lesson 04;
# 6. written the fused softmax + cross-entropy whose gradient overwrites the logits
#    (exercise 10.2), and measured the memory that saves;
# 7. derived the online softmax and built attention on it (exercise 10.3), measured the
#    saved memory go from quadratic to linear in T, and what the backward's recompute costs.
#
# The backward pass costs about twice the forward in FLOPs, but many of its kernels do very
# few FLOPs per byte they touch. For those, the number of *passes over memory* decides the
# time, and fusion is how a trainer cuts them.
#
# **Your pieces in the engine.** Fills: two kernels of the trainer's registry, the fused
# bias + GELU forward (10.1, `bias_gelu_forward`) and the softmax + cross-entropy that
# overwrites its logits (10.2, `softmax_cross_entropy`); lesson 13's trainer runs both.
# Runs: your gradient checker (04.3, `spot_check`), on the one-pass layer-norm backward
# and on your 10.2 gradient, in float64; the engine's checker runs instead, saying why,
# when yours is not saved. (The whole map: CONTRIBUTING.md, "Exercise <-> slot".)
#
# **Time.** This lesson compiles numba kernels as it goes, yours, the lesson's and the
# trainer's. The first run on a machine spends part of its time compiling, so a cell that
# defines or first calls a kernel can sit silent for some seconds; numba keeps the machine
# code on disk, and later runs load it at once. The cells that time many kernels say so
# before they start.

# %%
# The engine's numba set-up (engine/numba_config.py) comes first: it makes numba's threads
# wait for work *passively* (asleep, not spinning) unless you set OMP_WAIT_POLICY yourself,
# and it has to do so before numba starts its threads. On a machine shared with other
# programs, spinning threads steal the very cores the other threads need, and a small
# parallel kernel can take a scheduler time slice (milliseconds) instead of microseconds.
import engine.numba_config  # noqa: F401

import math
import time
import tracemalloc

import numpy as np
import matplotlib.pyplot as plt
import numba
from numba import njit, prange

from engine.trainer import kernels as fused
from engine.kernels import reference
from engine.timing import median_seconds
from coursework import lesson10

lesson10.name_unfinished_exercises()   # a cell that needs an unfinished exercise says which

np.set_printoptions(precision=4, suppress=True)


def best_seconds(fn, repeats=7):
    """Fastest of several calls: what the machine *can* do, for measuring its limits.
    (A kernel's typical cost is `median_seconds`, the median of several calls.)"""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)

# %% [markdown]
# ## Two numbers that bound every kernel
#
# A kernel needs its bytes brought from memory and its arithmetic done. Whichever takes
# longer sets its time. So measure both limits on this machine:
#
# - **memory bandwidth**: copy an array far larger than any CPU cache, and count the bytes
#   read plus the bytes written. We try numpy's copy and a two-thread numba copy and keep the
#   faster;
# - **peak arithmetic**: a float32 matrix product (sgemm), the most FLOP-dense thing a CPU
#   does, counting 2·n³ FLOPs for two n × n matrices.
#
# Timings on a shared machine are noisy. The machine's limits are the *best* of several runs
# (what it can do); a kernel's time is the *median* of several runs (what it typically
# costs); and the lesson's claims are ratios measured in the same cell.

# %%
# NBVAL_IGNORE_OUTPUT
print("Measuring this machine: 15 copies of 134 MB, 15 matrix products (some seconds) ...",
      flush=True)


@njit(parallel=True)
def parallel_copy(src, dst):
    for i in prange(src.size):
        dst[i] = src[i]


big_src = np.ones(1 << 25, dtype=np.float32)   # 32 M floats = 134 MB
big_dst = np.empty_like(big_src)
parallel_copy(big_src, big_dst)                  # compile before timing
t_numpy_copy = best_seconds(lambda: np.copyto(big_dst, big_src), repeats=15)
t_numba_copy = best_seconds(lambda: parallel_copy(big_src, big_dst), repeats=15)
moved = 2 * big_src.nbytes                      # every byte is read once and written once
BANDWIDTH = moved / min(t_numpy_copy, t_numba_copy)
assert np.array_equal(big_dst, big_src), "the parallel copy lost or changed elements"
del big_src, big_dst

n = 1024
a_mat = np.random.default_rng(0).normal(size=(n, n)).astype(np.float32)
a_mat @ a_mat
t_gemm = best_seconds(lambda: a_mat @ a_mat, repeats=15)
PEAK_FLOPS = 2 * n**3 / t_gemm

print(f"numba threads: {numba.get_num_threads()}")
print(f"copy, numpy: {moved / t_numpy_copy / 1e9:6.1f} GB/s ({t_numpy_copy*1e3:.1f} ms)")
print(f"copy, numba: {moved / t_numba_copy / 1e9:6.1f} GB/s ({t_numba_copy*1e3:.1f} ms)")
print(f"memory bandwidth used below: {BANDWIDTH / 1e9:.1f} GB/s")
print(f"sgemm {n}x{n}: {PEAK_FLOPS / 1e9:.1f} GFLOP/s ({t_gemm*1e3:.1f} ms)")
print(f"ridge point: {PEAK_FLOPS / BANDWIDTH:.1f} FLOP per byte")

# %% [markdown]
# The last line is the **ridge point**: a kernel that does fewer FLOPs per byte than that
# cannot keep the arithmetic units busy, however well it is written; memory is its limit.
# FLOPs per byte moved is the kernel's **arithmetic intensity**, and the *roofline* says
#
# $$\text{attainable FLOP/s} = \min(\text{peak FLOP/s},\ \text{bandwidth} \times \text{intensity}).$$
#
# A matmul of two n × n float32 matrices does 2n³ FLOPs on 3 · 4n² bytes: an intensity of
# n/6, about 170 FLOP/byte at n = 1024, far right of the ridge. An elementwise op like
# "add a bias" does one FLOP per element on 8 bytes (read 4, write 4): 0.125 FLOP/byte.
#
# ## Bias + GELU, counted
#
# After the MLP's first matmul comes `u = x + b`, then GELU (the tanh form of lessons 03-04):
#
# $$\mathrm{GELU}(u) = \tfrac12 u\,\bigl(1 + \tanh(k(u + a u^3))\bigr),\quad k = \sqrt{2/\pi},\ a = 0.044715.$$
#
# Counting exp as one operation (it is really a dozen or more), and writing
# tanh(z) = 1 - 2/(exp(2z) + 1), that is 14 arithmetic operations per element. How many bytes
# it moves depends entirely on how it is written. Three ways:
#
# 1. **numpy, one operation per line**: every line is a pass that reads its inputs from
#    memory and writes its output back;
# 2. **two kernels**: one loop adds the bias and writes `u`, a second loop reads `u` and
#    writes GELU(u);
# 3. **fused**: one loop reads `x`, keeps `u` in a register, writes GELU(u). 8 bytes per
#    element in float32, the least any version can move.

# %%
GELU_K, GELU_A = math.sqrt(2.0 / math.pi), 0.044715
FLOPS_PER_ELEMENT = 14


def bias_gelu_numpy(x, b):
    """Unfused: each line is one pass over an array of x's size (bytes per element, fp32)."""
    u = x + b                    # read x,        write u     :  8
    y = u * u                    # read u,        write y     :  8
    y *= u                       # read y, u,     write y     : 12
    y *= GELU_A                  # read y,        write y     :  8
    y += u                       # read y, u,     write y     : 12
    y *= GELU_K                  # read y,        write y     :  8
    np.tanh(y, out=y)            # read y,        write y     :  8
    y += 1.0                     # read y,        write y     :  8
    y *= u                       # read y, u,     write y     : 12
    y *= 0.5                     # read y,        write y     :  8
    return y


BYTES_PER_ELEMENT = {"numpy, 10 passes": 92, "two kernels": 16, "fused": 8}


@njit(parallel=True)
def bias_add(x, b, out):
    rows, cols = x.shape
    for i in prange(rows):
        for j in range(cols):
            out[i, j] = x[i, j] + b[j]
    return out


@njit(parallel=True)
def gelu_kernel(u, out):
    k, a = 0.7978845608028654, 0.044715
    rows, cols = u.shape
    for i in prange(rows):
        for j in range(cols):
            v = u[i, j]
            t = 1.0 - 2.0 / (np.exp(2.0 * k * (v + a * v * v * v)) + 1.0)
            out[i, j] = 0.5 * v * (1.0 + t)
    return out


rng = np.random.default_rng(0)
x_small = rng.normal(size=(4, 6)).astype(np.float32)
b_small = rng.normal(size=6).astype(np.float32)
two_kernels = gelu_kernel(bias_add(x_small, b_small, np.empty_like(x_small)),
                          np.empty_like(x_small))
print("numpy version equals the engine's reference GELU:",
      np.allclose(bias_gelu_numpy(x_small, b_small), reference.gelu_forward(x_small + b_small),
                  rtol=1e-6, atol=1e-6))
print("two-kernel version equals it too:",
      np.allclose(two_kernels, bias_gelu_numpy(x_small, b_small), rtol=1e-6, atol=1e-6))
for name, nbytes in BYTES_PER_ELEMENT.items():
    print(f"{name:>17}: {nbytes:3d} bytes per element, intensity "
          f"{FLOPS_PER_ELEMENT / nbytes:.3f} FLOP/byte")

# %% [markdown]
# The numpy version moves 92 bytes per element for a result that needs 8: more than eleven
# times the traffic. Dropout after the GELU would add a third pass (read the activations and
# a one-byte mask, write the output: 9 more bytes in and 4 out), and a fused kernel would
# absorb that too.
#
# ## Exercise 10.1 · A fused bias + GELU kernel
#
# Write `bias_gelu_fused(x, b, out)` with numba: for every row `i` (in `prange`, so rows are
# shared between threads) and column `j`, compute `u = x[i, j] + b[j]` and write GELU(u) into
# `out[i, j]`, then `return out`. Use the constants `k` and `a` defined inside the function
# (a kernel that reads notebook globals could not be reused by the trainer in lesson 13), and
# write tanh with exp: `tanh(z) = 1 - 2 / (exp(2 z) + 1)`, which is also safe when exp
# overflows to infinity.
#
# The check compares your kernel with the numpy reference in float64 and float32, and
# refuses one that runs on a single thread (no `parallel=True`, or `range` where the rows
# need `prange`). Then it times yours at two sizes, the trainer's (B·T, 4C) = (2048, 512)
# and a 16 times larger one, beside three others: the lesson's own plain fused loop (the
# same work, written as asked), the unfused numpy version and the trainer's fused kernel. It
# reports the bandwidth yours reaches against this machine's roof, and says which gap is
# yours to close. Each time is the fastest of several runs on the same arrays. A kernel that
# takes more than 3x numpy's time and more than 2.5x the plain loop's, in cache or out of it,
# is refused, with the cause the check sees in your code. Passing saves it as your piece
# `bias_gelu_forward`; a refused kernel is not saved.
#
# **What to expect.** Fusion saves memory traffic, so it helps where memory is the limit: at
# the large size, whose arrays do not fit in the caches. But a plain fused loop calls a
# scalar `exp` once per element (one C library call, tens of cycles), where numpy's `tanh`
# handles 8 or 16 floats per instruction. At the trainer's shape numpy's ten passes are
# cheap and the plain loop is usually slower; out of cache it depends on the machine, and
# on some the plain loop still loses. If yours is much slower than the plain loop, the
# cause is in your code (one thread, `tanh` in place of the exp form), and the check names
# it. The next section removes the exp limit, and then fusion wins at both sizes.

# %%
@njit(parallel=True)
def bias_gelu_fused(x, b, out):
    """out[i, j] = GELU(x[i, j] + b[j]) (tanh form) in one pass over memory; returns out."""
    k, a = 0.7978845608028654, 0.044715   # sqrt(2/pi) and the cubic coefficient
    ### BEGIN SOLUTION
    rows, cols = x.shape
    for i in prange(rows):
        for j in range(cols):
            u = x[i, j] + b[j]
            z = k * (u + a * u * u * u)
            t = 1.0 - 2.0 / (np.exp(2.0 * z) + 1.0)
            out[i, j] = 0.5 * u * (1.0 + t)
    return out
    ### END SOLUTION

# %%
# CHECK 10.1
# NBVAL_IGNORE_OUTPUT
from coursework import lesson10
lesson10.check_bias_gelu(bias_gelu_fused)

# %% [markdown]
# ## A third limit: exp
#
# Your kernel calls `np.exp` once per element. numba turns that into a call to the C
# library's scalar `exp`: one element at a time, some tens of cycles each. numpy's own `exp`
# and `tanh` use SIMD instructions, 8 or 16 floats per instruction. So the fused loop saves
# memory passes but may spend longer on arithmetic than numpy does.
#
# The cure is an `exp` written only with multiplies and adds, which the compiler can turn
# into SIMD instructions. One simple way is *scaling and squaring*:
#
# $$e^{w} = \bigl(e^{w/256}\bigr)^{256},$$
#
# where `w/256` is so small (|w| is clamped to 40, so |w/256| < 0.16) that six terms of the
# Taylor series give `e^{w/256}` to about 5e-10, and eight squarings raise it to the 256th
# power. Squaring multiplies the relative error by 256, so the result is good to about 1e-7:
# float32 precision, which is what the trainer stores. (Production kernels use cleverer
# range reductions; the idea is the same.) `fastmath=True` lets the compiler reorder the
# arithmetic so the loop vectorises.

# %%
@njit(parallel=True, fastmath=True)
def bias_gelu_fused_simd(x, b, out):
    """bias + GELU in one pass, with an exp made of multiplies and adds only."""
    k, a = 0.7978845608028654, 0.044715
    rows, cols = x.shape
    for i in prange(rows):
        x_row, out_row = x[i], out[i]
        for j in range(cols):
            u = x_row[j] + b[j]
            w = min(max(2.0 * k * (u + a * u * u * u), -40.0), 40.0) / 256.0
            e = 1.0 + w * (1.0 + w * (1 / 2 + w * (1 / 6 + w * (1 / 24 + w * (1 / 120
                                                                                + w / 720)))))
            for _ in range(8):          # (e^(w/256))^256 = e^(2z)
                e = e * e
            out_row[j] = 0.5 * u * (2.0 - 2.0 / (e + 1.0))    # 1 + tanh(z)
    return out


x_check = (rng.normal(size=(256, 512)) * 3).astype(np.float32)
b_check = rng.normal(size=512).astype(np.float32)
exact = bias_gelu_fused(x_check, b_check, np.empty_like(x_check))
simd = bias_gelu_fused_simd(x_check, b_check, np.empty_like(x_check))
print("SIMD-exp kernel agrees with the exact one to 1e-6:",
      np.allclose(simd, exact, rtol=1e-6, atol=1e-6))

# %% [markdown]
# ## Measured: time, GB/s and the roofline
#
# Now the four versions at two sizes. The trainer's own shape, (B·T, 4C) = (2048, 512), is
# 4 MB per float32 array: it fits in this CPU's caches, so a pass is cheap. 32 768 rows of 512
# is 64 MB per array, larger than the caches: every pass goes to main memory. For each
# version, the effective bandwidth is the bytes it must move (the table above) over its time,
# and its FLOP rate is 14 FLOPs per element over its time.

# %%
# NBVAL_IGNORE_OUTPUT
def measure_bias_gelu(rows, cols=512, repeats=5):
    x = rng.normal(size=(rows, cols)).astype(np.float32)
    b = rng.normal(size=cols).astype(np.float32)
    u, y = np.empty_like(x), np.empty_like(x)
    versions = {
        "numpy, 10 passes": lambda: bias_gelu_numpy(x, b),
        "two kernels": lambda: gelu_kernel(bias_add(x, b, u), y),
        "fused": lambda: bias_gelu_fused(x, b, y),
        "fused, SIMD exp": lambda: bias_gelu_fused_simd(x, b, y),
        "trainer kernel": lambda: fused.bias_gelu_forward(x, b, out=y),
        "bias add alone": lambda: bias_add(x, b, u),
    }
    traffic = {**BYTES_PER_ELEMENT, "fused, SIMD exp": 8, "trainer kernel": 8, "bias add alone": 8}
    flops = {**{name: FLOPS_PER_ELEMENT for name in traffic}, "bias add alone": 1}
    result = {}
    for name, fn in versions.items():
        fn()                                             # compiled and warm before timing
        seconds = median_seconds(fn, repeats)
        result[name] = dict(seconds=seconds, gbs=traffic[name] * x.size / seconds / 1e9,
                            gflops=flops[name] * x.size / seconds / 1e9,
                            intensity=flops[name] / traffic[name])
    # what the timings compare is the same result: every version equals numpy's
    want = bias_gelu_numpy(x, b)
    for name, fn in versions.items():
        if name != "bias add alone":
            y.fill(np.nan)
            got = fn()
            assert np.allclose(got, want, rtol=1e-4, atol=1e-5), f"{name} differs from numpy"
    assert np.array_equal(bias_add(x, b, u), x + b), "bias add alone differs from x + b"
    return result


print("Timing six versions at two sizes, five runs each (some seconds) ...", flush=True)
measured = {"trainer shape (2048, 512), 4 MB": measure_bias_gelu(2048),
            "(32768, 512), 64 MB": measure_bias_gelu(32768)}
for shape, table in measured.items():
    numpy_s = table["numpy, 10 passes"]["seconds"]
    print(shape)
    print(f"{'version':>17} {'time':>18} {'GB/s':>7} {'GFLOP/s':>8}  speedup over numpy")
    for name, m in table.items():
        print(f"{name:>17} {m['seconds']*1e3:11.2f} ms {m['gbs']:7.1f} {m['gflops']:8.2f}"
              f"  {numpy_s / m['seconds']:5.1f}x")
    print()
print(f"memory bandwidth of this machine: {BANDWIDTH / 1e9:.1f} GB/s")

# %%
fig, ax = plt.subplots(figsize=(10, 4.5))
ai = np.logspace(-2, 3, 200)
ax.loglog(ai, np.minimum(PEAK_FLOPS, BANDWIDTH * ai) / 1e9, "k-", lw=2,
          label="roofline: min(peak, bandwidth × intensity)")
markers = {"numpy, 10 passes": "o", "two kernels": "s", "fused": "D", "fused, SIMD exp": "P",
           "trainer kernel": "X", "bias add alone": "^"}
for (shape, table), fill in zip(measured.items(), ["none", "full"]):
    for k, (name, m) in enumerate(table.items()):
        ax.loglog(m["intensity"], m["gflops"], markers[name], ms=9, fillstyle=fill,
                  color=f"C{k}", label=f"{name}, {shape.split(', ')[-1]}")
gemm_ai = 2 * n**3 / (3 * 4 * n * n)
ax.loglog(gemm_ai, PEAK_FLOPS / 1e9, "*", ms=14, color="C6", label=f"sgemm {n}×{n}")
ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
ax.set_ylabel("GFLOP/s")
ax.set_title("Bias + GELU on this machine's roofline (hollow: fits in cache)")
ax.grid(True, which="both", alpha=0.3)
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))   # beside the data
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
for name, m in measured["(32768, 512), 64 MB"].items():
    roof = min(PEAK_FLOPS, BANDWIDTH * m["intensity"]) / 1e9
    print(f"64 MB, {name:>17}: {m['gflops']:6.2f} GFLOP/s = {m['gflops'] / roof:4.0%} of its roof")

# %% [markdown]
# How to read the plot and the tables (your numbers are in the cells above; on a machine
# shared with other work they wobble, so compare ratios within one table, and if a kernel
# shows more than 100% of its roof, the machine was busier while the copy was measured
# than later: run the bandwidth cell again). All bias + GELU
# versions are credited with the same 14 useful FLOPs per element, so their GFLOP/s compare
# work done per second.
#
# - **bias add alone** does one FLOP per 8 bytes. Beyond the caches it runs close to the copy
#   bandwidth, on the sloped part of the roof: only fewer bytes could make it faster.
# - **numpy, 10 passes** sits far to the left, at 14/92 FLOP per byte. At 64 MB each of its
#   ten passes goes to main memory, and its time is roughly that of ten copies.
# - **fused** (your kernel) moves the fewest bytes, yet sits far *below* its roof, and it
#   may be no faster than numpy, or slower. The roofline is an upper bound from two
#   resources; a kernel below both is limited by a third, here the scalar `exp`: tens of
#   cycles per element, where numpy's SIMD `tanh` handles 8 or 16 floats per instruction.
#   Saving passes over memory does not help a kernel that is not waiting for memory. In
#   cache (the 4 MB shape, the one the trainer runs) numpy's passes are cheap too.
# - **fused, SIMD exp** removes that third limit: the same single pass, with arithmetic the
#   compiler vectorises. With the engine's kernel it is usually the fastest at both sizes
#   (on a busy machine two close entries can swap places), and beyond the caches they come
#   closest to the memory roof. **trainer kernel** is the trainer's own kernel
#   (`engine.trainer.kernels`), built the same way: its float32 `exp` splits off a power of two,
#   takes a polynomial for the rest and assembles 2^n from its bits, accurate to about one
#   unit in the last place.
# - **two kernels** pays one extra round trip of `u` (8 more bytes per element) against the
#   fused kernel; it costs most where memory is the limit.
#
# On a GPU this chain is firmly memory-bound at every size that matters, and fusion wins by
# about the number of passes removed. On a CPU, cache lines stand in for a GPU's global
# memory: fusion removes passes over whichever level the data lives in, and once the data
# fits in cache, the arithmetic has to be vectorised too. Count the passes first; then
# measure, because the measurements say when the arithmetic has become the wall.
#
# ## Save or recompute: GELU's backward
#
# The backward of `y = GELU(u)` needs the local derivative at `u`:
#
# $$\mathrm{GELU}'(u) = \tfrac12(1 + t) + \tfrac12 u (1 - t^2)\,k(1 + 3au^2),\qquad t = \tanh(k(u + au^3)).$$
#
# The forward pass computed `t` already. Keep it (one more saved tensor of B·T·4C per layer,
# and the backward reads two arrays), or keep only `u` and compute `t` again (one more exp per
# element in the backward)? Both kernels below; the timing tells which is cheaper in time, and
# the byte count what the saved `t` costs in memory.

# %%
@njit(parallel=True)
def gelu_backward_saved(g, u, t, dx):
    k, a = 0.7978845608028654, 0.044715
    rows, cols = g.shape
    for i in prange(rows):
        for j in range(cols):
            v, tv = u[i, j], t[i, j]
            dx[i, j] = g[i, j] * (0.5 * (1.0 + tv)
                                  + 0.5 * v * (1.0 - tv * tv) * k * (1.0 + 3.0 * a * v * v))
    return dx


@njit(parallel=True)
def gelu_backward_recompute(g, u, dx):
    k, a = 0.7978845608028654, 0.044715
    rows, cols = g.shape
    for i in prange(rows):
        for j in range(cols):
            v = u[i, j]
            tv = 1.0 - 2.0 / (np.exp(2.0 * k * (v + a * v * v * v)) + 1.0)   # recomputed
            dx[i, j] = g[i, j] * (0.5 * (1.0 + tv)
                                  + 0.5 * v * (1.0 - tv * tv) * k * (1.0 + 3.0 * a * v * v))
    return dx


u_small = rng.normal(size=(3, 5))
g_small = rng.normal(size=(3, 5))
t_small = np.tanh(GELU_K * (u_small + GELU_A * u_small**3))
want = reference.gelu_backward(g_small, u_small)
print("saved-t backward equals the reference:",
      np.allclose(gelu_backward_saved(g_small, u_small, t_small, np.empty_like(g_small)), want,
                  rtol=1e-12))
print("recomputing backward equals the reference:",
      np.allclose(gelu_backward_recompute(g_small, u_small, np.empty_like(g_small)), want,
                  rtol=1e-12))

# %%
# NBVAL_IGNORE_OUTPUT
print("Timing both backwards on 64 MB arrays (some seconds) ...", flush=True)
u_big = rng.normal(size=(32768, 512)).astype(np.float32)      # 64 MB, beyond the caches
g_big = rng.normal(size=u_big.shape).astype(np.float32)
t_saved = np.tanh(GELU_K * (u_big + GELU_A * u_big * u_big * u_big)).astype(np.float32)
dx_big = np.empty_like(g_big)
gelu_backward_saved(g_big, u_big, t_saved, dx_big)
gelu_backward_recompute(g_big, u_big, dx_big)
t_save = median_seconds(lambda: gelu_backward_saved(g_big, u_big, t_saved, dx_big), repeats=5)
t_recompute = median_seconds(lambda: gelu_backward_recompute(g_big, u_big, dx_big), repeats=5)
print(f"backward reading saved t: {t_save*1e3:.1f} ms (reads g, u, t; writes dx)")
print(f"backward recomputing t:   {t_recompute*1e3:.1f} ms (reads g, u; writes dx)")
print(f"recompute / save time: {t_recompute / t_save:.2f}")
dx_saved = gelu_backward_saved(g_big, u_big, t_saved, np.empty_like(g_big))
assert np.allclose(gelu_backward_recompute(g_big, u_big, dx_big), dx_saved, rtol=1e-4,
                   atol=1e-5), "saving t and recomputing it give different gradients"
del dx_saved

# %%
def saved_tanh_bytes(tokens, width, layers, bytes_per_value):
    """Activation memory of keeping GELU's tanh for the backward: one value per MLP unit."""
    return tokens * width * layers * bytes_per_value


print(f"tiny trainer (B*T = 16*128, 4C = 512, L = 4, fp32): "
      f"{saved_tanh_bytes(16 * 128, 512, 4, 4) / 1e6:.1f} MB")
print(f"7B-class model (B*N = 8*2048, 4d = 16384, L = 32, bf16): "
      f"{saved_tanh_bytes(8 * 2048, 16384, 32, 2) / 1e9:.1f} GB")

# %% [markdown]
# This is the save-vs-recompute decision every fused backward makes. On a GPU, where the
# exp is nearly free and memory is the scarce resource, recomputing `t` is an easy win:
# 17 GB of activations gone for a few FLOPs. On this CPU, where `exp` is the expensive part,
# recomputing costs real time (the ratio above), and the 17 MB it saves for the tiny trainer
# hardly matter in system RAM. The right answer depends on which resource is scarce, and the
# way to know is to measure both.
#
# ## Layer-norm backward in one pass
#
# Layer norm normalises each row, `xhat = (x - mean) * rstd`, then scales and shifts:
# `y = xhat * w + b`. Its backward, for one row of C values with `gw = g * w`, is
#
# $$dx = \mathrm{rstd}\,\Bigl(gw - \overline{gw} - \hat x\,\overline{gw\,\hat x}\Bigr), \qquad dw = \sum_{\text{rows}} g\,\hat x, \qquad db = \sum_{\text{rows}} g,$$
#
# with the bars meaning a mean over the row. The numpy reference in `engine.kernels.reference`
# writes it in six lines; each line is one or more full passes over (N, C) arrays, about
# 22 array reads and writes in all. A fused kernel handles one row at a time: one loop
# accumulates both row means (and the row's share of dw and db), a second loop writes dx.
# The row is 128 floats, 512 bytes: after the first loop it is in the L1 cache, so the second
# loop costs no memory traffic. From memory's point of view that is **one pass**: read g and
# xhat once, write dx once.
#
# The column sums dw and db add a contribution from every row. Letting threads add into one
# shared dw would race (lesson 11 shows what that does); instead the rows are cut into a
# fixed number of chunks, each chunk sums into its own row of partial sums, and the partials
# are added in chunk order. The result does not depend on the number of threads.

# %%
@njit(parallel=True)
def layer_norm_backward_one_pass(g, xhat, rstd, w, n_chunks=16):
    n, c = g.shape
    dx = np.empty_like(g)
    dw_part = np.zeros((n_chunks, c))
    db_part = np.zeros((n_chunks, c))
    rows_per_chunk = (n + n_chunks - 1) // n_chunks
    for chunk in prange(n_chunks):
        for i in range(chunk * rows_per_chunk, min(n, (chunk + 1) * rows_per_chunk)):
            mean_gw = 0.0
            mean_gwx = 0.0
            for j in range(c):              # loop 1: row statistics and dw, db shares
                gw = g[i, j] * w[j]
                mean_gw += gw
                mean_gwx += gw * xhat[i, j]
                dw_part[chunk, j] += g[i, j] * xhat[i, j]
                db_part[chunk, j] += g[i, j]
            mean_gw /= c
            mean_gwx /= c
            for j in range(c):              # loop 2: the row is in L1 cache now
                dx[i, j] = rstd[i] * (g[i, j] * w[j] - mean_gw - xhat[i, j] * mean_gwx)
    dw = np.zeros(c)
    db = np.zeros(c)
    for chunk in range(n_chunks):           # fixed order: deterministic
        dw += dw_part[chunk]
        db += db_part[chunk]
    return dx, dw.astype(g.dtype), db.astype(g.dtype)


x_ln = rng.normal(size=(64, 128))
w_ln, b_ln = rng.normal(size=128), rng.normal(size=128)
_, xhat_ln, rstd_ln = reference.layer_norm_xhat_forward(x_ln, w_ln, b_ln, 1e-5)
g_ln = rng.normal(size=x_ln.shape)
ours = layer_norm_backward_one_pass(g_ln, xhat_ln, rstd_ln, w_ln)
theirs = reference.layer_norm_xhat_backward(g_ln, xhat_ln, rstd_ln, w_ln)
for name, a_, b_ in zip(["dx", "dw", "db"], ours, theirs):
    print(f"{name}: equals the reference to 1e-12: {np.allclose(a_, b_, rtol=1e-12, atol=1e-12)}")

# %% [markdown]
# Equal to the reference says both were derived alike; it does not say the derivation is
# right. A gradient checker does: take the scalar `f(x) = sum(g * y(x))`, whose gradient
# with respect to x is exactly the dx the backward computes for the upstream gradient g,
# and compare it with central differences of f, element by element, in float64. The
# checker is yours, `spot_check` of exercise 04.3, when you saved it; otherwise the
# engine's, with the same calling convention. The next cell says whose runs.

# %%
# NBVAL_IGNORE_OUTPUT
from coursework.pieces import gradient_checker

spot_check, checker_owner = gradient_checker()
print(f"gradient checker: {checker_owner}")

# %%
def ln_loss(x_, w_):
    """The scalar whose gradients are the one-pass kernel's dx and dw for upstream g_ln."""
    return float(np.sum(g_ln * reference.layer_norm_xhat_forward(x_, w_, b_ln, 1e-5)[0]))


dx_one, dw_one, _ = layer_norm_backward_one_pass(g_ln, xhat_ln, rstd_ln, w_ln)
ln_rows = {"dx": spot_check(lambda x_: ln_loss(x_, w_ln), x_ln, dx_one, n_checks=8),
           "dw": spot_check(lambda w_: ln_loss(x_ln, w_), w_ln, dw_one, n_checks=8)}
for name, rows in ln_rows.items():
    assert all(bool(r.ok) for r in rows), f"{name}: {[r for r in rows if not r.ok]}"
    print(f"one-pass layer-norm backward, {name}: {len(rows)} elements checked in float64, "
          f"all agree with central differences: {all(bool(r.ok) for r in rows)}")

# %%
# NBVAL_IGNORE_OUTPUT
print("Timing the numpy and the one-pass backward on 34 MB arrays (some seconds) ...",
      flush=True)
rows_ln = 65536                              # 65536 x 128 float32 = 34 MB per array
x_ln = rng.normal(size=(rows_ln, 128)).astype(np.float32)
w_ln = rng.normal(size=128).astype(np.float32)
b_ln = np.zeros(128, np.float32)
_, xhat_ln, rstd_ln = reference.layer_norm_xhat_forward(x_ln, w_ln, b_ln, 1e-5)
xhat_ln, rstd_ln = xhat_ln.astype(np.float32), rstd_ln.astype(np.float32)
g_ln = rng.normal(size=x_ln.shape).astype(np.float32)
layer_norm_backward_one_pass(g_ln, xhat_ln, rstd_ln, w_ln)
t_ref = median_seconds(lambda: reference.layer_norm_xhat_backward(g_ln, xhat_ln, rstd_ln, w_ln), 5)
t_one = median_seconds(lambda: layer_norm_backward_one_pass(g_ln, xhat_ln, rstd_ln, w_ln), 5)
array_bytes = x_ln.nbytes
print(f"numpy reference: {t_ref*1e3:.1f} ms, about 22 array passes "
      f"= {22 * array_bytes / t_ref / 1e9:.1f} GB/s")
print(f"one pass:        {t_one*1e3:.1f} ms, 3 array passes "
      f"= {3 * array_bytes / t_one / 1e9:.1f} GB/s")
print(f"speedup {t_ref / t_one:.1f}x; bandwidth of this machine {BANDWIDTH / 1e9:.1f} GB/s")
for name, a_, b_ in zip(["dx", "dw", "db"],
                        layer_norm_backward_one_pass(g_ln, xhat_ln, rstd_ln, w_ln),
                        reference.layer_norm_xhat_backward(g_ln, xhat_ln, rstd_ln, w_ln)):
    assert np.allclose(a_, b_, rtol=1e-3, atol=1e-4 * np.abs(b_).max()), \
        f"one-pass {name} differs from the reference at the timed size"

# %% [markdown]
# Read the two GB/s figures with care: the one-pass kernel usually shows the *lower*
# bandwidth and is still the faster, because GB/s here is "bytes the version must move over
# its time", and it must move 3 arrays where numpy moves about 22. A low figure says the
# kernel is not limited by memory but by its loops: each row's two means are running sums,
# and without `fastmath` numba may not reorder a float sum, so that loop runs one element
# at a time instead of in SIMD lanes; the dw and db shares are a read-modify-write of a
# float64 row per input row; and 16 chunks give the threads little to share. numpy's passes
# are simple vectorised streams, fast per byte but with seven times the bytes. The
# speed-up is the ratio of the times, not of the GB/s: (22 / 3) × (one-pass GB/s / numpy's
# GB/s). A kernel that moves fewer bytes wins even at a lower bandwidth; to go further,
# vectorise its reductions without giving up reproducible bits, as the trainer's kernels do
# (`engine/trainer/kernels/cpu/lanes.py`): sixteen partial sums in one vector register, lane k
# taking elements k, k + 16, k + 32, ..., then combined in one fixed order.

# %% [markdown]
# ## Fused softmax + cross-entropy
#
# The language-model head turns each of the N = B·T positions into V logits, and the loss is
# the cross-entropy of their softmax. The logits are the **largest tensor in the model**:
# B·T·V values. Written op by op, the forward keeps the probabilities (N × V), and the
# backward makes the gradient `(softmax - onehot) / N` as another (N × V) array, while the
# logits themselves are still alive: three copies of the biggest tensor.
#
# A fused kernel goes row by row. It finds the row maximum m, turns each logit into
# `exp(l - m)` *in place* while summing them, computes the row's loss
# `log(sum) + m - l_target`, then scales the row into the gradient of the mean loss, still in
# place. When it returns, the logits' buffer holds their gradient, and no other (N × V) array
# was ever made. The exp of each logit is stored once and reused, not recomputed: within a
# row that is cheap, because the row is still in cache.
#
# ## Exercise 10.2 · Softmax + cross-entropy that overwrites its logits
#
# Write `softmax_cross_entropy_fused(logits, targets)`: `logits` is (N, V), `targets` holds N
# integer class ids. Return the **mean** loss over the rows, and leave in `logits` the
# gradient of that mean:
#
# $$\frac{\partial\,\overline{L}}{\partial l_{ij}} = \frac{\mathrm{softmax}(l_i)_j - [j = t_i]}{N}.$$
#
# The kernel above the exercise describes the passes over a row; the order of the details
# is yours to work out. Two questions decide it: the row is overwritten as you go, so what
# must you read from it before the first write? And once a row holds `exp(l - m)` and you
# know its sum, what one factor per row, and what one subtraction, turn it into the formula
# above? Keep the per-row losses in `losses` and return their mean.

# %%
@njit(parallel=True)
def softmax_cross_entropy_fused(logits, targets):
    """Mean cross-entropy of the rows; `logits` is overwritten with its gradient."""
    n, v = logits.shape
    losses = np.empty(n)
    ### BEGIN SOLUTION
    for i in prange(n):
        m = logits[i, 0]
        for j in range(1, v):
            m = max(m, logits[i, j])
        target_logit = logits[i, targets[i]]
        total = 0.0
        for j in range(v):
            e = np.exp(logits[i, j] - m)
            logits[i, j] = e
            total += e
        losses[i] = np.log(total) + m - target_logit
        scale = 1.0 / (total * n)
        for j in range(v):
            logits[i, j] *= scale
        logits[i, targets[i]] -= 1.0 / n
    return losses.mean()
    ### END SOLUTION

# %%
# CHECK 10.2
lesson10.check_softmax_cross_entropy(softmax_cross_entropy_fused)

# %% [markdown]
# Your kernel returns a loss and leaves its gradient in the buffer: exactly what a gradient
# checker compares. The same checker as for the layer norm, in float64:

# %%
logits_check = np.random.default_rng(104).normal(size=(5, 7)) * 2
targets_check = np.array([0, 6, 3, 3, 1])
grad_check = logits_check.copy()
softmax_cross_entropy_fused(grad_check, targets_check)       # the gradient overwrites it
xent_rows = spot_check(lambda l_: float(softmax_cross_entropy_fused(l_.copy(), targets_check)),
                       logits_check, grad_check, n_checks=10)
assert all(bool(r.ok) for r in xent_rows), [r for r in xent_rows if not r.ok]
print(f"your softmax + cross-entropy gradient: {len(xent_rows)} elements checked in float64, "
      f"all agree with central differences: {all(bool(r.ok) for r in xent_rows)}")

# %% [markdown]
# Now the memory, measured. `tracemalloc` sees every array numpy allocates, so it can report
# the peak of new bytes during the unfused version (the engine's reference kernels: forward,
# then backward). numba's allocations are not visible to `tracemalloc`, so for the fused
# kernel we count them from its code: the `losses` array, N float64 values.

# %%
N_ROWS, VOCAB = 2048, 8192                  # B*T = 16*128 rows, a mid-sized vocabulary
logits = rng.normal(size=(N_ROWS, VOCAB)).astype(np.float32)
targets = rng.integers(0, VOCAB, size=N_ROWS)


def unfused_loss_and_grad(logits, targets):
    losses, probs = reference.cross_entropy_forward(logits, targets)
    grad = reference.cross_entropy_backward(probs, targets, 1.0 / len(targets))
    return float(losses.mean()), grad


tracemalloc.start()
loss_unfused, grad_unfused = unfused_loss_and_grad(logits, targets)
_, peak_unfused = tracemalloc.get_traced_memory()
tracemalloc.stop()

buffer = logits.copy()
loss_fused = softmax_cross_entropy_fused(buffer, targets)
fused_extra = N_ROWS * 8
print(f"logits: {logits.nbytes / 1e6:.1f} MB")
print(f"unfused: peak of new allocations {peak_unfused / 1e6:.1f} MB "
      f"= {peak_unfused / logits.nbytes:.1f} x the logits")
print(f"fused:   new allocations {fused_extra / 1e3:.1f} kB (the per-row losses)")
print(f"same loss: {math.isclose(loss_unfused, float(loss_fused), rel_tol=1e-5)}; "
      f"same gradient: {np.allclose(grad_unfused, buffer, rtol=1e-4, atol=1e-10)}")

# %%
# NBVAL_IGNORE_OUTPUT
t_unfused = median_seconds(lambda: unfused_loss_and_grad(logits, targets), repeats=5)
t_fused = median_seconds(lambda: softmax_cross_entropy_fused(logits.copy(), targets), repeats=5)
t_copy = median_seconds(lambda: logits.copy(), repeats=5)
print(f"unfused (numpy): {t_unfused*1e3:.1f} ms")
print(f"fused (numba):   {t_fused*1e3:.1f} ms (including a {t_copy*1e3:.1f} ms "
      f"copy that the trainer does not need)")
print(f"speedup: {t_unfused / t_fused:.1f}x")
assert math.isclose(float(softmax_cross_entropy_fused(logits.copy(), targets)), loss_unfused,
                    rel_tol=1e-5), "the timed fused kernel gives another loss"

# %% [markdown]
# The fused kernel's time runs into the same scalar `exp` as exercise 10.1, while numpy's
# `exp` is SIMD: on this CPU it may not be faster, even though it moves a third of the
# bytes. Its point is memory, and at real sizes that is the difference between fitting and
# not fitting. Take a batch of B·T = 16 384 tokens and vocabularies from 32 000 to 256 000
# (GPT-2's is 50 257):

# %%
for vocab in (32_000, 50_257, 128_000, 256_000):
    one = 16_384 * vocab * 4
    print(f"V = {vocab:>7,}: logits {one / 1e9:5.1f} GB; unfused keeps about 3 copies "
          f"({3 * one / 1e9:5.1f} GB), fused 1 ({one / 1e9:5.1f} GB)")

# %% [markdown]
# ## Attention without the T × T matrix
#
# One row of the usual table of training failures (symptom; cause; fix) reads: *OOM only on
# long sequences; the [N, N] scores; fused attention backward*. The trainer's attention kernel
# (`engine/trainer/kernels/attention.py`) saves its probabilities P, (B, H, T, T) numbers per
# layer, for the backward. Everything else a block keeps grows like T; P grows like T².
# The budget (`engine.budget`) counts it for a GPT-2-small shape (12 layers, 12 heads,
# width 768, B = 8, 16-bit activations) as the sequence grows:

# %%
from engine.budget import BudgetConfig
from engine.budget.activations import fused_attention_saved

print(f"{'T':>6} {'probabilities, 12 layers':>26} {'one number per row':>20}")
for T in (1024, 2048, 4096, 8192, 16384):
    shape = BudgetConfig(n_layer=12, d_model=768, n_head=12, micro_batch=8, seq_len=T,
                         precision="bf16")
    probs = 12 * fused_attention_saved(shape, "standard").bytes
    rows = 12 * fused_attention_saved(shape, "flash").bytes
    print(f"{T:>6} {probs / 2**30:>22.1f} GiB {rows / 2**20:>16.1f} MiB")

# %% [markdown]
# At T = 1024 the probabilities are two GiB; at T = 16 384 they are more than any
# accelerator holds, while the rest of the model has only grown sixteen-fold. The fix is
# not to keep P at all, and, in the forward, never to hold a whole row of scores either.
#
# **The online softmax.** For one query row i, with scores $s_j = q_i \cdot k_j / \sqrt{hs}$
# for the keys $j \le i$, attention is
#
# $$y_i = \frac{\sum_j e^{s_j - m}\, v_j}{\sum_j e^{s_j - m}}, \qquad m = \max_j s_j .$$
#
# Any m gives the same $y_i$; the maximum only keeps every exponential at most 1. Now let
# the keys arrive in tiles. After some tiles, keep three things per row: the largest score
# seen so far $m$, the sum $l = \sum e^{s_j - m}$ and the unnormalised output
# $a = \sum e^{s_j - m} v_j$, both over the keys seen. The next tile has maximum
# $\tilde m$; the new maximum is $m' = \max(m, \tilde m)$. Every term already summed carries
# the factor $e^{-m}$, and we want $e^{-m'}$: multiply by $e^{m - m'}$ (at most 1, so it never
# overflows), then add the tile:
#
# $$l \leftarrow l\, e^{m - m'} + \sum_{j \in \text{tile}} e^{s_j - m'}, \qquad
#   a \leftarrow a\, e^{m - m'} + \sum_{j \in \text{tile}} e^{s_j - m'} v_j, \qquad
#   m \leftarrow m'.$$
#
# After the last tile, $y_i = a / l$, exactly the softmax, and $\mathrm{lse}_i = m + \log l$ is
# the row's log-sum-exp. That one number per row is all the backward needs to rebuild any
# probability: $p_{ij} = e^{s_{ij} - \mathrm{lse}_i}$. No score outlives its tile.
#
# The picture: the (T × T) scores cut into tiles. A block of query rows walks its key tiles
# from the left up to the diagonal, carrying m, l and a along; in the diagonal tile the
# future keys are masked; the tiles right of the diagonal are never computed at all.

# %%
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

T_pic, tile_pic = 40, 8
i_pic, j_pic = np.mgrid[0:T_pic, 0:T_pic]
same_tile = i_pic // tile_pic == j_pic // tile_pic
kind = np.where(j_pic <= i_pic, 2, np.where(same_tile, 1, 0))  # 2 used, 1 masked, 0 never made
colours = ["white", "#c44e52", "#4c72b0"]
fig, ax = plt.subplots(figsize=(5.5, 6))
ax.imshow(kind, cmap=ListedColormap(colours), vmin=0, vmax=2, interpolation="nearest")
for edge in np.arange(0, T_pic + 1, tile_pic) - 0.5:
    ax.axhline(edge, color="black", lw=0.8)
    ax.axvline(edge, color="black", lw=0.8)
row_block = 3                                   # one block of query rows, walked left to right
y = (row_block + 0.5) * tile_pic - 0.5
ax.annotate("", xy=((row_block + 1) * tile_pic - 1, y), xytext=(0, y),
            arrowprops=dict(arrowstyle="->", color="black", lw=2))
ax.text(0.5, y - 1.2, "m, l, a carried from tile to tile", fontsize=8, color="white")
ax.set_xticks(np.arange(0, T_pic, tile_pic) - 0.5, [f"{k}" for k in range(0, T_pic, tile_pic)])
ax.set_yticks(np.arange(0, T_pic, tile_pic) - 0.5, [f"{k}" for k in range(0, T_pic, tile_pic)])
ax.set_xlabel(f"key j (tiles of {tile_pic})")
ax.set_ylabel(f"query i (tiles of {tile_pic})")
ax.set_title(f"Causal attention, T = {T_pic}, in {tile_pic} × {tile_pic} tiles")
ax.legend(handles=[Patch(color=colours[2], label="scores computed and used (j ≤ i)"),
                   Patch(color=colours[1], label="diagonal tile: j > i set to −inf"),
                   Patch(facecolor="white", edgecolor="black", label="tile never computed")],
          loc="upper center", bbox_to_anchor=(0.5, -0.1), fontsize=8)
plt.show()

# %% [markdown]
# ## Exercise 10.3 · Attention with the online softmax
#
# Write `online_softmax_attention(qkv, n_head, tile=16)` in numpy. `qkv` is (B, T, 3C) as the
# trainer lays it out (queries, keys, values side by side); return `out` (B, T, C) and `lse`
# (B, H, T). Work on one block of `tile` query rows at a time (all batches and heads at
# once, numpy broadcasts over them), and inside it on one block of `tile` keys at a time,
# from the first up to the block that holds the diagonal. In that last block, mask the keys
# j > i with −inf *before* the exponential. Start each row with m = −inf, l = 0, a = 0:
# the first tile always has column 0, so m becomes finite at once, and
# $e^{-\infty} = 0$ wipes the empty start. The check compares you with the full masked
# softmax and measures that you never made a (T × T) array.

# %%
def online_softmax_attention(qkv, n_head, tile=16):
    """Causal attention of qkv (B, T, 3C), tile by tile: returns (out (B, T, C), lse (B, H, T))."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    hs = C // n_head
    q, k, v = (qkv[..., i * C:(i + 1) * C].reshape(B, T, n_head, hs).transpose(0, 2, 1, 3)
               for i in range(3))                                   # (B, H, T, hs) each
    out = np.empty((B, n_head, T, hs))
    lse = np.empty((B, n_head, T))
    scale = 1.0 / np.sqrt(hs)
    ### BEGIN SOLUTION
    for i0 in range(0, T, tile):
        rows = np.arange(i0, min(i0 + tile, T))
        qi = q[:, :, rows] * scale                                  # (B, H, r, hs)
        m = np.full(qi.shape[:-1], -np.inf)                         # running maximum
        l = np.zeros(qi.shape[:-1])                                 # running sum
        acc = np.zeros(qi.shape)                                    # running output
        for j0 in range(0, rows[-1] + 1, tile):
            cols = np.arange(j0, min(j0 + tile, T))
            s = qi @ k[:, :, cols].transpose(0, 1, 3, 2)            # (B, H, r, c): one tile
            s = np.where(cols[None, :] <= rows[:, None], s, -np.inf)
            m_new = np.maximum(m, s.max(-1))
            rescale = np.exp(m - m_new)
            p = np.exp(s - m_new[..., None])
            l = l * rescale + p.sum(-1)
            acc = acc * rescale[..., None] + p @ v[:, :, cols]
            m = m_new
        out[:, :, rows] = acc / l[..., None]
        lse[:, :, rows] = m + np.log(l)
    ### END SOLUTION
    return out.transpose(0, 2, 1, 3).reshape(B, T, C), lse

# %%
# CHECK 10.3
lesson10.check_online_softmax(online_softmax_attention)

# %% [markdown]
# Your function fills the trainer's `flash_attention_forward` slot: it takes the kernel's
# inputs and returns its outputs. The trainer's `FusedGPT(attention="flash")` keeps your
# `lse` instead of P, and its backward (`engine/trainer/kernels/flash_attention.py`) rebuilds
# the probabilities from it, tile by tile. Plugged in, in float64, a step's gradients are
# those of the standard kernel:

# %%
from engine.gpt_config import GPTConfig, init_params
from engine.trainer.model import FusedGPT, kernel_owners, reset_kernels, use_kernel

small = GPTConfig(vocab_size=13, block_size=40, n_layer=2, n_head=2, n_embd=16)
ids, next_ids = np.random.default_rng(10).integers(0, 13, (2, 3, 40))


def step_gradients(attention):
    model = FusedGPT(small, 3, params=init_params(small, 0, np.float64), dtype=np.float64,
                     attention=attention)
    loss = model.forward(ids, next_ids)
    model.backward()
    return loss, model.grads.flat.copy()


loss_standard, grads_standard = step_gradients("standard")
use_kernel("flash_attention_forward", online_softmax_attention, owner="you")
try:
    loss_yours, grads_yours = step_gradients("flash")
    owner = kernel_owners()["flash_attention_forward"]
finally:
    reset_kernels("flash_attention_forward")
gap = np.abs(grads_yours - grads_standard).max() / np.abs(grads_standard).max()
print(f"flash_attention_forward run by: {owner}")
print(f"same loss: {math.isclose(loss_yours, loss_standard, rel_tol=1e-12)}; "
      f"gradients within 1e-10: {gap < 1e-10}")

# %% [markdown]
# **The memory curve, measured.** The trainer's models report the bytes they keep from
# forward to backward (`engine.trainer.model.activation_bytes`, what
# `python -m engine.bench --json` prints as `activation_bytes`). One sequence, growing:

# %%
from engine.trainer.model import activation_bytes

curve = GPTConfig(vocab_size=64, block_size=2048, n_layer=2, n_head=4, n_embd=64)
kept = {}
print(f"{'T':>5} | {'standard: attention':>20} {'all kept':>10} | "
      f"{'flash: attention':>17} {'all kept':>10}   (KiB)")
for T in (128, 256, 512, 1024, 2048):
    kept[T] = {kind: activation_bytes([FusedGPT(curve, 1, seq_len=T, attention=kind)])
               for kind in ("standard", "flash")}
    s, f = kept[T]["standard"], kept[T]["flash"]
    print(f"{T:>5} | {s['attention_saved_bytes'] / 1024:>20,.0f} "
          f"{s['activation_bytes'] / 1024:>10,.0f} | {f['attention_saved_bytes'] / 1024:>17,.0f} "
          f"{f['activation_bytes'] / 1024:>10,.0f}")
attention_kept = {kind: [kept[T][kind]["attention_saved_bytes"] for T in kept]
                  for kind in ("standard", "flash")}
for shorter, longer in zip(attention_kept["standard"], attention_kept["standard"][1:]):
    assert longer == 4 * shorter
for shorter, longer in zip(attention_kept["flash"], attention_kept["flash"][1:]):
    assert longer == 2 * shorter
print("each doubling of T: the probabilities grow 4x, the row statistics 2x")

# %% [markdown]
# The probabilities go from over a third of what the model keeps at T = 128 to nine tenths
# at T = 2048; with the flash kernel, attention's own share stays a few KiB.
#
# **What the backward pays.** The standard backward reads P and runs four products per
# pair of tiles (dP = dY Vᵀ, dV = Pᵀ dY, dQ = dS K, dK = dSᵀ Q). The flash backward has no P:
# it first computes $D_i = \sum_j p_{ij}\, dp_{ij}$, the softmax backward's row sum, as
# $dy_i \cdot y_i$ (because $y_i = \sum_j p_{ij} v_j$ and $dp_{ij} = dy_i \cdot v_j$), then per
# tile recomputes S = Q Kᵀ and P = exp(S − lse) before the same four products: five
# products and a tile of exponentials instead of four. What it saves is traffic: the
# standard forward writes T × T probabilities per head and its backward reads them back.
# Measured, kernel against kernel, on one thread (where both kernels work block of query
# rows by block, each product a register-tile product of
# `engine/trainer/kernels/cpu/register_tiles.py`; see `engine/trainer/kernels/attention.py`):

# %%
# NBVAL_IGNORE_OUTPUT
from engine.timing import fixed_threads

qkv = np.random.default_rng(11).normal(size=(2, 512, 3 * 128)).astype(np.float32)
dy = np.random.default_rng(12).normal(size=(2, 512, 128)).astype(np.float32)
y_std, probs = fused.attention_forward(qkv, 4)
y_fl, row_lse = fused.flash_attention_forward(qkv, 4)
with fixed_threads(1):
    t_fwd_std = median_seconds(lambda: fused.attention_forward(qkv, 4), repeats=5, warmup=1)
    t_fwd_fl = median_seconds(lambda: fused.flash_attention_forward(qkv, 4), repeats=5,
                              warmup=1)
    t_bwd_std = median_seconds(lambda: fused.attention_backward(dy, qkv, probs), repeats=5,
                               warmup=1)
    t_bwd_fl = median_seconds(lambda: fused.flash_attention_backward(dy, qkv, y_fl, row_lse),
                              repeats=5, warmup=1)
print(f"B=2 T=512 H=4 C=128 float32, one thread   forward   backward   saved for backward")
print(f"standard (keeps P)             {t_fwd_std * 1e3:7.1f} ms {t_bwd_std * 1e3:7.1f} ms   "
      f"{probs.nbytes / 2**20:6.2f} MiB")
print(f"flash (recomputes P)          {t_fwd_fl * 1e3:7.1f} ms {t_bwd_fl * 1e3:7.1f} ms   "
      f"{row_lse.nbytes / 2**20:6.2f} MiB")
print(f"flash / standard, forward + backward: "
      f"{(t_fwd_fl + t_bwd_fl) / (t_fwd_std + t_bwd_std):.2f}")

# %% [markdown]
# Which one wins depends on the machine and on where P lives, which is why this cell
# prints timings and no verdict: the flash backward does more arithmetic, the standard
# kernel moves more memory (P, 8 MiB here, written by the forward and read back by the
# backward). Timed alone, as here, part of P may still sit in the caches when the
# backward reads it; in a training step every layer's P has long left them by the time
# its backward runs, so the standard kernel pays the trip to main memory twice, which can
# make up for the recompute: compare
# `python -m engine.bench --shapes T512 T1024 --attention flash` with the same command
# and `--attention standard` on your machine. Either way the trade is the right one where
# memory runs out: a step that does not fit is infinitely slow. On a GPU the tiles sit in
# fast on-chip memory, and the kernel that never writes P to main memory is the faster
# one. `python -m engine.bench --sweep-attention` measures both kernels and PyTorch's
# `scaled_dot_product_attention` from T = 128 to 2048.
#
# The tape engine has the other answer to the same row of the failure table: *selective
# recompute* (`engine.recompute.selective_recompute`) keeps q, k, v and rebuilds only the
# probabilities in the backward, block by block, the cheap-to-redo and large-to-keep part
# that Korthikanti et al. single out; `engine.budget.lab.measure` now measures it.

# %% [markdown]
# ## What you built, and what it costs
#
# - **Two limits, measured**: this machine's memory bandwidth (a large copy) and its matmul
#   rate (sgemm). Their ratio, the ridge point, says how many FLOPs a kernel must do per byte
#   before memory stops being its limit. Elementwise ops and normalisations are far below it.
# - **A fused bias + GELU kernel** (your piece `bias_gelu_forward`): 8 bytes per element
#   instead of 92, one pass instead of ten. On this CPU it then runs into the cost of a
#   scalar `exp`, a limit the roofline does not draw; an `exp` built from multiplies and adds
#   lets the compiler vectorise the loop and removes it. On a GPU the kernel would run into
#   the memory roof instead.
# - **Save vs recompute** for GELU's backward: keeping `t` costs one activation tensor per
#   layer (17 GB for a 7B-class model in bf16), recomputing costs an exp per element. Which
#   is cheaper depends on what the machine is short of; measure it.
# - **Layer-norm backward in one pass**: row statistics and dx from a row held in cache,
#   deterministic column sums from fixed chunks.
# - **Fused softmax + cross-entropy** (your piece `softmax_cross_entropy`): the loss comes
#   out, the gradient overwrites the logits, and the largest tensor of the model exists
#   once instead of three times.
# - **Attention with the online softmax** (your piece `flash_attention_forward`): a running
#   maximum, sum and output per row, one log-sum-exp kept per row instead of a (T × T)
#   matrix; the backward recomputes the probabilities tile by tile, for one more product
#   per tile.
#
# The rule behind all of them: for memory-bound kernels, count passes over memory, not
# FLOPs. Lesson 11 turns to a kernel whose problem is not bandwidth but *order*: the
# embedding's scatter-add, where threads that add into the same row must not race.
