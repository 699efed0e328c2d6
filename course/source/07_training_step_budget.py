# %% [markdown]
# # 07 · The training-step budget
#
# **Goals.** By the end of this lesson you will be able to predict, before launching a run,
# what one training step costs:
# 1. in FLOPs: 2 per weight per token forward, twice that backward, so about **6 per
#    parameter per token**, plus attention's term that has no weights;
# 2. in fixed memory: weights, gradients and optimizer state, **16 bytes per parameter** for
#    mixed-precision AdamW (18 when the gradients are kept in fp32);
# 3. in activation memory (lesson 06), and where it overtakes the fixed memory as B × N grows;
# 4. with recompute: how much memory it saves and how many FLOPs it adds; with gradient
#    accumulation: more tokens per step for no extra memory;
# 5. and you will compare the prediction with what our engine measures: the bytes, and the
#    step time against the fastest this machine allows (exercise 07.4);
# 6. then with what a real framework's step holds on a GPU: Hugging Face transformers keeps
#    the loss's [B·N, V] tensors in fp32, autocast's copies, every small op's input, and
#    peaks inside the backward (exercise 07.5).
#
# All numbers come from `engine.budget`. The same functions drive the calculator widget below
# and the command line `python -m engine.budget`, so what you read here is what they show.
#
# **Your pieces in the engine.** Fills: no slot (the budget is `engine.budget`; 07.1-07.5
# are checked against it, not saved). Runs: your lesson 06 block count (06.2
# `block_saved_elements`) inside the activation budget, beside `engine.budget`'s count and
# the measurement (the engine's count runs, saying why, when yours is missing or broken).
# (The whole map: CONTRIBUTING.md, "Exercise <-> slot".)

# %%
import subprocess
import sys

import numpy as np
import matplotlib.pyplot as plt

from engine import budget as bm
from engine.budget.lab import measure
from coursework import lesson07
from widgets.budget import BudgetWidget
from widgets.real_step import folded_table, plot_measured_steps, plot_step_memory

lesson07.name_unfinished_exercises()   # a cell that needs an unfinished exercise says which

# %% [markdown]
# ## The calculator, first
#
# This is where the lesson is going: a calculator that predicts one training step's FLOPs,
# memory and time before you launch it. Try it now; each number it shows is derived in the
# sections below, and you will write five of them yourself (07.1-07.5).
#
# Every knob of the budget, with presets: lesson 06's two worked examples, GPT-2 small to
# XL, LLaMA-2 7B to 70B, a 7B-class model (the GPT-3 6.7B shape) and the trainer's tiny
# config. The controls sit on the left in three tabs (model, training, devices); the bar
# stacks one device's memory in the order it becomes resident, each item in its own colour;
# the curve shows memory against the tokens per micro-batch, with the batch where
# activations overtake the fixed memory marked. Pick a device to see whether a step fits,
# the largest micro-batch that does and the step time; spread the run over data-parallel
# devices with a ZeRO stage to shard the fixed memory. "measure on our engine" runs the
# reference GPT at the shape on screen (when it is small enough) and shows the measured
# bytes beside the prediction. Invalid settings (try N=2048 on GPT-2's 1024 positions) say
# what is wrong instead of failing.

# %%
# NBVAL_IGNORE_OUTPUT
calculator = BudgetWidget(preset="gpt2-small")
calculator.ui

# %% [markdown]
# The widget only writes into its controls and readouts, so code can drive it too. Here we
# move the same knobs a learner would and read the readout back:

# %%
print(calculator.summary())
calculator.controls["micro_batch"].value = 16
print("B=16:        ", calculator.summary())
calculator.controls["precision"].value = "bf16"
print("bf16:        ", calculator.summary())
calculator.controls["seq_len"].value = 2048
print("N=2048:      ", calculator.summary())
calculator.controls["seq_len"].value = 1024
calculator.controls["micro_batch"].value = 8
calculator.controls["precision"].value = "fp32"

# %% [markdown]
# ## FLOPs: the 6N rule
#
# A linear layer `Y = X @ W` with `X` of shape (tokens, K) and `W` of shape (K, M) costs
# 2·K·M FLOPs per token (a multiply and an add per weight). That is the "2 FLOPs per
# parameter per token" of the forward pass. Its backward runs **two** matmuls of the same
# size: `dX = dY @ W^T` (to keep the chain going) and `dW = X^T @ dY` (the weight's
# gradient). So the backward costs 2x the forward, a step costs 3x the forward, and a model
# with P weights costs about **6·P FLOPs per token** to train.
#
# Attention adds work with no weights: for each token, the scores `q @ K^T` against N keys
# and the weighted sum `att @ V` cost 2·N·d each per layer (summed over the heads). Our
# engine computes the full N×N matrix (the causal mask zeroes half of it afterwards), so the
# forward term is 4·N·d per layer per token. (A kernel that skips the masked half, like
# lesson 13's trainer, does 2·N·d: each query meets N/2 keys on average. Both counts are
# right for their kernel; the check of 07.1 accepts either, used consistently.)
# `engine.budget` counts the matmul weights
# (`bm.matmul_weights`: the blocks' four matrices and the output head; biases, norms and the
# embedding lookups do no matmul) and adds that term:

