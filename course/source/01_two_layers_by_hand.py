# %% [markdown]
# # 01 · Two layers by hand
#
# **Goals.** By the end of this lesson you will have
# 1. run a two-layer network forward with a pen's worth of numbers, keeping every
#    intermediate value in a *cache*;
# 2. run it backward one local step at a time, getting both weight gradients (4 and 24)
#    in a single sweep;
# 3. seen exactly which forward values each backward step reads, and so which ones a
#    training run has to keep alive (and an inference run does not);
# 4. checked your numbers against the course engine, `engine.scalar.Value`, which does the
#    same bookkeeping automatically.
#
# Lesson 00 showed that backprop gets every gradient for the price of a few forward passes.
# This lesson opens the box on the smallest network where the two ideas that make that
# possible are both visible: a single quantity carried backwards, and forward values kept
# for the trip back.
#
# **Your pieces in the engine.** Fills: no slot (the two layers by hand are the pattern
# lesson 02's engine generalises). Runs: your `central_difference_gradient` of lesson 00
# (piece of 00.1) checks the gradient you derive by hand; without it, the engine's central
# difference does, and the lesson says why. (The whole map: CONTRIBUTING.md, "Exercise <->
# slot".)

# %% [markdown]
# ## The network
#
# One input, two layers, a ReLU in between and a squared-error loss:
#
# | step | forward | local derivative(s) |
# |---|---|---|
# | layer 1 | $z_1 = w_1 x$ | $\partial z_1/\partial w_1 = x$ |
# | ReLU | $a_1 = \max(z_1, 0)$ | $\partial a_1/\partial z_1 = 1$ if $z_1 > 0$ else $0$ |
# | layer 2 | $z_2 = w_2 a_1$ | $\partial z_2/\partial w_2 = a_1$, $\partial z_2/\partial a_1 = w_2$ |
# | loss | $L = (z_2 - y)^2$ | $\partial L/\partial z_2 = 2(z_2 - y)$ |
#
# The numbers: input $x = 2$, weights $w_1 = 0.5$ and $w_2 = 3$, target $y = 1$.
# Everything in this lesson is plain Python floats, so you can follow along with a pen.

# %%
import matplotlib.pyplot as plt
from coursework import lesson01

lesson01.name_unfinished_exercises()   # a cell that needs an unfinished exercise says which

x, w1, w2, y = 2.0, 0.5, 3.0, 1.0

# %% [markdown]
# ## Exercise 01.1 · The forward pass, keeping everything
#
# Complete `forward`: compute `z1`, `a1`, `z2` and `L` in order, one line each. The last
# line, already written, returns the loss together with a dict of every value the forward
# pass saw. That dict is the *cache*; we keep all of it for now and find out below which
# entries the backward pass actually needs.

# %%
def forward(x, w1, w2, y):
    """Run the two-layer network; return (L, cache) where cache holds every forward value."""
    ### BEGIN SOLUTION
    z1 = w1 * x
    a1 = max(z1, 0.0)
    z2 = w2 * a1
    L = (z2 - y) ** 2
    ### END SOLUTION
    return L, {"x": x, "w1": w1, "w2": w2, "y": y, "z1": z1, "a1": a1, "z2": z2, "L": L}

# %%
# CHECK 01.1
from coursework import lesson01
lesson01.check_forward(forward)

# %%
L, cache = forward(x, w1, w2, y)
for name, value in cache.items():
    print(f"{name:>2} = {value:g}")

# %% [markdown]
# The prediction is $z_2 = 3$ against a target of 1, so the loss is $(3-1)^2 = 4$.
#
# ## Going backward: one quantity, carried down
#
# The backward pass starts at the loss with $\partial L/\partial L = 1$ and walks the table
# above from the bottom up. At each step it holds one number, the derivative of the loss
# with respect to the *output* of that step, and does two things with it:
#
# 1. multiply it by the local derivative with respect to the step's **weight**: that is the
#    weight's gradient, the thing the optimizer wants;
# 2. multiply it by the local derivative with respect to the step's **input**: that is the
#    number to carry down to the step below.
#
# Each local derivative is evaluated at the values of *this* forward pass, which is why the
# functions below receive the cache.
#
# ## Exercise 01.2 · The loss and layer 2
#
# Write `loss_backward(cache)`, returning $\partial L/\partial z_2$, and
# `layer2_backward(dL_dz2, cache)`, returning the pair
# $(\partial L/\partial w_2,\ \partial L/\partial a_1)$. Read forward values from the cache,
# for example `cache["a1"]`.

