"""The exercise checks of lessons 01-03: right answers pass, stubs and typical
wrong answers fail with the exercise's own message and a specific hint."""
from __future__ import annotations

import numpy as np
import pytest

from coursework import lesson01, lesson02, lesson03
from case_tools import assert_each_slip_named
from check_tools import fails_with


def stub(*args, **kwargs):
    raise NotImplementedError()


# ====================================================================== lesson 01
def forward(x, w1, w2, y):
    z1 = w1 * x
    a1 = max(z1, 0.0)
    z2 = w2 * a1
    L = (z2 - y) ** 2
    return L, {"x": x, "w1": w1, "w2": w2, "y": y, "z1": z1, "a1": a1, "z2": z2, "L": L}


def loss_backward(cache):
    return 2 * (cache["z2"] - cache["y"])


def layer2_backward(dL_dz2, cache):
    return dL_dz2 * cache["a1"], dL_dz2 * cache["w2"]


def layer1_backward(dL_da1, cache):
    dL_dz1 = dL_da1 * (1.0 if cache["z1"] > 0 else 0.0)
    return dL_dz1 * cache["x"], dL_dz1


def test_lesson01_right_answers_pass(capsys):
    lesson01.check_forward(forward)
    lesson01.check_layer2_backward(loss_backward, layer2_backward)
    lesson01.check_layer1_backward(layer1_backward)
    lesson01.check_saved_for_backward(lambda: {k: set(v) for k, v in lesson01.READS.items()})
    out = capsys.readouterr().out
    assert "Exercise 01.1 (forward pass) passed. z1=1, a1=1, z2=3, L=4." in out
    assert "dL/dz1=12, dL/dw1=24" in out


def test_lesson01_worked_numbers_are_the_source_texts():
    v = lesson01.reference_forward(2.0, 0.5, 3.0, 1.0)
    assert (v["z1"], v["a1"], v["z2"], v["L"]) == (1.0, 1.0, 3.0, 4.0)
    g = lesson01.reference_backward(v)
    assert g == {"dL_dz2": 4.0, "dL_dw2": 4.0, "dL_da1": 12.0, "dL_dz1": 12.0, "dL_dw1": 24.0}


def test_lesson01_stubs_name_their_exercise():
    fails_with(lesson01.check_forward, stub, words=["Exercise 01.1", "not done yet"])
    fails_with(lesson01.check_layer2_backward, stub, stub, words=["Exercise 01.2"])
    fails_with(lesson01.check_layer1_backward, stub, words=["Exercise 01.3"])
    fails_with(lesson01.check_saved_for_backward, stub, words=["Exercise 01.4"])


def test_lesson01_forward_without_relu():
    def no_relu(x, w1, w2, y):
        z1 = w1 * x
        L, cache = forward(x, w1, w2, y)
        cache.update(a1=z1, z2=w2 * z1, L=(w2 * z1 - y) ** 2)
        return cache["L"], cache
    fails_with(lesson01.check_forward, no_relu, words=["a1 = relu(z1) = max(z1, 0)"])


def test_lesson01_forward_half_squared_loss():
    def half(x, w1, w2, y):
        L, cache = forward(x, w1, w2, y)
        cache["L"] = L / 2
        return L / 2, cache
    fails_with(lesson01.check_forward, half, words=["no 1/2"])


def test_lesson01_loss_backward_missing_factor_two():
    fails_with(lesson01.check_layer2_backward, lambda c: c["z2"] - c["y"], layer2_backward,
               words=["Exercise 01.2", "is 2, expected 4", "factor 2 is missing"])


def test_lesson01_layer2_missing_factor_a1_is_caught_where_a1_is_not_1():
    # at the lesson's own point a1 = 1 hides this mistake; the other points show it
    msg = fails_with(lesson01.check_layer2_backward, loss_backward,
                     lambda g, c: (g, g * c["w2"]), words=["the factor a1 is missing"])
    assert "x=2, w1=0.5," not in msg


def test_lesson01_layer2_missing_factor_w2():
    fails_with(lesson01.check_layer2_backward, loss_backward,
               lambda g, c: (g * c["a1"], g), words=["dL_da1 is 4, expected 12",
                                                     "the factor w2 is missing"])


