# %% [markdown]
# # 11 · Embeddings
#
# **Goals.** By the end of this lesson you will have
# 1. seen that the embedding's forward is not a matmul but a *gather* (a row lookup), and
#    that its backward is the transpose of a gather: a *scatter-add*;
# 2. watched repeated token ids break the obvious numpy one-liner, and a parallel
#    scatter-add lose updates and change its last bits from run to run;
# 3. written a scatter-add that is exact, parallel and bit-for-bit deterministic
#    (exercise 11.1), the kernel the trainer's embedding runs on;
# 4. checked your scatter-add's gradient with your own gradient checker of lesson 04;
# 5. measured how much of an embedding gradient is structurally zero at real vocabulary
#    sizes, and counted what a dense and a row-sparse gradient cost in bytes (exercise 11.2);
# 6. worked out why dense AdamW quietly changes what a sparse gradient means
#    (exercise 11.3).
#
# Every other layer of a transformer is dense: each weight meets every token. The token
# embedding is the exception, and its gradient is where ordering, determinism and memory
# problems of the backward pass show up first.
#
# **Your pieces in the engine.** Fills: the trainer's embedding backward, a deterministic
# scatter-add (11.1, `embedding_backward`); lesson 13's trainer runs it. Runs: your
# gradient checker (04.3, `spot_check`), on your scatter-add in float64; the engine's
# checker runs instead, saying why, when yours is not saved. (The whole map:
# CONTRIBUTING.md, "Exercise <-> slot".)

# %%
import engine.numba_config  # noqa: F401  (first: numba's threads wait asleep, see lesson 10)

import re

import numpy as np
import matplotlib.pyplot as plt
import numba
from numba import njit, prange
from coursework import lesson11

lesson11.name_unfinished_exercises()   # a cell that needs an unfinished exercise says which

np.set_printoptions(precision=4, suppress=True)

# %% [markdown]
# ## Forward: a gather
#
# The embedding table `E` has one row of C numbers per token of the vocabulary, shape
# (V, C). The forward pass turns a sequence of token ids into their rows:
#
# $$y_t = E[\mathrm{id}_t, :].$$
#
# No arithmetic at all: a lookup, `E[ids]` in numpy.

# %%
V, C = 6, 3
E = np.arange(V * C, dtype=float).reshape(V, C) / 10
ids = np.array([2, 0, 2, 5])
y = E[ids]
print("E =\n", E)
print("ids =", ids)
print("y = E[ids] =\n", y)

# %% [markdown]
# ## Backward: a scatter-add
#
# Row `t` of `y` is a copy of row `id_t` of `E`, so the upstream gradient of row `t` flows
# back into that one row of the table. A row that several tokens read gets the **sum** of
# their gradients (fan-out sums, lesson 02), and a row no token read gets exactly zero:
#
# $$\frac{\partial L}{\partial E[v,:]} = \sum_{t\,:\,\mathrm{id}_t = v} \frac{\partial L}{\partial y_t}.$$
#
# One way to see it: the gather is a matmul with a one-hot matrix, `y = onehot(ids) @ E`,
# so its VJP is `dE = onehot(ids).T @ dy` (lesson 03). That is exact, and a terrible way to
# compute it: the one-hot matrix has N·V entries, 2·10⁹ for 16 384 tokens and a
# 128 000-token vocabulary. The scatter-add does the same sum with N·C additions.

# %%
rng = np.random.default_rng(0)
dy = rng.normal(size=(ids.size, C)).round(2)
onehot = np.zeros((ids.size, V))
onehot[np.arange(ids.size), ids] = 1.0
dE_onehot = onehot.T @ dy

dE_loop = np.zeros((V, C))
for t, v in enumerate(ids):
    dE_loop[v] += dy[t]

print("dy =\n", dy)
print("dE (scatter-add) =\n", dE_loop)
print("equals onehot.T @ dy:", np.allclose(dE_loop, dE_onehot))
print("rows never read (1, 3, 4) are zero:", np.all(dE_loop[[1, 3, 4]] == 0))

