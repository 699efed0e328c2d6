# %% [markdown]
# # 08 · Accumulation and checkpointing
#
# **Goals.** Lessons 06 and 07 showed that activations, not weights, decide whether a
# training step fits. This lesson builds the two standard ways to shrink them, and measures
# what each one costs. By the end you will have
# 1. seen why the gradient of a mean is the mean of the gradients, and written the
#    accumulation loop that turns K micro-batches of b examples into the exact gradient of
#    one batch of K x b;
# 2. met the classic bug, the missing /K, and its signature: a gradient norm exactly K times
#    too large;
# 3. measured that the activation peak follows the micro-batch b, not K x b, and what small
#    micro-batches cost in throughput;
# 4. written the backward of a checkpointed segment (recompute the forward from the saved
#    input, backpropagate through it) and plugged it into the engine;
# 5. measured a 5x lower activation peak for about a third more compute on a GPT, and
#    derived the exact peak of any checkpoint spacing, including the classic sqrt(L) rule
#    and when it applies.
#
# Every number below is measured on the engine's tape by `engine.memory`, or timed.
#
# **Your pieces in the engine.** Fills: the accumulation loop (08.1, `accumulate`; its check
# also runs it through the view of the fused model that lesson 13 trains with), checkpoint
# replay (08.2, `checkpoint_replay`) and the peak of a checkpointed stack (08.3,
# `checkpoint_peak`). Runs: your `checkpoint_replay` in every checkpointed GPT of this
# lesson after exercise 08.2 (a cell says whose replay runs; where yours is missing or breaks
# its slot's contract, the engine's `engine.recompute.replay` runs and the cell says why).
# No earlier pieces. (The whole map: CONTRIBUTING.md, "Exercise <-> slot".)

# %%
import re
import time

import numpy as np
import matplotlib.pyplot as plt

import engine
from engine import F, Tensor, memory, nn
from engine.accumulation import accumulate_gradients, grad_norm, split_batch
from engine.recompute import checkpoint, checkpoint_sequential, checkpointed, segments
from engine.gpt_config import GPTConfig, init_params
from coursework import lesson08
from widgets.memory_timeline import plot_timeline, timeline_points

lesson08.name_unfinished_exercises()   # a cell that needs an unfinished exercise says which

np.set_printoptions(precision=4, suppress=True)


