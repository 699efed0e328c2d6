# %% [markdown]
# # 03 · VJPs and tensors
#
# **Goals.** By the end of this lesson you will have
# 1. run your scalar engine of lesson 02 and the tape on the same thousand numbers: the same
#    gradient, thousands of nodes against a handful of array operations;
# 2. measured why no engine ever builds a Jacobian: its size and its build time against one
#    vector-Jacobian product (VJP), as the layer widens;
# 3. written the backward of a matrix product (two matrix products, checked by shapes and by
#    `engine.gradcheck`) and plugged it into the engine as an op;
# 4. written the backward of broadcasting (a sum back to the input's shape);
# 5. built a whole Jacobian two ways, by forward mode (JVPs, one column each) and by reverse
#    mode (VJPs, one row each), timed both and found where one overtakes the other;
# 6. followed gradients through 30 layers: products like $0.5^n$ and $1.5^n$, and how a
#    residual connection ($I + \partial F/\partial x$) changes them.
#
# Lessons 01-02 moved single numbers. Real layers move arrays, and every scalar rule you
# wrote has a tensor version. The vocabulary changes (Jacobians, VJPs), the idea does not:
# one local rule per operation, applied in reverse.
#
# **Your pieces in the engine.** Fills: two entries of the tape's rule table: the matmul VJP
# (03.1, piece `matmul_vjp`) and the sum back to an input's shape (03.2, piece
# `unbroadcast`); lesson 04 runs both inside the tape. Runs: your scalar engine of lesson 02
# (piece `scalar_backward`: your rules of 02.1 and your walk of 02.2) beside the tape, on
# the same computation; without it, `engine.scalar` runs, and the lesson says why. (The
# whole map: CONTRIBUTING.md, "Exercise <-> slot".)

# %%
import numpy as np
import matplotlib.pyplot as plt

import engine
from engine import F, Tensor

np.set_printoptions(precision=4, suppress=True)


from engine.timing import fixed_threads, median_seconds   # fixed thread pools; the median of several calls
from coursework import lesson03

lesson03.name_unfinished_exercises()   # a cell that needs an unfinished exercise says which

# %% [markdown]
# ## One number per node: your scalar engine against the tape
#
# Take a layer of $n$ units with one weight each and a shared bias,
# $L = \sum_i (\operatorname{relu}(w_i x_i + b) - y_i)^2$, and its gradient with respect to
# every $w_i$ and $b$. Your lesson 02 engine can do it: one node per number and per
# operation. `coursework.pieces.scalar_engine()` loads your walk and rules of lesson 02
# (saved as the piece `scalar_backward` when 02.2 passed), checks them in their slot, and
# hands them over with the node type they run on (`coursework.slots.ScalarNode`, the `Node`
# of lesson 02); without the piece it hands over `engine.scalar`. The next cell says whose
# code runs (its output is not compared when the notebook is checked: it depends on your
# pieces folder); everything after it prints the same whoever's engine ran.

# %%
# NBVAL_IGNORE_OUTPUT
# (whose code runs depends on the pieces you have saved)
from coursework.pieces import scalar_engine

leaf, scalar_backward, owner = scalar_engine()
print("scalar engine:", owner)

# %%
from engine.scalar import topological_order
from engine.tensor import TapeObserver, observe


def tree_sum(values):
    """Add in pairs, a tree of depth log2(n): a recursive walk of the graph stays shallow."""
    while len(values) > 1:
        pairs = [values[i] + values[i + 1] for i in range(0, len(values) - 1, 2)]
        values = pairs + values[len(pairs) * 2:]      # an odd one out waits a round
    return values[0]


def scalar_layer(w, x, b, y):
    """L = sum((relu(w_i x_i + b) - y_i)^2), one scalar operation at a time."""
    errors = [(wi * xi + b).relu() - yi for wi, xi, yi in zip(w, x, y)]
    return tree_sum([e * e for e in errors])


def tensor_layer(w, x, b, y):
    """The same loss as four array operations on the tape."""
    e = F.relu(w * x + b) - y
    return (e * e).sum()


class OpCounter(TapeObserver):
    """Counts the rules the engine runs: forward ops (`ran`; `ops` of them recorded on the
    tape) and VJPs (`vjps`: one for each node a backward pass visits)."""
    def __init__(self):
        self.ops = self.ran = self.vjps = 0

    def after_forward(self, op, inputs, result, recorded):
        self.ran += 1
        self.ops += recorded

    def after_backward(self, node, g, grads, released):
        self.vjps += 1


