# %% [markdown]
# # 00 · Why backprop
#
# **Goals.** By the end of this lesson you will have
# 1. written a gradient by *finite differences*: nudge one parameter, rerun the network;
# 2. run the same network's gradient by *reverse mode* (backprop), written out in numpy;
# 3. predicted what each costs in forward passes, then counted and measured both as the
#    parameter count P grows from about 10 to 10 000, and seen one grow like P while the
#    other stays at "a few forward passes";
# 4. done the arithmetic that rules finite differences out for real models:
#    7 billion parameters at 0.1 s per forward pass.
#
# Every later lesson is about making the second method cheap in *memory* and *time*. This
# one is about why there is no way around it.
#
# **How this course works.** Each lesson has exercises: a function with
# `raise NotImplementedError()` where your code goes, followed by a check cell starting with
# `# CHECK`. Run the check; it says what is wrong and gives a hint, or prints `passed`.
# From a terminal, `pytest --nbval course/00_why_backprop.ipynb` runs the whole notebook and
# fails until every exercise is done.
#
# **Your pieces in the engine.** Fills: the finite-difference gradient, the core of a
# gradient checker (00.1, saved as the piece `central_difference_gradient`; lesson 01 runs
# it to check the gradient you derive there by hand). Runs: no earlier pieces (this is the
# first lesson). (The whole map: CONTRIBUTING.md, "Exercise <-> slot".)

# %%
import numpy as np
import matplotlib.pyplot as plt
from coursework import lesson00

lesson00.name_unfinished_exercises()   # a cell that needs an unfinished exercise says which

np.set_printoptions(precision=4, suppress=True)

# %% [markdown]
# ## A small network with all its parameters in one vector
#
# A two-layer perceptron, `y = W2 · tanh(W1 x + b1) + b2`, with a mean-squared-error loss
# on a fixed batch of 64 examples. To make "the derivative with respect to every parameter"
# concrete, all parameters live in a single flat vector `theta`; `unpack` gives views of
# the four pieces. With 8 inputs, `hidden` units and one output the network has
# P = 8·hidden + hidden + hidden + 1 = 10·hidden + 1 parameters.

# %%
N_IN, BATCH = 8, 64


