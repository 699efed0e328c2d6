"""04.6: the local-to-global walk that names the most local failing part of a network
(op, then layer, then the network), or None when every part passes."""
from __future__ import annotations

import operator
from typing import Callable, NamedTuple

import numpy as np

from .._cases import Case, Slip, raise_first_difference
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


def _walk(levels):
    """A walk over the parts, level by level in `levels` and in the dict's order within a
    level, returning the first part whose check fails (None when none does)."""
    def walk(parts):
        for level in levels:
            for name, part in parts.items():
                if part.level == level and not check_part(part).ok:
                    return name
        return None
    return walk


#: The lesson's answer: ops, then layers, then the network.
localize_reference = _walk(LEVELS)

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

#: The planted bugs of the generated cases, each listed in a seeded random order: two ops
#: failing at once (the dict's order decides between them), the batch-only bug beside an
#: op's, and the three single bugs again.
_GENERATED_BUGS = ({"softplus": "formula", "add_bias": "scale"},
                   {"softplus": "formula", "add_bias": "broadcast"},
                   {"add_bias": "broadcast"}, {"add_bias": "scale"}, {"softplus": "formula"})


def _local_cases() -> list[Case]:
    """The lesson's 4 networks, then the generated ones (parts shuffled with seed 47)."""
    cases = [Case((network_parts(bugs, order),), what) for what, bugs, order in _LOCAL_CASES]
    rng = np.random.default_rng(47)
    names = list(network_parts())
    for k, bugs in enumerate(_GENERATED_BUGS):
        order = [names[i] for i in rng.permutation(len(names))]
        planted = " and ".join(f"{op} ({bug})" for op, bug in bugs.items())
        cases.append(Case((network_parts(bugs, order),),
                          f"generated network #{k + 1} (seed 47), bugs in {planted}, its "
                          f"parts in the order {', '.join(order)}"))
    return cases


#: The usual wrong walks. Skipping the layers goes first: where it is wrong (every op passes,
#: a layer fails), the walk from the network down gives the same answer, and a learner who
#: walked from the network down is also wrong where an op fails.
LOCAL_SLIPS = [
    Slip(_walk(("op", "network")),
         "you skipped the layers: every op passes on its own here, and the network's check "
         "only says something is wrong somewhere; a layer's check narrows it down."),
    Slip(_walk(("network", "layer", "op")),
         "you walked from the network down: the end-to-end check only says something is "
         "wrong somewhere; it does not say where."),
    Slip(lambda parts: next((n for n, p in parts.items() if not check_part(p).ok), None),
         "you returned the first failing part in the order the dict lists them, but the "
         "dict's order is not the local-to-global order."),
    Slip(_walk(("layer", "op", "network")),
         "you checked the layers before the ops: a layer also fails when one of its ops "
         "does, and only the op's own check points at the cause."),
    Slip(_walk(("op",)),
         "you stopped after the ops: every op passes on its own here, yet a check further "
         "out fails, a bug no single op's check shows."),
]


def _where_walk_differs(got, want, case: Case) -> str:
    parts = case.args[0]

    def described(name):
        verdict = "passes" if check_part(parts[name]).ok else "fails"
        return f"{name!r} ({parts[name].level}, {verdict} its check)"
    if want is None:
        return f"you returned {described(got)}, where every part passes its check here"
    if got is None:
        return (f"you returned None, where a check fails: the most local failing part is "
                f"{described(want)}")
    return (f"you returned {described(got)}, where the most local failing part is "
            f"{described(want)}")


def _learner_part(localize, case: Case):
    """The learner's answer on one case, after checking it is a name of `parts` or None."""
    from engine.gradcheck import GradcheckError, GradcheckReport
    parts, what = case.args[0], case.label
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
    if got is not None and got not in parts:
        raise ExerciseError(EX_LOCAL, f"for {what}, {got!r} is not one of the parts "
                                      f"{sorted(parts)}.")
    return got


def check_localize(localize) -> None:
    """04.6: walk the parts from local to global; the name of the most local failing part
    (None if every part passes), for the lesson's network, its three hidden variants and
    generated ones."""
    cases = _local_cases()
    answers = [_learner_part(localize, case) for case in cases]
    raise_first_difference(EX_LOCAL, cases, answers,
                           [localize_reference(*case.args) for case in cases],
                           slips=LOCAL_SLIPS, same=operator.eq, difference=_where_walk_differs)
    passed(EX_LOCAL, f"ops, then layers, then the network: the first failure names the op, "
                     f"the layer where only the batch shows a bug, or None, on "
                     f"{len(cases)} networks (the lesson's 4 and {len(cases) - 4} generated).")
