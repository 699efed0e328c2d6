"""Lesson 03's slots: rules of the tape's rule table."""
from __future__ import annotations

import numpy as np

from engine.rules import unbroadcast

from .core import SlotError


# piece name -> (exercise, the rule it replaces, the op whose VJP runs it)
TAPE_SLOTS = {
    "matmul_vjp": ("03.1", "the matmul VJP (2-D products)", "matmul"),
    "unbroadcast": ("03.2", "the sum back to an input's shape (add's VJP)", "add"),
}


def tape_rule(piece: str, fn, calls: dict):
    """The learner's piece as an override of the tape's rule (`engine.rules.override_vjp`):
    counted in `calls[piece]` each time it runs; ops it does not cover keep their own rule."""
    if piece == "matmul_vjp":
        def vjp(op, g):
            (sa, sb) = op.shapes
            if len(sa) != 2 or len(sb) != 2 or not all(op.needs):
                return op.vjp(g)                 # batched products, frozen operands
            calls[piece] = calls.get(piece, 0) + 1
            return tuple(fn(op.a, op.b, g))
        return vjp
    if piece == "unbroadcast":
        def vjp(op, g):
            calls[piece] = calls.get(piece, 0) + 1
            return tuple(fn(g, shape) if need else None for need, shape in zip(op.needs, op.shapes))
        return vjp
    raise KeyError(f"no tape rule for the piece {piece!r}")


def _check_matmul_vjp(fn):
    rng = np.random.default_rng(301)
    a, b, g = rng.normal(size=(3, 4)), rng.normal(size=(4, 5)), rng.normal(size=(3, 5))
    got = fn(a, b, g)
    if got is None or len(got) != 2:
        raise SlotError("return the pair (dL/da, dL/db)")
    if not (np.allclose(got[0], g @ b.T, rtol=1e-12) and np.allclose(got[1], a.T @ g,
                                                                      rtol=1e-12)):
        raise SlotError("on a (3, 4) @ (4, 5) product the gradients differ from the "
                        "tape's own matmul rule")


def _check_unbroadcast(fn):
    rng = np.random.default_rng(302)
    for grad_shape, shape in (((4, 3), (3,)), ((4, 3), (4, 1)), ((2, 4, 3), (4, 3)),
                              ((4, 3), (1, 3)), ((4, 3), (4, 3))):
        g = rng.normal(size=grad_shape)
        got = fn(g.copy(), shape)
        if got is None:
            raise SlotError("returned None instead of the summed gradient")
        if np.shape(got) != shape or not np.allclose(got, unbroadcast(g, shape), rtol=1e-12):
            raise SlotError(f"a gradient of shape {grad_shape} brought back to {shape} "
                            f"differs from the tape's own unbroadcast")


CONTRACTS = {"matmul_vjp": _check_matmul_vjp, "unbroadcast": _check_unbroadcast}
