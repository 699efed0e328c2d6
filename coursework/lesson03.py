"""Checks for lesson 03, VJPs and tensors.

* 03.1 `matmul_vjp(a, b, grad_out) -> (grad_a, grad_b)`: two matmuls.
* 03.2 `unbroadcast(grad, shape)`: sum a gradient back to an input's shape.
* 03.3 `jacobian(f, x, mode)`: the full Jacobian from n forward-mode passes
  (JVPs, one column each) or m reverse-mode passes (VJPs, one row each).
* 03.4 `residual_vjp(grad_out, branch_vjp)`: the VJP of y = x + F(x).

Each check compares with the exact answer on small float64 arrays whose
shapes are all different (so a misplaced transpose shows as a shape error),
then on square ones (where a misplaced transpose has the right shape and only
the values give it away). The checks of 03.1 and 03.2 also plug the learner's
function into the engine as an op, so `engine.gradcheck` compares it with
central differences, and save it as a piece for later lessons.
"""
from __future__ import annotations

import numpy as np

from ._cases import Case, Slip, array_difference, compare_over_cases, slip_reproduced
from ._core import ExerciseError, attempt, passed
from .pieces import save_piece

EX_MATMUL = "03.1 (matmul VJP)"
EX_UNBROADCAST = "03.2 (broadcasting backward)"
EX_JACOBIAN = "03.3 (the Jacobian, column by column or row by row)"
EX_RESIDUAL = "03.4 (residual VJP)"
EX_PRODUCT = "03.5 (predict the gradient's shrinking or growth)"


def _call(exercise, what, fn, *args, hint=""):
    """attempt(), and also turn any other error into the exercise's message, naming the case
    it stopped on (and numpy's line, where `attempt` named it)."""
    try:
        return attempt(exercise, fn, *args)
    except ExerciseError as err:
        if err.stopped_by is None:
            raise
        raise ExerciseError(exercise, f"{what}: {err.detail} {hint}".rstrip()) from None
    except Exception as err:  # a learner's code may fail in any way; say where
        raise ExerciseError(exercise, f"{what} raised {type(err).__name__}: {err}. "
                                      f"{hint}".rstrip()) from None


def _array(exercise, what, value):
    if value is None:
        raise ExerciseError(exercise, f"{what} is None; return an array.")
    data = getattr(value, "data", value)  # accept an engine Tensor too
    try:
        return np.asarray(data, dtype=np.float64)
    except (TypeError, ValueError):
        raise ExerciseError(exercise, f"{what} should be an array, got {value!r}.") from None


