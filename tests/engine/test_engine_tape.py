"""The tape: recording, the reverse walk, accumulation, graph cuts, dtypes."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import F, Tensor


def leaf(values, dtype=np.float64, name=None):
    return Tensor(np.asarray(values, dtype=dtype), requires_grad=True, name=name)


def test_two_layer_example_of_lesson_01():
    x, y = Tensor(2.0), Tensor(1.0)
    w1, w2 = leaf(0.5), leaf(3.0)
    z1 = w1 * x
    a1 = F.relu(z1)
    z2 = w2 * a1
    loss = (z2 - y) ** 2
    loss.backward()
    assert loss.item() == 4.0
    assert w2.grad == 4.0 and w1.grad == 24.0


def test_fan_out_sums_the_gradients_of_every_use():
    w = leaf(3.0)
    loss = w * 2.0 + w * w  # dl/dw = 2 + 2w = 8
    loss.backward()
    assert w.grad == 8.0


def test_grad_accumulates_until_zero_grad():
    w = leaf([1.0, 2.0])
    for expected in (1, 2, 3):
        (w * 5.0).sum().backward()
        np.testing.assert_array_equal(w.grad, [5.0 * expected] * 2)
    w.zero_grad()
    assert w.grad is None
    (w * 5.0).sum().backward()
    np.testing.assert_array_equal(w.grad, [5.0, 5.0])


def test_define_by_run_records_the_branch_taken():
    def f(w, x):
        return (w * x).relu() if x > 0 else (w * x).exp()
    for x, expected in ((2.0, 2.0), (-1.0, -np.exp(-1.5))):
        w = leaf(1.5)
        f(w, x).backward()
        assert np.isclose(w.grad, expected)


def test_no_grad_and_detach_and_ndarray_round_trip_cut_the_graph():
    w = leaf([1.0, 2.0])
    with engine.no_grad():
        y = w * 3.0
    assert not y.requires_grad and y.is_leaf
    h = w * 3.0
    d = h.detach()
    assert not d.requires_grad and np.shares_memory(d.data, h.data)
    z = Tensor(h.data)  # a trip through numpy: a new leaf without gradient
    for cut in (y, d, z):
        with pytest.raises(RuntimeError, match="does not require grad.*no_grad.*detach"):
            cut.sum().backward()
    (d * w).sum().backward()  # the path through w still works; d is a constant
    np.testing.assert_array_equal(w.grad, d.data)


def test_no_grad_works_as_a_decorator_and_nests():
    @engine.no_grad()
    def evaluate(w):
        return w * 2.0
    w = leaf(1.0)
    assert not evaluate(w).requires_grad
    with engine.no_grad():
        with engine.enable_grad():
            assert (w * 2.0).requires_grad
        assert not (w * 2.0).requires_grad
    assert (w * 2.0).requires_grad


def test_backward_of_a_non_scalar_needs_a_gradient_of_its_shape():
    w = leaf([[1.0, 2.0]])
    y = w * 2.0
    with pytest.raises(RuntimeError, match=r"shape \(1, 2\).*\.sum\(\)"):
        y.backward()
    with pytest.raises(engine.ShapeError, match=r"grad has shape \(2,\)"):
        y.backward(np.ones(2))
    y.backward(np.array([[1.0, 10.0]]))
    np.testing.assert_array_equal(w.grad, [[2.0, 20.0]])


def test_second_backward_without_retain_graph_names_the_op_and_the_fix():
    w = leaf([0.5, 1.0])
    loss = F.exp(w).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match=r"exp .*second time.*retain_graph=True"):
        loss.backward()


def test_retain_graph_allows_a_second_backward_that_accumulates():
    w = leaf([0.5, 1.0])
    loss = F.exp(w).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    np.testing.assert_allclose(w.grad, 2 * np.exp([0.5, 1.0]))


def test_retain_grad_keeps_an_intermediate_gradient():
    w = leaf([1.0, -2.0])
    h = (w * 3.0).retain_grad()
    (h * h).sum().backward()
    np.testing.assert_array_equal(h.grad, 2 * h.data)
    np.testing.assert_array_equal(w.grad, 3 * 2 * h.data)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtypes_follow_the_inputs(dtype):
    rng = np.random.default_rng(0)
    x = leaf(rng.standard_normal((2, 3, 8)), dtype)
    w, b = leaf(np.ones(8), dtype), leaf(np.zeros(8), dtype)
    y = F.gelu(F.layer_norm(x, w, b) @ leaf(rng.standard_normal((8, 5)), dtype))
    loss = F.cross_entropy(y, rng.integers(0, 5, (2, 3))) + (y * 2.0).mean()
    assert y.dtype == dtype and loss.dtype == dtype
    loss.backward()
    assert x.grad.dtype == dtype and w.grad.dtype == dtype


def test_ndarray_on_the_left_of_an_operator_gives_a_tensor():
    w = leaf([1.0, 2.0])
    y = np.array([3.0, 4.0]) * w + np.array(1.0)
    assert isinstance(y, Tensor)
    y.sum().backward()
    np.testing.assert_array_equal(w.grad, [3.0, 4.0])


def test_transpose_follows_pytorch_for_two_axes_and_permute_takes_all():
    x = leaf(np.arange(24.0).reshape(2, 3, 4))
    assert x.transpose(0, 2).shape == (4, 3, 2)
    assert x.transpose(1, 2).shape == (2, 4, 3)
    assert x.permute(2, 0, 1).shape == (4, 2, 3)
    assert x.T.shape == (4, 3, 2) and x.transpose().shape == (4, 3, 2)


def test_a_tensor_copies_its_array_so_later_changes_do_not_leak_in():
    a = np.array([1.0, 2.0])
    t = Tensor(a)
    a[0] = 100.0
    assert t.data[0] == 1.0


def test_integer_tensors_cannot_require_grad():
    with pytest.raises(TypeError, match="only floating-point.*dtype=np.float64"):
        Tensor([1, 2, 3], requires_grad=True)


def test_intermediate_tensors_are_not_kept_alive_by_the_graph():
    """A node links to its inputs' nodes, not to the input tensors."""
    import weakref
    w = leaf(np.ones(4))
    h = w + 1.0          # add saves nothing
    ref = weakref.ref(h)
    loss = (h * 2.0).sum()   # mul by a constant saves only the constant
    del h
    assert ref() is None
    loss.backward()
    np.testing.assert_array_equal(w.grad, np.full(4, 2.0))