# %%
gpt2 = bm.preset("gpt2-small")
tok = bm.flops(gpt2)["per_token"]
print(f"GPT-2 small: {bm.parameter_count(gpt2):,} parameters, "
      f"{bm.matmul_weights(gpt2):,} of them in matmuls")
print(f"forward per token: 2 x {bm.matmul_weights(gpt2):,} + attention "
      f"{bm.attention_flops_per_token(gpt2):,} = {tok['forward']:,} FLOPs")
print(f"backward per token: {tok['backward']:,} FLOPs (2x)")
print(f"step per token: {bm.human_flops(tok['total'])}, vs 6 x parameters = "
      f"{bm.human_flops(6 * bm.parameter_count(gpt2))}")

# %% [markdown]
# ## Exercise 07.1 · FLOPs per token of a training step
#
# Write `training_flops_per_token(matmul_weights, n_layer, seq_len, d_model)`: forward plus
# backward FLOPs per token, with the attention term, no recompute. The check compares with
# `engine.budget` on GPT-2 small, the 7B-class model, the tiny trainer config and one more.

# %%
def training_flops_per_token(matmul_weights, n_layer, seq_len, d_model):
    """Forward (2 per matmul weight + attention) plus backward (2x forward), per token."""
    ### BEGIN SOLUTION
    forward = 2 * matmul_weights + n_layer * 2 * (2 * seq_len * d_model)
    return 3 * forward
    ### END SOLUTION

# %%
# CHECK 07.1
from coursework import lesson07
lesson07.check_training_flops(training_flops_per_token)

# %% [markdown]
# How much does the attention term matter? It grows with N while the weight term does not:

# %%
print(f"{'model':<12} {'N':>6} {'6 x weights':>14} {'with attention':>15} {'attention share':>16}")
for name in ("gpt2-small", "7b-class"):
    for n in (128, 1024, 2048):
        cfg = bm.preset(name, seq_len=n, block_size=max(n, 1024))
        total = bm.flops(cfg)["per_token"]["total"]
        six_p = 6 * bm.matmul_weights(cfg)
        print(f"{name:<12} {n:>6} {bm.human_flops(six_p):>14} {bm.human_flops(total):>15} "
              f"{(total - six_p) / total:>15.1%}")

# %% [markdown]
# ## Fixed memory: weights, gradients, optimizer state
#
# Three buffers come with every parameter whatever the batch:
#
# * the **weights**, in the storage precision (4 bytes in fp32; 2 in bf16 or fp16);
# * the **gradients**, the same size, summed into over the micro-batches of a step (we
#   count them in the storage precision, as the usual "16 bytes per parameter" does; see
#   the note below);
# * the **optimizer state**: nothing for plain SGD, one buffer for momentum, two for AdamW
#   (the running mean and the running mean square of the gradient), always fp32.
#
# Mixed precision adds a fourth: an **fp32 master copy** of the weights. The optimizer updates
# the master copy, and the 16-bit weights are rounded from it; without it, an update smaller
# than bf16's spacing near the weight would vanish (lesson 09 shows it happen).
#
# ## Exercise 07.2 · Bytes per parameter
#
# Write `fixed_bytes_per_parameter(precision, optimizer)` for `precision` in
# `"fp32", "bf16", "fp16"` and `optimizer` in `"sgd", "momentum", "adamw"`.

# %%
def fixed_bytes_per_parameter(precision, optimizer):
    """Weights + master weights + gradients + optimizer state, bytes per parameter."""
    ### BEGIN SOLUTION
    storage = 4 if precision == "fp32" else 2
    master = 0 if precision == "fp32" else 4
    state = {"sgd": 0, "momentum": 4, "adamw": 8}[optimizer]
    return storage + master + storage + state
    ### END SOLUTION

# %%
# CHECK 07.2
lesson07.check_fixed_bytes_per_parameter(fixed_bytes_per_parameter)

# %% [markdown]
# Mixed-precision AdamW: 2 (bf16 weights) + 4 (fp32 master) + 2 (bf16 gradients) + 8 (two
# fp32 moments) = 16 bytes per parameter, the same as fp32 AdamW (4 + 4 + 8). Mixed precision
# does not shrink the fixed memory; it halves the *activations* and speeds up the matmuls on
# hardware with fast 16-bit units. A 7B model needs 112 GB for this part alone.
#
# **A note on the gradient's precision.** The 16 counts a 2-byte bf16 gradient: what a bf16
# backward writes. Lesson 09 shows why long sums belong in fp32, and many mixed-precision
# setups do keep the gradient buffer in fp32 so that the sum over micro-batches (and over
# data-parallel ranks) does not round away small contributions. Then the gradient costs 4
# bytes and mixed-precision AdamW costs 2 + 4 + 4 + 8 = **18 bytes per parameter**.
# `engine.budget` and this lesson use the usual 16; add 2 bytes per parameter for an fp32
# gradient buffer.

