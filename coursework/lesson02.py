"""Checks for lesson 02, computational graphs.

In the lesson the learner completes a small scalar engine. A `Node` (given in
the notebook) records its value `.data`, its gradient `.grad`, the nodes it
was computed from `.parents` and the name of the operation `.op`. The learner
writes

* 02.1 the local backward rules `rule(grad_out, *inputs) -> input gradients`
  of add, mul, square and relu;
* 02.2 `topological_order(root)` and `backward(root, rules)`: zero the
  intermediate nodes, seed 1, visit the nodes in reverse topological order,
  add each local gradient into the input's `.grad` (so leaves accumulate
  across passes, as in `engine.scalar.Value`);
* 02.3 a gradient-descent loop that zeroes the gradient every step.

A passed 02.2 saves the walk as the piece `scalar_backward` (the notebook's
`rule_table()` and the learner's rules travel with it); its slot contract is
`coursework.slots._check_scalar_backward`, and lesson 03 runs it through
`coursework.pieces.scalar_engine()`.

The checks build their own small graphs with the learner's `Node` class and
predict the outcome of the typical mistakes (an overwrite instead of a sum at
fan-out, a missing seed, the walk in forward order, a missing `visited` set),
so each mistake gets its own hint.
"""
from __future__ import annotations

import math

from ._core import ExerciseError, attempt, passed
from .pieces import save_piece

EX_RULES = "02.1 (local backward rules)"
EX_WALK = "02.2 (topological order and the backward walk)"
EX_LOOP = "02.3 (zero the gradient every step)"


# ---------------------------------------------------------------- reference rules
def _add(g, a, b):
    return g, g


def _sub(g, a, b):
    return g, -g


def _mul(g, a, b):
    return g * b, g * a


def _square(g, a):
    return (2.0 * a * g,)


def _relu(g, a):
    return (g if a > 0 else 0.0,)


REFERENCE_RULES = {"+": _add, "-": _sub, "*": _mul, "square": _square, "relu": _relu}


def _same(a, b) -> bool:
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)


def _as_tuple(exercise, name, out, n):
    """Accept a bare number for a one-input rule; require an n-tuple otherwise."""
    if isinstance(out, list):
        raise ExerciseError(exercise, f"{name} returned the list {out!r}. Return a tuple "
                                      f"(`return grad_a, grad_b`, or a bare number for a "
                                      f"one-input rule): `local_gradients` treats anything "
                                      f"that is not a tuple as one single gradient, so a list "
                                      f"would reach `parent.grad += ...` whole and fail there.")
    if n == 1 and not isinstance(out, tuple):
        out = (out,)
    if not isinstance(out, tuple) or len(out) != n:
        shape = "one number" if n == 1 else f"a pair (grad_a, grad_b)"
        raise ExerciseError(exercise, f"{name} should return {shape}, one gradient per "
                                      f"input, but it returned {out!r}.")
    try:
        return tuple(float(v) for v in out)
    except (TypeError, ValueError):
        raise ExerciseError(exercise, f"{name} returned {out!r}; each gradient should be a "
                                      f"plain number.") from None


