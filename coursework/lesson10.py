"""Checks for lesson 10, "Fused kernels".

10.1 a fused bias + GELU forward kernel in numba: one pass, reading x and
     the bias and writing the output once. The check compares it with the
     unfused numpy composition in float64 and float32, recognises the usual
     slips (bias forgotten or added after the GELU, the erf or sigmoid form
     of GELU, the output array never written), refuses a kernel that runs on
     one thread (no parallel=True, or range in place of prange) or on a number
     of threads fixed in the code (prange(2) over row chunks), then times
     it against the lesson's plain fused loop, the unfused numpy version and
     the trainer's kernel, refuses one far slower than numpy and the plain
     loop with the cause it sees, and says which gap is the learner's to
     close (coursework/lesson10_speed.py).
10.2 fused softmax + cross-entropy: the mean loss is returned and the
     logits' buffer is overwritten with the gradient of that mean, so the
     probabilities and the gradient never exist as separate (N, V) arrays.
     On logits that overflow a careless shift, a slip (a shift for the whole
     batch, the row's first logit or its target's, the log of a probability)
     is named only when its numpy version gives the learner's loss and
     gradient on that case and the ones before; else the hint says where the
     result differs.
10.3 attention with the online softmax: tile by tile, keeping a running
     maximum, sum and output per row; returns the output and each row's
     log-sum-exp. The check compares both with the full masked softmax
     (T shorter than a tile, not a multiple of it, one head, head size 1),
     recognises a missing rescale of the output or of the sum (the first
     wrong row is the first to see two tiles) and a missing mask (row 0,
     which sees key 0 alone, is wrong), and measures with
     tracemalloc that no (T x T) array was made. Saved as the trainer's
     flash_attention_forward piece.
"""
from __future__ import annotations

import ast
import math

import numpy as np

from engine import numba_config  # noqa: F401  (its thread settings go in before numba loads)
from ._core import ExerciseError, attempt, function_syntax, is_call, passed
from ._cases import differing_digits
from ._compiled_stubs import uncompile_stubs
from .lesson10_speed import (bias_gelu_speed_verdict, calls, measure, plain_fused_loop,  # noqa: F401
                             refusal, slow_causes, speed_report)
from .pieces import save_piece

EX_GELU = "10.1 (bias_gelu_fused)"
EX_XENT = "10.2 (softmax_cross_entropy_fused)"
EX_FLASH = "10.3 (online_softmax_attention)"

GELU_K = math.sqrt(2.0 / math.pi)
GELU_A = 0.044715


# ------------------------------------------------------------- references
def gelu(u):
    """GELU, tanh form, in numpy: 0.5 u (1 + tanh(K (u + A u^3)))."""
    return 0.5 * u * (1.0 + np.tanh(GELU_K * (u + GELU_A * u * u * u)))


def bias_gelu_unfused(x, b):
    """The unfused reference, as lesson 10 writes it: ten numpy passes over memory, in
    place where possible (no fresh temporaries beyond u and the result)."""
    u = x + b
    y = u * u
    y *= u
    y *= GELU_A
    y += u
    y *= GELU_K
    np.tanh(y, out=y)
    y += 1.0
    y *= u
    y *= 0.5
    return y


def softmax_cross_entropy_reference(logits, targets):
    """(mean loss, gradient of the mean loss) in numpy, leaving `logits` alone."""
    n = logits.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    total = e.sum(axis=1, keepdims=True)
    rows = np.arange(n)
    loss = float(np.mean(np.log(total[:, 0]) - shifted[rows, targets]))
    grad = e / total
    grad[rows, targets] -= 1.0
    return loss, grad / n


def _is_compiled(fn) -> bool:
    return hasattr(fn, "py_func") and hasattr(fn, "signatures")