def random_batch(cfg, batch, seed=0):
    """Token ids and next-token targets for `batch` sequences of the full context length."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, cfg.vocab_size, (batch, cfg.block_size))
    return ids, rng.integers(0, cfg.vocab_size, (batch, cfg.block_size))


def kb(n):
    return f"{n / 1024:,.1f} KiB"


def progress(what, done, total, started):
    """One line per finished round of a long measurement: how far, and about how long to go."""
    spent = time.perf_counter() - started
    print(f"  {what}: {done}/{total} done after {spent:.0f} s, about "
          f"{spent / done * (total - done):.0f} s left", flush=True)

# %% [markdown]
# ## Part A · Gradient accumulation
#
# A recipe asks for a batch of 512 sequences; the machine holds 8. One observation settles
# it. The loss of a batch is the *mean* of the per-example losses, and differentiation is
# linear, so
#
# $$\nabla \frac{1}{Kb}\sum_{i=1}^{Kb} \ell_i \;=\; \frac{1}{K}\sum_{k=1}^{K}\,\nabla\Big(\frac{1}{b}\sum_{i \in \text{micro-batch } k} \ell_i\Big).$$
#
# The gradient of the big batch's mean is the mean of the K micro-batch gradients. And the
# engine already adds: a leaf's `.grad` *accumulates* over backward calls until
# `zero_grad()` (lesson 02). So: zero once, then for each micro-batch run forward and
# backward on `loss / K`, and `.grad` ends up holding the big batch's gradient, while the
# tape only ever holds one micro-batch.
#
# A check in float64 on a small GPT: the gradient of a batch of 8 sequences, computed in one
# go and as K micro-batches, with `engine.accumulation.accumulate_gradients`.

# %%
cfg = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32)
model = nn.GPT(cfg, init_params(cfg, seed=0, dtype=np.float64))
params = model.parameters()
ids, targets = random_batch(cfg, 8)

full_loss = accumulate_gradients(params, lambda b: model(*b), [(ids, targets)])
full_grads = {name: p.grad.copy() for name, p in params.items()}
print(f"one batch of 8: loss {full_loss:.6f}")
for K in (2, 4, 8):
    loss = accumulate_gradients(params, lambda b: model(*b), split_batch(ids, targets, K))
    worst = max(np.max(np.abs(p.grad - full_grads[n])) / np.max(np.abs(full_grads[n]))
                for n, p in params.items())
    print(f"K={K} micro-batches of {8 // K}: loss {loss:.6f}, gradients equal to the full "
          f"batch's within 1e-12 (relative): {worst < 1e-12}")

# %% [markdown]
# Not approximately equal: equal up to the last few bits of float64 (the sums are only done
# in a different order). One condition hides in the formula: every micro-batch must hold the
# same number of examples, or the mean of the means is not the mean; `split_batch` refuses
# uneven splits.
#
# ## Exercise 08.1 · The accumulation loop
#
# Write `accumulate(model, micro_batches)`. `micro_batches` is a list of `(ids, targets)`
# pairs, `model(ids, targets)` returns the mean loss of that micro-batch as a scalar
# Tensor, `model.zero_grad()` clears every parameter's `.grad`. Leave in every parameter's
# `.grad` the gradient of the mean loss over all micro-batches, and return that mean loss
# (a Python float; `loss.item()` reads a scalar Tensor).
#
# **The contract.** Lesson 13 runs this same loop on the fused trainer, whose gradients
# live in one flat buffer, through a view that offers only what is listed here:
# `model(ids, targets)`, `model.zero_grad()`, and on a loss `/` and `*` by a number,
# `.backward()` and `.item()`. So use nothing else: no `model.parameters()`, no `.grad`,
# no `.data`. (Dividing every `.grad` by K after the loop would be right on the tape, but
# there is no `.grad` to divide in lesson 13: scale the loss before its backward.)

# %%
def accumulate(model, micro_batches):
    """Leave in every .grad the gradient of the mean loss over all the micro-batches,
    whatever .grad held before; return that mean loss as a float."""
    ### BEGIN SOLUTION
    model.zero_grad()
    K = len(micro_batches)
    total = 0.0
    for ids, targets in micro_batches:
        loss = model(ids, targets)
        (loss / K).backward()
        total += loss.item()
    return total / K
    ### END SOLUTION


# %%
# CHECK 08.1
lesson08.check_accumulate(accumulate)

# %% [markdown]
# ## The /K bug
#
# Forget the division and each micro-batch contributes its full mean gradient: the sum of K
# gradients is K times their mean, always, whether the micro-batches agree or not (the
# mean of K gradients is their sum over K). The optimizer then takes K times the intended
# step, the same as
# multiplying the learning rate by K. Nothing crashes; the run just behaves like a
# different, usually unstable, recipe. The fingerprint is in the gradient norm you log
# every step (lesson 12):

# %%
reference_norm = float(np.sqrt(sum(np.sum(g ** 2) for g in full_grads.values())))
print(f"{'K':>3} {'norm with /K':>14} {'norm without /K':>16} {'ratio':>7}")
for K in (1, 2, 4, 8):
    micro = split_batch(ids, targets, K)
    accumulate_gradients(params, lambda b: model(*b), micro)
    right = grad_norm(params)
    accumulate_gradients(params, lambda b: model(*b), micro, divide_by_k=False)
    wrong = grad_norm(params)
    print(f"{K:>3} {right:>14.6f} {wrong:>16.6f} {wrong / right:>7.3f}")

# %% [markdown]
# The ratio is not "about K": the gradients without /K are exactly K times the right ones,
# so if a run's gradient norm jumped by the accumulation factor when you turned accumulation
# on, you know where to look. The other classic mistake, zeroing inside the loop, gives the
# gradient of the last micro-batch only; forgetting to zero at all adds the previous step's
# gradients (the check of 08.1 recognises all three).
#
# ## Peak memory follows the micro-batch
#
# Each micro-batch's backward frees what its forward saved before the next micro-batch
# starts, so the tape's peak is that of one micro-batch. Measured:

# %%
print(f"{'K':>3} {'micro-batch':>12} {'measured peak':>15} {'formula for b':>15}")
for K in (1, 2, 4, 8):
    with memory.record() as mem:
        accumulate_gradients(params, lambda b: model(*b), split_batch(ids, targets, K))
    b = 8 // K
    formula = nn.gpt_saved_bytes(cfg, b, cfg.block_size, np.float64)
    print(f"{K:>3} {b:>12} {kb(mem.peak_bytes):>15} {kb(formula):>15}")
    if K == 4:
        mem_k4 = mem

fig, ax = plt.subplots(figsize=(8, 3))
plot_timeline(timeline_points(mem_k4), ax=ax)
ax.set_title("K = 4 micro-batches of 2: four humps, each one micro-batch high")
plt.show()

# %% [markdown]
# The effective batch is K x b; the activation memory is that of b. What accumulation adds is
# one buffer: the gradients, P numbers, which training needs anyway.
#
# ## What small micro-batches cost
#
# Accumulation is not free in time. K small forward and backward passes do the same
# arithmetic as one big one, but less efficiently: every op pays a fixed cost (Python, the
# tape, numpy's dispatch) per call, and a small matmul cannot keep the CPU's vector units
# and caches as busy as a large one. Below, the same 16 sequences per optimizer step, run
# as K micro-batches of 16/K, in float32 on a wider model.

# %%
# NBVAL_IGNORE_OUTPUT
# (timings differ from run to run and machine to machine)
speed_cfg = GPTConfig(vocab_size=64, block_size=64, n_layer=2, n_head=4, n_embd=64)
speed_model = nn.GPT(speed_cfg, init_params(speed_cfg, seed=1))
speed_ids, speed_targets = random_batch(speed_cfg, 16, seed=1)
speed_params = speed_model.parameters()


def step_seconds(K):
    micro = split_batch(speed_ids, speed_targets, K)
    t0 = time.perf_counter()
    accumulate_gradients(speed_params, lambda b: speed_model(*b), micro)
    return time.perf_counter() - t0


# Single-threaded numpy kernels and one BLAS thread (engine.timing.fixed_threads): we compare
# amounts of work, and multi-threaded kernels on a busy machine make timings jumpy. Rounds
# interleave the K values, so a busy moment hits all of them alike; the best of 5 rounds counts.
from engine.timing import fixed_threads

tokens = 16 * speed_cfg.block_size
with engine.kernels.use("numpy"), fixed_threads(1):
    step_seconds(1)                    # warm-up: first calls pay one-time costs
    best = {K: float("inf") for K in (1, 2, 4, 8, 16)}
    started = time.perf_counter()
    for round_ in range(1, 6):
        for K in best:
            best[K] = min(best[K], step_seconds(K))
        progress("rounds over K = 1, 2, 4, 8, 16", round_, 5, started)
    # the split changes the time, never the result: K=16 accumulates K=1's gradient
    grads_k = {}
    for K in (1, 16):
        step_seconds(K)
        grads_k[K] = {n: p.grad.copy() for n, p in speed_params.items()}
assert all(np.allclose(grads_k[16][n], g, rtol=1e-4, atol=1e-5 * np.abs(g).max())
           for n, g in grads_k[1].items()), "16 micro-batches of 1 changed the gradient"
rates = {K: tokens / seconds for K, seconds in best.items()}
for K, seconds in best.items():
    print(f"K={K:>2} micro-batches of {16 // K:>2}: {seconds * 1e3:7.1f} ms per step, "
          f"{rates[K]:8,.0f} tokens/s, {rates[K] / rates[1]:.2f}x the K=1 throughput")

fig, ax = plt.subplots(figsize=(6, 2.8))
ax.bar([f"b={16 // K}" for K in rates], [r / rates[1] for r in rates.values()])
ax.set_ylabel("throughput / throughput at b=16")
ax.set_title("Same batch of 16 per step, split into smaller micro-batches")
plt.show()

# %% [markdown]
# Read the bars from left to right. On a CPU a moderate split often costs little or even
# nothing: a smaller micro-batch's activations fit better in the caches, which can offset
# the extra calls (on a busy machine neighbouring bars can swap by a few percent). The
# smallest micro-batches usually lose clearly: every op's fixed cost is paid K times, and a
# matmul over a handful of rows cannot keep the vector units busy. On an accelerator, whose
# speed comes from large matmuls, the loss starts much earlier.
# Accumulation trades throughput for the ability to run a large-batch recipe at all, so the
# rule is: use the largest micro-batch that runs efficiently and fits, and accumulate only the
# rest of the way to the batch size the recipe needs.
#
# ## Part B · Activation checkpointing
#
# Accumulation shrinks the batch the tape holds. Checkpointing shrinks what the tape holds
# *per example*: keep the input of each segment (a block, or a run of blocks), throw away
# everything inside, and when the backward pass reaches the segment, run its forward again
# from the kept input, use the regenerated insides for the VJPs, and free them again.
#
# `engine.recompute.checkpoint(fn, x)` records this as **one** node on the tape:
#
# * forward: run `fn(x)` under `no_grad()`, so nothing inside is recorded or saved; the node
#   saves only `x`;
# * backward: when the walk reaches the node with the gradient `g` of the segment's output,
#   recompute `fn` on the saved `x` with recording on, call `backward(g)` on the recomputed
#   output, and pass the gradient of `x` on to the rest of the tape. The segment's
#   parameters are leaves, so that inner backward accumulates their gradients directly.
#
# Watch it on one small segment: the function runs twice, the second time during backward.

# %%
rng = np.random.default_rng(0)
w = Tensor(rng.normal(size=(4, 4)) / 2, requires_grad=True, name="w")
runs = []


def segment(x):
    runs.append("recording" if engine.tensor.is_grad_enabled() else "not recording")
    return F.tanh(x @ w) @ w


x = Tensor(rng.normal(size=(3, 4)), requires_grad=True)
with memory.record() as mem:
    h = F.tanh(x)                  # an earlier layer, outside the segment
    y = checkpoint(segment, h)
    print("after the forward, segment ran:", runs)
    print("saved by the forward:", [(s.op, s.slot, s.shape) for s in mem.saved])
    (y ** 2).sum().backward()
print("after the backward, segment ran:", runs)

# %% [markdown]
# Before the backward the tape held two entries, and they are one buffer: tanh's output
# (which tanh's own VJP needs) and the same array as the checkpoint's input. Nothing from
# inside the segment (no `x @ w`, no second tanh) was kept.
#
# ## Exercise 08.2 · The checkpointed segment's backward
#
# Write `checkpointed_backward(fn, saved_input, grad_output)`: `saved_input` is the ndarray
# the checkpoint kept, `grad_output` the gradient arriving at the segment's output. Recompute
# the segment and backpropagate through it; return the gradient of the input (an ndarray).
# Two details decide whether the recompute yields a gradient at all; the demo above holds
# the clues. The backward pass may run with recording switched off (`engine.no_grad()`;
# `engine.enable_grad()` is its opposite): what must be on while `fn` runs again, and what
# happens to an op you run after that? And the answer is some Tensor's `.grad`: which one,
# and what must be true of it when you create it? Then: which gradient do you send back
# through the recomputed output, the one that reached the segment or a fresh one?

# %%
def checkpointed_backward(fn, saved_input, grad_output):
    """The gradient of the loss with respect to the segment's input (an ndarray shaped like
    saved_input); the segment's parameters get their gradients on the way."""
    ### BEGIN SOLUTION
    x = Tensor(saved_input, requires_grad=True)
    with engine.enable_grad():
        out = fn(x)
    out.backward(grad_output)
    return x.grad
    ### END SOLUTION