# %% [markdown]
# ## Repeated ids break the one-liner
#
# Token 2 appears twice above. The obvious numpy line, `dE[ids] += dy`, looks like the
# loop but is not: numpy evaluates `dE[ids] + dy` into a temporary first and then assigns
# each row, so for a repeated id the later assignment overwrites the earlier one.
# `np.add.at` is the unbuffered version that adds repeats one after another.

# %%
dE_buffered = np.zeros((V, C))
dE_buffered[ids] += dy
dE_add_at = np.zeros((V, C))
np.add.at(dE_add_at, ids, dy)
print("dE[ids] += dy, row 2:    ", dE_buffered[2], "(only the second token's gradient)")
print("np.add.at, row 2:        ", dE_add_at[2], "(both tokens)")
print("np.add.at equals the loop:", np.array_equal(dE_add_at, dE_loop))

# %% [markdown]
# No error, no warning: a gradient that is wrong exactly where tokens repeat, which in text
# is everywhere ("the", spaces, newlines).
#
# ## Races: what threads do to a scatter-add
#
# To use all cores, the natural plan is to give each thread a slice of the tokens. Two
# threads may then add into the same row at the same time. An addition into memory is three
# steps, *read, add, write*, and nothing stops the two threads' steps from interleaving.
# Here is one interleaving, step by step, for two tokens with the same id:

# %%
def interleave(schedule, start=0.0, contributions=None):
    """Run read/add/write steps of two 'threads' in the given order on one memory cell."""
    memory = start
    register = {}
    lines = []
    for thread, step in schedule:
        if step == "read":
            register[thread] = memory
            lines.append(f"thread {thread} reads  {memory:4.1f}")
        else:
            memory = register[thread] + contributions[thread]
            lines.append(f"thread {thread} writes {memory:4.1f} "
                         f"(= {register[thread]:.1f} + {contributions[thread]:.1f})")
    return memory, lines


grads = {"A": 1.5, "B": 2.0}
serial, _ = interleave([("A", "read"), ("A", "write"), ("B", "read"), ("B", "write")],
                       contributions=grads)
racy, lines = interleave([("A", "read"), ("B", "read"), ("A", "write"), ("B", "write")],
                         contributions=grads)
print("\n".join(lines))
print(f"result {racy:.1f}; one after the other it would be {serial:.1f}: "
      f"thread A's {grads['A']} is lost")

# %% [markdown]
# Now a real one. The kernel below gives each thread a slice of 2 million tokens, all with
# ids among 8 rows, and every gradient is 1.0: each row's correct total is simply how often
# its id occurs. Every missing unit is a lost update. How many are lost depends on how the
# threads happen to overlap, so the cell's output differs from run to run (and with a
# single thread, or when the operating system runs the two threads one after the other,
# nothing is lost: a race is a possibility, not a certainty).

# %%
@njit(parallel=True)
def scatter_add_racy(ids, g, vocab_size):
    d = np.zeros((vocab_size, g.shape[1]), g.dtype)
    for t in prange(ids.size):                # tokens split between threads: a race
        for c in range(g.shape[1]):
            d[ids[t], c] += g[t, c]
    return d


ids_many = rng.integers(0, 8, size=2_000_000)
ones = np.ones((ids_many.size, 4), np.float32)
expected_total = float(ids_many.size * 4)

# %%
# NBVAL_IGNORE_OUTPUT
print(f"threads: {numba.get_num_threads()}; five runs of 2 million tokens ...", flush=True)
for run in range(5):
    d = scatter_add_racy(ids_many, ones, 8)
    lost = expected_total - float(d.sum(dtype=np.float64))
    # a race can only drop updates, never invent one (how many: up to the threads' timing)
    assert 0 <= lost <= expected_total, f"the racy kernel gained {-lost:,.0f} updates"
    print(f"run {run}: {lost:9,.0f} of {expected_total:,.0f} updates lost")

