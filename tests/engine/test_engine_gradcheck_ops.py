"""Every op passes gradcheck in float64 on hypothesis-drawn shapes.

Shapes include broadcasting, size-1 axes and (for reductions) empty axis
lists. The bar: every checked element has relative error below 1e-6, with
the relative error floored at 1e-3 for gradients near zero (so an exact 0
against a numerical 1e-11 is not counted as a relative error of 1), and the
hot ops pass with both the numpy and the numba kernels.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine
from engine import kernels

import engine_op_cases as cases

SETTINGS = settings(max_examples=10, deadline=None, derandomize=True)
RTOL, FLOOR = 1e-6, 1e-3


def check(case: cases.OpCase):
    report = engine.gradcheck(case.fn, case.inputs, eps=1e-6, rtol=RTOL, atol=0.0,
                              floor=FLOOR, raise_on_failure=False)
    assert report.ok and report.max_rel_error < RTOL, f"{case.name}: {report}"
    return report


size = st.integers(1, 4)
seeds = st.integers(0, 2**31 - 1)


@st.composite
def broadcast_shapes(draw):
    """A shape and a second one that broadcasts against it (a suffix, some axes 1)."""
    full = draw(st.lists(size, min_size=0, max_size=3))
    keep = draw(st.integers(0, len(full)))
    other = [1 if draw(st.booleans()) else n for n in full[len(full) - keep:]]
    a, b = tuple(full), tuple(other)
    return (b, a) if draw(st.booleans()) else (a, b)


@SETTINGS
@given(shapes=broadcast_shapes(), op=st.sampled_from(["add", "sub", "mul", "div"]), seed=seeds)
def test_broadcasting_arithmetic(shapes, op, seed):
    check(cases.binary(np.random.default_rng(seed), op, *shapes))


@SETTINGS
@given(shape=st.lists(size, min_size=0, max_size=3).map(tuple),
       op=st.sampled_from(["neg", "exp", "log", "tanh", "relu", "gelu"]), seed=seeds)
def test_elementwise(shape, op, seed):
    check(cases.unary(np.random.default_rng(seed), op, shape))


@SETTINGS
@given(shape=st.lists(size, min_size=1, max_size=3).map(tuple),
       p=st.sampled_from([2, 3, 0.5, -1.5, 1]), seed=seeds)
def test_pow(shape, p, seed):
    check(cases.unary(np.random.default_rng(seed), "pow", shape, p=p))


@st.composite
def shape_and_axis(draw, allow_none=True, allow_tuple=True):
    shape = tuple(draw(st.lists(size, min_size=1, max_size=3)))
    choices = [st.integers(-len(shape), len(shape) - 1)]
    if allow_none:
        choices.append(st.none())
    if allow_tuple:
        choices.append(st.lists(st.integers(0, len(shape) - 1), unique=True,
                                max_size=len(shape)).map(tuple))  # () = no axis reduced
    return shape, draw(st.one_of(*choices))


@SETTINGS
@given(sa=shape_and_axis(), op=st.sampled_from(["sum", "mean"]), keepdims=st.booleans(),
       seed=seeds)
def test_reductions(sa, op, keepdims, seed):
    shape, axis = sa
    check(cases.reduction(np.random.default_rng(seed), op, shape, axis, keepdims))


def test_sum_over_an_empty_axis_gives_zeros_and_an_empty_gradient():
    x = engine.Tensor(np.zeros((0, 3)), requires_grad=True)
    y = x.sum(axis=0)
    assert y.shape == (3,) and np.all(y.data == 0)
    y.sum().backward()
    assert x.grad.shape == (0, 3)


def test_mean_over_an_empty_axis_is_refused_with_a_reason():
    x = engine.Tensor(np.zeros((0, 3)), requires_grad=True)
    with pytest.raises(engine.ShapeError, match="no elements.*use sum"):
        x.mean(axis=0)


@st.composite
def matmul_shapes(draw):
    n, k, m = draw(size), draw(size), draw(size)
    kind = draw(st.sampled_from(["2d", "batched", "broadcast", "vec-mat", "mat-vec", "vec-vec",
                                 "batched-vec", "stack-weights"]))
    b1, b2 = draw(size), draw(size)
    return {"2d": ((n, k), (k, m)), "batched": ((b1, n, k), (b1, k, m)),
            "broadcast": ((b1, 1, n, k), (b2, k, m)), "vec-mat": ((k,), (k, m)),
            "mat-vec": ((b1, n, k), (k,)), "vec-vec": ((k,), (k,)),
            "batched-vec": ((k,), (b1, k, m)), "stack-weights": ((b1, n, k), (k, m))}[kind]


@SETTINGS
@given(shapes=matmul_shapes(), seed=seeds)
def test_matmul(shapes, seed):
    check(cases.matmul(np.random.default_rng(seed), *shapes))


@SETTINGS
@given(shape_axis=shape_and_axis(allow_none=False, allow_tuple=False),
       op=st.sampled_from(["softmax", "log_softmax"]),
       mode=st.sampled_from(["numpy", "numba"]), seed=seeds)
def test_softmax_family(shape_axis, op, mode, seed):
    shape, axis = shape_axis
    with kernels.use(mode):
        check(cases.softmax_like(np.random.default_rng(seed), op, shape, axis))


@SETTINGS
@given(lead=st.lists(size, min_size=1, max_size=2), V=st.integers(1, 6),
       mode=st.sampled_from(["numpy", "numba"]), seed=seeds)
def test_cross_entropy(lead, V, mode, seed):
    with kernels.use(mode):
        check(cases.cross_entropy(np.random.default_rng(seed), lead, V))


@SETTINGS
@given(shape=st.lists(size, min_size=1, max_size=3).map(tuple), affine=st.booleans(),
       mode=st.sampled_from(["numpy", "numba"]), seed=seeds)
def test_layer_norm(shape, affine, mode, seed):
    shape = shape[:-1] + (shape[-1] + 1,)  # at least 2 features: a 1-feature row is constant
    with kernels.use(mode):
        check(cases.layer_norm(np.random.default_rng(seed), shape, affine))


@SETTINGS
@given(ids_shape=st.lists(size, min_size=1, max_size=2).map(tuple), V=st.integers(1, 5),
       C=size, mode=st.sampled_from(["numpy", "numba"]), seed=seeds)
def test_embedding(ids_shape, V, C, mode, seed):
    with kernels.use(mode):
        check(cases.embedding(np.random.default_rng(seed), ids_shape, V, C))


@SETTINGS
@given(lead=st.lists(size, min_size=0, max_size=2), T=st.integers(1, 5), D=size,
       mode=st.sampled_from(["numpy", "numba"]), seed=seeds)
def test_causal_attention(lead, T, D, mode, seed):
    with kernels.use(mode):
        check(cases.attention(np.random.default_rng(seed), tuple(lead) + (T, D)))


@SETTINGS
@given(shape=st.lists(size, min_size=1, max_size=3).map(tuple),
       p=st.sampled_from([0.1, 0.5, 0.9]), seed=seeds)
def test_dropout(shape, p, seed):
    check(cases.dropout(np.random.default_rng(seed), shape, p, seed=seed))


INDICES = [np.s_[1:3], np.s_[::-1], np.s_[..., 0], np.s_[0, 1:], np.s_[None, :, 1],
           np.s_[[0, 2, 0]], np.s_[:, [1, 1, 0]], (np.array([0, 1, 0]), np.array([1, 1, 1]))]


@pytest.mark.parametrize("index", INDICES, ids=[repr(i) for i in range(len(INDICES))])
def test_indexing(index):
    check(cases.indexing(np.random.default_rng(0), (3, 4), index))


def test_boolean_mask_indexing():
    rng = np.random.default_rng(1)
    mask = rng.random((3, 4)) > 0.4
    check(cases.indexing(rng, (3, 4), mask))


@SETTINGS
@given(shape=st.lists(size, min_size=1, max_size=4).map(tuple), seed=seeds, data=st.data())
def test_reshape_and_transpose(shape, seed, data):
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    rng = np.random.default_rng(seed)
    check(cases.OpCase("reshape", lambda t: t.reshape(-1, 1) * 2.0,
                       [rng.standard_normal(shape)]))
    check(cases.OpCase("permute", lambda t: t.permute(perm), [rng.standard_normal(shape)]))
    check(cases.OpCase(".T", lambda t: t.T, [rng.standard_normal(shape)]))


def test_a_composed_expression_with_fan_out():
    """One input used by several ops: gradients from every path are summed."""
    rng = np.random.default_rng(3)
    check(cases.OpCase("fan-out", lambda x, w: ((x @ w).tanh() * x.sum(axis=1, keepdims=True)
                                                + (x * x).mean()).sum(),
                       [rng.standard_normal((3, 4)), rng.standard_normal((4, 4))]))
