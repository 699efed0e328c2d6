"""The small machinery every exercise check shares.

* `ExerciseError`: what a failed check raises. Its message always starts with
  "Exercise NN.k (title):" so a learner (and the test that runs the untouched
  student notebooks) can see which exercise is not done, followed by a hint.
  In a notebook it shows only that message, not the checker's traceback.
* `attempt`: call the learner's function, turning `NotImplementedError` into
  the exercise's own "not done yet" message, and an error numpy raised on one of
  its lines into one line that names the call (`numpy_error`).
* `name_unfinished_exercises`: in a notebook, a cell that needs an exercise
  the learner has not finished (or a value an earlier cell makes with it) says
  which, in one line, instead of a NameError or NotImplementedError traceback.
(The pieces a passed check saves are kept by `coursework.pieces`.)
"""
from __future__ import annotations

import re

import numpy as np


class ExerciseError(AssertionError):
    """A check found a wrong (or missing) answer. The message carries a hint."""

    def __init__(self, exercise: str, message: str):
        self.exercise = exercise
        self.detail = message
        #: the learner's own error that `attempt` named in one line (numpy's, numba's)
        self.stopped_by: BaseException | None = None
        super().__init__(f"Exercise {exercise}: {message}")

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for this error: the message alone, in red, without the
        traceback through the checker (whose source would also show the hints of
        other wrong answers). The cell still fails, so `pytest --nbval` still does."""
        red, plain = "\x1b[1;31m", "\x1b[0m"
        first, *rest = str(self).splitlines() or [""]
        return [f"{red}{type(self).__name__}{plain}: {first}", *rest]


def attempt(exercise: str, fn, *args, **kwargs):
    """Call the learner's `fn`, naming the exercise if it is still a stub, and turning an
    error numpy raised on a line of `fn` (`numpy_error`), or numba's failure to compile
    it (`numba_typing_line`), into one line that names it."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise ExerciseError(
            exercise,
            "not done yet. Replace the lines `# YOUR CODE HERE` and "
            "`raise NotImplementedError()` in the exercise cell with your code, "
            "run that cell, then run this check again.") from None
    except Exception as err:
        if _numba_typing_error(err):
            line = numba_typing_line(err)
        elif isinstance(err, (TypeError, ValueError, IndexError)):
            line = numpy_error(fn, err)
        else:
            line = None
        if line is None:
            raise
        named = ExerciseError(exercise, line)
        named.stopped_by = err
        raise named from None


def _numba_typing_error(err: BaseException) -> bool:
    """Is `err` numba's TypingError (numba imported only where it is already loaded)?"""
    import sys
    errors = sys.modules.get("numba.core.errors")
    return errors is not None and isinstance(err, errors.TypingError)


def numba_typing_line(err: BaseException) -> str:
    """numba's long TypingError as one line: what it could not type, and on which line of
    the kernel."""
    text = str(err)
    lines = [s.strip() for s in text.splitlines() if s.strip()]
    what = next((s for s in lines if not s.startswith(("Failed in", "File ", "During:", "^",
                                                      "<source elided>", "def "))),
                lines[0] if lines else type(err).__name__)
    code = None
    for k, s in enumerate(lines):
        if s.startswith("File ") and k + 1 < len(lines):
            rest = [r for r in lines[k + 1:k + 5] if not r.startswith(("def ", "<source",
                                                                     "^", "During:"))]
            code = rest[0] if rest else None
            break
    known = ""
    if re.search(r"Unknown attribute '(at|reduceat|accumulate|outer)'", what):
        known = (" (numba compiles no ufunc methods such as np.add.at: write the loop of "
                 "additions yourself)")
    where = f" at `{code}`" if code else ""
    return f"numba could not compile your kernel{where}: {what}{known}."


# What a numpy message means on the calls a learner makes, where the message alone misleads.
_NUMPY_NOTES = {
    "return arrays must be of ArrayType": "a ufunc such as np.maximum takes two inputs; a "
                                          "third positional argument is the array it writes "
                                          "its result into (`out`), not a third input",
    "output array": "a ufunc such as np.maximum takes two inputs; a third positional "
                    "argument is the array it writes its result into (`out`)",
    "could not be broadcast": "the two arrays' shapes do not line up element by element",
    "mismatch in its core dimension": "in a @ b, the last dimension of a must equal the "
                                      "first (or next to last) dimension of b",
}