# %%
# CHECK 08.2
lesson08.check_checkpointed_backward(checkpointed_backward)

# %% [markdown]
# The check also ran a GPT with every block checkpointed *by your function*:
# `checkpointed(model, "every", replay_fn=checkpointed_backward)` swaps the model's blocks
# for checkpointed segments that call it. From here on, every checkpointed GPT of this
# lesson runs your saved piece the same way. `piece_or_engine` loads it fresh from its
# file, runs it first on its slot's contract (a segment replayed under `no_grad`, and a
# checkpointed 2-block GPT against the plain one) and falls back to the engine's own
# version, `engine.recompute.replay`, saying why, when the piece is missing or breaks the
# contract.

# %%
# NBVAL_IGNORE_OUTPUT
# (whose replay runs depends on the pieces you saved; a solution notebook saves its own)
from coursework.pieces import piece_or_engine
from engine.recompute import replay

replay_fn, replay_owner = piece_or_engine("checkpoint_replay", "08.2", replay)
print(f"checkpoint replay in the checkpointed GPTs below: {replay_owner}")

# %% [markdown]
#
# ## The peak, measured on an 8-block GPT
#
# Three policies: no checkpointing, a checkpoint at every block, and one every
# round(sqrt(8)) = 3 blocks. All three must give the same gradients (float64).

