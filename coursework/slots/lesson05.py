"""Lesson 05's slot: the gradient checker's spot check."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from engine.gradcheck import relative_error

from .core import SlotError


class Spot(NamedTuple):
    """One checked element: what the backward said, what central differences say."""
    index: tuple
    analytic: float
    numeric: float
    rel_err: float
    abs_err: float
    ok: bool


def engine_spot_check(f, x, analytic_grad, n_checks=6, eps=1e-6, rtol=1e-6, atol=1e-8, seed=0):
    """The engine's spot check, with the calling convention of exercise 04.3: central
    differences of the scalar f(x) at n_checks seeded random elements of the array x
    (x itself is left unchanged), each compared with analytic_grad there."""
    rng = np.random.default_rng(seed)
    rows = []
    for flat in rng.choice(x.size, size=min(n_checks, x.size), replace=False):
        index = tuple(int(i) for i in np.unravel_index(flat, x.shape))
        shifted = x.copy()
        shifted[index] = x[index] + eps
        plus = float(f(shifted))
        shifted[index] = x[index] - eps
        minus = float(f(shifted))
        numeric = (plus - minus) / (2 * eps)
        a = float(analytic_grad[index])
        ab, rel = abs(a - numeric), float(relative_error(a, numeric))
        rows.append(Spot(index, a, numeric, rel, ab, ab <= atol or rel <= rtol))
    return rows


def _check_spot_check(fn):
    # Where later lessons run it: on an array the loss reads, once with the right gradient
    # (every row passes) and once with a gradient wrong in one element (that row fails).
    rng = np.random.default_rng(304)
    x = rng.normal(size=(3, 4))
    c = rng.normal(size=(3, 4))
    f = lambda a: float(np.sum(np.tanh(a * c)))
    right = c * (1 - np.tanh(x * c) ** 2)
    before = x.copy()
    rows = list(fn(f, x, right.copy(), n_checks=x.size, eps=1e-6, rtol=1e-6, atol=1e-8, seed=0))
    if not np.allclose(x, before, rtol=0, atol=1e-12):
        raise SlotError("left the checked array changed: put each nudged element back")
    if len(rows) != x.size or not all(bool(r.ok) for r in rows):
        raise SlotError("did not pass a right gradient on every element of a (3, 4) array")
    wrong = right.copy()
    wrong[1, 2] *= 1.5
    rows = list(fn(f, x, wrong, n_checks=x.size, eps=1e-6, rtol=1e-6, atol=1e-8, seed=0))
    bad = [tuple(int(i) for i in r.index) for r in rows if not bool(r.ok)]
    if bad != [(1, 2)]:
        raise SlotError(f"with one element of the gradient wrong, at (1, 2), it flagged "
                        f"{bad or 'nothing'}")


CONTRACTS = {"spot_check": _check_spot_check}