# %% [markdown]
# ## Even without losses, the order changes the bits
#
# Atomic additions (hardware instructions that make read-add-write indivisible) prevent
# lost updates, but not reordering: the additions into one row then happen in whatever order
# the threads arrive. Floating-point addition is not associative, so a different order
# gives a different last bit or two. Below, the same 1000 float32 gradients are summed in
# token order and in a shuffled order, one addition at a time as a kernel would:

# %%
@njit
def sequential_sum(values, order):
    total = np.float32(0.0)
    for i in order:
        total += values[i]
    return total


values = rng.normal(size=1000).astype(np.float32)
in_order = sequential_sum(values, np.arange(1000))
shuffled = sequential_sum(values, rng.permutation(1000))
print(f"token order:    {in_order:.4f}")
print(f"shuffled order: {shuffled:.4f}")
print(f"equal to 1e-5 (relative): {abs(in_order - shuffled) <= 1e-5 * abs(in_order)}")
print(f"bit-identical:  {in_order == shuffled}")

# %%
# NBVAL_IGNORE_OUTPUT
# every digit of the two float32 sums (the compared cell above prints them rounded)
assert in_order != shuffled, "the two orders happened to give the same bits"
print(f"token order:    {in_order!r}")
print(f"shuffled order: {shuffled!r}")

# %% [markdown]
# A last-bit difference sounds harmless, but it makes a training run unrepeatable: two runs
# from the same seed drift apart, a bug cannot be replayed, and a resumed run does not match
# the uninterrupted one. "Nondeterministic gradients" in the failure-mode table of lesson 12
# points at exactly this kernel.
#
# ## Exercise 11.1 · A deterministic scatter-add
#
# Write `embedding_backward(ids, g, vocab_size)`: `ids` holds N token ids, `g` the upstream
# gradient (N, C). Return the table's gradient, shape (vocab_size, C), dtype of `g`, with
#
# - repeated ids summed, untouched rows exactly zero;
# - the same bits on every run and for any number of threads.
#
# The trick is to split the work so that **no two threads ever write the same number**, and
# each number receives its additions **in token order**. The tokens cannot be split (any
# two may share an id), but the columns can: give each thread its own block of columns
# (`prange` over blocks), and inside, walk all tokens in order. A block of 16 float32
# columns is one 64-byte cache line, so two threads never even share a line of the table.
#
# The check compares with `np.add.at`, reads your kernel for a `prange` over the tokens
# that adds into a row picked by a token's id (a race, whether or not it strikes in one
# run), runs it several times (once with every token on the same id) and with 1 and with
# all threads, and times it at the trainer's shape. Passing saves it as your piece
# `embedding_backward`.

# %%
@njit(parallel=True)
def embedding_backward(ids, g, vocab_size):
    """dE[v] = sum of g[t] over the tokens t with ids[t] == v; deterministic."""
    n, c = g.shape
    d = np.zeros((vocab_size, c), dtype=g.dtype)
    block = 16                                   # columns per task: one cache line
    ### BEGIN SOLUTION
    n_blocks = (c + block - 1) // block
    for b in prange(n_blocks):                   # each thread owns whole columns
        c0, c1 = b * block, min(c, (b + 1) * block)
        for t in range(n):                       # tokens in their original order
            row = ids[t]
            for j in range(c0, c1):
                d[row, j] += g[t, j]
    ### END SOLUTION
    return d

# %%
# CHECK 11.1
# NBVAL_IGNORE_OUTPUT
from coursework import lesson11
lesson11.check_embedding_backward(embedding_backward)

# %% [markdown]
# **Checked by your gradient checker.** The scatter-add is the VJP of the gather
# `y = E[ids]`, so central differences of a scalar loss of `E` must agree with it: take
# `f(E) = sum(g * E[ids])`, whose gradient is exactly your `embedding_backward(ids, g, V)`.
# Your `spot_check` of lesson 04 (exercise 04.3) nudges elements of E, in float64, on a small
# table where some ids repeat and some rows are never read; the engine's checker, with the
# same calling convention, runs when yours is not saved. The next cell says whose runs.