# %%
gcfg = GPTConfig(vocab_size=32, block_size=32, n_layer=8, n_head=4, n_embd=32)
gparams = init_params(gcfg, seed=2, dtype=np.float64)
gids, gtargets = random_batch(gcfg, 4, seed=2)
results = {}
for policy in ("none", "every", "sqrt"):
    gpt = nn.GPT(gcfg, gparams)
    with memory.record() as mem:
        with checkpointed(gpt, policy, replay_fn=replay_fn):
            loss = gpt(gids, gtargets)
        loss.backward()
    results[policy] = (mem, gpt.grads())
plain_mem, plain_grads = results["none"]
for policy, (mem, grads) in results.items():
    same = all(np.allclose(grads[n], plain_grads[n], rtol=1e-12, atol=0) for n in plain_grads)
    print(f"{policy:>5}: peak {kb(mem.peak_bytes):>11}, {plain_mem.peak_bytes / mem.peak_bytes:4.1f}x "
          f"lower than plain; same gradients as plain: {same}")

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2), sharey=True)
plot_timeline(timeline_points(results["none"][0]), ax=axes[0])
plot_timeline(timeline_points(results["every"][0]), ax=axes[1])
axes[0].set_title("no checkpointing")
axes[1].set_title("checkpoint every block: the recompute spikes in the backward")
plt.show()

