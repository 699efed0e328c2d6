# %% [markdown]
# # 13 · The fused CPU trainer
#
# **Goals.** By the end of this lesson you will have
# 1. assembled the GPT trainer from the pieces you wrote in lessons 10-12, with the engine's
#    kernels filling every gap, and seen exactly whose code runs where;
# 2. written the training step itself, with its division of labour: zero, loss, backward,
#    clip and update (exercise 13.1);
# 3. trained a small GPT on the Python documentation, on this CPU, with a live loss curve
#    and tokens per second;
# 4. compared the budget's prediction (lesson 07) with the step you measured;
# 5. read text the model wrote before and after training.
#
# Everything in this lesson runs on `engine.trainer.model`: the GPT-2 style model of the design
# (learned positions, pre-LayerNorm, causal attention, tanh-GELU MLP, tied embedding) on
# the fused numba kernels, with its parameters and gradients in two flat buffers and every
# activation laid out once, so a step allocates nothing.

# %%
import os
os.environ.setdefault("OMP_WAIT_POLICY", "passive")   # see lesson 10: threads wait asleep

import math
import time

import numpy as np
import matplotlib.pyplot as plt

from engine import budget
from engine.trainer import kernels as fused
from engine.trainer.data import Dataset, batch_at, builtin_text, eval_batches, unigram_entropy
from coursework import lesson13
from engine.trainer.model import FusedGPT, decay_segments, kernel_owners, reset_kernels, use_kernel
from engine.gpt_config import tiny_config
from engine.trainer.optim import lr_at
from engine.train import sample
from widgets.trainer import TrainerDashboard

np.set_printoptions(precision=4, suppress=True)

# %% [markdown]
# ## The corpus and the model
#
# The built-in corpus is the Python documentation that ships inside CPython, split into
# characters; 90% trains, 10% is held out for validation. The model is the `tiny` config:
# T = 128 characters of context, 4 layers, 4 heads, width 128, micro-batch of 16 sequences.
#
# One number to keep in mind: the **unigram entropy** of the characters, the loss of a
# model that knows only how often each character occurs and ignores all context. A model
# that beats it has learned something about *sequences*.

# %%
reset_kernels()                                  # start from the engine's own kernels
dataset = Dataset.from_text(builtin_text(), val_fraction=0.1)
tokenizer = dataset.tokenizer
cfg = tiny_config(tokenizer.vocab_size)
B, T = 16, cfg.block_size
entropy = unigram_entropy(dataset.train, tokenizer.vocab_size)
print(f"{len(dataset.train):,} training and {len(dataset.val):,} validation characters, "
      f"vocabulary V = {tokenizer.vocab_size}")
print(f"model: T={cfg.block_size}, L={cfg.n_layer}, H={cfg.n_head}, C={cfg.n_embd}; "
      f"micro-batch B={B}, {B * T} tokens per step")
print(f"a uniform guess costs ln V = {math.log(tokenizer.vocab_size):.3f} nats per character; "
      f"the unigram entropy is {entropy:.3f}")

# %% [markdown]
# ## Whose pieces run
#
# Five of your exercises replace a part of the trainer. Each was saved as a *piece* in
# `course/my_pieces/` when its check passed; the report below says which of them exist on
# this machine. Anything you have not written runs on the engine's version.

# %%
# NBVAL_IGNORE_OUTPUT
for name, owner in lesson13.trainer_pieces_report():
    exercise, role = lesson13.TRAINER_PIECES[name]
    print(f"{name:>22} (exercise {exercise}): {owner:>11}  -> {role}")

# %% [markdown]
# ## Plugging them in
#
# The model calls every kernel through a registry, `engine.trainer.model.KERNELS`, and
# `use_kernel(name, function, owner=...)` replaces one. Your pieces have the signatures of
# their exercises, so each gets a small adapter to the model's calling convention (inputs
# first, output buffers as keywords, gradients *added into* where the model accumulates).
# Before a piece goes in, it is run once beside the engine's kernel on a random input: a
# piece that disagrees stays out, and the cell says so.

