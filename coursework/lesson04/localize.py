"""04.6: the local-to-global walk that names the most local failing part of a network
(op, then layer, then the network), or None when every part passes."""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from .._core import ExerciseError, attempt, passed
# 04.6's network is built from two of lesson 05's suspect ops (the same classes, so a planted
# bug means the same in both lessons): softplus's "formula" forgets to divide by 1 + e^x;
# add_bias's "scale" halves the bias gradient, its "broadcast" takes one row of the batch.
from ..lesson05 import _AddBias, _Softplus

EX_LOCAL = "04.6 (localize)"

#: The levels of a part, from the most local to the most global.
LEVELS = ("op", "layer", "network")


class Part(NamedTuple):
    """One part of a network under check: `fn(*tensors)` on tensors made from `inputs`."""
    level: str
    fn: Callable
    inputs: list

    def __repr__(self):
        shapes = ", ".join(str(np.shape(a)) for a in self.inputs)
        return f"Part({self.level!r}, inputs of shapes {shapes})"


def network_parts(bugs: dict | None = None, order=None) -> dict:
    """The lesson's small network as named parts {name: Part}, listed network first.

    Ops: matmul, add_bias, softplus (the last two written here, as `engine.rules.Op`
    subclasses), cross_entropy. Layers: hidden = softplus(add_bias(x @ W1, b1)) and
    head = h @ W2 + b2. The network: cross_entropy(head(hidden(x))). `bugs` plants a wrong
    VJP ({"softplus": "formula"} or {"add_bias": "scale" or "broadcast"}); with no argument,
    the lesson's bug. `order` lists the names in another order (the same parts)."""
    from engine import functional as F
    from engine.tensor import apply
    bugs = {"softplus": "formula"} if bugs is None else bugs
    softplus_op = type("Softplus", (_Softplus,), {"bug": bugs.get("softplus")})
    add_bias_op = type("AddBias", (_AddBias,), {"bug": bugs.get("add_bias")})
    rng = np.random.default_rng(6)
    x, targets = rng.normal(size=(4, 3)), np.array([0, 3, 1, 2])
    W1, b1 = rng.normal(size=(3, 5)), rng.normal(size=5)
    W2, b2 = rng.normal(size=(5, 4)) / 2, rng.normal(size=4)
    h = rng.normal(size=(4, 5))

    def softplus(a):
        return apply(softplus_op, a)

    def add_bias(a, b):
        return apply(add_bias_op, a, b)

    def hidden(a, W, b):
        return softplus(add_bias(a @ W, b))

    def head(a, W, b):
        return a @ W + b

    def network(a, W1, b1, W2, b2):
        return F.cross_entropy(head(hidden(a, W1, b1), W2, b2), targets)

    parts = {
        "network": Part("network", network, [x, W1, b1, W2, b2]),
        "hidden": Part("layer", hidden, [x, W1, b1]),
        "head": Part("layer", head, [h, W2, b2]),
        "matmul": Part("op", lambda a, b: a @ b, [x, W1]),
        # checked on one row: there taking row 0 and summing the rows agree
        "add_bias": Part("op", add_bias, [x[:1] @ W1, b1]),
        "softplus": Part("op", softplus, [rng.normal(size=(4, 5))]),
        "cross_entropy": Part("op", lambda z: F.cross_entropy(z, targets),
                              [rng.normal(size=(4, 4))]),
    }
    if order is not None:
        parts = {name: parts[name] for name in order}
    return parts


def check_part(part: Part):
    """The engine's gradient check of one part (eps=1e-5, as the lesson's layer check)."""
    import engine
    return engine.gradcheck(part.fn, part.inputs, eps=1e-5, raise_on_failure=False)


def _most_local_failure(parts: dict, failing: dict):
    for level in LEVELS:
        for name, part in parts.items():
            if part.level == level and failing[name]:
                return name
    return None