# %% [markdown]
# ## Where activations overtake the fixed memory
#
# The fixed memory does not depend on the batch; the activations grow linearly with B (and
# faster than linearly with N, through attention). Past some micro-batch the activations are
# the larger part, and from there on the batch shape, not the model, decides whether a step
# fits.
#
# ## Exercise 07.3 · Find the crossover batch
#
# Write `find_crossover_batch(cfg)`: the smallest micro-batch B at which the activation peak
# of `cfg` (at its sequence length) is larger than the fixed memory. The *peak*, not what
# the forward saves: with recompute the backward rebuilds a block on top of what was
# saved, and that is the moment memory runs out. Use
# `bm.budget(cfg).fixed_total`, `bm.activations(cfg.with_(micro_batch=b)).peak`, and search:
# step through b = 1, 2, 3, ... or, faster, double b until it is over and then bisect. The
# check tries eight configurations, two of them with recompute.

# %%
def find_crossover_batch(cfg):
    """Smallest micro-batch whose activation peak exceeds the fixed memory."""
    ### BEGIN SOLUTION
    fixed = bm.budget(cfg).fixed_total

    def over(b):
        return bm.activations(cfg.with_(micro_batch=b)).peak > fixed

    hi = 1
    while not over(hi):
        hi *= 2
    lo = hi // 2          # over(lo) is false (or lo == 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if over(mid):
            hi = mid
        else:
            lo = mid
    return hi
    ### END SOLUTION

# %%
# CHECK 07.3
lesson07.check_crossover_batch(find_crossover_batch)

# %% [markdown]
# The same question for each preset, at its own sequence length:

# %%
print(f"{'preset':<18} {'N':>5} {'fixed':>9} {'act. per sequence':>18} {'crossover B':>12}")
for name in bm.PRESET_NAMES:
    cfg = bm.preset(name)
    one = bm.activations(cfg.with_(micro_batch=1)).peak
    print(f"{name:<18} {cfg.seq_len:>5} {bm.human_bytes(bm.budget(cfg).fixed_total):>9} "
          f"{bm.human_bytes(one):>18} {bm.crossover_batch(cfg):>12}")

# %%
cfg = bm.preset("gpt2-small", seq_len=512)
sweep = bm.batch_sweep(cfg, list(range(1, 25)))
cross = bm.crossover_batch(cfg)
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(sweep["tokens"], [v / 1e9 for v in sweep["fixed"]], label="weights + grads + AdamW")
ax.plot(sweep["tokens"], [v / 1e9 for v in sweep["activations"]], label="activations")
ax.axvline(cross * cfg.seq_len, ls=":", color="k")
ax.annotate(f"B = {cross}", (cross * cfg.seq_len, 0.2), xytext=(5, 0), textcoords="offset points")
ax.set_xlabel("tokens per micro-batch B x N (GPT-2 small, N = 512, fp32)")
ax.set_ylabel("GB")
ax.legend()
plt.show()

# %% [markdown]
# ## Recompute: memory for FLOPs
#
# Full recompute (activation checkpointing of every block) keeps only each block's input and
# rebuilds the block's insides during the backward: one more forward pass, so a step costs 4
# forwards instead of 3, **+33%** compute. Selective recompute (Korthikanti et al. 2022)
# rebuilds only the attention core (softmax, its dropout and `att @ V`), whose T×T tensors
# are most of the memory at long sequences but cheap to recompute.

# %%
base = bm.preset("7b-class", seq_len=2048, micro_batch=1)
print(f"{'recompute':<10} {'act. peak':>10} {'saved':>10} {'FLOPs/step':>11} {'added':>8}")
for mode in bm.RECOMPUTE:
    cfg = base.with_(recompute=mode)
    t = bm.recompute_tradeoff(cfg)
    b = bm.budget(cfg)
    print(f"{mode:<10} {bm.human_bytes(b.activations.peak):>10} "
          f"{bm.human_bytes(t['bytes_saved']):>10} "
          f"{bm.human_flops(b.flops['per_step']['total']):>11} "
          f"{t['flops_added'] / t['base_flops_per_step']:>8.1%}")

# %% [markdown]
# For the 7B-class model at N = 2048, selective recompute removes most of the activation
# memory for a few percent more compute; full recompute removes nearly all of the rest for a
# third more. On a CPU with plenty of RAM the trade usually goes the other way: keep the
# activations and spend the compute on a bigger batch.
#
# ## Accumulation: more tokens per step, same memory
#
# K micro-batches per optimizer step multiply the tokens (and FLOPs) per step by K. The
# memory does not change: each micro-batch's activations are freed by its backward before the
# next one starts, and the gradients are summed into the one gradient buffer.

# %%
for k in (1, 4, 16):
    b = bm.budget(bm.preset("gpt2-small", accumulation=k))
    print(f"K={k:>2}: {bm.tokens_per_step(b.config):>7,} tokens per step, "
          f"{bm.human_flops(b.flops['per_step']['total']):>10} per step, peak {bm.human_bytes(b.peak)}")

# %% [markdown]
# ## Predicted against measured
#
# The "engine" activation model of `engine.budget` lists exactly the tensors our reference GPT
# saves; `measure` (from `engine.budget.lab`, where the budget keeps its measuring) runs that
# GPT under `engine.memory` and compares: the activations alive at the end of the forward, and
# their peak over the whole step. With `recompute="full"`
# it checkpoints every block with `engine.recompute` (lesson 08): the forward keeps only the
# blocks' inputs, and the backward rebuilds one block at a time after the head and the loss
# have been freed, so the peak is higher than what the forward kept.