# %%
def gelu_adapter(piece):
    def kernel(h, bias, *, out):                     # out = gelu(h + bias)
        piece(h.reshape(-1, h.shape[-1]), bias, out.reshape(-1, out.shape[-1]))
        return out
    return kernel


def crossentropy_adapter(piece):
    def kernel(logits, targets, scale, *, losses):
        n = logits.shape[0]
        mean = piece(logits, targets)                # logits now hold d(mean)/d(logits)
        logits *= logits.dtype.type(scale * n)       # the model wants d(scale * sum)/d(logits)
        losses[...] = mean                           # your piece returns only the mean
        return float(mean), losses
    return kernel


def embedding_adapter(piece):
    def kernel(ids, dx, vocab_size, *, dwte, dwpe):
        b, t = ids.shape
        c = dwte.shape[1]
        dwte += piece(np.ascontiguousarray(ids).reshape(-1), dx.reshape(-1, c), vocab_size)
        dwpe[:t] += dx.reshape(b, t, c).sum(axis=0)  # positions: a sum over the batch
        return dwte, dwpe
    return kernel


def agrees_with_engine(name, kernel, rng):
    """Run `kernel` and the engine's kernel `name` on the same random input."""
    if name == "bias_gelu_forward":
        h = rng.normal(size=(64, 32)).astype(np.float32)
        bias = rng.normal(size=32).astype(np.float32)
        ours, theirs = np.empty_like(h), fused.bias_gelu_forward(h, bias)
        kernel(h, bias, out=ours)
        return np.allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    if name == "crossentropy_softmax":
        logits = rng.normal(size=(32, 20)).astype(np.float32)
        targets = rng.integers(0, 20, size=32)
        mine, engines = logits.copy(), logits.copy()
        mean, _ = kernel(mine, targets, 1 / 32, losses=np.empty(32, np.float32))
        ref_mean, _ = fused.crossentropy_softmax(engines, targets, 1 / 32)
        return math.isclose(mean, ref_mean, rel_tol=1e-4) and np.allclose(mine, engines, atol=1e-6)
    if name == "embedding_backward":
        ids = rng.integers(0, 20, size=(4, 8))
        dx = rng.normal(size=(4, 8, 16)).astype(np.float32)
        ours = kernel(ids, dx, 20, dwte=np.zeros((20, 16), np.float32),
                      dwpe=np.zeros((8, 16), np.float32))
        theirs = fused.embedding_backward(ids, dx, 20)
        return all(np.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(ours, theirs))
    raise KeyError(name)


KERNEL_PIECES = {"bias_gelu_forward": ("bias_gelu_forward", gelu_adapter),
                 "softmax_cross_entropy": ("crossentropy_softmax", crossentropy_adapter),
                 "embedding_backward": ("embedding_backward", embedding_adapter)}
status = {}
rng = np.random.default_rng(13)
for piece_name, (kernel_name, adapter) in KERNEL_PIECES.items():
    exercise = lesson13.TRAINER_PIECES[piece_name][0]
    try:
        piece = lesson13.load_trainer_piece(piece_name)
    except Exception as err:                         # saved, but it does not load
        status[piece_name] = f"engine's (your piece did not load: {type(err).__name__}: {err})"
        continue
    if piece is None:
        status[piece_name] = "engine's (not written yet)"
        continue
    kernel = adapter(piece)
    try:
        ok = agrees_with_engine(kernel_name, kernel, rng)
    except Exception as err:
        ok, why = False, f"{type(err).__name__}: {err}"
    else:
        why = "it disagrees with the engine's kernel"
    if ok:
        use_kernel(kernel_name, kernel, owner=f"you ({exercise})", pure=False)
        status[piece_name] = f"yours (exercise {exercise})"
    else:
        status[piece_name] = f"engine's ({why})"

