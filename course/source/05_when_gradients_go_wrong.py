# %% [markdown]
# # 05 · When gradients go wrong
#
# **Goals.** By the end of this lesson you will have
# 1. made each classic failure of a backward pass happen on the engine, and diagnosed it
#    with the right tool:
#    - a graph cut three ways (`detach`, `no_grad`, a round trip through an ndarray) that
#      leaves a gradient `None`;
#    - an in-place change of a tensor the backward needs, caught by the engine's version
#      counters (and one way past them), and predicted for seven snippets;
#    - a forgotten `zero_grad`, seen in the gradient norm;
#    - a NaN, traced to the first op that made it with `engine.detect_anomaly()`;
#    - a broadcasting bug that runs without a complaint;
# 2. found, with the gradient checker of lesson 04 (your `spot_check`, or the engine's when
#    yours is not saved), which of seven ops have a broken backward rule, and said how each
#    one is broken;
# 3. used the troubleshooting order and the symptom table on five mystery runs.
#
# The mathematics of the chain rule is settled; what goes wrong is the program around it.
# A broken gradient rarely crashes: it comes back as `None`, as zeros, as NaN, or, worst, as
# numbers of the right shape that are simply wrong.
#
# **Your pieces in the engine.** Fills: no slot (the exercises diagnose). Runs: your
# gradient checker, 04.3 `spot_check` (with the 04.1 and 04.2 parts it calls), in the hunt
# for broken backward rules (05.2) and on the plots that say how each is broken; where it is
# not saved or breaks its contract, the engine's spot check with the same rows runs, and the
# lesson prints which. (The whole map: CONTRIBUTING.md, "Exercise <-> slot".)

# %%
import re

import numpy as np
import matplotlib.pyplot as plt

import engine
from engine import Tensor
import engine.functional as F
from engine.rules import Op
from coursework import lesson05

lesson05.name_unfinished_exercises()   # a cell that needs an unfinished exercise says which

np.set_printoptions(precision=4, suppress=True)

# %% [markdown]
# ## The first tool: look at every gradient
#
# Before any theory, print each parameter's gradient in one line: `None`, all zeros,
# non-finite, or its norm. The symptoms below are all visible in this report.

# %%
def health(**params):
    """One line per parameter: what its .grad holds."""
    for name, p in params.items():
        g = p.grad
        if g is None:
            state = "None"
        elif not np.isfinite(g).all():
            state = f"{int((~np.isfinite(g)).sum())} of {g.size} entries NaN or Inf"
        elif not g.any():
            state = "all zero"
        else:
            state = f"norm {np.linalg.norm(g):.4g}"
        print(f"  {name:>3}.grad: {state}")


rng = np.random.default_rng(0)
X = rng.normal(size=(8, 3))
Y = rng.normal(size=(8, 2))


def fresh_params():
    """Two weight matrices, made again for every experiment."""
    r = np.random.default_rng(1)
    return (Tensor(r.normal(size=(3, 4)) / 2, requires_grad=True, name="W1"),
            Tensor(r.normal(size=(4, 2)) / 2, requires_grad=True, name="W2"))


W1, W2 = fresh_params()
h = F.tanh(Tensor(X) @ W1)
loss = ((h @ W2 - Tensor(Y)) ** 2).mean()
loss.backward()
print(f"loss {loss.item():.6f}")
health(W1=W1, W2=W2)

# %% [markdown]
# ## 1. A cut graph: the gradient is `None`
#
# The tape records an op only if one of its inputs requires a gradient, and only while
# recording is on. Three ordinary lines break the chain between `W1` and the loss:
# `detach()` (same numbers, no history), a `no_grad()` block (nothing recorded inside),
# and a round trip through numpy (`.data` is a plain array; a new `Tensor` made from it has
# no history either).

# %%
def forward_with_cut(how):
    W1, W2 = fresh_params()
    if how == "detach":
        h = F.tanh(Tensor(X) @ W1).detach()
    elif how == "no_grad":
        with engine.no_grad():
            h = F.tanh(Tensor(X) @ W1)
    elif how == "ndarray round trip":
        h = Tensor(np.tanh((Tensor(X) @ W1).data))
    loss = ((h @ W2 - Tensor(Y)) ** 2).mean()
    loss.backward()
    print(f"{how}: h.requires_grad = {h.requires_grad}, loss {loss.item():.6f}")
    health(W1=W1, W2=W2)


for how in ["detach", "no_grad", "ndarray round trip"]:
    forward_with_cut(how)