# %%
print(f"{'shape':<62} {'saved: predicted':>16} {'measured':>11} {'peak: predicted':>16} "
      f"{'measured':>11}")
SHAPES = ({}, {"micro_batch": 4}, {"seq_len": 64}, {"n_layer": 2, "n_head": 8},
          {"recompute": "full"}, {"recompute": "full", "micro_batch": 4})
measured = []
for changes in SHAPES:
    m = measure(bm.preset("tiny", **changes))
    measured.append(m)
    print(f"{m['shape']:<62} {m['predicted_saved']:>16,} {m['measured_saved']:>11,} "
          f"{m['predicted_peak']:>16,} {m['measured_peak']:>11,}")
print(f"weights {m['measured_weights']:,} bytes and gradients {m['measured_gradients']:,} "
      f"bytes, as predicted: {m['measured_weights'] == m['predicted_weights']}, "
      f"{m['measured_gradients'] == m['predicted_gradients']}")

# %% [markdown]
# Every row agrees to the byte: the model is not an approximation of the engine, it is a list
# of what the engine keeps, in the order it lets go. (The engine has no optimizer state of its
# own to measure; the trainer's AdamW adds its two fp32 buffers per parameter.)
#
# ## Your block count in the budget
#
# In lesson 06 you counted what one block keeps (06.2, `block_saved_elements`), and the check
# kept your function as a piece. It is the heart of the activation model: the blocks keep L
# times your count, at 4 bytes per float, and the model keeps a few tensors outside its
# blocks (token ids, the final layer norm, the head's input, the loss's probabilities:
# `bm.engine_outside_saved`). Here your count builds the activations of the shapes measured
# above (those without recompute), beside `engine.budget`'s model and the measurement. The
# first cell says whose count runs: yours, or the engine's when yours is not saved or breaks
# its contract (checked on these very shapes).

# %%
# NBVAL_IGNORE_OUTPUT
from coursework import pieces

block_saved_elements, owner = pieces.block_count()
print("the per-block count below:", owner)

# %%
print(f"{'shape':<62} {'your count':>11} {'engine.budget':>14} {'measured':>11}")
for changes, m in zip(SHAPES, measured):
    cfg = bm.preset("tiny", **changes)
    if cfg.recompute != "none":
        continue                        # with recompute the blocks keep only their inputs
    per_block = block_saved_elements(cfg.micro_batch, cfg.seq_len, cfg.d_model, cfg.n_head)
    yours = (cfg.n_layer * int(per_block) * bm.activation_bytes_per_element(cfg)
             + sum(item.bytes for item in bm.engine_outside_saved(cfg)))
    print(f"{m['shape']:<62} {yours:>11,} {bm.activations(cfg).saved:>14,} "
          f"{m['measured_saved']:>11,}")
    assert yours == bm.activations(cfg).saved == m["measured_saved"]

# %% [markdown]
# The same bytes, whoever's count ran: the contract of the slot refuses a count that differs
# from the engine's block on these shapes, so a wrong piece never reaches the budget (the
# engine's runs, and the cell above says why).
#
# ## Predicted against measured: the step time
#
# The calculator also predicts how long a step takes, from two numbers: the step's FLOPs
# (07.1's count, times the tokens of a step) and the device's dense rate in FLOP/s, the
# rate of its own best large matmul. Real code does not keep a device that busy: small
# products, memory traffic, one op waiting for the next. The calculator's `mfu` knob (*model
# FLOP utilization*) stands for how close a run comes to that rate.
#
# ## Exercise 07.4 · The floor of a step, and the MFU a measured step reached
#
# Write `step_floor_and_mfu(step_flops, device_flops, measured_seconds)`, given a step's
# FLOPs, the device's FLOP/s and a step's measured time in seconds. Return the pair:
#
# 1. the fastest this step could possibly run on that device, in seconds;
# 2. the share of the device's rate that the measured step reached, as a fraction (its MFU).
#
# The units tell you the arithmetic. Before you write it, answer on paper: why can no real
# step run faster than the first number, whatever its code does? Why is the second at most
# 1, and how would you read a measurement that gave more than 1? Then predict, before you
# run the cell after the check: our tape engine runs op by op in numpy, with many small
# products and a Python call per op; will its MFU on this CPU be near 1, near 0.5, or well
# below? That cell measures the tiny model's step (B=4) on one thread, against this
# machine's float32 matmul rate measured the same way (`bm.this_machine()`), so that a busy
# machine slows both alike, and runs your function on the measurement.

# %%
def step_floor_and_mfu(step_flops, device_flops, measured_seconds):
    """(the fastest the step could run on this device in seconds, the MFU the measured step reached)."""
    ### BEGIN SOLUTION
    floor = step_flops / device_flops
    return floor, floor / measured_seconds
    ### END SOLUTION

# %%
# CHECK 07.4
lesson07.check_step_floor_and_mfu(step_floor_and_mfu)