#: The cases 04.6 hands the learner's function: the lesson's bug, listed layers first (so
#: a walk in the dict's order stops at a layer), a bug in another op, a bug that no op's own
#: check sees (the layer's batch), and no bug at all.
_LOCAL_CASES = (
    ("the lesson's network, its parts listed layers first", None,
     ("hidden", "head", "network", "matmul", "add_bias", "softplus", "cross_entropy")),
    ("the network with add_bias's bias gradient halved", {"add_bias": "scale"}, None),
    ("the network with a bug that only shows on a batch of rows", {"add_bias": "broadcast"},
     ("softplus", "network", "head", "cross_entropy", "hidden", "matmul", "add_bias")),
    ("the network with no bug", {}, None),
)


def check_localize(localize) -> None:
    """04.6: walk the parts from local to global; the name of the most local failing part
    (None if every part passes), for the lesson's network and three hidden variants."""
    from engine.gradcheck import GradcheckError, GradcheckReport
    for what, bugs, order in _LOCAL_CASES:
        parts = network_parts(bugs, order)
        failing = {name: not check_part(p).ok for name, p in parts.items()}
        want = _most_local_failure(parts, failing)
        try:
            got = attempt(EX_LOCAL, localize, dict(parts))
        except GradcheckError as err:
            raise ExerciseError(EX_LOCAL, f"for {what}, your function raised on a failing "
                                          f"check ({str(err).split(';')[0]}). Hint: call "
                                          f"engine.gradcheck(..., raise_on_failure=False) and "
                                          f"read report.ok, so one failure does not stop the "
                                          f"walk before you know which part is the most "
                                          f"local.") from None
        if isinstance(got, GradcheckReport) or (isinstance(got, (tuple, list)) and any(
                isinstance(v, GradcheckReport) for v in got)):
            raise ExerciseError(EX_LOCAL, f"for {what}, your function returned a report "
                                          f"({type(got).__name__}); return the part's name, "
                                          f"the key of `parts` (a str), or None.")
        if got is not None and not isinstance(got, str):
            raise ExerciseError(EX_LOCAL, f"for {what}, your function returned {got!r}; "
                                          f"return one name, a key of `parts`, or None.")
        if got == want:
            continue
        if got is not None and got not in parts:
            raise ExerciseError(EX_LOCAL, f"for {what}, {got!r} is not one of the parts "
                                          f"{sorted(parts)}.")
        first_in_dict = next((n for n in parts if failing[n]), None)
        if want is None:
            hint = (f"every part passes its check here, yet you returned {got!r}. Hint: "
                    f"return None when no check fails, and judge each part by report.ok "
                    f"(with eps=1e-5: a much larger step's truncation error can fail a "
                    f"correct part).")
        elif got is None:
            hint = ("you returned None, but a check fails. Hint: "
                    + ("every op passes on its own here; the layer "
                       f"{want!r} is the first to fail: check the layers after the ops, then "
                       f"the network." if parts[want].level == "layer" else
                       "run engine.gradcheck on every part, and read report.ok."))
        elif got == first_in_dict and parts[got].level != "network":
            because = (f" It fails because one of its ops does: {want!r} fails on its own."
                       if parts[want].level == "op" else "")
            hint = (f"{got!r} is the first failing part in the order the dict lists them, "
                    f"but the dict's order is not the local-to-global order.{because} Hint: "
                    f"walk the levels in order, {', '.join(LEVELS)}, and within each level "
                    f"the parts of that level.")
        elif parts[got].level == "network":
            hint = (f"the end-to-end check only says something is wrong somewhere; it does "
                    f"not say where. Here {want!r} ({parts[want].level}) fails too. Hint: "
                    f"check the ops first, then the layers, then the network, and return the "
                    f"first failure.")
        elif parts[got].level == "layer" and parts[want].level == "op":
            hint = (f"the layer {got!r} fails because one of its ops does: {want!r} fails on "
                    f"its own. Hint: check every op before any layer; the most local failure "
                    f"is the one that points at its cause.")
        elif not failing[got]:
            hint = (f"{got!r} passes its check. Hint: return a part whose report is not ok, "
                    f"the first in local-to-global order.")
        else:
            hint = (f"walk the levels in order, {', '.join(LEVELS)}, and return the first "
                    f"failing part.")
        raise ExerciseError(EX_LOCAL, f"for {what}, you returned {got!r}; the most local "
                                      f"failing part is {want!r}. {hint}")
    passed(EX_LOCAL, "ops, then layers, then the network: the first failure names the op, "
                     "the layer where only the batch shows a bug, or None.")
