"""Edges of the tape's API: arrays the caller still owns, exponent 0, integer casts,
empty inputs, closures in checkpointed segments, graphs dropped without backward.

Each test here failed before the fix it guards: a wrong gradient given silently,
a NaN, a raw numpy or Python error that named neither the op nor the fix, or a
buffer kept alive."""
from __future__ import annotations

import gc
import warnings
import weakref

import numpy as np
import pytest

import engine
from engine import F, Tensor
from engine.recompute import checkpoint


def leaf(values, name=None):
    return Tensor(np.asarray(values, dtype=np.float64), requires_grad=True, name=name)


# ------------------------------------------- arrays the caller still owns
def test_changing_a_caller_array_after_the_forward_does_not_change_the_gradient():
    w = leaf([1.0, 2.0, 3.0])
    a = np.array([1.0, 2.0, 3.0])
    loss = (w * a).sum()           # mul keeps a for w's gradient
    a[:] = 100.0
    loss.backward()
    np.testing.assert_array_equal(w.grad, [1.0, 2.0, 3.0])


@pytest.mark.parametrize("make_loss", [
    lambda w, a: (a @ w).sum(),                                   # matmul keeps a
    lambda w, a: (F.layer_norm(w, a[0], None) ** 3).sum(),         # layer_norm keeps a[0]
    lambda w, a: F.causal_attention(w[None], a[None], a[None]).sum(),  # keeps k, v
    lambda w, a: checkpoint(lambda t, c: (t * c).sum(), w, a),    # the checkpoint keeps a
])
def test_every_op_that_keeps_a_caller_array_keeps_a_copy(make_loss):
    rng = np.random.default_rng(0)
    w0, a0 = rng.normal(size=(3, 3)), rng.normal(size=(3, 3))
    reference = leaf(w0)
    make_loss(reference, a0.copy()).backward()
    w, a = leaf(w0), a0.copy()
    loss = make_loss(w, a)
    a[...] = rng.normal(size=a.shape)          # the caller reuses their array
    loss.backward()
    np.testing.assert_allclose(w.grad, reference.grad, rtol=1e-12, atol=0)


def test_a_view_op_on_a_caller_array_does_not_share_its_memory():
    w = leaf([1.0, 2.0, 3.0, 4.0])
    a = np.arange(4.0)
    loss = (w * F.reshape(a, (4,))).sum()
    a[:] = -1.0
    loss.backward()
    np.testing.assert_array_equal(w.grad, [0.0, 1.0, 2.0, 3.0])


def test_the_snapshot_is_saved_bytes_and_lets_the_callers_buffer_go():
    big = np.ones(1000)
    w = leaf(np.ones(3))
    with engine.memory.record() as mem:
        loss = (w * big[:3]).sum()
    # the tape keeps a 3-element copy (24 bytes), not the caller's 8000-byte buffer
    assert mem.saved_bytes == 3 * 8
    [saved] = [s for s in mem.saved if s.op == "mul"]
    assert saved.counted_bytes == saved.nbytes == 24
    mul_node = loss._node.parents[0]          # the sum's input is the mul's output
    assert mul_node.name == "mul" and not np.shares_memory(mul_node.b, big)


@pytest.mark.parametrize("make_index", [
    lambda: np.array([0, 1, 1]),
    lambda: Tensor(np.array([0, 1, 1])),           # an index Tensor (PyTorch raises here)
    lambda: [0, 1, 1],
])
def test_changing_an_index_after_the_forward_does_not_change_the_gradient(make_index):
    x = leaf([10.0, 20.0, 30.0, 40.0])
    index = make_index()
    loss = x[index].sum()
    index[0] = 3
    loss.backward()
    np.testing.assert_array_equal(x.grad, [1.0, 2.0, 0.0, 0.0])


def test_a_boolean_mask_and_a_tuple_index_are_kept_too():
    x = leaf(np.arange(6.0).reshape(2, 3))
    mask = np.array([[True, False, True], [False, False, True]])
    rows, cols = np.array([0, 1]), np.array([2, 2])
    loss = x[mask].sum() + x[rows, cols].sum() + x[0, np.array([1])].sum()
    mask[:] = True
    rows[:], cols[:] = 1, 0
    loss.backward()
    np.testing.assert_array_equal(x.grad, [[1.0, 1.0, 2.0], [0.0, 0.0, 2.0]])