# %%
# NBVAL_IGNORE_OUTPUT
from engine.gpt_config import GPTConfig, init_params
from engine.nn import GPT
from engine.timing import fixed_threads, median_seconds

step_cfg = bm.preset("tiny", micro_batch=4)
gcfg = GPTConfig(vocab_size=step_cfg.vocab_size, block_size=step_cfg.seq_len,
                 n_layer=step_cfg.n_layer, n_head=step_cfg.n_head, n_embd=step_cfg.d_model)
model = GPT(gcfg, init_params(gcfg, seed=0, dtype=np.float32))
ids = np.random.default_rng(0).integers(0, step_cfg.vocab_size, size=(4, step_cfg.seq_len))
with fixed_threads(1):
    machine = bm.this_machine()
    measured_step = median_seconds(lambda: model(ids, ids).backward(), 3, warmup=1)
step_flops = bm.flops(step_cfg)["per_step"]["total"]
print(f"{step_cfg.name}, B=4: {bm.human_flops(step_flops)} per step; this machine's float32 "
      f"matmul: {bm.human_flops(machine['device_flops'])}/s; "
      f"measured step: {bm.human_seconds(measured_step)}")
floor, tape_mfu = step_floor_and_mfu(step_flops, machine["device_flops"], measured_step)
# your floor is the calculator's step time at MFU 1 (one piece of arithmetic, two callers)
assert abs(floor - bm.budget(step_cfg.with_(mfu=1.0, **machine)).device.step_seconds) <= 1e-9 * floor
print(f"floor: {bm.human_seconds(floor)}; our tape engine's MFU: {tape_mfu:.2f}")
# the claim: the floor is a floor (with a margin for a machine busy while the matmul rate
# was measured)
assert measured_step > 0.5 * floor

# %% [markdown]
# The answers to the questions on paper. A step has to do all its FLOPs and the device does
# at most its rate of them per second, so step_flops / device_flops seconds is the least a
# step can take; everything else code does (waiting, moving memory, Python) only adds to it.
# That is why the floor is a floor. The MFU is the rate the step reached,
# step_flops / measured, over the device's rate: the floor over the measured time, at most 1
# because no step beats the floor. A value above 1 says the premise is wrong, not the code
# fast: the device's rate was measured low (a busy machine), or the step's FLOPs are counted
# high (the full attention matrix for a kernel that skips the masked half).
#
# What the measurement shows: where this lesson was written, the cell above printed an MFU
# of 0.46 to 0.47 over several runs, so about half, not near 1 and not far below. One
# thread is the setting that flatters a numpy engine: the step's large products run at
# close to the matmul rate the denominator was measured at, on the same thread, and what
# the step loses is the rest: every other op is a separate numpy call that reads and writes
# its arrays at memory speed (softmax, layer norm, GELU, the loss), the small products of
# a tiny model run below the large matmul's rate, and Python runs between the ops. Your
# number depends on your CPU; the reasoning does not.
#
# Read it as a share of *one thread's* rate. Lesson 13 quotes its fused trainer's MFU
# against the rate of *all cores* on a different matmul, so the two numbers answer
# different questions and are not to be set side by side. For a large model on a GPU, an
# MFU of 0.3 to 0.5 is what good runs reach (the calculator's default is 0.4): read the
# calculator's step time as "if my code is that good".
#
# ## A real framework's step
#
# Everything so far predicts a step written the way the formula thinks: each op keeps what its
# backward needs, in the step's precision, and the peak is the end of the forward. A real
# framework's step is code, and code keeps what its ops keep. Ten Hugging Face transformers
# steps were measured on a GPU (an NVIDIA H200, `torch.cuda.max_memory_allocated`, conditions in
# `engine/budget/measured/README.md`). Before you see them, predict one.
#
# Take GPT-2 small at B=8, N=1024, vocabulary V=50257, under `torch.autocast` to bf16, with
# SDPA attention. Its loss is transformers' own: the logits go through `logits.float()`, then
# `cross_entropy`, which is `log_softmax` followed by `nll_loss`. Questions to answer first, on
# paper:
#
# * how many tensors of shape [B·N, V] does the loss keep for its backward, and in which dtype?
#   (autocast runs `log_softmax` on its fp32 list)
# * which [B·N, V] tensors are alive while the backward of `log_softmax` runs, and how many
#   are there?
# * AdamW's state is created by the first `opt.step()`: is the first step's peak the same as
#   the second's?
#
# ## Exercise 07.5 · The peak inside the loss's backward
#
# Write `loss_peak(n_tokens, vocab, precision, other_saved, resident)`: the bytes alive while
# `log_softmax`'s backward runs in a transformers step. `resident` is what lives across steps
# at that moment (the fp32 weights and AdamW's state; the gradients, set to None by
# `zero_grad`, do not exist yet), `other_saved` what the forward saved apart from the loss's
# own [n, V] tensors, and `precision` is "fp32", "bf16" or "fp16" (autocast). Decide which
# [n, V] tensors are alive then and in which dtype.

