# %% [markdown]
# # 13 · The fused CPU trainer
#
# **Goals.** By the end of this lesson you will have
# 1. assembled the GPT trainer from the pieces you wrote in lessons 10-12, with the engine's
#    kernels filling every gap, and seen exactly whose code runs where;
# 2. written the training step itself, with its division of labour: zero, loss, backward,
#    clip and update (exercise 13.1);
# 3. trained a small GPT on the Python documentation, on this CPU, for a fixed number of
#    steps, with a live loss curve, the gradient norm, tokens per second and the model FLOPs
#    utilisation (MFU);
# 4. compared the budget's prediction (lesson 07) with the step you measured;
# 5. predicted the activation memory of the checkpointed trainer with your lesson 08
#    formula, and exported the trained weights in bf16 with your lesson 09 rounding;
# 6. read text the model wrote before and after training.
#
# Everything in this lesson runs on `engine.trainer.model`: the GPT-2 style model of the design
# (learned positions, pre-LayerNorm, causal attention, tanh-GELU MLP, tied embedding) on
# the fused numba kernels, with its parameters and gradients in two flat buffers and every
# activation laid out once, so a step allocates nothing.
#
# **Your pieces in the engine.** Fills: the training step (13.1). Runs: your pieces of
# lessons 08-12 on the fused model (08.1, 10.1, 10.2, 11.1, 12.1, 12.2), your checkpoint
# formula (08.3) on the checkpointed trainer and your bf16 rounding (09.1) on the trained
# weights, each checked in its slot first, the engine's version where one is missing or
# breaks its slot; the table below says which ran and how fast. (The whole map:
# CONTRIBUTING.md, "Exercise <-> slot".)

# %%
import engine.numba_config  # noqa: F401  (first: numba's threads wait asleep, see lesson 10)

import math
import tempfile
import time

import numpy as np
import matplotlib.pyplot as plt

from engine import budget
from engine.trainer.data import Dataset, batch_at, builtin_text, eval_batches, unigram_entropy
from coursework import lesson13, solution_pieces
from coursework.pieces import pieces_dir
from engine.trainer.model import FusedGPT, kernel_owners, reset_kernels
from engine.gpt_config import tiny_config
from engine.trainer.optim import lr_at
from engine.train import sample
from widgets.trainer import TrainerDashboard

lesson13.name_unfinished_exercises()   # a cell that needs an unfinished exercise says which

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
# Nine of your exercises fill a *slot* of the trainer. Each was saved as a *piece* in
# `course/my_pieces/` when its check passed. `lesson13.plug_in_pieces()` loads each one on its
# own, as a file, runs it in its slot on the buffers the trainer will hand it (float32
# activations for the kernels; float32 views of one flat buffer for clipping and AdamW, where
# working *in place* is part of the contract), compares it with the engine's version, and
# plugs in those that keep the contract (the last two below are checked the same way where
# they run, further down):
#
# | slot | exercise | where it runs |
# |---|---|---|
# | bias + GELU forward | 10.1 | the model's kernel registry, `bias_gelu_forward`; the backward runs it again (below) |
# | softmax + cross-entropy | 10.2 | the registry, `crossentropy_softmax` |
# | embedding backward | 11.1 | the registry, `embedding_backward` |
# | global-norm clipping | 12.1 | the `clip` your training step is handed |
# | AdamW update | 12.2 | the optimizer, once per parameter tensor of the flat buffer |
# | accumulation loop | 08.1 | K micro-batches on the fused model, below |
# | the training step | 13.1 | the training loop below |
# | checkpoint memory formula | 08.3 | the checkpointed trainer's activations, below |
# | bf16 rounding | 09.1 | the trained weights exported in bf16, below |
#
# A piece you have not written, or one that breaks its slot, leaves the engine's version in
# place, and the table says which and why. With each of your pieces goes its speed against
# the engine's version at this trainer's shape; a piece more than twice as slow is named.
# (The model calls every kernel through a registry,
# `engine.trainer.kernel_registry.KERNELS`; `use_kernel(name, function, owner=...)` replaces
# one, after a small adapter from your exercise's signature to the model's calling
# convention: the kernels' adapters are in `coursework/slots/lesson10.py` and
# `coursework/slots/lesson11.py`.)
#
# Your pieces live in `course/my_pieces/`. The *solution* notebook of this lesson never
# reads them: it fills a new temporary folder with the reference solutions of lessons
# 00-12, saved through the same checks, and runs the trainer on those, so what it shows
# is the trainer assembled from a full set of pieces.