def _close(a, b) -> bool:
    return a.shape == b.shape and np.allclose(a, b, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- 03.1
def _matmul_slips(which: str) -> list[Slip]:
    """The usual wrong formulas for dL/da (`which` "a") or dL/db of z = a @ b, each
    reproduced from (a, b, grad_out) and named only when it gives the learner's gradient."""
    if which == "a":
        return [
            Slip(lambda a, b, g: b @ g.T, "your grad_a is the right gradient transposed; on a "
                                          "square product the shapes cannot tell them apart."),
            Slip(lambda a, b, g: g @ b, "you multiplied grad_out by b as it is; dL/da needs b "
                                        "transposed."),
            Slip(lambda a, b, g: b.T @ g, "the two factors are in the wrong order: grad_out "
                                          "comes first in dL/da."),
            Slip(lambda a, b, g: g.T @ b.T, "you transposed grad_out too; in dL/da it keeps its "
                                            "own orientation."),
            Slip(lambda a, b, g: a.T @ g, "a.T @ grad_out is the gradient of b, not of a."),
        ]
    return [
        Slip(lambda a, b, g: g.T @ a, "your grad_b is the right gradient transposed; on a "
                                      "square product the shapes cannot tell them apart."),
        Slip(lambda a, b, g: a @ g, "you multiplied a as it is by grad_out; dL/db needs a "
                                    "transposed."),
        Slip(lambda a, b, g: g @ a.T, "the two factors are in the wrong order: a's factor "
                                      "comes first in dL/db."),
        Slip(lambda a, b, g: a.T @ g.T, "you transposed grad_out too; in dL/db it keeps its "
                                        "own orientation."),
        Slip(lambda a, b, g: g @ b.T, "grad_out @ b.T is the gradient of a, not of b."),
    ]


def _matmul_cases() -> list[Case]:
    """The story's products (all shapes different, then square, then a single row), then
    seeded random shapes from 1 to 6, square ones among them."""
    rng = np.random.default_rng(3)
    shapes = [(3, 4, 5), (4, 4, 4), (1, 6, 2)]
    shapes += [tuple(int(v) for v in rng.integers(1, 7, 3)) for _ in range(6)]
    shapes += [(n, n, n) for n in (2, 5)]
    cases = []
    for m, k, n in shapes:
        a, b, g = rng.normal(size=(m, k)), rng.normal(size=(k, n)), rng.normal(size=(m, n))
        cases.append(Case((a, b, g), f"with a {a.shape}, b {b.shape}, grad_out {g.shape}"))
    return cases


def _agrees_at_its_precision(got, want) -> bool:
    """`got` equals `want` to the rounding of got's own float type: 1e-10 relative in
    float64, a few units in the last place of a short sum of products in float32."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return False
    eps = np.finfo(got.dtype).eps if np.issubdtype(got.dtype, np.floating) else 0.0
    rtol = max(1e-10, 32 * eps)
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    return bool(np.allclose(got, want, rtol=rtol, atol=rtol * scale))


def _gradient(exercise, what, value):
    """The learner's gradient as an array of its own float type (a Tensor's .data too)."""
    if value is None:
        raise ExerciseError(exercise, f"{what} is None; return an array.")
    data = np.asarray(getattr(value, "data", value))
    if not np.issubdtype(data.dtype, np.floating):
        try:
            data = data.astype(np.float64)
        except (TypeError, ValueError):
            raise ExerciseError(exercise, f"{what} should be an array, got {value!r}.") from None
    return data


def _matmul_answers(matmul_vjp, cases):
    """The learner's (grad_a, grad_b) on every case, shapes checked case by case."""
    ex = EX_MATMUL
    answers = []
    for case in cases:
        a, b, g = case.args
        out = _call(ex, f"matmul_vjp {case.label}", matmul_vjp, a.copy(), b.copy(), g.copy(),
                    hint="Hint: a gradient has its input's shape, grad_a (m, k) like a and "
                         "grad_b (k, n) like b; each is a product of grad_out (m, n) with the "
                         "other input, transposed or not, whose shapes line up.")
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise ExerciseError(ex, f"matmul_vjp should return the pair (grad_a, grad_b), "
                                    f"got {type(out).__name__}.")
        pair = (_gradient(ex, "grad_a", out[0]), _gradient(ex, "grad_b", out[1]))
        for what, got, inp, other in (("grad_a", pair[0], a, "b or b.T"),
                                      ("grad_b", pair[1], b, "a or a.T")):
            if got.shape != inp.shape:
                raise ExerciseError(
                    ex, f"{case.label}, {what} has shape {got.shape}, but {what[-1]} has shape "
                        f"{inp.shape} and a gradient always has the shape of its input. "
                        f"Hint: find the product of grad_out {g.shape} with {other} that "
                        f"gives {inp.shape}.")
        answers.append(pair)
    return answers


