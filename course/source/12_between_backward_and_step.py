# %% [markdown]
# # 12 · Between backward and step
#
# **Goals.** By the end of this lesson you will have
# 1. seen that clipping each tensor on its own turns the gradient's *direction*, and written
#    global-norm clipping, which only shortens it (exercise 12.1);
# 2. measured a fused AdamW against the unfused one, and written the fused update yourself
#    (exercise 12.2);
# 3. run the steps between backward and step in their order with mixed precision, on your
#    lesson 09 pieces: unscale, the loss scaler's skip-or-apply, clipping, the master-weight
#    step;
# 4. logged the gradient norm and read two of its signatures: a spike that comes before the
#    loss moves, and a flat zero that means broken gradient flow, not convergence; then
#    written the function that finds them in a log (exercise 12.3);
# 5. run data parallelism on a real MPI, launched from this notebook: the all-reduce's
#    bytes and cost, its overlap with the backward, and why to synchronise only on the last
#    micro-batch; then scheduled gradient buckets on a link yourself (exercise 12.4);
# 6. diagnosed six failing runs from their symptoms (exercise 12.5).
#
# The backward pass ends with a gradient for every parameter. Before the optimizer may use
# it, three things can happen to it: it is summed across processes (data parallelism), its
# norm is measured and perhaps clipped, and only then is the step taken.
#
# **Your pieces in the engine.** Fills: global-norm clipping (12.1, `clip_global_norm`) and
# the fused AdamW update (12.2, `adamw_step`), both checked on views of one flat buffer, in
# place, as the trainer hands them; lesson 13's trainer runs both. Runs: your lesson 09
# pieces, `to_bf16` (09.1), `master_weight_step` (09.2) and `update_scale` (09.3), with
# your clipping, in the order between backward and step with mixed precision; the
# engine's versions run instead, saying why, where yours are not saved. (The whole map:
# CONTRIBUTING.md, "Exercise <-> slot".)

# %%
import engine.numba_config  # noqa: F401  (first: numba's threads wait asleep, see lesson 10)

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import matplotlib.pyplot as plt
from numba import njit, prange

from engine import F, Tensor
from coursework import lesson12

lesson12.name_unfinished_exercises()   # a cell that needs an unfinished exercise says which

np.set_printoptions(precision=4, suppress=True)

# %% [markdown]
# ## Global-norm clipping keeps the direction; per-tensor clipping does not
#
# Clipping protects a step from a gradient that is too large. The global norm is one number
# for the whole model,
#
# $$g = \sqrt{\sum_{p} \lVert \partial L/\partial p \rVert^2},$$
#
# and if g exceeds a threshold c, **every** gradient is multiplied by c/g. The update gets
# shorter and keeps its direction. Clipping each tensor to c on its own is a different
# algorithm: a tensor with a large gradient is shrunk, a tensor with a small one is not, so
# their proportions change and with them the direction of the step.
#
# The smallest example: a model with two one-number parameters, a weight whose gradient is
# 10 and a bias whose gradient is 0.5, so the whole gradient is the 2-D vector (10, 0.5).
# Clip at c = 1 both ways:

# %%
def angle_degrees(a, b):
    cos = np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b))
    return float(np.degrees(np.arccos(np.clip(cos, -1.0, 1.0))))


g = np.array([10.0, 0.5])                       # (weight's gradient, bias's gradient)
c = 1.0
global_clipped = g * min(1.0, c / np.linalg.norm(g))
per_tensor = np.array([x * min(1.0, c / abs(x)) for x in g])
print(f"gradient            {g}, norm {np.linalg.norm(g):.3f}")
print(f"global clipping     {global_clipped}, turned by {angle_degrees(g, global_clipped):.1f} degrees")
print(f"per-tensor clipping {per_tensor}, turned by {angle_degrees(g, per_tensor):.1f} degrees")

# %%
fig, ax = plt.subplots(figsize=(6, 3))
for vec, label, color in [(g / np.linalg.norm(g), "gradient (direction)", "k"),
                          (global_clipped, "global clipping", "C0"),
                          (per_tensor, "per-tensor clipping", "C3")]:
    ax.annotate("", xy=vec, xytext=(0, 0),
                arrowprops=dict(arrowstyle="->", color=color, lw=2))
    ax.plot([], [], color=color, lw=2, label=label)
ax.add_patch(plt.Circle((0, 0), c, fill=False, ls=":", color="gray"))
ax.set_xlim(-0.1, 1.2)
ax.set_ylim(-0.1, 0.6)
ax.set_aspect("equal")
ax.set_xlabel("weight's gradient")
ax.set_ylabel("bias's gradient")
ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8)   # beside the arrows
ax.set_title("Clipping a gradient of (10, 0.5) to norm 1")
plt.show()

# %% [markdown]
# Per-tensor clipping shrank the weight's gradient tenfold and left the bias's alone: the
# bias's share of the step went from 1/20 to 1/2, and the update now points about 24
# degrees away from the gradient. Global clipping is the same direction at a tenth of the
# length.
#
# ## Exercise 12.1 · Global-norm clipping
#
# Write `clip_global_norm(grads, max_norm)`: `grads` is a dict of name -> gradient array
# (as the model's `named_grads()` gives). Compute the global norm over all of them; if it
# exceeds `max_norm`, multiply every array **in place** by `max_norm / norm`; return the
# norm measured *before* clipping (that is the number to log). Clipping never scales up.

# %%
def clip_global_norm(grads, max_norm):
    """Scale every gradient in place so their global norm is at most max_norm; return the
    norm before clipping."""
    ### BEGIN SOLUTION
    norm = float(np.sqrt(sum(np.sum(np.square(g, dtype=np.float64)) for g in grads.values())))
    if norm > max_norm:
        scale = max_norm / norm
        for g in grads.values():
            g *= scale
    return norm
    ### END SOLUTION

# %%
# CHECK 12.1
from coursework import lesson12
lesson12.check_clip_global_norm(clip_global_norm)

# %% [markdown]
# Now on a real gradient: the tiny GPT of the capstone (lesson 13), one batch of the
# built-in corpus. Clip it at a threshold below its norm, globally and per tensor, and
# measure how far per-tensor clipping turns the 822 912-dimensional direction.
#
# **The first run of this cell waits about a minute:** the first call of `FusedGPT`
# compiles the trainer's numba kernels for this machine. numba keeps the compiled code in
# its cache, so later runs (and lesson 13) load them in a second or two. The cell says when
# it starts and how long it took.

# %%
# NBVAL_IGNORE_OUTPUT
import time

from engine.trainer.data import Dataset, batch_at, builtin_text
from engine.trainer.model import FusedGPT
from engine.gpt_config import tiny_config