def rules_run(fn):
    """An OpCounter over one call of fn(). Unlike a clock, it reads the same on any machine
    however busy it is, so the lesson's claims about cost are asserted on these counts."""
    with observe(OpCounter()) as count:
        fn()
    return count


n = 1000
rng = np.random.default_rng(0)
w0, x0, y0, b0 = rng.normal(size=n), rng.normal(size=n), rng.normal(size=n), 0.1

w_s, b_s = [leaf(v) for v in w0], leaf(b0)
L_s = scalar_layer(w_s, x0.tolist(), b_s, y0.tolist())
scalar_backward(L_s)

w_t, b_t = Tensor(w0, requires_grad=True), Tensor(b0, requires_grad=True)
with observe(OpCounter()) as tape_ops:
    L_t = tensor_layer(w_t, x0, b_t, y0)
L_t.backward()

same = (np.allclose([v.grad for v in w_s], w_t.grad, rtol=1e-12, atol=1e-14)
        and np.isclose(b_s.grad, float(b_t.grad), rtol=1e-12))
print(f"n = {n}: the same loss ({L_s.data:.6g}) and the same gradient both ways: {same}")
scalar_nodes = len(topological_order(L_s))
print(f"scalar engine: {scalar_nodes} nodes, one Python object per number and per operation")
print(f"tape:          {tape_ops.ops} recorded operations on arrays of {n}")
assert same
assert scalar_nodes > n and tape_ops.ops < 10, "a node per number against an op per array"

# %% [markdown]
# Every number of the scalar graph is a Python object, and every step of its backward walk
# is a Python function call, a dictionary lookup and a few attribute reads, whatever the
# operation. The tape records a handful of operations whatever $n$ is, and each of them runs
# one numpy loop in compiled code over the whole array. Time per element, both ways:

# %%
# NBVAL_IGNORE_OUTPUT
# (timings differ from run to run and machine to machine: the counts above are the claim)


def scalar_step():
    w, b = [leaf(v) for v in w0], leaf(b0)
    scalar_backward(scalar_layer(w, x0.tolist(), b, y0.tolist()))


def tensor_step():
    w, b = Tensor(w0, requires_grad=True), Tensor(b0, requires_grad=True)
    tensor_layer(w, x0, b, y0).backward()


with fixed_threads(1):
    t_scalar = median_seconds(scalar_step, repeats=5)
    t_tensor = median_seconds(tensor_step, repeats=21)
print(f"forward + backward, per element: scalar engine {t_scalar / n * 1e9:8.0f} ns, "
      f"tape {t_tensor / n * 1e9:6.1f} ns, ratio {t_scalar / t_tensor:.0f}")
# thousands of Python calls against a few numpy loops: on a quiet machine far more than 10x

# %% [markdown]
# The scalar engine pays its bookkeeping per *number*; the tape pays it per *array*, and the
# arithmetic in between runs in compiled loops. That, not any new mathematics, is why real
# engines work on tensors. The price is that a rule now has to handle whole arrays at once:
# the rest of this lesson writes those rules.
# %% [markdown]
# ## The Jacobian, and why nobody builds it
#
# A layer $y = f(x)$ with $x \in \mathbb{R}^n$ and $y \in \mathbb{R}^m$ has a Jacobian
# $J \in \mathbb{R}^{m \times n}$, $J_{ij} = \partial y_i / \partial x_j$: every output's
# sensitivity to every input. Backward never needs $J$ itself. It arrives at the layer
# holding $\bar y = \partial L / \partial y$ (a vector shaped like $y$) and needs
# $\bar x = \partial L / \partial x$ (shaped like $x$):
#
# $$\bar x^\top = \bar y^\top J \qquad \text{a vector-Jacobian product (VJP).}$$
#
# For $y = \tanh(Wx)$ the Jacobian is $\operatorname{diag}(1 - y^2)\, W$, and the VJP is
# $W^\top \big((1 - y^2) \odot \bar y\big)$: an elementwise product and one matrix-vector
# product, with nothing of size $m \times n$ made along the way. A generic engine that wanted
# $J$ would have to run one VJP per output (each gives one row). Let us measure what that
# costs, with the engine, as the width $n = m$ grows.

# %%
def layer(n, seed=0):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(n, n)) / np.sqrt(n)
    return W, rng.normal(size=n), rng.normal(size=n)


def one_vjp(W, x, v):
    """dL/dx for L = v . tanh(W x): one backward pass."""
    xt = Tensor(x, requires_grad=True)
    F.tanh(W @ xt).backward(v)
    return xt.grad