def check_matmul_vjp(matmul_vjp) -> None:
    """`matmul_vjp(a, b, grad_out)` for z = a @ b with a (m, k), b (k, n), over the story's
    products and seeded random ones."""
    ex = EX_MATMUL
    cases = _matmul_cases()
    answers = _matmul_answers(matmul_vjp, cases)
    for index, which, reference in ((0, "a", lambda a, b, g: g @ b.T),
                                    (1, "b", lambda a, b, g: a.T @ g)):
        what = f"grad_{which}"
        got = [pair[index] for pair in answers]
        want = [reference(*case.args) for case in cases]
        if all(_close(np.asarray(x, np.float64), w) for x, w in zip(got, want)):
            continue
        if all(_agrees_at_its_precision(x, w) for x, w in zip(got, want)):
            raise ExerciseError(ex, f"{what} agrees with the exact gradient on every case to "
                                    f"{got[0].dtype}'s precision, but it is {got[0].dtype} while "
                                    f"{which} is float64: a gradient keeps its input's dtype, and "
                                    f"the tape (and lesson 04's gradient checks of it) works in "
                                    f"float64. Return the products in the inputs' dtype, "
                                    f"without a cast.")
        bad = next(i for i, (x, w) in enumerate(zip(got, want))
                   if not _agrees_at_its_precision(x, w))
        slip = slip_reproduced(_matmul_slips(which), cases, got, want,
                               same=_agrees_at_its_precision)
        hint = f" Hint: {slip.hint}" if slip else ""
        raise ExerciseError(ex, f"{cases[bad].label}, {what} has the right shape but other "
                                f"values: {array_difference(got[bad], want[bad])}.{hint}")
    _gradcheck_matmul(matmul_vjp)
    save_piece("matmul_vjp", matmul_vjp, ex)
    passed(ex, "shapes and values right, gradcheck agrees; saved as the piece 'matmul_vjp'.")


def _gradcheck_matmul(matmul_vjp) -> None:
    from engine import gradcheck
    from engine.rules import Op
    from engine.tensor import Tensor, apply

    class LearnerMatMul(Op):
        name = "matmul (yours)"

        def forward(self, a, b):
            self.save(a=a, b=b)
            return a @ b

        def vjp(self, g):
            return matmul_vjp(self.a, self.b, g)

    rng = np.random.default_rng(7)
    a = Tensor(rng.normal(size=(3, 5)), requires_grad=True)
    b = Tensor(rng.normal(size=(5, 2)), requires_grad=True)
    report = gradcheck(lambda a, b: apply(LearnerMatMul, a, b), [a, b], raise_on_failure=False)
    if not report.ok:
        raise ExerciseError(EX_MATMUL, f"engine.gradcheck disagrees with your VJP: {report}.")


# ---------------------------------------------------------------- 03.2
UNBROADCAST_CASES = [((4, 3), (3,)), ((4, 3), (1, 3)), ((4, 3), (4, 1)), ((2, 4, 3), (4, 1)),
                     ((2, 4, 3), ()), ((4, 3), (4, 3)), ((2, 1, 3), (1, 3)), ((5,), (1,))]


def reference_unbroadcast(grad, shape):
    """Sum grad over the axes broadcasting added (leading) or stretched (size 1)."""
    lead = grad.ndim - len(shape)
    g = grad.sum(axis=tuple(range(lead))) if lead else grad
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=stretched, keepdims=True) if stretched else g


def _broadcast_pairs() -> list[tuple[tuple, tuple]]:
    """The story's pairs (gradient shape, input shape), then seeded random ones: an input
    of up to 3 axes, some stretched from size 1, broadcast to up to 2 more leading axes."""
    rng = np.random.default_rng(12)
    pairs = list(UNBROADCAST_CASES)
    for _ in range(8):
        big = tuple(int(n) for n in rng.integers(1, 5, int(rng.integers(1, 5))))
        kept = big[int(rng.integers(0, len(big))):]
        small = tuple(1 if rng.random() < 0.4 else n for n in kept)
        pairs.append((big, small))
    return pairs