# %%
# NBVAL_IGNORE_OUTPUT
from coursework.pieces import gradient_checker

spot_check, checker_owner = gradient_checker()
print(f"gradient checker: {checker_owner}")

# %%
ids_check = np.array([4, 1, 4, 7, 1, 4, 0, 9])          # 4 and 1 repeat; 2, 3, 5, 6, 8 unread
g_check = np.random.default_rng(111).normal(size=(ids_check.size, 3))
table = np.random.default_rng(112).normal(size=(10, 3))
scatter_rows = spot_check(lambda E_: float(np.sum(g_check * E_[ids_check])), table,
                          embedding_backward(ids_check, g_check, 10), n_checks=20)
assert all(bool(r.ok) for r in scatter_rows), [r for r in scatter_rows if not r.ok]
print(f"{len(scatter_rows)} elements of the (10, 3) table checked in float64: every one "
      f"agrees with central differences: {all(bool(r.ok) for r in scatter_rows)}")

# %% [markdown]
# The same idea runs the trainer: `engine.trainer.kernels.embedding_backward` splits the table's
# columns between threads and walks the tokens in order (and adds the position embedding's
# gradient too). Compare it with yours, and with `np.add.at`, at the tiny trainer's shape:
# B·T = 2048 tokens, C = 128, V = the corpus's characters.

# %%
from engine.trainer import kernels as fused
from engine.trainer.data import builtin_text

chars = sorted(set(builtin_text()))
V_chars = len(chars)
ids_batch = rng.integers(0, V_chars, size=(16, 128))
g_batch = rng.normal(size=(16, 128, 128)).astype(np.float32)
yours = embedding_backward(ids_batch.ravel(), g_batch.reshape(-1, 128), V_chars)
engine_dwte, _ = fused.embedding_backward(ids_batch, g_batch, V_chars)
reference = np.zeros((V_chars, 128), np.float32)
np.add.at(reference, ids_batch.ravel(), g_batch.reshape(-1, 128))
print(f"V = {V_chars} characters")
print("yours equals np.add.at:", np.allclose(yours, reference, rtol=1e-5, atol=1e-5))
print("engine's equals np.add.at:", np.allclose(engine_dwte, reference, rtol=1e-5, atol=1e-5))

# %%
# NBVAL_IGNORE_OUTPUT
from engine.timing import median_seconds


def ms(fn):
    return median_seconds(fn, repeats=20, warmup=1) * 1e3


flat_ids, flat_g = ids_batch.ravel(), g_batch.reshape(-1, 128)
print(f"np.add.at:        {ms(lambda: np.add.at(np.zeros((V_chars, 128), np.float32), flat_ids, flat_g)):.3f} ms")
print(f"yours:            {ms(lambda: embedding_backward(flat_ids, flat_g, V_chars)):.3f} ms")
print(f"trainer kernel:   {ms(lambda: fused.embedding_backward(ids_batch, g_batch, V_chars)):.3f} ms")

# %% [markdown]
# ## Most of the gradient is zero
#
# A batch touches only the rows of the tokens it contains. With B·T tokens and a vocabulary
# of V, at most B·T distinct rows get a gradient, so at least 1 - B·T/V of the rows are
# structurally zero: for 16 384 tokens and V = 128 000, at least 87%. Real text repeats its
# frequent words, so the true share is higher still.
#
# Measured first on real text: the Python documentation of the built-in corpus, split into
# words and punctuation, gives a word-level vocabulary. A batch of 16 384 consecutive words
# touches far fewer rows than it has tokens:

# %%
words = re.findall(r"\w+|[^\w\s]", builtin_text().lower())
word_vocab = {w: i for i, w in enumerate(sorted(set(words)))}
word_ids = np.array([word_vocab[w] for w in words])
batch_tokens = 16_384
for start in (0, 40_000, 80_000):
    touched = np.unique(word_ids[start:start + batch_tokens]).size
    print(f"words {start:>6}-{start + batch_tokens:>6}: {touched:5d} distinct rows of "
          f"{len(word_vocab)}; {1 - touched / len(word_vocab):.1%} of the rows untouched")