def full_jacobian(W, x):
    """J of tanh(W x), one backward pass per output row."""
    xt = Tensor(x, requires_grad=True)
    y = F.tanh(W @ xt)
    rows = []
    for i in range(y.size):
        xt.zero_grad()
        y.backward(np.eye(1, y.size, i)[0], retain_graph=True)
        rows.append(xt.grad)
    return np.stack(rows)


W, x, v = layer(6)
J = full_jacobian(W, x)
print("J built row by row equals diag(1 - y^2) W:",
      np.allclose(J, (1 - np.tanh(W @ x) ** 2)[:, None] * W))
print("v^T J equals the single VJP:             ", np.allclose(v @ J, one_vjp(W, x, v)))

# %%
# NBVAL_IGNORE_OUTPUT
# (timings differ from run to run and machine to machine; the counts and the assert do not)
widths = [32, 64, 128, 256, 512, 1024]
t_vjp, t_jac = [], []
with fixed_threads(1):        # one BLAS thread: no jump where BLAS would start more threads
    for n in widths:
        W, x, v = layer(n)
        t_vjp.append(median_seconds(lambda: one_vjp(W, x, v), repeats=21))
        t_jac.append(median_seconds(lambda: v @ full_jacobian(W, x), repeats=3))
        one, built = rules_run(lambda: one_vjp(W, x, v)), rules_run(lambda: full_jacobian(W, x))
        print(f"n = {n:5d}: one VJP {t_vjp[-1] * 1e3:8.3f} ms ({one.vjps} VJPs)   build J, "
              f"then v^T J {t_jac[-1] * 1e3:9.1f} ms ({built.vjps:5d} VJPs)   "
              f"time ratio {t_jac[-1] / t_vjp[-1]:4.0f}")
        # one forward pass both ways, then n backward passes against one
        assert built.ran == one.ran and built.vjps == n * one.vjps, "building J costs n VJPs"

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
n_axis = np.array(widths)
axes[0].loglog(n_axis, n_axis * n_axis * 8, "o-", label="Jacobian, n x n float64")
axes[0].loglog(n_axis, n_axis * 8, "s-", label="VJP result, n float64")
axes[0].set_xlabel("width n")
axes[0].set_ylabel("bytes")
axes[0].set_title("memory")
axes[0].legend()
axes[1].loglog(widths, t_jac, "o-", label="build J (n backward passes), then v^T J")
axes[1].loglog(widths, t_vjp, "s-", label="one VJP (one backward pass)")
axes[1].set_xlabel("width n")
axes[1].set_ylabel("seconds")
axes[1].set_title("time")
axes[1].legend()
for ax in axes:
    ax.grid(True, which="both", alpha=0.3)
plt.tight_layout()
plt.show()

# %% [markdown]
# The Jacobian grows like $n^2$ in memory and costs about $n$ backward passes to build; the
# VJP grows like $n$ and costs one. At the width of a real layer the Jacobian is out of the
# question:

# %%
for n in (1_000, 10_000, 50_000):
    print(f"n = {n:>6}: J has {n * n:.0e} entries = {n * n * 8 / 1e9:8.3f} GB in float64; "
          f"the VJP has {n} entries = {n * 8 / 1e3:g} KB")

# %% [markdown]
# A width of 10 000 means a hundred million Jacobian entries (0.8 GB) for one layer and one
# example. So every op in `engine/rules.py` has a `vjp(g)` method that goes straight from
# $\bar y$ to $\bar x$ using the structure of the op. For an elementwise op the Jacobian is
# diagonal, and its VJP is just an elementwise product. For a matrix product it is two
# matrix products, which you write now.
#
# ## Exercise 03.1 · The matmul VJP
#
# For $Z = A B$ with $A \in \mathbb{R}^{m \times k}$, $B \in \mathbb{R}^{k \times n}$ and the
# upstream gradient $\bar Z = \partial L / \partial Z \in \mathbb{R}^{m \times n}$, derive
# $\bar A$ and $\bar B$ before you write them. Two facts are enough:
#
# 1. **The entries.** $Z_{ij} = \sum_p A_{ip} B_{pj}$ is a sum of scalar products, and in
#    lesson 02 a product $z = a b$ sent `grad_out * b` to $a$ and `grad_out * a` to $b$. The
#    entry $A_{ip}$ takes part in every $Z_{ij}$ of row $i$ (one for each $j$), and at a
#    fan-out the contributions add: write $\partial L / \partial A_{ip}$ as a sum over $j$,
#    then read that sum as a matrix product. Do the same for $B_{pj}$.
# 2. **The shapes.** A gradient has the shape of its input: $\bar A$ is $m \times k$ and
#    $\bar B$ is $k \times n$. Of the products of $\bar Z$ with $B$ or $B^\top$, only one
#    has the shape $m \times k$; that is a check on your derivation, for free.
#
# Write `matmul_vjp(a, b, grad_out)` returning `(grad_a, grad_b)` for 2-D arrays.