# --------------------------------------------------------------- 10.1
def _gelu_diagnosis(x, b, got):
    """Name the usual wrong answers of a bias + GELU kernel, or return None."""
    candidates = [
        (gelu(x), "this is GELU of x alone: the bias was never added. Compute "
                  "u = x[i, j] + b[j] first, then GELU(u)."),
        (gelu(x) + b, "this is GELU(x) + b: the bias goes in before the GELU, "
                      "u = x[i, j] + b[j], then GELU(u)."),
        (0.5 * (x + b) * (1.0 + np.vectorize(math.erf)((x + b) / math.sqrt(2.0))),
         "this is the exact (erf) GELU; the course and GPT-2 use the tanh form "
         "0.5 u (1 + tanh(k (u + a u^3))) with the constants k and a given in the cell."),
        ((x + b) / (1.0 + np.exp(-1.702 * (x + b))),
         "this is the sigmoid approximation u * sigmoid(1.702 u); use the tanh form "
         "0.5 u (1 + tanh(k (u + a u^3)))."),
        (np.maximum(x + b, 0.0), "this is ReLU(x + b), not GELU."),
        (x + b, "this is only the bias add: apply GELU to u = x + b as well."),
        (0.5 * (x + b) * (1.0 - np.tanh(GELU_K * ((x + b) + GELU_A * (x + b) ** 3))),
         "the sign of the tanh term is flipped: GELU(u) = 0.5 u (1 + tanh(...)). "
         "With exp, tanh(z) = 1 - 2 / (exp(2 z) + 1)."),
    ]
    for want, hint in candidates:
        if got.shape == want.shape and np.allclose(got, want, rtol=1e-6, atol=1e-9):
            return hint
    return None


