# %% [markdown]
# # 06 · Activation memory
#
# **Goals.** By the end of this lesson you will
# 1. know why training needs far more memory than inference: every value a backward rule
#    reads must survive from the forward pass until the backward reaches it;
# 2. read the tape's report of what each op saved (op, tensor, shape, dtype, bytes);
# 3. predict the saved bytes of an MLP and count the saved elements of a GPT block yourself,
#    and check both against what the engine *measures*;
# 4. see that activations grow with batch B, sequence N, width d and depth L, while the
#    weights grow with neither B nor N;
# 5. watch the live bytes rise through the forward pass and fall through the backward;
# 6. decide how many sequences fit in a device by the rule of thumb that write-ups on
#    training memory use (k saved tensors of B × N × d per layer), and redo its two usual
#    worked examples: 134 MB per tensor and 17 GB for a 7B model, 12.9 GB for a
#    24-layer model whose weights are under a gigabyte.
#
# Everything measured here comes from `engine.memory`, which watches the tape: it is not an
# estimate. The formulas come from `engine.budget`, which the next lesson's calculator uses.
#
# **Your pieces in the engine.** Fills: the per-block count of the activation model (06.2
# `block_saved_elements`, checked against `engine.memory` and kept as a piece; lesson 07's
# budget runs it beside `engine.budget`'s own count). 06.1 and 06.3 are checked against
# `engine.memory` and `engine.budget`, not saved. Runs: no earlier pieces. (The whole map:
# CONTRIBUTING.md, "Exercise <-> slot".)

# %%
import numpy as np
import matplotlib.pyplot as plt

import engine
from engine import Tensor, memory
from engine import budget as bm
from engine.budget.lab import measure
from engine.gpt_config import GPTConfig, init_params
from engine.nn import GPT, MLP, Linear
from coursework import lesson06
from widgets.memory_timeline import MemoryTimeline

lesson06.name_unfinished_exercises()   # a cell that needs an unfinished exercise says which


def show_saved(recorder, scope_prefix=""):
    """One line per array the tape saved: where, which slot, shape, dtype, bytes counted."""
    print(f"{'op':<26} {'saved':<8} {'shape':<16} {'dtype':<8} {'bytes':>10}  note")
    for s in recorder.saved:
        if not s.scope.startswith(scope_prefix):
            continue
        if s.kind == "parameter":
            note = f"weight {s.tensor}: exists anyway, not counted"
        elif s.counted_bytes == 0:
            note = "same buffer as above: counted once"
        else:
            note = ""
        counted = s.counted_bytes if s.kind == "activation" else 0
        print(f"{s.where:<26} {s.slot:<8} {str(s.shape):<16} {s.dtype:<8} {counted:>10,}  {note}")
    print(f"activation bytes saved: {recorder.saved_bytes:,}")

# %% [markdown]
# ## Inference forgets, training remembers
#
# In lesson 01 the backward pass of `L = (w2·relu(w1·x) - y)²` needed `a1` to compute
# `dL/dw2`, and `x` and the sign of `z1` to compute `dL/dw1`. Those are forward values. A
# forward pass that will be followed by a backward must therefore *keep* them; a forward pass
# for inference can drop each layer's values as soon as the next layer has read them.
#
# Our engine makes this visible. Every op's rule calls `save(...)` for exactly what its VJP
# reads (see `engine/rules.py`), and `engine.memory.record()` lists those arrays. Here is
# one linear layer and a tanh, `tanh(x @ W + b).sum()`, on a batch of 2 inputs with 3
# features and 4 outputs, in float64 (8 bytes per number):

# %%
layer = Linear(3, 4, seed=0)
x = np.random.default_rng(0).normal(size=(2, 3))

with memory.record() as mem:
    loss = layer(Tensor(x)).tanh().sum()
    loss.backward()
show_saved(mem)

with engine.no_grad(), memory.record() as mem_inference:
    layer(Tensor(x)).tanh().sum()
print(f"the same forward under no_grad (inference): {mem_inference.saved_bytes} bytes saved")

