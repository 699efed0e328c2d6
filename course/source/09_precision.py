# %% [markdown]
# # 09 · Precision
#
# **Goals.** By the end of this lesson you will
# 1. tell apart the three decisions hidden in the words "mixed precision": the format a tensor
#    is *stored* in, the format a long sum is *accumulated* in, and the format of the *master
#    weights* the optimizer updates;
# 2. round float32 to bf16 yourself, on the bits, with round-to-nearest-even, and see
#    `1 + 1e-4` come back as `1`;
# 3. see fp16's narrow range at work: a language model's gradients sit below fp16's smallest
#    normal number (about 6.1e-5) and lose their bits or vanish, and loss scaling (multiply
#    the loss by 2^15, divide the gradients back) rescues them;
# 4. write the dynamic loss scaler's rule: skip a step whose gradients overflowed and halve
#    the scale, grow it again after a run of good steps;
# 5. watch a training run stall with bf16 weights and recover with fp32 master weights;
# 6. measure fp32 against emulated mixed precision on this CPU and explain the result.
#
# **How we emulate.** numpy has no bf16 type, and its float16 arithmetic is slow, so
# `engine.precision` keeps every tensor in a float32 array but *rounds* it to the values the
# smaller format can hold. The numbers are exactly those of the real formats; only the speed
# is not (we measure what that costs at the end).
#
# **Your pieces in the engine.** Fills: the bf16 rounding step (09.1, `to_bf16`), the
# master-weight update (09.2, `master_weight_step`) and the loss scaler's rule (09.3,
# `update_scale`); each is checked against `engine.precision` on the arrays a training step
# hands it before it is saved. Runs: your `to_bf16` in every bf16 rounding of this lesson
# after exercise 09.1 (the worked values, the bf16 sums and the master-weight runs; a cell
# says whose rounding runs, and where yours is missing or breaks its slot's contract the
# engine's `round_to_bf16` runs and the cell says why). No earlier pieces. (The whole map:
# CONTRIBUTING.md, "Exercise <-> slot".)

# %%
import numpy as np
import matplotlib.pyplot as plt

from engine import precision as P
from coursework import lesson09

lesson09.name_unfinished_exercises()   # a cell that needs an unfinished exercise says which

np.set_printoptions(precision=6, suppress=False)

# %% [markdown]
# ## Three formats, three shapes of number
#
# A binary float stores a sign, an exponent `e` and a fraction of `m` bits; its value is
# `±1.fraction × 2^e`. The exponent bits decide the *range* (how large and how small), the
# fraction bits the *precision* (how finely a range `[2^e, 2^(e+1))` is divided). Between two
# powers of two there are always `2^m` values, so the gap next to 1.0 is `2^-m`: that gap is
# the format's *epsilon*.

# %%
print(f"{'format':<6} {'bits':>4} {'exp':>4} {'frac':>4} {'epsilon':>10} {'smallest normal':>16} "
      f"{'smallest subnormal':>19} {'largest':>10}")
for f in P.FORMATS.values():
    print(f"{f.name:<6} {f.bits:>4} {f.exponent_bits:>4} {f.mantissa_bits:>4} {f.epsilon:>10.3g} "
          f"{f.smallest_normal:>16.3g} {f.smallest_subnormal:>19.3g} {f.max:>10.4g}")

# %% [markdown]
# Read the two 16-bit rows against each other. **bf16** ("brain float") keeps all 8 exponent
# bits of fp32, so it has fp32's range (down to 1.2e-38, up to 3.4e38), and pays with
# precision: 7 fraction bits, an epsilon of 1/128. **fp16** keeps 10 fraction bits (an
# epsilon of about 1e-3) but only 5 exponent bits: nothing above 65504, and below
# `2^-14 ≈ 6.1e-5` it runs out of normal numbers. Values under that are *subnormal*: the
# leading 1 is gone, the spacing stays `2^-24 ≈ 6e-8`, and every halving of the value costs
# one bit of precision until, under `2^-25 ≈ 3e-8`, there is nothing left but zero.
#
# ## The swallowed update
#
# A weight of 1.0 gets an update of 1e-4, a typical size (learning rate times gradient).
# The exact sum 1.0001 has to be stored back. In bf16 the neighbours of 1.0 are 1 - 2^-8 and
# 1 + 2^-7 = 1.0078125; 1.0001 is far closer to 1.0, so it *becomes* 1.0: the update is gone.