# %%
def loss_backward(cache):
    """dL/dz2 for L = (z2 - y)^2."""
    ### BEGIN SOLUTION
    return 2 * (cache["z2"] - cache["y"])
    ### END SOLUTION


def layer2_backward(dL_dz2, cache):
    """Layer 2 is z2 = w2 * a1. Return (dL_dw2, dL_da1)."""
    ### BEGIN SOLUTION
    dL_dw2 = dL_dz2 * cache["a1"]
    dL_da1 = dL_dz2 * cache["w2"]
    return dL_dw2, dL_da1
    ### END SOLUTION

# %%
# CHECK 01.2
lesson01.check_layer2_backward(loss_backward, layer2_backward)

# %%
dL_dz2 = loss_backward(cache)
dL_dw2, dL_da1 = layer2_backward(dL_dz2, cache)
print(f"dL/dz2 = 2 * (z2 - y) = 2 * ({cache['z2']:g} - {cache['y']:g}) = {dL_dz2:g}")
print(f"dL/dw2 = dL/dz2 * a1  = {dL_dz2:g} * {cache['a1']:g} = {dL_dw2:g}")
print(f"dL/da1 = dL/dz2 * w2  = {dL_dz2:g} * {cache['w2']:g} = {dL_da1:g}   <- carried down")

# %% [markdown]
# $\partial L/\partial w_2 = 4$ is finished: layer 2's weight gradient. $\partial L/\partial a_1 = 12$
# is the number layer 1 receives. Layer 1 never needs to know that a loss or a second layer
# exists; it only needs this one number.
#
# ## Exercise 01.3 · Layer 1, through the ReLU
#
# Write `layer1_backward(dL_da1, cache)`, returning the pair
# $(\partial L/\partial w_1,\ \partial L/\partial z_1)$. The ReLU is a gate: it passes the
# gradient unchanged where its forward input was positive and blocks it (multiplies by 0)
# where it was not. At $z_1 = 0$ the derivative does not exist; the convention used
# throughout this course is 0 there.

# %%
def layer1_backward(dL_da1, cache):
    """Layer 1 is a1 = relu(z1) with z1 = w1 * x. Return (dL_dw1, dL_dz1)."""
    ### BEGIN SOLUTION
    dL_dz1 = dL_da1 * (1.0 if cache["z1"] > 0 else 0.0)
    dL_dw1 = dL_dz1 * cache["x"]
    return dL_dw1, dL_dz1
    ### END SOLUTION

# %%
# CHECK 01.3
lesson01.check_layer1_backward(layer1_backward)

# %% [markdown]
# ## The whole backward pass
#
# Chained together, the three functions are the backward pass of the network. One sweep
# gives both weight gradients.

# %%
def backward(cache):
    """Every gradient of the two-layer network, from the forward cache."""
    dL_dz2 = loss_backward(cache)
    dL_dw2, dL_da1 = layer2_backward(dL_dz2, cache)
    dL_dw1, dL_dz1 = layer1_backward(dL_da1, cache)
    return {"dL_dz2": dL_dz2, "dL_dw2": dL_dw2, "dL_da1": dL_da1,
            "dL_dz1": dL_dz1, "dL_dw1": dL_dw1}


grads = backward(cache)
for name, value in grads.items():
    print(f"{name} = {value:g}")

# %% [markdown]
# Two weight gradients, 4 and 24. Are they right? Ask the gradient you wrote in lesson 00:
# `central_difference_gradient` nudges each weight by a tiny amount in both directions and
# reruns the forward pass. Your lesson 00 function was saved as a piece when its check
# passed; `coursework.pieces.central_difference()` loads it, checks it on a loss with a
# known gradient, and hands it over, or hands over the engine's central difference
# (`engine.eps_sweep.finite_difference`) and says why. A piece is first loaded and checked
# in a separate Python process, stopped after 20 s of computing (numba's compiling not
# counted), so a piece that loops, exits or changes numpy cannot take this notebook with
# it; what that limit cannot see is the rest of the piece's life: it runs one check on
# small inputs, so a piece that is fast there and slow on a lesson's larger ones, or wrong
# only for some inputs, runs here just as it is. The next cell says whose code runs
# (its output is not compared when the notebook is checked: it depends on your pieces
# folder); the cell after it prints the same whoever's code ran.