print("One forward and backward of the tiny GPT. On the first run on this machine numba "
      "compiles the trainer's kernels first (about a minute); later runs load them from its "
      "cache ...", flush=True)
t_start = time.perf_counter()
dataset = Dataset.from_text(builtin_text())
cfg = tiny_config(dataset.tokenizer.vocab_size)
model = FusedGPT(cfg, batch_size=8, seed=0)
x_batch, y_batch = batch_at(dataset.train, 0, 0, 8, cfg.block_size)
model.zero_grad()
model.forward(x_batch, y_batch)
model.backward()
print(f"done in {time.perf_counter() - t_start:.1f} s")

# %%
flat = model.grads.flat.astype(np.float64)
max_norm = 0.5
norms = {name: float(np.linalg.norm(g)) for name, g in model.named_grads().items()}
clipped_global = {k: g.astype(np.float64) for k, g in model.named_grads().items()}
norm_before = clip_global_norm(clipped_global, max_norm)
clipped_per_tensor = np.concatenate([
    (g.astype(np.float64) * min(1.0, max_norm / max(norms[k], 1e-30))).ravel()
    for k, g in model.named_grads().items()])
print(f"global norm {norm_before:.2f}; largest tensor norms: " + ", ".join(
    f"{k} {v:.2f}" for k, v in sorted(norms.items(), key=lambda kv: -kv[1])[:3]))
print(f"global clipping to {max_norm}: turned by "
      f"{angle_degrees(flat, np.concatenate([g.ravel() for g in clipped_global.values()])):.2f} degrees")
print(f"per-tensor clipping to {max_norm}: turned by "
      f"{angle_degrees(flat, clipped_per_tensor):.1f} degrees")

# %% [markdown]
# ## Fused AdamW
#
# AdamW touches every parameter at every step, with four arrays of P numbers: parameters,
# gradients and the two moments. Written in numpy, one operation per line, it makes about
# a dozen passes over them, most reading and writing a temporary:

# %%
def adamw_numpy(p, g, m, v, step, lr, beta1, beta2, eps, weight_decay):
    m *= beta1; m += (1 - beta1) * g                        # 4 passes (one temporary)
    v *= beta2; v += (1 - beta2) * g * g                    # 5 passes (two temporaries)
    m_hat = m / (1 - beta1 ** step)                         # 1
    v_hat = v / (1 - beta2 ** step)                         # 1
    p *= 1 - lr * weight_decay                              # 1 (decoupled decay)
    p -= lr * m_hat / (np.sqrt(v_hat) + eps)                # 5
    return p


P_TINY = model.num_params()
print(f"the tiny GPT has P = {P_TINY:,} parameters: 4 arrays of {P_TINY * 4 / 1e6:.1f} MB in fp32")
print("fused: read p, g, m, v once, write p, m, v once = 28 bytes per parameter")

# %% [markdown]
# The fused version is one loop: each element of p, g, m and v is read once, the new p, m
# and v written once. The engine's `engine.trainer.kernels.adamw_update` does exactly that over the
# model's flat buffers (with a per-segment weight decay: matrices decay, biases and
# LayerNorm gains do not). Time both at the tiny model's size and at 10 M parameters:

# %%
# NBVAL_IGNORE_OUTPUT
from engine.trainer.kernels import adamw_update, work_items


from engine.timing import median_seconds


def ms(fn):
    return median_seconds(fn, repeats=7, warmup=1) * 1e3


rng = np.random.default_rng(0)
for n_params in (P_TINY, 10_000_000):
    p, g = rng.normal(size=n_params).astype(np.float32), rng.normal(size=n_params).astype(np.float32)
    m, v = np.zeros_like(p), np.zeros_like(p)
    items = work_items([(0, n_params, 0.1)])
    adamw_update(p, g, m, v, items, lr=1e-3, step=1)
    t_numpy = ms(lambda: adamw_numpy(p, g, m, v, 2, 1e-3, 0.9, 0.95, 1e-8, 0.1))
    t_fused = ms(lambda: adamw_update(p, g, m, v, items, lr=1e-3, step=2))
    print(f"P = {n_params:>10,}: numpy {t_numpy:7.2f} ms, fused {t_fused:6.2f} ms, "
          f"speedup {t_numpy / t_fused:4.1f}x; fused moves {28 * n_params / t_fused / 1e6:5.1f} GB/s")
    state = [a.copy() for a in (p, m, v)]       # one more step from the same state, both ways
    adamw_numpy(*state[:1], g, *state[1:], 3, 1e-3, 0.9, 0.95, 1e-8, 0.1)
    adamw_update(p, g, m, v, items, lr=1e-3, step=3)
    assert all(np.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip((p, m, v), state)), \
        "the fused AdamW and the numpy one disagree"

# %% [markdown]
# ## Exercise 12.2 · A fused AdamW step
#
# Write `adamw_step(p, g, m, v, step, lr, beta1, beta2, eps, weight_decay)` in numba: one
# `prange` loop over the elements of the flat arrays, updating `p`, `m` and `v` in place
# with AdamW as `torch.optim.AdamW` defines it (`step` counts from 1):
#
# $$m \leftarrow \beta_1 m + (1-\beta_1) g,\qquad v \leftarrow \beta_2 v + (1-\beta_2) g^2,$$
# $$p \leftarrow p\,(1 - \mathrm{lr}\cdot\mathrm{wd}) - \mathrm{lr}\,\frac{m / (1-\beta_1^{t})}{\sqrt{v / (1-\beta_2^{t})} + \varepsilon}.$$
#
# The decay is *decoupled*: it multiplies the weights, it is not added to the gradient (that
# would be Adam with L2 regularisation, whose decay gets divided by √v like everything
# else). Compute the two bias corrections once, before the loop. Passing saves your piece
# `adamw_step`, which lesson 13's training loop can run.

# %%
@njit(parallel=True)
def adamw_step(p, g, m, v, step, lr, beta1, beta2, eps, weight_decay):
    """One AdamW update of the flat arrays p, m, v in place, from the gradient g."""
    ### BEGIN SOLUTION
    bias1 = 1.0 - beta1 ** step
    bias2 = 1.0 - beta2 ** step
    keep = 1.0 - lr * weight_decay
    for i in prange(p.size):
        mi = beta1 * m[i] + (1.0 - beta1) * g[i]
        vi = beta2 * v[i] + (1.0 - beta2) * g[i] * g[i]
        m[i] = mi
        v[i] = vi
        p[i] = p[i] * keep - lr * (mi / bias1) / (np.sqrt(vi / bias2) + eps)
    ### END SOLUTION