def check_bias_gelu(bias_gelu_fused, repeats: int = 7) -> None:
    """Correct in float64 and float32, in place, compiled; then timed against numpy."""
    rng = np.random.default_rng(10)
    x = rng.normal(0.0, 2.0, size=(5, 7))
    x[0, :3] = [-30.0, 0.0, 30.0]  # far tails: exp(2z) overflows or vanishes there
    b = rng.normal(0.0, 0.5, size=7)
    out = np.full_like(x, np.nan)
    got = attempt(EX_GELU, bias_gelu_fused, x, b, out)
    want = bias_gelu_unfused(x, b)
    if got is None and np.all(np.isnan(out)):
        raise ExerciseError(EX_GELU, "the function returned None and left `out` unwritten. "
                                     "Write GELU(x[i, j] + b[j]) into out[i, j] and end "
                                     "with `return out`.")
    if got is None:
        raise ExerciseError(EX_GELU, "the function returned None. End it with `return out`, "
                                     "so it can be used in an expression like the reference.")
    got = np.asarray(got)
    if got is not out:
        if np.all(np.isnan(out)):
            raise ExerciseError(EX_GELU, "`out` was never written: the result came back in a "
                                         "new array. A fused kernel writes into the buffer it "
                                         "is given (out[i, j] = ...), so a training step "
                                         "allocates nothing, and returns `out`.")
        raise ExerciseError(EX_GELU, "return the `out` array you were given (`return out`), "
                                     "not a new one.")
    if got.shape != want.shape:
        raise ExerciseError(EX_GELU, f"the output has shape {got.shape}, the input "
                                     f"{want.shape}; GELU is elementwise.")
    if not np.all(np.isfinite(got)):
        i = np.unravel_index(int(np.argmax(~np.isfinite(got))), got.shape)
        raise ExerciseError(EX_GELU, f"out{tuple(int(k) for k in i)} is {got[i]} for "
                                     f"x + b = {x[i] + b[i[1]]:.4g}. For large |z|, exp(2 z) "
                                     f"overflows: write tanh(z) = 1 - 2 / (exp(2 z) + 1), which "
                                     f"gives 1 when exp is inf and -1 when it is 0.")
    if not np.allclose(got, want, rtol=1e-6, atol=1e-9):
        hint = _gelu_diagnosis(x, b, got)
        if hint is None:
            err = np.abs(got - want)
            i = np.unravel_index(int(np.argmax(err)), err.shape)
            hint = (f"at index {tuple(int(k) for k in i)} (x = {x[i]:.4g}, b = {b[i[1]]:.4g}) "
                    f"you have {got[i]:.6g}, the reference {want[i]:.6g}. Compute u = x + b, "
                    f"z = k (u + a u^3), tanh(z) = 1 - 2 / (exp(2 z) + 1), "
                    f"then 0.5 u (1 + tanh(z)).")
        raise ExerciseError(EX_GELU, f"float64 result differs from the reference; {hint}")
    # float32, a non-square shape, rows handed out to threads
    x32 = rng.normal(0.0, 1.5, size=(64, 96)).astype(np.float32)
    b32 = rng.normal(0.0, 0.5, size=96).astype(np.float32)
    out32 = np.empty_like(x32)
    got32 = np.asarray(attempt(EX_GELU, bias_gelu_fused, x32, b32, out32))
    if got32.dtype != np.float32:
        raise ExerciseError(EX_GELU, f"float32 input gave a {got32.dtype} result; write into "
                                     f"the float32 `out` you were given and return it.")
    want32 = bias_gelu_unfused(x32.astype(np.float64), b32.astype(np.float64))
    if not np.allclose(got32, want32, rtol=2e-6, atol=2e-6):
        err = np.abs(got32 - want32)
        i = np.unravel_index(int(np.argmax(err)), err.shape)
        raise ExerciseError(EX_GELU, f"float32 (64, 96): at index {tuple(int(k) for k in i)} "
                                     f"you have {got32[i]:.6g}, the reference {want32[i]:.6g}. "
                                     f"Loop over every row i and column j of x.shape.")
    if not _is_compiled(bias_gelu_fused):
        raise ExerciseError(EX_GELU, "the values are right, but this is a plain Python function: "
                                     "a Python loop over 2048 x 512 elements takes seconds. "
                                     "Put @njit(parallel=True) above `def` and use prange for "
                                     "the loop over rows.")
    one_thread = _one_thread_reason(bias_gelu_fused)
    if one_thread:
        raise ExerciseError(EX_GELU, f"the values are right, but {one_thread} The trainer "
                                     f"runs this kernel on every MLP of every step, so it "
                                     f"must use every core: loop over the rows with "
                                     f"`for i in prange(rows)` under @njit(parallel=True).")
    times = measure(bias_gelu_fused, bias_gelu_unfused, rng, max(repeats, 3))
    if refusal(times, [], 1) is not None:     # measured again before a refusal stands
        times = measure(bias_gelu_fused, bias_gelu_unfused, rng, max(2 * repeats, 5))
        why = refusal(times, slow_causes(bias_gelu_fused), max(2 * repeats, 5))
        if why is not None:
            raise ExerciseError(EX_GELU, why)
    save_piece("bias_gelu_forward", bias_gelu_fused, EX_GELU)
    passed(EX_GELU, "matches the reference in float64 and float32. Float32 timings:\n  "
                    + "\n  ".join(speed_report(times, calls(bias_gelu_fused, "tanh"),
                                               32768 * 512 * 4)))


def _one_thread_reason(fn) -> str:
    """Why a compiled kernel runs on one thread only, or "" when it can use them all."""
    if not getattr(fn, "targetoptions", {}).get("parallel"):
        return ("it is compiled without parallel=True, so numba runs it on one thread "
                "(prange is then a plain range).")
    if calls(fn, "range") and not calls(fn, "prange"):
        return ("its loops use range, not prange: parallel=True shares only prange loops "
                "between threads, so this one runs on one thread.")
    chunks = fixed_prange_count(fn)
    if chunks is not None:
        import numba            # loaded already: the kernel is compiled
        return (f"its prange runs over {chunks} pieces of work fixed in the code, so at most "
                f"{chunks} thread{'s' if chunks > 1 else ''} share the rows, whatever the "
                f"machine offers (numba has {numba.get_num_threads()} here, and a larger "
                f"machine more).")
    return ""


