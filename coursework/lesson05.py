"""Checks for lesson 05, "When gradients go wrong", and the lesson's tools.

Four exercises:
05.1 `in_place_outcomes()`: for each snippet of IN_PLACE_SNIPPETS (a forward,
     an in-place change, a backward), predict whether the engine's version
     counters refuse the backward ("raises"), the backward runs on stale values
     ("wrong") or nothing saved was touched ("right"). `snippet_outcome` runs a
     snippet and says which it was; the check's hint for a miss names what the
     op saved.
05.2 `find_broken(suspects)`: run a gradient check (the learner's 04.3
     `spot_check`, via `pieces.gradient_checker()`, on `scalar_views` of each
     op) on every suspect op and return the names of those whose backward rule
     is wrong. The suspects are ops of the engine (subclasses of
     `engine.rules.Op`) with bugs planted in their VJPs. The check also hands the
     learner's function a second set of suspects with the bugs moved around, so
     only a real check passes.
05.3 `verdicts()`: say *how* each suspect of the lesson is broken, one of
     CAUSES. The check knows the answer and explains each miss with the
     evidence a gradient check shows.
05.4 `triage()`: for the lesson's mystery runs, the first step of the
     troubleshooting order (STEPS) that finds the cause, using the symptom
     table (SYMPTOMS, `diagnose`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from engine.rules import Op
from engine.tensor import Tensor, apply
from ._core import ExerciseError, attempt, passed

EX_IN_PLACE = "05.1 (in_place_outcomes)"
EX_FIND = "05.2 (find_broken)"
EX_HOW = "05.3 (verdicts)"
EX_TRIAGE = "05.4 (triage)"


# ============================================================ 05.1 in place
#: What every snippet starts from: a weight that requires a gradient, an input that does not.
IN_PLACE_SETUP = '''w = Tensor(np.array([2.0, -1.0]), requires_grad=True, name="w")
x = Tensor(np.array([3.0, 0.5]), name="x")'''

_CHANGE = "  # the change"

#: Seven snippets: a forward, an in-place change (the lines marked), then y.backward().
IN_PLACE_SNIPPETS = {
    "a": f"y = (x * w).sum()\nx += 1.0{_CHANGE}",
    "b": f"y = (x + w).sum()\nx += 1.0{_CHANGE}",
    "c": f"y = (x * w).sum()\nx.data[:] += 1.0{_CHANGE}",
    "d": f"y = (x * w).sum()\nfirst = x[0:1]{_CHANGE}\nfirst += 1.0{_CHANGE}",
    "e": f"y = (F.exp(x) * w).sum()\nx += 1.0{_CHANGE}",
    "f": f"t = F.tanh(x * w)\ny = t.sum()\nwith engine.no_grad():{_CHANGE}\n    t += 1.0{_CHANGE}",
    "g": f"arr = np.array([3.0, 0.5])\ny = (arr * w).sum()\narr += 1.0{_CHANGE}",
}

OUTCOMES = {
    "raises": "backward raises: the version counter saw a saved tensor change",
    "wrong": "backward runs, and w.grad is computed from the changed values",
    "right": "backward runs, and w.grad is the gradient of the forward as it ran",
}

#: What each snippet's op saved, and why that decides the outcome.
_IN_PLACE_WHY = {
    "a": "mul saves x to compute w's gradient (d(x*w)/dw = x); `x += 1` bumps x's version "
         "counter, and before its VJP runs mul compares it with the version it saved",
    "b": "an add needs no values for its gradient (d(x+w)/dw = 1), so it saves nothing: x "
         "may change freely, and w.grad is still [1, 1]",
    "c": "`.data` is the plain array inside the tensor: writing into it goes around the "
         "version counter, so nothing complains, and mul's VJP multiplies by the changed x",
    "d": "`x[0:1]` is a view: it shares x's memory and x's version counter, so `first += 1` "
         "bumps the counter that mul recorded for x",
    "e": "mul saved exp(x), a new tensor, not x, and the exp itself was not recorded, since "
         "nothing before it requires a gradient: changing x changes nothing the VJP reads",
    "f": "tanh saves its output t (its derivative is 1 - t**2); no_grad() stops recording "
         "new ops, it does not hide an in-place change from the version counter",
    "g": "a plain ndarray has no version counter, so an op that saves one keeps a private "
         "copy of it: changing your array after the forward cannot reach the gradient",
}


def _run_snippet(code: str) -> np.ndarray:
    import engine
    import engine.functional as F
    namespace = {"np": np, "engine": engine, "F": F, "Tensor": Tensor}
    exec(IN_PLACE_SETUP + "\n" + code + "\ny.backward()", namespace)  # noqa: S102
    return namespace["w"].grad


def snippet_outcome(letter: str) -> tuple[str, str]:
    """Run snippet `letter` of IN_PLACE_SNIPPETS: (outcome, what was seen), the outcome one
    of OUTCOMES. "right" or "wrong" compares w.grad with the same snippet run without the
    change (the lines marked "# the change")."""
    code = IN_PLACE_SNIPPETS[letter]
    unchanged = "\n".join(line for line in code.splitlines() if not line.endswith(_CHANGE))
    want = _run_snippet(unchanged)
    try:
        got = _run_snippet(code)
    except RuntimeError as err:
        # node numbers count every op made before, so they depend on what ran earlier
        first = re.sub(r" \(node #\d+\)", "", str(err)).split(", but ")[0]
        return "raises", first
    outcome = "right" if np.allclose(got, want, rtol=1e-12, atol=0) else "wrong"
    return outcome, f"w.grad = {np.round(got, 4).tolist()}, the forward's gradient " \
                    f"{np.round(want, 4).tolist()}"


#: The outcomes of the snippets (tests/test_lessons_04_05_checks.py runs them to confirm).
IN_PLACE_TRUTH = {"a": "raises", "b": "right", "c": "wrong", "d": "raises", "e": "right",
                  "f": "raises", "g": "right"}


def check_in_place(in_place_outcomes) -> None:
    out = attempt(EX_IN_PLACE, in_place_outcomes)
    if not isinstance(out, dict):
        raise ExerciseError(EX_IN_PLACE, f"return a dict {{snippet letter: outcome}}, got "
                                         f"{type(out).__name__}.")
    missing = sorted(set(IN_PLACE_SNIPPETS) - set(out))
    if missing:
        raise ExerciseError(EX_IN_PLACE, f"no outcome for snippet(s) {', '.join(missing)}; "
                                         f"give one of {sorted(OUTCOMES)} for every snippet "
                                         f"a-g.")
    for letter, outcome in out.items():
        if letter not in IN_PLACE_SNIPPETS:
            raise ExerciseError(EX_IN_PLACE, f"{letter!r} is not a snippet; they are "
                                             f"{', '.join(IN_PLACE_SNIPPETS)}.")
        if outcome not in OUTCOMES:
            raise ExerciseError(EX_IN_PLACE, f"the outcome for snippet {letter} is "
                                             f"{outcome!r}; choose one of {sorted(OUTCOMES)}.")
    wrong = [k for k in IN_PLACE_SNIPPETS if out[k] != IN_PLACE_TRUTH[k]]
    if wrong:
        k = wrong[0]
        raise ExerciseError(
            EX_IN_PLACE, f"{len(wrong)} outcome(s) to revisit; first, snippet {k}: you said "
                         f"{out[k]!r}, but there {OUTCOMES[IN_PLACE_TRUTH[k]]}. Hint: "
                         f"{_IN_PLACE_WHY[k]}.")
    counts = {o: sum(v == o for v in IN_PLACE_TRUTH.values()) for o in OUTCOMES}
    passed(EX_IN_PLACE, f"{counts['raises']} refused by the version counters, "
                        f"{counts['wrong']} silently wrong, {counts['right']} harmless.")


# ===================================================== the ways a VJP goes wrong
CAUSES = {
    "ok": "the backward rule is right: the check passes",
    "scale": "off by a constant factor everywhere (analytic = c * numerical, c not 1 or -1)",
    "sign": "the sign is flipped everywhere (analytic = -numerical)",
    "branch": "right on one side of a branch, wrong on the other (e.g. only for negative inputs)",
    "broadcast": "only the broadcast input's gradient is wrong: the sum over the axis it "
                 "was repeated along is missing",
    "formula": "wrong everywhere with no constant ratio: a term of the derivative is missing",
}


class _Elementwise(Op):
    """y = f(x), element by element; subclasses give f, its derivative and a
    wrong derivative. `bug` (a class attribute) plants one of CAUSES."""
    bug: str | None = None

    def forward(self, x):
        self.save(x=x)
        return self.f(x)

    def vjp(self, g):
        x = self.x
        d = self.derivative(x)
        if self.bug == "scale":
            d = 0.5 * d
        elif self.bug == "sign":
            d = -d
        elif self.bug == "branch":
            d = np.where(x > 0, d, 0.0)
        elif self.bug == "formula":
            d = self.wrong_derivative(x)
        return (g * d,)


class _Softplus(_Elementwise):
    name = "softplus"
    f = staticmethod(lambda x: np.logaddexp(0.0, x))
    derivative = staticmethod(lambda x: 1.0 / (1.0 + np.exp(-x)))
    wrong_derivative = staticmethod(np.exp)  # forgot to divide by 1 + e^x


class _Square(_Elementwise):
    name = "square"
    f = staticmethod(lambda x: x * x)
    derivative = staticmethod(lambda x: 2.0 * x)
    wrong_derivative = staticmethod(lambda x: x * x)  # wrote the function, not its slope


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


class _Sigmoid(_Elementwise):
    name = "sigmoid"
    f = staticmethod(_sigmoid)
    derivative = staticmethod(lambda x: _sigmoid(x) * (1.0 - _sigmoid(x)))
    wrong_derivative = staticmethod(_sigmoid)  # forgot the factor (1 - s)


class _LeakyRelu(_Elementwise):
    """max(x, 0.1 x); slope 1 above 0 and 0.1 below."""
    name = "leaky_relu"
    f = staticmethod(lambda x: np.where(x > 0, x, 0.1 * x))
    derivative = staticmethod(lambda x: np.where(x > 0, 1.0, 0.1))
    wrong_derivative = staticmethod(lambda x: np.where(x > 0, 1.0, -0.1))


class _XExp(_Elementwise):
    name = "x_exp"
    f = staticmethod(lambda x: x * np.exp(x))
    derivative = staticmethod(lambda x: (1.0 + x) * np.exp(x))
    wrong_derivative = staticmethod(np.exp)  # the product rule's second term is gone


class _LogSumExp(Op):
    """Row-wise log(sum(exp(x))), keeping the last axis as size 1."""
    name = "logsumexp"
    bug: str | None = None

    def forward(self, x):
        m = x.max(axis=-1, keepdims=True)
        out = m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True))
        self.save(x=x, out=out)
        return out

    def vjp(self, g):
        p = np.exp(self.x - self.out)  # softmax of the row
        if self.bug == "scale":
            p = 0.5 * p
        elif self.bug == "sign":
            p = -p
        elif self.bug == "branch":
            p = np.where(self.x > 0, p, 0.0)
        elif self.bug == "formula":
            p = np.exp(self.x)  # forgot to normalise by the row's sum
        return (g * p,)


class _AddBias(Op):
    """x (B, C) + b (C,): b is repeated along the batch axis."""
    name = "add_bias"
    bug: str | None = None

    def forward(self, x, b):
        return x + b

    def vjp(self, g):
        gb = g.sum(axis=0)
        if self.bug == "broadcast":
            gb = g[0]          # took one row instead of summing over the batch
        elif self.bug == "scale":
            gb = 0.5 * gb
        elif self.bug == "sign":
            gb = -gb
        return (g, gb)


_OPS = {cls.name: cls for cls in (_Softplus, _Square, _Sigmoid, _LeakyRelu, _XExp,
                                  _LogSumExp, _AddBias)}
_SHAPES = {"add_bias": [(4, 3), (3,)], "logsumexp": [(3, 5)]}


@dataclass(frozen=True)
class Suspect:
    """An op under suspicion: call `fn` on tensors of `shapes`."""
    name: str
    fn: Callable
    shapes: list

    def __repr__(self):
        return f"Suspect({self.name!r}, shapes={self.shapes})"


def _make(name: str, bug: str | None) -> Suspect:
    base = _OPS[name]
    op = type(f"{base.__name__}_{bug or 'ok'}", (base,), {"bug": bug})
    return Suspect(name, lambda *tensors: apply(op, *tensors), _SHAPES.get(name, [(3, 4)]))


#: The lesson's suspects: which are broken, and how (05.2 and 05.3).
LESSON_BUGS = {"softplus": None, "square": "scale", "sigmoid": "sign",
               "leaky_relu": "branch", "x_exp": "formula", "logsumexp": None,
               "add_bias": "broadcast"}
#: The same ops with the bugs moved: a second test of the learner's find_broken.
SHUFFLED_BUGS = {"softplus": "formula", "square": None, "sigmoid": None,
                 "leaky_relu": "sign", "x_exp": "branch", "logsumexp": "scale",
                 "add_bias": None}


def suspects(bugs: dict | None = None) -> dict[str, Suspect]:
    """The suspects {name: Suspect}; with no argument, the lesson's set."""
    bugs = LESSON_BUGS if bugs is None else bugs
    unknown = set(bugs) - set(_OPS)
    if unknown:
        raise ValueError(f"suspects: no op named {sorted(unknown)}; the ops are {sorted(_OPS)}")
    return {name: _make(name, bug) for name, bug in bugs.items()}