def check_unbroadcast(unbroadcast) -> None:
    """`unbroadcast(grad, shape)` returns grad summed back to `shape`, on the story's
    pairs of shapes and seeded random ones."""
    ex = EX_UNBROADCAST
    rng = np.random.default_rng(11)
    for big, small in _broadcast_pairs():
        grad = rng.normal(size=big)
        want = reference_unbroadcast(grad, small)
        got = _array(ex, f"unbroadcast(grad of shape {big}, {small})",
                     _call(ex, f"unbroadcast(grad of shape {big}, {small})", unbroadcast,
                           grad.copy(), small))
        where = f"an input of shape {small} broadcast to {big}"
        if got.shape != want.shape:
            if got.size == want.size and _close(got.reshape(want.shape), want):
                hint = (f"the values are right but the shape is {got.shape}: keep the "
                        f"stretched size-1 axes (sum with keepdims=True), drop only the "
                        f"leading axes broadcasting added.")
            elif got.shape == big:
                hint = ("nothing was summed: every copy of the input made by broadcasting "
                        "sends its gradient back to the one original, so the copies add up.")
            else:
                hint = ("first sum over the leading axes broadcasting added (the gradient has "
                        "more axes than the input), then over each axis where the input has "
                        "size 1 but the gradient does not, with keepdims=True.")
            raise ExerciseError(ex, f"for {where} your gradient has shape {got.shape}, "
                                    f"expected {want.shape}. Hint: {hint}")
        if _close(got, want):
            continue
        n_copies = int(np.prod(big)) // max(int(np.prod(small)), 1)
        if _close(got * n_copies, want):
            raise ExerciseError(ex, f"for {where} the shape is right but the values are not. "
                                    f"Hint: that is the mean over the copies; each copy "
                                    f"contributes its full gradient, so sum them.")
        raise ExerciseError(ex, f"for {where} the shape is right but the values are not: "
                                f"{array_difference(got, want)}.")
    _gradcheck_unbroadcast(unbroadcast)
    save_piece("unbroadcast", unbroadcast, ex)
    passed(ex, "every broadcast case sums back to the input's shape, gradcheck agrees; saved "
               "as the piece 'unbroadcast'.")


def _gradcheck_unbroadcast(unbroadcast) -> None:
    from engine import gradcheck
    from engine.rules import Op
    from engine.tensor import Tensor, apply

    class LearnerBroadcastAdd(Op):
        name = "add (your unbroadcast)"

        def forward(self, a, b):
            self.shapes = a.shape, b.shape
            return a + b

        def vjp(self, g):
            return unbroadcast(g, self.shapes[0]), unbroadcast(g, self.shapes[1])

    rng = np.random.default_rng(5)
    for sa, sb in (((4, 3), (3,)), ((2, 4, 3), (4, 1))):
        a = Tensor(rng.normal(size=sa), requires_grad=True)
        b = Tensor(rng.normal(size=sb), requires_grad=True)
        report = gradcheck(lambda a, b: apply(LearnerBroadcastAdd, a, b) ** 2, [a, b],
                           raise_on_failure=False)
        if not report.ok:
            raise ExerciseError(EX_UNBROADCAST, f"engine.gradcheck disagrees on {sa} + {sb}: "
                                                f"{report}.")


# ---------------------------------------------------------------- 03.3
#: (seed, m outputs, n inputs): the story's f from R^5 to R^3, then a wide one and a tall one.
JACOBIAN_PROBLEMS = ((4, 3, 5), (41, 2, 6), (42, 6, 2))


def _jacobian_problem(seed: int = 4, m: int = 3, n: int = 5):
    """f(x) = tanh(W x) from R^n to R^m, its input and its exact Jacobian."""
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(m, n)) * 0.5
    x = rng.normal(size=n)
    y = np.tanh(W @ x)
    return W, x, (1.0 - y ** 2)[:, None] * W


def check_jacobian(jacobian) -> None:
    """`jacobian(f, x, mode)` with mode "forward" (n JVPs) or "reverse" (m VJPs), on the
    story's f and a wide and a tall one."""
    ex = EX_JACOBIAN
    for problem in JACOBIAN_PROBLEMS:
        _check_jacobian_on(jacobian, *_jacobian_problem(*problem))
    m, n = JACOBIAN_PROBLEMS[0][1:]
    passed(ex, f"forward mode: {n} JVPs, one column each; reverse mode: {m} VJPs, one row "
               f"each.")