# %%
w, update = np.float32(1.0), np.float32(1e-4)
for fmt in ("fp32", "fp16", "bf16"):
    stored = P.cast(w + update, fmt)
    print(f"{fmt}: 1 + 1e-4 is stored as {float(stored):.7f}   "
          f"(step near 1: {float(P.representable_step(w, fmt)):.3g}; an update survives "
          f"only if larger than half a step, {float(P.representable_step(w, fmt)) / 2:.3g})")

# %% [markdown]
# The step printed for bf16 is the gap *above* 1.0, 2^-7 ≈ 0.0078, so an increase survives
# only if it is larger than half of it, 0.0039. Below 1.0 the values are twice as dense
# (the gap is 2^-8 ≈ 0.0039), so a decrease survives from half of that, about 2e-3. Hence
# the rule of thumb "updates under 2e-3 vanish at weights of size 1": that holds in both
# directions, and upward even updates up to 0.0039 vanish. fp16 swallows 1e-4 too. Repeat
# the update a thousand times and a bf16 weight still reads 1.0: this is the silent stall
# that training guides warn of ("loss plateaus, weights barely move").
#
# ## Rounding on the bits
#
# bf16 is literally the upper half of a float32: same sign bit, same 8 exponent bits, the
# first 7 of the 23 fraction bits. Converting float32 to bf16 therefore means dropping the
# low 16 bits, and the only question is how to round. Look at the bits of three numbers:

# %%
def show_bits(x):
    b = int(np.float32(x).view(np.uint32))
    s = f"{b:032b}"
    return f"{s[0]} {s[1:9]} {s[9:16]}|{s[16:]}"


print("sign exponent  kept7  |dropped 16")
for x in (1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 1.0001):
    print(f"{show_bits(x)}   {x!r}")

# %% [markdown]
# * **Truncation** (just clear the low 16 bits) always rounds toward zero. Its error is
#   biased: a long sum of truncated values drifts down.
# * **Round to nearest** adds half of the dropped range (0x8000) before clearing. Exact
#   ties, where the dropped bits are exactly `1000...0` like `1 + 2^-8` above, would then
#   always go up, again a bias.
# * **Round to nearest, ties to even** (IEEE's default, what hardware and PyTorch do) sends
#   a tie to whichever neighbour has a 0 as its last kept bit. The trick on the integer
#   view: add `0x7FFF + (last kept bit)` and clear the low 16 bits. Without a tie the extra
#   0 or 1 changes nothing; at a tie it decides. A carry out of the fraction bumps the
#   exponent, which is exactly right, and lifts values beyond bf16's max to infinity.
#
# One trap remains: NaN. A NaN has an all-ones exponent and a nonzero fraction; if its
# nonzero bits are all in the dropped half (the pattern `0x7F800001`), dropping them leaves
# `0x7F80`, which is *infinity*. Keep a NaN a NaN by setting the top fraction bit
# (`0x00400000`, the "quiet" bit) before clearing.
#
# ## Exercise 09.1 · float32 to bf16
#
# Write `to_bf16(x)`: `x` is a float32 array; return a float32 array holding, for every
# element, the nearest bf16 value (ties to even, NaN stays NaN, overflow becomes infinity).
# Work on `x.view(np.uint32)` (the same bytes read as unsigned integers), and view the
# result back with `.view(np.float32)`. Use `np.uint32(...)` constants so numpy keeps the
# integers 32 bits wide (it wraps around instead of overflowing).

# %%
def to_bf16(x):
    """Round a float32 array to the nearest bf16 values (returned as float32)."""
    ### BEGIN SOLUTION
    bits = x.view(np.uint32)
    lowest_kept = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = (bits + np.uint32(0x7FFF) + lowest_kept) & np.uint32(0xFFFF0000)
    quiet_nan = (bits | np.uint32(0x00400000)) & np.uint32(0xFFFF0000)
    return np.where(np.isnan(x), quiet_nan, rounded).astype(np.uint32).view(np.float32)
    ### END SOLUTION


# %%
# CHECK 09.1
lesson09.check_to_bf16(to_bf16)

# %% [markdown]
# Your function now agrees with `engine.precision.round_to_bf16` on every input the check
# tried (ties, subnormals, NaN payloads, 20,000 random bit patterns), and on the arrays the
# engine hands its rounding step (a weight matrix, the transposed view a matmul reads, a
# scalar), which it leaves unchanged. The engine's version is also held bit for bit against
# PyTorch's `torch.bfloat16` and an independent float64 reference by
# `tests/test_precision.py`.
#
# From here on this lesson rounds to bf16 with your piece: `piece_or_engine` loads it fresh
# from its file and checks it in its slot again, and `engine.precision.use_bf16_rounding`
# makes every bf16 rounding of `engine.precision` (`cast`, `matmul_mixed`, the training
# runs) call it. Where your piece is missing or breaks the contract, the engine's
# `round_to_bf16` runs, and the next cell says why.