# %%
# CHECK 12.2
# NBVAL_IGNORE_OUTPUT
lesson12.check_adamw_step(adamw_step)

# %% [markdown]
# ## The order between backward and step, with mixed precision
#
# Lesson 09 trained with fp16 gradients, a loss scale and fp32 master weights. Put them
# together with clipping and the order of what happens between backward and step matters:
#
# 1. the backward ran on `scale * loss`: every gradient is `scale` times too large, stored
#    in fp16, and some may have overflowed to inf;
# 2. **unscale**, in fp32: divide by the scale, and check that every gradient is finite;
# 3. the **loss scaler's rule** (your `update_scale`, 09.3) decides: skip the step and halve
#    the scale, or take it (and double the scale after enough good steps in a row);
# 4. **clip** the *unscaled* gradient (your `clip_global_norm`, 12.1): `max_norm` is a
#    threshold on the true gradient's norm, and that norm is the one to log;
# 5. the **step** on the fp32 master weights (your `master_weight_step`, 09.2), which also
#    hands back the bf16 weights the next forward reads.
#
# The cells below run your lesson 09 pieces where you saved them
# (`lesson12.mixed_precision_pieces()` loads each with `piece_for_slot`), the engine's
# versions, with the same calling conventions, where you did not; the next cell says whose
# ran. The model: a least-squares fit of 16 weights, the loss scale started at 2^17, too
# large on purpose.

# %%
# NBVAL_IGNORE_OUTPUT
precision_pieces = lesson12.mixed_precision_pieces()
for name, (_, owner) in precision_pieces.items():
    print(f"{name}: {owner}")
to_bf16 = precision_pieces["to_bf16"][0]
update_scale = precision_pieces["update_scale"][0]
master_weight_step = precision_pieces["master_weight_step"][0]

# %%
from engine.precision import round_to_fp16

rng_mp = np.random.default_rng(9)
x_mp = rng_mp.normal(size=(256, 16))
y_mp = x_mp @ rng_mp.normal(size=16) + 0.1 * rng_mp.normal(size=256)


def scaled_fp16_gradient(weights, scale):
    """(loss, the gradient of scale * loss as the backward leaves it, stored in fp16)."""
    residual = x_mp @ weights.astype(np.float64) - y_mp       # the forward reads bf16 weights
    return float(np.mean(residual ** 2)), round_to_fp16(scale * 2 * x_mp.T @ residual / len(y_mp))


def mixed_precision_step(master, weights, scale, good_steps, lr=0.2, max_norm=1.0,
                         growth_interval=3):
    """One step in the order above; returns the new state and a record of the step."""
    loss, grad16 = scaled_fp16_gradient(weights, scale)                       # 1.
    grad = grad16.astype(np.float32) / np.float32(scale)                     # 2. unscale
    finite = bool(np.all(np.isfinite(grad)))
    new_scale, good_steps, apply = update_scale(scale, good_steps, finite, growth_interval)  # 3.
    norm = None
    if apply:
        grads = {"w": grad}
        norm = clip_global_norm(grads, max_norm)                             # 4. true norm
        master, weights = master_weight_step(master, grads["w"], lr)         # 5. fp32 master
    record = dict(scale=scale, finite=finite, applied=bool(apply), norm=norm, loss=loss)
    return master, weights, new_scale, good_steps, record


master = np.zeros(16, np.float32)
weights = to_bf16(master.copy())
scale, good_steps = 2.0 ** 17, 0
records = []
print(f"{'step':>4} {'scale':>6} {'finite':>7} {'step taken':>10} {'norm (unscaled)':>16} "
      f"{'loss':>7}")
for step in range(12):
    master, weights, scale, good_steps, rec = mixed_precision_step(master, weights, scale,
                                                                   good_steps)
    records.append(rec)
    norm = f"{rec['norm']:.3g}" if rec["norm"] is not None else "-"
    print(f"{step:>4} {'2^' + str(int(np.log2(rec['scale']))):>6} {str(rec['finite']):>7} "
          f"{str(rec['applied']):>10} {norm:>16} {rec['loss']:7.3g}")
assert [r["applied"] for r in records] == [r["finite"] for r in records]
print(f"final scale 2^{int(np.log2(scale))}; the master weights are float32 "
      f"({master.dtype}), the forward's are bf16 values: {np.array_equal(weights, to_bf16(master))}")

# %% [markdown]
# Every overflow was skipped, and halved the scale; after three good steps the scaler tried
# a doubling, and where that overflowed it backed off again. No inf ever reached the
# weights, and the loss falls on every step taken.
#
# **Why unscale before clipping.** Clip the scaled gradient instead, then unscale: the
# threshold meets a norm `scale` times too large, so the step is always clipped, and once
# unscaled, it is `scale` times too small:

# %%
scale_now = 2.0 ** 14
_, grad16 = scaled_fp16_gradient(weights, scale_now)
right = {"w": grad16.astype(np.float32) / np.float32(scale_now)}
clip_global_norm(right, 1.0)                              # unscale, then clip: the true norm
wrong = {"w": grad16.astype(np.float32)}
clip_global_norm(wrong, 1.0)                              # clip the scaled gradient ...
wrong["w"] /= np.float32(scale_now)                       # ... then unscale
ratio = np.linalg.norm(right["w"]) / np.linalg.norm(wrong["w"])
print(f"unscale, then clip: the step's gradient has norm {np.linalg.norm(right['w']):.3g}")
print(f"clip, then unscale: {np.linalg.norm(wrong['w']):.3g}, {ratio:.0f} times smaller "
      f"(the scale is 2^{int(np.log2(scale_now))} = {scale_now:.0f})")

# %% [markdown]
# ## Log the norm: a spike, and a flat zero
#
# The global norm costs one pass over the gradients (and the step above computes it
# anyway, for clipping), and it is the single most useful number to log every step,
# measured **before** clipping. Two signatures to know:
#
# - **a spike**: the norm jumps on the step a bad batch (corrupted data, a sudden learning
#   rate, a numerical blow-up) arrives. It is measured before the optimizer step, so it is
#   there *one step before* the damage shows in the loss: time to clip, skip or stop;
# - **a flat zero** for one group of parameters: their gradient never arrives. The graph is
#   cut somewhere upstream (a `detach()`, a `no_grad()`, a round trip through numpy,
#   lesson 05), and those parameters stop learning while the rest of the model carries on,
#   so the loss can still fall. It is not convergence: a converged model has small
#   gradients, not exactly zero ones.
#
# Four runs of a small two-layer regression on the course's tape engine, 80 steps of SGD,
# with the norm logged per layer and the loss measured on a fixed validation batch after
# every step. At step 40 one training batch arrives with its targets multiplied by 100.

