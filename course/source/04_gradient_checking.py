# %% [markdown]
# # 04 · Gradient checking
#
# **Goals.** By the end of this lesson you will have
# 1. built a gradient checker from three parts you write: the central difference of one
#    element, the relative and absolute error with a floor, and spot checks on random
#    elements;
# 2. swept the step ε from 1e-1 down to 1e-12 in float32 and float64, seen the U-shaped error
#    curve (truncation on the right, rounding on the left, a stable valley between) and
#    derived where its bottom lies;
# 3. seen three ways a correct gradient can *fail* a check: a kink (ReLU at 0), randomness
#    (dropout without a fixed seed) and low precision (float32), and written the fixes for
#    the first two;
# 4. checked the engine from local to global, one op, one layer, a whole network, with
#    `engine.gradcheck`, and written the walk that names the most local failing part of a
#    broken network.
#
# **Why check at all.** A backward rule with a wrong formula does not crash. It returns an
# array of the right shape, full of finite, plausible numbers, and training runs on, only
# worse. The one independent witness is the forward pass itself: nudge a parameter, rerun
# the forward, and see how the loss moved. That witness never reads the backward rule it is
# checking, which is exactly why we trust it.
#
# **Your pieces in the engine.** Fills: the gradient checker: one partial derivative (04.1,
# `numerical_partial`), the two errors (04.2, `gradient_errors`), random spot checks (04.3,
# `spot_check`); lesson 05 hunts broken backward rules with your `spot_check` (the engine's
# runs where yours is not saved, and the lesson says so). The fixes of 04.5
# (`away_from_kink`, `same_mask`) and the walk of 04.6 (`localize`) fill no slot. Runs:
# your lesson 03 rules (03.1 `matmul_vjp`, 03.2 `unbroadcast`) inside the tape near the
# end, checked by your `spot_check`. (The whole map: CONTRIBUTING.md, "Exercise <-> slot".)

# %%
from typing import NamedTuple

import numpy as np
import matplotlib.pyplot as plt

import engine
from engine import Tensor
import engine.functional as F
from coursework import lesson04
from engine.eps_sweep import finite_difference, predicted_best_eps, sweep_both
from widgets.eps_sweep import EpsSweep, plot_sweeps

np.set_printoptions(precision=4, suppress=True)
lesson04.name_unfinished_exercises()   # a cell that needs an unfinished exercise says which

# %% [markdown]
# ## The central difference, on the running example
#
# The `-4` worked example of lesson 02: one weight `w`, an input `x = 2`, a target `y = 6`,
# the prediction `u = w·x` and the loss `L = ½(u - y)²`. At `w = 2` the prediction is 4, the
# error `e = u - y = -2`, the loss 2, and backprop gives `dL/dw = e·x = -4`.
#
# The central difference asks the forward pass alone:
#
# $$\frac{\partial L}{\partial w} \approx \frac{L(w + \varepsilon) - L(w - \varepsilon)}{2\varepsilon}$$
#
# Two forward passes, one subtraction, one division. It uses no backward rule at all.

# %%
def running_loss(w, x=2.0, y=6.0):
    return 0.5 * (w * x - y) ** 2


eps = 1e-3
up, down = running_loss(2.0 + eps), running_loss(2.0 - eps)
print(f"L(w+eps) = {up:.6f}   L(w-eps) = {down:.6f}")
print(f"central difference: {(up - down) / (2 * eps):.6f}   backprop: {(2.0 * 2 - 6) * 2:.1f}")

# %% [markdown]
# Here the loss is a quadratic in `w`, and for a quadratic the central difference is exact
# whatever ε is: the curvature term cancels between the two sides (only rounding remains).
# Real losses are not quadratics; most of this lesson is about the error that is left.
#
# ## Exercise 04.1 · One element at a time
#
# Lesson 00 computed every partial derivative of a parameter vector. A checker for a tensor
# with a million elements cannot afford that; it checks a handful, so its atom is **one
# element**. Write `numerical_partial(f, x, index, eps)`: the central difference of the
# scalar function `f` along the single element `x[index]` (`index` is a tuple such as
# `(2, 5)`). Perturb a copy, or put the element back: the caller still needs `x` as it was.