# ---------------------------------------------------------------- 02.1
def check_local_rules(add_backward, mul_backward, square_backward, relu_backward) -> None:
    """Each rule takes the upstream gradient first, then the forward inputs."""
    ex = EX_RULES
    g = 1.5

    def call(name, fn, *args):
        return _as_tuple(ex, name, attempt(ex, fn, *args), len(args) - 1)

    got = call("add_backward", add_backward, g, 2.0, -3.0)
    if got == (g / 2, g / 2):
        raise ExerciseError(ex, f"add_backward(1.5, 2, -3) gave {got}: you split the gradient. "
                                f"Hint: a + b grows by 1 when either input grows by 1, so "
                                f"each input receives the full upstream gradient.")
    if not (_same(got[0], g) and _same(got[1], g)):
        raise ExerciseError(ex, f"add_backward(1.5, 2, -3) gave {got}, expected (1.5, 1.5). "
                                f"Hint: both local derivatives of a + b are 1; each input "
                                f"receives grad_out unchanged.")

    want = (g * -3.0, g * 2.0)
    got = call("mul_backward", mul_backward, g, 2.0, -3.0)
    if not all(_same(u, v) for u, v in zip(got, want)):
        if _same(got[0], want[1]) and _same(got[1], want[0]):
            hint = ("the two are swapped: the gradient for a is grad_out * b (the *other* "
                    "input), and for b it is grad_out * a.")
        elif _same(got[0], -3.0) and _same(got[1], 2.0):
            hint = "multiply the local derivatives by grad_out, the upstream gradient."
        elif _same(got[0], g) and _same(got[1], g):
            hint = ("that is the rule of add. d(a*b)/da is b and d(a*b)/db is a: each "
                    "input's gradient uses the other input's forward value (that is why mul "
                    "keeps both).")
        else:
            hint = "d(a*b)/da = b and d(a*b)/db = a; multiply each by grad_out."
        raise ExerciseError(ex, f"mul_backward(1.5, 2, -3) gave {got}, expected {want}. "
                                f"Hint: {hint}")

    (got,) = call("square_backward", square_backward, g, -3.0)
    want = 2.0 * -3.0 * g
    if not _same(got, want):
        hints = {2.0 * -3.0: "multiply by grad_out, the upstream gradient.",
                 -3.0 * g: "the derivative of a^2 is 2a: the factor 2 is missing.",
                 9.0 * g: "that is a^2 times grad_out; the derivative of a^2 is 2a.",
                 2.0 * g: "the derivative of a^2 is 2a: it depends on the forward value a.",
                 -want: "mind the sign: the local derivative 2a keeps the sign of a."}
        hint = next((h for v, h in hints.items() if _same(got, v)),
                    "the local derivative of a^2 is 2a; multiply it by grad_out.")
        raise ExerciseError(ex, f"square_backward(1.5, -3) gave {got:g}, expected {want:g}. "
                                f"Hint: {hint}")

    for a, want in ((2.0, g), (-1.0, 0.0), (0.0, 0.0), (0.5, g)):
        (got,) = call("relu_backward", relu_backward, g, a)
        if _same(got, want):
            continue
        if a < 0 and _same(got, g):
            hint = ("your relu passes the gradient for a negative input. relu(a) = 0 for "
                    "a < 0 does not change when a moves a little, so its gradient is 0 there.")
        elif a == 0 and _same(got, g):
            hint = ("at a = 0 relu has no derivative (its slopes are 0 on the left and 1 on "
                    "the right). This course uses 0 there, like most engines: test a > 0, "
                    "not a >= 0.")
        elif a > 0 and _same(got, a * g):
            hint = "the local derivative is 1 for a > 0 (a gate), not a itself."
        elif a > 0 and _same(got, 1.0):
            hint = "multiply the gate by grad_out: for a > 0 pass grad_out through unchanged."
        else:
            hint = "relu passes grad_out where a > 0 and 0 elsewhere."
        raise ExerciseError(ex, f"relu_backward(1.5, {a:g}) gave {got:g}, expected {want:g}. "
                                f"Hint: {hint}")
    passed(ex, "add, mul, square and relu each send the upstream gradient times the "
               "local derivative.")


# ---------------------------------------------------------------- graphs for 02.2 / 02.3
def _minus_four(Node):
    """The lesson's worked example: L = 0.5 * (w*x - y)^2 at w=2, x=2, y=6."""
    w, x, y = Node(2.0), Node(2.0), Node(6.0)
    u = w * x
    e = u - y
    L = Node(0.5) * e.square()
    return L, {"w": w, "x": x, "y": y, "u": u, "e": e}


def _two_paths(Node):
    """u = w^2 + w at w = 3: two paths from w to u, contributions 6 and 1."""
    w = Node(3.0)
    u = w.square() + w
    return u, {"w": w}


def _self_product(Node):
    """w * w: one operation that reads the same node twice."""
    w = Node(3.0)
    return w * w, {"w": w}


def _branchy(Node):
    """A graph built with a Python `if`, with a ReLU that is off and shared nodes."""
    a, b, c = Node(1.5), Node(-2.0), Node(0.5)
    h = a * b + c                       # -2.5
    gate = h.relu()                     # off: h < 0
    if h.data < 0:                      # define-by-run: only this branch is recorded
        s = (a - c).square() * b + gate * a
    else:
        s = h * h
    out = s * a + b.square()
    return out, {"a": a, "b": b, "c": c, "h": h}