# %% [markdown]
# Read the table row by row:
#
# * `matmul` keeps its input `x` (2×3×8 = 48 bytes), because the weight's gradient is
#   `x^T @ g` (lesson 03). It does not keep the weight: `x` needs no gradient, so `g @ W^T`
#   is never computed. (When it does keep a weight, the table says so and does not count it:
#   the weights exist anyway, they are the model, not activations.)
# * `tanh` keeps its output (2×4×8 = 64 bytes): its derivative is `1 - out²`.
# * The bias add and the final sum keep nothing: their VJPs pass `g` through or broadcast it.
#
# **Two kinds of memory.** Under `no_grad` the tape records nothing and keeps nothing: that
# is inference. "Nothing saved" is not "no memory", though. Inference still needs *working
# memory*: while a layer computes, its input and its output are both alive, and the input is
# dropped once the next layer has read the output. Inference's working memory is therefore
# the largest pair of neighbouring activations, **whatever the depth**. Memory *saved for
# the backward* is the sum over all layers, each kept alive until the backward reaches it: it
# **grows with the depth**, and it is what this lesson measures.
#
# ## Exercise 06.1 · Predict what an MLP keeps
#
# Now a two-layer ReLU MLP, `fc2(relu(fc1(x)))`, with a bias in each layer: predict, before
# you measure, what the tape keeps. Write `mlp_saved_bytes(batch, n_in, n_hidden, n_out,
# itemsize)`: the activation bytes our engine saves for a forward and backward of
# `MLP(n_in, n_hidden, n_out, activation="relu")` on an input of shape `(batch, n_in)`, with
# `itemsize` bytes per number. Go op by op (matmul, bias add, relu, matmul, bias add, sum) and
# ask for each: what does its VJP read? (ReLU's derivative is the mask `out > 0`.) An array
# that two ops keep is one buffer: count it once. The check measures the engine with
# `engine.memory` on several shapes (float64 and float32) and compares; then the lesson
# shows you the measurement.

# %%
def mlp_saved_bytes(batch, n_in, n_hidden, n_out, itemsize):
    """Activation bytes the tape keeps for a ReLU MLP: count each saved buffer once."""
    ### BEGIN SOLUTION
    x_kept_by_fc1 = batch * n_in
    relu_output_kept_once = batch * n_hidden   # relu and fc2 share this buffer
    return itemsize * (x_kept_by_fc1 + relu_output_kept_once)
    ### END SOLUTION

# %%
# CHECK 06.1
from coursework import lesson06
lesson06.check_mlp_saved_bytes(mlp_saved_bytes)

# %% [markdown]
# Here is the measurement your prediction had to match, for a batch of 4 inputs with 3
# features, a hidden layer of 5 and 2 outputs:

# %%
mlp = MLP(3, 5, 2, activation="relu", seed=0)
x = np.random.default_rng(0).normal(size=(4, 3))
with memory.record() as mem:
    mlp(Tensor(x)).sum().backward()
show_saved(mem)
print(f"your prediction: {mlp_saved_bytes(4, 3, 5, 2, 8):,} bytes")

# %% [markdown]
# * `fc1/matmul` keeps its input `x` (4×3×8 = 96 bytes), for the weight gradient `x^T @ g`.
# * `relu` keeps its output (4×5×8 = 160 bytes): the mask `out > 0` is its whole derivative.
# * `fc2/matmul` keeps its weight (for the gradient of its input) and its input, which is
#   ReLU's output: the same array, so it costs nothing extra. The weight is not counted.
# * The network's output is kept by no one: the sum's VJP only broadcasts `g`.
#
# So `itemsize · batch · (n_in + n_hidden)`, whatever `n_out` is. Under `no_grad` the same
# MLP keeps nothing, and its working memory is at most `x` and the hidden array together.
# A ten-layer MLP would keep ten such arrays for the backward; its inference would still need
# only two at a time.

# %% [markdown]
# ## What a GPT block keeps
#
# The reference GPT (`engine.nn.GPT`) is the model the trainer runs: pre-LayerNorm blocks,
# causal multi-head attention, a GELU MLP of width 4C. Run a one-block model on B=2
# sequences of T=8 tokens with C=16 features and H=2 heads (float32, 4 bytes) and list what
# block `h0` saved:

# %%
small = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16)
model = GPT(small, init_params(small, seed=0))
ids = np.random.default_rng(1).integers(0, 11, size=(2, 8))

with memory.record() as mem:
    model(ids, ids).backward()
show_saved(mem, scope_prefix="h0")