# %% [markdown]
# Without checkpointing, the live bytes climb through the forward to the full activation
# stack and drain through the backward. With a checkpoint per block, the forward keeps
# eight block inputs (plus the head and the loss); in the backward, each block's insides
# reappear for a moment (a spike), are consumed by their VJPs and freed before the next
# block is recomputed. The peak is now one block's insides on top of the kept inputs.
#
# The budget calculator of lesson 07 predicts exactly this peak with `recompute="full"`:

# %%
from engine import budget

float32_gpt = nn.GPT(gcfg, init_params(gcfg, seed=2))   # the budget counts fp32 bytes
with memory.record() as mem32:
    with checkpointed(float32_gpt, "every", replay_fn=replay_fn):
        loss = float32_gpt(gids, gtargets)
    loss.backward()
bcfg = budget.BudgetConfig(n_layer=gcfg.n_layer, d_model=gcfg.n_embd, n_head=gcfg.n_head,
                           vocab_size=gcfg.vocab_size, micro_batch=4, seq_len=gcfg.block_size,
                           activation_model="engine", recompute="full")
predicted = budget.activations(bcfg).peak
print(f"measured peak {kb(mem32.peak_bytes)}; engine.budget predicts {kb(predicted)}; "
      f"equal to the byte: {mem32.peak_bytes == predicted}")

