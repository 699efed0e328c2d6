# %% [markdown]
# # 02 · Computational graphs
#
# **Goals.** By the end of this lesson you will have
# 1. written the local backward rule of four operations (add, multiply, square, ReLU), each
#    a two-line function that knows nothing about the network around it;
# 2. written the walk that applies them to any graph: a topological order, the seed
#    gradient 1, and a sum wherever one value feeds two places;
# 3. followed the `-4` worked example node by node, and the two-path example whose
#    gradient is a sum of two contributions;
# 4. seen the graph being *recorded as the code runs* (a Python `if` in the middle is fine);
# 5. fallen into the accumulation trap (backward twice without zeroing) and fixed a training
#    loop that fell into it.
#
# In lesson 01 you wrote a backward function per *layer* of one particular network. Here
# the unit becomes the *operation*: every operation brings its own backward rule, and one
# generic walk strings the rules together for whatever graph the forward pass produced.
# That is all an autodiff engine is.
#
# **Your pieces in the engine.** Fills: the scalar engine's local rules and backward walk
# (`engine.scalar` is the engine's own): when the check of 02.2 passes, your walk is saved
# as the piece `scalar_backward`, with your four rules of 02.1 and your topological order
# travelling with it. Lesson 03 runs it, beside the tape, on a computation of a thousand
# numbers. Runs: no earlier pieces. (The whole map: CONTRIBUTING.md, "Exercise <-> slot".)

# %%
import matplotlib.pyplot as plt

from coursework import lesson02
from widgets.graph import GraphView, draw_graph

lesson02.name_unfinished_exercises()   # a cell that needs an unfinished exercise says which

# %% [markdown]
# ## A value that remembers where it came from
#
# `Node` below is a complete forward engine. A node holds a number (`data`), a slot for the
# gradient of the final result with respect to it (`grad`, 0 until backward fills it),
# the nodes it was computed from (`parents`) and the name of the operation that made it
# (`op`). Every arithmetic operation returns a new node that points back to its inputs, so
# running ordinary-looking code *records the graph* as a side effect.

# %%
class Node:
    """A scalar in a computation: its value, its gradient, and how it was made."""

    def __init__(self, data, parents=(), op=""):
        self.data = float(data)
        self.grad = 0.0
        self.parents = tuple(parents)
        self.op = op

    def __add__(self, other):
        other = as_node(other)
        return Node(self.data + other.data, (self, other), "+")

    def __sub__(self, other):
        other = as_node(other)
        return Node(self.data - other.data, (self, other), "-")

    def __mul__(self, other):
        other = as_node(other)
        return Node(self.data * other.data, (self, other), "*")

    __radd__ = __add__
    __rmul__ = __mul__

    def __rsub__(self, other):
        return as_node(other) - self

    def square(self):
        return Node(self.data ** 2, (self,), "square")

    def relu(self):
        return Node(self.data if self.data > 0 else 0.0, (self,), "relu")

    def __pow__(self, exponent):
        # This engine has a rule for `square` only; say so instead of Python's bare TypeError.
        raise TypeError(f"Node has no `**` (you wrote `** {exponent!r}`): this small engine "
                        f"knows +, -, *, .square() and .relu(). Write `e.square()` for e ** 2.")

    def __repr__(self):
        return f"Node(data={self.data:g}, grad={self.grad:g}, op={self.op!r})"


def as_node(value):
    """Wrap a plain number as a leaf node; leave a node alone."""
    return value if isinstance(value, Node) else Node(value)

# %% [markdown]
# The worked example of this lesson is a one-weight model $u = w x$ with a half-squared
# error loss against a target $y$:
#
# $$e = u - y, \qquad L = \tfrac12 e^2, \qquad w = 2,\ x = 2,\ y = 6 .$$
#
# The prediction $u = 4$ is 2 short of the target, so $e = -2$ and $L = 2$.

# %%
w, x, y = Node(2.0), Node(2.0), Node(6.0)
u = w * x
e = u - y
L = 0.5 * e.square()
print(L)
print("L was made by", repr(L.op), "from", L.parents)

# %%
names = {"w": w, "x": x, "y": y, "u": u, "e": e, "L": L}
draw_graph(L, names=names, show_grad=False, title="the recorded graph of L = 0.5 * (w*x - y)^2")
plt.show()