# %%
def numerical_partial(f, x, index, eps=1e-6):
    """(f(x + eps*e_index) - f(x - eps*e_index)) / (2*eps), leaving x unchanged."""
    ### BEGIN SOLUTION
    shifted = x.copy()
    shifted[index] = x[index] + eps
    up = f(shifted)
    shifted[index] = x[index] - eps
    down = f(shifted)
    return (up - down) / (2 * eps)
    ### END SOLUTION

# %%
# CHECK 04.1
lesson04.check_numerical_partial(numerical_partial)

# %% [markdown]
# ## Comparing two gradients: relative error, with a floor, and absolute error
#
# The numerical value `n` and the backprop value `a` never agree exactly, so we need a
# measure of "close". The absolute difference `|a - n|` alone is not it: a difference of
# 1e-5 is nothing next to a gradient of 1e3, and everything next to a gradient of 1e-6.
# The **relative error** divides the difference by the size of the gradients. Which size?
# Three demands decide the denominator:
#
# 1. neither value is privileged (either may be the wrong one), so swapping `a` and `n` must
#    not change the error;
# 2. the error reads as the fraction of the gradient that is wrong, whatever its size: a
#    value 1% off gives about 0.01, a right gradient about 1e-8, and a gradient missing
#    entirely (0 where the other is not) exactly 1, all of it wrong;
# 3. gradients at or near zero give a finite number. Two exact zeros must not give 0/0 =
#    NaN, and a true gradient of 1e-14 against a numerical 0 must not give a scary
#    relative error for a difference no one could measure. A **floor** δ, a smallest
#    denominator, handles this: the denominator never goes below δ, and above δ the floor
#    changes nothing.
#
# Because of 3, a checker reports the absolute error `|a - n|` next to the relative one,
# and an element passes when **either** is small: `abs <= atol or rel <= rtol`.
#
# ## Exercise 04.2 · The two errors
#
# Write `gradient_errors(analytic, numeric, floor)` returning the pair `(relative, absolute)`,
# element by element. Choose the relative error's denominator by the three demands
# (`np.maximum` takes element-wise maxima); the check says which demand a denominator breaks.

# %%
def gradient_errors(analytic, numeric, floor=1e-10):
    """(relative error, absolute error) of two gradients, element-wise."""
    ### BEGIN SOLUTION
    absolute = np.abs(analytic - numeric)
    relative = absolute / np.maximum(np.maximum(np.abs(analytic), np.abs(numeric)), floor)
    return relative, absolute
    ### END SOLUTION

# %%
# CHECK 04.2
lesson04.check_gradient_errors(gradient_errors)

# %% [markdown]
# The same absolute difference, 1e-5, at three scales of gradient, and an exact zero against
# a rounding-sized 1e-13:

# %%
a = np.array([1e3, 1.0, 1e-6, 0.0])
n = a + np.array([1e-5, 1e-5, 1e-5, 1e-13])
rel, ab = gradient_errors(a, n)
for ai, ri, bi in zip(a, rel, ab):
    print(f"gradient {ai:8.0e}: absolute error {bi:.0e}, relative error {ri:.1e}")

# %% [markdown]
# The first is fine (rel 1e-8), the second is borderline (rel 1e-5: fine for a float32
# check, too loose for float64), the third is a real disagreement (the numerical gradient is
# eleven times the analytic one), and the last is an exact zero against rounding noise: its
# relative error, 1e-3 even with the floor, would fail any sensible `rtol`; its absolute
# error, 1e-13, says "harmless".
#
# ## Exercise 04.3 · Spot checks on random elements
#
# Checking every element of a weight matrix costs two forward passes each. A spot check
# draws a few elements **at random, from a seed**: at random, because a bug often lives in
# a corner you would not have picked (the last column, a broadcast row); from a seed, so that
# the same check rerun checks the same elements and a failure can be reproduced.
#
# Write `spot_check(f, x, analytic_grad, n_checks, eps, rtol, atol, seed)`: draw `n_checks`
# distinct elements with `np.random.default_rng(seed)` (`rng.choice(x.size, n, replace=False)`
# then `np.unravel_index`), and for each return a `Spot` row: the index (a tuple of ints),
# the analytic and numerical values, their relative and absolute errors (your
# `gradient_errors`) and whether the element passes (`abs <= atol or rel <= rtol`).