def test_lesson01_layer2_swapped():
    fails_with(lesson01.check_layer2_backward, loss_backward,
               lambda g, c: (g * c["w2"], g * c["a1"]), words=["swapped"])


def test_lesson01_layer1_missing_factor_x():
    def no_x(g, c):
        dL_dz1 = g * (1.0 if c["z1"] > 0 else 0.0)
        return dL_dz1, dL_dz1
    fails_with(lesson01.check_layer1_backward, no_x,
               words=["dL_dw1 is 12, expected 24", "the factor x is missing"])


def test_lesson01_layer1_relu_that_never_blocks():
    fails_with(lesson01.check_layer1_backward, lambda g, c: (g * c["x"], g),
               words=["w1=-0.5", "ReLU was off", "passes no gradient"])


def test_lesson01_layer1_gate_multiplied_by_z1():
    fails_with(lesson01.check_layer1_backward,
               lambda g, c: (g * c["z1"] * c["x"], g * c["z1"]), words=["not z1 itself"])


def test_lesson01_saved_for_backward_hints():
    right = {k: set(v) for k, v in lesson01.READS.items()}
    with_w1 = dict(right, dL_dw1={"x", "w1"})
    fails_with(lesson01.check_saved_for_backward, lambda: with_w1,
               words=["you listed w1", "no local gradient reads w1"])
    without_y = dict(right, dL_dz2={"z2"})
    fails_with(lesson01.check_saved_for_backward, lambda: without_y,
               words=["it also reads y"])
    with_loss = dict(right, dL_dz2={"z2", "y", "L"})
    fails_with(lesson01.check_saved_for_backward, lambda: with_loss, words=["never reads the loss"])
    # the ReLU's gate can be read from its output as well
    lesson01.check_saved_for_backward(lambda: dict(right, dL_dz1={"a1"}))


# ====================================================================== lesson 02
class Node:
    """The notebook's Node, as the checks receive it."""

    def __init__(self, data, parents=(), op=""):
        self.data, self.grad, self.parents, self.op = float(data), 0.0, tuple(parents), op

    def __add__(self, o):
        o = o if isinstance(o, Node) else Node(o)
        return Node(self.data + o.data, (self, o), "+")

    def __sub__(self, o):
        o = o if isinstance(o, Node) else Node(o)
        return Node(self.data - o.data, (self, o), "-")

    def __mul__(self, o):
        o = o if isinstance(o, Node) else Node(o)
        return Node(self.data * o.data, (self, o), "*")

    __radd__, __rmul__ = __add__, __mul__

    def square(self):
        return Node(self.data ** 2, (self,), "square")

    def relu(self):
        return Node(max(self.data, 0.0), (self,), "relu")


def local_gradients(node, rules):
    if not node.parents:
        return ()
    out = rules[node.op](node.grad, *(p.data for p in node.parents))
    return out if isinstance(out, tuple) else (out,)


def topological_order(root):
    order, seen = [], set()

    def visit(n):
        if n not in seen:
            seen.add(n)
            for p in n.parents:
                visit(p)
            order.append(n)
    visit(root)
    return order


def make_backward(order_fn=topological_order, seed=True, accumulate=True, reverse=True,
                  reset="intermediate"):
    def backward(root, rules):
        order = order_fn(root)
        for node in order:
            if reset == "all" or (reset == "intermediate" and node.parents):
                node.grad = 0.0
        if seed:
            root.grad = 1.0
        for node in (reversed(order) if reverse else order):
            for p, g in zip(node.parents, local_gradients(node, rules)):
                p.grad = p.grad + g if accumulate else g
    return backward


RULES = dict(add=lambda g, a, b: (g, g), mul=lambda g, a, b: (g * b, g * a),
             square=lambda g, a: 2 * a * g, relu=lambda g, a: g if a > 0 else 0.0)


def rules_with(**changed):
    r = dict(RULES, **changed)
    return r["add"], r["mul"], r["square"], r["relu"]


def test_lesson02_right_answers_pass(capsys):
    lesson02.check_local_rules(*rules_with())
    lesson02.check_backward(topological_order, make_backward(), Node)

    def descent(w, x, y, lr, steps):
        losses = []
        for _ in range(steps):
            w.grad = 0.0
            L = 0.5 * (w * x - y).square()
            make_backward()(L, lesson02.REFERENCE_RULES)
            losses.append(L.data)
            w.data -= lr * w.grad
        return losses
    lesson02.check_gradient_descent(descent, Node)
    out = capsys.readouterr().out
    assert "Exercise 02.2 (topological order and the backward walk) passed." in out
    assert "w.grad = -4" in out