# %% [markdown]
# The loss is the same number each time, and the backward runs without an error: `W2` gets
# its gradient, `W1` gets nothing. The diagnosis is to walk from the loss towards the
# parameter and find the first tensor with `requires_grad = False`: there the path ends.
#
# `None` is not the same as zero. `None` says *no path*; zero says a path exists and the
# derivative along it is 0. A ReLU that is off for every example gives zeros:

# %%
W1, W2 = fresh_params()
h = F.relu(Tensor(X) @ W1 - 100.0)          # every pre-activation is far below 0
((h @ W2 - Tensor(Y)) ** 2).mean().backward()
health(W1=W1, W2=W2)

# %% [markdown]
# (Here `W2` gets zeros too: its gradient is `hᵀ·g`, and `h` is all zeros.)
#
# ## 2. In-place changes of a tensor the backward needs
#
# `y = x * w` saves `x`: the gradient of `w` is `g·x`. Change `x` in place after the forward,
# and the backward would multiply by the wrong numbers. The engine keeps a **version
# counter** on every tensor, bumped by every in-place change (`+=`, `x[i] = ...`,
# `zero_()`); each op remembers the versions of what it saved and checks them before its
# VJP runs.

# %%
w = Tensor(np.array([2.0, -1.0]), requires_grad=True, name="w")
x = Tensor(np.array([3.0, 0.5]), name="x")
y = (x * w).sum()
x += 1.0                                      # after the forward, before the backward
try:
    y.backward()
except RuntimeError as err:
    print(err)

# %% [markdown]
# The message names the op, the tensor, the versions, and the fix. A counter only sees
# changes made through the tensor, though. Writing into `.data` goes around it, and then
# nothing complains:

# %%
w = Tensor(np.array([2.0, -1.0]), requires_grad=True, name="w")
x = Tensor(np.array([3.0, 0.5]), name="x")
y = (x * w).sum()
x.data[:] += 1.0                              # the same change, invisible to the counter
y.backward()
print("w.grad =", w.grad, "  but dy/dw at the forward's x is", np.array([3.0, 0.5]))

# %% [markdown]
# A silent, wrong gradient: the absence of an error is not a proof of safety. The fix in both
# cases is to make the change out of place (`x = x + 1` makes a new tensor and leaves the
# saved one alone), or after the backward. In-place updates of parameters belong inside
# `engine.no_grad()` after the backward: that is what an optimizer step does. The engine
# refuses an in-place change of a tensor that requires a gradient while recording:

# %%
try:
    w += 1.0
except RuntimeError as err:
    print(err)

# %% [markdown]
# ## Exercise 05.1 · Which changes does the engine catch?
#
# The counter guards exactly what an op *saved*, through the tensor that holds it. So the
# question to ask of an in-place change is: did some op save this memory for its VJP, and
# does the change go through a tensor (and so through its counter)? Each snippet below
# starts from the same two tensors, runs a forward, makes an in-place change (the lines
# marked `# the change`), then calls `y.backward()`.

# %%
print(lesson05.IN_PLACE_SETUP, end="\n\n")
for letter, code in lesson05.IN_PLACE_SNIPPETS.items():
    print(f"--- {letter}")
    print(code)
    print("y.backward()")

# %% [markdown]
# Predict, for each snippet, one of three outcomes, *before* running anything:

# %%
for outcome, meaning in lesson05.OUTCOMES.items():
    print(f"{outcome:7} {meaning}")

# %% [markdown]
# Write `in_place_outcomes()`, returning `{snippet letter: outcome}`. What each op saves is in
# its class in `engine/rules.py` (`self.save(...)`), and the module docstring of
# `engine/tensor.py` says what a counter sees.

# %%
def in_place_outcomes():
    """{snippet letter: "raises", "wrong" or "right"} for the seven snippets."""
    ### BEGIN SOLUTION
    return {"a": "raises", "b": "right", "c": "wrong", "d": "raises", "e": "right",
            "f": "raises", "g": "right"}
    ### END SOLUTION

# %%
# CHECK 05.1
lesson05.check_in_place(in_place_outcomes)

# %% [markdown]
# Now run them (`lesson05.snippet_outcome` runs a snippet, and once more without its change,
# to tell a right gradient from a wrong one):

# %%
for letter in lesson05.IN_PLACE_SNIPPETS:
    outcome, seen = lesson05.snippet_outcome(letter)
    print(f"{letter}: {outcome:6} {seen}")