# %%
if solution_pieces.in_solution_notebook():
    print("Saving the reference solutions of lessons 00-12 through their checks (the first "
          "run on a machine also compiles their kernels: up to a minute) ...", flush=True)
    solution_pieces.use_solution_pieces(before_lesson="13")
    print("This is the solution notebook: the pieces below are the reference solutions of "
          "lessons 00-12, saved into a temporary folder through their checks, standing in "
          "for yours.")
else:
    print(f"your pieces: {pieces_dir()}")

# %%
ENGINE_FOR = []   # slots to run on the engine's version instead of yours, e.g. ["adamw_step"]
print("Checking each piece in its slot, beside the engine's version (the first run on a "
      "machine compiles the trainer's kernels too) ...", flush=True)
trainer = lesson13.plug_in_pieces(engine_for=ENGINE_FOR)
clip, make_optimizer = trainer.clip, trainer.make_optimizer
print("whose code the trainer runs:")
for line in trainer.slot_table(train_step_owner="yours (exercise 13.1, below)"):
    print(" ", line)
print("kernel registry:", {k: v for k, v in kernel_owners().items() if v != "engine"} or
      "all kernels are the engine's")

# %% [markdown]
# And how fast each of your pieces runs in its slot, against the engine's version (the
# figures depend on this machine and its load; only the ratio means much).
#
# Expect some of yours to be slower, even when they are exactly the plain loops the
# exercises asked for: each exercise taught one idea (one pass over memory, a deterministic
# scatter-add, a fused update), and the engine's version adds one more trick on top. The
# table names it under every piece more than twice as slow as the engine's: the vectorised
# exp of lesson 10's third limit for GELU and the loss, the update split into loops that
# vectorise over one flat buffer for AdamW. It also says what the gap costs one training
# step. A slow piece trains the model just as well, only slower. If the run below
# would take too long, put the slot's name in `ENGINE_FOR` above and run from there again:
# the engine's version takes that slot, and the table says it was your choice.

# %%
# NBVAL_IGNORE_OUTPUT
for line in trainer.slot_table(cfg, B, train_step_owner="yours (exercise 13.1, below)"):
    print(" ", line)

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
# optimizer step on the micro-batch `x, y` and returns `(loss, grad_norm)`, the norm before
# clipping. What you have to work with:
#
# - `model.zero_grad()` clears the flat gradient buffer;
# - `model.forward(x, y)` returns the mean loss. The fused softmax + cross-entropy leaves the
#   logits' gradient in place, so it already starts the backward;
# - `model.backward()` *adds* every parameter's gradient into the flat buffer;
# - `clip(model.named_grads(), max_norm)` scales the gradients in place and returns the norm
#   they had before;
# - `optimizer.step(lr)` moves the weights by the gradients in the buffer.
#
# Three phases are timed by the trainer: wrap the loss in `with phase("loss"):`, the
# backward in `with phase("backward"):`, and clipping with the update in
# `with phase("optimizer"):`.
#
# The order is yours to find, and each choice has a reason. Which order lets clipping see
# this step's gradient, and only this step's? Where must zeroing go, given that the
# backward adds (lesson 08's K micro-batches rely on it), and where would it wipe out the
# work? Which norm should the log show, and why not the one after clipping? The check runs
# your step beside a reference on a small GPT and names what a wrong order does.
#
# Evaluation is a fourth kind of work; the loop below does it every few steps.

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
# ## Your accumulation loop on the fused model
#
# Lesson 08's `accumulate(model, micro_batches)` was written for the tape: `model(ids,
# targets)` gave a loss Tensor, `(loss / K).backward()` added its share into `.grad`. The
# fused model has the same division of labour (`zero_grad`, a forward that prepares
# `loss_scale * loss` for the backward, a backward that *adds*), so your loop drives it
# unchanged through a thin view of the model (`coursework/slots/lesson08.py`). One batch of 16
# sequences as 4 micro-batches of 4 must give the gradient of the batch of 16:

# %%
# NBVAL_IGNORE_OUTPUT
x_one, y_one = batch_at(dataset.train, 0, 0, B, T, np.empty((B, T), np.int64),
                        np.empty((B, T), np.int64))
loss_k, grad_k = lesson13.accumulated_gradient(trainer.pieces.get("accumulate"), cfg,
                                               (x_one, y_one), k=4, seed=1)