# %%
def make_batch(seed, n=64):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8))
    return x, np.sin(2 * x[:, :1]) + 0.5 * x[:, 1:2]


def init_params(hidden=32, seed=0):
    rng = np.random.default_rng(seed)
    return {"layer1.w": rng.normal(0, 1 / np.sqrt(8), (8, hidden)), "layer1.b": np.zeros(hidden),
            "layer2.w": rng.normal(0, 1 / np.sqrt(hidden), (hidden, 1)), "layer2.b": np.zeros(1)}


def mse(params, x, y, detach_bug=False):
    h = F.tanh(Tensor(x) @ params["layer1.w"] + params["layer1.b"])
    if detach_bug:
        h = h.detach()                            # the bug: layer 1 is cut from the loss
    pred = h @ params["layer2.w"] + params["layer2.b"]
    return ((pred - Tensor(y)) ** 2).mean()


def train_logged(steps=80, lr=0.1, bad_step=None, detach_bug=False, clip=None):
    params = {k: Tensor(v, requires_grad=True) for k, v in init_params().items()}
    x_val, y_val = make_batch(seed=999)
    log = {"val_loss": [], "norm": [], "layer1": [], "layer2": []}
    for step in range(steps):
        x, y = make_batch(seed=step)
        if step == bad_step:
            y = y * 100.0                         # a corrupted batch
        for p in params.values():
            p.zero_grad()
        mse(params, x, y, detach_bug).backward()
        grads = {k: p.grad if p.grad is not None else np.zeros_like(p.data)
                 for k, p in params.items()}     # None: the gradient never arrived
        for layer in ("layer1", "layer2"):         # logged before clipping, as the norm
            log[layer].append(float(np.sqrt(sum(np.sum(g ** 2) for k, g in grads.items()
                                                if k.startswith(layer)))))
        norm = clip_global_norm(grads, clip if clip is not None else np.inf)
        log["norm"].append(norm)
        for k, p in params.items():
            p.data -= lr * grads[k]
        log["val_loss"].append(float(mse(params, x_val, y_val).data))
    return log


runs = {"healthy": train_logged(),
        "bad batch at step 40": train_logged(bad_step=40),
        "bad batch, clipped at 1": train_logged(bad_step=40, clip=1.0),
        "layer 1 detached": train_logged(detach_bug=True)}
for name, log in runs.items():
    print(f"{name:>24}: norm at steps 39-41 {np.round(log['norm'][39:42], 2)}, "
          f"validation loss {np.round(log['val_loss'][39:42], 3)}, "
          f"final {log['val_loss'][-1]:.3g}; layer-1 norm max {max(log['layer1']):.3g}")

# %%
fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
for name, log in list(runs.items())[:3]:
    axes[0].semilogy(log["norm"], label=name)
    axes[1].semilogy(log["val_loss"], label=name)
axes[0].set_title("global gradient norm (before clipping)")
axes[1].set_title("validation loss (after each step)")
for ax in axes[:2]:
    ax.axvline(40, color="gray", ls=":")
    ax.set_xlabel("step")
    ax.grid(True, alpha=0.3)
axes[1].legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)  # below
detached = runs["layer 1 detached"]
axes[2].plot(detached["layer1"], label="layer 1")
axes[2].plot(detached["layer2"], label="layer 2")
axes[2].plot(np.array(detached["val_loss"]) * 5, "k:", label="validation loss x 5")
axes[2].set_title("layer 1 detached: per-layer norms")
axes[2].set_xlabel("step")
axes[2].legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)  # below
axes[2].grid(True, alpha=0.3)
plt.show()

# %% [markdown]
# The bad batch shows up in the norm at step 40, two orders of magnitude above its usual
# level, while the validation loss of step 39 is still normal: the norm is measured before
# the step is taken. Unclipped, that one step throws the model far off and the loss
# explodes; clipped at 1, the step is an ordinary-sized step and the run barely notices.
# In the detached run, layer 1's norm is exactly zero at every step while layer 2 learns and
# the loss falls: only a per-group norm reveals that half the model is frozen.
#
# ## Exercise 12.3 · Read a norm log
#
# By eye, four runs are easy; a real job logs thousands of steps and dozens of groups, and
# a script reads the log. Write `summarize_norms(group_norms, spike_factor=10.0)`:
# `group_norms` maps a group's name to its norm at every step (lists of equal length, as
# `train_logged` keeps them). Return `(global_norms, spikes, frozen)`:
#
# - `global_norms`: the global norm of each step, from the group norms (the groups split
#   one gradient vector, so their *squares* add up);
# - `spikes`: the steps t ≥ 1 whose global norm exceeds `spike_factor` times the **median**
#   of the global norms of all earlier steps (a median, so that one odd step, a quiet one
#   or an earlier spike, does not move the yardstick; earlier only, because a monitor reads
#   the log while the run trains);
# - `frozen`: the names of the groups whose norm is exactly 0.0 at every step.
#
# The check reads the log of the plots above and five more, each built so that one
# tempting shortcut gives a different answer.

# %%
def summarize_norms(group_norms, spike_factor=10.0):
    """(global norm per step, steps of a spike, groups whose gradient never arrives)."""
    ### BEGIN SOLUTION
    squares = sum(np.square(np.asarray(norms, dtype=np.float64)) for norms in group_norms.values())
    global_norms = np.sqrt(squares)
    spikes = [t for t in range(1, len(global_norms))
              if global_norms[t] > spike_factor * np.median(global_norms[:t])]
    frozen = [name for name, norms in group_norms.items() if not np.any(norms)]
    return global_norms, spikes, frozen
    ### END SOLUTION

# %%
# CHECK 12.3
lesson12.check_summarize_norms(summarize_norms)

# %% [markdown]
# The four runs above, read by your function:

# %%
for name, log in runs.items():
    _, spikes, frozen = summarize_norms({"layer1": log["layer1"], "layer2": log["layer2"]})
    shown = ", ".join(map(str, spikes[:3])) + (", ..." if len(spikes) > 3 else "")
    print(f"{name:>24}: spikes at steps [{shown}]; frozen groups {frozen}")

# %% [markdown]
# Clipping does not hide the spike, because the norm is logged before it: the clipped run
# flags step 40 too, and only there. Unclipped, the run that follows the bad batch keeps
# spiking: the step threw the weights far off, and their gradients stay large. And the
# detached run names the group that never learns.