# %% [markdown]
# The entries, in the order the forward made them:
#
# * each **layer norm** keeps the normalised input `xhat` (B,T,C) and `rstd`, one number per
#   row (B,T): its backward needs both, not the raw input;
# * the **qkv matmul** keeps its input; **attention** keeps `q`, `k`, `v` (three views of
#   the one (B,T,3C) buffer the qkv matmul made, counted once) and the probabilities `att`,
#   one T×T matrix per head and sequence: the only term that grows like T²;
# * the **projection** keeps the merged heads; the **MLP** keeps the fc input, the GELU's
#   input `u` (B,T,4C) and the GELU's output (another (B,T,4C), read by fc-proj).
#
# Bias adds, residual adds, and the reshapes that split and merge heads keep nothing.
#
# ## Exercise 06.2 · Count a block
#
# Write `block_saved_elements(B, T, C, H)`: the number of float elements one block of
# `engine.nn.GPT` saves. The check measures a 2-block and a 1-block GPT on several shapes and
# compares your count with the difference. When it passes, your function is saved as a
# piece: lesson 07 builds its activation budget on your count.

# %%
def block_saved_elements(B, T, C, H):
    """Float elements one GPT block keeps for its backward (each buffer once)."""
    ### BEGIN SOLUTION
    layer_norms = 2 * (B * T * C + B * T)          # xhat and rstd, twice
    attention = B * T * C + 3 * B * T * C + B * H * T * T + B * T * C
    #           qkv input   q, k, v (one buffer)  att         proj input
    mlp = B * T * C + 4 * B * T * C + 4 * B * T * C  # fc input, gelu input, gelu output
    return layer_norms + attention + mlp
    ### END SOLUTION

# %%
# CHECK 06.2
lesson06.check_block_saved_elements(block_saved_elements)

# %% [markdown]
# Collect the terms: **16·B·T·C + 2·B·T + B·H·T²** elements per block. Sixteen tensors the
# size of the block's input, plus attention's T×T matrices. Remember the 16: the usual worked
# example of a 24-layer model (the `24-layer-example` preset) assumes "16 saved tensors per
# layer", and for our engine it is exact.
#
# ## The whole model: predicted equals measured
#
# Outside the blocks the model keeps the token ids (int64), the final layer norm, the head's
# input, and the loss's probabilities over the vocabulary (B,T,V) and targets.
# `engine.budget`'s "engine" activation model lists every one of these; on the trainer's
# `tiny` configuration (L=4, C=128, H=4, B=16, T=128, V = the characters of the built-in
# corpus) it should match the measurement to the byte.

# %%
tiny = bm.preset("tiny")
print(f"tiny: L={tiny.n_layer} C={tiny.d_model} H={tiny.n_head} V={tiny.vocab_size} "
      f"B={tiny.micro_batch} T={tiny.seq_len}")
print(f"{'op':<24} {'tensor':<22} {'count':>5} {'bytes':>12}")
for item in bm.engine_saved_tensors(tiny):
    print(f"{item.op:<24} {item.tensor:<22} {item.count:>5} {item.bytes:>12,}")
measured = measure(tiny)
print(f"predicted {measured['predicted_saved']:,} bytes, measured {measured['measured_saved']:,} "
      f"bytes: equal = {measured['predicted_saved'] == measured['measured_saved']}")
print(f"the weights of the same model: {measured['measured_weights']:,} bytes")

# %% [markdown]
# The activations of one micro-batch of the tiny model are about 26 times its weights.
#
# ## What grows, and what does not
#
# Change one size at a time, starting from a small model, and measure both the saved
# activations and the weights:

# %%
def measured_bytes(L=2, C=32, H=2, B_=4, T=32, V=50):
    cfg = bm.BudgetConfig(n_layer=L, d_model=C, n_head=H, vocab_size=V, micro_batch=B_,
                         seq_len=T, activation_model="engine")
    m = measure(cfg)
    return m["measured_saved"], m["measured_weights"]


base = dict(L=2, C=32, H=2, B_=4, T=32)
print(f"{'change':<16} {'activations':>12} {'x base':>7} {'weights':>10} {'x base':>7}")
acts0, weights0 = measured_bytes(**base)
for label, change in [("base", {}), ("B x 2", {"B_": 8}), ("T x 2", {"T": 64}),
                      ("C x 2", {"C": 64}), ("L x 2", {"L": 4})]:
    acts, weights = measured_bytes(**{**base, **change})
    print(f"{label:<16} {acts:>12,} {acts / acts0:>7.2f} {weights:>10,} {weights / weights0:>7.2f}")