# The messages numpy's own array methods and operators raise from C, with no numpy frame in
# the traceback: `g.reshape(3, 5)`, `x.T @ y`, `a + b`, `if a > 0:`, `a[7]`, `a.argmax(3)`.
_NUMPY_MESSAGES = re.compile("|".join((
    r"cannot reshape array of size \d+ into shape",
    r"operands could not be broadcast together",
    r"could not broadcast input array from shape",
    r"non-broadcastable output operand",
    r"has a mismatch in its core dimension",
    r"shapes \(.*\) and \(.*\) not aligned",
    r"is out of bounds for (axis \d+ with size|array of dimension)",
    r"too many indices for array",
    r"boolean index did not match indexed array",
    r"truth value of an array with more than one element is ambiguous",
    r"setting an array element with a sequence",
    r"axes don't match array",
    r"cannot select an axis to squeeze out",
    r"arrays used as indices must be of integer",
)))


def _raise_statement(tb) -> bool:
    """Did the traceback entry `tb` stop at a `raise` the code itself wrote?"""
    import dis
    return any(i.offset == tb.tb_lasti and i.opname in ("RAISE_VARARGS", "RERAISE")
               for i in dis.get_instructions(tb.tb_frame.f_code))


def _numpy_raised_it(err: BaseException) -> bool:
    """Is `err` one of numpy's own exceptions (AxisError, a ufunc's type error, LinAlgError)
    or one of the messages numpy's array methods and operators raise?"""
    return (type(err).__module__.split(".")[0] == "numpy"
            or _NUMPY_MESSAGES.search(str(err)) is not None)


def numpy_error(fn, err: BaseException) -> str | None:
    """One line for an error numpy raised inside the learner's `fn`, or None for any other
    error: raised in numpy's own code called from a line of `fn`, or on a line of `fn` itself
    by numpy's C code (an array method or operator: `g.reshape(3, 5)`, `x.T @ y`), told by
    numpy's exception type or message, or by a line that calls numpy. An error the learner's
    own `raise` statement raised is never numpy's."""
    code = getattr(getattr(fn, "py_func", fn), "__code__", None)
    frames, tb = [], err.__traceback__
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    mine = [k for k, f in enumerate(frames) if f.tb_frame.f_code is code]
    if code is None or not mine:
        return None
    at = frames[mine[-1]]
    import linecache
    source = linecache.getline(at.tb_frame.f_code.co_filename, at.tb_lineno).strip()
    below = frames[mine[-1] + 1:]
    note = next((f" ({text})" for key, text in _NUMPY_NOTES.items() if key in str(err)), "")
    if below:
        from_numpy = all("numpy" in f.tb_frame.f_code.co_filename for f in below)
    else:
        from_numpy = not _raise_statement(at) and (
            _numpy_raised_it(err) or "np." in source or "numpy." in source
            or (not source and bool(note)))
    if not from_numpy:
        return None
    where = f"`{source}`" if source else f"line {at.tb_lineno}"
    return (f"numpy stopped your function at {where}: {type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}{note}.")


class UnfinishedExercise(Exception):
    """A lesson's cell needs an exercise's function that is missing or still a stub, or a
    value that an earlier cell makes with it and did not finish."""

    def __init__(self, exercise: str, name: str, never_ran: bool, made_earlier: bool = False):
        self.exercise = exercise
        if made_earlier:
            why = (f"needs `{name}`, which an earlier cell makes with your exercise and did "
                   f"not finish")
            again = "run that cell and this one again"
        else:
            why = (f"needs `{name}`, whose exercise cell has not run" if never_ran
                   else f"runs your `{name}`, which is still the stub")
            again = "run this cell again"
        super().__init__(f"finish exercise {exercise} first: this cell {why}. Complete it, "
                         f"run it and its check, then {again}.")

    def _render_traceback_(self) -> list[str]:
        """One line in a notebook, as ExerciseError shows."""
        red, plain = "\x1b[1;31m", "\x1b[0m"
        return [f"{red}{type(self).__name__}{plain}: {self}"]