# %% [markdown]
# ## Data parallelism on a real MPI
#
# With n processes (ranks), each holds the whole model and takes 1/n of the batch. After the
# backward, each rank has the gradient of *its* share; the step needs the gradient of the
# whole batch. An **all-reduce** sums a buffer across ranks and leaves the sum on every
# rank. Three engineering points decide what it costs:
#
# - **mean, not sum, of the batch**: the loss is a mean over the global batch, so each rank
#   scales its loss by 1/n and the all-reduce *sums*: the sum of the ranks' gradients is the
#   gradient of the global mean. Every rank then takes the same step, and the weights stay
#   identical without ever being sent;
# - **overlap with the backward**: the backward produces the last block's gradients first.
#   Handing each block's gradients (a *bucket*) to a non-blocking all-reduce as soon as they
#   are final lets communication run while the backward computes the blocks below. Only the
#   optimizer step has to wait;
# - **synchronise on the last micro-batch only**: with gradient accumulation over K
#   micro-batches, an all-reduce after each one sends K times the bytes for the same sum.
#
# The engine implements all three (its MPI job, `engine/trainer/mpi_job.py`, and `mpiexec -n
# 2 python -m engine.train --data-parallel`). The script below measures them on the tiny GPT with two
# ranks. It is written to a temporary folder and launched with `mpiexec`, as you would from
# a terminal.

# %%
DEMO_DIR = Path(tempfile.mkdtemp(prefix="dp-demo-"))
DP_SCRIPT = DEMO_DIR / "dp_demo.py"

# %%
DP_SCRIPT.write_text('''\
"""Data parallelism on MPI, measured on the engine's GPT.

Run: mpiexec -n 2 python dp_demo.py result.json
Every rank holds the whole tiny model and takes its share of a global batch of
16 sequences; rank 0 writes what it measured to result.json.
"""
import json
import sys
import time

import numpy as np
from mpi4py import MPI

from engine.trainer.kernels.threads import set_threads
from engine.trainer.model import FusedGPT
from engine.gpt_config import tiny_config
from engine.trainer.mpi_job import GradientAllReduce

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
set_threads(1)                                    # the ranks share the cores

cfg = tiny_config(vocab_size=103)
B_GLOBAL, T, K = 16, 128, 4
B = B_GLOBAL // size
rows = slice(rank * B, (rank + 1) * B)            # this rank's share of every batch
rng = np.random.default_rng(0)                    # the same data on every rank
ids = rng.integers(0, cfg.vocab_size, size=(K, B_GLOBAL, T))
targets = rng.integers(0, cfg.vocab_size, size=(K, B_GLOBAL, T))
model = FusedGPT(cfg, B, seed=0)
grads = model.grads.flat
allreduce = GradientAllReduce(comm, grads)


def timed(fn, repeats=5):
    """Median seconds; a barrier lines the ranks up before each try."""
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def forward(k=0, scale=1.0 / size):
    model.forward(ids[k, rows], targets[k, rows], loss_scale=scale)


# 1. one all-reduce of the whole gradient buffer
t_allreduce = timed(lambda: comm.Allreduce(MPI.IN_PLACE, grads, op=MPI.SUM), repeats=10)


# 2. all-reduce after the backward, or buckets started during it
def forward_backward():
    forward()
    model.backward()


def backward_then_allreduce():
    forward()
    model.backward()
    comm.Allreduce(MPI.IN_PLACE, grads, op=MPI.SUM)


def backward_overlapped():
    forward()
    model.backward(grad_ready=allreduce.start)    # each block's bucket starts at once
    allreduce.wait()


t_fwd_bwd = timed(forward_backward)
t_sequential = timed(backward_then_allreduce)
t_overlapped = timed(backward_overlapped)


# 3. K micro-batches: reduce each one's gradient, or only the accumulated sum at the end;
#    count the bytes each way hands to the all-reduce (a count, unlike a time, does not
#    depend on how busy the machine is)
reduced = {"every": 0, "last": 0}


def sync_every_micro_batch():
    model.zero_grad()
    for k in range(K):
        before = grads.copy()
        forward(k, 1.0 / (K * size))
        model.backward()
        delta = grads - before                    # this micro-batch's own gradient
        comm.Allreduce(MPI.IN_PLACE, delta, op=MPI.SUM)
        reduced["every"] += delta.nbytes
        grads[...] = before + delta


def start_counted(start, stop):
    reduced["last"] += (stop - start) * grads.itemsize
    allreduce.start(start, stop)


def sync_last_only():
    model.zero_grad()
    for k in range(K):
        forward(k, 1.0 / (K * size))
        model.backward(grad_ready=start_counted if k == K - 1 else None)
    allreduce.wait()


t_every = timed(sync_every_micro_batch, repeats=3)
every = grads.copy()
t_last = timed(sync_last_only, repeats=3)
last = grads.copy()

# 4. rank 0 checks the sum against one process running the whole global batch
if rank == 0:
    single = FusedGPT(cfg, B_GLOBAL, seed=0)
    single.zero_grad()
    for k in range(K):
        single.forward(ids[k], targets[k], loss_scale=1.0 / K)
        single.backward()
    scale = float(np.abs(single.grads.flat).max())
    with open(sys.argv[1], "w") as f:
        json.dump({
            "ranks": size, "parameters": int(grads.size), "bytes": int(grads.nbytes),
            "micro_batches": K, "allreduce_s": t_allreduce, "forward_backward_s": t_fwd_bwd,
            "sequential_s": t_sequential, "overlapped_s": t_overlapped,
            "sync_every_s": t_every, "sync_last_s": t_last,
            "reduced_every_bytes": reduced["every"] // 3, "reduced_last_bytes": reduced["last"] // 3,
            "every_vs_last": float(np.abs(every - last).max()) / scale,
            "parallel_vs_single": float(np.abs(last - single.grads.flat).max()) / scale,
        }, f)
''')
print(f"wrote {DP_SCRIPT.name}")

# %% [markdown]
# Without MPI the same two claims can still be checked inside this process: the engine's
# `ThreadReplicas` runs two replicas of the model on two threads, each on its half of every
# micro-batch, and sums their gradients in a fixed order, which is the arithmetic the
# all-reduce does across ranks. The stand-in below measures what it can on them.