CASES = [("the -4 example, L = 0.5*(w*x - y)^2", _minus_four),
         ("u = w^2 + w (w reaches u along two paths)", _two_paths),
         ("w * w (one op reads w twice)", _self_product),
         ("a graph with a relu, an `if` and shared nodes", _branchy)]


def _parents(node):
    return tuple(node.parents)


def _reference_order(root):
    order, seen = [], set()

    def visit(n):
        if id(n) in seen:
            return
        seen.add(id(n))
        for p in _parents(n):
            visit(p)
        order.append(n)
    visit(root)
    return order


def _order_without_visited_set(root, limit=10_000):
    order = []

    def visit(n):
        if len(order) > limit:
            return
        for p in _parents(n):
            visit(p)
        order.append(n)
    visit(root)
    return order


def _walk(root, order, reverse=True, seed=1.0, accumulate=True):
    """Predict every node's .grad for one way of walking the graph (nodes untouched)."""
    grad = {id(n): 0.0 for n in order}
    grad[id(root)] = seed
    for node in (reversed(order) if reverse else order):
        ps = _parents(node)
        if not ps:
            continue
        local = REFERENCE_RULES[node.op](grad[id(node)], *(p.data for p in ps))
        for p, gp in zip(ps, local):
            grad[id(p)] = grad[id(p)] + gp if accumulate else gp
    return grad


def reference_grads(root) -> dict:
    """{id(node): gradient} for every node of the graph under `root`."""
    return _walk(root, _reference_order(root))


def _check_order(topological_order, Node) -> None:
    ex = EX_WALK
    for title, build in CASES:
        root, named = build(Node)
        order = attempt(ex, topological_order, root)
        try:
            order = list(order)
        except TypeError:
            raise ExerciseError(ex, f"topological_order should return a list of nodes, got "
                                    f"{order!r}.") from None
        want = _reference_order(root)
        ids = [id(n) for n in order]
        if len(ids) != len(set(ids)):
            raise ExerciseError(ex, f"on {title}, topological_order lists some nodes more than "
                                    f"once ({len(ids)} entries for {len(want)} nodes). Hint: "
                                    f"keep a `visited` set and return at once from a node "
                                    f"already in it; a node reached along two paths is still "
                                    f"one node.")
        if set(ids) != {id(n) for n in want}:
            raise ExerciseError(ex, f"on {title}, topological_order returned {len(ids)} nodes "
                                    f"but the graph has {len(want)}. Hint: visit every parent "
                                    f"of every node, starting from the root.")
        position = {i: k for k, i in enumerate(ids)}
        for n in order:
            for p in _parents(n):
                if position[id(p)] > position[id(n)]:
                    raise ExerciseError(ex, f"on {title}, a node comes before one of its "
                                            f"inputs. Hint: append a node to the order *after* "
                                            f"visiting all its parents (post-order), so the "
                                            f"root comes last.")