# %%
class Spot(NamedTuple):
    index: tuple
    analytic: float
    numeric: float
    rel_err: float
    abs_err: float
    ok: bool


def spot_check(f, x, analytic_grad, n_checks=6, eps=1e-6, rtol=1e-6, atol=1e-8, seed=0):
    """Compare analytic_grad with central differences of f at n_checks random elements."""
    ### BEGIN SOLUTION
    rng = np.random.default_rng(seed)
    rows = []
    for flat in rng.choice(x.size, size=min(n_checks, x.size), replace=False):
        index = tuple(int(i) for i in np.unravel_index(flat, x.shape))
        a = float(analytic_grad[index])
        n = float(numerical_partial(f, x, index, eps))
        rel, ab = (float(v) for v in gradient_errors(np.array(a), np.array(n)))
        rows.append(Spot(index, a, n, rel, ab, ab <= atol or rel <= rtol))
    return rows
    ### END SOLUTION

# %%
# CHECK 04.3
lesson04.check_spot_check(spot_check)

# %% [markdown]
# A helper prints the rows (errors below 1e-7 are rounding noise, whose last digits differ
# from one CPU to another, so they print as `<1e-07`). Try it on a function of a 20 x 30
# matrix whose gradient we know by hand, `f(X) = Σ tanh(X ⊙ C)`, so
# `∂f/∂X = C ⊙ (1 - tanh²(X ⊙ C))`. Then plant a bug: a "backward rule" that forgets the
# factor `C` in its last column only.

# %%
def small(v, below=1e-7):
    """An error for printing: rounding noise (machine-dependent) shows as '<1e-07'."""
    return f"<{below:.0e}" if v < below else f"{v:.1e}"


def show(rows):
    print(f"{'index':>10} {'analytic':>12} {'numeric':>12} {'rel err':>8} {'abs err':>8}  ok")
    for r in rows:
        print(f"{str(r.index):>10} {r.analytic:12.6f} {r.numeric:12.6f} "
              f"{small(r.rel_err):>8} {small(r.abs_err):>8}  {'yes' if r.ok else 'NO'}")


rng = np.random.default_rng(42)
X = rng.normal(size=(20, 30))
C = rng.uniform(0.5, 2.0, size=(20, 30))
f_tanh = lambda M: float(np.sum(np.tanh(M * C)))
grad_right = C * (1 - np.tanh(X * C) ** 2)
grad_buggy = grad_right.copy()
grad_buggy[:, -1] = 1 - np.tanh(X[:, -1] * C[:, -1]) ** 2   # forgot C in the last column

show(spot_check(f_tanh, X, grad_right, n_checks=5, seed=0))

# %% [markdown]
# With a bug in 20 of 600 elements, five random picks will usually miss it. Rerunning
# with more seeds (or more checks) is what catches it; the seed tells you which elements were
# covered, and the failing row names the exact element to look at.

# %%
for seed in range(40):
    rows = spot_check(f_tanh, X, grad_buggy, n_checks=5, seed=seed)
    bad = [r for r in rows if not r.ok]
    if bad:
        print(f"seed {seed}: {len(bad)} of {len(rows)} checks fail")
        show(bad)
        break

# %% [markdown]
# ## The step ε: truncation against rounding
#
# Which ε should a checker use? Not "as small as possible". Two errors pull in opposite
# directions:
#
# - **truncation** (large ε): the difference quotient is the *average* slope over
#   `[x - ε, x + ε]`, not the slope at `x`. By Taylor's theorem the central difference is off
#   by about `ε²·|f'''|/6`, falling fast as ε shrinks (a forward difference is off by
#   `ε·|f''|/2`: one power of ε worse).
# - **rounding** (small ε): `f(x+ε)` and `f(x-ε)` are each rounded to the working precision,
#   an error of about `u·|f|`, where the *unit roundoff* `u` is 2⁻²⁴ ≈ 6e-8 for float32 and
#   2⁻⁵³ ≈ 1.1e-16 for float64. Subtracting two nearly equal numbers keeps that error while
#   the difference itself shrinks; dividing by 2ε blows it up: about `u·|f|/ε`.
#
# Add them and the total error is U-shaped in ε. `eps_sweep(f, x, grad, eps_values, dtype)`
# (in `engine.eps_sweep`, a pure function the widget below also calls) measures the
# curve: it computes every element's central difference in the given precision at each ε and
# records the worst relative error against the exact gradient. The function is
# `f(x) = Σ sin(x)·exp(x/2)` at six points in [-1, 1].