# %%
def matmul_vjp(a, b, grad_out):
    """VJP of z = a @ b: return (dL/da, dL/db) given grad_out = dL/dz."""
    ### BEGIN SOLUTION
    return grad_out @ b.T, a.T @ grad_out
    ### END SOLUTION

# %%
# CHECK 03.1
from coursework import lesson03
lesson03.check_matmul_vjp(matmul_vjp)

# %% [markdown]
# The derivation, written out: $\partial L / \partial A_{ip} = \sum_j \bar Z_{ij} B_{pj}$ and
# $\partial L / \partial B_{pj} = \sum_i A_{ip} \bar Z_{ij}$, that is
#
# $$\bar A = \bar Z B^\top \quad (m \times n)(n \times k) = (m \times k), \qquad
#   \bar B = A^\top \bar Z \quad (k \times m)(m \times n) = (k \times n).$$
#
# Each product is as big as the forward one, so the backward of a linear layer costs twice
# its forward (the "2x" of lesson 00, behind the 6N FLOPs rule of lesson 07). Note what it
# reads: $B$ for $\bar A$ and $A$ for $\bar B$. That $A$ is the layer's input activation,
# kept from the forward pass.
#
# The check also ran your function *inside the engine*. An op is a small class with a
# `forward` that saves what backward needs and a `vjp(g)` that returns one gradient per
# input (see `engine/rules.py`); `engine.tensor.apply` runs any such class on tensors and
# records it on the tape. Here is the op the check built, with your VJP in it:

# %%
from engine.rules import Op
from engine.tensor import apply


class MyMatMul(Op):
    """z = a @ b, with your backward."""
    name = "matmul (yours)"

    def forward(self, a, b):
        self.save(a=a, b=b)        # both are read by the VJP: kept until backward
        return a @ b

    def vjp(self, g):
        return matmul_vjp(self.a, self.b, g)


rng = np.random.default_rng(0)
a = Tensor(rng.normal(size=(4, 3)), requires_grad=True, name="a")
b = Tensor(rng.normal(size=(3, 2)), requires_grad=True, name="b")
report = engine.gradcheck(lambda a, b: apply(MyMatMul, a, b), [a, b])
print("gradcheck of your matmul VJP:", "passed" if report.ok else "FAILED",
      f"({report.checked} elements, worst relative error below 1e-7: {report.max_rel_error < 1e-7})")

# A two-layer network whose first layer runs on your op, the second on the engine's:
x = Tensor(rng.normal(size=(5, 4)))
h = F.relu(apply(MyMatMul, x, a))
loss = (h @ b).sum()
loss.backward()
print("grad of a, from your VJP:\n", a.grad)

# %% [markdown]
# ## Broadcasting forward is a sum backward
#
# Adding a bias $b \in \mathbb{R}^{3}$ to a batch $X \in \mathbb{R}^{4 \times 3}$ *broadcasts*
# $b$: numpy acts as if $b$ were copied into each of the 4 rows. Each copy affects the loss
# through its own row, so (fan-out again, lesson 02) the gradient of $b$ is the **sum** of
# the 4 rows of the upstream gradient. In general, backward sums over every axis that
# broadcasting added at the front, and over every axis where the input had size 1 and was
# stretched; the result has exactly the input's shape.

# %%
X = Tensor(np.arange(12.0).reshape(4, 3), requires_grad=True)
bias = Tensor(np.array([0.5, -1.0, 2.0]), requires_grad=True)
out = X + bias                            # (4, 3) + (3,) -> (4, 3)
upstream = np.ones((4, 3)) * np.array([[1.0], [2.0], [3.0], [4.0]])
out.backward(upstream)
print("upstream gradient:\n", upstream)
print("bias.grad (the column sums):", bias.grad, " shape", bias.grad.shape)