# %% [markdown]
# Every box is a node, every circle the operation that made the box to its right. The
# constant 0.5 became a leaf node too: `0.5 * e.square()` called `Node.__rmul__`, which
# wrapped it. Nothing here knows about calculus yet.
#
# ## Local rules
#
# Backward visits each operation once, holding `grad_out`, the gradient of the final result
# with respect to the operation's output. The operation's *local rule* turns it into one
# gradient per input: `grad_out` times the local derivative, evaluated at the forward
# values. A rule is a plain function `rule(grad_out, *inputs)` returning one gradient per
# input (a single number for a one-input operation). Subtraction is done for you, at the
# top of the exercise cell below.

# %% [markdown]
# ## Exercise 02.1 · Four local rules
#
# | op | forward | local derivatives | reads from the forward pass |
# |---|---|---|---|
# | add | $z = a + b$ | $1,\ 1$ | nothing |
# | mul | $z = a b$ | $b,\ a$ | both inputs |
# | square | $z = a^2$ | $2a$ | $a$ |
# | relu | $z = \max(a, 0)$ | $1$ if $a > 0$ else $0$ | the sign of $a$ |
#
# Write the four rules. The ReLU has no derivative at $a = 0$ (the slope jumps from 0 to 1);
# like most engines, this course uses 0 there. The last column is why an engine keeps
# forward values: multiplying needs both inputs again on the way back.

# %%
def sub_backward(grad_out, a, b):
    """z = a - b: dz/da = 1, dz/db = -1. (Done for you.)"""
    return grad_out, -grad_out


def add_backward(grad_out, a, b):
    """z = a + b. Return (grad_a, grad_b)."""
    ### BEGIN SOLUTION
    return grad_out, grad_out
    ### END SOLUTION


def mul_backward(grad_out, a, b):
    """z = a * b. Return (grad_a, grad_b)."""
    ### BEGIN SOLUTION
    return grad_out * b, grad_out * a
    ### END SOLUTION


def square_backward(grad_out, a):
    """z = a ** 2. Return grad_a."""
    ### BEGIN SOLUTION
    return 2 * a * grad_out
    ### END SOLUTION


def relu_backward(grad_out, a):
    """z = max(a, 0), with derivative 0 at a = 0. Return grad_a."""
    ### BEGIN SOLUTION
    return grad_out if a > 0 else 0.0
    ### END SOLUTION

# %%
# CHECK 02.1
lesson02.check_local_rules(add_backward, mul_backward, square_backward, relu_backward)

# %% [markdown]
# ## The walk
#
# Four facts turn the rules into a backward pass.
#
# 0. **A fresh start for this pass.** The gradients of the intermediate nodes describe
#    this one backward pass, so the walk sets them to 0 first. The leaves (inputs and
#    weights, the nodes without parents) are left alone: they *add* every pass's gradient
#    to what they hold, on purpose (the end of this lesson shows why, and the trap in it).
# 1. **Seed.** The walk starts at the root with $\partial L/\partial L = 1$: a unit of
#    sensitivity, not a learning rate or a guess.
# 2. **Order.** A node may send its gradient on only when it is *complete*, that is after
#    every node that uses it has sent its share. Listing the nodes so that each comes after
#    all of its inputs (a *topological order*) and walking that list backwards guarantees
#    it. A depth-first search that appends a node after visiting its parents gives such a
#    list; a `visited` set makes sure a node reached along two paths is listed once.
# 3. **Sum.** A node that feeds several places receives one contribution from each. They
#    add up (`parent.grad += g`): this is the multivariable chain rule.
#
# ## Exercise 02.2 · Topological order and the backward walk
#
# The rules go into a table keyed by the `op` name a node records: `rule_table()`, at the
# top of the next cell, builds it from your functions (it builds it afresh at each call, so a
# rule you fix in 02.1 is the one the walk uses). `local_gradients` looks up a node's rule
# and calls it with the node's gradient and its inputs' forward values.
#
# Write `topological_order(root)`, a list of every node `root` depends on, inputs before
# the nodes made from them, `root` last. Then write `backward(root, rules)`: zero the
# intermediate nodes, seed, walk in reverse, add into each parent.