loss_1, grad_1 = lesson13.accumulated_gradient(None, cfg, (x_one, y_one), k=1, seed=1)
same = bool(np.allclose(grad_k, grad_1, rtol=1e-3, atol=1e-6)
            and math.isclose(loss_k, loss_1, rel_tol=1e-4))
print(f"the accumulation loop: {trainer.owner('accumulate')}")
print(f"mean loss over 4 micro-batches of {B // 4}: {loss_k:.4f}; one batch of {B}: "
      f"{loss_1:.4f}; the same gradient: {same}")
assert same

# %% [markdown]
# ## How well the step uses the machine: MFU
#
# **MFU**, the model FLOPs utilisation, is the one number that says how much of the
# machine a trainer uses: the FLOP/s a training step achieves, counting only the model's
# own FLOPs (lesson 07's count, 6 per weight per token plus attention's two products;
# recomputed work does not count), divided by the peak FLOP/s of the machine. Here the
# peak is measured, not taken from a data sheet: the best rate the trainer's own float32
# matmul reaches on the model's largest matmul shape, (B·T, C) @ (C, 4C), on this CPU.
# That is the faster of two ways: one BLAS call on all cores (the library `engine.blas`
# chose: SciPy's OpenBLAS, or Intel's MKL where it is installed), and the trainer's own
# way, every core its share of the rows at once (on the engine's register tiles where
# their vectors are wider than the BLAS's kernels; the benchmark says which ran).

# %%
flops_per_step = lesson13.step_flops(cfg, B)
print(f"FLOPs per training step (lesson 07's count): {flops_per_step / 1e9:.2f} G")

# %%
# NBVAL_IGNORE_OUTPUT
peak_flops = lesson13.sgemm_flops_per_s(B * T, cfg.n_embd, 4 * cfg.n_embd)
print(f"sgemm on ({B * T}, {cfg.n_embd}) @ ({cfg.n_embd}, {4 * cfg.n_embd}), best of 30: "
      f"{peak_flops / 1e9:.1f} GFLOP/s")

# %% [markdown]
# ## Training, live
#
# The loop below is the whole trainer: a batch, your step, a validation loss every 25
# steps, and one record per step handed to a dashboard. `TrainerDashboard` draws what it is
# given: the training loss of each batch, the validation loss, the dotted unigram-entropy
# line, the gradient norm before clipping (the number lesson 12 says to log: spikes and
# trends show there first), tokens per second, the MFU, and the share of time in each
# phase. (`python -m engine.train` runs the same loop from a terminal, with checkpoints
# and logs.)
#
# The run is a fixed 250 steps of 2048 characters, a little more than one pass over the
# training text, so every run does the same work and ends in the same place, however busy
# the machine. The dashboard counts the steps done and left and the time left, at the
# run's average pace so far. On an idle two-core machine the run takes under a minute.
#
# To end the run early, click the dashboard's **stop** button (or use Kernel > Interrupt):
# the step in progress finishes, the dashboard says "stopped by you at step N", and the
# cells below work on the model as it is then. (The loop awaits `dashboard.keep_going()`
# once a step: while a cell runs, the kernel reads the button's click only when the cell
# waits for something.)

# %%
STEPS, EVAL_EVERY = 250, 25
LR, WARMUP, MAX_NORM = 2e-3, 25, 1.0
dashboard = TrainerDashboard(total_steps=STEPS, redraw_every=10, reference_loss=entropy,
                             title="tiny GPT on the Python docs")

# %%
# NBVAL_IGNORE_OUTPUT
dashboard.show()

# %%
# NBVAL_IGNORE_OUTPUT
history = []
x_buf = np.empty((B, T), np.int64)
y_buf = np.empty((B, T), np.int64)
t_start = time.perf_counter()
with dashboard.running():            # stop or Kernel > Interrupt end the run here, cleanly
    for step in range(STEPS):
        if not await dashboard.keep_going():
            break
        x, y = batch_at(dataset.train, 0, step, B, T, x_buf, y_buf)
        phase = lesson13.PhaseLog()
        t0 = time.perf_counter()
        loss, norm = train_step(model, optimizer, clip, x, y,
                                lr_at(step, lr=LR, warmup=WARMUP, total=STEPS), MAX_NORM, phase)
        step_time = time.perf_counter() - t0
        record = {"step": step + 1, "loss": float(loss), "grad_norm": float(norm),
                  "step_time": step_time, "tokens_per_s": B * T / step_time,
                  "mfu": lesson13.mfu(flops_per_step, step_time, peak_flops)}
        if (step + 1) % EVAL_EVERY == 0 or step + 1 == STEPS:
            with phase("evaluation"):
                record["val_loss"] = validation_loss(model)
        record["phases"] = dict(phase.seconds)
        history.append(record)
        dashboard(record)