# %%
def loss_peak(n_tokens, vocab, precision, other_saved, resident):
    """Bytes alive while log_softmax's backward runs in a transformers training step."""
    ### BEGIN SOLUTION
    fp32 = 4  # the loss works in fp32 whatever autocast does elsewhere
    # log_softmax's saved output, the gradient of that output (from nll_loss), and the
    # gradient of the logits it writes: three [n, V] tensors at once
    return resident + other_saved + 3 * n_tokens * vocab * fp32
    ### END SOLUTION

# %%
# CHECK 07.5
lesson07.check_loss_peak(loss_peak)

# %% [markdown]
# Now the measurements, beside what the budget predicts with `activations="hf"`: the same op
# lists, in the dtype each op keeps, with the step's moments in order. Nothing in it is fitted
# to this table; every term was checked against PyTorch's own allocator on the CPU at other
# shapes (`tests/test_budget_real_step.py`).

# %%
import json
from importlib.resources import files

measured_steps = json.loads(files("engine.budget").joinpath(
    "measured", "h200_hf_training_steps.json").read_text())["rows"]
LLAMA_1B = dict(architecture="llama", n_layer=22, d_model=2048, n_head=32, n_kv_head=4,
                d_ff=5632, vocab_size=32000, tied_embedding=False, block_size=0)
REAL_STEPS = [  # the table's rows, as budget settings
    ("gpt2-small", dict(micro_batch=8, precision="fp32", dropout=True)),
    ("gpt2-small", dict(micro_batch=8, precision="fp32")),
    ("gpt2-small", dict(micro_batch=8, precision="fp32", attention="flash")),
    ("gpt2-small", dict(micro_batch=8, precision="bf16", attention="flash")),
    ("gpt2-small", dict(micro_batch=8, precision="fp32", attention="flash", recompute="full")),
    ("gpt2-medium", dict(micro_batch=4, precision="fp32", dropout=True)),
    ("gpt2-medium", dict(micro_batch=8, precision="bf16", attention="flash")),
    ("gpt2-large", dict(micro_batch=8, precision="bf16", attention="flash", recompute="full")),
    ("tiny", dict(micro_batch=4, seq_len=2048, precision="bf16", attention="flash", **LLAMA_1B)),
    ("tiny", dict(micro_batch=4, seq_len=2048, precision="bf16", attention="flash",
                  recompute="full", **LLAMA_1B)),
]
real = [bm.budget(bm.preset(name, activation_model="hf", **changes))
        for name, changes in REAL_STEPS]
textbook = [bm.budget(bm.preset(name, activation_model="transformer", **changes))
            for name, changes in REAL_STEPS]
for b, row in zip(real, measured_steps):     # the budget for this code, against the GPU
    pairs = ((b.activations.saved, row["activations"]), (b.peak, row["peak_step2"]),
             (b.peak_first_step, row["peak_step1"]))
    assert all(abs(p / m - 1) < 0.05 for p, m in pairs), row["name"]
worst = max(abs(b.peak / row["peak_step2"] - 1) for b, row in zip(real, measured_steps))
missed = max(1 - t.peak / row["peak_step2"] for t, row in zip(textbook, measured_steps))
print(f"{len(measured_steps)} measured steps: the budget's peak within {worst:.1%} of every "
      f"one; the textbook formula misses up to {missed:.0%} of a peak")

fig, ax = plt.subplots(figsize=(9, 6))
plot_measured_steps(ax, [row["name"] for row in measured_steps],
                    [row["peak_step2"] for row in measured_steps],
                    [b.peak for b in real], [t.peak for t in textbook])
ax.set_title("Peak memory of the second step: measured, the budget, the formula")
plt.show()

# %%
GB = 1e9
folded_table("The numbers behind the bars (click to open): GB, predicted / measured",
             ["measured step", "activations", "peak (step 2)", "peak (step 1)",
              "textbook formula, peak"],
             [[row["name"]] + [f"{p / GB:.2f} / {m / GB:.2f}" for p, m in
                               ((b.activations.saved, row["activations"]),
                                (b.peak, row["peak_step2"]),
                                (b.peak_first_step, row["peak_step1"]))]
              + [f"{t.peak / GB:.2f}"]
              for b, t, row in zip(real, textbook, measured_steps)])

# %% [markdown]
# Every prediction lands within 1% of the measurement (the cell holds 5%); the textbook op
# list (the grey bars, the same settings under `activations="transformer"`) misses up to
# half of the peak. Where do the gigabytes come from? Ask the budget for the step's moments,
# in order, and what is alive at each: the strip below is the fourth step of the table
# (GPT-2 small, bf16 autocast, SDPA attention), the vocabulary-sized [B·N, V] tensors in
# red, the measured peak as a black line.

# %%
row4 = real[3]
fig, ax = plt.subplots(figsize=(8, 4.2))
plot_step_memory(ax, row4, n_tokens=8 * 1024, vocab=50257,
                 measured={row4.activations.step.peak_moment.name:
                           measured_steps[3]["phases_step2"]["peak"]})
ax.set_title("GPT-2 small, B=8, N=1024, bf16 autocast: memory through the step")
plt.show()
print(f"the peak: {row4.activations.step.peak_moment.name}, "
      f"{bm.human_bytes(row4.activations.step.peak_moment.bytes)}")