# %% [markdown]
# The optimizer's two pieces work on the flat buffers between the backward and the step.
# Your AdamW kernel takes one contiguous range at a time, so it runs once per parameter
# tensor (a *segment* of the flat buffer): matrices get weight decay, biases and LayerNorm
# gains do not, exactly as the engine's optimizer does it.

# %%
class SegmentAdamW:
    """AdamW over the model's flat buffers with your `adamw_step` kernel, one tensor at a time."""

    def __init__(self, model, kernel, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1):
        self.p, self.g = model.params.flat, model.grads.flat
        self.m, self.v = np.zeros_like(self.p), np.zeros_like(self.p)
        self.segments = decay_segments(model.params)
        self.kernel, self.betas, self.eps, self.weight_decay = kernel, betas, eps, weight_decay
        self.t = 0

    def step(self, lr):
        self.t += 1
        for a, b, decays in self.segments:
            self.kernel(self.p[a:b], self.g[a:b], self.m[a:b], self.v[a:b], self.t, lr,
                        self.betas[0], self.betas[1], self.eps,
                        self.weight_decay if decays else 0.0)


def optimizer_pieces_agree(adamw_kernel, clip_fn, rng):
    """Your AdamW and clipping beside the engine's, on a small random problem."""
    ok = True
    if adamw_kernel is not None:
        p = rng.normal(size=300).astype(np.float32)
        g = rng.normal(size=300).astype(np.float32)
        mine = [p.copy(), np.zeros(300, np.float32), np.zeros(300, np.float32)]
        adamw_kernel(mine[0], g, mine[1], mine[2], 1, 1e-2, 0.9, 0.99, 1e-8, 0.1)
        theirs = [p.copy(), np.zeros(300, np.float32), np.zeros(300, np.float32)]
        fused.adamw_update(theirs[0], g, theirs[1], theirs[2], fused.work_items([(0, 300, 0.1)]),
                           lr=1e-2, step=1, beta1=0.9, beta2=0.99)
        ok &= np.allclose(mine[0], theirs[0], rtol=1e-5, atol=1e-6)
    if clip_fn is not None:
        grads = {"a": rng.normal(size=(5, 4)), "b": rng.normal(size=3)}
        copy = {k: v.copy() for k, v in grads.items()}
        ok &= math.isclose(clip_fn(grads, 0.5), lesson13.engine_clip(copy, 0.5), rel_tol=1e-6)
        ok &= all(np.allclose(grads[k], copy[k], rtol=1e-6) for k in grads)
    return bool(ok)


def load_or_none(name):
    try:
        return lesson13.load_trainer_piece(name)
    except Exception as err:
        status[name] = f"engine's (your piece did not load: {type(err).__name__}: {err})"
        return None


your_adamw, your_clip = load_or_none("adamw_step"), load_or_none("clip_global_norm")
if (your_adamw or your_clip) and not optimizer_pieces_agree(your_adamw, your_clip, rng):
    status["adamw_step" if your_adamw else "clip_global_norm"] = \
        "engine's (your optimizer pieces disagree with the engine's)"
    your_adamw = your_clip = None
for name, piece in (("adamw_step", your_adamw), ("clip_global_norm", your_clip)):
    status.setdefault(name, f"yours (exercise {lesson13.TRAINER_PIECES[name][0]})" if piece
                      else "engine's (not written yet)")


def make_optimizer(model):
    if your_adamw is not None:
        return SegmentAdamW(model, your_adamw)
    return lesson13.FlatAdamW(model)                # the engine's fused AdamW


clip = your_clip if your_clip is not None else lesson13.engine_clip

# %%
# NBVAL_IGNORE_OUTPUT
print("whose code the trainer runs:")
for name, who in status.items():
    print(f"  {name:>22}: {who}")
print("kernel registry:", {k: v for k, v in kernel_owners().items() if v != "engine"} or
      "all kernels are the engine's")