def fixed_prange_count(fn) -> int | None:
    """The number of iterations of the kernel's prange when the code fixes it (prange(2),
    or a name set to a number), below the rows of any shape the trainer runs; else None."""
    node = function_syntax(fn)
    if node is None:
        return None
    constants = {}
    for sub in ast.walk(node):
        if (isinstance(sub, ast.Assign) and len(sub.targets) == 1
                and isinstance(sub.targets[0], ast.Name)):
            try:
                constants[sub.targets[0].id] = int(ast.literal_eval(sub.value))
            except (ValueError, TypeError, SyntaxError):
                constants.pop(sub.targets[0].id, None)
    for loop in ast.walk(node):
        if isinstance(loop, ast.For) and is_call(loop.iter, "prange") and loop.iter.args:
            arg = loop.iter.args[-1] if len(loop.iter.args) < 3 else None
            count = None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, int):
                count = arg.value
            elif isinstance(arg, ast.Name) and arg.id in constants:
                count = constants[arg.id]
            if count is not None and count < 256:
                return count
    return None


# --------------------------------------------------------------- 10.2
def _xent_case(exercise, fn, logits, targets):
    buf = logits.copy()
    loss = attempt(exercise, fn, buf, targets)
    return loss, buf


def _xent_loss_diagnosis(loss, logits, targets, buf) -> str:
    """The slip behind a wrong loss on ordinary logits, named without the formula."""
    n = logits.shape[0]
    rows = np.arange(n)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_total = np.log(np.exp(shifted).sum(axis=1))
    per_row = log_total - shifted[rows, targets]
    if math.isclose(loss, float(np.mean(log_total + logits.max(axis=1) - buf[rows, targets])),
                    rel_tol=1e-9):
        return ("the target's logit was read after the row had been overwritten with its "
                "gradient; read it first.")
    if math.isclose(loss, float(np.mean(log_total - logits[rows, targets])), rel_tol=1e-9):
        return ("the shift subtracted before exp never came back into the loss: the loss of "
                "a row does not depend on how its logits were shifted.")
    if math.isclose(loss, float(np.median(per_row)), rel_tol=1e-9):
        return "this is the median of the row losses; the loss is their mean."
    if math.isclose(loss, float(per_row[0]), rel_tol=1e-9):
        return "this is the first row's loss alone; the loss is the mean over all N rows."
    relative = abs(loss - float(np.mean(per_row))) / abs(float(np.mean(per_row)))
    if relative < 1e-5:
        digits = int(-math.log10(relative))
        return (f"yours agrees with the reference to {digits} significant digits only, where "
                f"float64 logits keep about 16: a difference of the size of a float32 "
                f"rounding. Look for a sum or a product of your loop kept in float32.")
    return (f"the row losses should average to {float(np.mean(per_row)):.8g} (the first row's "
            f"is {float(per_row[0]):.8g}): work out one row by hand, as the negative log of "
            f"the target's softmax probability, and compare it with your loop's.")


def _xent_gradient_diagnosis(buf, want_grad, targets) -> str:
    """The slip behind a wrong gradient left in the buffer, named without the formula."""
    n = buf.shape[0]
    probs = want_grad * n
    onehot = np.zeros_like(probs)
    onehot[np.arange(n), targets] = 1.0
    probs += onehot
    if np.allclose(buf, want_grad * n, rtol=1e-9, atol=1e-12):
        hint = ("this is the gradient of the summed loss: divide every entry by N, the "
                "number of rows, because the loss you return is the mean.")
    elif np.allclose(buf, probs / n, rtol=1e-9, atol=1e-12):
        hint = "subtract 1/N at each row's target: the gradient is (softmax - onehot) / N."
    elif np.allclose(buf, probs, rtol=1e-9, atol=1e-12):
        hint = ("the buffer holds the probabilities: subtract the one-hot target and "
                "divide by N to turn them into the gradient.")
    elif np.allclose(buf, -want_grad, rtol=1e-9, atol=1e-12):
        hint = "the sign is flipped: the gradient is (softmax - onehot) / N."
    else:
        err = np.abs(buf - want_grad)
        i = np.unravel_index(int(np.argmax(err)), err.shape)
        yours, right = differing_digits(float(buf[i]), float(want_grad[i]), least=6)
        hint = (f"at {tuple(int(k) for k in i)} you have {yours}, expected "
                f"{right}. Work that entry out by hand from its row and "
                f"compare it with each quantity your loop computes on the way.")
    return hint