# %%
# NBVAL_IGNORE_OUTPUT
# (whose rounding runs depends on the pieces you saved; a solution notebook saves its own)
from coursework.pieces import piece_or_engine

bf16, bf16_owner = piece_or_engine("to_bf16", "09.1", P.round_to_bf16)
print(f"bf16 rounding in the rest of this lesson: {bf16_owner}")

# %% [markdown]
# Here it is on the worked values:

# %%
samples = np.array([1.0, 1.0 + 1e-4, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, np.pi, 1e-3, 65504.0,
                    3.3e38, 3.4e38], dtype=np.float32)
for x, y in zip(samples, bf16(samples)):
    print(f"{float(x):>14.8g} -> bf16 {float(y):<14.8g} bits {int(P.bf16_bits(y)):#06x}")

# %% [markdown]
# ## fp16 on the value grid
#
# fp16 cannot be had by clearing bits: its exponent field is shorter, so the bits have to
# be repacked. `engine.precision.round_to_fp16` rounds on the *value grid* instead: near
# `|x|` the fp16 values are spaced `step = 2^(max(e, -14) - 10)` where `2^e ≤ |x| < 2^(e+1)`.
# Since the step is a power of two, `x / step` is exact, `np.rint` rounds it to the nearest
# integer with ties to even, and multiplying back is exact again. The `max(e, -14)` clamp is
# the whole story of subnormals: below 2^-14 the step stops shrinking. The result is checked
# bit for bit against numpy's own float16 conversion (every tie between two fp16 values,
# both neighbours of each tie, and 300,000 random bit patterns).
#
# The plot shows what each format does to numbers across 80 orders of magnitude: the
# relative gap from each power of two to the next representable value (the precision you
# get there) against the magnitude.

# %%
mags = 2.0 ** np.arange(-149, 128)   # every power of two a float32 holds, 2^-149 to 2^127
fig, ax = plt.subplots(figsize=(8, 3.6))
for fmt, color in (("fp32", "#4c72b0"), ("bf16", "#dd8452"), ("fp16", "#55a868")):
    f = P.FORMATS[fmt]
    inside = (mags >= f.smallest_subnormal) & (mags <= f.max)
    rel = P.representable_step(mags, fmt).astype(np.float64) / mags
    ax.loglog(mags[inside], rel[inside], color=color, label=fmt, lw=2)
ax.axvline(P.FORMATS["fp16"].smallest_normal, color="#55a868", ls=":", lw=1)
ax.text(P.FORMATS["fp16"].smallest_normal * 3, 1e-5, "fp16 smallest\nnormal 6.1e-5",
        fontsize=8, color="#55a868")
ax.set_xlabel("|x|")
ax.set_ylabel("gap to the next value / |x|")
ax.set_title("Precision across the range: flat while normal, rising once subnormal")
ax.legend(loc="upper right")
plt.show()

# %% [markdown]
# Flat lines are the normal ranges (the same relative precision everywhere); the rising parts
# on the left are the subnormals, where the gap stays fixed while the numbers shrink, until
# the gap is the number itself (a relative gap of 1: the next step down is zero). fp16's
# line starts rising at 6.1e-5 and ends at 6e-8; above 65504 it stops. bf16 covers everything
# fp32 covers, about 65,000 times more coarsely than fp32 and 8 times more coarsely than
# fp16.
#
# ## Accumulation: why every reduction upcasts
#
# Storage in 16 bits halves memory and bandwidth. *Summing* in 16 bits is another matter.
# A kernel that keeps its running sum in bf16 adds 1.0 a thousand times and gets 256: at
# 256 the step between bf16 values is 2, so 256 + 1 is a tie, rounded to the even
# neighbour 256, every time.

# %%
ones = np.ones(1000, dtype=np.float32)
with P.use_bf16_rounding(bf16):        # every bf16 rounding in the block runs `bf16`
    for fmt in ("bf16", "fp16", "fp32"):
        print(f"sum of 1000 ones with a {fmt} accumulator: {P.sequential_sum(ones, fmt):g}")

    rng = np.random.default_rng(0)
    a = bf16(rng.normal(size=4096).astype(np.float32))
    b = bf16(rng.normal(size=4096).astype(np.float32))
    exact = float(np.dot(a.astype(np.float64), b.astype(np.float64)))
    fp32_acc = float(P.matmul_mixed(a[None, :], b[:, None], "fp32")[0, 0])
    bf16_acc = P.sequential_sum(bf16(a * b), "bf16")