elapsed = time.perf_counter() - t_start
val_after = validation_loss(model)     # where the run ended, whether it ran to the end or not
assert all(np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"]) for r in history), \
    "a training step produced a NaN or inf loss or gradient norm"
step_times = [r["step_time"] for r in history[1:]]
median_step = float(np.median(step_times))
print(f"{len(history)} steps in {elapsed:.0f} s; median step {median_step * 1e3:.0f} ms"
      f", {B * T / median_step:,.0f} tokens/s, MFU "
      f"{lesson13.mfu(flops_per_step, median_step, peak_flops):.0%}")
print(f"validation loss: {val_before:.3f} before, {val_after:.3f} after "
      f"(unigram entropy {entropy:.3f})")

# %%
print(f"{len(history)} steps run, as planned: {len(history) == STEPS}")
print("validation loss at least 1 nat below where it started:", val_after < val_before - 1.0)
print("validation loss at least 0.5 nat below the unigram entropy of the characters:",
      val_after < entropy - 0.5)

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
achieved = flops_budget / median_step
step_mfu = lesson13.mfu(flops_budget, median_step, peak_flops)
print(f"measured: {median_step * 1e3:.0f} ms per step = "
      f"{achieved / 1e9:.1f} GFLOP/s of the model's FLOPs")
print(f"sgemm on the model's largest matmul shape: {peak_flops / 1e9:.1f} GFLOP/s")
if step_mfu <= 1:
    print(f"MFU {step_mfu:.0%}: at the sgemm rate alone the step's FLOPs would take "
          f"{flops_budget / peak_flops * 1e3:.0f} ms")
else:
    print("the sgemm measurement was slowed by other work on this machine (the step beat it); "
          "run the sgemm cell again when the machine is quieter")

# %% [markdown]
# The budget and the model agree on the parameters and on the fixed memory. On the
# activations kept for the backward the fused model is a fifth lighter. The budget counts
# what the tape engine saves, and the fused model lays out nearly the same tensors once, in
# its own buffers, with one left out: GELU's output, 4C numbers a row in every block, the
# largest activation a block has. Only the weight gradient of the projection after the GELU
# reads it, and the GELU backward rebuilds it from the fc output it reads anyway: it has
# each element's sigmoid in hand, so the output costs one multiply, with the forward's bits.
# That is lesson 10's save-or-recompute question, answered for a whole tensor. (When the
# GELU forward in the registry is yours, the backward runs your kernel again instead, so the
# gradient is taken through the very output your forward produced.)
#
# The budget and the model differ on the FLOPs: the budget counts attention over the full
# T × T square, as the tape engine computes it, while the fused kernel skips the masked
# half; MFU is quoted with the budget's count, the convention (skipping work is the
# kernel's gain, not the model's). An MFU of a few tens of percent is normal for a model this small: much of its
# time goes to the memory-bound kernels of lesson 10, to attention, and to Python between
# kernels, none of which run at the matmul rate.
#
# ## Your checkpoint formula on the fused trainer
#
# `FusedGPT(..., checkpointing=True)` keeps only each block's input and recomputes the
# block in the backward, one block's buffers shared by all blocks. Lesson 08's formula
# predicts what it keeps: the L blocks checkpointed every block (k = 1), each boundary one
# residual stream, each block what its backward reads beyond its input (the sizes come from
# lesson 07's budget of the fused trainer), plus what lies outside every segment (the last
# block's output, the final layer norm, the logits). The model lays out its buffers once,
# so its bytes are exact, and the prediction must equal them to the byte.

# %%
checkpoint_peak, peak_owner = lesson13.checkpoint_peak_piece()
ckpt_model = FusedGPT(cfg, batch_size=B, params=model.params.to_dict(), checkpointing=True)
predicted_ckpt = lesson13.predicted_checkpointed_bytes(checkpoint_peak, cfg, B)
measured_ckpt = ckpt_model.acts.saved_nbytes()
print(f"the checkpoint formula: {peak_owner}")
print(f"activations of the checkpointed trainer: predicted {predicted_ckpt / 1e6:.2f} MB, "
      f"the model's buffers {measured_ckpt / 1e6:.2f} MB; equal to the byte: "
      f"{predicted_ckpt == measured_ckpt}")
print(f"without checkpointing: {model.acts.saved_nbytes() / 1e6:.2f} MB, "
      f"{model.acts.saved_nbytes() / measured_ckpt:.1f}x as much")

# %% [markdown]
# The price is time: the backward runs each block's forward again. Both models, the same
# trained weights, the same batch: the same loss and gradient, at different speeds.

# %%
# NBVAL_IGNORE_OUTPUT
def timed_steps(m, n=4):
    """Median seconds of forward + backward on one batch; the loss and gradient."""
    times = []
    for _ in range(n):
        m.zero_grad()
        t0 = time.perf_counter()
        loss = m.forward(x_one, y_one)
        m.backward()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), loss, m.grads.flat.copy()