def check_backward(topological_order, backward, Node) -> None:
    """`topological_order(root)` lists parents first; `backward(root, rules)` fills .grad."""
    ex = EX_WALK
    _check_order(topological_order, Node)
    for title, build in CASES:
        root, named = build(Node)
        order = _reference_order(root)
        predictions = {
            "right": _walk(root, order),
            "overwrite": _walk(root, order, accumulate=False),
            "forward": _walk(root, order, reverse=False),
            "no seed": _walk(root, order, seed=0.0),
            "duplicates": _walk(root, _order_without_visited_set(root)),
        }
        attempt(ex, backward, root, REFERENCE_RULES)
        got = {id(n): float(n.grad) for n in order}

        def matches(pred):
            return all(_same(got[i], pred[i]) for i in got)
        if matches(predictions["right"]):
            continue
        names = ", ".join(f"{k}.grad = {float(v.grad):g} (expected "
                          f"{predictions['right'][id(v)]:g})" for k, v in named.items())
        if matches(predictions["no seed"]):
            hint = ("every gradient is 0: set the seed root.grad = 1.0 (dL/dL = 1) before "
                    "the walk.")
        elif matches(predictions["overwrite"]):
            hint = ("a node that feeds two places gets the gradient of only one of them: you "
                    "overwrite (`parent.grad = g`) instead of summing (`parent.grad += g`). "
                    "At a fan-out the contributions of all paths add up.")
        elif matches(predictions["forward"]):
            hint = ("you walk the graph from the inputs to the output. Walk reversed("
                    "topological_order(root)), so a node is visited only after every node "
                    "that uses it has sent its share.")
        elif matches(predictions["duplicates"]):
            hint = ("some contributions are counted twice: the walk visits a shared node more "
                    "than once. Walk each node exactly once.")
        elif _same(got[id(root)], 0.0):
            hint = "the root's gradient should be the seed 1.0."
        else:
            hint = ("seed root.grad = 1.0, then for each node in reversed(topological_order("
                    "root)) add each of local_gradients(node, rules) to its parent's .grad.")
        raise ExerciseError(ex, f"on {title}: {names}. Hint: {hint}")
    _check_second_backward(backward, Node)
    _check_with_your_rules(backward, Node)
    saved = save_piece("scalar_backward", backward, ex)
    passed(ex, "the -4 example gives w.grad = -4; u = w^2 + w at w = 3 gives 6 + 1 = 7."
               + (" Saved, with your rules, as the piece 'scalar_backward'." if saved else ""))


def _your_rule_table(backward, default):
    """The table `backward(L)` uses without a `rules` argument: the default itself, or,
    for the lesson's `rules=None`, what the notebook's `rule_table()` builds."""
    if isinstance(default, dict):
        return default
    build = getattr(backward, "__globals__", {}).get("rule_table")
    try:
        table = build() if callable(build) else None
    except Exception:  # the learner's table; any failure shows when the walk runs
        table = None
    return table if isinstance(table, dict) else {}


def _check_with_your_rules(backward, Node) -> None:
    """The lesson calls `backward(L)` with its default, the table of your 02.1 rules:
    run that too, so a rule the walk cannot use is named here, not in a later demo."""
    import inspect
    try:
        default = inspect.signature(backward).parameters["rules"].default
    except (KeyError, TypeError, ValueError):
        return
    if default is inspect.Parameter.empty or not (default is None or isinstance(default, dict)):
        return
    table = _your_rule_table(backward, default)
    L, named = _minus_four(Node)
    try:
        attempt(EX_WALK, backward, L)
    except TypeError as err:
        returned = {op: rule.__name__ for op, rule in table.items()
                    if op in REFERENCE_RULES and isinstance(_sample(rule, op), list)}
        which = (f" {', '.join(sorted(returned.values()))} returned a list;" if returned else "")
        raise ExerciseError(EX_WALK, f"with your rules from 02.1 (the default, `rule_table()`) "
                                     f"the walk fails: {err}.{which} every rule must return a "
                                     f"tuple, or a bare number for a one-input op.") from None
    if not _same(named["w"].grad, -4.0):
        raise ExerciseError(EX_WALK, f"with the reference rules your walk is right, but with "
                                     f"your rules from 02.1 (the default, `rule_table()`) "
                                     f"w.grad = {named['w'].grad:g}, not -4. Rerun the 02.1 "
                                     f"cell and its check, then this one.")


def _sample(rule, op):
    """What `rule` returns on a sample input (None if it raises)."""
    try:
        return rule(1.0, 2.0) if op in ("square", "relu") else rule(1.0, 2.0, 3.0)
    except Exception:  # the rule is the learner's; any failure just means "not a list"
        return None