# ------------------------------------------------------------------- evidence
def scalar_views(suspect: Suspect, arrays, seed: int = 0):
    """What a spot check (exercise 04.3) needs, for each input k of the suspect:
    (f_k, x_k, grad_k). f_k(array) is the op's output reduced to one number with fixed
    random weights (so every output element matters), as a plain function of input k
    alone, the other inputs held at `arrays`; x_k is arrays[k]; grad_k is the gradient
    of that number by one backward through the op's VJP."""
    arrays = [np.array(a, dtype=np.float64) for a in arrays]
    tensors = [Tensor(a, requires_grad=True) for a in arrays]
    out = suspect.fn(*tensors)
    weights = np.random.default_rng(seed).normal(size=out.shape)
    (out * Tensor(weights)).sum().backward()

    def view(k):
        def f(array):
            values = [Tensor(array if i == k else a) for i, a in enumerate(arrays)]
            return float(np.sum(suspect.fn(*values).data * weights))
        return f

    return [(view(k), a, tensors[k].grad) for k, a in enumerate(arrays)]


def numeric_and_analytic(suspect: Suspect, checker=None, seed: int = 0, eps: float = 1e-6):
    """For each input of the suspect, (x, analytic, numerical) arrays, float64, read
    from the rows of `checker` (a spot check with the calling convention of 04.3; the
    engine's by default) run on every element. Inputs are standard normal, so both signs
    appear."""
    if checker is None:
        from .slots import engine_spot_check as checker
    rng = np.random.default_rng(seed)
    arrays = [rng.normal(size=s) for s in suspect.shapes]
    result = []
    for f, x, grad in scalar_views(suspect, arrays, seed):
        analytic, numeric = np.empty_like(x), np.empty_like(x)
        for row in checker(f, x, grad, n_checks=x.size, eps=eps):
            index = tuple(int(i) for i in row.index)
            analytic[index], numeric[index] = row.analytic, row.numeric
        result.append((x, analytic, numeric))
    return result