# %%
sweeps = sweep_both()
fig, ax = plt.subplots(figsize=(7, 4))
plot_sweeps(sweeps, ax=ax)
for name, s in sweeps.items():
    ax.axvline(predicted_best_eps(name), color="0.5", lw=0.8, ls=":")
ax.plot([], [], color="0.5", lw=0.8, ls=":", label="eps* from theory (below)")
ax.legend(loc="lower left", fontsize=8)
plt.show()

# %%
for name, s in sweeps.items():
    theory = predicted_best_eps(name)
    print(f"{name}: error at eps=1e-1 {s.error_at(1e-1):.2e} (truncation); valley bottom "
          f"within a factor 10 of the theory's {theory:.0e}: {theory / 10 <= s.best_eps <= theory * 10}; "
          f"best error below {'1e-9' if name == 'float64' else '1e-3'}: "
          f"{s.best_error < (1e-9 if name == 'float64' else 1e-3)}")

# %% [markdown]
# Read the plot from the right. Both precisions start on the same straight line of slope 2:
# truncation error, the same in both, falling like ε². Then each curve hits its rounding
# floor and turns back up, float32 about three decades of ε earlier than float64, because its
# `u` is 2²⁹ times larger. From about 1e-7 leftwards the float32 curve sits at 1: the step
# is smaller than half the spacing of float32 numbers near `x`, so `x + ε == x`, the two
# forward passes are identical and the numerical gradient is 0.
#
# Between the two arms lies the **stable valley**: a range of ε where the numerical gradient
# barely changes. That is what to look for in practice: if the numerical gradient is stable
# over several ε and still disagrees with backprop, suspect the backward rule; if it swings
# with ε, suspect precision, randomness or a kink.
#
# ## The sweep, interactively
#
# Drag ε and read the error it gives in each precision, and which error dominates there.
# Switch to forward differences and watch the right arm's slope drop from 2 to 1 and the
# valley rise; change the function, or the range of ε plotted.
#
# The widget needs none of your exercises: if *Run All* stopped at a check above, click into
# the cell below and run it on its own.

# %%
# NBVAL_IGNORE_OUTPUT
sweep_widget = EpsSweep(eps=1e-6)
sweep_widget.ui

# %% [markdown]
# ## Exercise 04.4 · Where is the bottom of the valley?
#
# Model the total error of a central difference, for a function whose value and derivatives
# are of order one, as `E(ε) = ε²/6 + u/ε`. Write `best_step(u)`: the ε that minimises `E`
# (set `dE/dε = 0` and solve).

# %%
def best_step(u):
    """The eps minimising eps**2/6 + u/eps."""
    ### BEGIN SOLUTION
    return (3 * u) ** (1 / 3)
    ### END SOLUTION

# %%
# CHECK 04.4
lesson04.check_best_step(best_step)

# %% [markdown]
# So about 7e-6 in float64 and 6e-3 in float32, where the plot put them. The error at the
# bottom is `E(ε*) = ½(3u)^(2/3)`: about 2e-11 in float64 and 2e-5 in float32 (the stars on
# the plot sit a few times higher, because a real evaluation of `f` rounds more than once).
# A float32 check can never be tighter than about 1e-4 relative, which is why **gradient
# checks run in float64**, whatever precision training uses: the check is about the logic of
# the backward rule, not about the training precision.
#
# The default `eps=1e-6` of this lesson's checker sits inside the float64 valley, with room
# to spare on both sides for functions whose scale is not one.
#
# ## Kinks: ReLU at and away from 0
#
# ReLU has no derivative at 0: the slope is 0 on the left and 1 on the right. The engine
# defines the gradient at 0 as 0 (a *subgradient*, the same choice as PyTorch). The central
# difference straddles the kink and sees the average, 1/2. Neither is wrong; they are
# different conventions at a point where the classical derivative does not exist.
# And close to 0, within ε of the kink, the numerical slope is a blend of the two sides.
# (This section and the next take their central differences from the engine,
# `finite_difference(f, x, eps)`: your 04.1 for every element at once.)