# %% [markdown]
# Three rules cover all seven. A counter belongs to the *memory*, so a view (`x[0:1]`, a
# reshape, a transpose, `detach()`) shares it (d). It guards only what some op saved: an add
# saves nothing (b), and a product of `exp(x)` saved `exp(x)`, not `x` (e). And it sees only
# changes made through a tensor: `.data` goes around it (c), and a plain ndarray has no
# counter at all, which is why the tape copies one it must keep (g). `no_grad()` changes what
# is recorded, not what is checked (f).
# %% [markdown]
# ## 3. A forgotten `zero_grad`
#
# `.backward()` *adds* into `.grad`: that is what makes a parameter used twice in one graph
# get the sum of both contributions, and what lets you accumulate micro-batches on purpose
# (lesson 08). A training loop that never zeroes the gradients adds every step's gradient to
# all the previous ones. Log the gradient norm at every step, on the same batch:

# %%
def train_steps(zero_each_step, steps=4, lr=0.0):
    W1, W2 = fresh_params()
    norms = []
    for step in range(steps):
        if zero_each_step:
            W1.zero_grad()
            W2.zero_grad()
        loss = ((F.tanh(Tensor(X) @ W1) @ W2 - Tensor(Y)) ** 2).mean()
        loss.backward()
        norms.append(np.linalg.norm(W1.grad))
    return norms


print("without zero_grad:", " ".join(f"{n:.4f}" for n in train_steps(False)))
print("with zero_grad:   ", " ".join(f"{n:.4f}" for n in train_steps(True)))

# %% [markdown]
# The same batch and the same weights (the learning rate is 0 here) should give the same
# gradient each step. Without `zero_grad` it grows like 1, 2, 3, 4 times: the norm log shows
# it at once, long before the loss curve looks odd. With intentional accumulation, the norm
# grows across the K micro-batches and resets after each optimizer step; say so in the code.
#
# ## 4. A NaN, and the first op that made it
#
# A softmax written the obvious way, `exp(z) / sum(exp(z))`, overflows as soon as a logit
# passes about 709 (float64; about 88 in float32): `exp` gives `inf`, and `inf / inf` is NaN.
# By the time the loss is NaN, every op after the first bad one has passed the NaN along,
# and the loss cannot say where it began. (numpy's warnings on stderr say *that* an overflow
# happened somewhere in the engine, not which op of yours caused it.)

# %%
def naive_cross_entropy(logits, targets):
    e = F.exp(logits)
    probs = e / e.sum(axis=-1, keepdims=True)
    return -F.log(probs[np.arange(len(targets)), targets]).mean()


logits_w = Tensor(np.array([[1.0, -2.0, 0.5], [0.3, 0.2, -0.1]]), requires_grad=True, name="Wout")
features = Tensor(np.array([[1.0, 0.0], [0.0, 3000.0]]))   # one example has a huge feature
targets = np.array([0, 0])
loss = naive_cross_entropy(features @ logits_w, targets)
loss.backward()
print(f"loss = {loss.item()}")
health(Wout=logits_w)

# %% [markdown]
# Run the same forward and backward inside `engine.detect_anomaly()`: every op's output is
# checked as the forward runs, every gradient as the backward runs, and the first non-finite
# one raises an error naming the op (and where your code called it; we blank that part out
# here because it names a temporary file).

# %%
logits_w.zero_grad()
try:
    with engine.detect_anomaly():
        naive_cross_entropy(features @ logits_w, targets).backward()
except engine.AnomalyError as err:
    print(f"first bad op: {err.op} ({err.phase})")
    print(re.sub(r"called at [^,]*?(?=\. )", "called at <your cell>", str(err)))

# %% [markdown]
# `exp` made the first `inf`, from finite inputs. The fix is a formula that cannot overflow:
# subtract each row's maximum before `exp` (softmax does not change), or, better, use
# `F.cross_entropy`, which works with `log_softmax` and never forms the huge `exp`:

# %%
logits_w.zero_grad()
loss = F.cross_entropy(features @ logits_w, targets)
loss.backward()
print(f"loss = {loss.item():.4f}")
health(Wout=logits_w)

# %% [markdown]
# ## 5. A broadcasting bug that runs
#
# A per-feature scale `s` (one number per column of a batch `x` of shape `(B, C)`) should be
# applied as `x * s`. Written as `x * s.reshape(-1, 1)` it becomes a per-*row* scale. With
# a square batch (`B = C = 4`) numpy broadcasts it without a word, the output has the right
# shape, the gradient of `s` has the right shape, and a gradient check passes, because the
# gradient *is* right: for the wrong function.

