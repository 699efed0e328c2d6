"""Each safety check is triggered and its message read: it must name the op,
the tensor or the shapes, and say what to do."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import F, Tensor


def leaf(values, name=None):
    return Tensor(np.asarray(values, dtype=np.float64), requires_grad=True, name=name)


# ------------------------------------------------------------ version counters
def test_in_place_change_of_a_saved_input_makes_backward_raise():
    w = leaf([1.0, 2.0], name="w")
    x = Tensor([3.0, 4.0], name="x")
    y = (w * x).sum()          # mul saved x for w's gradient
    x += 1.0                   # x needs no grad, so this is allowed ... and bumps its version
    with pytest.raises(RuntimeError) as err:
        y.backward()
    msg = str(err.value)
    assert msg.startswith("backward: mul (node #")
    assert "saved 'x'" in msg and "version 0 when saved, now 1" in msg
    assert "out-of-place" in msg


def test_in_place_change_of_a_saved_output_is_caught_too():
    w = leaf([0.1, 0.2])
    e = F.exp(w)               # exp saves its own output
    loss = e.sum()
    with engine.no_grad():
        e *= 2.0
    with pytest.raises(RuntimeError, match=r"exp .*saved its output.*modified in place"):
        loss.backward()


def test_an_optimizer_step_between_forward_and_backward_is_caught():
    """The classic mistake: updating the weights before the backward that needs them."""
    w = leaf(np.ones((3, 2)), name="layer.weight")
    x = leaf(np.ones((4, 3)), name="x")
    loss = (x @ w).sum()
    with engine.no_grad():
        w -= 0.1 * np.ones((3, 2))
    with pytest.raises(RuntimeError, match=r"matmul .*saved 'layer\.weight'.*version 0 when "
                                           r"saved, now 1"):
        loss.backward()


def test_a_view_shares_the_version_counter_of_its_base():
    w = leaf([1.0, 2.0, 3.0])
    x = Tensor([1.0, 2.0, 3.0], name="x")
    row = x[1:]
    loss = (w[1:] * row).sum()
    x[0] = 7.0                 # a write to the base: the view's memory block changed
    with pytest.raises(RuntimeError, match="modified in place"):
        loss.backward()


def test_in_place_on_a_tensor_that_requires_grad_is_refused_outside_no_grad():
    w = leaf([1.0, 2.0], name="w")
    with pytest.raises(RuntimeError, match=r"in-place \+= .*\('w'\).*x = x \+ y.*no_grad"):
        w += 1.0
    with engine.no_grad():
        w += 1.0
    np.testing.assert_array_equal(w.data, [2.0, 3.0])
    assert w.version == 1


# ------------------------------------------------------------- detect_anomaly
def test_detect_anomaly_names_the_first_op_that_made_a_nan_in_the_forward():
    x = leaf([1.0, -1.0, 2.0])
    with engine.detect_anomaly(), np.errstate(invalid="ignore"):
        h = x * 2.0
        with pytest.raises(engine.AnomalyError) as err:
            F.log(h)           # log of -2: NaN, made by this op
    e = err.value
    assert e.op == "log" and e.phase == "forward"
    assert "log" in str(e) and "NaN" in str(e) and "this op made it" in str(e)
    assert "test_engine_safety.py" in str(e)  # where in *our* code it was called


def test_detect_anomaly_says_when_the_nan_came_from_upstream():
    x = Tensor([1.0, np.nan], requires_grad=True, name="data")
    with engine.detect_anomaly():
        with pytest.raises(engine.AnomalyError, match=r"data already contained NaN.*upstream"):
            F.exp(x)


def test_detect_anomaly_names_the_op_whose_gradient_is_not_finite():
    x = leaf([0.0, 1.0])
    with engine.detect_anomaly(), np.errstate(divide="ignore"):
        y = (x ** 0.5).sum()   # finite forward (sqrt(0) = 0) but d/dx = inf at 0
        with pytest.raises(engine.AnomalyError) as err:
            y.backward()
    assert err.value.op == "pow" and err.value.phase == "backward"
    assert "Inf" in str(err.value) and "input 0" in str(err.value)


def test_without_detect_anomaly_the_nan_just_flows():
    x = leaf([-1.0])
    with np.errstate(invalid="ignore"):
        y = F.log(x).sum()
    assert np.isnan(y.item())


# ----------------------------------------------------------- shape mismatches
@pytest.mark.parametrize("make, pattern", [
    (lambda: leaf(np.ones((2, 3))) + leaf(np.ones(4)),
     r"add: shapes \(2, 3\) and \(4,\) do not broadcast"),
    (lambda: leaf(np.ones((2, 3))) * leaf(np.ones((4, 1, 2))),
     r"mul: shapes \(2, 3\) and \(4, 1, 2\) do not broadcast"),
    (lambda: leaf(np.ones((2, 3))) @ leaf(np.ones((4, 5))),
     r"matmul: shapes \(2, 3\) and \(4, 5\) do not fit.*\(3\).*\(4\).*transpose"),
    (lambda: F.layer_norm(leaf(np.ones((2, 8))), leaf(np.ones(4)), leaf(np.zeros(8))),
     r"layer_norm: weight has shape \(4,\) but x has shape \(2, 8\).*\(8,\)"),
    (lambda: F.cross_entropy(leaf(np.ones((6, 5))), np.zeros(5, dtype=int)),
     r"cross_entropy: logits of shape \(6, 5\) need targets of shape \(6,\).*got \(5,\)"),
    (lambda: F.causal_attention(leaf(np.ones((2, 4, 8))), leaf(np.ones((2, 4, 8))),
                                leaf(np.ones((2, 5, 8)))),
     r"causal_attention: .*same shape.*q \(2, 4, 8\).*v \(2, 5, 8\)"),
    (lambda: leaf(np.ones((2, 3))).reshape(4, 2),
     r"reshape: cannot reshape \(2, 3\) \(6 elements\) into \(4, 2\)"),
    (lambda: F.embedding(np.array([0, 1]), leaf(np.ones(5))),
     r"embedding: the table must be 2-D"),
])
def test_shape_errors_name_the_op_and_both_shapes(make, pattern):
    with pytest.raises(engine.ShapeError, match=pattern):
        make()


# --------------------------------------------------------- ids and targets
def test_float_targets_get_a_message_about_integers():
    with pytest.raises(TypeError, match=r"cross_entropy: targets must be integers.*float64"
                                        r".*astype\(np.int64\).*one-hot"):
        F.cross_entropy(leaf(np.ones((3, 4))), np.array([0.0, 1.0, 2.0]))


def test_float_ids_get_a_message_about_integers():
    with pytest.raises(TypeError, match=r"embedding: ids must be integers.*float32"):
        F.embedding(np.array([0.0, 1.0], dtype=np.float32), leaf(np.ones((4, 2))))


def test_out_of_range_ids_and_targets_name_the_value_and_the_range():
    with pytest.raises(IndexError, match=r"embedding: ids contain 4, outside .*0\.\.3"):
        F.embedding(np.array([0, 4]), leaf(np.ones((4, 2))))
    with pytest.raises(IndexError, match=r"cross_entropy: targets contain -1"):
        F.cross_entropy(leaf(np.ones((2, 3))), np.array([0, -1]))


def test_bool_targets_are_not_taken_for_integers():
    with pytest.raises(TypeError, match="targets must be integers"):
        F.cross_entropy(leaf(np.ones((2, 3))), np.array([True, False]))


def test_ids_are_copied_so_changing_them_later_cannot_change_the_gradient():
    table = leaf(np.ones((4, 2)))
    ids = np.array([0, 1, 1])
    out = F.embedding(ids, table)
    ids[:] = 3
    out.sum().backward()
    np.testing.assert_array_equal(table.grad[:, 0], [1.0, 2.0, 0.0, 0.0])


def test_dropout_arguments_are_checked():
    x = leaf(np.ones(3))
    with pytest.raises(ValueError, match=r"dropout: p=1.0 must be in \[0, 1\)"):
        F.dropout(x, 1.0, seed=0)
    with pytest.raises(TypeError, match="dropout: seed must be an integer"):
        F.dropout(x, 0.5, seed=None)