# %%
# NBVAL_IGNORE_OUTPUT
# (whose code runs depends on the pieces you have saved)
from coursework.pieces import central_difference

central_difference_gradient, owner = central_difference()
print("central difference:", owner)

# %%
import numpy as np

weights = np.array([w1, w2])
fd = central_difference_gradient(lambda t: forward(x, t[0], t[1], y)[0], weights)
print(f"dL/dw1: backward {grads['dL_dw1']:g}, central difference {fd[0]:.4f}")
print(f"dL/dw2: backward {grads['dL_dw2']:g}, central difference {fd[1]:.4f}")
assert np.allclose(fd, [grads["dL_dw1"], grads["dL_dw2"]], rtol=1e-6)
print("the central difference agrees with your backward pass to 6 digits")

# %% [markdown]
# What do the gradients *say*? $\partial L/\partial w_1 = 24$: raising $w_1$ by a small
# $\Delta$ raises the loss by about $24\Delta$. The prediction 3 is too high, so both weights
# should go down, $w_1$ six times faster than $w_2$ per unit of learning rate. A plain
# gradient-descent step with learning rate 0.01 would do exactly that.

# %%
lr = 0.01
w1_new, w2_new = w1 - lr * grads["dL_dw1"], w2 - lr * grads["dL_dw2"]
print(f"after one step: w1 = {w1_new:g}, w2 = {w2_new:g}, "
      f"loss {forward(x, w1, w2, y)[0]:g} -> {forward(x, w1_new, w2_new, y)[0]:.6g}")

# %% [markdown]
# ## Which forward values did the backward pass need?
#
# Look at your three backward functions and list, for each gradient, the forward values it
# reads from the cache. This is the question every real engine answers for every operation,
# because whatever backward reads must survive in memory from the moment the forward pass
# made it until the backward pass gets there.
#
# ## Exercise 01.4 · What backward reads
#
# Return a dict that maps each gradient's name (`"dL_dz2"`, `"dL_dw2"`, `"dL_da1"`,
# `"dL_dz1"`, `"dL_dw1"`) to the set of forward values its formula reads, named as in the
# cache (`"x"`, `"w1"`, `"w2"`, `"y"`, `"z1"`, `"a1"`, `"z2"`, `"L"`). Count only values
# read from the cache, not the gradient handed down from the step above.

# %%
def saved_for_backward():
    """For each gradient, the set of cached forward values its formula reads."""
    ### BEGIN SOLUTION
    return {"dL_dz2": {"z2", "y"}, "dL_dw2": {"a1"}, "dL_da1": {"w2"},
            "dL_dz1": {"z1"}, "dL_dw1": {"x"}}
    ### END SOLUTION

# %%
# CHECK 01.4
lesson01.check_saved_for_backward(saved_for_backward)

# %% [markdown]
# Now let your own backward functions testify. `ReadLog` is a dict that writes down every
# key anyone reads from it. We run each backward step on a fresh `ReadLog` of the cache and
# print what it read.

# %%
class ReadLog(dict):
    """A dict that records, in order, every key read from it."""
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads = []

    def __getitem__(self, key):
        self.reads.append(key)
        return super().__getitem__(key)


def reads_of(step, *args):
    """Run step(*args, cache) on a recording copy of the cache; return the keys it read."""
    log = ReadLog(cache)
    step(*args, log)
    return sorted(set(log.reads))


print("loss_backward   read", reads_of(loss_backward))
print("layer2_backward read", reads_of(layer2_backward, grads["dL_dz2"]))
print("layer1_backward read", reads_of(layer1_backward, grads["dL_da1"]))

# %% [markdown]
# Together: `x`, `z1`, `a1`, `w2`, `z2` and `y`. Two things never appear: `L` (backward
# starts from $\partial L/\partial L = 1$, not from the loss value) and `w1` (the gradient
# of $z_1 = w_1 x$ with respect to $w_1$ is $x$). The weights are kept anyway, since the
# model needs them; the others are **activations**, and they are what training adds.
#
# The plot shows when each value is made and when it is last read, step by step, for a
# forward-only (inference) run and for a training run. In inference a value can be thrown
# away after its last forward use; in training, everything backward reads stays alive until
# the backward pass reaches it.