print(f"dot product of two bf16 vectors of length 4096: exact {exact:.4f}")
# The fp32 sum runs through the matrix library, whose order of additions (and so the last
# bits) differs between CPUs: print its size class, and the exact figure below.
print(f"  fp32 accumulator: {fp32_acc:.2f}   (error below 1e-4: {abs(fp32_acc - exact) < 1e-4})")
print(f"  bf16 accumulator: {bf16_acc:.4f}   (error {abs(bf16_acc - exact):.2g})")

# %%
# NBVAL_IGNORE_OUTPUT
# (the last bits of an fp32 sum depend on the order the matrix library adds in)
print(f"fp32 accumulator on this machine: {fp32_acc!r}, error {abs(fp32_acc - exact):.2g}")

# %% [markdown]
# So real mixed-precision kernels read bf16 or fp16 inputs and accumulate inner products in
# fp32 (`engine.precision.matmul_mixed` does the same: round the inputs, multiply in fp32,
# round the output). The same holds for the backward pass: a weight gradient is a sum over
# every token of the batch, the textbook case of many small contributions, so gradient
# reductions and the gradient accumulator are kept in fp32.
#
# ## Master weights
#
# Now the third decision. Train the same small network (a two-layer ReLU classifier, 512
# points, 8 classes, full-batch SGD) three ways, with `engine.precision.train_classifier`:
#
# * **fp32** everything;
# * **bf16 weights only**: the forward reads bf16 weights, and the update is added to those
#   bf16 weights and rounded straight back;
# * **bf16 + fp32 master**: the forward reads bf16 weights, but the optimizer keeps an fp32
#   copy, updates it, and re-rounds the bf16 copy from it after every step.
#
# In both bf16 runs the activations and gradients are stored in bf16 too and the matmuls
# accumulate in fp32. Besides the loss we log `update_kept`: the size of the change that
# actually happened to the weights the optimizer owns, over the size of the update it asked
# for.

# %%
problem = P.make_classification()
with P.use_bf16_rounding(bf16):        # the bf16 runs round with `bf16` (yours, see above)
    runs = {name: P.train_classifier(P.POLICIES[name], problem, steps=600, lr=1.0)
            for name in ("fp32", "bf16 weights only", "bf16 + fp32 master")}
# fp32 matrix products differ in their last bits between CPUs, and 600 steps carry that
# into the fourth digit of the loss: three decimals are the same on every machine.
for name, log in runs.items():
    print(f"{name:<20} loss after 600 steps {log.losses[-1]:.3f}   share of the update kept "
          f"(last 100 steps) {np.mean(log.update_kept[-100:]):.2f}")

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
for name, log in runs.items():
    ax1.semilogy(log.losses, label=name)
    ax2.plot(np.convolve(log.update_kept, np.ones(20) / 20, mode="valid"), label=name)
ax1.set_xlabel("step"), ax1.set_ylabel("cross-entropy"), ax1.legend()
ax2.set_xlabel("step"), ax2.set_ylabel("share of the update kept (20-step mean)")
ax1.set_title("bf16 weights stall; a master copy recovers")
plt.show()

# %% [markdown]
# All three start together: early updates are large enough to move bf16 weights. As the
# gradients shrink, more and more of each update is less than half a bf16 step and is
# rounded away; the bf16-only run keeps a fraction of its updates and its loss flattens
# several times above the others. The master-weight run keeps every update in fp32, where
# small changes add up until they cross a bf16 step, and follows fp32 closely. The forward
# pass still ran on bf16 weights: the storage saving is kept, the stall is gone.
#
# The price: 4 bytes per parameter for the master copy, next to the 2-byte bf16 weights
# (this is where the usual "16 bytes per parameter" for mixed-precision AdamW comes
# from: 2 weights + 2 gradients + 4 master + 4 + 4 for AdamW's two moments). That count
# keeps the gradient in bf16. A setup that accumulates gradients in fp32, as the section on
# sums below recommends for any long sum (over micro-batches, over data-parallel ranks),
# pays 4 bytes for them: **18 bytes per parameter**. Lesson 07's budget uses the 16; add 2
# per parameter for an fp32 gradient buffer.
#
# A master copy is not the only cure. **Stochastic rounding** rounds up with a probability
# equal to how far the exact value lies towards the upper neighbour: a single update of 1e-4
# still usually rounds away, but on average the weight moves by exactly 1e-4 per step, so
# many small updates add up without an fp32 copy. Some hardware and some bf16-only
# optimizers use it; this course keeps the master copy, which is deterministic.
#
# ## Exercise 09.2 · One step with master weights
#
# Write `master_weight_step(master, grad, lr)`: `master` is the fp32 master copy, `grad`
# the gradient (already in fp32), `lr` the learning rate. Return `(new_master, weights)`:
# the updated fp32 master weights (plain SGD) and the bf16 weights the next forward pass
# will read. You may use your `to_bf16` or `P.round_to_bf16`.