# %% [markdown]
# ## What it costs in compute
#
# A training step is a forward (1 unit of work) and a backward (2 units: two matmuls for
# every forward one). Checkpointing every block runs each block's forward a second time
# inside the backward: one more unit for the blocks, so about 4/3 of the step, +33%. Our
# checkpoints leave the embedding and the output head alone, so the prediction is a little
# below 33%. Count the FLOPs, then time it.

# %%
def predicted_overhead(cfg):
    """Extra FLOPs of recomputing every block once, over a plain step's 3 forward units."""
    T, C, V, L = cfg.block_size, cfg.n_embd, cfg.vocab_size, cfg.n_layer
    block = 2 * (3 * C * C + C * C + 8 * C * C) + 2 * 2 * T * C   # per token: matmuls + attention
    head = 2 * C * V
    return L * block / (3 * (L * block + head))


print(f"predicted extra compute of checkpointing every block of the 8-block GPT: "
      f"+{predicted_overhead(gcfg):.1%}")

# %%
# NBVAL_IGNORE_OUTPUT
# (timings differ from run to run and machine to machine)
tcfg = GPTConfig(vocab_size=64, block_size=64, n_layer=4, n_head=4, n_embd=128)
timed_model = nn.GPT(tcfg, init_params(tcfg, seed=3))
tids, ttargets = random_batch(tcfg, 8, seed=3)


def step_time(policy):
    """(forward seconds, backward seconds) of one step under a checkpoint policy."""
    timed_model.zero_grad()
    t0 = time.perf_counter()
    with checkpointed(timed_model, policy, replay_fn=replay_fn):   # yours, or the engine's
        loss = timed_model(tids, ttargets)
    t1 = time.perf_counter()
    loss.backward()
    return t1 - t0, time.perf_counter() - t1


with engine.kernels.use("numpy"), fixed_threads(1):   # as in the accumulation timing above
    step_time("none"), step_time("every")   # warm-up
    best = {"none": (float("inf"),) * 2, "every": (float("inf"),) * 2}
    started = time.perf_counter()
    for round_ in range(1, 6):         # interleaved rounds, the fastest of 5 counts
        for policy in best:
            best[policy] = min(best[policy], step_time(policy), key=sum)
        progress("rounds over plain and checkpointed", round_, 5, started)
    # the recompute changes the time, never the result: both policies give the same gradient
    step_time("none")
    plain_grads = {n: p.grad.copy() for n, p in timed_model.parameters().items()}
    step_time("every")
assert all(np.allclose(p.grad, plain_grads[n], rtol=1e-5, atol=1e-6 * np.abs(plain_grads[n]).max())
           for n, p in timed_model.parameters().items()), "checkpointing changed the gradient"
(f_plain, b_plain), (f_ckpt, b_ckpt) = best["none"], best["every"]
print(f"plain step:        forward {f_plain * 1e3:6.1f} ms + backward {b_plain * 1e3:6.1f} "
      f"ms (backward/forward = {b_plain / f_plain:.2f})")
print(f"checkpoint/block:  forward {f_ckpt * 1e3:6.1f} ms + backward {b_ckpt * 1e3:6.1f} "
      f"ms (the backward now includes the recompute)")
print(f"extra time: +{(f_ckpt + b_ckpt) / (f_plain + b_plain) - 1:.0%} measured; "
      f"+{predicted_overhead(tcfg):.0%} predicted from FLOPs")