# %% [markdown]
# Doubling the batch doubles the activations exactly, and leaves the weights alone. Doubling
# T more than doubles them (attention's T² term; with our small C it is a large share), and
# the weights only grow by the position table. Doubling C doubles most terms but the weights
# grow about 4x (they go like C²). Doubling L doubles what the blocks keep.
#
# That asymmetry is why "reduce the batch size" is the first answer to an out-of-memory
# error: the model has not changed, only the activations have. Here is the tiny model's
# prediction as B grows, against its fixed memory (weights, gradients and AdamW state in
# fp32: 16 bytes per parameter, lesson 07):

# %%
sweep = bm.batch_sweep(tiny, [1, 8, 16, 24, 32, 40, 48, 56, 64])
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(sweep["micro_batch"], [v / 1e6 for v in sweep["activations"]], "o-",
        label="activations (engine model)")
ax.plot(sweep["micro_batch"], [v / 1e6 for v in sweep["fixed"]], "s-",
        label="weights + grads + AdamW state")
ax.set_xlabel("micro-batch B (sequences of 128 tokens)")
ax.set_ylabel("MB")
ax.set_xlim(left=0), ax.set_ylim(bottom=0)   # linear axes: linear growth is a straight line
ax.legend()
plt.show()
print(f"activations overtake the fixed memory at B = {bm.crossover_batch(tiny)}")

# %% [markdown]
# ## The timeline of a step
#
# The recorder also notes the live activation bytes after every op of the forward and after
# every VJP of the backward, freeing each node's saved arrays as soon as its VJP has run. The
# curve climbs through the forward, peaks when the loss is computed, and falls back to zero
# as the backward walks the tape in reverse: the last layer's activations are the first to
# go. This is what the cells below measure and draw (the tiny model at B = 4; a smaller batch
# than the preset keeps the plot readable, the shape of the curve is the same):
#
# ![Live activation bytes of one step of the tiny GPT at B = 4: a staircase rising through
# the forward to a peak of 21.7 MB at the loss, then falling to zero through the
# backward](images/06_memory_timeline.png)
#
# Both axes are linear: each of the 4 blocks adds the same stairs on the way up and removes
# them on the way down, so growth with depth is a straight climb. Run the cells to get the
# live version, and drag its slider to walk through the step one op at a time.

# %%
timeline_cfg = bm.preset("tiny", micro_batch=4)
run = measure(timeline_cfg)
print(f"peak live: measured {run['measured_peak']:,} bytes, predicted "
      f"{run['predicted_peak']:,} bytes")
print(f"steps: {sum(p == 'forward' for p, _, _ in run['timeline'])} ops forward, "
      f"{sum(p == 'backward' for p, _, _ in run['timeline'])} VJPs backward")

# %%
# NBVAL_IGNORE_OUTPUT
timeline = MemoryTimeline(run["timeline"], predicted_peak=run["predicted_peak"])
timeline.ui