# %%
def master_weight_step(master, grad, lr):
    """One SGD step on fp32 master weights; return (new_master, bf16 weights)."""
    ### BEGIN SOLUTION
    new_master = master - np.float32(lr) * grad
    return new_master, P.round_to_bf16(new_master)
    ### END SOLUTION


# %%
# CHECK 09.2
lesson09.check_master_weight_step(master_weight_step)

# %% [markdown]
# ## fp16: the range problem, and loss scaling
#
# bf16's trouble was precision. fp16's is range. Take the first gradient of a language
# model's backward pass, the gradient of the mean cross-entropy with respect to the logits:
# `(softmax(logits) - onehot) / N` for N = B x T tokens. With B x T = 2048 tokens and a
# vocabulary of 96 characters, an untrained model puts about 1/96 on each character, so the
# typical entry is about `1 / (96 x 2048) ≈ 5e-6`: already below fp16's smallest normal.
# As the model grows confident, the wrong characters' probabilities (and gradients) shrink
# further. `margin` below raises the right character's logit to mimic a trained model.

# %%
def lm_logit_gradient(tokens=2048, vocab=96, margin=0.0, seed=0):
    """d(mean cross-entropy)/d(logits) for a batch of `tokens` predictions."""
    rng = np.random.default_rng(seed)
    logits = 0.02 * rng.normal(size=(tokens, vocab))
    targets = rng.integers(0, vocab, tokens)
    logits[np.arange(tokens), targets] += margin
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(tokens), targets] -= 1.0
    return (p / tokens).astype(np.float32)


def report_line(label, r):
    return (f"{label:<28} flushed to 0: {r['flushed_to_zero']:6.1%}   subnormal: "
            f"{r['subnormal']:6.1%}   overflow: {r['overflowed']:5.1%}   typical entry's "
            f"error: {r['median_relative_error']:.2g}")


for margin, what in ((0.0, "untrained"), (12.0, "confident")):
    g = lm_logit_gradient(margin=margin)
    print(f"{what} model: median |gradient| = {np.median(np.abs(g)):.2g}")
    print(report_line("  fp16, no scaling", P.underflow_report(g, "fp16", 1.0)))
    print(report_line("  fp16, loss scale 2^15", P.underflow_report(g, "fp16", 2.0 ** 15)))
    print(report_line("  bf16, no scaling", P.underflow_report(g, "bf16", 1.0)))

# %% [markdown]
# Unscaled, the untrained model's gradient is almost entirely subnormal (each entry keeps a
# few bits, an error of a few tenths of a percent), and the confident model's wrong-class
# entries are flushed to zero: those gradients are simply gone. bf16 has fp32's range, so
# nothing is flushed, only rounded.
#
# **Loss scaling** moves the whole gradient up into fp16's normal range. Multiply the loss by
# S before backward; by linearity every gradient in the backward pass is multiplied by S too;
# store them in fp16; divide by S in fp32 just before the optimizer step. A power of two as
# S keeps the multiplication and the division exact. The sweep shows the window: too small
# a scale leaves the gradient subnormal, too large a one overflows 65504.

# %%
g_untrained = lm_logit_gradient(margin=0.0)
g_confident = lm_logit_gradient(margin=12.0)
powers = np.arange(0, 45)
fig, ax = plt.subplots(figsize=(8, 3.4))
for g, label in ((g_untrained, "untrained"), (g_confident, "confident (margin 12)")):
    errors = [P.underflow_report(g, "fp16", 2.0 ** int(k))["median_relative_error"]
              for k in powers]
    errors = np.array([e if np.isfinite(e) else np.nan for e in errors])
    ax.semilogy(powers, errors, marker=".", label=label)
    first_overflow = min(int(k) for k, e in zip(powers, errors) if np.isnan(e))
    print(f"{label:<22} typical error at S=1: {errors[0]:.2g}, at S=2^15: {errors[15]:.2g}; "
          f"overflow from S=2^{first_overflow}")
ax.axvline(15, color="gray", ls=":")
ax.set_xlabel("log2 of the loss scale S")
ax.set_ylabel("typical entry's relative error")
ax.set_title("fp16 gradients: subnormal on the left, overflow (curve ends) on the right")
ax.legend()
plt.show()