# %% [markdown]
# ## Exercise 03.2 · Sum back to the input's shape
#
# Write `unbroadcast(grad, shape)`: given the gradient of a broadcast result and the shape
# the input had, return the gradient of the input. Two steps:
# 1. sum over the leading axes that broadcasting added (the gradient has more axes than
#    `shape`);
# 2. sum, keeping the axis (`keepdims=True`), over each axis where `shape` has size 1 but the
#    gradient does not.
#
# Examples: `(4, 3) -> (3,)` sums axis 0; `(4, 3) -> (4, 1)` sums axis 1 and keeps it;
# `(2, 4, 3) -> (4, 1)` sums axis 0, then axis 1 (kept); `(4, 3) -> ()` sums everything.

# %%
def unbroadcast(grad, shape):
    """Sum grad over the axes broadcasting added or stretched, to get `shape`."""
    ### BEGIN SOLUTION
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    stretched = tuple(i for i, size in enumerate(shape) if size == 1 and grad.shape[i] != 1)
    if stretched:
        grad = grad.sum(axis=stretched, keepdims=True)
    return grad
    ### END SOLUTION

# %%
# CHECK 03.2
lesson03.check_unbroadcast(unbroadcast)

# %% [markdown]
# The check plugged your function into an addition op and ran `engine.gradcheck` on it. The
# engine's own version is `engine.rules.unbroadcast`; every broadcasting op (add, sub, mul,
# div, batched matmul) calls it in its VJP. A shape check alone would not catch the classic
# bug here, averaging instead of summing: the shape is right, the values are off by the
# number of copies.
#
# ## Forward mode and reverse mode
#
# A VJP pulls one upstream vector back through the graph: one **reverse** pass gives the
# gradient of *one output* (or one weighted combination of outputs) with respect to *every
# input*. The mirror image is the Jacobian-vector product (JVP), $J r$: push one input
# direction $r$ **forward** through the graph, alongside the values, and get how *every
# output* changes along it. `engine.jvp(fn, inputs, tangents)` does that, using each op's
# `jvp` rule.
#
# So the full Jacobian of $f: \mathbb{R}^n \to \mathbb{R}^m$ costs $n$ forward-mode passes
# (one column each) or $m$ reverse-mode passes (one row each).
#
# ## Exercise 03.3 · The Jacobian, column by column or row by row
#
# Write `jacobian(f, x, mode)` for a function `f` from tensors of shape `(n,)` to tensors of
# shape `(m,)`, returning the `(m, n)` array.
# - `mode == "forward"`: for each input $j$, `engine.jvp(f, [x], [e_j])` returns
#   `(value, tangent)`; the tangent is column $j$.
# - `mode == "reverse"`: run `y = f(xt)` once with `xt = Tensor(x, requires_grad=True)`; for
#   each output $i$, call `y.backward(e_i, retain_graph=True)` (the graph must survive
#   several backward passes) and read row $i$ from `xt.grad`. Remember lesson 02: backward
#   *adds* into `.grad`, so `xt.zero_grad()` before each row.
#
# Row `i` of `np.eye(k)` is the unit vector $e_i$ of length $k$ (make the matrix once, not
# once per pass).

# %%
def jacobian(f, x, mode):
    """The (m, n) Jacobian of f at x, by n JVPs (mode="forward") or m VJPs ("reverse")."""
    ### BEGIN SOLUTION
    if mode == "forward":
        directions = np.eye(x.size)
        columns = [engine.jvp(f, [x], [directions[j]])[1] for j in range(x.size)]
        return np.stack(columns, axis=1)
    xt = Tensor(x, requires_grad=True)
    y = f(xt)
    seeds = np.eye(y.size)
    rows = []
    for i in range(y.size):
        xt.zero_grad()
        y.backward(seeds[i], retain_graph=True)
        rows.append(xt.grad)
    return np.stack(rows, axis=0)
    ### END SOLUTION

# %%
# CHECK 03.3
lesson03.check_jacobian(jacobian)

# %% [markdown]
# Now time both modes on $f(x) = \tanh(A x)$ with $A \in \mathbb{R}^{m \times n}$, holding
# $m = 64$ outputs and sweeping the number of inputs $n$. Forward mode does $n$ passes,
# reverse mode $m$. If a pass cost the same in both modes the lines would cross at exactly
# $n = m$. Where exactly they cross depends on the machine and on the run; often somewhat
# earlier, because each forward-mode pass reruns `f` with its tangent while the $m$ reverse
# passes share one recorded forward pass. The two ends of the sweep are never in doubt, and
# the cell asserts them on what a clock cannot blur: the rules each mode runs, counted by
# `rules_run` (forward ops, each with its tangent in forward mode; the one recorded forward
# and every VJP in reverse mode).