# %%
def data_parallel_in_process(n_replicas=2, B_GLOBAL=16, K=4):
    """The MPI script's two gradient checks (and timings) with thread replicas in place of ranks."""
    import time
    from engine.trainer.parallel import ThreadReplicas

    cfg = tiny_config(vocab_size=103)
    rng = np.random.default_rng(0)                # the script's data
    ids = rng.integers(0, cfg.vocab_size, size=(K, B_GLOBAL, cfg.block_size))
    targets = rng.integers(0, cfg.vocab_size, size=(K, B_GLOBAL, cfg.block_size))
    replicas = ThreadReplicas(cfg, B_GLOBAL, n_replicas, seed=0)
    reduced = {"every": 0, "last": 0}             # bytes of gradient summed, per way

    def counter(way):                             # called once per bucket a sum covers
        def count(start, stop):
            reduced[way] += (stop - start) * replicas.grads.flat.itemsize
        return count

    try:
        def sync_every_micro_batch():             # sum the replicas after every micro-batch
            total = np.zeros_like(replicas.grads.flat)
            for k in range(K):
                replicas.zero_grad()
                replicas.forward_backward(ids[k], targets[k], loss_scale=1.0 / K,
                                          grad_ready=counter("every"))
                total += replicas.grads.flat
            return total

        def sync_last_only():                     # each replica accumulates; one sum at the end
            replicas.zero_grad()
            for k in range(K):
                replicas.forward_backward(ids[k], targets[k], loss_scale=1.0 / K,
                                          last=k == K - 1, grad_ready=counter("last"))
            return replicas.grads.flat.copy()

        t0 = time.perf_counter()
        every = sync_every_micro_batch()
        t1 = time.perf_counter()
        last = sync_last_only()
        t2 = time.perf_counter()
    finally:
        replicas.close()
    single = FusedGPT(cfg, B_GLOBAL, seed=0)      # one process, the whole global batch
    single.zero_grad()
    for k in range(K):
        single.forward(ids[k], targets[k], loss_scale=1.0 / K)
        single.backward()
    scale = float(np.abs(single.grads.flat).max())
    return {"ranks": n_replicas, "bytes": int(last.nbytes), "micro_batches": K,
            "sync_every_s": t1 - t0, "sync_last_s": t2 - t1,
            "reduced_every_bytes": reduced["every"], "reduced_last_bytes": reduced["last"],
            "every_vs_last": float(np.abs(every - last).max()) / scale,
            "parallel_vs_single": float(np.abs(last - single.grads.flat).max()) / scale}


# %% [markdown]
# Launch it. The command is the same one you would type in a terminal. If `mpiexec` or
# `mpi4py` is missing, the in-process stand-in above checks the same two claims instead (the
# next cell says which one ran, and how to install MPI). The two processes load the kernels
# compiled above from numba's cache; a kernel not compiled yet (the all-reduce's helpers on a
# first run) is compiled by each process, so a first run takes longer: the cell says what
# it launches before it waits.

# %%
# NBVAL_IGNORE_OUTPUT
# Set the environment variable BACKPROP_NO_MPI=1 before starting Jupyter to take the
# in-process path even where MPI is installed (the tests use it to check both paths).
def find_mpiexec():
    beside_python = Path(sys.executable).parent / "mpiexec"
    return str(beside_python) if beside_python.exists() else shutil.which("mpiexec")


def mpi_available():
    if os.environ.get("BACKPROP_NO_MPI", "") not in ("", "0"):
        return False
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return find_mpiexec() is not None


MPI_OK = mpi_available()
if MPI_OK:
    print(f"launching: mpiexec -n 2 python {DP_SCRIPT.name} (two processes; up to a minute or "
          f"two on a first run) ...", flush=True)
    result_file = DEMO_DIR / "result.json"
    completed = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, str(DP_SCRIPT),
                                str(result_file)], capture_output=True, text=True, timeout=300)
    if completed.returncode != 0:
        print(completed.stdout[-2000:], completed.stderr[-2000:])
        raise RuntimeError(f"mpiexec failed with exit code {completed.returncode}")
    dp = json.loads(result_file.read_text())
else:
    print("no MPI here: two thread replicas in this process instead (about half a minute) ...",
          flush=True)
    dp = data_parallel_in_process()
print("done")

# %%
assert dp["reduced_every_bytes"] == dp["micro_batches"] * dp["bytes"]
assert dp["reduced_last_bytes"] == dp["bytes"]
print(f"data-parallel gradient equals one process on the whole batch "
      f"(largest difference below 1e-5 of the largest entry): {dp['parallel_vs_single'] < 1e-5}")
print(f"syncing every micro-batch and only the last give the same gradient "
      f"(below 1e-5): {dp['every_vs_last'] < 1e-5}")
print(f"bytes reduced per rank in one step of K = {dp['micro_batches']} micro-batches, counted: "
      f"sync every micro-batch {dp['reduced_every_bytes'] / dp['bytes']:.0f} x the "
      f"{dp['bytes'] / 1e6:.1f} MB gradient, sync the last only "
      f"{dp['reduced_last_bytes'] / dp['bytes']:.0f} x")

# %%
# NBVAL_IGNORE_OUTPUT
# (which path ran depends on what is installed; timings differ from run to run)
assert dp["parallel_vs_single"] < 1e-5, "the data-parallel gradient differs from one process's"
assert dp["every_vs_last"] < 1e-5, "syncing every micro-batch changed the gradient"
dp_ms = {k: 1e3 * v for k, v in dp.items() if k.endswith("_s")}
if MPI_OK:
    print(f"ran on {dp['ranks']} MPI processes; gradient buffer {dp['bytes'] / 1e6:.1f} MB")
    print(f"one all-reduce of {dp['bytes'] / 1e6:.1f} MB:        {dp_ms['allreduce_s']:7.2f} ms")
    print(f"forward + backward (8 sequences):     {dp_ms['forward_backward_s']:7.1f} ms")
    print(f"  then a blocking all-reduce:          {dp_ms['sequential_s']:7.1f} ms")
    print(f"  with buckets overlapped:             {dp_ms['overlapped_s']:7.1f} ms")
else:
    print(f"mpiexec or mpi4py is not installed (or BACKPROP_NO_MPI is set), so the claims were "
          f"checked in-process on {dp['ranks']} thread replicas, without any all-reduce.\n"
          "For the real thing install both with\n"
          "    pip install -e '.[mpi]'      (or: conda install -c conda-forge mpi4py mpich)\n"
          "and run the cell above again.")
print(f"K = {dp['micro_batches']} micro-batches, sync each: {dp_ms['sync_every_s']:7.1f} ms")
print(f"K = {dp['micro_batches']} micro-batches, last only: {dp_ms['sync_last_s']:7.1f} ms")

# %% [markdown]
# The bytes are counted, so they hold on any machine: syncing every micro-batch hands K
# times the gradient to the all-reduce for the same sum. The times are measured, and on a
# shared machine they wobble. With MPI, both ranks run on this one machine, so the
# all-reduce goes through shared memory and is cheap, typically around a percent of a
# forward and backward: overlap can hide at most that much here, and on a busy machine the
# measurement noise is as large (the in-process stand-in has no all-reduce at all: its
# replicas are summed in memory). So the claims about overlap below are made with a stated,
# simulated link instead of a measured one. Between
# machines the same buffer crosses a network. A ring all-reduce over n ranks sends and
# receives 2(n-1)/n times the buffer per rank, so its time is about that many bytes over the
# link's bandwidth:

