"""Checks for lesson 01, two layers by hand.

The network of the lesson, one input and two layers with a squared loss:

    z1 = w1 * x          a1 = relu(z1)          z2 = w2 * a1          L = (z2 - y)^2

At x=2, w1=0.5, w2=3, y=1 the forward values are z1=1, a1=1, z2=3, L=4 and the
backward values dL/dz2=4, dL/dw2=4, dL/da1=12, dL/dz1=12, dL/dw1=24.

Every check runs the learner's function at that point and at two more points
chosen so that each typical mistake shows: at the lesson's point a1 = 1, so a
forgotten factor a1 would go unseen there; at the second point the ReLU is
off, so a ReLU that lets the gradient through shows.
"""
from __future__ import annotations

import math

from ._core import ExerciseError, attempt, passed

EX_FORWARD = "01.1 (forward pass)"
EX_LAYER2 = "01.2 (loss and layer 2 backward)"
EX_LAYER1 = "01.3 (layer 1 backward)"
EX_CACHE = "01.4 (what backward reads)"

# (x, w1, w2, y): the lesson's point, a point where the ReLU is off, and a
# point where no forward value equals 1.
POINTS = [(2.0, 0.5, 3.0, 1.0), (2.0, -0.5, 3.0, 1.0), (3.0, 0.5, 2.0, 0.5)]
FORWARD_NAMES = ("x", "w1", "w2", "y", "z1", "a1", "z2", "L")
GRADIENT_NAMES = ("dL_dz2", "dL_dw2", "dL_da1", "dL_dz1", "dL_dw1")


def reference_forward(x, w1, w2, y):
    """Every forward value of the network, by name."""
    z1 = w1 * x
    a1 = max(z1, 0.0)
    z2 = w2 * a1
    L = (z2 - y) ** 2
    return {"x": x, "w1": w1, "w2": w2, "y": y, "z1": z1, "a1": a1, "z2": z2, "L": L}


def reference_backward(v):
    """Every gradient of the network, from the forward values `v`."""
    dL_dz2 = 2.0 * (v["z2"] - v["y"])
    dL_dw2 = dL_dz2 * v["a1"]
    dL_da1 = dL_dz2 * v["w2"]
    dL_dz1 = dL_da1 * (1.0 if v["z1"] > 0 else 0.0)
    dL_dw1 = dL_dz1 * v["x"]
    return {"dL_dz2": dL_dz2, "dL_dw2": dL_dw2, "dL_da1": dL_da1,
            "dL_dz1": dL_dz1, "dL_dw1": dL_dw1}