# %% [markdown]
# For real model vocabularies we need a model of word frequencies. Natural language is
# close to Zipf's law: the k-th most frequent token has probability proportional to
# 1/(k + 2.7). Sampling 16 384 tokens from that law (seeded, so the numbers are fixed), next
# to the bound 1 - B·T/V, for a table of width d = 4096 in float32:

# %% [markdown]
# ## Exercise 11.2 · The bytes of a dense and a sparse gradient
#
# A dense embedding gradient is the whole (V, C) table, zeros included. A *row-sparse* one
# keeps only the distinct rows the batch touched, each with the id that says which row it
# is. Write `gradient_bytes(ids, vocab_size, width, value_bytes=4, id_bytes=8)` returning
# `(dense_bytes, sparse_bytes)` for one batch of token ids (any shape): `value_bytes` per
# gradient value (4 in float32, 2 in bf16), `id_bytes` per stored id (8 for int64).
# The cell after the check builds both gradients for a real batch and measures them.

# %%
def gradient_bytes(ids, vocab_size, width, value_bytes=4, id_bytes=8):
    """(dense, row-sparse) bytes of one batch's embedding gradient."""
    ### BEGIN SOLUTION
    touched = len(set(np.asarray(ids).ravel().tolist()))
    return vocab_size * width * value_bytes, touched * (width * value_bytes + id_bytes)
    ### END SOLUTION

# %%
# CHECK 11.2
lesson11.check_gradient_bytes(gradient_bytes)

# %% [markdown]
# Now measured: the first batch of words above, with an upstream gradient of width 256 in
# float32. The dense gradient is your `embedding_backward`'s table; the row-sparse one is
# `lesson11.row_sparse_gradient`: `np.unique` finds the distinct ids, `np.add.at` sums each
# token's gradient into its id's row. The bytes are those of the arrays themselves.

# %%
batch_ids = word_ids[:batch_tokens]
g_words = np.random.default_rng(113).normal(size=(batch_tokens, 256)).astype(np.float32)
dense_dE = embedding_backward(batch_ids, g_words, len(word_vocab))
sparse_ids, sparse_rows = lesson11.row_sparse_gradient(batch_ids, g_words)
predicted = gradient_bytes(batch_ids, len(word_vocab), 256)
measured = (dense_dE.nbytes, sparse_ids.nbytes + sparse_rows.nbytes)
assert np.allclose(dense_dE[sparse_ids], sparse_rows, rtol=1e-5, atol=1e-5)
assert not dense_dE[np.setdiff1d(np.arange(len(word_vocab)), sparse_ids)].any()
print(f"dense:      predicted {predicted[0]:>10,} bytes, measured {measured[0]:>10,}")
print(f"row-sparse: predicted {predicted[1]:>10,} bytes, measured {measured[1]:>10,} "
      f"({sparse_ids.size} rows and their ids)")
print(f"the same gradient: the sparse rows equal the dense table's rows, every other row "
      f"is zero; the sparse one takes {measured[1] / measured[0]:.1%} of the bytes")

# %%
def zipf_batch(vocab_size, tokens, seed=0):
    """`tokens` ids drawn from a Zipf-Mandelbrot law over the vocabulary."""
    p = 1.0 / (np.arange(vocab_size) + 2.7)
    p /= p.sum()
    return np.random.default_rng(seed).choice(vocab_size, size=tokens, p=p)