def test_the_kept_index_is_counted_by_the_memory_recorder():
    x = leaf(np.ones(10))
    index = np.arange(5, dtype=np.int64)
    with engine.memory.record() as mem:
        x[index].sum()
    [saved] = mem.saved
    assert (saved.op, saved.dtype, saved.counted_bytes) == ("getitem", "int64", 5 * 8)
    assert mem.saved_bytes == 40


# ------------------------------------------------------------------ x ** 0
def test_x_to_the_power_0_has_gradient_0_everywhere_even_at_0():
    x = leaf([0.0, 2.0, -3.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # no divide-by-zero warning either
        (x ** 0).sum().backward()
        _, tangent = engine.jvp(lambda t: t ** 0, [np.zeros(2)], [np.ones(2)])
    np.testing.assert_array_equal(x.grad, [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(tangent, [0.0, 0.0])


def test_x_to_the_power_0_saves_nothing():
    x = leaf(np.ones(4))
    with engine.memory.record() as mem:
        F.pow(x, 0)
    assert mem.saved == []


# ------------------------------------------------------------ integer casts
@pytest.mark.parametrize("dtype", [np.int64, np.int32, bool])
def test_a_cast_to_an_integer_dtype_leaves_the_graph(dtype):
    x = leaf([0.5, 1.5, 2.5])
    ids = x.astype(dtype)
    assert ids.dtype == np.dtype(dtype)
    assert not ids.requires_grad and ids.is_leaf
    with pytest.raises(RuntimeError, match="does not require grad"):
        ids.sum().backward()
    _, tangent = engine.jvp(lambda t: t.astype(dtype), [np.array([0.5, 1.5])],
                            [np.array([2.7, 3.2])])
    assert not tangent.any()                  # forward mode agrees: no derivative


def test_a_cast_between_float_dtypes_stays_on_the_graph():
    x = leaf([0.5, 1.5])
    y = x.astype(np.float32)
    assert y.requires_grad and y._node.name == "cast"
    (y * 2).sum().backward()
    assert x.grad.dtype == np.float64 and np.array_equal(x.grad, [2.0, 2.0])


# ------------------------------------------------------------- empty inputs
@pytest.mark.parametrize("make, pattern", [
    (lambda: F.softmax(leaf(np.zeros((2, 0)))),
     r"softmax: the input has shape \(2, 0\).*no elements.*axis 1 has length 0"),
    (lambda: F.softmax(leaf(np.zeros((0, 3)))), r"softmax: the input has shape \(0, 3\)"),
    (lambda: F.log_softmax(leaf(np.zeros((4, 0)))), r"log_softmax: the input has shape"),
    (lambda: F.layer_norm(leaf(np.zeros((2, 0))), None, None),
     r"layer_norm: the input x has shape \(2, 0\).*no elements"),
    (lambda: F.layer_norm(leaf(np.zeros((0, 4))), leaf(np.ones(4)), leaf(np.zeros(4))),
     r"layer_norm: the input x has shape \(0, 4\)"),
    (lambda: F.causal_attention(*[leaf(np.zeros((1, 0, 4)))] * 3),
     r"causal_attention: q, k and v have shape \(1, 0, 4\).*axis 1 has length 0"),
    (lambda: F.causal_attention(*[leaf(np.zeros((1, 3, 0)))] * 3),
     r"causal_attention: q, k and v have shape \(1, 3, 0\)"),
    (lambda: F.causal_attention(*[leaf(np.zeros((0, 2, 3, 4)))] * 3),
     r"causal_attention: .*\(0, 2, 3, 4\)"),
])
def test_empty_inputs_get_a_message_naming_the_op_and_the_shape(make, pattern):
    with pytest.raises(engine.ShapeError, match=pattern) as err:
        make()
    assert "check" in str(err.value)   # and says what to do


def test_layer_norm_of_a_single_number_names_the_missing_axis():
    with pytest.raises(engine.ShapeError, match=r"layer_norm: .*shape \(\).*at least one axis"):
        F.layer_norm(leaf(3.0), None, None)


@pytest.mark.parametrize("op", [F.softmax, F.log_softmax])
def test_a_bad_softmax_axis_names_the_op_the_axis_and_the_shape(op):
    name = op.__name__
    x = leaf(np.ones((2, 3)))
    with pytest.raises(engine.ShapeError, match=rf"{name}: axis 2 is out of range for a "
                                                rf"tensor of shape \(2, 3\).*-2\.\.1.*axis=-1"):
        op(x, axis=2)
    with pytest.raises(engine.ShapeError, match=rf"{name}: axis -3 is out of range"):
        op(x, axis=-3)
    with pytest.raises(TypeError, match=rf"{name}: axis must be one integer.*None"):
        op(x, axis=None)
    with pytest.raises(engine.ShapeError, match=rf"{name}: .*shape \(\).*no axis"):
        op(leaf(1.0))
    np.testing.assert_allclose(op(x, axis=np.int64(0)).data, op(x, axis=-2).data)


def test_gradcheck_refuses_an_empty_input_before_running_anything():
    calls = []

    def fn(t):
        calls.append(1)
        return t.sum()

    with pytest.raises(ValueError, match=r"gradcheck: input 0 has shape \(0,\), no elements"
                                         r".*non-empty.*wrt="):
        engine.gradcheck(fn, [np.zeros(0)])
    with pytest.raises(ValueError, match=r"gradcheck: 'b' has shape \(2, 0\)"):
        engine.gradcheck(lambda a, b: a.sum() + b.sum(), [np.ones(2), leaf(np.ones((2, 0)), "b")])
    assert calls == []


def test_gradcheck_refuses_samples_below_1_and_an_empty_output():
    with pytest.raises(ValueError, match=r"gradcheck: samples=0.*at least 1"):
        engine.gradcheck(lambda t: t.sum(), [np.ones(3)], samples=0)
    with pytest.raises(ValueError, match=r"gradcheck: fn returned a tensor of shape \(0,\)"):
        engine.gradcheck(lambda t: t[:0] * 2.0, [np.ones(3)])


# ------------------------------------------------ checkpoint with a closure
def test_a_checkpointed_segment_reading_an_outer_result_gets_the_right_diagnosis():
    w = leaf([1.0, 2.0, 3.0], name="w")
    x = leaf([0.0, 1.0, 2.0], name="x")
    z = w * 3.0                               # a result of the outer tape (a non-leaf)
    with pytest.raises(RuntimeError) as err:
        checkpoint(lambda t: t * z, x, label="seg")
    msg = str(err.value)
    assert msg.startswith("checkpoint(seg): the segment reads a tensor made outside it by "
                          "mul (node #")
    assert "not one of its inputs" in msg and "checkpoint(fn, x, z)" in msg
    assert "retain_graph" not in msg


def test_an_outer_result_passed_as_an_input_works():
    w = leaf([1.0, 2.0, 3.0], name="w")
    x = leaf([0.0, 1.0, 2.0], name="x")
    z = w * 3.0
    loss = (checkpoint(lambda t, c: t * c, x, z) + z).sum()
    loss.backward()
    np.testing.assert_array_equal(w.grad, 3.0 * x.data + 3.0)
    np.testing.assert_array_equal(x.grad, z.data)


# -------------------------------------- the memory recorder and dropped graphs
def test_the_memory_recorder_lets_a_forward_dropped_without_backward_go():
    w = leaf(np.ones((50, 50)))
    with engine.memory.record() as mem:
        e = F.exp(w)                          # exp keeps its output for the backward
        kept = weakref.ref(e.data)
        loss = (e * 2.0).sum()
        assert mem.live_bytes == 50 * 50 * 8
        del e, loss                           # dropped: no backward will ever run
        gc.collect()
        assert kept() is None                 # the recorder did not keep the buffer alive
        assert mem.live_bytes == 0
    assert mem.timeline[-1].phase == "dropped" and mem.timeline[-1].live_bytes == 0
    assert mem.saved_bytes == mem.peak_bytes == 50 * 50 * 8   # what was saved stays reported


def test_the_memory_recorder_keeps_no_parameter_alive():
    w = leaf(np.ones((8, 8)))
    param = weakref.ref(w.data)
    with engine.memory.record() as mem:
        (Tensor(np.ones((2, 8))) @ w).sum().backward()
    del w
    gc.collect()
    assert param() is None and mem.live_bytes == 0


def test_a_graph_kept_by_retain_graph_is_released_when_dropped():
    w = leaf(np.ones((4, 4)))
    with engine.memory.record() as mem:
        loss = F.tanh(Tensor(np.ones((8, 4))) @ w).sum()
        loss.backward(retain_graph=True)
        assert mem.live_bytes == (8 * 4 + 8 * 4) * 8     # still kept for a second backward
        del loss
        gc.collect()
        assert mem.live_bytes == 0
    assert [p.phase for p in mem.timeline[-2:]] == ["dropped", "dropped"]