# %% [markdown]
# ## Before training
#
# The model starts from GPT-2's initialisation: small random weights. Its predictions are
# close to uniform over the vocabulary, so its loss is close to ln V, and what it writes is
# characters drawn almost at random.

# %%
model = FusedGPT(cfg, batch_size=B, seed=0)
optimizer = make_optimizer(model)


def validation_loss(model, n_batches=4):
    """Mean loss on fixed windows of the held-out text (no gradient work)."""
    return float(np.mean([model.loss(x, y) for x, y in
                          eval_batches(dataset.val, B, T, n_batches)]))


val_before = validation_loss(model)
print(f"validation loss before training: {val_before:.2f} nats (ln V = "
      f"{math.log(tokenizer.vocab_size):.2f})")

# %%
# NBVAL_IGNORE_OUTPUT
PROMPT = "The "
text_before = sample(model, tokenizer, PROMPT, length=240, temperature=0.8, seed=0)
print(text_before)

# %% [markdown]
# ## Exercise 13.1 · One training step, phase by phase
#
# Write `train_step(model, optimizer, clip, x, y, lr, max_norm, phase)`. It does one
# optimizer step on the micro-batch `x, y` and returns `(loss, grad_norm)`. The work falls
# into phases, each wrapped in `with phase("name"):` so the trainer can time it:
#
# 1. before anything: `model.zero_grad()`, because the backward *adds* into the gradient
#    buffer (lesson 02's accumulation, lesson 08's K micro-batches);
# 2. `"loss"`: `loss = model.forward(x, y)`. The fused softmax + cross-entropy leaves the
#    logits' gradient in place, so the loss phase already starts the backward;
# 3. `"backward"`: `model.backward()`, which adds every parameter's gradient into the flat
#    buffer;
# 4. `"optimizer"`: `norm = clip(model.named_grads(), max_norm)` (it scales the gradients in
#    place and returns the norm before clipping), then `optimizer.step(lr)`.
#
# Evaluation is the fourth kind of work; the loop below does it every few steps.

# %%
def train_step(model, optimizer, clip, x, y, lr, max_norm, phase):
    """One optimizer step on one micro-batch; returns (loss, grad_norm before clipping)."""
    ### BEGIN SOLUTION
    model.zero_grad()
    with phase("loss"):
        loss = model.forward(x, y)
    with phase("backward"):
        model.backward()
    with phase("optimizer"):
        norm = clip(model.named_grads(), max_norm)
        optimizer.step(lr)
    return loss, norm
    ### END SOLUTION

# %%
# CHECK 13.1
lesson13.check_train_step(train_step)

# %% [markdown]
# ## Training, live
#
# The loop below is the whole trainer: a batch, your step, a validation loss every 50
# steps, and one record per step handed to a dashboard. `TrainerDashboard` draws what it is
# given: the training loss of each batch, the validation loss, the dashed unigram-entropy
# line, tokens per second, and the share of time in each phase. (`python -m engine.train`
# runs the same loop from a terminal, with checkpoints and logs.)
#
# The run is 600 steps of 2048 characters, about three passes over the training text, or
# at most five minutes, whichever comes first. On an idle two-core machine it takes one to
# two minutes.

# %%
STEPS, EVAL_EVERY, TIME_LIMIT_S = 600, 50, 300
LR, WARMUP, MAX_NORM = 2e-3, 30, 1.0
dashboard = TrainerDashboard(total_steps=STEPS, redraw_every=10, reference_loss=entropy,
                             title="tiny GPT on the Python docs")

# %%
# NBVAL_IGNORE_OUTPUT
dashboard