# %%
for step in (0, len(timeline.points) // 4, len(timeline.points) // 2, len(timeline.points) - 1):
    print(timeline.describe(step))

# %% [markdown]
# Without recompute, nothing is freed before the backward starts, so the peak of the
# timeline is exactly the total the forward saved. Lesson 08 changes that: checkpointing
# frees a block's insides during the forward and rebuilds them in the backward.
#
# ## The rule of thumb and its worked numbers
#
# Write-ups on training memory estimate activations with a rule of thumb that knows nothing
# of the ops:
# every layer keeps *k* tensors the size of its input, a B × N × d activation, at some bytes
# per element. (For our engine, 06.2 says k = 16, plus the T×T term.)
#
# ## Exercise 06.3 · How many sequences fit?
#
# The first question a memory budget answers is a design decision: how large can the
# micro-batch be? Write `micro_batch_that_fits(memory_bytes, N, d, L, k, bytes_per_element)`:
# the largest micro-batch B whose activations, by the rule of thumb, fit in `memory_bytes`
# (0 when not even one sequence fits). Activations only; lesson 07 adds the weights,
# gradients and optimizer state. Work out first what *one* sequence of N tokens costs in all
# L layers; then decide how to turn "this many bytes per sequence" into a whole number of
# sequences that fits. The check asks about the two worked examples (a 7B model: L=32,
# d=4096, N=2048, 16-bit, k=4, in an 80 GB device; a 24-layer model: d=1024, N=2048, bf16,
# k=16, in 16 GB and in 40 GB) and a few more, and compares with `engine.budget`'s own
# search (`largest_micro_batch` on its "rule" activation model).

# %%
def micro_batch_that_fits(memory_bytes, N, d, L, k, bytes_per_element):
    """Largest B whose rule-of-thumb activations (k tensors of B x N x d per layer) fit."""
    ### BEGIN SOLUTION
    one_sequence = N * d * k * L * bytes_per_element
    return memory_bytes // one_sequence
    ### END SOLUTION

# %%
# CHECK 06.3
lesson06.check_micro_batch_that_fits(micro_batch_that_fits)

# %% [markdown]
# One sequence costs N·d·k·L·bytes, so the rule of thumb is **B·N·d·k·L·bytes** of
# activations, and the batch that fits is the memory divided by one sequence's bytes,
# rounded *down* (one sequence more would not fit). The two worked examples at their own
# micro-batch, B = 8, beside their weights, in the rule of thumb's terms:

# %%
seven_b = bm.budget(bm.preset("7b-example"))
print(f"7B example: one B x N x d tensor = {bm.human_bytes(seven_b.one_tensor_bytes)} "
      f"({seven_b.one_tensor_bytes:,} bytes)")
print(f"  x {seven_b.config.tensors_per_layer} tensors x {seven_b.config.n_layer} layers = "
      f"{bm.human_bytes(seven_b.activations.saved)} of activations")
print(f"  weights in 16-bit: {bm.human_bytes(seven_b.fixed['weights'])}")
print(f"  sequences whose activations fit in 80 GB: "
      f"{micro_batch_that_fits(80 * 10**9, 2048, 4096, 32, 4, 2)}")

ex24 = bm.budget(bm.preset("24-layer-example"))
print(f"24-layer example: {bm.human_bytes(ex24.activations.saved)} of activations "
      f"for {bm.human_count(ex24.parameters)} parameters = "
      f"{bm.human_bytes(ex24.fixed['weights'])} of bf16 weights")
print(f"  sequences whose activations fit in 16 GB: "
      f"{micro_batch_that_fits(16 * 10**9, 2048, 1024, 24, 16, 2)}")

# %% [markdown]
# Activations are the larger half of the 7B model's memory, and for the 24-layer model they
# dwarf the weights: 12.9 GB against 0.71 GB. Double the sequence and the activations double
# (the rule of thumb is linear in N; the real T² term of attention makes it worse).
#
# How good is "k tensors per layer"? For our engine it is exact with k = 16, plus the T×T
# term. The per-op count of Korthikanti et al. (2022), for a 16-bit GPT layer with dropout
# (1-byte masks), is s·b·h·(34 + 5·a·s/h) bytes: 34 bytes per token and feature, which is
# 16 saved tensors at 2 bytes plus two dropout masks, and five bytes per attention score.
# `engine.budget`'s "transformer" model lists it op by op:

# %%
layer_cfg = bm.preset("24-layer-example", activation_model="transformer", dropout=True)
s, b, h, a = layer_cfg.seq_len, layer_cfg.micro_batch, layer_cfg.d_model, layer_cfg.n_head
print(f"{'op':<30} {'tensor':<20} {'bytes':>14}")
for item in bm.transformer_layer_ops(layer_cfg):
    print(f"{item.op:<30} {item.tensor:<20} {item.bytes:>14,}")
per_layer = sum(item.bytes for item in bm.transformer_layer_ops(layer_cfg))
print(f"per layer {per_layer:,} = sbh(34 + 5as/h) = "
      f"{bm.korthikanti_layer_bytes(s, b, h, a):,}")
print(f"x {layer_cfg.n_layer} layers = {bm.human_bytes(layer_cfg.n_layer * per_layer)} "
      f"(the rule of thumb with k=16 said {bm.human_bytes(ex24.activations.saved)})")

# %% [markdown]
# At N = 2048 with 16 heads, the attention scores (5·a·s/h = 160 bytes per token and
# feature, against 34) are most of the memory: the rule of thumb, which has no T² term,
# underestimates by about 6x. This is exactly what FlashAttention-style kernels remove: they never
# keep the T×T matrices, and rebuild them in the backward instead.
#
# ## What you built, and what it costs
#
# * You counted, buffer by buffer, what an MLP and a GPT block keep for the backward, and the
#   engine's measurement agreed: **16·B·T·C + 2·B·T + B·H·T²** floats per block.
# * Activations scale with B, N, d and L (and N² for attention); weights scale with neither
#   B nor N. At training batch sizes the activations are the larger part of memory.
# * The live bytes peak at the end of the forward pass and drain during the backward, in
#   reverse order.
# * Cost: every one of those bytes lives for the whole forward-and-backward of a
#   micro-batch. The next lesson puts them in a budget beside the weights, gradients and
#   optimizer state, and counts the FLOPs.