# %%
def relu_sum(values):
    return float(np.sum(np.maximum(values, 0.0)))


points = np.array([-0.5, -3e-7, 0.0, 3e-7, 0.5])
t = Tensor(points.copy(), requires_grad=True)
F.relu(t).sum().backward()
num = finite_difference(relu_sum, points, eps=1e-6)
print(f"{'x':>8} {'engine grad':>12} {'central diff':>13}")
for i, p in enumerate(points):
    print(f"{p:8.1e} {t.grad[i]:12.3f} {num[i]:13.3f}")

# %% [markdown]
# Away from the kink (|x| = 0.5) both agree. At 0 the check reports a relative error of 1;
# at ±3e-7, closer to the kink than ε, the numerical value is 0.35 or 0.65. The cure is to
# pick check points away from kinks (at least a few ε), and to cover **both branches**:
# check ReLU at a positive and at a negative input, separately.

# %%
rng = np.random.default_rng(1)
z = rng.normal(size=(4, 6))
z[np.abs(z) < 1e-3] = 1e-3            # keep every point a safe distance from the kink
print("negative inputs:", int((z < 0).sum()), " positive inputs:", int((z > 0).sum()))
report = engine.gradcheck(lambda v: F.relu(v), [z], raise_on_failure=False)
print(f"gradcheck of relu on both branches: {'passed' if report.ok else 'FAILED'}, "
      f"{report.checked} elements")

# %% [markdown]
# ## Determinism: dropout needs its seed
#
# A gradient check compares two forward passes. If anything random differs between them,
# the difference quotient measures the randomness, not the slope. Dropout draws a fresh
# mask on every forward pass in training. For the check, fix the seed so both passes drop
# the same elements.

# %%
rng = np.random.default_rng(2)
h = rng.normal(size=(3, 5))
weights = rng.normal(size=(3, 5))


def dropout_loss(values, seed):
    out = F.dropout(Tensor(values), p=0.5, seed=seed)
    return float((out * Tensor(weights)).sum().data)


fresh_seed = iter(range(1000, 10_000))          # a new mask per call, as in training
ht = Tensor(h.copy(), requires_grad=True)
(F.dropout(ht, p=0.5, seed=7) * Tensor(weights)).sum().backward()
seeded = finite_difference(lambda v: dropout_loss(v, seed=7), h, eps=1e-6)[0, 1]
unseeded = finite_difference(lambda v: dropout_loss(v, seed=next(fresh_seed)), h, eps=1e-6)[0, 1]
print(f"engine gradient at (0, 1):              {ht.grad[0, 1]: .6f}")
print(f"central difference, same seed:          {seeded: .6f}")
print(f"central difference, a fresh mask twice: {unseeded: .6e}")

# %% [markdown]
# With the same seed, both forward passes see the same mask and the check passes. With a
# fresh mask each time, the "numerical gradient" is the change of the *mask* divided by
# 2e-6: enormous and meaningless. The same holds for anything else that changes between the
# two forward passes: shuffled data, running statistics, a counter.
#
# ## Exercise 04.5 · A fair check for a correct gradient
#
# Both failures above are failures of the *check*, not of the backward rule, and each has a
# fix that a checker can apply before it runs. Write both:
#
# - `away_from_kink(x, eps)`: a copy of `x` in which every element closer than `10*eps` to
#   ReLU's kink at 0 is moved out to distance `10*eps`, on its own side (an exact 0 goes to
#   `+10*eps`); the other elements stay as they are. Farther than ε, the two nudged points
#   `x ± ε` lie on the same side of the kink; and keeping the sides keeps both branches
#   covered.
# - `same_mask(loss, seed)`: training code rarely hands each layer a seed. It keeps a random
#   generator, and each dropout layer draws its mask from it, as `training_loss(values, rng)`
#   below does. Return the function `f(values)` a checker can call: every call must see the
#   same mask, and it must be the mask of the backward pass under check, the one a generator
#   made from `seed` draws first.