def test_lesson02_reference_walk_gives_the_source_texts_numbers():
    L, named = lesson02._minus_four(Node)
    grads = lesson02.reference_grads(L)
    assert [grads[id(named[k])] for k in ("w", "x", "y", "u", "e")] == [-4, -4, 2, -2, -2]
    u, named = lesson02._two_paths(Node)
    assert lesson02.reference_grads(u)[id(named["w"])] == 7.0  # 2w + 1 at w = 3


def test_lesson02_stubs_name_their_exercise():
    fails_with(lesson02.check_local_rules, stub, stub, stub, stub, words=["Exercise 02.1"])
    fails_with(lesson02.check_backward, stub, stub, Node, words=["Exercise 02.2", "not done"])
    fails_with(lesson02.check_backward, topological_order, stub, Node, words=["Exercise 02.2"])
    fails_with(lesson02.check_gradient_descent, stub, Node, words=["Exercise 02.3"])


def test_lesson02_relu_passing_gradient_for_negative_inputs():
    fails_with(lesson02.check_local_rules, *rules_with(relu=lambda g, a: g),
               words=["relu_backward(1.5, -1)", "passes the gradient for a negative input"])


def test_lesson02_relu_subgradient_at_zero():
    fails_with(lesson02.check_local_rules, *rules_with(relu=lambda g, a: g if a >= 0 else 0.0),
               words=["at a = 0", "test a > 0"])


def test_lesson02_mul_swapped_and_add_split():
    fails_with(lesson02.check_local_rules, *rules_with(mul=lambda g, a, b: (g * a, g * b)),
               words=["swapped", "the *other* input"])
    fails_with(lesson02.check_local_rules, *rules_with(mul=lambda g, a, b: (g, g)),
               words=["the rule of add"])
    fails_with(lesson02.check_local_rules, *rules_with(add=lambda g, a, b: (g / 2, g / 2)),
               words=["split the gradient"])


def test_lesson02_square_missing_factor_two():
    fails_with(lesson02.check_local_rules, *rules_with(square=lambda g, a: a * g),
               words=["factor 2 is missing"])


def test_lesson02_overwrite_instead_of_sum_at_fan_out():
    fails_with(lesson02.check_backward, topological_order, make_backward(accumulate=False),
               Node, words=["w.grad", "(`parent.grad += g`)", "fan-out"])


def test_lesson02_missing_seed():
    fails_with(lesson02.check_backward, topological_order, make_backward(seed=False), Node,
               words=["root.grad = 1.0"])


def test_lesson02_walk_in_forward_order():
    fails_with(lesson02.check_backward, topological_order, make_backward(reverse=False), Node,
               words=["from the inputs to the output", "reversed("])


def test_lesson02_order_without_visited_set():
    def no_visited(root):
        order = []

        def visit(n):
            for p in n.parents:
                visit(p)
            order.append(n)
        visit(root)
        return order
    fails_with(lesson02.check_backward, no_visited, make_backward(no_visited), Node,
               words=["more than once", "visited"])


def test_lesson02_preorder_is_not_topological():
    def preorder(root):
        order, seen = [], set()

        def visit(n):
            if n not in seen:
                seen.add(n)
                order.append(n)
                for p in n.parents:
                    visit(p)
        visit(root)
        return order
    fails_with(lesson02.check_backward, preorder, make_backward(preorder), Node,
               words=["before one of its inputs", "post-order"])


def test_lesson02_second_backward_without_resetting_intermediates():
    fails_with(lesson02.check_backward, topological_order, make_backward(reset="none"), Node,
               words=["backward run twice", "w.grad = -20", "has parents"])


def test_lesson02_second_backward_resetting_leaves_too():
    fails_with(lesson02.check_backward, topological_order, make_backward(reset="all"), Node,
               words=["w.grad = -4", "the leaves were reset too"])