# %%
# NBVAL_IGNORE_OUTPUT
m_out = 64
n_inputs = [4, 8, 16, 32, 64, 128, 256, 512]
t_forward, t_reverse, work_forward, work_reverse = [], [], [], []
with fixed_threads(1):
    for n in n_inputs:
        A = np.random.default_rng(1).normal(size=(m_out, n)) / np.sqrt(n)
        x0 = np.random.default_rng(2).normal(size=n)
        f = lambda t: F.tanh(A @ t)  # noqa: E731
        t_forward.append(median_seconds(lambda: jacobian(f, x0, "forward"), repeats=5))
        t_reverse.append(median_seconds(lambda: jacobian(f, x0, "reverse"), repeats=5))
        work_forward.append(rules_run(lambda: jacobian(f, x0, "forward")))
        work_reverse.append(rules_run(lambda: jacobian(f, x0, "reverse")))
        print(f"n = {n:4d} inputs, m = {m_out} outputs: forward {t_forward[-1] * 1e3:7.1f} ms "
              f"({work_forward[-1].ran:4d} rules), reverse {t_reverse[-1] * 1e3:7.1f} ms "
              f"({work_reverse[-1].ran + work_reverse[-1].vjps:4d} rules)")
# 4 JVPs against 64 VJPs at the left end, 512 against 64 at the right end: the rules each
# mode runs (forward ops, each with its tangent; forward ops and VJPs) say so on any machine.
rules = lambda count: count.ran + count.vjps  # noqa: E731
assert rules(work_forward[0]) < rules(work_reverse[0]), "4 inputs, 64 outputs: forward wins"
assert rules(work_reverse[-1]) < rules(work_forward[-1]), "512 inputs, 64 outputs: reverse wins"

# %%
fig, ax = plt.subplots(figsize=(6.5, 4))
ax.loglog(n_inputs, t_forward, "o-", label="forward mode: n JVPs")
ax.loglog(n_inputs, t_reverse, "s-", label=f"reverse mode: m = {m_out} VJPs")
ax.axvline(m_out, color="gray", ls=":", label="n = m")
ax.set_xlabel("number of inputs n")
ax.set_ylabel("seconds for the full Jacobian")
ax.set_title(f"full Jacobian of tanh(A x), {m_out} outputs")
ax.legend()
ax.grid(True, which="both", alpha=0.3)
plt.show()

# %% [markdown]
# Left of the crossing, few inputs and many outputs: forward mode wins. Right of it, many
# inputs and few outputs: reverse mode wins. A loss is the far right end of this plot: one
# output, and as many inputs as the model has parameters. The two extremes, each measured
# with the mode that suits it and the mode that does not:

# %%
# NBVAL_IGNORE_OUTPUT
rng = np.random.default_rng(3)
wide = 2048
A_in = rng.normal(size=(1, wide)) / np.sqrt(wide)    # many inputs, one output (a loss)
A_out = rng.normal(size=(wide, 1))                   # one input, many outputs
cases = [("many inputs, one output", lambda t: F.tanh(A_in @ t), rng.normal(size=wide)),
         ("one input, many outputs", lambda t: F.tanh(A_out @ t), rng.normal(size=1))]
extremes = {}
with fixed_threads(1):
    for title, f, x0 in cases:
        tf = median_seconds(lambda: jacobian(f, x0, "forward"), repeats=3)
        tr = median_seconds(lambda: jacobian(f, x0, "reverse"), repeats=3)
        extremes[title] = (rules(rules_run(lambda: jacobian(f, x0, "forward"))),
                           rules(rules_run(lambda: jacobian(f, x0, "reverse"))))
        m = f(Tensor(x0)).size
        passes = lambda k: f"{k} pass" + ("es" if k > 1 else "")  # noqa: E731
        print(f"{title:24s} (n={x0.size}, m={m}): forward {tf * 1e3:7.1f} ms "
              f"({passes(x0.size)}), reverse {tr * 1e3:7.1f} ms ({passes(m)})")
# 2048 passes against 1: the suited mode runs 2048 times fewer rules at each extreme.
forward, reverse = extremes["many inputs, one output"]
assert reverse * 100 < forward, "one output: reverse mode (1 pass) beats forward mode (2048)"
forward, reverse = extremes["one input, many outputs"]
assert forward * 100 < reverse, "one input: forward mode (1 pass) beats reverse mode (2048)"