# %%
def training_loss(values, rng):
    """The dropout loss as a training step runs it: the layer draws its mask from `rng`."""
    return dropout_loss(values, seed=int(rng.integers(2 ** 31)))


def away_from_kink(x, eps=1e-6):
    """A copy of x with every element closer than 10*eps to 0 moved out to +-10*eps, on its
    own side (0 to +10*eps)."""
    ### BEGIN SOLUTION
    gap = 10 * eps
    safe = x.copy()
    near = np.abs(x) < gap
    safe[near] = np.where(x[near] < 0, -gap, gap)
    return safe
    ### END SOLUTION


def same_mask(loss, seed):
    """f(values) for a checker: loss(values, rng), every call with the mask that a generator
    made from `seed` draws first."""
    ### BEGIN SOLUTION
    return lambda values: loss(values, np.random.default_rng(seed))
    ### END SOLUTION

# %%
# CHECK 04.5
lesson04.check_fair_checks(away_from_kink, same_mask)

# %% [markdown]
# Your `spot_check` on both, before and after the fix. The ReLU points are those of the kink
# section, with the analytic gradient from the engine; the dropout check compares the
# engine's gradient for the mask of seed 7's generator with central differences of the loss
# through one generator made once (the usual mistake: each call advances it) and through
# `same_mask`.

# %%
def engine_relu_grad(values):
    t = Tensor(values.copy(), requires_grad=True)
    F.relu(t).sum().backward()
    return t.grad


for label, pts in (("as given", points), ("away_from_kink", away_from_kink(points))):
    rows = spot_check(relu_sum, pts, engine_relu_grad(pts), n_checks=pts.size)
    print(f"relu, points {label:15}: {sum(r.ok for r in rows)} of {len(rows)} elements pass")

ht = Tensor(h.copy(), requires_grad=True)
mask_seed = int(np.random.default_rng(7).integers(2 ** 31))   # what the generator draws first
(F.dropout(ht, p=0.5, seed=mask_seed) * Tensor(weights)).sum().backward()
made_once = np.random.default_rng(7)
for label, f in (("one generator, made once", lambda v: training_loss(v, made_once)),
                 ("same_mask(training_loss, 7)", same_mask(training_loss, 7))):
    rows = spot_check(f, h, ht.grad, n_checks=h.size)
    print(f"dropout, {label:27}: {sum(r.ok for r in rows)} of {len(rows)} elements pass")

# %% [markdown]
# The two unfair checks fail elements whose gradient is right; after the fixes every element
# passes, and a failure left would point at the backward rule itself.
#
# ## From local to global: one op, one layer, the network
#
# When a whole network fails its check, the culprit could be any op, any broadcast, any
# branch. Check in order, so the first failure points at its cause:
#
# 1. each op on its own;
# 2. a layer (a few ops together);
# 3. a small end-to-end network;
# 4. spot checks at other elements and other inputs.
#
# `engine.gradcheck(fn, inputs)` is the checker of this lesson, built into the engine: it runs
# `fn` on tensors made from the input arrays, reduces a non-scalar output to one number with
# fixed random weights (so every output element matters), backpropagates, and compares every
# input element (or `samples=k` random ones) with central differences in float64, using the
# relative error with a floor and the absolute error. It returns a report naming the worst
# element, or raises.

# %%
rng = np.random.default_rng(3)


def verdict(report):
    if report.ok:
        return f"passed ({report.checked} elements)"
    return (f"FAILED at {report.worst_name}{list(report.worst_index)}: "
            f"relative error {report.rel_error:.2g}")