# %%
def scaled_loss(x, s, right):
    scaled = x * s if right else x * s.reshape(-1, 1)
    return (scaled ** 2).sum(axis=1).mean()


x4 = np.arange(16.0).reshape(4, 4) / 8
s0 = np.array([1.0, 2.0, 3.0, 4.0])
for right in (True, False):
    s = Tensor(s0, requires_grad=True)
    scaled_loss(Tensor(x4), s, right).backward()
    check = engine.gradcheck(lambda x, s: scaled_loss(x, s, right),
                             [x4, s0], raise_on_failure=False)
    label = "x * s" if right else "x * s.reshape(-1, 1)"
    print(f"{label:20}: s.grad = {s.grad}, gradcheck {'passed' if check.ok else 'FAILED'}")

# %% [markdown]
# Both gradients pass their check, and they are different. A gradient check verifies the
# backward against the forward; it cannot know what you *meant* the forward to be. The tool
# for this one is step 8 of the order below: make every axis a different size. With
# `B = 2, C = 3` the wrong line cannot broadcast, and the engine says which op and which
# shapes:

# %%
x23 = np.arange(6.0).reshape(2, 3)
try:
    scaled_loss(Tensor(x23), Tensor(np.ones(3), requires_grad=True), right=False)
except engine.ShapeError as err:
    print(err)

# %% [markdown]
# ## 6. Broken backward rules: find them, and say how
#
# Seven ops written the way you would add an op to the engine: a subclass of
# `engine.rules.Op` with a `forward` and a `vjp`. Their forwards are all right. Some of
# their VJPs are not. `lesson05.suspects()` gives them as `Suspect` objects: `s.fn(*tensors)`
# runs the op, `s.shapes` are the shapes of its inputs.
#
# The tool is the gradient checker you built in lesson 04. `pieces.gradient_checker()` hands
# back your `spot_check` (04.3), loaded from your saved pieces after a test of its contract
# (a right gradient passes everywhere, one wrong element is flagged, and only it), or, when
# yours is not saved or fails that test, the engine's spot check with the same arguments and
# the same rows. The line below says which one runs here. Everything printed after it is
# the same whichever it is: both report the same verdicts.
# %%
# NBVAL_IGNORE_OUTPUT
# (whose checker runs depends on the pieces you saved; no result below depends on it)
from coursework import pieces

spot_check, checker_owner = pieces.gradient_checker()
print("the gradient checker of this section:", checker_owner)

# %%
suspects = lesson05.suspects()
for name, s in suspects.items():
    print(f"{name:11} inputs of shape {s.shapes}")

# %% [markdown]
# A spot check takes a scalar function of one array and the gradient backprop gives for it.
# An op has an array output and possibly several inputs, so `lesson05.scalar_views(s, arrays)`
# turns it into what the checker wants, one triple `(f, x, grad)` per input: `f(array)` runs
# the op with that input replaced by `array` (the others fixed) and reduces the output to one
# number with fixed random weights, so every output element matters; `grad` is that number's
# gradient from one backward through the op's `vjp`. For the bias op, the second triple is
# the bias's:

# %%
(f_x, x_in, g_x), (f_b, b_in, g_b) = lesson05.scalar_views(
    suspects["add_bias"], [np.ones((4, 3)), np.zeros(3)])
print("inputs:", x_in.shape, b_in.shape, "  gradients:", g_x.shape, g_b.shape)
print("both views give the op's number at the inputs given:", f_x(x_in) == f_b(b_in))
# %% [markdown]
# ## Exercise 05.2 · Which are broken?
#
# Write `find_broken(suspects)`: for every suspect, draw float64 inputs from
# `np.random.default_rng(seed).normal(size=shape)`, one for each of its shapes, and run
# `spot_check` (the checker of the cell above) on every `scalar_views` triple of the suspect;
# return the names of the suspects with a failing row (`r.ok` is False). Everything from
# lesson 04 applies: float64, both signs of input (kinks!), every input of the op, and every
# element (`n_checks=x.size`), since a bug can hide in a few of them. (`engine.gradcheck` does
# the same in one call; here your own checker does the work.)

# %%
def find_broken(suspects, seed=0):
    """Names of the suspects whose backward rule fails a gradient check."""
    ### BEGIN SOLUTION
    rng = np.random.default_rng(seed)
    broken = []
    for name, s in suspects.items():
        arrays = [rng.normal(size=shape) for shape in s.shapes]
        for f, x, grad in lesson05.scalar_views(s, arrays):
            if not all(r.ok for r in spot_check(f, x, grad, n_checks=x.size)):
                broken.append(name)
                break
    return broken
    ### END SOLUTION