def _check_jacobian_on(jacobian, W, x, J) -> None:
    """Both modes on f(x) = tanh(W x), whose exact Jacobian is J."""
    from engine import functional as F

    ex = EX_JACOBIAN
    m, n = J.shape
    for mode in ("forward", "reverse"):
        calls = []

        def f(t):
            calls.append(1)
            return F.tanh(W @ t)
        got = _array(ex, f"jacobian(f, x, {mode!r})",
                     _call(ex, f"jacobian(f, x, {mode!r})", jacobian, f, x.copy(), mode,
                           hint="Hint: forward mode runs one JVP per input direction, "
                                "reverse mode one backward per output; the error names the "
                                "call that failed."))
        what = f"in {mode} mode, for f from R^{n} to R^{m}"
        if got.shape == (n, m) and _close(got.T, J):
            side = ("each JVP gives a column (the change of every output along one input "
                    "direction): stack them with axis=1." if mode == "forward" else
                    "each VJP gives a row (the gradient of one output): stack them with "
                    "axis=0.")
            raise ExerciseError(ex, f"{what} your Jacobian is transposed: shape {got.shape}, "
                                    f"expected ({m}, {n}), outputs by inputs. Hint: {side}")
        if got.shape != (m, n):
            raise ExerciseError(ex, f"{what} your Jacobian has shape {got.shape}, expected "
                                    f"({m}, {n}): one row per output, one column per input.")
        if _close(got, J):
            if mode == "forward" and len(calls) < n:
                raise ExerciseError(ex, f"{what} the values are right but f ran only "
                                        f"{len(calls)} time{'s' if len(calls) != 1 else ''}: forward mode needs one JVP (one "
                                        f"run of f) per input direction, {n} here. Did you "
                                        f"use backward?")
            continue
        if mode == "reverse" and _close(got, np.cumsum(J, axis=0)):
            hint = ("row i holds the sum of rows 0..i: backward adds into .grad, so zero the "
                    "input's gradient (x.zero_grad()) before each row's backward (lesson 02's "
                    "trap).")
        elif mode == "reverse" and _close(got, np.repeat(J.sum(axis=0, keepdims=True), m, 0)):
            hint = ("every row is the same sum: the rows share one gradient array that backward "
                    "keeps adding into. Zero the gradient before each backward and store a copy "
                    "(x.grad.copy()).")
        else:
            raise ExerciseError(ex, f"{what} the Jacobian has the right shape but other "
                                    f"values: {array_difference(got, J)}.")
        raise ExerciseError(ex, f"{what} the Jacobian has the right shape but wrong values. "
                                f"Hint: {hint}")


# ---------------------------------------------------------------- 03.4
def _residual_cases() -> list[Case]:
    """The story's 4-wide block, then seeded random widths; each case's branch VJP is
    g -> J^T g for a random Jacobian J of the branch F."""
    rng = np.random.default_rng(2)
    cases = []
    for width in (4, 1, 3, 7):
        J = rng.normal(size=(width, width)) * 0.3
        g = rng.normal(size=width)
        cases.append(Case((g, lambda v, J=J: J.T @ v), f"for a block of width {width}"))
    return cases


RESIDUAL_SLIPS = [
    Slip(lambda g, branch: branch(g),
         "you return only the branch: the shortcut x -> y is a second path whose local "
         "derivative is the identity I, so grad_out itself is added."),
    Slip(lambda g, branch: g.copy(),
         "you return only the shortcut; the branch F sends branch_vjp(grad_out) too."),
    Slip(lambda g, branch: g * branch(g), "the two paths add (a fan-out), they do not multiply."),
]


def check_residual_vjp(residual_vjp) -> None:
    """`residual_vjp(grad_out, branch_vjp)` for y = x + F(x), branch_vjp(g) = J_F^T g."""
    ex = EX_RESIDUAL

    def read(value, case):
        got = _array(ex, "residual_vjp(grad_out, branch_vjp)", value)
        if got.shape != case.args[0].shape:
            raise ExerciseError(ex, f"{case.label} the gradient has shape {got.shape}, "
                                    f"expected {case.args[0].shape} (the shape of x).")
        return got
    compare_over_cases(ex, lambda g, branch: residual_vjp(g.copy(), branch),
                       lambda g, branch: g + branch(g), _residual_cases(),
                       slips=RESIDUAL_SLIPS, same=_close, read=read)
    passed(ex, "grad_out + branch_vjp(grad_out): the shortcut adds the identity.")