def _evidence(name: str) -> str:
    """The fact a gradient check shows about the lesson's suspect `name`."""
    bug = LESSON_BUGS[name]
    return {
        None: "its check passes: analytic and numerical gradients agree to ~1e-9",
        "scale": "the analytic gradient is exactly half the numerical one at every element",
        "sign": "the analytic gradient is minus the numerical one at every element",
        "branch": "the two agree for positive inputs and disagree for every negative one",
        "broadcast": "the gradient of x is right, the gradient of the bias b is wrong",
        "formula": "they disagree everywhere, and their ratio changes from element to element",
    }[bug]


# ============================================================== 05.2 find_broken
def _as_names(exercise, out, valid):
    if isinstance(out, str) or not hasattr(out, "__iter__"):
        raise ExerciseError(exercise, f"return a list (or set) of suspect names, got {out!r}.")
    names = set()
    for n in out:
        name = getattr(n, "name", n)
        if name not in valid:
            raise ExerciseError(exercise, f"{name!r} is not one of the suspects {sorted(valid)}.")
        names.add(name)
    return names


def check_find_broken(find_broken) -> None:
    """The learner's function must name exactly the broken suspects, for the
    lesson's set and for a set with the bugs moved around."""
    for bugs, which in ((LESSON_BUGS, "the lesson's suspects"),
                        (SHUFFLED_BUGS, "a second set of the same ops with the bugs moved")):
        got = _as_names(EX_FIND, attempt(EX_FIND, find_broken, suspects(bugs)), set(bugs))
        truth = {n for n, b in bugs.items() if b is not None}
        if got == truth:
            continue
        missed, extra = sorted(truth - got), sorted(got - truth)
        hints = []
        for n in missed:
            if bugs[n] == "branch":
                hints.append(f"{n} is broken only for negative inputs: make sure your test "
                             f"inputs have both signs (rng.normal does) and that you check "
                             f"every element, or enough of them")
            elif bugs[n] == "broadcast":
                hints.append(f"{n} is broken in the gradient of its second input (the bias): "
                             f"check every input, not only the first")
            else:
                hints.append(f"{n} is broken ({CAUSES[bugs[n]]}); does your check compare "
                             f"all its inputs, with a tolerance like rtol=1e-5?")
        for n in extra:
            hints.append(f"{n} is correct; a float64 check with eps around 1e-6 passes it. "
                         f"A failure there means the tolerance is too tight or the inputs "
                         f"are float32, or points sit on a kink")
        if which != "the lesson's suspects" and got == {n for n, b in LESSON_BUGS.items() if b}:
            hints.insert(0, "you returned the lesson's answer for a different set: run the "
                            "check on the suspects you are given")
        raise ExerciseError(EX_FIND, f"for {which}, you found {sorted(got)}; "
                                     f"{len(truth)} are broken. " + ". ".join(hints) + ".")
    passed(EX_FIND, f"found the {sum(b is not None for b in LESSON_BUGS.values())} broken ops, "
                    f"and the {sum(b is not None for b in SHUFFLED_BUGS.values())} of a "
                    f"second set.")