# %%
def ring_allreduce_seconds(n_params, bytes_per_grad, ranks, link_gbit_per_s):
    return 2 * (ranks - 1) / ranks * n_params * bytes_per_grad / (link_gbit_per_s * 1e9 / 8)


for name, n_params, bytes_per in (("tiny GPT, fp32", P_TINY, 4), ("GPT-2 small, fp32", 124e6, 4),
                                  ("7B model, bf16", 7e9, 2)):
    for link in (10, 100):
        t = ring_allreduce_seconds(n_params, bytes_per, 8, link)
        print(f"{name:>18}, 8 ranks, {link:3d} Gbit/s: {t * 1e3:10.1f} ms per all-reduce")

# %% [markdown]
# Two seconds per step for a 7B model on a 100 Gbit/s link: that is why real trainers
# overlap the all-reduce with the backward, and why an all-reduce per micro-batch, K times
# per step, is not an option. On one CPU the reduction disappears into the accumulator
# (lesson 08), which is what the capstone trainer does.
#
# ## Exercise 12.4 · Buckets on a link
#
# The backward finishes the gradient in buckets, last block first (`gradient_buckets` of
# `engine.trainer.model`: the final layer norm, blocks L-1 ... 0, then the embeddings). A
# bucket can be sent once its own backward is done, while the backward of the layers
# below it still runs, but one link carries one bucket at a time. Write
# `bucket_schedule(backward_ms, bucket_bytes, link_bytes_per_ms)`: both lists are in
# backward order, `backward_ms[i]` is the time the backward spends producing bucket i
# (the backward runs the buckets one after another), `bucket_bytes[i]` its size, and an
# all-reduce moves `link_bytes_per_ms` bytes per millisecond (the ring's factor included).
# Return one `(start_ms, end_ms)` per bucket: when its all-reduce starts and ends, counted
# from the start of the backward. The optimizer may step when the last one ends.

# %%
def bucket_schedule(backward_ms, bucket_bytes, link_bytes_per_ms):
    """When each bucket's all-reduce runs on one link: [(start_ms, end_ms), ...]."""
    ### BEGIN SOLUTION
    ready = np.cumsum(backward_ms)
    schedule = []
    for i, size in enumerate(bucket_bytes):
        start = ready[i] if i == 0 else max(ready[i], schedule[-1][1])
        schedule.append((float(start), float(start + size / link_bytes_per_ms)))
    return schedule
    ### END SOLUTION

# %%
# CHECK 12.4
lesson12.check_bucket_schedule(bucket_schedule)

# %% [markdown]
# On the tiny GPT's real buckets, with stated times: the head's backward (the logits'
# matmuls) takes 10 ms before the first bucket, each block 20 ms, the embeddings 2 ms, and
# 8 ranks share a 1 Gbit/s link in a ring, so an all-reduce moves 1.25e5 / (2 · 7/8) bytes
# per ms. These are not measurements, so the numbers below are the same on any machine.

# %%
from engine.trainer.model import gradient_buckets

buckets = gradient_buckets(model.grads, cfg.n_layer)
bucket_names = (["final layer norm"] + [f"block {i}" for i in reversed(range(cfg.n_layer))]
                + ["embeddings (wte, wpe)"])
bucket_bytes = [(stop - start) * model.grads.flat.itemsize for start, stop in buckets]
backward_ms = [10.0] + [20.0] * cfg.n_layer + [2.0]
link = 1e9 / 8 / 1e3 / (2 * 7 / 8)                         # bytes per ms of an 8-rank ring
overlapped = bucket_schedule(backward_ms, bucket_bytes, link)
after_backward = bucket_schedule([sum(backward_ms)] + [0.0] * (len(buckets) - 1),
                                 bucket_bytes, link)      # every bucket ready at the end
for name, size, (t0, t1) in zip(bucket_names, bucket_bytes, overlapped):
    print(f"{name:>22}: {size / 1e3:6.1f} kB, sent {t0:6.1f} - {t1:6.1f} ms")
backward_end = sum(backward_ms)
print(f"backward ends at {backward_end:.0f} ms; the step can start at "
      f"{overlapped[-1][1]:.1f} ms with the buckets overlapped, at {after_backward[-1][1]:.1f} ms "
      f"with one all-reduce after the backward")
assert overlapped[-1][1] <= after_backward[-1][1]

# %%
fig, ax = plt.subplots(figsize=(9, 2.8))
lane = dict(height=0.6, edgecolor="white")       # one lane per row, with a gap between them
t = 0.0
for name, ms_ in zip(bucket_names, backward_ms):
    ax.barh(2, ms_, left=t, color="C0", **lane)
    t += ms_
for (t0, t1) in overlapped:
    ax.barh(1, t1 - t0, left=t0, color="C1", **lane)
for (t0, t1) in after_backward:
    ax.barh(0, t1 - t0, left=t0, color="C3", **lane)
ax.set_yticks([0, 1, 2], ["sends after\nthe backward", "sends\noverlapped",
                          "backward,\nbucket by bucket"])
ax.set_xlabel("ms from the start of the backward")
ax.set_title("Gradient buckets on one link (stated times, tiny GPT's bucket sizes)")
ax.grid(True, axis="x", alpha=0.3)
plt.show()

# %% [markdown]
# The blocks' buckets travel while the blocks below them are still in the backward; what is
# left after the backward is the queue on the link and the last bucket, the embeddings,
# which cannot go early: with tied embeddings `wte` receives the head's gradient at the
# start of the backward and the embedding's scatter-add at its very end. The slower the
# link, the more the sends queue up and the less the overlap hides; the faster the
# backward, likewise.
#
# ## Reading the failure modes
#
# When a step fails, the fault is rarely in the gradient formulas. It is in storage,
# scaling, or the order of accumulation around them, and each has a signature. Six runs
# follow, each with the evidence its log would show. The evidence is computed here on
# small stand-ins for real runs (the memory figures with `engine.budget`, lesson 07).

# %%
from engine import budget
from engine.precision import POLICIES, make_classification, round_to_fp16, train_classifier

evidence = {}