# %%
folded_table("What is alive at each moment, and the largest tensors the forward keeps "
             "(click to open)", ["moment", "alive", "bytes"],
             [[moment.name, what, bm.human_bytes(size)]
              for moment in row4.activations.step.moments for what, size in moment.alive]
             + [["kept by the forward", f"{item.op}: {item.tensor}"
                 + (f" (x{item.count} blocks)" if item.count > 1 else ""),
                 bm.human_bytes(item.bytes)]
                for item in sorted(row4.activations.items, key=lambda x: -x.bytes)[:6]])

# %% [markdown]
# Term by term, the gap between the formula and the GPU:
#
# * **The loss.** One fp32 [B·N, V] tensor (1.65 GB here) is kept by `log_softmax`, and its
#   backward allocates two more while it is alive: 4.9 GB of vocabulary-sized tensors at the
#   peak, the single largest item of the step. The formula's one fp32 softmax misses two.
# * **Code written as small ops.** transformers' GPT-2 GELU, `0.5*x*(1+tanh(...))`, keeps four
#   tensors of B·N·4d instead of one, and under autocast `pow` is on the fp32 list, so three of
#   them are fp32: 4.2 GB where the formula counts 0.6.
# * **Autocast's copies.** Each matmul saves a bf16 copy of its input while the residual stream
#   stays fp32, and every weight gets a bf16 copy (kept for the backward, or held in autocast's
#   cache until the forward ends, which sets the peak of checkpointed runs).
# * **Eager attention** keeps the T × T probabilities in fp32, plus the dropout mask and the
#   dropped copy when dropout is on (rows 1 and 6).
# * **The moment.** The peak is inside the loss's backward (or, with checkpointing, at the loss
#   in the forward), and step 1 peaks lower than step 2 by AdamW's 8 bytes per parameter.
#
# Our own trainer is the other way to write the same step: lesson 13's fused cross-entropy
# turns the logits into probabilities in place and writes their gradient over them, so one
# [B·N, V] buffer serves the forward and the backward.

# %%
n_tokens, vocab = 8 * 1024, 50257
one = n_tokens * vocab * 4                      # one fp32 [B·N, V] tensor
alive = dict(row4.activations.step.peak_moment.alive)
loss_tensors = (one + alive["gradient of the log_softmax output"]
                + alive["gradient of the logits (fp32)"])
print(f"transformers, at its peak: {loss_tensors // one} fp32 [B·N, V] tensors, "
      f"{bm.human_bytes(loss_tensors)}")
print(f"the fused trainer (lesson 13): 1 buffer (logits, then probabilities, then their "
      f"gradient, in place), {bm.human_bytes(one)}")

# %% [markdown]
# ### Which optimizer, and which outputs, the loop runs
#
# Two choices of the training loop, not of the model, move the peak too. The first is which
# of torch's three AdamW implementations runs. The *for-loop* one (`foreach=False,
# fused=False`) updates one parameter at a time, so its temporaries are the size of the
# largest parameter. The *foreach* one runs each line of the update as one list operation
# over every tensor of a param group: `torch._foreach_sqrt(exp_avg_sq)` holds a square root
# of the whole group at once, 4 bytes per parameter in fp32. The *fused* one (`fused=True`)
# is one kernel that updates in place and allocates nothing. Which one you get depends on
# how the loop builds it: transformers' `Trainer` asks for `adamw_torch_fused` by default,
# while a plain `torch.optim.AdamW(params)` picks foreach when every tensor is on CUDA. The
# second choice is whether the loop holds the model's output through the backward:
# nanoGPT's `logits, loss = model(x, y)` keeps the logits until the next forward returns
# them, while the `Trainer` keeps only the loss. The budget reads both from the loop it
# models (`engine/budget/frameworks.py`), and its knobs `optimizer_impl` and `outputs`
# override them.
#
# These temporaries are measured, not guessed. With torch 2.13 on a CPU, the allocator's
# memory events inside one `step()` of AdamW over ten tensors of a million parameters each
# (40 MB of fp32 weights) show 40.0 MB beyond the state for foreach, 12.0 MB for the
# for-loop (the previous tensor's quotient is still alive beside this one's square root and
# quotient: three at once) and nothing for fused; the budget predicts each to the byte
# (`tests/test_budget_optimizer_step.py`).
#
# The optimizer's choice matters when the activations are small beside the 16 bytes per
# parameter: fine-tuning at micro-batch 1. The budget for LLaMA-2 7B at B=1, N=1024, bf16,
# under both optimizers:

# %%
for impl, who in (("fused", "transformers' Trainer, adamw_torch_fused"),
                  ("foreach", "torch.optim.AdamW(params) on CUDA")):
    step = bm.budget(bm.preset("llama2-7b", activation_model="hf", micro_batch=1,
                               seq_len=1024, optimizer_impl=impl))
    moment = step.activations.step.peak_moment
    print(f"{impl:>8} ({who}): peak {bm.human_bytes(step.peak)}, at {moment.name}")
    extra = [size for what, size in moment.alive if what.startswith("AdamW foreach")]
    if extra:
        print(f"{'':>10}of which the foreach square root over the whole group: "
              f"{bm.human_bytes(extra[0])}")