# %%
def rule_table():
    """The local rules by op name: yours from 02.1, and sub_backward."""
    return {"+": add_backward, "-": sub_backward, "*": mul_backward,
            "square": square_backward, "relu": relu_backward}


def local_gradients(node, rules):
    """What `node` sends to each of its parents: its rule applied to node.grad."""
    if not node.parents:
        return ()
    out = rules[node.op](node.grad, *(p.data for p in node.parents))
    return out if isinstance(out, tuple) else (out,)


def topological_order(root):
    """Every node that root depends on, each after all of its parents; root last."""
    ### BEGIN SOLUTION
    order, visited = [], set()

    def visit(node):
        if node in visited:
            return
        visited.add(node)
        for parent in node.parents:
            visit(parent)
        order.append(node)

    visit(root)
    return order
    ### END SOLUTION


def backward(root, rules=None):
    """Give every intermediate node d(root)/d(node) in .grad; add it to each leaf's .grad."""
    rules = rule_table() if rules is None else rules
    ### BEGIN SOLUTION
    order = topological_order(root)
    for node in order:
        if node.parents:          # intermediate: its gradient belongs to this pass
            node.grad = 0.0
    root.grad = 1.0
    for node in reversed(order):
        for parent, g in zip(node.parents, local_gradients(node, rules)):
            parent.grad += g
    ### END SOLUTION

# %%
# CHECK 02.2
lesson02.check_backward(topological_order, backward, Node)

# %% [markdown]
# ## The `-4` example, node by node
#
# Now watch your engine run on the worked example. The view below calls your `backward`
# once and lets you replay it: step 0 is the graph before backward (every gradient 0), each
# step visits one node in reverse topological order, and at the last step every box holds
# its gradient. Drag the slider, or use the buttons.

# %%
w, x, y = Node(2.0), Node(2.0), Node(6.0)
u = w * x
e = u - y
L = 0.5 * e.square()
names = {"w": w, "x": x, "y": y, "u": u, "e": e, "L": L}
view = GraphView(L, names=names, backward=backward, title="L = 0.5 * (w*x - y)^2")
view.ui

# %% [markdown]
# The first and the last step side by side, as a picture that stays in the notebook file:

# %%
fig, axes = plt.subplots(2, 1, figsize=(10, 5.6))
draw_graph(L, names=names, grads=view.grads_at(0), ax=axes[0], title="before backward")
draw_graph(L, names=names, ax=axes[1], title="after backward")
plt.show()

# %% [markdown]
# In words:

# %%
for name in ["L", "e", "u", "w", "x", "y"]:
    print(f"dL/d{name} = {names[name].grad:g}")

# %% [markdown]
# The seed 1 enters the half-square node, whose local derivative is $e = -2$: so
# $\partial L/\partial e = -2$. The minus sign survives squaring: the error says which way
# the prediction is off. Subtraction passes $-2$ to $u$ unchanged (and $+2$ to $y$), and
# the multiplication hands $u$'s gradient to $w$ times the *other* input $x = 2$:
#
# $$\frac{\partial L}{\partial w} = 1 \cdot e \cdot 1 \cdot x = 1 \cdot (-2) \cdot 1 \cdot 2 = -4 .$$
#
# A negative gradient says that increasing $w$ decreases the loss, which is right: the
# prediction $wx = 4$ is below the target 6. It does not say *how far* to move: a
# gradient-descent step $w \leftarrow w - \eta \cdot (-4)$ picks the distance with the
# learning rate $\eta$. And the numbers hold at this point only: after the step, the forward
# pass must run again before the next backward.
#
# ## Fan-out: two paths, one sum
#
# In $u = w^2 + w$ the weight $w$ reaches $u$ along two paths: through the square, and
# straight into the addition. Changing $w$ by a small $\Delta$ moves both branches, so both
# count:
#
# $$\frac{du}{dw} = \underbrace{2w}_{\text{square path}} + \underbrace{1}_{\text{direct path}} = 6 + 1 = 7 \quad (w = 3).$$
#
# To *see* the two contributions, run your `backward`, then ask every node that uses `w`
# what it sent: after the walk each node's gradient is final, so applying its rule again
# reproduces exactly the share it passed to `w`.