def test_lesson02_gradient_descent_without_zeroing():
    def stale(w, x, y, lr, steps):
        losses = []
        for _ in range(steps):
            L = 0.5 * (w * x - y).square()
            make_backward()(L, lesson02.REFERENCE_RULES)
            losses.append(L.data)
            w.data -= lr * w.grad
        return losses
    fails_with(lesson02.check_gradient_descent, stale, Node,
               words=["backward adds to .grad", "w.grad = 0.0"])


def test_lesson02_gradient_ascent():
    def ascent(w, x, y, lr, steps):
        losses = []
        for _ in range(steps):
            w.grad = 0.0
            L = 0.5 * (w * x - y).square()
            make_backward()(L, lesson02.REFERENCE_RULES)
            losses.append(L.data)
            w.data += lr * w.grad
        return losses
    fails_with(lesson02.check_gradient_descent, ascent, Node, words=["w.data -= lr * w.grad"])


# ====================================================================== lesson 03
def matmul_vjp(a, b, g):
    return g @ b.T, a.T @ g


def test_lesson03_matmul_right_answer_passes_and_is_saved(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path))
    lesson03.check_matmul_vjp(matmul_vjp)
    assert "Exercise 03.1 (matmul VJP) passed." in capsys.readouterr().out
    assert (tmp_path / "matmul_vjp.py").exists()


def test_lesson03_matmul_stub():
    fails_with(lesson03.check_matmul_vjp, stub, words=["Exercise 03.1", "not done yet"])


def test_lesson03_matmul_transpose_on_the_wrong_side_fails_on_shapes_first():
    # with non-square shapes the wrong formula cannot even run: the check says why
    message = fails_with(lesson03.check_matmul_vjp, lambda a, b, g: (b.T @ g, a.T @ g),
                         words=["Exercise 03.1", "with a (3, 4), b (4, 5), grad_out (3, 5)",
                                "numpy stopped your function", "ValueError: matmul",
                                "a gradient has its input's shape"])
    assert "grad_out @ b.T" not in message and "a.T @ grad_out" not in message


def test_lesson03_matmul_transposed_result_is_caught_by_values():
    # returns grad_a transposed: for the (3, 4, 5) case the shape is wrong ...
    msg = fails_with(lesson03.check_matmul_vjp, lambda a, b, g: ((g @ b.T).T, a.T @ g),
                     words=["grad_a has shape (4, 3)", "a gradient always has the shape"])
    # ... and a version that fixes the shape only in the square case is caught by values
    def square_only(a, b, g):
        ga = g @ b.T
        return (b @ g.T if ga.shape[0] == ga.shape[1] else ga), a.T @ g
    fails_with(lesson03.check_matmul_vjp, square_only,
               words=["right shape but other values", "right gradient transposed"])
    assert msg


def test_lesson03_matmul_grad_b_transpose_misplaced():
    def wrong_b(a, b, g):
        gb = g.T @ a
        return g @ b.T, (gb.T if gb.shape != b.shape else gb)
    fails_with(lesson03.check_matmul_vjp, wrong_b, words=["grad_b", "transposed"])


def test_lesson03_matmul_each_slip_is_named_by_its_reproduction():
    cases = lesson03._matmul_cases()
    for index, which in ((0, "a"), (1, "b")):
        for slip in lesson03._matmul_slips(which):
            def answer(a, b, g, slip=slip):
                right = [g @ b.T, a.T @ g]
                try:
                    wrong = slip.reproduce(a, b, g)
                except ValueError:
                    return tuple(right)         # the slip cannot run on these shapes
                if wrong.shape == right[index].shape:
                    right[index] = wrong
                return tuple(right)
            fails_with(lesson03.check_matmul_vjp, answer, words=[f"grad_{which}", slip.hint])
    assert cases[1].args[0].shape == (4, 4) and len(cases) > 8


def test_lesson03_matmul_float32_that_is_right_is_told_its_dtype_not_wrong_values():
    def in_float32(a, b, g):
        a, b, g = (x.astype(np.float32) for x in (a, b, g))
        return g @ b.T, a.T @ g
    message = fails_with(lesson03.check_matmul_vjp, in_float32,
                         words=["agrees with the exact gradient", "float32's precision",
                                "keeps its input's dtype"])
    assert "other values" not in message and "wrong values" not in message
    assert "grad_out @ b.T" not in message and "a.T @ grad_out" not in message