# %% [markdown]
# With the fused optimizer the step peaks at the end of the forward, and the optimizer adds
# nothing; with foreach the optimizer step itself becomes the peak, by the size of the
# group's fp32 temporary. At a longer sequence or a larger batch the activations outgrow that
# temporary, and the choice no longer shows in the peak.

# %% [markdown]
# ### Fine-tuning with LoRA adapters
#
# Most fine-tunes on one GPU freeze the model and train small LoRA adapters beside some of
# its linear layers (peft's `LoraConfig`): each adapted layer computes `W x + B A x`, with A
# of rank r by the layer's input width and B of its output width by r. Only A and B get
# gradients and AdamW's state, so those terms shrink from 12 bytes per parameter to 12 bytes
# per *adapter* parameter. The weights do not shrink: the frozen model still sits in memory.
# And the activations barely move, because autograd keeps what the *gradients that are
# still computed* read. A frozen layer's input is no longer kept (its weight gets no
# gradient), but every other tensor on the way back to the first adapter is still needed
# to carry the gradient there, and each adapter keeps its own low-rank output A x. The
# budget's knobs `lora_rank`, `lora_targets` and `lora_dropout` follow peft (see
# `engine/budget/lora.py`, each term checked against peft's steps on a CPU). Llama 3.2 1B
# at one sequence of 2,048 tokens, bf16:

# %%
ALL_LINEARS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
base = bm.preset("llama3.2-1b", activation_model="hf", attention="flash", seq_len=2048)
print(f"{'':<28}{'trainable':>10}{'weights':>10}{'grads+state':>13}{'activations':>13}"
      f"{'peak':>10}")
for label, changes in (("full fine-tune", {}),
                       ("LoRA r=8 on q_proj,v_proj", dict(lora_rank=8)),
                       ("LoRA r=64 on every linear", dict(lora_rank=64,
                                                           lora_targets=ALL_LINEARS))):
    step = bm.budget(base.with_(**changes))
    fixed = step.fixed_per_device
    print(f"{label:<28}{bm.human_count(bm.trainable_parameter_count(step.config)):>10}"
          f"{bm.human_bytes(fixed['weights'] + fixed['master weights']):>10}"
          f"{bm.human_bytes(fixed['gradients'] + fixed['optimizer state']):>13}"
          f"{bm.human_bytes(step.activations.saved):>13}{bm.human_bytes(step.peak):>10}")

# %% [markdown]
# Gradients and optimizer state fall more than twenty-fold (over a thousand-fold at rank 8,
# on two layers); the weights stay
# (a little larger, by the adapters); the activations fall by a fifth at rank 8 on two
# layers (the frozen MLP's and projections' inputs go) and by less than a tenth at rank 64
# on every linear layer, where each adapter keeps its own low-rank output. The peak halves,
# but what is left is the frozen weights and the activations, which LoRA hardly touches:
# to fit a longer sequence, checkpointing (`recompute="full"`) still does more than any rank.

# %% [markdown]
# The widget above offers the same choices: the activation model (`pytorch` for a plain
# PyTorch GPT as nanoGPT writes it, `hf` for transformers), `attention` (standard keeps the
# T × T probabilities, flash one number per row) and recompute (`full` checkpoints every block,
# as `gradient_checkpointing_enable()` does). With PyTorch installed,
# `python -m engine.budget ... --measure torch` runs the same step and prints measured beside
# predicted, on a GPU at your shape, on the CPU at a scaled-down one.
#
# ## The command line
#
# Practitioners do not need the notebook: `python -m engine.budget` has the same presets and
# knobs (`--help` lists them) and `--json` for scripts.

# %%
report = subprocess.run([sys.executable, "-m", "engine.budget", "--preset", "7b-example"],
                        capture_output=True, text=True, check=True)
print(report.stdout)

# %% [markdown]
# ## What you built, and what it costs
#
# * A training step costs about **6 FLOPs per parameter per token** (2 forward, 4 backward)
#   plus attention's 12·L·N·d, and recompute adds up to one more forward (+33%).
# * The fixed memory is **16 bytes per parameter** for AdamW, mixed precision or not (18 with
#   an fp32 gradient buffer); it does not depend on the batch.
# * The activations grow with B × N (and N² through attention). You found the batch where
#   they overtake the fixed memory; past it, the batch shape decides whether a step fits.
# * The engine's own activation model equals its measurement exactly; the rule of thumb and
#   the per-op transformer count let you reason about models the engine cannot run here.
# * A real framework's step keeps what its code keeps: the loss's fp32 [B·N, V] tensors (three
#   at the peak), autocast's copies, every small op's saved input. The budget's `hf` and
#   `pytorch` models follow that code and land within 1% of ten measured GPU steps.
# * A step's FLOPs over the device's FLOP/s is the floor of its time; floor / measured is the
#   MFU the code reached. On one thread our tape engine reached about half of this
#   machine's matmul rate: its large products run near that rate, its other ops and
#   Python do not.
# * Next, lesson 08 measures the two levers this budget exposes: gradient accumulation and
#   activation checkpointing.