def _check_second_backward(backward, Node) -> None:
    """Backward twice on one graph: leaves add up both passes, intermediates do not."""
    ex = EX_WALK
    L, named = _minus_four(Node)
    attempt(ex, backward, L, REFERENCE_RULES)
    attempt(ex, backward, L, REFERENCE_RULES)
    w, u = named["w"], named["u"]
    if _same(w.grad, -8.0) and _same(u.grad, -2.0):
        return
    if not _same(u.grad, -2.0) and not _same(w.grad, -4.0):
        hint = ("the intermediate nodes kept the gradient of the first pass, so the second "
                "pass sent it on twice. At the start of the walk set .grad = 0.0 on every node "
                "that has parents; only the leaves keep adding across passes.")
    elif _same(w.grad, -4.0):
        hint = ("the leaves were reset too. Reset only the nodes that have parents: a leaf "
                "(an input or a weight) adds each pass's gradient to what it holds.")
    else:
        hint = ("zero the intermediate nodes, seed root.grad = 1.0, then walk; leaves add "
                "each pass's gradient to what they hold.")
    raise ExerciseError(ex, f"on the -4 example, backward run twice on the same graph gave "
                            f"w.grad = {float(w.grad):g} and u.grad = {float(u.grad):g}; "
                            f"expected -8 (both passes add up at the leaf w) and -2 (u's "
                            f"gradient is that of one pass). Hint: {hint}")


# ---------------------------------------------------------------- 02.3
def _descent(w0, x, y, lr, steps, zero=True, sign=-1.0):
    """Losses and final w of gradient descent on 0.5*(w*x - y)^2 (plain floats)."""
    w, grad, losses = w0, 0.0, []
    for _ in range(steps):
        if zero:
            grad = 0.0
        e = w * x - y
        losses.append(0.5 * e * e)
        grad += e * x
        w = w + sign * lr * grad
    return losses, w


def check_gradient_descent(gradient_descent, Node) -> None:
    """`gradient_descent(w, x, y, lr, steps)` updates the Node w and returns the losses."""
    ex = EX_LOOP
    w0, x, y, lr, steps = 2.0, 2.0, 6.0, 0.1, 8
    w = Node(w0)
    losses = attempt(ex, gradient_descent, w, x, y, lr, steps)
    try:
        losses = [float(v) for v in losses]
    except TypeError:
        raise ExerciseError(ex, f"gradient_descent should return the list of losses (plain "
                                f"numbers, one per step), got {losses!r}.") from None
    right, w_right = _descent(w0, x, y, lr, steps)
    if len(losses) != steps:
        raise ExerciseError(ex, f"with steps={steps} you returned {len(losses)} losses. Hint: "
                                f"append L.data once per step, before the update.")
    if all(_same(a, b) for a, b in zip(losses, right)) and _same(w.data, w_right):
        passed(ex, f"the loss falls 2 -> {right[-1]:.3g} and w approaches 3.")
        return
    stale, _ = _descent(w0, x, y, lr, steps, zero=False)
    ascent, _ = _descent(w0, x, y, lr, steps, sign=1.0)
    shown = ", ".join(f"{v:.4g}" for v in losses[:4])
    want = ", ".join(f"{v:.4g}" for v in right[:4])
    if all(_same(a, b) for a, b in zip(losses, stale)):
        hint = ("the gradient of every earlier step is still in w.grad: backward adds to "
                ".grad, it never replaces it. Set w.grad = 0.0 at the start of each step.")
    elif all(_same(a, b) for a, b in zip(losses, ascent)):
        hint = "the loss grows: step against the gradient, w.data -= lr * w.grad."
    elif _same(losses[0], right[1]):
        hint = "record the loss of the step before updating w (the first loss should be 2)."
    elif all(_same(a, b) for a, b in zip(losses, right)):
        hint = (f"the losses are right but w ended at {w.data:g}, expected {w_right:g}: "
                f"update w.data in place so the caller's node learns.")
    else:
        hint = ("each step: zero w.grad, build L = 0.5 * (w*x - y)^2 from w, run backward(L), "
                "record L.data, then w.data -= lr * w.grad.")
    raise ExerciseError(ex, f"your first losses are {shown}; expected {want}. Hint: {hint}")


# ------------------------------------------------------------------ the notebook
#: Each exercise function of the lesson, and its exercise.
EXERCISE_FUNCTIONS = {"add_backward": EX_RULES, "mul_backward": EX_RULES, "square_backward":
                      EX_RULES, "relu_backward": EX_RULES, "topological_order": EX_WALK,
                      "backward": EX_WALK, "gradient_descent": EX_LOOP}


def name_unfinished_exercises() -> None:
    """In the notebook, a cell that needs an unfinished exercise of this lesson says which."""
    from . import _core
    _core.name_unfinished_exercises(EXERCISE_FUNCTIONS)