def _number(exercise: str, what: str, value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ExerciseError(exercise, f"{what} should be a number, but it is {value!r} "
                                      f"(type {type(value).__name__}).") from None


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _point(p) -> str:
    x, w1, w2, y = p
    return f"x={x:g}, w1={w1:g}, w2={w2:g}, y={y:g}"


def _context(p) -> dict:
    """Every forward value and gradient at the point p, by name, and the point itself."""
    v = reference_forward(*p)
    return {**v, **reference_backward(v), "point": p}


def _judge(exercise, what, got, want, wrongs) -> None:
    """Compare the learner's values with the right ones at every test point.

    got:    [(ctx, value)] one per point;
    want:   ctx -> the right value;
    wrongs: [(ctx -> value of a typical mistake, its hint)].
    A mistake that reproduces the learner's value at *every* point gets its hint
    (one point alone can be ambiguous: at the lesson's point a1 = 1, so a missing
    factor a1 is invisible there); failing that, one that matches at the first
    point that is wrong.
    """
    bad = [(c, val) for c, val in got if not _same(val, want(c))]
    if not bad:
        return
    ctx, value = bad[0]
    # (+ 0.0 turns a negative zero into 0 for printing)
    where = (f"at {_point(ctx['point'])} your {what} is {value + 0.0:g}, expected "
             f"{want(ctx) + 0.0:g}.")
    for matches_all in (True, False):
        for mistake, hint in wrongs:
            pool = got if matches_all else bad[:1]
            if all(_same(val, mistake(c)) for c, val in pool):
                raise ExerciseError(exercise, f"{where} Hint: {hint}")
    raise ExerciseError(exercise, f"{where} Hint: redo this step with the numbers of that "
                                  f"point, one operation at a time.")


def _pair(exercise, fn_name, out, names):
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ExerciseError(exercise, f"{fn_name} should return the pair ({names}), but it "
                                      f"returned {out!r}.")
    return out


# ---------------------------------------------------------------- 01.1
def check_forward(forward) -> None:
    """`forward(x, w1, w2, y)` returns `(L, cache)`, the cache holding every forward value."""
    ex = EX_FORWARD
    results = []
    for p in POINTS:
        out = attempt(ex, forward, *p)
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
            raise ExerciseError(ex, f"forward should return the pair (L, cache) with cache a "
                                    f"dict, but it returned {out!r}.")
        L, cache = out
        missing = [k for k in FORWARD_NAMES if k not in cache]
        if missing:
            raise ExerciseError(ex, f"the cache has no {', '.join(missing)}. Keep the return "
                                    f"line of the exercise as it is.")
        results.append((_context(p), L, cache))

    def values(name):
        return [(c, _number(ex, f"cache[{name!r}]", cache[name])) for c, _, cache in results]

    for name in ("x", "w1", "w2", "y"):
        _judge(ex, name, values(name), lambda c, n=name: c[n], [])
    _judge(ex, "z1", values("z1"), lambda c: c["z1"], [
        (lambda c: c["w1"] + c["x"], "layer 1 multiplies: z1 = w1 * x.")])
    _judge(ex, "a1", values("a1"), lambda c: c["a1"], [
        (lambda c: c["z1"], "a1 = relu(z1) = max(z1, 0): a negative z1 becomes 0."),
        (lambda c: abs(c["z1"]), "relu(z1) is max(z1, 0), not the absolute value.")])
    _judge(ex, "z2", values("z2"), lambda c: c["z2"], [
        (lambda c: c["w2"] * c["z1"], "layer 2 multiplies w2 by a1 (after the ReLU), not by z1.")])
    _judge(ex, "L", values("L"), lambda c: c["L"], [
        (lambda c: c["z2"] - c["y"], "the loss squares the error: L = (z2 - y)^2."),
        (lambda c: 0.5 * c["L"], "this lesson's loss has no 1/2 in front: L = (z2 - y)^2."),
        (lambda c: (c["w2"] * c["z1"] - c["y"]) ** 2,
         "the loss should use z2 = w2 * relu(z1).")])
    returned = [(c, _number(ex, "L", L)) for c, L, _ in results]
    _judge(ex, "returned L", returned, lambda c: c["L"], [
        (lambda c: c["z2"], "return the loss as the first element of the pair, not z2.")])
    passed(ex, "z1=1, a1=1, z2=3, L=4.")


# ---------------------------------------------------------------- 01.2
def check_layer2_backward(loss_backward, layer2_backward) -> None:
    """`loss_backward(cache) -> dL_dz2`; `layer2_backward(dL_dz2, cache) -> (dL_dw2, dL_da1)`."""
    ex = EX_LAYER2
    contexts = [_context(p) for p in POINTS]
    cache = lambda c: {k: c[k] for k in FORWARD_NAMES}  # noqa: E731
    got = [(c, _number(ex, "loss_backward(cache)", attempt(ex, loss_backward, cache(c))))
           for c in contexts]
    _judge(ex, "dL/dz2", got, lambda c: c["dL_dz2"], [
        (lambda c: c["z2"] - c["y"],
         "the derivative of (z2 - y)^2 is 2 * (z2 - y): the factor 2 is missing."),
        (lambda c: -c["dL_dz2"],
         "the sign is flipped: it is 2 * (z2 - y), the prediction minus the target."),
        (lambda c: c["L"], "that is the loss itself; its derivative is 2 * (z2 - y)."),
        (lambda c: 2.0 * c["z2"], "the target y belongs in the derivative: 2 * (z2 - y).")])
    outs = []
    for c in contexts:
        out = _pair(ex, "layer2_backward", attempt(ex, layer2_backward, c["dL_dz2"], cache(c)),
                    "dL_dw2, dL_da1")
        outs.append((c, _number(ex, "dL_dw2", out[0]), _number(ex, "dL_da1", out[1])))
    if all(_same(dw2, c["dL_da1"]) and _same(da1, c["dL_dw2"]) for c, dw2, da1 in outs):
        raise ExerciseError(ex, "dL_dw2 and dL_da1 are swapped. Hint: the gradient for w2 "
                                "needs the other factor, a1; the gradient for a1 needs w2.")
    _judge(ex, "dL_dw2", [(c, dw2) for c, dw2, _ in outs], lambda c: c["dL_dw2"], [
        (lambda c: c["dL_dz2"], "z2 = w2 * a1, so dL/dw2 = dL/dz2 * a1: the factor a1 is missing."),
        (lambda c: c["a1"], "multiply by the upstream gradient: dL/dw2 = dL/dz2 * a1."),
        (lambda c: c["dL_dz2"] * c["w2"], "dz2/dw2 is a1 (the other factor), not w2.")])
    _judge(ex, "dL_da1", [(c, da1) for c, _, da1 in outs], lambda c: c["dL_da1"], [
        (lambda c: c["dL_dz2"], "z2 = w2 * a1, so dL/da1 = dL/dz2 * w2: the factor w2 is missing."),
        (lambda c: c["w2"], "multiply by the upstream gradient: dL/da1 = dL/dz2 * w2."),
        (lambda c: c["dL_dz2"] * c["a1"], "dz2/da1 is w2 (the other factor), not a1.")])
    passed(ex, "dL/dz2=4, dL/dw2=4, dL/da1=12.")


# ---------------------------------------------------------------- 01.3
def check_layer1_backward(layer1_backward) -> None:
    """`layer1_backward(dL_da1, cache) -> (dL_dw1, dL_dz1)`."""
    ex = EX_LAYER1
    outs = []
    for p in POINTS:
        c = _context(p)
        out = _pair(ex, "layer1_backward",
                    attempt(ex, layer1_backward, c["dL_da1"], {k: c[k] for k in FORWARD_NAMES}),
                    "dL_dw1, dL_dz1")
        outs.append((c, _number(ex, "dL_dw1", out[0]), _number(ex, "dL_dz1", out[1])))
    _judge(ex, "dL_dz1", [(c, dz1) for c, _, dz1 in outs], lambda c: c["dL_dz1"], [
        (lambda c: c["dL_da1"], "z1 is not positive here, so the ReLU was off in the forward "
                                "pass and passes no gradient back: "
                                "dL/dz1 = dL/da1 * (1 if z1 > 0 else 0)."),
        (lambda c: 0.0, "where z1 > 0 the ReLU passes the gradient unchanged: "
                        "dL/dz1 = dL/da1."),
        (lambda c: c["dL_da1"] * c["z1"], "relu'(z1) is 1 or 0 (a gate), not z1 itself."),
        (lambda c: c["dL_da1"] * c["x"], "that is dL/dw1 when the ReLU is on; dL/dz1 is "
                                         "dL/da1 times relu'(z1).")])
    _judge(ex, "dL_dw1", [(c, dw1) for c, dw1, _ in outs], lambda c: c["dL_dw1"], [
        (lambda c: c["dL_dz1"], "z1 = w1 * x, so dL/dw1 = dL/dz1 * x: the factor x is missing."),
        (lambda c: c["dL_da1"] * c["x"], "the ReLU was off at this point (z1 <= 0), so its "
                                         "gate is 0 and dL/dw1 is 0: go through dL/dz1, not "
                                         "straight from dL/da1."),
        (lambda c: c["dL_dz1"] * c["w1"], "dz1/dw1 is x (the other factor), not w1."),
        (lambda c: c["x"], "multiply by the upstream gradient: dL/dw1 = dL/dz1 * x.")])
    passed(ex, "dL/dz1=12, dL/dw1=24.")


# ---------------------------------------------------------------- 01.4
READS = {"dL_dz2": {"z2", "y"}, "dL_dw2": {"a1"}, "dL_da1": {"w2"},
         "dL_dz1": {"z1"}, "dL_dw1": {"x"}}
WHY = {"dL_dz2": "dL/dz2 = 2 * (z2 - y) needs the prediction z2 and the target y",
       "dL_dw2": "dL/dw2 = dL/dz2 * a1 needs a1",
       "dL_da1": "dL/da1 = dL/dz2 * w2 needs w2",
       "dL_dz1": "dL/dz1 = dL/da1 * relu'(z1) needs the sign of z1 (a1 > 0 tells the same)",
       "dL_dw1": "dL/dw1 = dL/dz1 * x needs x"}


def check_saved_for_backward(saved_for_backward) -> None:
    """`saved_for_backward()` maps each gradient's name to the forward values it reads."""
    got = attempt(EX_CACHE, saved_for_backward)
    if not isinstance(got, dict):
        raise ExerciseError(EX_CACHE, f"saved_for_backward() should return a dict from "
                                      f"gradient names to sets of names, got {got!r}.")
    missing = [k for k in GRADIENT_NAMES if k not in got]
    if missing:
        raise ExerciseError(EX_CACHE, f"the dict has no entry for {', '.join(missing)}; "
                                      f"give one for each of {', '.join(GRADIENT_NAMES)}.")
    for name in GRADIENT_NAMES:
        entry = got[name]
        names = {entry} if isinstance(entry, str) else set(entry)
        unknown = names - set(FORWARD_NAMES)
        if unknown:
            raise ExerciseError(EX_CACHE, f"{name}: {sorted(unknown)} is not a forward "
                                          f"value; use names from {', '.join(FORWARD_NAMES)}.")
        want = READS[name]
        ok = names == want or (name == "dL_dz1" and names in ({"a1"}, {"z1", "a1"}))
        if ok:
            continue
        if "w1" in names:
            raise ExerciseError(EX_CACHE, f"{name}: you listed w1, but no local gradient "
                                          f"reads w1 (dL/dw1 needs x, not w1). Hint: {WHY[name]}.")
        if "L" in names:
            raise ExerciseError(EX_CACHE, f"{name}: you listed L, but backward starts from "
                                          f"dL/dL = 1 and never reads the loss value. "
                                          f"Hint: {WHY[name]}.")
        lacking = sorted(want - names)
        extra = sorted(names - want)
        detail = (f"it also reads {', '.join(lacking)}" if lacking
                  else f"it does not read {', '.join(extra)}")
        raise ExerciseError(EX_CACHE, f"{name}: you said {sorted(names)}, but {detail}. "
                                      f"Hint: {WHY[name]}.")
    passed(EX_CACHE, "backward reads x, z1 (its sign), a1, w2, z2 and y; never w1 or L.")


# ------------------------------------------------------------------ the notebook
#: Each exercise function of the lesson, and its exercise.
EXERCISE_FUNCTIONS = {"forward": EX_FORWARD, "loss_backward": EX_LAYER2, "layer2_backward":
                      EX_LAYER2, "layer1_backward": EX_LAYER1, "saved_for_backward": EX_CACHE}


def name_unfinished_exercises() -> None:
    """In the notebook, a cell that needs an unfinished exercise of this lesson says which."""
    from . import _core
    _core.name_unfinished_exercises(EXERCISE_FUNCTIONS)