# %% [markdown]
# The pass counts are the whole story: $n$ for forward mode, $m$ for reverse mode. Training
# has billions of inputs and one output, hence backprop. When you need how *many outputs*
# move with *one* knob (a sensitivity study, a Jacobian-vector product inside an optimizer),
# forward mode is the right tool, and every serious framework ships it.
#
# ## Depth: products of Jacobians
#
# Through a stack of layers $h_{l+1} = f_l(h_l)$, the gradient at the bottom is the top
# gradient pulled back through every layer in turn:
#
# $$\bar h_0^\top = \bar h_L^\top\, J_{L-1} J_{L-2} \cdots J_0 .$$
#
# What that product does to the gradient's size over many layers is exercise 03.5's
# question. First, the connection that deep networks use to tame it.
#
# ## Exercise 03.4 · The residual VJP
#
# A **residual connection** $y = x + F(x)$ changes the graph, not the rules. Derive its VJP
# from lesson 02 before you write it: along how many paths does $x$ reach $y$? What does
# each path hand back to $x$, given $\bar y$ (for the path through $F$, that is what
# `branch_vjp` computes)? And what happens to contributions that meet at a fan-out?
#
# Write `residual_vjp(grad_out, branch_vjp)`: the VJP of $y = x + F(x)$, given `grad_out`
# $= \bar y$ and a function `branch_vjp(g)` that returns $J_F^\top g$, the VJP of the
# branch $F$ alone.

# %%
def residual_vjp(grad_out, branch_vjp):
    """VJP of y = x + F(x), given branch_vjp(g) = J_F^T g."""
    ### BEGIN SOLUTION
    return grad_out + branch_vjp(grad_out)
    ### END SOLUTION

# %%
# CHECK 03.4
lesson03.check_residual_vjp(residual_vjp)

# %% [markdown]
# Two paths, straight and through $F$, and at a fan-out contributions add:
#
# $$\frac{\partial y}{\partial x} = I + \frac{\partial F}{\partial x}, \qquad
#   \bar x = \bar y + J_F^\top \bar y .$$
#
# Even when the branch's $J_F$ shrinks everything, the identity path hands $\bar y$ down
# unchanged.
#
# Now three stacks of 30 linear layers of width 64, each layer $W_l = s\, Q_l$ with $Q_l$ a
# random rotation (so it scales every vector by exactly $s$):
# - plain, $s = 0.5$: $h_{l+1} = W_l h_l$;
# - plain, $s = 1.5$;
# - residual with the shrinking layer as its branch: $h_{l+1} = h_l + W_l h_l$, $s = 0.5$.
#
# We pull the gradient of $L = \sum_i h_{30,i}$ back by hand, with your `residual_vjp` and
# `matmul_vjp` (a layer is a matrix product), and record its norm at every layer.
#
# ## Exercise 03.5 · Predict, then measure
#
# Before running the stacks, predict for the *plain* ones. Write
# `predicted_ratio(scale, depth)`: the norm of the gradient at the bottom, $\|\partial L /
# \partial h_0\|$, divided by its norm at the top, $\|\partial L / \partial h_{depth}\|$, for
# `depth` plain layers $W_l = s\,Q_l$. Work it out from the VJP of one layer (what does it
# multiply the gradient by, and what does a rotation do to a norm?). The check compares your
# prediction with a measurement; the cell after it compares it with the stacks below.

# %%
def predicted_ratio(scale, depth):
    """||dL/dh_0|| / ||dL/dh_depth|| through `depth` plain layers W = scale * rotation."""
    ### BEGIN SOLUTION
    return scale ** depth       # each VJP multiplies by W^T, which scales every norm by s
    ### END SOLUTION

# %%
# CHECK 03.5
lesson03.check_gradient_ratio(predicted_ratio)

# %% [markdown]
# Each layer's VJP multiplies the gradient by $W_l^\top = s\,Q_l^\top$, and a rotation keeps
# norms, so each layer scales the norm by exactly $s$: $s^{depth}$ in all. If every $J_l$
# shrinks vectors by about 0.5, the product shrinks them by $0.5^L$; if it stretches them by
# 1.5, by $1.5^L$. Nothing is computed wrongly: the chain rule is exact, and its answer is
# tiny (vanishing gradients) or huge (exploding ones).

# %%
for n in (10, 20, 30, 50):
    print(f"n = {n:2d}: 0.5^n = {0.5 ** n:.3g}   1.5^n = {1.5 ** n:.4g}")

# %%
depth, width = 30, 64


def rotations(seed):
    rng = np.random.default_rng(seed)
    return [np.linalg.qr(rng.normal(size=(width, width)))[0] for _ in range(depth)]