def test_lesson03_matmul_a_slip_in_float32_is_still_named():
    def transposed_in_float32(a, b, g):
        a, b, g = (x.astype(np.float32) for x in (a, b, g))
        ga = g @ b.T
        return (b @ g.T if ga.shape[0] == ga.shape[1] else ga), a.T @ g
    fails_with(lesson03.check_matmul_vjp, transposed_in_float32,
               words=["grad_a", "right gradient transposed"])


@pytest.mark.parametrize("wrong", [
    lambda a, b, g: (2 * g @ b.T, a.T @ g),                       # a stray factor of 2
    lambda a, b, g: (g @ b.T, a.T @ g + 1e-3),                    # an offset
    lambda a, b, g: (g @ b.T, np.abs(a.T @ g)),                   # a sign lost
])
def test_lesson03_matmul_a_wrong_answer_that_is_no_known_slip_gets_the_neutral_message(wrong):
    message = fails_with(lesson03.check_matmul_vjp, wrong,
                         words=["right shape but other values", "where the reference has"])
    assert "Hint" not in message
    assert "grad_out @ b.T" not in message and "a.T @ grad_out" not in message


def unbroadcast(grad, shape):
    return lesson03.reference_unbroadcast(grad, shape)


def test_lesson03_unbroadcast_right_answer_passes(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path))
    lesson03.check_unbroadcast(unbroadcast)
    assert "Exercise 03.2 (broadcasting backward) passed." in capsys.readouterr().out
    assert (tmp_path / "unbroadcast.py").exists()


def test_lesson03_unbroadcast_mean_instead_of_sum():
    def mean(grad, shape):
        s = lesson03.reference_unbroadcast(grad, shape)
        return s * (np.prod(shape) / grad.size)
    fails_with(lesson03.check_unbroadcast, mean, words=["mean over the copies"])


def test_lesson03_unbroadcast_no_known_slip_gets_the_neutral_message():
    def first_copy_only(grad, shape):       # picks one copy instead of adding them
        lead = grad.ndim - len(shape)
        g = grad[(0,) * lead]
        stretched = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
        return g[tuple(slice(0, 1) if i in stretched else slice(None)
                       for i in range(g.ndim))]
    message = fails_with(lesson03.check_unbroadcast, first_copy_only,
                         words=["the shape is right but the values are not",
                                "where the reference has"])
    assert "Hint" not in message


def test_lesson03_unbroadcast_runs_generated_shapes():
    pairs = lesson03._broadcast_pairs()
    assert len(pairs) == len(lesson03.UNBROADCAST_CASES) + 8
    assert all(len(big) >= len(small) for big, small in pairs)


def test_lesson03_unbroadcast_only_leading_axes():
    def leading_only(grad, shape):
        lead = grad.ndim - len(shape)
        return grad.sum(axis=tuple(range(lead))) if lead else grad
    fails_with(lesson03.check_unbroadcast, leading_only,
               words=["(4, 3), expected (1, 3)", "nothing was summed"])


def test_lesson03_unbroadcast_drops_size_one_axes():
    def squeezed(grad, shape):
        return np.squeeze(lesson03.reference_unbroadcast(grad, shape))
    fails_with(lesson03.check_unbroadcast, squeezed, words=["keepdims=True"])


def test_lesson03_residual_vjp():
    lesson03.check_residual_vjp(lambda g, vjp: g + vjp(g))
    fails_with(lesson03.check_residual_vjp, stub, words=["Exercise 03.4", "not done yet"])
    fails_with(lesson03.check_residual_vjp, lambda g, vjp: vjp(g),
               words=["only the branch", "identity"])
    fails_with(lesson03.check_residual_vjp, lambda g, vjp: g * vjp(g), words=["add"])


def make_jacobian(stack_forward=1, zero=True, retain=True):
    from engine import Tensor, jvp

    def jacobian(f, x, mode):
        n = x.size
        if mode == "forward":
            columns = []
            for j in range(n):
                e = np.zeros(n)
                e[j] = 1.0
                columns.append(jvp(f, [x], [e])[1])
            return np.stack(columns, axis=stack_forward)
        xt = Tensor(x, requires_grad=True)
        y = f(xt)
        rows = []
        for i in range(y.size):
            e = np.zeros(y.shape)
            e[i] = 1.0
            if zero:
                xt.zero_grad()
            y.backward(e, retain_graph=retain)
            rows.append(xt.grad.copy())
        return np.stack(rows)
    return jacobian