d_model = 4096
print(f"{'V':>8} {'bound':>7} {'Zipf':>7} {'dense dE':>10} {'sparse dE':>10}")
shares = {}
for vocab in (32_000, 50_257, 128_000, 256_000):
    batch = zipf_batch(vocab, batch_tokens)
    touched = np.unique(batch).size
    shares[vocab] = (1 - batch_tokens / vocab, 1 - touched / vocab)
    dense_bytes, sparse_bytes = gradient_bytes(batch, vocab, d_model)   # float32, int64 ids
    print(f"{vocab:>8,} {shares[vocab][0]:7.1%} {shares[vocab][1]:7.1%} "
          f"{dense_bytes / 1e6:7.0f} MB {sparse_bytes / 1e6:7.0f} MB")

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
vocabs = list(shares)
ax.plot(vocabs, [100 * s[0] for s in shares.values()], "o--", label="bound 1 - B·T/V")
ax.plot(vocabs, [100 * s[1] for s in shares.values()], "s-", label="Zipf sample")
ax.set_xscale("log")
ax.set_xlabel("vocabulary size V")
ax.set_ylabel("rows of dE that are zero (%)")
ax.set_title("Untouched embedding rows, batch of 16 384 tokens")
ax.grid(True, which="both", alpha=0.3)
ax.legend()
plt.show()

# %% [markdown]
# A dense (V, d) gradient spends hundreds of megabytes, a gigabyte at V = 256 000, on
# zeros, and the optimizer then reads all of them. That is why frameworks offer sparse
# embedding gradients: the touched rows and their ids. (For the tiny trainer the question
# does not arise: about a hundred characters, nearly all of them in every batch.)
#
# ## The catch: dense AdamW and sparse gradients
#
# A sparse gradient says "these rows have gradient g, the others zero". Handing it to a
# standard AdamW does not just skip the zero rows, because AdamW's update of a row depends
# on more than the row's current gradient:
#
# - **weight decay** is decoupled: every step, *every* row is multiplied by
#   (1 - lr · weight_decay), gradient or not;
# - **the moments** `m` and `v` of a row keep their history: a row whose token appeared a few
#   steps ago keeps moving on steps where its gradient is zero, by `m / (sqrt(v) + eps)`,
#   which fades only as fast as β₁ⁿ/√β₂ⁿ.
#
# A *lazy* (sparse) AdamW updates only the rows that appeared: their moments, their decay,
# their step. The two are different algorithms. Below, three tokens, one in every batch, one
# in every tenth, one in every hundredth, each pulled towards a target row; watch the rare
# token's row under both.

# %%
def adamw_rows(grad_fn, table, n_steps, lazy, lr=0.01, betas=(0.9, 0.999), eps=1e-8,
               weight_decay=0.1):
    """AdamW on an embedding table; lazy=True updates only rows with a gradient this step."""
    table = table.copy()
    m, v = np.zeros_like(table), np.zeros_like(table)
    history = [table.copy()]
    for step in range(1, n_steps + 1):
        grad, seen = grad_fn(table, step)
        rows = seen if lazy else np.arange(table.shape[0])
        m[rows] = betas[0] * m[rows] + (1 - betas[0]) * grad[rows]
        v[rows] = betas[1] * v[rows] + (1 - betas[1]) * grad[rows] ** 2
        m_hat = m[rows] / (1 - betas[0] ** step)
        v_hat = v[rows] / (1 - betas[1] ** step)
        table[rows] *= 1 - lr * weight_decay                      # decoupled decay
        table[rows] -= lr * m_hat / (np.sqrt(v_hat) + eps)
        history.append(table.copy())
    return np.array(history)


targets = np.array([[1.0, -1.0, 0.5, 2.0]] * 3)
every = {0: 1, 1: 10, 2: 100}                    # token -> appears every n-th step


def pull_to_targets(table, step):
    seen = np.array([tok for tok, n in every.items() if step % n == 0])
    grad = np.zeros_like(table)
    grad[seen] = table[seen] - targets[seen]      # gradient of 0.5 |row - target|^2
    return grad, seen


start = np.random.default_rng(1).normal(size=(3, 4))
dense_run = adamw_rows(pull_to_targets, start, 400, lazy=False)
lazy_run = adamw_rows(pull_to_targets, start, 400, lazy=True)

rare = 2
moved_without_grad = sum(
    1 for s in range(1, 401)
    if s % every[rare] != 0 and not np.array_equal(dense_run[s, rare], dense_run[s - 1, rare]))
print(f"rare token (every {every[rare]}th step), steps where its row changed with a zero "
      f"gradient: dense AdamW {moved_without_grad} of {400 - 400 // every[rare]}, lazy 0")