# %% [markdown]
# Try it with the sliders: the histogram shows the scaled gradient's magnitudes against
# fp16's subnormal range (shaded) and its largest value; the label reads the report.

# %%
import io

import ipywidgets as widgets
from widgets._figures import PreviewVBox


class LossScaleExplorer:
    """Margin and log2(S) sliders over engine.precision.underflow_report."""

    def __init__(self):
        self.margin = widgets.FloatSlider(value=6.0, min=0.0, max=14.0, step=1.0,
                                          description="margin")
        self.log2_scale = widgets.IntSlider(value=0, min=0, max=44, description="log2 S")
        self.label = widgets.Label()
        self.plot = widgets.Output()
        self.fig = None
        for s in (self.margin, self.log2_scale):
            s.observe(self._update, names="value")
        self._update()
        # a saved notebook without the widget's state shows this picture of it instead
        self.ui = PreviewVBox([widgets.HBox([self.margin, self.log2_scale]), self.label,
                               self.plot], preview=lambda: self.png)

    def _update(self, change=None):
        g = lm_logit_gradient(margin=self.margin.value)
        scale = 2.0 ** self.log2_scale.value
        r = P.underflow_report(g, "fp16", scale)
        self.label.value = (f"flushed {r['flushed_to_zero']:.1%}, subnormal {r['subnormal']:.1%}, "
                            f"overflow {r['overflowed']:.2%}, typical error "
                            f"{r['median_relative_error']:.2g}")
        if self.fig is not None:
            plt.close(self.fig)
        self.fig, ax = plt.subplots(figsize=(7, 2.8))
        mags = np.abs(g[g != 0]).astype(np.float64) * scale
        ax.hist(np.log10(mags), bins=80, color="#4c72b0")
        f16 = P.FORMATS["fp16"]
        ax.axvspan(np.log10(f16.smallest_subnormal) - 3, np.log10(f16.smallest_normal),
                   color="#c44e52", alpha=0.15, label="subnormal (and 0 below)")
        ax.axvline(np.log10(f16.max), color="#c44e52", label="fp16 max 65504")
        ax.set_xlim(-14, 10)
        ax.set_xlabel("log10 |S x gradient|")
        ax.legend(loc="upper left", fontsize=8)
        self.plot.outputs = ()
        self.plot.append_display_data(self.fig)
        png = io.BytesIO()
        self.fig.savefig(png, format="png")
        self.png = png.getvalue()
        plt.close(self.fig)


explorer = LossScaleExplorer()
print(explorer.label.value)

# %%
# NBVAL_IGNORE_OUTPUT
explorer.ui

# %% [markdown]
# ## The dynamic loss scaler
#
# Which S? Too small wastes the range, too large overflows, and the right value drifts as
# training goes. The dynamic scaler searches for it continually:
#
# * start high (2^16 = 65536 is the usual default, PyTorch's `GradScaler` included; the
#   demos in this lesson use 2^15 and, on purpose, 2^30);
# * after backward, check the gradients. If any is inf or NaN, the step is **skipped** (its
#   gradients are garbage) and S is **halved**;
# * after `growth_interval` good steps in a row (PyTorch uses 2000), S is **doubled**, to
#   probe whether a larger scale now fits.
#
# A few skipped steps are the normal cost of the search; a run that skips often has a range
# problem the scaler cannot fix.
#
# **Unscale before clipping.** The gradients the backward produces are S times too large.
# Divide them by S *before* anything reads their size: gradient-norm clipping (a threshold of
# 1.0 applied to scaled gradients would clip every step, by a factor S too much) and the
# gradient norm you log (lesson 12). The order of a step is: backward on S × loss, check for
# inf/NaN, unscale, clip, optimizer step, update S.
#
# ## Exercise 09.3 · The scaler's rule
#
# Write `update_scale(scale, good_steps, finite, growth_interval)` returning
# `(new_scale, new_good_steps, apply_step)`. `good_steps` counts the finite steps since the
# scale last changed; `finite` says whether this step's gradients were all finite.

# %%
def update_scale(scale, good_steps, finite, growth_interval):
    """One step of dynamic loss scaling: (new_scale, new_good_steps, apply_step)."""
    ### BEGIN SOLUTION
    if not finite:
        return scale * 0.5, 0, False
    good_steps += 1
    if good_steps >= growth_interval:
        return scale * 2.0, 0, True
    return scale, good_steps, True
    ### END SOLUTION


# %%
# CHECK 09.3
lesson09.check_update_scale(update_scale)