def _xent_slip(logits, targets, shift="row max", through_probability=False):
    """(mean loss, gradient) of the fused loss with one slip, in numpy, on the same input:
    the shift taken from the whole batch, from the row's first logit or from its target's,
    or the loss taken as the log of the target's probability."""
    n = logits.shape[0]
    rows = np.arange(n)
    m = {"row max": logits.max(axis=1, keepdims=True),
         "batch max": np.full((n, 1), logits.max()),
         "first logit": logits[:, :1],
         "target logit": logits[rows, targets][:, None]}[shift]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e = np.exp(logits - m)
        total = e.sum(axis=1, keepdims=True)
        p = e / total
        losses = (-np.log(p[rows, targets]) if through_probability else
                  np.log(total[:, 0]) + m[:, 0] - logits[rows, targets])
        grad = p.copy()
        grad[rows, targets] -= 1.0
        return float(np.mean(losses)), grad / n


# (the slip's arguments to _xent_slip, what it is): each named only when it gives the
# learner's loss and gradient on the same input
_XENT_SLIPS = (
    (dict(shift="batch max"),
     "a shift shared by the whole batch leaves a row far below the batch's largest logit "
     "with exps that are all 0. Each row needs a shift of its own."),
    (dict(shift="first logit"),
     "your shift is the row's first logit: a shift below the row's largest logit lets the "
     "exp of the largest overflow."),
    (dict(shift="target logit"),
     "your shift is the target's logit: where the target is not the row's largest logit, "
     "the exp of the largest overflows."),
    (dict(through_probability=True),
     "the target's probability underflows to 0 before its log is taken, though its loss "
     "is a plain 800 (and a little): work in the log domain, not through the probability."),
)


def _same_result(loss, buf, want_loss, want_grad) -> bool:
    """Do (loss, buffer) equal (want_loss, want_grad), non-finite values alike?"""
    if not (math.isfinite(loss) and math.isfinite(want_loss)):
        same_loss = (loss == want_loss) or (math.isnan(loss) and math.isnan(want_loss))
    else:
        same_loss = math.isclose(loss, want_loss, rel_tol=1e-6, abs_tol=1e-12)
    return same_loss and buf.shape == want_grad.shape and np.allclose(
        buf, want_grad, rtol=1e-6, atol=1e-12, equal_nan=True)


def _xent_where_it_differs(what, loss, buf, want_loss, want_grad) -> str:
    """The neutral hint: on which case the loss or the gradient differs, and by how much."""
    if not math.isclose(loss, want_loss, rel_tol=1e-9):
        yours, right = differing_digits(loss, want_loss)
        return f"on {what}, your mean loss is {yours}, the reference's {right} (in nats)."
    with np.errstate(invalid="ignore"):
        err = np.where(np.isfinite(buf), np.abs(buf - want_grad), np.inf)
    i = np.unravel_index(int(np.argmax(err)), err.shape)
    yours, right = differing_digits(float(buf[i]), float(want_grad[i]))
    return (f"on {what}, the loss is right, but the gradient left in the buffer at (row, "
            f"column) {tuple(int(k) for k in i)} is {yours}, the reference's {right}.")