# ================================================================ 05.3 verdicts
_WHY_NOT = {
    "ok": "a correct op passes its check",
    "scale": "a constant ratio other than 1 or -1 between analytic and numerical",
    "sign": "analytic = -numerical everywhere",
    "branch": "agreement on one side of 0 and disagreement on the other",
    "broadcast": "only the broadcast input (the one repeated along an axis) disagreeing",
    "formula": "disagreement everywhere with a ratio that varies",
}


def check_verdicts(verdicts) -> None:
    out = attempt(EX_HOW, verdicts)
    if not isinstance(out, dict):
        raise ExerciseError(EX_HOW, f"return a dict {{suspect name: cause}}, got "
                                    f"{type(out).__name__}.")
    missing = sorted(set(LESSON_BUGS) - set(out))
    if missing:
        raise ExerciseError(EX_HOW, f"no verdict for {missing}; give one of {sorted(CAUSES)} "
                                    f"for every suspect (\"ok\" for a correct one).")
    for name, cause in out.items():
        if name not in LESSON_BUGS:
            raise ExerciseError(EX_HOW, f"{name!r} is not a suspect; they are {sorted(LESSON_BUGS)}.")
        if cause not in CAUSES:
            raise ExerciseError(EX_HOW, f"the verdict for {name} is {cause!r}; choose one of "
                                        f"{sorted(CAUSES)}.")
    wrong = [(n, out[n]) for n in LESSON_BUGS if out[n] != (LESSON_BUGS[n] or "ok")]
    if wrong:
        name, cause = wrong[0]
        raise ExerciseError(
            EX_HOW, f"{len(wrong)} verdict(s) to revisit; first, {name}: you said {cause!r}, "
                    f"which would show as {_WHY_NOT[cause]}. What the check shows for {name}: "
                    f"{_evidence(name)}.")
    passed(EX_HOW, "every suspect diagnosed: " + ", ".join(
        f"{n}={LESSON_BUGS[n] or 'ok'}" for n in LESSON_BUGS) + ".")