ops = {
    "gelu": (F.gelu, [rng.normal(size=(3, 4))]),
    "softmax": (F.softmax, [rng.normal(size=(3, 5))]),
    "matmul": (lambda a, b: a @ b, [rng.normal(size=(3, 4)), rng.normal(size=(4, 2))]),
    "layer_norm": (lambda a, w, b: F.layer_norm(a, w, b, 1e-5),
                   [rng.normal(size=(3, 6)), rng.normal(size=6), rng.normal(size=6)]),
    "add, broadcast": (lambda a, b: a + b, [rng.normal(size=(3, 4)), rng.normal(size=4)]),
}
print("1. one op at a time")
for name, (fn, inputs) in ops.items():
    print(f"   {name:15} {verdict(engine.gradcheck(fn, inputs, raise_on_failure=False))}")

# %%
x_batch = rng.normal(size=(4, 8))
W1, b1 = rng.normal(size=(8, 16)) / np.sqrt(8), rng.normal(size=16)
gamma, beta = 1 + 0.1 * rng.normal(size=16), 0.1 * rng.normal(size=16)
W2, b2 = rng.normal(size=(16, 5)) / 4, rng.normal(size=5)
targets = np.array([0, 3, 1, 4])


def layer(x, W, b, g, bt):
    return F.layer_norm(F.gelu(x @ W + b), g, bt, 1e-5)


def network(x, W1, b1, g, bt, W2, b2):
    return F.cross_entropy(layer(x, W1, b1, g, bt) @ W2 + b2, targets)


one_layer = engine.gradcheck(layer, [x_batch, W1, b1, gamma, beta], eps=1e-5,
                             raise_on_failure=False)
whole = engine.gradcheck(network, [x_batch, W1, b1, gamma, beta, W2, b2], eps=1e-5,
                         raise_on_failure=False)
print("2. one layer, layer_norm(gelu(x @ W + b)):           ", verdict(one_layer))
print("3. the network, cross_entropy(layer(x) @ W2 + b2):  ", verdict(whole))

# %% [markdown]
# Why `eps=1e-5` for the layer and the network? Their outputs are sums of many terms, and
# some gradient elements are small (a few 1e-4). With the default 1e-6, rounding noise of
# about `u·|L|/ε ≈ 2e-10` is then a relative error near 1e-6, right at the tolerance: the
# left arm of the sweep. One decade larger, the check sits back in the valley. For a real
# model, `samples=k` checks `k` random elements of each input instead of all of them: the
# spot check of exercise 04.3.
#
# Finally, your own checker on the same network: backprop once through the engine for the
# analytic gradient of `W1`, then spot-check it with central differences of the loss, seen as
# a plain function of `W1`'s array.

# %%
params = [Tensor(a, requires_grad=True) for a in (x_batch, W1, b1, gamma, beta, W2, b2)]
network(*params).backward()


def loss_of_W1(array):
    with engine.no_grad():
        return float(network(x_batch, Tensor(array), b1, gamma, beta, W2, b2).data)


show(spot_check(loss_of_W1, W1, params[1].grad, n_checks=6, seed=0))

# %% [markdown]
# ## Exercise 04.6 · Which part is broken?
#
# The order pays off when something fails. `lesson04.network_parts()` is another small
# network, taken apart: a dict `{name: Part}`, each `Part(level, fn, inputs)` a piece of
# code to check with `engine.gradcheck(part.fn, part.inputs, ...)`, its `level` one of
# `"op"`, `"layer"`, `"network"`. Two of its ops, `softplus` and `add_bias`, are
# `engine.rules.Op` subclasses written for it, as a new op would be, and one backward rule is
# broken. The dict lists the network first, the way one reads a model top-down.
#
# Write `localize(parts)`: check the parts from local to global (every op, then every layer,
# then the network; within a level, in the dict's order) and return the name of the first
# that fails, or `None` when every check passes. Use `engine.gradcheck` with `eps=1e-5`, as
# for the layer above, and `raise_on_failure=False`: a walk that stops at the first exception
# cannot say which part failed first in this order. The check also hands your function
# variants of the network with the bug elsewhere, and without one.

# %%
parts = lesson04.network_parts()
for name, part in parts.items():
    print(f"{name:14} {part}")