plain_s, plain_loss, plain_grad = timed_steps(model)
ckpt_s, ckpt_loss, ckpt_grad = timed_steps(ckpt_model)
assert math.isclose(plain_loss, ckpt_loss, rel_tol=1e-5)
assert np.allclose(plain_grad, ckpt_grad, rtol=1e-3, atol=1e-6), "the recompute changed a gradient"
print(f"forward + backward: {plain_s * 1e3:.0f} ms plain, {ckpt_s * 1e3:.0f} ms checkpointed "
      f" ({ckpt_s / plain_s - 1:+.0%}); the same loss and gradient")
model.zero_grad()

# %% [markdown]
# ## The trained weights in bf16, with your rounding
#
# A model is trained in float32 but can be kept and shipped in bf16: half the bytes, the
# same range (lesson 09). Your `to_bf16` rounds the trained weights; the upper 16 bits of
# each rounded float32 are its bf16 pattern, and that is what the file stores. Read back,
# the weights give a validation loss that barely moves:

# %%
to_bf16, bf16_owner = lesson13.bf16_piece()
exported = lesson13.export_bf16(to_bf16, model.params.flat, tempfile.mkdtemp())
trained = model.params.flat.copy()
model.params.flat[...] = exported["weights"]
val_bf16 = validation_loss(model)
model.params.flat[...] = trained                     # back to the float32 weights
print(f"the bf16 rounding: {bf16_owner}")
print(f"weights file: float32 {exported['fp32_bytes']:,} bytes, bf16 {exported['bf16_bytes']:,} "
      f"bytes ({exported['bf16_bytes'] / exported['fp32_bytes']:.2f} of it)")
print("validation loss changes by less than 0.02 nats in bf16:", abs(val_bf16 - val_after) < 0.02)

# %%
# NBVAL_IGNORE_OUTPUT
print(f"validation loss: float32 weights {val_after:.4f}, bf16 weights {val_bf16:.4f} "
      f"({val_bf16 - val_after:+.4f})")

# %% [markdown]
# ## The division of labour
#
# Where did the time go? Each record carries the seconds of its phases; the bars are the
# dashboard's own, with each phase's share written beside it:

# %%
from widgets.trainer import PHASES, draw_phase_bars
phase_totals = {p: sum(r["phases"].get(p, 0.0) for r in history) for p in PHASES}
total = sum(phase_totals.values())
fig, ax = plt.subplots(figsize=(6, 2.4))
draw_phase_bars(ax, phase_totals, title="Where the time went")
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
for p, seconds in phase_totals.items():
    print(f"{p:>10}: {seconds:6.1f} s ({seconds / total:.0%})")
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
# - **Checked where they run**: each piece was loaded on its own and run in its slot, on
#   the buffers the trainer hands it, before it went in; a missing or broken piece left the
#   engine's version in place and the table said why. Your accumulation loop of lesson 08
#   drove the fused model unchanged, your checkpoint formula predicted the checkpointed
#   trainer's memory to the byte, and your bf16 rounding halved the weights file.
# - **The training step** (exercise 13.1): zero, loss, backward, clip, step, in that order.
#   Each slip has a signature you met in this course: a missing zero_grad piles up
#   gradients, clipping after the step protects nothing.
# - **A measured run**: the validation loss falls far below the unigram entropy in a few
#   hundred steps on a CPU, at a speed you measured in tokens per second and as MFU, the
#   share of this CPU's matmul rate the step turns into the model's FLOPs; the budget of
#   lesson 07 predicted the step's parameters, memory and FLOPs before it ran.
#
# The backward pass's formulas were never the hard part. Where its numbers live, in which
# order they are summed, how many times they cross memory, and what happens to them between
# backward and step: that is the engineering, and you have now built each piece of it.