# %% [markdown]
# `engine.precision.DynamicLossScaler` is this rule with the bookkeeping around it (the
# multiply, the unscale in fp32, the finite check). Here it trains the classifier in fp16
# with fp32 master weights, started on purpose from an absurd scale, 2^30, with a short
# growth interval of 25 so the search is visible.

# %%
policy = P.PrecisionPolicy("fp16", master_weights=True, loss_scale=2.0 ** 30,
                           growth_interval=25)
fp16_run = P.train_classifier(policy, problem, steps=300, lr=1.0)
fp32_run = P.train_classifier(P.POLICIES["fp32"], problem, steps=300, lr=1.0)
skipped_at = [step for step, applied in enumerate(fp16_run.applied) if not applied]
search = [step for step in skipped_at if step < 20]              # the way down from 2^30
probes = [step for step in skipped_at if step >= 20]             # later: a doubling overshot
def just_doubled(step, within=3):
    """Whether the scale doubled on one of the `within` steps up to `step`."""
    return any(fp16_run.scales[t] == 2 * fp16_run.scales[t - 1] for t in range(step - within + 1, step + 1))


after_doubling = all(just_doubled(step) for step in probes)
print(f"skipped on the way down from 2^{np.log2(fp16_run.scales[0]):.0f}: {len(search)} steps "
      f"(steps {search[0]}-{search[-1]}), scale then 2^{np.log2(fp16_run.scales[search[-1] + 1]):.0f}")
print(f"a few later skips (1 to 9): {0 < len(probes) < 10}; each within 3 steps of a doubling "
      f"of the scale: {after_doubling}")
print(f"loss after 300 steps: fp16 + scaler within 25% of fp32, a few steps behind: "
      f"{abs(fp16_run.losses[-1] - fp32_run.losses[-1]) < 0.25 * fp32_run.losses[-1]}")

# %%
# NBVAL_IGNORE_OUTPUT
# (exactly which late steps overflow depends on the last bits of fp32 products, so on the CPU)
print(f"skipped steps: {fp16_run.skipped}, at steps {skipped_at}")
print(f"loss after 300 steps: fp16 + scaler {fp16_run.losses[-1]:.4f}, "
      f"fp32 {fp32_run.losses[-1]:.4f}")

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.2))
ax1.semilogy(fp16_run.scales, drawstyle="steps-post")
ax1.plot(skipped_at, [fp16_run.scales[i] for i in skipped_at], "rx", label="skipped step")
ax1.set_xlabel("step"), ax1.set_ylabel("loss scale S"), ax1.legend()
ax2.semilogy(fp32_run.losses, label="fp32"), ax2.semilogy(fp16_run.losses, "--", label="fp16 + scaler")
ax2.set_xlabel("step"), ax2.set_ylabel("cross-entropy"), ax2.legend()
plt.show()

# %% [markdown]
# The first steps overflow and are skipped while S halves down from 2^30; then S settles in
# a sawtooth: every 25 good steps it doubles, and when that overflows it is halved back at
# the cost of one skipped step. The loss follows fp32, a few steps behind (each skipped step
# is a step not taken). bf16 needs none of this: it has fp32's exponent range, which is why
# it displaced fp16 for training.
#
# ## Is mixed precision faster here?
#
# On accelerators, 16-bit storage halves the bytes moved and 16-bit matrix units run several
# times faster than fp32 ones. On a CPU the answer depends on the instructions the chip has
# and on whether the library you call uses them. Measure ours: one training step of a wider
# version of the classifier in fp32 and in emulated bf16 mixed precision, and one matmul.

# %%
# NBVAL_IGNORE_OUTPUT
# (timings differ from run to run and machine to machine)
from engine.timing import fastest_seconds as best_time, fixed_threads

wide = P.make_classification(n=4096, d_in=256, d_hidden=512, classes=64)
with fixed_threads(1):   # one thread: a busy machine slows both alike
    t_fp32 = P.time_training_step(P.POLICIES["fp32"], wide, repeats=5)
    t_bf16 = P.time_training_step(P.POLICIES["bf16 + fp32 master"], wide, repeats=5)
print(f"training step: fp32 {t_fp32 * 1e3:.1f} ms, emulated bf16 mixed "
      f"{t_bf16 * 1e3:.1f} ms -> {t_bf16 / t_fp32:.1f}x the fp32 time")

A = rng.normal(size=(1024, 1024)).astype(np.float32)
B = rng.normal(size=(1024, 1024)).astype(np.float32)


with fixed_threads(1):
    t_mm = best_time(lambda: A @ B)
    t_mm_mixed = best_time(lambda: P.matmul_mixed(A, B, "bf16"))
    t_round = best_time(lambda: P.round_to_bf16(A))