def gradient_norms(scale, residual, Q, seed=1):
    """||dL/dh_l|| for l = 0 ... depth, for L = sum(h_depth)."""
    Ws = [scale * q for q in Q]
    h = np.random.default_rng(seed).normal(size=(1, width))   # a batch of one example
    inputs = []
    for W in Ws:                       # forward, keeping each layer's input
        inputs.append(h)
        z = h @ W.T
        h = h + z if residual else z
    g = np.ones_like(h)                # dL/dh_depth for L = sum(h_depth)
    norms = [np.linalg.norm(g)]
    for W, h_in in zip(reversed(Ws), reversed(inputs)):
        def branch_vjp(g, W=W, h_in=h_in):
            return matmul_vjp(h_in, W.T, g)[0]       # dL/dh_in through z = h_in @ W.T
        g = residual_vjp(g, branch_vjp) if residual else branch_vjp(g)
        norms.append(np.linalg.norm(g))
    return norms[::-1]                 # index l: the norm at layer l


Q = rotations(0)
stacks = {"plain, s = 0.5": (0.5, False), "plain, s = 1.5": (1.5, False),
          "residual, s = 0.5": (0.5, True)}
norms = {name: gradient_norms(s, res, Q) for name, (s, res) in stacks.items()}
for name, values in norms.items():
    print(f"{name:18s}: |dL/dh| at the top {values[-1]:.3g}, at the bottom {values[0]:.3g}, "
          f"ratio {values[0] / values[-1]:.3g}")
for name, (scale, residual) in stacks.items():
    if not residual:
        print(f"{name:18s}: your predicted ratio {predicted_ratio(scale, depth):.3g}")

# %% [markdown]
# The engine agrees. The same residual stack, run on tensors with `retain_grad()` on every
# hidden state so that backward keeps their gradients:

# %%
h = Tensor(np.random.default_rng(1).normal(size=(1, width)), requires_grad=True)
hidden = [h]
for q in Q:
    h = h + h @ Tensor(0.5 * q).T
    hidden.append(h.retain_grad())
h.sum().backward()
engine_norms = [float(np.linalg.norm(t.grad)) for t in hidden]
print("engine and hand-rolled norms agree at every layer:",
      np.allclose(engine_norms, norms["residual, s = 0.5"]))

# %%
fig, ax = plt.subplots(figsize=(6.5, 4))
for name, values in norms.items():
    ax.semilogy(range(depth + 1), values, "o-", ms=3, label=name)
ax.set_xlabel("layer l (0 = input, 30 = output)")
ax.set_ylabel("||dL/dh_l||")
ax.set_title("gradient norm through 30 layers")
ax.legend()
ax.grid(True, which="both", alpha=0.3)
plt.show()

# %% [markdown]
# Reading the plot from right (the loss) to left (the input): the plain shrinking stack loses
# a factor 2 per layer, $0.5^{30} \approx 10^{-9}$, so its first layers would barely learn;
# the plain stretching stack gains $1.5^{30} \approx 2 \times 10^{5}$. The residual stack
# built from the *same* shrinking layers keeps the gradient within a small factor of where
# it started: per layer it multiplies by $I + 0.5\,Q^\top$, whose effect on a vector stays
# between 0.5 and 1.5. It drifts slowly, which is why real residual networks also keep the
# branches small at the start and normalise their inputs (layer norm). A residual connection
# does not suspend the chain rule; it adds a path whose Jacobian is the identity.
#
# ## What you built, and what it costs
#
# - `matmul_vjp`: two matrix products, as big as the forward one, reading both inputs. Saved
#   as your piece `matmul_vjp`.
# - `unbroadcast`: broadcasting forward is a sum backward. Saved as your piece `unbroadcast`.
# - A Jacobian builder in both modes: $n$ JVPs or $m$ VJPs; reverse mode wins whenever there
#   are more inputs than outputs, which for a loss is always.
# - `residual_vjp`: a fan-out with the identity on one path.
# - Your scalar engine of lesson 02 beside the tape: the same gradient, but a Python object
#   per number and a Python call per node, against a few array operations; the reason every
#   rule above works on whole arrays.
#
# The costs: a VJP never forms the Jacobian, but it reads forward values. The matmul VJP
# reads the layer's input activation $A$; the tanh VJP reads $y$. For a batch of tokens these
# are whole matrices kept from the forward pass until backward reaches them: lesson 06 counts
# those bytes on the engine's tape.