# ==================================================== troubleshooting: 05.4 triage
#: The troubleshooting order: cheapest and most common causes first.
STEPS = {
    1: "Confirm the parameter takes part at all: is it used in computing the loss, and was "
       "it made as a tensor that requires grad?",
    2: "Look for graph cuts on the way from a parameter that takes part to the loss: "
       "detach(), a round trip through a plain ndarray or float (.data), a no_grad() block.",
    3: "Look for in-place changes of tensors the backward needs (the engine's version "
       "counters catch most, writes to .data bypass them).",
    4: "Check when gradients are zeroed, and whether accumulation is intended.",
    5: "Look for zeros, NaN and Inf in activations and gradients (detect_anomaly names the "
       "first op that made a NaN or Inf).",
    6: "Compare with higher precision (float64) to rule out a precision problem.",
    7: "Look for discrete or non-differentiable ops (round, argmax, comparisons, kinks).",
    8: "Check broadcasting, reductions and the meaning of each axis (shapes 1, 2, 3 make "
       "axes distinct).",
    9: "On a small deterministic example, compare with a hand calculation or finite "
       "differences (gradcheck), one op, then a layer, then the network.",
}

#: The symptom table: what you see -> likely causes -> the steps to take first.
SYMPTOMS = {
    "grad is None": (
        "no differentiable path: the parameter is unused, or the graph was cut by detach, "
        "an ndarray round trip or no_grad", [1, 2]),
    "backward raises 'modified in place'": (
        "a tensor saved for backward was changed in place after the forward", [3]),
    "grad is zero everywhere": (
        "a true zero, a blocked path (dead ReLU, saturation), a non-differentiable op, or "
        "underflow in low precision", [5, 7, 6]),
    "grad contains NaN or Inf": (
        "overflow (exp of a large number), log of 0, division by 0, an unstable formula",
        [5, 6]),
    "grad grows every step on the same batch": (
        "gradients accumulate because zero_grad is missing (or true explosion)", [4]),
    "right shape, plausible direction, wrong size": (
        "a missing path, a wrong broadcast or reduction axis, stale accumulation, a wrong "
        "scale (a missing /K or /N)", [4, 8, 9]),
    "numerical gradient stable over eps, backprop disagrees": (
        "a wrong backward rule, a missing sum at a fan-out, a wrong broadcast reduction",
        [9, 8]),
    "numerical gradient changes a lot with eps": (
        "low precision, randomness between the two forward passes, a kink, a badly scaled "
        "loss", [6, 7]),
}