def test_lesson03_jacobian_right_answer_passes(capsys):
    lesson03.check_jacobian(make_jacobian())
    assert "forward mode: 5 JVPs, one column each; reverse mode: 3 VJPs" in capsys.readouterr().out
    fails_with(lesson03.check_jacobian, stub, words=["Exercise 03.3", "not done yet"])


def test_lesson03_jacobian_forward_mode_stacked_as_rows():
    fails_with(lesson03.check_jacobian, make_jacobian(stack_forward=0),
               words=["in forward mode", "transposed", "axis=1"])


def test_lesson03_jacobian_reverse_mode_without_zeroing():
    fails_with(lesson03.check_jacobian, make_jacobian(zero=False),
               words=["in reverse mode", "sum of rows 0..i", "zero_grad"])


def test_lesson03_jacobian_reverse_mode_without_retain_graph():
    fails_with(lesson03.check_jacobian, make_jacobian(retain=False),
               words=["Exercise 03.3", "raised RuntimeError", "retain_graph=True"])


def test_lesson03_jacobian_is_checked_on_other_shapes_than_the_storys():
    right = make_jacobian()

    def three_outputs_assumed(f, x, mode):
        J = right(f, x, mode)
        return J[:3] if mode == "reverse" else J
    fails_with(lesson03.check_jacobian, three_outputs_assumed,
               words=["in reverse mode, for f from R^2 to R^6", "shape (3, 2)"])


def test_lesson03_jacobian_no_known_slip_gets_the_neutral_message():
    right = make_jacobian()
    message = fails_with(lesson03.check_jacobian, lambda f, x, mode: 2 * right(f, x, mode),
                         words=["right shape but other values", "where the reference has"])
    assert "Hint" not in message and "engine.jvp(f, [x], [e_j])" not in message


def test_lesson03_jacobian_forward_mode_by_backward_is_not_forward_mode():
    rev = make_jacobian()

    def reverse_only(f, x, mode):
        return rev(f, x, "reverse")
    fails_with(lesson03.check_jacobian, reverse_only, words=["f ran only 1 time:"])


def test_lesson02_rule_returning_a_list_is_rejected_with_a_hint():
    fails_with(lesson02.check_local_rules, *rules_with(add=lambda g, a, b: [g, g]),
               words=("add_backward", "list", "tuple"))
    fails_with(lesson02.check_local_rules, *rules_with(square=lambda g, a: [2 * a * g]),
               words=("square_backward", "list"))


def test_lesson02_walk_with_the_learners_list_rules_names_them():
    default = {"+": lambda g, a, b: [g, g], "-": lesson02.REFERENCE_RULES["-"],
               "*": lesson02.REFERENCE_RULES["*"], "square": lambda g, a: [2 * a * g],
               "relu": lesson02.REFERENCE_RULES["relu"]}
    walk = make_backward()

    def backward(root, rules=default):
        return walk(root, rules)
    fails_with(lesson02.check_backward, topological_order, backward, Node,
               words=("your rules from 02.1", "returned a list", "tuple"))


def test_lesson02_walk_with_the_learners_tuple_rules_passes(capsys):
    walk = make_backward()

    def backward(root, rules=dict(lesson02.REFERENCE_RULES)):
        return walk(root, rules)
    lesson02.check_backward(topological_order, backward, Node)
    assert "passed" in capsys.readouterr().out


def _lesson02_node_class():
    """The Node class exactly as lesson 02 defines it."""
    import ast
    from pathlib import Path
    source = Path(__file__).parents[1] / "course/source/02_computational_graphs.py"
    tree = ast.parse(source.read_text())
    wanted = [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))
              and n.name in ("Node", "as_node")]
    namespace = {}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(source), "exec"), namespace)
    return namespace["Node"]


def test_lesson02_node_power_says_to_use_square():
    LessonNode = _lesson02_node_class()
    with pytest.raises(TypeError, match=r"e\.square\(\)"):
        LessonNode(3.0) ** 2