# %%
# CHECK 05.2
lesson05.check_find_broken(find_broken)

# %% [markdown]
# ## How is each one broken?
#
# A failed check gives the worst element; the pattern over *all* elements tells you the
# kind of bug. Plot, for every input element, the ratio of the analytic gradient (backward)
# to the numerical one (central differences), against the input's value. A correct rule
# puts every point on the line at 1, whatever its size, so a wrong small gradient shows as
# clearly as a wrong large one (on a plot of analytic against numerical, the leaky ReLU's
# slope 0.1 sits so close to the origin that a missing leak is hard to see). Points of a
# negative input are drawn in orange, of a positive input in blue; a second input (a bias)
# with crosses. Ratios beyond ±2.5 are drawn at the edge. The values come from the rows of the
# same `spot_check`, run on every element (`lesson05.numeric_and_analytic(s, spot_check)`).

# %%
fig, axes = plt.subplots(2, 4, figsize=(12, 6), sharey=True)
for ax, (name, s) in zip(axes.flat, suspects.items()):
    for k, (x, analytic, numeric) in enumerate(lesson05.numeric_and_analytic(s, spot_check)):
        marker = "o" if k == 0 else "x"
        ratio = np.clip(analytic / numeric, -2.5, 2.5)
        ax.scatter(x[x < 0], ratio[x < 0], c="tab:orange", marker=marker, s=18)
        ax.scatter(x[x >= 0], ratio[x >= 0], c="tab:blue", marker=marker, s=18)
    ax.axhline(1.0, color="0.7", lw=0.8, zorder=0)
    ax.axhline(0.0, color="0.85", lw=0.6, zorder=0)
    ax.set_ylim(-2.7, 2.7)
    ax.set_title(name)
    ax.set_xlabel("input value")
axes[0, 0].set_ylabel("analytic / numerical")
axes[1, 0].set_ylabel("analytic / numerical")
key = axes.flat[-1]                        # the eighth panel, empty: the legend goes there
key.axis("off")
key.legend(handles=[
    plt.Line2D([], [], ls="", marker="o", color="tab:orange", label="input < 0"),
    plt.Line2D([], [], ls="", marker="o", color="tab:blue", label="input ≥ 0"),
    plt.Line2D([], [], ls="", marker="x", color="0.3", label="second input (a bias)"),
    plt.Line2D([], [], color="0.7", label="ratio 1: a correct rule"),
], loc="center", title="each point: one input element")
fig.tight_layout()
plt.show()

# %%
for cause, meaning in lesson05.CAUSES.items():
    print(f"{cause:9} {meaning}")

# %% [markdown]
# ## Exercise 05.3 · Say how
#
# From the plots (and the reports of your `find_broken`, if you print them), give each
# suspect its verdict: one of the causes listed above. `"ok"` for a correct op.

# %%
def verdicts():
    """{suspect name: cause} for the seven suspects."""
    ### BEGIN SOLUTION
    return {"softplus": "ok", "square": "scale", "sigmoid": "sign", "leaky_relu": "branch",
            "x_exp": "formula", "logsumexp": "ok", "add_bias": "broadcast"}
    ### END SOLUTION

# %%
# CHECK 05.3
lesson05.check_verdicts(verdicts)

# %% [markdown]
# Each pattern points at the line to fix. A constant ratio is a lost constant (the 2 of
# `x²`); a flipped sign is a subtraction written the wrong way round; one-sided agreement is a
# branch of a `where` (the leak of the leaky ReLU was dropped); a wrong gradient for the
# broadcast input only is a missing sum over the repeated axis; and disagreement without a
# pattern is a term missing from the derivative (the product rule's second term of `x·eˣ`).
#
# ## The troubleshooting order, and the symptom table
#
# When a real model's gradients look wrong, the cause can be any of the above, or several at
# once. Work through the causes from the cheapest and most common to the most expensive:

# %%
for number, step in lesson05.STEPS.items():
    print(f"{number}. {step}")

# %% [markdown]
# And start from what you see. The symptom table maps a symptom to its likely causes and the
# steps that find them first; `lesson05.diagnose(symptom)` prints one row (a word of the
# symptom is enough):

# %%
for symptom in lesson05.SYMPTOMS:
    print("-", symptom)