def _xent_stability_cases(rng):
    """(logits, targets, what the case is): rows a shift for the whole batch, a shift
    below the row's maximum, or a log taken of a probability gets wrong; the largest
    logit first, last and away from the target tell which shift it was."""
    v = 11
    levels = np.array([[1000.0], [-1000.0]]) + rng.normal(0.0, 2.0, size=(2, v))
    spread = np.linspace(0.0, 800.0, v)[None, :]
    return [
        (levels, np.array([3, 7]),
         "two rows, one with logits near +1000 and one near -1000"),
        (spread[:, ::-1].copy(), np.array([v // 2]),
         "a row whose logits fall from 800 to 0"),
        (spread.copy(), np.array([v - 1]),
         "a row whose logits rise from 0 to 800, its target the largest"),
        (spread.copy(), np.array([0]),
         "a row whose logits rise from 0 to 800, its target 800 below the largest"),
    ]


def _xent_stability_hint(runs, what, want_loss, want_grad) -> str:
    """The slip whose output the learner's reproduces on this case and on the cases before
    it (`runs`: (logits, targets, the learner's loss and buffer), this case last), else
    where it differs."""
    logits, targets, loss, buf = runs[-1]
    for slip, hint in _XENT_SLIPS:
        if all(_same_result(l, b, *_xent_slip(x, t, **slip)) for x, t, l, b in runs):
            return f"{what} gives a wrong result: {hint}"
    return _xent_where_it_differs(what, loss, buf, want_loss, want_grad)


def check_softmax_cross_entropy(softmax_cross_entropy_fused) -> None:
    """The mean loss is returned; the buffer ends up holding (softmax - onehot) / N."""
    rng = np.random.default_rng(102)
    n, v = 6, 11
    logits = rng.normal(0.0, 2.0, size=(n, v))
    targets = rng.integers(0, v, size=n).astype(np.int64)
    want_loss, want_grad = softmax_cross_entropy_reference(logits, targets)
    loss, buf = _xent_case(EX_XENT, softmax_cross_entropy_fused, logits, targets)
    if loss is None:
        raise ExerciseError(EX_XENT, "the function returned None; return the mean loss "
                                     "over the rows (a float).")
    try:
        loss = float(loss)
    except (TypeError, ValueError):
        raise ExerciseError(EX_XENT, f"return the mean loss as one number, got "
                                     f"{type(loss).__name__}.") from None
    if not math.isclose(loss, want_loss, rel_tol=1e-9):
        if math.isclose(loss, want_loss * n, rel_tol=1e-9):
            hint = "this is the sum of the row losses; return their mean (divide by N)."
        elif math.isclose(loss, -want_loss, rel_tol=1e-9):
            hint = "the sign is flipped: the loss is log(sum exp) + max - logits[target]."
        else:
            hint = _xent_loss_diagnosis(loss, logits, targets, buf)
        yours, right = differing_digits(loss, want_loss)
        raise ExerciseError(EX_XENT, f"the loss is {yours}, expected {right}; {hint}")
    if np.allclose(buf, logits):
        raise ExerciseError(EX_XENT, "the loss is right but `logits` still holds the logits. "
                                     "The fused kernel overwrites them with the gradient "
                                     "(softmax - onehot) / N, so no second (N, V) array exists.")
    if not np.allclose(buf, want_grad, rtol=1e-9, atol=1e-12):
        hint = _xent_gradient_diagnosis(buf, want_grad, targets)
        raise ExerciseError(EX_XENT, f"the gradient left in `logits` is wrong; {hint}")
    # numerical stability: logits of a thousand overflow exp in float64
    big = logits * 50.0 + 1000.0
    want_loss, want_grad = softmax_cross_entropy_reference(big, targets)
    loss, buf = _xent_case(EX_XENT, softmax_cross_entropy_fused, big, targets)
    if not (np.isfinite(float(loss)) and np.all(np.isfinite(buf))):
        raise ExerciseError(EX_XENT, "with logits near 1000, exp overflows and the result is "
                                     "inf or nan. Subtract each row's maximum before exp: "
                                     "softmax does not change, and every exp is at most 1.")
    if not (math.isclose(float(loss), want_loss, rel_tol=1e-9)
            and np.allclose(buf, want_grad, rtol=1e-9, atol=1e-12)):
        raise ExerciseError(EX_XENT, "with logits near 1000 the result drifts from the "
                                     "reference: the shift subtracted before exp must come "
                                     "back into the loss, exactly once.")
    runs = []
    for case_logits, case_targets, what in _xent_stability_cases(rng):
        want_loss, want_grad = softmax_cross_entropy_reference(case_logits, case_targets)
        loss, buf = _xent_case(EX_XENT, softmax_cross_entropy_fused, case_logits, case_targets)
        runs.append((case_logits, case_targets, float(loss), buf))
        if not (math.isclose(float(loss), want_loss, rel_tol=1e-9)
                and np.allclose(buf, want_grad, rtol=1e-9, atol=1e-12)):
            raise ExerciseError(EX_XENT, _xent_stability_hint(runs, what, want_loss,
                                                              want_grad))
    # float32 buffer, more rows than threads, int32 targets
    l32 = rng.normal(0.0, 3.0, size=(32, 50)).astype(np.float32)
    t32 = rng.integers(0, 50, size=32).astype(np.int32)
    want_loss, want_grad = softmax_cross_entropy_reference(l32.astype(np.float64), t32)
    loss, buf = _xent_case(EX_XENT, softmax_cross_entropy_fused, l32, t32)
    if buf.dtype != np.float32 or not np.allclose(buf, want_grad, rtol=1e-4, atol=1e-6) \
            or not math.isclose(float(loss), want_loss, rel_tol=1e-5):
        raise ExerciseError(EX_XENT, "float32 logits (32, 50) with int32 targets: the loss or "
                                     "the gradient is off. Loop over every row; accumulate the "
                                     "sum of exps in a float64 local variable.")
    save_piece("softmax_cross_entropy", softmax_cross_entropy_fused, EX_XENT)
    passed(EX_XENT, "loss and in-place gradient match the reference, also for logits near "
                    "1000, rows far apart, a spread of 800, and in float32.")


# --------------------------------------------------------------- 10.3
def attention_reference(qkv, n_head):
    """(out (B, T, C), lse (B, H, T)) of causal attention with the whole masked
    (T x T) score matrix: what the online softmax must reproduce."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    hs = C // n_head
    q, k, v = (qkv[..., i * C:(i + 1) * C].reshape(B, T, n_head, hs).transpose(0, 2, 1, 3)
               for i in range(3))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hs)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    top = s.max(-1, keepdims=True)
    e = np.exp(s - top)
    total = e.sum(-1, keepdims=True)
    out = (e / total) @ v
    lse = (top + np.log(total))[..., 0]
    return out.transpose(0, 2, 1, 3).reshape(B, T, C), lse


def _flash_case(fn, B, T, H, C, seed, tile=None):
    rng = np.random.default_rng(seed)
    qkv = rng.normal(size=(B, T, 3 * C))
    got = attempt(EX_FLASH, fn, qkv, H) if tile is None else attempt(EX_FLASH, fn, qkv, H, tile)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise ExerciseError(EX_FLASH, "return two arrays: (out of shape (B, T, C), lse of "
                                      "shape (B, H, T)).")
    out, lse = (np.asarray(x) for x in got)
    want_out, want_lse = attention_reference(qkv, H)
    where = f"B={B} T={T} H={H} C={C}" + (f" tile={tile}" if tile else "")
    if out.shape != want_out.shape or lse.shape != want_lse.shape:
        raise ExerciseError(EX_FLASH, f"{where}: out has shape {out.shape} and lse {lse.shape}; "
                                      f"expected {want_out.shape} and {want_lse.shape}.")
    if not np.all(np.isfinite(out)):
        raise ExerciseError(EX_FLASH, f"{where}: the output holds inf or nan. Start each row's "
                                      "running maximum from the first tile's maximum (column 0 "
                                      "is never masked), and mask with -inf before exp, not "
                                      "after.")
    if not np.allclose(out, want_out, rtol=1e-9, atol=1e-12):
        if np.allclose(lse, want_lse, rtol=1e-9, atol=1e-12):
            hint = ("the log-sum-exp is right, so the running sum is; the output is not. "
                    "When a tile raises the running maximum, the output accumulated so far "
                    "is still weighted for the old maximum: it needs the same correction "
                    "the running sum gets.")
        else:
            hint = _flash_diagnosis(out, want_out, qkv.shape[1])
        raise ExerciseError(EX_FLASH, f"{where}: the output differs from the full softmax; "
                                      f"{hint}")
    if not np.allclose(lse, want_lse, rtol=1e-9, atol=1e-12):
        raise ExerciseError(EX_FLASH, f"{where}: the output is right but lse is not. lse is "
                                      "the log of the row's sum of exps of its raw, unshifted "
                                      "scores; a sum kept relative to the running maximum "
                                      "needs that maximum back in lse.")


def _flash_diagnosis(out, want_out, T):
    """Which rows are wrong tells the mistakes apart: row 0 sees key 0 alone, so only a
    leak of later keys (a missing mask) can make it wrong; a row is first wrong where its
    keys span a second tile when the running sum is not rescaled."""
    row_error = np.abs(out - want_out).max(axis=(0, 2))
    first = int(np.flatnonzero(row_error > 1e-9 * (1.0 + np.abs(want_out).max()))[0])
    if first == 0:
        return ("row 0 is wrong, and row 0 attends to key 0 alone (its output is v_0): later "
                "keys leak in. In the diagonal tile, set the scores of the future columns "
                "(j > i) to -inf before the exp.")
    return (f"rows 0 to {first - 1} are right and row {first} is the first wrong one: the "
            f"rows that see a single tile of keys come out right, so the merge of a second "
            f"tile is wrong. When a tile raises the running maximum, the running sum and the "
            f"running output were accumulated for the old maximum and must be brought to the "
            f"new one before the tile's terms are added; and check that the loop over key "
            f"tiles reaches column i (T = {T} is not always a multiple of the tile).")


def check_online_softmax(online_softmax_attention) -> None:
    """Equal to the full softmax; no (T x T) array; saved as a trainer piece."""
    import tracemalloc
    for case in ((2, 5, 2, 6), (1, 37, 3, 12), (2, 16, 1, 4), (1, 19, 2, 2), (1, 1, 1, 1)):
        _flash_case(online_softmax_attention, *case, seed=sum(case))
    _flash_case(online_softmax_attention, 1, 23, 2, 8, seed=3, tile=7)
    # memory: at T = 1024 one head's score matrix is 8 MB; the tiles are 16 x 16
    rng = np.random.default_rng(103)
    T, C = 1024, 16
    qkv = rng.normal(size=(1, T, 3 * C))
    tracemalloc.start()
    try:
        attempt(EX_FLASH, online_softmax_attention, qkv, 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    square = T * T * 8
    if peak >= square // 4:
        raise ExerciseError(EX_FLASH, f"right answers, but at T={T} the function allocated "
                                      f"{peak / 1e6:.1f} MB at its peak, a (T x T) matrix "
                                      f"being {square / 1e6:.1f} MB. Compute scores one "
                                      f"(tile x tile) block at a time; never the whole row "
                                      f"block against all keys at once.")
    save_piece("flash_attention_forward", online_softmax_attention, EX_FLASH)
    passed(EX_FLASH, f"equal to the full masked softmax (output and log-sum-exp) for odd T, "
                     f"T shorter than a tile and not a multiple of it, one head, head size 1; "
                     f"at T={T} its allocations stayed below a quarter of one (T x T) "
                     f"matrix ({square / 1e6:.1f} MB).")


# ------------------------------------------------------------------ the notebook
#: Each exercise function of the lesson, and its exercise.
EXERCISE_FUNCTIONS = {"bias_gelu_fused": EX_GELU, "softmax_cross_entropy_fused": EX_XENT,
                      "online_softmax_attention": EX_FLASH}


def name_unfinished_exercises() -> None:
    """In the notebook, a cell that needs an unfinished exercise of this lesson says which."""
    from . import _core
    _core.name_unfinished_exercises(EXERCISE_FUNCTIONS)
    uncompile_stubs(EXERCISE_FUNCTIONS)