def test_custom_op_plugs_into_the_tape():
    """A rule written outside the engine runs through the same machinery."""
    from engine.rules import Op
    from engine.tensor import apply

    class Square(Op):
        name = "square"

        def forward(self, a):
            self.save(a=a)
            return a * a

        def vjp(self, g):
            return (2 * self.a * g,)

    w = leaf([3.0, -1.0])
    apply(Square, w).sum().backward()
    np.testing.assert_array_equal(w.grad, [6.0, -2.0])
    report = engine.gradcheck(lambda t: apply(Square, t), [np.array([0.3, 2.0])])
    assert report.ok


def test_a_vjp_returning_the_wrong_shape_is_caught_and_named():
    from engine.rules import Op
    from engine.tensor import apply

    class BadBroadcast(Op):
        name = "bad_add"

        def forward(self, a, b):
            return a + b

        def vjp(self, g):
            return g, g  # forgot to sum over the broadcast axis

    a, b = leaf(np.ones((2, 3))), leaf(np.ones(3))
    with pytest.raises(engine.ShapeError, match=r"bad_add .*shape \(2, 3\).*shape \(3,\)"
                                                r".*sum over the broadcast axes"):
        apply(BadBroadcast, a, b).sum().backward()


def test_comparisons_give_masks_and_float_gives_a_number():
    x = leaf([-1.0, 2.0])
    np.testing.assert_array_equal(x > 0, [False, True])
    np.testing.assert_array_equal(x <= Tensor([0.0, 2.0]), [True, True])
    loss = (x * x).sum()
    assert float(loss) == 5.0
    if float(loss) > 1:      # define-by-run: a Python condition on a value
        loss = loss * 2.0
    loss.backward()
    np.testing.assert_array_equal(x.grad, [-4.0, 8.0])


def test_layer_norm_parameters_get_gradients_when_x_needs_none():
    """Only weight and bias require grad (e.g. the first layer of a recomputed
    segment): backward must not reach for the weight reference it never saved."""
    import numpy as np
    from engine import Tensor, functional as F
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 4))
    w = Tensor(rng.normal(size=4), requires_grad=True)
    b = Tensor(rng.normal(size=4), requires_grad=True)
    F.layer_norm(Tensor(x), w, b).sum().backward()
    xhat = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(w.grad, xhat.sum(0), rtol=1e-10)
    np.testing.assert_allclose(b.grad, np.full(4, 3.0))


def test_a_tape_observer_sees_every_op_forward_and_backward():
    import numpy as np

    from engine import F, Tensor
    from engine.tensor import TapeObserver, observe

    class Log(TapeObserver):
        def __init__(self):
            self.events = []

        def after_forward(self, op, inputs, result, recorded):
            self.events.append(("forward", op.name, recorded))

        def after_backward(self, node, g, grads, released):
            self.events.append(("backward", node.name, released))

    x = Tensor(np.ones((2, 3)), requires_grad=True)
    with observe(Log()) as log:
        loss = F.exp(x).sum()
        loss.backward()
    names = [e[1] for e in log.events]
    assert [e[0] for e in log.events] == ["forward", "forward", "backward", "backward"]
    assert names[:2] == names[2:][::-1]            # backward visits the ops in reverse
    assert all(e[2] for e in log.events)           # recorded, then released
    assert log.events[0][1] != "op"                # nodes carry their op's name
    loss2 = F.exp(x).sum()                         # outside the block: not observed
    loss2.backward()
    assert len(log.events) == 4


def test_an_op_lists_its_saved_arrays_and_only_those():
    """The tape's copies, its version checks and engine.memory all walk the arrays a
    rule saved through Op.saved_arrays: ndarrays in saving order, other values skipped."""
    from engine.rules import Op
    op = Op((True,))
    x, mask = np.ones(3), np.zeros(2, dtype=bool)
    op.save(x=x, axis=1, mask=mask)
    assert [(k, v is {"x": x, "mask": mask}[k]) for k, v in op.saved_arrays()] == \
        [("x", True), ("mask", True)]