def test_lesson03_gradient_ratio_prediction_passes(capsys):
    lesson03.check_gradient_ratio(lambda s, depth: s ** depth)
    assert "passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, words", [
    (lambda s, depth: s * depth, ("linearly", "multiply")),
    (lambda s, depth: s ** -depth, ("other way up",)),
    (lambda s, depth: s ** (depth - 1), ("one factor short",)),
    (lambda s, depth: s ** (depth + 1), ("one factor too many",)),
    (lambda s, depth: "small", ("should be a number",)),
])
def test_lesson03_gradient_ratio_names_the_mistake(answer, words):
    fails_with(lesson03.check_gradient_ratio, answer, words=words)


def test_lesson03_gradient_ratio_each_slip_is_named_by_its_reproduction():
    assert_each_slip_named(lesson03.check_gradient_ratio, lesson03._ratio_cases(),
                           lesson03.RATIO_SLIPS, lesson03._measured_ratio,
                           same=lambda a, b: np.isclose(a, b, rtol=1e-6))


@pytest.mark.parametrize("answer", [
    lambda s, depth: s ** depth if depth < 20 else s ** 20,     # a depth capped at 20
    lambda s, depth: s ** depth if s < 1 else s,                # growth taken for one layer
])
def test_lesson03_gradient_ratio_no_known_slip_gets_the_neutral_message(answer):
    message = fails_with(lesson03.check_gradient_ratio, answer, words=["measured", "times it"])
    for cause in ("linearly", "other way up", "one factor"):
        assert cause not in message


def test_lesson03_gradient_ratio_stub():
    fails_with(lesson03.check_gradient_ratio, stub, words=("03.5", "not done yet"))


# ============================== lesson 02's walk as the piece `scalar_backward`, run in 03
@pytest.fixture()
def pieces_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path))
    return tmp_path


def sub_rule(g, a, b):
    return g, -g


def add_rule(g, a, b):
    return g, g


def mul_rule(g, a, b):
    return g * b, g * a


def square_rule(g, a):
    return 2 * a * g


def relu_rule(g, a):
    return g if a > 0 else 0.0


def rule_table():
    return {"+": add_rule, "-": sub_rule, "*": mul_rule, "square": square_rule, "relu": relu_rule}


def walk_with_your_rules(root, rules=None):
    """The lesson's signature: without `rules`, the table of the notebook's rules."""
    rules = rule_table() if rules is None else rules
    order = topological_order(root)
    for node in order:
        if node.parents:
            node.grad = 0.0
    root.grad = 1.0
    for node in reversed(order):
        for parent, g in zip(node.parents, local_gradients(node, rules)):
            parent.grad += g


def test_lesson02_passed_walk_is_saved_and_is_the_scalar_engine_of_lesson03(pieces_folder,
                                                                            capsys):
    from coursework import pieces, slots
    from engine.scalar import Value
    leaf, backward, owner = pieces.scalar_engine()
    assert leaf is Value and owner == "the engine's (engine.scalar), because not written yet"
    lesson02.check_backward(topological_order, walk_with_your_rules, Node)
    assert "Saved, with your rules, as the piece 'scalar_backward'." in capsys.readouterr().out
    saved = (pieces_folder / "scalar_backward.py").read_text()
    assert "rule_table" in saved and "topological_order" in saved   # its helpers travel with it
    leaf, backward, owner = pieces.scalar_engine()
    assert leaf is slots.ScalarNode and owner == "yours (02.1-02.2)"
    # lesson 03's use: a shared bias, a relu on and off, summed
    w, b = [leaf(2.0), leaf(-1.0)], leaf(0.5)
    L = sum(((wi * xi + b).relu() - 1.0) * ((wi * xi + b).relu() - 1.0)
            for wi, xi in zip(w, (1.0, 3.0)))
    backward(L)
    assert [wi.grad for wi in w] == [3.0, 0.0] and b.grad == 3.0


def test_lesson02_walk_whose_default_rules_are_wrong_is_named(pieces_folder):
    def bad_table():
        return dict(rule_table(), **{"*": lambda g, a, b: (g * a, g * b)})

    def walk(root, rules=None):
        return walk_with_your_rules(root, bad_table() if rules is None else rules)
    message = fails_with(lesson02.check_backward, topological_order, walk, Node,
                         words=("your rules from 02.1", "not -4", "Rerun the 02.1 cell"))
    assert "RULES cell" not in message