# %%
# NBVAL_IGNORE_OUTPUT
history = []
x_buf = np.empty((B, T), np.int64)
y_buf = np.empty((B, T), np.int64)
t_start = time.perf_counter()
for step in range(STEPS):
    x, y = batch_at(dataset.train, 0, step, B, T, x_buf, y_buf)
    phase = lesson13.PhaseLog()
    t0 = time.perf_counter()
    loss, norm = train_step(model, optimizer, clip, x, y,
                            lr_at(step, lr=LR, warmup=WARMUP, total=STEPS), MAX_NORM, phase)
    step_time = time.perf_counter() - t0
    record = {"step": step + 1, "loss": float(loss), "grad_norm": float(norm),
              "step_time": step_time, "tokens_per_s": B * T / step_time}
    out_of_time = time.perf_counter() - t_start > TIME_LIMIT_S
    if (step + 1) % EVAL_EVERY == 0 or step + 1 == STEPS or out_of_time:
        with phase("evaluation"):
            record["val_loss"] = validation_loss(model)
    record["phases"] = dict(phase.seconds)
    history.append(record)
    dashboard(record)
    if out_of_time:
        break
dashboard.finish(reason=f"the {TIME_LIMIT_S} s time limit" if out_of_time else None)
elapsed = time.perf_counter() - t_start
val_after = history[-1]["val_loss"]
step_times = [r["step_time"] for r in history[1:]]
print(f"{len(history)} steps in {elapsed:.0f} s [timed]; median step {np.median(step_times) * 1e3:.0f} ms "
      f"[timed], {B * T / np.median(step_times):,.0f} tokens/s")
print(f"validation loss: {val_before:.3f} before, {val_after:.3f} after "
      f"(unigram entropy {entropy:.3f})")

# %%
print("validation loss at least 1 nat below where it started:", val_after < val_before - 1.0)
print("validation loss below the unigram entropy of the characters:", val_after < entropy)

# %% [markdown]
# ## After training
#
# The same prompt, the same sampling seed, the trained weights:

# %%
# NBVAL_IGNORE_OUTPUT
text_after = sample(model, tokenizer, PROMPT, length=240, temperature=0.8, seed=0)
print("--- before training ---")
print(text_before)
print("--- after training ---")
print(text_after)

# %% [markdown]
# A few hundred steps on a CPU take the model from noise to the texture of the
# documentation: words separated by spaces, common English and Python words, punctuation
# and indentation in roughly the right places, but not yet sense. Longer runs
# (`python -m engine.train --steps 3000`) keep improving it.
#
# ## The budget's prediction beside the measured step
#
# Lesson 07's budget predicts what one step costs from the shape alone. The `tiny` preset is
# this model; the widget shows its prediction. Next to it, what the step measured here.

# %%
# NBVAL_IGNORE_OUTPUT
from widgets.budget import BudgetWidget
BudgetWidget(preset="tiny").ui

# %%
predicted = budget.budget(budget.preset("tiny"))
flops_budget = predicted.flops["per_step"]["total"]
flops_model = model.flops_per_step()["total"]
print(f"parameters: budget {predicted.parameters:,}, model {model.num_params():,}")
print(f"FLOPs per step: budget {flops_budget / 1e9:.2f} G (attention over the full T x T), "
      f"the fused model {flops_model / 1e9:.2f} G (causal half only)")
print(f"fixed memory (weights, gradients, AdamW): budget {predicted.fixed_total / 1e6:.1f} MB, "
      f"model {4 * model.params.flat.nbytes / 1e6:.1f} MB")
print(f"activations saved for backward: budget (tape engine) "
      f"{predicted.activations.saved / 1e6:.1f} MB, fused model "
      f"{model.acts.saved_nbytes() / 1e6:.1f} MB")

# %%
# NBVAL_IGNORE_OUTPUT
# the rate BLAS reaches on the model's largest matmul shape, (B*T, C) @ (C, 4C)
a = np.random.default_rng(0).normal(size=(B * T, cfg.n_embd)).astype(np.float32)
w = np.random.default_rng(1).normal(size=(cfg.n_embd, 4 * cfg.n_embd)).astype(np.float32)
sgemm_times = []
for _ in range(30):
    t0 = time.perf_counter()
    a @ w
    sgemm_times.append(time.perf_counter() - t0)
