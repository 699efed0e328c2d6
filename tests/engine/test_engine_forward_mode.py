"""engine.jvp: forward mode on the same ops, checked against reverse mode
(<u, J t> computed both ways) and against a central difference."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import F

import engine_op_cases as cases


def float_inputs(case):
    return [i for i, x in enumerate(case.inputs)
            if np.issubdtype(np.asarray(x).dtype, np.floating)]


def build():
    rng = np.random.default_rng(0)
    out = [cases.binary(rng, op, (2, 3), (3,)) for op in ("add", "sub", "mul", "div")]
    out += [cases.unary(rng, op, (2, 3)) for op in ("neg", "exp", "log", "tanh", "relu", "gelu")]
    out += [cases.unary(rng, "pow", (3,), p=3),
            cases.reduction(rng, "mean", (2, 3, 4), (0, 2), False),
            cases.reduction(rng, "sum", (2, 3), 1, True),
            cases.matmul(rng, (2, 3, 4), (4, 5)), cases.matmul(rng, (4,), (4, 2)),
            cases.softmax_like(rng, "softmax", (3, 5), 0),
            cases.softmax_like(rng, "log_softmax", (3, 5), -1),
            cases.cross_entropy(rng, (4,), 6), cases.layer_norm(rng, (3, 5)),
            cases.layer_norm(rng, (3, 5), affine=False), cases.embedding(rng, (2, 3), 4, 5),
            cases.attention(rng, (2, 4, 3)), cases.dropout(rng, (3, 4), 0.5, seed=1),
            cases.indexing(rng, (4, 3), np.s_[1:, [0, 0]])]
    out.append(cases.OpCase("reshape+T", lambda t: t.reshape(3, 2).T * 1.0,
                            [rng.standard_normal((2, 3))]))
    return out


CASES = build()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_jvp_agrees_with_vjp_and_a_central_difference(case):
    rng = np.random.default_rng(1)
    idx = float_inputs(case)
    tangents = [rng.standard_normal(np.shape(x)) if i in idx else None
                for i, x in enumerate(case.inputs)]
    out, tangent = engine.jvp(case.fn, case.inputs, tangents)
    assert tangent.shape == out.shape

    # reverse mode: u . (J t) must equal (J^T u) . t
    ts = [engine.Tensor(x, requires_grad=True) if i in idx else x
          for i, x in enumerate(case.inputs)]
    y = case.fn(*ts)
    u = rng.standard_normal(y.shape)
    y.backward(u)
    reverse = sum(float((ts[i].grad * tangents[i]).sum()) for i in idx)
    forward = float((u * tangent).sum())
    assert np.isclose(forward, reverse, rtol=1e-10, atol=1e-12), case.name

    # central difference along the tangent
    h = 1e-6
    def shifted(sign):
        xs = [x + sign * h * tangents[i] if i in idx else x for i, x in enumerate(case.inputs)]
        with engine.no_grad():
            return case.fn(*[engine.Tensor(x) if i in idx else x for i, x in enumerate(xs)]).data
    numeric = (shifted(1) - shifted(-1)) / (2 * h)
    np.testing.assert_allclose(tangent, numeric, rtol=1e-6, atol=1e-7)


def test_jvp_leaves_the_inputs_and_the_tape_alone():
    x = engine.Tensor(np.ones(3), requires_grad=True)
    out, t = engine.jvp(lambda a: F.exp(a) * 2.0, [x], [np.array([1.0, 0.0, 2.0])])
    np.testing.assert_allclose(t, 2 * np.e * np.array([1.0, 0.0, 2.0]))
    assert x._tangent is None and x.grad is None


def test_jvp_with_tuples_and_fixed_inputs():
    outs, tans = engine.jvp(lambda a, b: (a * b, a + b), [np.array(2.0), np.array(5.0)],
                            [np.array(1.0), None])
    assert outs == (10.0, 7.0) and tans == (5.0, 1.0)


def test_jvp_checks_its_arguments():
    with pytest.raises(ValueError, match="2 inputs but 1 tangents"):
        engine.jvp(lambda a, b: a + b, [np.ones(2), np.ones(2)], [np.ones(2)])
    with pytest.raises(ValueError, match=r"tangent 0 has shape \(3,\) but input 0 has "
                                         r"shape \(2,\)"):
        engine.jvp(lambda a: a, [np.ones(2)], [np.ones(3)])