# %% [markdown]
# The FLOP count says +33% because it assumes the backward costs twice the forward. Read the
# measured ratio above: in this small numpy engine the backward is usually cheaper than
# that (the forward's exp and tanh are the expensive elementwise work, and the backward
# reuses what the forward saved), so one more forward is a larger share of the step, and
# the measured overhead tends to come out above +33%. At the sizes of real models matmuls
# dominate both passes, the 2:1 ratio holds and so does +33%. Either way, the trade is: here
# about 5x less activation memory for roughly a third to a half more time (a busy machine
# can push one measurement outside that range; the memory figure does not move).
#
# ## Choosing the boundaries
#
# Why a checkpoint at *every* block, when the classic result says every sqrt(L) blocks? Let
# `a` be the bytes of one boundary (a segment's saved input) and `b` the bytes one block
# saves inside. Checkpoint every k blocks: the forward keeps ceil(L/k) boundaries; the
# backward walks the segments from the last to the first, and while it is inside segment j
# (counting from 0 in forward order) the boundaries 0..j are still kept (the later ones are
# freed once their segments are done) and segment j's recomputed insides are live.
#
# ## Exercise 08.3 · The peak of a checkpointed stack
#
# Write `checkpoint_peak(n_blocks, k, boundary_bytes, block_bytes)`: the activation peak the
# tape measures for `n_blocks` blocks checkpointed in segments of `k` (the last segment may be
# shorter), when nothing else is saved. The check compares your formula with the engine's
# measurement, to the byte.

# %%
def checkpoint_peak(n_blocks, k, boundary_bytes, block_bytes):
    """Peak activation bytes of n_blocks blocks checkpointed every k blocks."""
    ### BEGIN SOLUTION
    peak = 0
    for j, start in enumerate(range(0, n_blocks, k)):
        blocks_in_segment = min(k, n_blocks - start)
        peak = max(peak, (j + 1) * boundary_bytes + blocks_in_segment * block_bytes)
    return peak
    ### END SOLUTION


# %%
# CHECK 08.3
lesson08.check_checkpoint_peak(checkpoint_peak)

# %% [markdown]
# When k divides L, the peak is `(L/k)·a + k·b`, which is smallest at `k = sqrt(L·a/b)`.
# That is where "sqrt(L)" comes from: it is the best spacing when a block saves about as much
# as its input (`b ≈ a`). A GPT block saves far more than its input (`16·B·T·C + B·H·T²`
# elements against `B·T·C`, `b/a` about 20 here), so the best k is 1: a checkpoint at every
# block. Two stacks, measured for every k and set against your formula:
#
# * 16 GPT blocks (b/a large);
# * 16 layers of `tanh`, each saving just its output, so `b = a`.

# %%
def measured_peaks(blocks, x0, ks):
    peaks = []
    for k in ks:
        # x * 1.0: an input that needs a gradient but is not a leaf, like the output of
        # earlier layers (a leaf that requires grad would count as a parameter)
        x = Tensor(x0, requires_grad=True) * 1.0
        with memory.record() as mem:
            checkpoint_sequential(blocks, x, k, replay_fn=replay_fn).sum().backward()
        peaks.append(mem.peak_bytes)
    return peaks


ks = list(range(1, 17))
scfg = GPTConfig(vocab_size=4, block_size=16, n_layer=16, n_head=2, n_embd=16)
sparams = {n: Tensor(v, requires_grad=True, name=n) for n, v in init_params(scfg, seed=4).items()}
gpt_blocks = [nn.Block(scfg, sparams, i) for i in range(16)]
x_gpt = np.random.default_rng(5).normal(size=(2, 16, 16)).astype(np.float32)
a_gpt, b_gpt = x_gpt.nbytes, nn.block_saved_bytes(2, 16, 16, 2, np.float32)

tanh_layers = [lambda t: F.tanh(t) for _ in range(16)]
x_tanh = np.random.default_rng(6).normal(size=(64, 64)).astype(np.float32)
a_tanh = b_tanh = x_tanh.nbytes

fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
for ax, (title, blocks, x0, a, b) in zip(axes, (
        ("16 GPT blocks (b/a = %.0f)" % (b_gpt / a_gpt), gpt_blocks, x_gpt, a_gpt, b_gpt),
        ("16 tanh layers (b = a)", tanh_layers, x_tanh, a_tanh, b_tanh))):
    measured = measured_peaks(blocks, x0, ks)
    predicted = [checkpoint_peak(16, k, a, b) for k in ks]
    best = [k for k, m in zip(ks, measured) if m == min(measured)]
    print(f"{title}: lowest peak at k = {best}; no checkpointing {kb(16 * b)}, lowest "
          f"{kb(min(measured))}; formula matches every measurement: {measured == predicted}")
    ax.plot(ks, [m / 1024 for m in measured], "o", label="measured")
    ax.plot(ks, [p / 1024 for p in predicted], "-", label="checkpoint_peak")
    ax.axhline(16 * b / 1024, color="gray", ls=":", label="no checkpointing")
    ax.set_xlabel("k (blocks per segment)"), ax.set_ylabel("peak KiB"), ax.set_title(title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3)  # below
plt.show()

# %% [markdown]
# For the tanh chain the lowest peak sits around k = 4 = sqrt(16) (its neighbours tie with
# it, because their short last segment leaves room); for the GPT it is at k = 1. Both come
# from the same formula. Note k = 1 on the tanh chain: a checkpoint per layer keeps 16
# inputs, exactly as many bytes as the layers saved themselves, plus a recompute: worse
# than not checkpointing at all. Which segments to checkpoint is the same kind of question
# asked op by op: a piece whose forward is cheap but whose saved tensors are large (a layer
# norm, the attention probabilities of size B·H·T²) is a good thing to recompute; a piece
# with an expensive forward and a small output is a bad one. Recomputing only the attention
# core is the "selective recompute" setting of lesson 07's calculator.
#
# ## What the recompute must reproduce
#
# A checkpoint is only correct if the second forward computes the same function as the
# first. Three ways it can fail, and what the engine does about them:
#
# * **randomness**: dropout draws a new mask each time unless seeded; `F.dropout(x, p,
#   seed)` takes an explicit seed, so the recompute draws the same mask;
# * **in-place changes** to a kept input between forward and backward: the tape's version
#   counter catches them (below);
# * **side effects or changed state** inside the segment (a counter, data read from outside
#   that changes): nothing can catch those; keep segments pure.

# %%
h = Tensor(np.ones((2, 2)), requires_grad=True) * 1.0   # an intermediate result
y = checkpoint(lambda t: t @ w[:2, :2], h)
with engine.no_grad():
    h += 1.0          # changes the kept input after the forward
try:
    y.sum().backward()
except RuntimeError as err:
    message = re.sub(r" \(node #\d+\)", "", str(err))   # node numbers vary
    print("RuntimeError:", message.split(", so")[0])

# %% [markdown]
# ## What you built, what it costs
#
# * `accumulate`: K micro-batches with `loss / K` give the exact gradient of a batch of
#   K x b (float64, to 1e-12). Cost: the activation peak of one micro-batch, the gradient
#   buffer you need anyway, and throughput (small matmuls and per-op overhead: measured
#   above). Forgetting /K multiplies the gradient, and its norm, by exactly K.
# * `checkpointed_backward`: the recompute at the heart of checkpointing, and the replay
#   every checkpointed model after exercise 08.2 ran. On an 8-block GPT,
#   a checkpoint per block cut the measured activation peak about 5x, for one extra forward
#   of the blocks: +33% predicted (the head, left out of the recompute, is tiny here), and
#   measured close to it.
# * `checkpoint_peak`: the exact peak of any spacing; sqrt(L) is the best spacing only when a
#   block saves about as much as its input; for transformer blocks, checkpoint every block.
# * On a CPU with plenty of RAM, checkpointing often solves a problem you do not have, at a
#   real compute price: prefer the largest micro-batch that fits, accumulate to the batch
#   size you need, and checkpoint only when memory, not time, is what runs out.