def diagnose(symptom: str) -> str:
    """The row of the symptom table for `symptom` (a key of SYMPTOMS, or a word of
    one), with its steps in troubleshooting order, as text to print."""
    key = symptom if symptom in SYMPTOMS else None
    if key is None:
        matches = [k for k in SYMPTOMS if symptom.lower() in k.lower()]
        if len(matches) != 1:
            choices = "\n  ".join(SYMPTOMS)
            raise KeyError(f"diagnose: {symptom!r} matches {len(matches)} symptoms; "
                           f"use one of:\n  {choices}")
        key = matches[0]
    causes, steps = SYMPTOMS[key]
    lines = [f"symptom: {key}", f"likely causes: {causes}", "steps, in this order:"]
    lines += [f"  {s}. {STEPS[s]}" for s in sorted(steps)]
    return "\n".join(lines)


#: The lesson's mystery runs: (symptom seen, the step that finds the cause, why).
MYSTERIES = {
    "A": ("grad is None", 2,
          "the hidden layer went through np.tanh on .data: a round trip through a plain "
          "ndarray cuts the graph"),
    "B": ("grad contains NaN or Inf", 5,
          "exp(1000) overflowed to inf and inf/inf is NaN; detect_anomaly names the exp"),
    "C": ("grad grows every step on the same batch", 4,
          "zero_grad is never called, so each step adds to the last"),
    "D": ("grad is zero everywhere", 7,
          "a rounding step (non-differentiable, gradient 0) sits between the weights and the "
          "loss"),
    "E": ("right shape, plausible direction, wrong size", 8,
          "the mean runs over the batch axis instead of the feature axis"),
}