# Run A: gradient accumulation over K = 8 micro-batches of a linear model's MSE.
rng = np.random.default_rng(12)
xa, ya = rng.normal(size=(64, 5)), rng.normal(size=(64, 1))
wa = rng.normal(size=(5, 1))
full = 2 * xa.T @ (xa @ wa - ya) / 64
accumulated = sum(2 * xa[k::8].T @ (xa[k::8] @ wa - ya[k::8]) / 8 for k in range(8))
evidence["A"] = (f"K = 8 micro-batches of 8. Gradient norm: whole batch of 64 "
                 f"{np.linalg.norm(full):.3f}, accumulated {np.linalg.norm(accumulated):.3f} "
                 f"({np.linalg.norm(accumulated) / np.linalg.norm(full):.2f}x). Memory, "
                 f"precision and data are normal; the run diverges where the recipe did not.")

# Run B: memory of a GPT-2-small-shaped model in fp32 as the sequence grows.
mem = {n: budget.budget(budget.preset("gpt2-small", micro_batch=4, seq_len=n, block_size=4096))
       for n in (512, 1024, 2048, 4096)}
evidence["B"] = ("Fine up to N = 2048, out of a 24 GB device at N = 4096. Peak memory: "
                 + ", ".join(f"N={n} {b.peak / 1e9:.1f} GB" for n, b in mem.items())
                 + f"; from N=2048 to 4096 the peak grows "
                   f"{mem[4096].peak / mem[2048].peak:.1f}x.")

# Run C: the same seed twice; the embedding's additions arrive in two different orders.
ids_c = rng.integers(0, 50, size=4096)
g_c = rng.normal(size=(4096, 16)).astype(np.float32)
order_1, order_2 = rng.permutation(4096), rng.permutation(4096)
dE_1 = np.zeros((50, 16), np.float32)
dE_2 = np.zeros((50, 16), np.float32)
np.add.at(dE_1, ids_c[order_1], g_c[order_1])
np.add.at(dE_2, ids_c[order_2], g_c[order_2])
evidence["C"] = (f"Two runs, same seed, same data, same code, same machine. The embedding "
                 f"gradient of step 1 differs in {int(np.sum(dE_1 != dE_2))} of "
                 f"{dE_1.size} entries, by at most {np.abs(dE_1 - dE_2).max():.1e}, and only in "
                 f"rows of tokens that occur more than once.")

# Run D: 300 SGD steps on a small classifier with weights stored in bf16, no fp32 copy.
problem = make_classification()
log_fp32 = train_classifier(POLICIES["fp32"], problem, steps=300, lr=0.002)
log_bf16 = train_classifier(POLICIES["bf16 weights only"], problem, steps=300, lr=0.002)
evidence["D"] = (f"Weights stored in bf16. Loss over 300 steps: {log_bf16.losses[0]:.3f} -> "
                 f"{log_bf16.losses[-1]:.3f} (the same run in fp32: -> {log_fp32.losses[-1]:.3f}); "
                 f"on average {1 - np.mean(log_bf16.update_kept):.0%} of each update vanished "
                 f"in rounding. Gradient norms normal, no NaN.")

# Run E: GPT-2 small in fp32 at micro-batch 32, N = 1024.
big = budget.budget(budget.preset("gpt2-small", micro_batch=32, seq_len=1024))
evidence["E"] = (f"Out of memory at step 1, just after the forward of the first micro-batch "
                 f"completed, on a 24 GB device. Weights + gradients + AdamW state "
                 f"{big.fixed_total / 1e9:.1f} GB; peak predicted {big.peak / 1e9:.0f} GB. "
                 f"Sequence length is the recipe's N = 1024.")

# Run F: activations growing through a deep stack, stored in fp16.
activation = np.float32(3.0)
peak, layer = 0.0, 0
while np.isfinite(round_to_fp16(np.array([activation]))[0]):
    peak, activation, layer = float(activation), activation * np.float32(1.9), layer + 1
evidence["F"] = (f"Activations and gradients stored in fp16, no loss scaler. The largest "
                 f"activation grows layer by layer: {peak:,.0f} at layer {layer - 1}, then "
                 f"{float(activation):,.0f} at layer {layer}, stored as "
                 f"{round_to_fp16(np.array([activation]))[0]}; the loss is NaN from that step on.")

for run in sorted(evidence):
    print(f"Run {run}: {evidence[run]}\n")

# %% [markdown]
# ## Exercise 12.5 · Diagnose the runs
#
# For each run A-F, pick the cause its evidence points to, one of the keys of
# `lesson12.CAUSES` (each cause fits exactly one run). Return a dict like
# `{"A": "missing_div_k", ...}`. The check tells you which diagnosis is wrong and what its
# evidence says; when all six are right it prints the first move for each.

# %%
for key, meaning in lesson12.CAUSES.items():
    print(f"{key:>18}: {meaning}")

# %%
def diagnose():
    """Run letter -> cause key (one of lesson12.CAUSES)."""
    ### BEGIN SOLUTION
    return {"A": "missing_div_k", "B": "attention_scores", "C": "unordered_scatter",
            "D": "bf16_swallowed", "E": "activations", "F": "fp16_overflow"}
    ### END SOLUTION

# %%
# CHECK 12.5
lesson12.check_diagnose(diagnose)

# %% [markdown]
# ## What you built, and what it costs
#
# - **Global-norm clipping** (your piece `clip_global_norm`): one norm over every gradient,
#   one scale for all of them: the direction survives. Per-tensor clipping turned even a
#   real GPT gradient by a visible angle. Cost: one pass over the gradients (the engine
#   folds the scaling into the optimizer's pass).
# - **Fused AdamW** (your piece `adamw_step`): 28 bytes per parameter per step instead of a
#   dozen passes with temporaries.
# - **The order with mixed precision**, run on your lesson 09 pieces: unscale in fp32, let
#   the loss scaler skip or take the step, clip the unscaled gradient, step the fp32 master
#   weights. Clipping before unscaling makes every step `scale` times too small.
# - **The norm as a diagnostic** (your `summarize_norms`): a spike arrives before the
#   damage; a flat zero in one group means a cut graph, not convergence. Log it every step,
#   before clipping, per group when you can.
# - **Data parallelism**: each rank scales its loss by 1/n and the all-reduce sums;
#   buckets overlap with the backward (your `bucket_schedule`: each goes when its backward
#   is done and the link is free); synchronise only on the last micro-batch, K times fewer
#   bytes, counted. On one machine the all-reduce is cheap; across machines it is seconds
#   for large models.
# - **The failure modes**: out-of-memory, stalls, NaNs, K-times norms and irreproducible
#   gradients each point at one piece of the machinery around the gradient formulas.
#
# Lesson 13 puts the pieces together: the fused GPT trainer, run on your kernels where you
# wrote them and on the engine's elsewhere.