print(f"1024x1024 matmul: fp32 {t_mm * 1e3:.1f} ms, bf16 storage emulated "
      f"{t_mm_mixed * 1e3:.1f} ms; rounding one 1024x1024 array {t_round * 1e3:.1f} ms")
print("this CPU's low-precision instruction flags:", P.cpu_flags_for_low_precision() or "none found")

# %% [markdown]
# Those times are one machine's, on one afternoon; a busy machine can even swap two close
# figures. What does not change from run to run is the work, and that is what the emulated
# matmul is built from: the very fp32 product, with a rounding pass over each input before
# it and one over the output after it. The next cell checks that bit for bit, so the extra
# passes are visible in the code itself, not only in the clock.

# %%
emulated = P.matmul_mixed(A, B, "bf16")
by_hand = P.round_to_bf16(P.round_to_bf16(A) @ P.round_to_bf16(B))
same_bits = np.array_equal(emulated, by_hand)
print("emulated bf16 matmul == round(round(A) @ round(B)), bit for bit:", same_bits)
assert same_bits, "the emulated bf16 matmul is the fp32 one plus three rounding passes"

# %% [markdown]
# The emulation cannot win: it runs the same fp32 arithmetic *plus* rounding passes (about
# ten elementwise integer operations per element) over inputs and outputs, and the master
# copy adds one more pass per parameter. It saves no memory either, since the values still
# sit in 4-byte float32 arrays. How much it loses depends on the share of elementwise work.
# A large matmul does O(n^3) arithmetic on O(n^2) numbers, so rounding its inputs and output
# hardly shows; a training step is full of elementwise-sized tensors (activations, their
# gradients, the ReLU mask, the update), and there the extra passes dominate. Emulation buys
# exact *numerics*, which is what this lesson needed, not speed.
#
# Would *real* bf16 be faster on this machine? Only with hardware support and a library that
# uses it: bf16 dot-product instructions (`avx512_bf16`) or matrix units (`amx_bf16`), which
# the flags line above lists if the CPU has them, and a matmul library built to use them.
# numpy has no bf16 type at all. If PyTorch happens to be installed (it is never required
# here), the next cell asks its bf16 matmul, which does use such instructions when present.

# %%
# NBVAL_IGNORE_OUTPUT
# (timings; and PyTorch may or may not be installed)
try:
    import torch
except ImportError:
    print("PyTorch is not installed: no native bf16 matmul to compare with (that is fine).")
else:
    ta, tb = torch.from_numpy(A), torch.from_numpy(B)
    ta16, tb16 = ta.bfloat16(), tb.bfloat16()
    t_t32 = best_time(lambda: ta @ tb)
    t_t16 = best_time(lambda: ta16 @ tb16)
    print(f"PyTorch 1024x1024 matmul: fp32 {t_t32 * 1e3:.1f} ms, bf16 "
          f"{t_t16 * 1e3:.1f} ms -> bf16 takes {t_t16 / t_t32:.2f}x the fp32 time")

# %% [markdown]
# On a CPU with bf16 instructions, a native bf16 matmul can beat fp32 (on the machine this
# course was written on, PyTorch's took about half the fp32 time). That speed lives inside
# one kernel of one library. Our engine, numpy and numba have no bf16 arithmetic, so for us
# "bf16" would mean converting to fp32 and back around every operation: the emulation's cost,
# never its gain. And for a small model the bandwidth argument is weak: its weights and
# activations largely fit in the caches. That is the honest CPU default:
# **fp32 throughout**, and the rest of this course trains in fp32.
#
# ## What you built, what it costs
#
# * `to_bf16`: float32 to bf16 on the bits, round to nearest with ties to even, NaN kept;
#   every bf16 rounding after exercise 09.1 ran it. Truncation would bias every sum; a tie
#   always rounded up would too.
# * `master_weight_step`: the optimizer updates an fp32 copy; the forward reads its bf16
#   rounding. Cost: 4 extra bytes per parameter. Without it, updates below half a bf16 step
#   (2e-3 for a weight of 1) vanish and training stalls.
# * `update_scale`: the dynamic loss scaler's rule. fp16 needs it because its smallest normal
#   is 6.1e-5 and a language model's gradients live below that; the cost is an occasional
#   skipped step. bf16 needs no scaler.
# * Accumulate in fp32: a bf16 running sum of 1000 ones stops at 256.
# * Measured on this CPU: emulated mixed precision is slower than fp32 (extra rounding
#   passes, no saving in bytes); native bf16 speed needs hardware instructions and a library
#   kernel that uses them, which our numpy engine does not have. fp32 stays our default.