# ------------------------------------------------------------------ 03.5
def _measured_ratio(scale: float, depth: int, width: int = 16, seed: int = 0) -> float:
    """||dL/dh_0|| / ||dL/dh_depth|| through `depth` plain layers W = scale * rotation."""
    rng = np.random.default_rng(seed)
    g = rng.normal(size=width)
    top = np.linalg.norm(g)
    for _ in range(depth):
        q = np.linalg.qr(rng.normal(size=(width, width)))[0]
        g = (scale * q).T @ g
    return float(np.linalg.norm(g) / top)


def _ratio_cases() -> list[Case]:
    """The story's stacks (shrinking, growing, short, long, one layer), then seeded random
    scales from 0.3 to 2.5 and depths from 1 to 60."""
    rng = np.random.default_rng(35)
    pairs = [(0.5, 30), (1.5, 30), (0.9, 7), (1.1, 50), (2.0, 1)]
    pairs += [(round(float(rng.uniform(0.3, 2.5)), 3), int(rng.integers(1, 61)))
              for _ in range(6)]
    return [Case(pair, f"predicted_ratio({pair[0]}, {pair[1]})") for pair in pairs]


RATIO_SLIPS = [
    Slip(lambda scale, depth: scale * depth,
         "that grows linearly with the depth. The gradient passes through the layers one "
         "after another, so their factors multiply."),
    Slip(lambda scale, depth: 1.0 / _measured_ratio(scale, depth),
         "that is the ratio the other way up (top over bottom). The question is the bottom's "
         "norm over the top's: below 1 when the layers shrink."),
    Slip(lambda scale, depth: scale ** (depth - 1),
         "one factor short: every one of the layers, the first included, multiplies the "
         "gradient by W^T on its way down."),
    Slip(lambda scale, depth: scale ** (depth + 1),
         "one factor too many: there are as many factors as layers."),
]


def _ratio_number(value, case: Case) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ExerciseError(EX_PRODUCT, f"{case.label} should be a number, got "
                                        f"{value!r}.") from None


def _ratios_apart(got: float, want: float, case: Case) -> str:
    return f"you predict {got:.6g}, measured {want:.6g} (yours is {got / want:.4g} times it)"


def check_gradient_ratio(predicted_ratio) -> None:
    """predicted_ratio(scale, depth) = ||dL/dh_0|| / ||dL/dh_depth|| for a plain stack
    of `depth` layers W_l = scale * Q_l: each VJP multiplies by W^T, norm exactly scale."""
    def close(got, want):
        return bool(np.isclose(got, want, rtol=1e-6))
    compare_over_cases(EX_PRODUCT, predicted_ratio, _measured_ratio, _ratio_cases(),
                       slips=RATIO_SLIPS, same=close, read=_ratio_number,
                       difference=_ratios_apart,
                       neutral_hint="Hint: follow the norm of the gradient through one "
                                    "layer, then through `depth` of them.")
    passed(EX_PRODUCT, f"your prediction matches the measured ratio: 0.5 over 30 layers gives "
                       f"{_measured_ratio(0.5, 30):.3g}, 1.5 gives "
                       f"{_measured_ratio(1.5, 30):.3g}.")


# ------------------------------------------------------------------ the notebook
#: Each exercise function of the lesson, and its exercise.
EXERCISE_FUNCTIONS = {"matmul_vjp": EX_MATMUL, "unbroadcast": EX_UNBROADCAST, "jacobian":
                      EX_JACOBIAN, "residual_vjp": EX_RESIDUAL, "predicted_ratio": EX_PRODUCT}


def name_unfinished_exercises() -> None:
    """In the notebook, a cell that needs an unfinished exercise of this lesson says which."""
    from . import _core
    _core.name_unfinished_exercises(EXERCISE_FUNCTIONS)