print()
print(lesson05.diagnose("None"))

# %% [markdown]
# Symptoms narrow the search; they do not prove a cause. After every fix, rerun the small
# forward-backward test and the gradient check: a symptom that went away only shows that
# *something* changed.
#
# ## Five mystery runs
#
# Each run below trains a little, or computes one gradient, and shows its `health` report.
# Read the report, find the symptom in the table, read the code, and decide which step of
# the order finds the cause.

# %%
class Round(Op):
    """Round to the nearest integer: flat between jumps, so its derivative is 0."""
    name = "round"

    def forward(self, a):
        return np.round(a)

    def vjp(self, g):
        return (np.zeros_like(g),)


def mystery_A():
    W1, W2 = fresh_params()
    hidden = (Tensor(X) @ W1).data
    h = Tensor(np.tanh(hidden))
    ((h @ W2 - Tensor(Y)) ** 2).mean().backward()
    health(W1=W1, W2=W2)


def mystery_B():
    W1, W2 = fresh_params()
    temperature = 1e-4                          # meant to be 1.0
    logits = (Tensor(X) @ W1 @ W2) / temperature
    naive_cross_entropy(logits, np.array([0, 1, 1, 0, 1, 0, 0, 1])).backward()
    health(W1=W1, W2=W2)


def mystery_C():
    W1, W2 = fresh_params()
    for step in range(3):
        loss = ((F.tanh(Tensor(X) @ W1) @ W2 - Tensor(Y)) ** 2).mean()
        loss.backward()
        print(f" step {step}:")
        health(W1=W1, W2=W2)
        with engine.no_grad():
            W1 -= 0.01 * W1.grad
            W2 -= 0.01 * W2.grad


def mystery_D():
    W1, W2 = fresh_params()
    h = F.apply(Round, F.tanh(Tensor(X) @ W1) * 4.0) / 4.0   # quantise h to steps of 1/4
    ((h @ W2 - Tensor(Y)) ** 2).mean().backward()
    health(W1=W1, W2=W2)


def mystery_E():
    W1, W2 = fresh_params()
    pred = F.tanh(Tensor(X) @ W1) @ W2
    loss = ((pred - Tensor(Y)) ** 2).sum(axis=0).mean()   # per-example error, averaged?
    loss.backward()
    health(W1=W1, W2=W2)
    print("  for comparison, the intended ((pred - Y)**2).sum(axis=1).mean():")
    W1, W2 = fresh_params()
    ((F.tanh(Tensor(X) @ W1) @ W2 - Tensor(Y)) ** 2).sum(axis=1).mean().backward()
    health(W1=W1, W2=W2)


for name, run in [("A", mystery_A), ("B", mystery_B), ("C", mystery_C), ("D", mystery_D),
                  ("E", mystery_E)]:
    print(f"mystery {name}")
    run()

# %% [markdown]
# ## Exercise 05.4 · Triage
#
# For each mystery, give the number of the step (1-9) of the troubleshooting order that finds
# its cause. Use `lesson05.diagnose(...)` with the symptom you see; where it lists several
# steps, the code tells you which one applies.

# %%
def triage():
    """{mystery: step number}"""
    ### BEGIN SOLUTION
    return {"A": 2, "B": 5, "C": 4, "D": 7, "E": 8}
    ### END SOLUTION

# %%
# CHECK 05.4
lesson05.check_triage(triage)

# %% [markdown]
# ## What you built, and what it costs
#
# - A `health` line per parameter: the cheapest diagnostic there is, and the one to log every
#   step (with the gradient norm) in a real run.
# - The engine's own guards: version counters that turn a stale saved tensor into an error
#   naming the op (as long as some op saved that memory and the change goes through a tensor
#   or a view of it, not `.data`), and
#   `detect_anomaly()`, which names the first op to make a NaN or Inf at the price of a scan
#   of every array (debugging only).
# - `find_broken`: your lesson 04 checker as a bug detector, and the patterns that say how a
#   backward rule is broken: a constant ratio, a flipped sign, one branch, the broadcast
#   input, or no pattern at all.
# - The troubleshooting order: paths and cuts first, then in-place changes, zeroing, bad
#   values, precision, non-differentiable ops, axes, and the gradient check last, because it
#   is the most expensive and, as the broadcasting bug showed, it only compares the backward
#   with the forward you wrote.
#
# Lesson 06 turns to what a correct backward pass costs: the activations the tape keeps
# alive between the forward and the backward, measured on the engine.