# %%
steps = ["z1 = w1·x", "a1 = relu", "z2 = w2·a1", "L", "dL/dz2", "layer 2", "layer 1"]
made = {"x": 0, "z1": 0, "a1": 1, "z2": 2, "L": 3}
last_forward_use = {"x": 0, "z1": 1, "a1": 2, "z2": 3, "L": 3}
backward_reads = {name: 4 + i for i, step_reads in enumerate(
    [reads_of(loss_backward), reads_of(layer2_backward, 1.0), reads_of(layer1_backward, 1.0)])
    for name in step_reads}
last_training_use = {n: max(last_forward_use[n], backward_reads.get(n, -1)) for n in made}

fig, axes = plt.subplots(1, 2, figsize=(10, 2.8), sharey=True)
names = list(made)
for ax, last, title in ((axes[0], last_forward_use, "inference: free after last forward use"),
                        (axes[1], last_training_use, "training: keep until backward reads it")):
    for row, n in enumerate(names):
        ax.barh(row, last[n] - made[n] + 0.8, left=made[n] - 0.4, color="tab:blue", alpha=0.7)
    ax.axvline(3.5, color="gray", ls=":")
    ax.set_xticks(range(len(steps)), steps, rotation=35, ha="right", fontsize=8)
    ax.set_xlim(-0.6, len(steps) - 0.4)
    ax.set_title(title, fontsize=10)
axes[0].set_yticks(range(len(names)), names)
axes[0].invert_yaxis()
plt.tight_layout()
plt.show()

# %% [markdown]
# With one number per value the difference is a few bytes. With a batch of 8 sequences of
# 2048 tokens and 4096 features per layer, one such value is 134 MB in 16-bit floats, and a
# deep network keeps several per layer: lesson 06 measures it.
#
# ## The same network in the course engine
#
# From lesson 02 on we stop writing backward functions by hand for every network. The course
# engine's scalar type, `engine.scalar.Value`, records each operation as it runs, then does
# the sweep you just did when you call `.backward()`. Same network, same numbers:

# %%
from engine.scalar import Value

vx, vw1, vw2, vy = Value(x), Value(w1), Value(w2), Value(y)
vz1 = vw1 * vx
va1 = vz1.relu()
vz2 = vw2 * va1
vL = (vz2 - vy) ** 2
vL.backward()

print(f"forward:  L = {vL.data:g}")
print(f"backward: dL/dw1 = {vw1.grad:g}, dL/dw2 = {vw2.grad:g}, dL/dx = {vx.grad:g}")
assert vL.data == L and vw1.grad == grads["dL_dw1"] and vw2.grad == grads["dL_dw2"]
print("the engine agrees with your hand-written backward pass")

# %% [markdown]
# The engine also gives gradients you did not ask for, such as $\partial L/\partial x = 6$
# ($= \partial L/\partial z_1 \cdot w_1$): it cannot know which inputs you care about.
# Here is the graph it recorded, each box showing a value and, after `.backward()`, its
# gradient. Lesson 02 builds this machinery.

# %%
from widgets.graph import draw_graph

draw_graph(vL, names={"x": vx, "w1": vw1, "w2": vw2, "y": vy, "z1": vz1, "a1": va1,
                      "z2": vz2, "L": vL}, title="the graph engine.scalar.Value recorded")
plt.show()

# %% [markdown]
# ## What you built, and what it costs
#
# - A forward pass that keeps a cache, and a backward pass of three local steps, each
#   turning "how the loss changes with my output" into a weight gradient and the number
#   carried down. One sweep: $\partial L/\partial w_2 = 4$, $\partial L/\partial w_1 = 24$.
# - The list of what backward reads: `x`, the sign of `z1`, `a1`, `w2`, `z2`, `y`. Never
#   `w1`, never `L`.
#
# The cost: every activation backward reads must live from its forward step until the
# backward sweep reaches it. That is why training needs far more memory than inference, and
# why the first cure for running out of memory is a smaller batch. Lesson 02 turns the three
# hand-written steps into a rule per operation and an engine that applies them to any graph.