# %%
w = Node(3.0)
u = w.square() + w
backward(u)
for node in topological_order(u):
    for i, parent in enumerate(node.parents):
        if parent is w:
            share = local_gradients(node, rule_table())[i]
            print(f"the {node.op!r} node (grad {node.grad:g}) sends w {share:g}")
print(f"w.grad = {w.grad:g}, the sum of both")

# %% [markdown]
# Had `backward` written `parent.grad = g` instead of `+=`, the contribution that arrived
# second would have erased the first, leaving 6 or 1 depending on the order of the walk.
# Both are finite, plausible-looking numbers, which is what makes the bug nasty. The same
# sum is what happens at every shared weight (a weight used at each position of a sequence),
# every residual connection (lesson 03) and every recurrent network unrolled in time.

# %%
w = Node(3.0)
u = w.square() + w
GraphView(u, names={"w": w, "u": u}, backward=backward, title="u = w^2 + w").ui

# %% [markdown]
# ## Your engine and the course engine
#
# `engine.scalar.Value` is the course's version of what you just built. Run the same two
# examples through it:

# %%
from engine.scalar import Value

vw, vx, vy = Value(2.0), Value(2.0), Value(6.0)
vL = 0.5 * (vw * vx - vy) ** 2
vL.backward()
print(f"Value: L = {vL.data:g}, dL/dw = {vw.grad:g}, dL/dx = {vx.grad:g}, dL/dy = {vy.grad:g}")

vw = Value(3.0)
vu = vw ** 2 + vw
vu.backward()
print(f"Value: u = w^2 + w at w = 3, du/dw = {vw.grad:g}")

# %% [markdown]
# Same numbers. `Value` is your `Node` with more operations; open `engine/scalar.py` and
# you will recognise everything:
#
# | | your `Node` | `engine.scalar.Value` |
# |---|---|---|
# | inputs of a node, operation | `.parents`, `.op` | `.inputs`, `.op` (and an optional `.label`) |
# | the rules | `rule_table()[op](grad_out, *inputs)` returns what each input receives | `LOCAL_GRADIENTS[op](out, *inputs)` returns the local derivatives; `backward` multiplies them by the node's gradient |
# | operations | `+ - *`, `square`, `relu` | also `/`, `**`, `neg`, `tanh`, `exp`, `log` |
# | the walk | your `backward` | `Value.backward()`: the same four steps |
# | clearing a leaf | `w.grad = 0.0` | `w.zero_grad()` |
#
# Your rules take the upstream gradient and return the products, which is the form the
# tensor engine uses from lesson 03 on (`engine/rules.py`: each op's forward next to its
# `vjp(g)`); `Value` keeps the older textbook split "local derivative, then multiply". Both
# keep every rule of the engine in one short table.
#
# ## Define-by-run: the graph is whatever ran
#
# Nobody declared the graph in advance: each operation appended itself as the Python code
# executed. So ordinary control flow just works. The function below takes a different
# branch depending on the data; the recorded graph contains only the branch that ran, and
# the gradient is the gradient of that branch.

# %%
def f(a):
    h = a * a
    if h.data > 4:          # plain Python, deciding on a value
        return h * 3.0
    return h + a


for start in (1.0, 3.0):
    a = Node(start)
    out = f(a)
    backward(out)
    branch = "h * 3" if a.data ** 2 > 4 else "h + a"
    print(f"a = {start:g}: took {branch}, f = {out.data:g}, df/da = {a.grad:g}")

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 2.8))
for ax, start in zip(axes, (1.0, 3.0)):
    a = Node(start)
    out = f(a)
    backward(out)
    draw_graph(out, names={"a": a, "f": out}, ax=ax, title=f"graph recorded for a = {start:g}")
plt.show()

# %% [markdown]
# For $a = 1$: $f = a^2 + a$, so $df/da = 2a + 1 = 3$ (another fan-out). For $a = 3$:
# $f = 3a^2$, so $df/da = 6a = 18$. The `if` itself is not differentiated; it only decided
# which operations were recorded. This is what "define-by-run" means, and why a Python `if`
# inside a PyTorch model is fine.
#
# ## The accumulation trap
#
# Your `backward` adds into `.grad` and never clears it. Call it twice and the second
# gradient lands on top of the first:

# %%
w, x, y = Node(2.0), Node(2.0), Node(6.0)
L = 0.5 * (w * x - y).square()
backward(L)
print(f"after one backward:  w.grad = {w.grad:g}")
L = 0.5 * (w * x - y).square()     # a new forward pass, as in the next training step
backward(L)
print(f"after two backwards: w.grad = {w.grad:g}   (the gradient is still -4)")

# %% [markdown]
# The course engine does the same (`Value.backward()` adds too):

# %%
vw = Value(2.0)
for _ in range(2):
    vL = 0.5 * (vw * 2.0 - 6.0) ** 2
    vL.backward()
print(f"Value after two backwards: w.grad = {vw.grad:g}")
vw.zero_grad()
vL = 0.5 * (vw * 2.0 - 6.0) ** 2
vL.backward()
print(f"after zero_grad() and one more backward: w.grad = {vw.grad:g}")

# %% [markdown]
# This is a feature. Summing the gradients of several small batches before one update is
# *gradient accumulation*: it simulates a big batch on a small machine (lesson 08). It is
# also a trap: a training loop that never clears the gradient steps along the sum of every
# gradient it has ever seen. The loss first seems to fall faster, then overshoots and
# oscillates, with nothing in the code looking wrong.
#
# Both kinds of summing use `+=`, but they are different things. The sum at a fan-out
# happens *inside one backward pass* and is required by the chain rule. The sum across
# backward passes is a *training choice*, and the training loop decides when to clear.
#
# ## Exercise 02.3 · A training loop that zeroes its gradient
#
# Write `gradient_descent(w, x, y, lr, steps)`: for each step, clear `w.grad`, build
# $L = \frac12 (w x - y)^2$ from the node `w` and the numbers `x`, `y`, run your
# `backward(L)`, record `L.data`, then move `w.data` against the gradient by `lr` times it.
# Return the list of losses.

# %%
def gradient_descent(w, x, y, lr, steps):
    """Minimise 0.5 * (w*x - y)^2 over the node w; return the loss of every step."""
    losses = []
    ### BEGIN SOLUTION
    for _ in range(steps):
        w.grad = 0.0
        L = 0.5 * (w * x - y).square()
        backward(L)
        losses.append(L.data)
        w.data -= lr * w.grad
    ### END SOLUTION
    return losses

# %%
# CHECK 02.3
lesson02.check_gradient_descent(gradient_descent, Node)

# %% [markdown]
# Here is what the check guards against: the same loop with and without the clearing line.

# %%
def descent_without_zeroing(w, x, y, lr, steps):
    losses = []
    for _ in range(steps):
        L = 0.5 * (w * x - y).square()
        backward(L)
        losses.append(L.data)
        w.data -= lr * w.grad
    return losses


right = gradient_descent(Node(2.0), 2.0, 6.0, 0.1, 25)
stale = descent_without_zeroing(Node(2.0), 2.0, 6.0, 0.1, 25)
print("step  zeroed      never zeroed")
for step in (0, 1, 2, 5, 10, 24):
    print(f"{step:>4}  {right[step]:<10.4g}  {stale[step]:.4g}")

fig, ax = plt.subplots(figsize=(6, 3.2))
ax.semilogy(right, "o-", ms=3, label="w.grad zeroed each step")
ax.semilogy(stale, "s-", ms=3, label="w.grad never zeroed")
ax.set_xlabel("step")
ax.set_ylabel("loss")
ax.set_title("gradient descent on 0.5 (w x - y)^2, lr = 0.1")
ax.legend()
plt.show()

# %% [markdown]
# ## What you built, and what it costs
#
# - Four local rules, each a line or two, each reading only its own forward inputs.
# - A topological order and a walk: seed 1, reverse order, `+=` into each input. With the
#   rules it differentiates any graph made of these operations, including graphs shaped by
#   `if`s and loops, because the graph is recorded as the code runs. Saved, rules and all, as
#   your piece `scalar_backward`: lesson 03 runs it beside the tape.
# - The habit of clearing gradients once per step, and the knowledge that summing is right
#   inside a pass (fan-out) and a choice across passes (accumulation).
#
# The cost: every node stays alive until backward has visited it (the graph holds its
# parents), and every operation that reads its inputs on the way back (mul, square, relu)
# keeps them. With scalars that is a few bytes per node; with tensors each node is a whole
# array. Lesson 03 moves to tensors, where the local rules become vector-Jacobian products.