def unfinished_exercise(error: BaseException, functions: dict[str, str], namespace: dict,
                        made_by: dict[str, str] | None = None):
    """The UnfinishedExercise that `error` stands for, or None when it is some other error.

    `functions` maps each exercise function's name to its exercise ("04.3 (spot_check)"). A
    NameError for one of them means its cell never ran; a NotImplementedError raised in one
    of them, defined in `namespace` (the notebook's), means the stub ran. `made_by` maps
    the values that a cell stopped by an unfinished exercise did not make to that
    exercise: a NameError for one of them is named too."""
    name = getattr(error, "name", None) if isinstance(error, NameError) else None
    if name in functions:
        return UnfinishedExercise(functions[name], name, never_ran=True)
    if name in (made_by or {}):
        return UnfinishedExercise(made_by[name], name, never_ran=True, made_earlier=True)
    if isinstance(error, NotImplementedError):
        tb = error.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None:
            name = tb.tb_frame.f_code.co_name
            if name in functions and tb.tb_frame.f_globals is namespace:
                return UnfinishedExercise(functions[name], name, never_ran=False)
    return None


def assigned_names(code: str) -> set[str]:
    """The names a cell's code binds at its top level (assignments, loops, with, def,
    class), not inside its functions; none when it does not parse."""
    import ast
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    names, todo = set(), list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)            # its body binds the function's names, not ours
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        todo.extend(ast.iter_child_nodes(node))
    return names


def function_syntax(fn):
    """The syntax tree of a learner's function (a numba kernel's Python source), or None
    when its source cannot be read back."""
    import ast
    import inspect
    import textwrap
    try:
        source = textwrap.dedent(inspect.getsource(getattr(fn, "py_func", fn)))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return None
    return next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)), None)


def is_call(node, name: str) -> bool:
    """Is `node` a call of `name` or of `something.name`?"""
    import ast
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Name) and f.id == name) or (isinstance(f, ast.Attribute)
                                                         and f.attr == name)


def register_once(shell, event: str, attribute: str, hook) -> None:
    """Register `hook` for the shell's `event`, replacing the one an earlier run of the
    lesson's first cell left under `attribute`: one hook, not two. The earlier one is
    unregistered only if it is still registered (another user of the shell may have
    removed it)."""
    previous = getattr(shell, attribute, None)
    if previous in shell.events.callbacks[event]:
        shell.events.unregister(event, previous)
    shell.events.register(event, hook)
    setattr(shell, attribute, hook)


def name_unfinished_exercises(functions: dict[str, str], shell=None) -> None:
    """In IPython, show a NameError or NotImplementedError that comes from an unfinished
    exercise of `functions` as the one line of `UnfinishedExercise`; every other error shows
    as usual. The cell still fails (so Run All stops there and `pytest --nbval` fails).

    A cell stopped that way leaves its results half made (a list filled for two sizes of
    five). The names it had bound for the first time in that run are removed, and a later
    cell that needs one of them says which exercise to finish instead of failing on half a
    result; names that existed before the cell ran keep their values. Outside IPython this
    does nothing."""
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
        if shell is None:
            return
    made_by: dict[str, str] = {}
    cell = {"names": set(), "code": ""}

    def before_each_cell(info):
        cell["names"] = set(shell.user_ns)
        cell["code"] = shell.transform_cell(info.raw_cell or "")

    def show(shell, etype, value, tb, tb_offset=None):
        unfinished = unfinished_exercise(value, functions, shell.user_ns, made_by)
        if unfinished is None:
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
            return
        for name in assigned_names(cell["code"]) - cell["names"]:
            shell.user_ns.pop(name, None)
            made_by[name] = unfinished.exercise
        shell.showtraceback((UnfinishedExercise, unfinished, tb))

    register_once(shell, "pre_run_cell", "_before_each_cell_of_exercises", before_each_cell)
    shell.set_custom_exc((NameError, NotImplementedError), show)


def close(exercise: str, what: str, got, want, rtol: float = 1e-7, atol: float = 0.0,
          hint: str = "") -> None:
    """Raise ExerciseError unless `got` matches `want` in shape and value."""
    got_a = np.asarray(got)
    want_a = np.asarray(want)
    if got_a.shape != want_a.shape:
        raise ExerciseError(exercise, f"{what} has shape {got_a.shape}, expected "
                                      f"{want_a.shape}. {hint}".rstrip())
    if not np.allclose(got_a, want_a, rtol=rtol, atol=atol, equal_nan=False):
        err = np.abs(got_a - want_a)
        i = np.unravel_index(int(np.argmax(err)), err.shape) if err.ndim else ()
        raise ExerciseError(
            exercise,
            f"{what} is off: at index {tuple(int(k) for k in i)} you have "
            f"{got_a[i]!r}, expected {want_a[i]!r}. {hint}".rstrip())


def passed(exercise: str, detail: str = "") -> None:
    """Print the one deterministic line a passed check shows."""
    print(f"Exercise {exercise} passed." + (f" {detail}" if detail else ""))