#: Hints for a tempting wrong step, which say why it is not that step without naming the right one.
_TRIAGE_NUDGES = {
    ("A", 1): "step 1 finds nothing here: W1 takes part (`Tensor(X) @ W1`) and requires grad. "
              "The gradient is lost on the way from W1 to the loss; look at what happens to "
              "the product before the tanh",
    ("D", 5): "step 5 would show the zeros, which you already see in the symptom; it would not "
              "say where they come from. Which op between W1 and the loss has a derivative of "
              "0 almost everywhere?",
    ("D", 6): "float64 would show the same zeros: this is not a precision problem",
    ("B", 6): "float64 would not rescue this run: dividing by a temperature of 1e-4 makes "
              "logits in the thousands, and exp of a thousand overflows float64 as well. Find "
              "the first op that produced an Inf instead",
    ("E", 4): "step 4 finds nothing here: mystery E computes one gradient, once, so nothing "
              "accumulates. Its size is off because of what the loss adds up: look at the "
              "axis of each reduction in the loss line",
    ("E", 9): "a finite-difference check would agree with this backward: the gradient is the "
              "right gradient of the loss as written. The loss line itself differs from the "
              "intended one printed below it",
}


def check_triage(triage) -> None:
    out = attempt(EX_TRIAGE, triage)
    if not isinstance(out, dict):
        raise ExerciseError(EX_TRIAGE, f"return a dict {{mystery: step number}}, got "
                                       f"{type(out).__name__}.")
    missing = sorted(set(MYSTERIES) - set(out))
    if missing:
        raise ExerciseError(EX_TRIAGE, f"no step for mystery {', '.join(missing)}; answer every "
                                       f"one of {sorted(MYSTERIES)} with a step number 1-9.")
    for case, (symptom, step, why) in MYSTERIES.items():
        got = out[case]
        if not isinstance(got, (int, np.integer)) or not 1 <= int(got) <= 9:
            raise ExerciseError(EX_TRIAGE, f"mystery {case}: {got!r} is not a step number 1-9.")
        if int(got) == step:
            continue
        causes, steps = SYMPTOMS[symptom]
        if (case, int(got)) in _TRIAGE_NUDGES:
            hint = _TRIAGE_NUDGES[case, int(got)]
        elif int(got) in steps:
            hint = (f"step {got} is on the list for this symptom, but it would not find what "
                    f"is wrong in mystery {case}: read its code again, find the line that "
                    f"differs from a normal run, and ask which step looks at that kind of line")
        elif int(got) == 9:
            hint = ("step 9 would find it eventually, but it comes last for a reason: the "
                    "symptom points at a cheaper step first")
        else:
            hint = (f"the symptom is '{symptom}'; diagnose('{symptom}') lists steps "
                    f"{', '.join(map(str, sorted(steps)))}")
        raise ExerciseError(EX_TRIAGE, f"mystery {case}: step {got} ({STEPS[int(got)][:60]}...) "
                                       f"is not the one. Hint: {hint}.")
    passed(EX_TRIAGE, " ".join(f"{c}->{MYSTERIES[c][1]}" for c in MYSTERIES))


# ------------------------------------------------------------------ the notebook
#: Each exercise function of the lesson, and its exercise.
EXERCISE_FUNCTIONS = {"in_place_outcomes": EX_IN_PLACE, "find_broken": EX_FIND, "verdicts":
                      EX_HOW, "triage": EX_TRIAGE}


def name_unfinished_exercises() -> None:
    """In the notebook, a cell that needs an unfinished exercise of this lesson says which."""
    from . import _core
    _core.name_unfinished_exercises(EXERCISE_FUNCTIONS)