peak = 2 * a.shape[0] * a.shape[1] * w.shape[1] / min(sgemm_times)   # best of 30
median_step = float(np.median(step_times))
achieved = flops_model / median_step
print(f"measured: {median_step * 1e3:.0f} ms per step [timed] = "
      f"{achieved / 1e9:.1f} GFLOP/s of useful work")
print(f"sgemm on the model's largest matmul shape: {peak / 1e9:.1f} GFLOP/s")
if achieved <= peak:
    print(f"the whole step runs at {achieved / peak:.0%} of that rate; at that rate alone the "
          f"budget's FLOPs would take {flops_budget / peak * 1e3:.0f} ms")
else:
    print("the sgemm measurement was slowed by other work on this machine (the step beat it); "
          "run this cell again when the machine is quieter")

# %% [markdown]
# The budget and the model agree on the parameters, on the fixed memory and, to a tenth of
# a megabyte, on the activations kept for the backward (the budget counts what the tape
# engine saves; the fused model lays out nearly the same tensors once, in its own buffers).
# They differ on the FLOPs: the budget counts attention over the full T × T square, as the
# tape engine computes it, while the fused kernel skips the masked half. A step running at
# a fraction of the matmul rate is normal for a model this small: much of its time goes to
# the memory-bound kernels of lesson 10, to attention, and to Python between kernels.
#
# ## The division of labour
#
# Where did the time go? Each record carries the seconds of its phases:

# %%
phase_totals = {p: sum(r["phases"].get(p, 0.0) for r in history)
                for p in ("loss", "backward", "optimizer", "evaluation")}
total = sum(phase_totals.values())
fig, ax = plt.subplots(figsize=(6, 2.4))
ax.barh(list(phase_totals), [100 * v / total for v in phase_totals.values()],
        color=["#4c72b0", "#c44e52", "#55a868", "#ccb974"])
ax.invert_yaxis()
ax.set_xlabel("% of the training run")
ax.set_title("Where the time went")
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
for p, seconds in phase_totals.items():
    print(f"{p:>10}: {seconds:6.1f} s [timed] ({seconds / total:.0%})")
print(f"backward / loss phase: {phase_totals['backward'] / phase_totals['loss']:.1f}")

# %% [markdown]
# Each phase has one job and hands one thing to the next:
#
# - **loss** (the forward): computes the loss *and keeps what the backward needs*
#   (lesson 06); its last kernel, the fused softmax + cross-entropy, already turns the
#   logits into their gradient (lesson 10);
# - **backward**: about twice the forward's FLOPs (two matmuls per forward matmul, lesson
#   03), adding every gradient into one flat buffer, the embedding's by a deterministic
#   scatter-add (lesson 11);
# - **optimizer**: one pass for the global norm (the number to log, lesson 12), clipping
#   folded in, one fused AdamW pass; with several processes, the all-reduce lands here;
# - **evaluation**: forward only, on held-out text, no gradient: the honest measure of
#   progress, and cheap because it runs rarely.
#
# ## What you built, and what it costs
#
# - **A trainer assembled from your pieces**: the fused bias + GELU, the softmax +
#   cross-entropy that overwrites its logits, the deterministic scatter-add, global-norm
#   clipping and the fused AdamW run inside the engine's GPT wherever you wrote them; the
#   engine's kernels fill the rest, and the registry says whose is whose.
# - **The training step** (exercise 13.1): zero, loss, backward, clip, step, in that order.
#   Each slip has a signature you met in this course: a missing zero_grad piles up
#   gradients, clipping after the step protects nothing.
# - **A measured run**: the validation loss falls far below the unigram entropy in a few
#   hundred steps on a CPU, at a speed you measured in tokens per second, and the budget of
#   lesson 07 predicted the step's parameters, memory and FLOPs before it ran.
#
# The backward pass's formulas were never the hard part. Where its numbers live, in which
# order they are summed, how many times they cross memory, and what happens to them between
# backward and step: that is the engineering, and you have now built each piece of it.