@pytest.mark.parametrize("change, why", [
    ("parent.grad += g", "after backward #1"),          # overwrite at a fan-out
    ("if node.parents:", "after backward #2"),          # leaves reset too
])
def test_a_broken_scalar_walk_falls_back_to_engine_scalar_with_the_reason(pieces_folder,
                                                                         change, why):
    import json
    from coursework import pieces
    from engine.scalar import Value
    source = (
        "def backward(root, rules=None):\n"
        "    rules = {'+': lambda g, a, b: (g, g), '-': lambda g, a, b: (g, -g),\n"
        "             '*': lambda g, a, b: (g * b, g * a), 'square': lambda g, a: 2 * a * g,\n"
        "             'relu': lambda g, a: g if a > 0 else 0.0}\n"
        "    order, seen = [], set()\n"
        "    def visit(n):\n"
        "        if n not in seen:\n"
        "            seen.add(n)\n"
        "            for p in n.parents:\n"
        "                visit(p)\n"
        "            order.append(n)\n"
        "    visit(root)\n"
        "    for node in order:\n"
        "        if node.parents:\n"
        "            node.grad = 0.0\n"
        "    root.grad = 1.0\n"
        "    for node in reversed(order):\n"
        "        if not node.parents:\n"
        "            continue\n"
        "        out = rules[node.op](node.grad, *(p.data for p in node.parents))\n"
        "        for parent, g in zip(node.parents, out if isinstance(out, tuple) else (out,)):\n"
        "            parent.grad += g\n")
    broken = {"parent.grad += g": "parent.grad = g",
              "if node.parents:": "if True:"}[change]
    source = source.replace(change, broken) if change != "if node.parents:" else \
        source.replace("    for node in order:\n        if node.parents:",
                       "    for node in order:\n        if True:")
    (pieces_folder / "scalar_backward.py").write_text(source)
    (pieces_folder / "index.json").write_text(json.dumps(
        {"scalar_backward": {"function": "backward", "exercise": "02.2"}}))
    leaf, backward, owner = pieces.scalar_engine()
    assert leaf is Value and backward is Value.backward
    assert owner.startswith("the engine's (engine.scalar), because yours was skipped: ") and why in owner, owner


def test_the_unbroken_scalar_walk_of_the_broken_test_keeps_the_contract():
    """The source the broken cases start from is right: only the change breaks it."""
    from coursework import slots
    slots.check("scalar_backward", walk_with_your_rules)


def test_lesson02_walk_with_rule_table_default_names_the_list_rules(pieces_folder):
    """The lesson's `backward(root, rules=None)` takes the notebook's `rule_table()`: a rule
    there that returns a list is named."""
    namespace = {"topological_order": topological_order, "local_gradients": local_gradients,
                 "REFERENCE": lesson02.REFERENCE_RULES}
    exec("def square_backward(g, a):\n    return [2 * a * g]\n"
         "def rule_table():\n    return dict(REFERENCE, square=square_backward)\n", namespace)
    exec(compile(__import__("inspect").getsource(walk_with_your_rules), "<walk>", "exec"),
         namespace)
    fails_with(lesson02.check_backward, topological_order, namespace["walk_with_your_rules"],
               Node, words=("your rules from 02.1", "square_backward returned a list", "tuple"))


def test_lesson03_residual_vjp_derivation_mistakes():
    """03.4 is derived, not copied: each wrong derivation gets its hint."""
    lesson03.check_residual_vjp(lambda g, vjp: vjp(g) + g)
    fails_with(lesson03.check_residual_vjp, lambda g, vjp: g,
               words=["only the shortcut", "branch_vjp(grad_out)"])
    # an answer that is no known slip is told where it differs, not the answer
    message = fails_with(lesson03.check_residual_vjp, lambda g, vjp: 0.5 * (g + vjp(g)),
                         words=["for a block of width 4", "where the reference has"])
    assert "Hint" not in message and "grad_out + J_F^T grad_out" not in message


def test_lesson03_residual_vjp_runs_generated_widths():
    # a VJP right only for the story's width is caught on another
    fails_with(lesson03.check_residual_vjp,
               lambda g, vjp: g + vjp(g) if g.size == 4 else vjp(g) + g[::-1],
               words=["for a block of width 3"])
    assert [case.args[0].size for case in lesson03._residual_cases()] == [4, 1, 3, 7]