for name, run in (("dense", dense_run), ("lazy", lazy_run)):
    dist = np.linalg.norm(run[-1] - targets, axis=1)
    print(f"{name:>5} AdamW after 400 steps, distance to target: "
          + ", ".join(f"token {k} (every {every[k]:>3}): {dist[k]:.3f}" for k in every))

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharey=True)
for ax, (name, run) in zip(axes, (("dense AdamW", dense_run), ("lazy (sparse) AdamW", lazy_run))):
    for k in every:
        ax.plot(np.linalg.norm(run[:, k] - targets[k], axis=1),
                label=f"token {k}: every {every[k]} steps")
    ax.set_title(name)
    ax.set_xlabel("step")
    ax.grid(True, alpha=0.3)
axes[0].set_ylabel("distance of the row from its target")
axes[0].legend()
plt.show()

# %% [markdown]
# Under dense AdamW the rare row drifts between its appearances: momentum carries it on,
# and weight decay pulls it towards zero at every step, a hundred decays for each gradient.
# Under the lazy update it moves only when its token is seen. Neither is "the" right answer,
# but they regularise rare tokens very differently, so switching an embedding to sparse
# gradients with a stock AdamW silently changes the training recipe.
#
# ## Exercise 11.3 · Decay that never sees a gradient
#
# Take weight decay alone (ignore the gradient step). Write `decay_factors(steps_seen,
# n_steps, lr, weight_decay)` returning `(dense_factor, lazy_factor)`: the factors by which
# decoupled weight decay shrinks one embedding row over `n_steps` optimizer steps, when its
# token appeared at the steps listed in `steps_seen`, under dense AdamW (every step) and
# under a lazy update (only on those steps).

# %%
def decay_factors(steps_seen, n_steps, lr, weight_decay):
    """(dense, lazy): how much decoupled weight decay alone shrinks a row over a run."""
    ### BEGIN SOLUTION
    shrink = 1.0 - lr * weight_decay
    return shrink ** n_steps, shrink ** len(steps_seen)
    ### END SOLUTION

# %%
# CHECK 11.3
lesson11.check_decay_factors(decay_factors)

# %%
dense_f, lazy_f = decay_factors(list(range(0, 100_000, 1000)), 100_000, 3e-4, 0.1)
print("a token seen in 1 batch of 1000, over 100 000 steps at lr 3e-4, weight decay 0.1:")
print(f"  weight decay leaves {dense_f:.1%} of its row under dense AdamW, "
      f"{lazy_f:.1%} under a lazy update")
print("  (a token in every batch is decayed alike under both)")

# %% [markdown]
# ## What you built, and what it costs
#
# - **Gather forward, scatter-add backward**: a lookup costs no FLOPs, and its gradient is a
#   sum per row over the tokens that read it, never a one-hot matmul.
# - **Repeated ids** need a real accumulation: numpy's `d[ids] += g` silently drops repeats;
#   `np.add.at` or a loop adds them.
# - **Races and order**: threads that split the tokens can lose updates, and even atomic
#   additions reorder the sums and change the last bits. Your `embedding_backward` splits
#   the columns instead, walks the tokens in order, and is exact and bit-for-bit
#   reproducible for any number of threads, with no locks; the trainer's kernel does the
#   same.
# - **Sparsity**: a batch of 16 384 tokens leaves at least 87% of a 128 000-row gradient at
#   zero (far more under a Zipf law); a dense gradient stores those zeros, hundreds of MB
#   for a wide model, where a row-sparse one stores the touched rows and their ids
#   (`gradient_bytes`, measured on a real batch).
# - **Sparse gradients and AdamW**: dense AdamW decays and moves every row every step; a
#   lazy update touches only rows that appeared. Rare tokens are regularised very
#   differently under the two.
#
# Lesson 12 follows the gradient past the backward pass, to what happens before the step:
# clipping, logging the norm, the fused optimizer, and the all-reduce of data parallelism.