# %%
def localize(parts):
    """The name of the most local part whose gradient check fails (ops, then layers, then
    the network), or None if every part passes."""
    ### BEGIN SOLUTION
    for level in ("op", "layer", "network"):
        for name, part in parts.items():
            if part.level != level:
                continue
            report = engine.gradcheck(part.fn, part.inputs, eps=1e-5, raise_on_failure=False)
            if not report.ok:
                return name
    return None
    ### END SOLUTION

# %%
# CHECK 04.6
lesson04.check_localize(localize)

# %% [markdown]
# The verdict of every part of the lesson's network, in the order the walk takes them, and
# what your `localize` names:

# %%
for level in lesson04.LEVELS:
    for name, part in parts.items():
        if part.level == level:
            print(f"   {level:8} {name:14} {verdict(lesson04.check_part(part))}")
print("most local failure, by your localize:", localize(parts))

# %% [markdown]
# Three checks fail, and only one of them says where to look. The network and the `hidden`
# layer fail because `softplus` does: they contain it. Read top-down, the first failure is
# the network's, which only says that something, somewhere, is wrong. Read from the ops out,
# the first failure is the op, and the bug is in its `vjp`.
#
# When every op passes and a layer fails, as in one of the check's variants, the bug lies in
# what the layer adds to its ops. There, `add_bias` takes one row of the upstream gradient
# where it should sum over the batch; its own check ran on a single row, where the two agree,
# and only the layer's batch of four rows shows the difference. The layer's failure points at
# the new thing it does (a bias broadcast over a batch), and step 4, checks at other inputs,
# pins it on the op.

# %% [markdown]
# ## Your lesson 03 rules inside the tape
#
# The tape's matmul and add run `vjp` rules from `engine/rules.py`. In lesson 03 you wrote
# two of them: `matmul_vjp` and `unbroadcast` (the backward of a broadcast add). Saved as
# pieces, they can take the engine's place: `pieces.tape_rules()` checks each one in its
# slot, then, inside the `with` block, the tape calls yours (`engine.rules.override_vjp`).
# The same network again, and your `spot_check` on the gradient your rules produced. (A rule
# you have not saved, or one that fails its slot, leaves the engine's in place; the lines
# below say which ran.)

# %%
# NBVAL_IGNORE_OUTPUT
from coursework import pieces

with pieces.tape_rules() as tape:
    params = [Tensor(a, requires_grad=True) for a in (x_batch, W1, b1, gamma, beta, W2, b2)]
    network(*params).backward()
for line in tape.report():
    print(line)
rows = spot_check(loss_of_W1, W1, params[1].grad, n_checks=6, seed=0)
print("your spot_check on the gradient of W1:",
      "every element passes" if all(r.ok for r in rows) else "an element FAILS")
assert all(r.ok for r in rows)

# %% [markdown]
# ## What you built, and what it costs
#
# - `numerical_partial`: the central difference of one element, two forward passes, error
#   `O(ε²)` from truncation plus `O(u/ε)` from rounding.
# - `gradient_errors`: relative error with a floor, and absolute error alongside; an element
#   passes when either is within tolerance.
# - `spot_check`: seeded random elements, so a check is cheap (2 forward passes per element,
#   not per parameter) and reproducible.
# - `best_step`: ε* = (3u)^(1/3), about 7e-6 in float64; the reason checks run in float64.
# - `away_from_kink` and `same_mask`: a fair check for a correct gradient, with every point
#   farther than ε from a kink (on its own side) and one mask for every forward pass.
# - `localize`: ops, then layers, then the network; the first failure in that order names
#   the op to fix, or the layer whose composition hides the bug.
#
# A check of `k` elements costs `2k` forward passes, whatever the model's size, which is why
# it is a development tool and not a training step. And it is a *sample*: passing spot checks
# show the gradient is right at those elements, inputs and points, not everywhere. Cover both
# branches of every kink, fix every seed, and check from one op outwards.
#
# Lesson 05 puts the checker to work: a set of ops with planted bugs, and the other ways a
# backward pass goes wrong (graphs cut, saved tensors overwritten, gradients never zeroed,
# NaNs), each made to happen and then found.