def make_problem(hidden, seed=0):
    """A random network of the given width, a batch of inputs and targets."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(0, 1 / np.sqrt(N_IN), size=10 * hidden + 1)
    x = rng.normal(size=(BATCH, N_IN))
    y = np.sin(x.sum(axis=1, keepdims=True))
    return theta, x, y


def unpack(theta, hidden):
    """Views (not copies) of W1, b1, W2, b2 inside the flat parameter vector."""
    i = 0
    W1 = theta[i:i + N_IN * hidden].reshape(N_IN, hidden); i += N_IN * hidden
    b1 = theta[i:i + hidden]; i += hidden
    W2 = theta[i:i + hidden].reshape(hidden, 1); i += hidden
    b2 = theta[i:i + 1]
    return W1, b1, W2, b2


def loss_fn(theta, x, y, hidden):
    """One forward pass: the mean squared error of the network on the batch."""
    W1, b1, W2, b2 = unpack(theta, hidden)
    h = np.tanh(x @ W1 + b1)
    pred = h @ W2 + b2
    return float(np.mean((pred - y) ** 2))


theta, x, y = make_problem(hidden=10)
print("parameters:", theta.size)
print("loss:", round(loss_fn(theta, x, y, 10), 6))

# %% [markdown]
# ## Exercise 00.1 · The gradient by finite differences
#
# The derivative of the loss with respect to parameter i is the slope of the loss when only
# `theta[i]` moves. The *central difference*
#
# $$\frac{\partial L}{\partial \theta_i} \approx \frac{L(\theta + \varepsilon e_i) - L(\theta - \varepsilon e_i)}{2\varepsilon}$$
#
# has an error that shrinks like ε² (the forward difference, with `L(θ)` in place of
# `L(θ - εe_i)` and ε in the denominator, only like ε). Write `central_difference_gradient`:
# for every parameter, evaluate the loss once with it nudged up and once nudged down. That is
# **two forward passes per parameter**. Leave `theta` as you found it.

# %%
def central_difference_gradient(loss, theta, eps=1e-6):
    """Gradient of loss(theta) -> float by central differences, one parameter at a time."""
    ### BEGIN SOLUTION
    grad = np.empty_like(theta)
    nudged = theta.copy()
    for i in range(theta.size):
        nudged[i] = theta[i] + eps
        up = loss(nudged)
        nudged[i] = theta[i] - eps
        down = loss(nudged)
        nudged[i] = theta[i]
        grad[i] = (up - down) / (2 * eps)
    return grad
    ### END SOLUTION

# %%
# CHECK 00.1
from coursework import lesson00
lesson00.check_central_difference(central_difference_gradient)

# %% [markdown]
# ## The same gradient by reverse mode
#
# Backprop runs the network forward once, **keeping** the intermediate values (`a`, `h`,
# `pred`), then walks backwards, each step turning "how the loss changes with my output" into
# "how it changes with my inputs and my weights". Read it line by line; lesson 01 does the
# same by hand on scalars, and lesson 03 explains why every weight gradient is a matrix
# product.

# %%
def backprop_gradient(theta, x, y, hidden):
    """Loss gradient for every parameter: one forward pass plus one backward pass."""
    W1, b1, W2, b2 = unpack(theta, hidden)
    # forward, keeping what the backward pass will need
    a = x @ W1 + b1
    h = np.tanh(a)
    pred = h @ W2 + b2
    # backward: from the loss towards the inputs
    d_pred = 2 * (pred - y) / pred.size      # d mean((pred - y)^2) / d pred
    d_W2 = h.T @ d_pred                      # needs h, saved from the forward pass
    d_b2 = d_pred.sum(axis=0)
    d_h = d_pred @ W2.T
    d_a = d_h * (1 - h**2)                   # tanh' = 1 - tanh^2: reuses h again
    d_W1 = x.T @ d_a                         # needs the input x
    d_b1 = d_a.sum(axis=0)
    return np.concatenate([d_W1.ravel(), d_b1, d_W2.ravel(), d_b2])


g_fd = central_difference_gradient(lambda t: loss_fn(t, x, y, 10), theta)
g_bp = backprop_gradient(theta, x, y, 10)
rel = np.max(np.abs(g_fd - g_bp) / np.maximum(np.abs(g_bp), 1e-8))
print(f"{theta.size} parameters; largest relative difference below 1e-6: {rel < 1e-6}")
print("first five entries, both ways:")
print(g_fd[:5])
print(g_bp[:5])

# %% [markdown]
# Both methods give the same numbers (to about 8 digits, the precision finite differences
# can reach in float64; lesson 04 is about exactly that). The difference is what they cost.
#
# ## Exercise 00.2 · Predict the cost of one gradient
#
# Before counting or timing anything, predict. Write `step_seconds(n_params,
# seconds_per_forward)` returning the pair `(finite_difference_seconds, backprop_seconds)`
# that one gradient costs, for a network of `n_params` parameters whose forward pass takes
# `seconds_per_forward`. Work both out from code you have read:
# - finite differences: how many times does your `central_difference_gradient` call the
#   loss?
# - backprop: `backprop_gradient` runs the forward pass once, then the backward pass. Price
#   the backward pass in forward passes by its matrix products, which are most of the work
#   (the elementwise steps are cheap next to them). In the forward pass a layer makes one
#   product, its input times its weight. On the way back, a layer in the middle of a deep
#   network owes two gradients: its weight's, for the optimizer, and its input's, for the
#   layer below. Find the two products that do this for `W2` in `backprop_gradient` and
#   compare their sizes with the forward product `h @ W2`.
#
# The check compares your prediction with the rule; the cells after it count and time both
# methods against your prediction.

# %%
def step_seconds(n_params, seconds_per_forward):
    """(finite-difference seconds, backprop seconds) for one gradient."""
    ### BEGIN SOLUTION
    return 2 * n_params * seconds_per_forward, 3 * seconds_per_forward
    ### END SOLUTION

# %%
# CHECK 00.2
lesson00.check_step_seconds(step_seconds)

# %% [markdown]
# The rule: finite differences make **two forward passes per parameter**; backprop makes
# **one forward pass plus a backward pass worth about two**, three in all. `d_W2 = h.T @
# d_pred` and `d_h = d_pred @ W2.T` each multiply matrices of the same sizes as `h @ W2`, so
# each costs what the forward product costs; every layer but the first does both (the first
# needs no gradient for its input `x`, which is data). Lessons 03 and 07 come back to this
# "2x".
#
# ## Counting forward passes
#
# Wrap the loss in a counter and ask your `central_difference_gradient` for one gradient.
# Counting needs no big network: the count follows from the loop, so we count on small ones
# and compare with your prediction there (at one second per forward pass, `step_seconds`
# returns forward passes). The timing below runs the big one anyway.

# %%
class CountingLoss:
    """A loss function that counts how often it is evaluated."""
    def __init__(self, x, y, hidden):
        self.x, self.y, self.hidden, self.calls = x, y, hidden, 0

    def __call__(self, theta):
        self.calls += 1
        return loss_fn(theta, self.x, self.y, self.hidden)


print(f"{'hidden':>7} {'P':>7} {'finite-difference passes: counted':>34} {'predicted':>10}")
for hidden in [1, 10, 100]:
    theta, x, y = make_problem(hidden)
    counter = CountingLoss(x, y, hidden)
    central_difference_gradient(counter, theta)
    predicted, _ = step_seconds(theta.size, 1.0)
    # (a loop that also evaluates L(theta) once makes one call more; the check allows it)
    assert predicted == 2 * theta.size and counter.calls in (predicted, predicted + 1)
    print(f"{hidden:>7} {theta.size:>7} {counter.calls:>34} {predicted:>10g}")
print(f"{1000:>7} {10 * 1000 + 1:>7} {'(not run)':>34} {step_seconds(10_001, 1.0)[0]:>10g}")
print(f"backprop, predicted: {step_seconds(10_001, 1.0)[1]:g} forward passes' worth at any size "
      f"(timed below)")

# %% [markdown]
# Finite differences need 2P forward passes; backprop needs one forward pass and one
# backward pass, whatever P is. Counting is not timing, though: a backward pass does work
# too. So time both, for each size, and take the median of several runs.
#
# **This cell takes a while** (about a minute on a laptop): it runs *your*
# `central_difference_gradient` up to P = 10 001, i.e. 20 002 forward passes per
# gradient, three times over. That wait is the point of the lesson.

# %%
# NBVAL_IGNORE_OUTPUT
# (timings differ from run to run and machine to machine; the asserts below hold on any)
from engine.timing import fixed_threads, median_seconds


sizes, t_fd, t_bp, t_fwd = [], [], [], []
# One BLAS thread: small matrix products are then timed the same way whatever else the
# machine is doing, and BLAS never switches to several threads halfway through the sizes.
with fixed_threads(1):
    for hidden in [1, 3, 10, 30, 100, 300, 1000]:
        theta, x, y = make_problem(hidden)
        f = lambda t: loss_fn(t, x, y, hidden)
        sizes.append(theta.size)
        t_fwd.append(median_seconds(lambda: f(theta), repeats=21))
        t_bp.append(median_seconds(lambda: backprop_gradient(theta, x, y, hidden), repeats=21))
        t_fd.append(median_seconds(lambda: central_difference_gradient(f, theta),
                                   repeats=3 if theta.size > 1000 else 5))
        print(f"P={theta.size:>6}: finite differences {t_fd[-1]*1e3:9.2f} ms   "
              f"backprop {t_bp[-1]*1e6:8.1f} us = {t_bp[-1]/t_fwd[-1]:.1f} forward passes")
print(f"your prediction: backprop = {step_seconds(1, 1.0)[1]:g} forward passes")

# What the lesson claims, on any machine: at the largest size finite differences
# (20,002 forward passes) cost far more than backprop, and backprop stays a few forward passes.
assert t_fd[-1] > 100 * t_bp[-1], "finite differences should lose by orders of magnitude"
assert t_bp[-1] < 50 * t_fwd[-1], "backprop should cost a few forward passes (50: margin for a busy machine)"

# %%
fig, ax = plt.subplots(figsize=(6, 4))
ax.loglog(sizes, t_fd, "o-", label="central differences (2P forward passes)")
ax.loglog(sizes, t_bp, "s-", label="backprop (1 forward + 1 backward)")
ax.loglog(sizes, t_fwd, ":", color="gray", label="one forward pass")
ax.set_xlabel("number of parameters P")
ax.set_ylabel("seconds per gradient")
ax.set_title("Cost of one gradient")
ax.legend()
ax.grid(True, which="both", alpha=0.3)
plt.show()

# %% [markdown]
# On the log-log plot the finite-difference line has slope about 2 at the right: 2P
# evaluations, each of which itself costs more as the network grows. The backprop line runs
# beside the forward pass: its ratio to one forward pass (printed above for each P) stays a
# small number while P grows a thousandfold, where finite differences grow with P.
#
# That ratio is rarely exactly the 3 of your prediction, and it differs between machines and
# between runs. The prediction counts matrix products; a small numpy network also pays
# Python's fixed cost per call, temporary arrays and transposes, which the count leaves out.
# At the smallest sizes the fixed cost decides it (backprop makes fewer calls than three
# forward passes would, so it can even look cheaper than 3); at the largest, a loaded
# machine has shown anything from about 2 to 10. What does not change is the comparison:
# a handful of forward passes against 20,002.
#
# ## The 7-billion-parameter arithmetic
#
# Your `step_seconds` is the arithmetic that rules finite differences out. A model of 7
# billion parameters whose forward pass takes 0.1 s:

# %%
fd_s, bp_s = step_seconds(7_000_000_000, 0.1)
year = 365.25 * 24 * 3600
print(f"finite differences: {fd_s:.3g} s = {fd_s / year:.1f} years per training step")
print(f"backprop:           {bp_s:.3g} s per training step")
print(f"ratio:              {fd_s / bp_s:.2g}")

# %% [markdown]
# Even a one-sided difference (one extra pass per parameter) would take over 22 years per
# step. Backprop takes three tenths of a second.
#
# ## What you built, and what it costs
#
# - A central-difference gradient: exact enough to *check* gradients (lesson 04 makes it a
#   tool), far too slow to *train* with: 2P forward passes.
# - A reverse-mode gradient: one forward pass that **keeps** its intermediate values, and a
#   backward pass of about two forward passes' work.
#
# The price of backprop is in that word *keeps*. `backprop_gradient` needed `x`, `h` and
# `pred` from the forward pass; a real network keeps such tensors for every layer until the
# backward pass reaches it. Lessons 01-03 build the machinery that records them, and
# lessons 06-07 measure what they cost in memory.
