"""What the checks of lessons 10-13 share beyond `_core`: compiled stubs that say which
exercise they belong to, numba's compile errors as one line, and numbers printed with
the digits that show where two of them part.

* `uncompile_stubs`: in a notebook, an exercise cell still holding its `@njit` stub binds
  the stub's plain Python function in place of numba's dispatcher. A compiled stub raises
  its NotImplementedError from compiled code, which has no frame in the notebook, so a
  cell that calls it cannot tell which exercise it needs; the Python function raises the
  same error from the notebook, and the cell says which exercise to finish.
* `attempt`: `_core.attempt`, with numba's TypingError on the learner's kernel turned into
  one line naming the call numba could not compile.
* `differing_digits`: two numbers printed with as many significant digits as it takes to
  tell them apart (float32's 7 are not enough to show a float32 slip in a float64 loss).
"""
from __future__ import annotations

import ast
import re

from ._core import ExerciseError, attempt as _attempt, function_syntax


# ------------------------------------------------------------------ compiled stubs
def is_stub(fn) -> bool:
    """Does `fn` (a numba dispatcher or a function) always raise NotImplementedError: a
    top-level `raise NotImplementedError(...)` in its body, with no return before it?"""
    node = function_syntax(fn)
    if node is None:
        return False
    for statement in node.body:
        if isinstance(statement, ast.Return):
            return False
        if isinstance(statement, ast.Raise) and statement.exc is not None:
            raised = statement.exc.func if isinstance(statement.exc, ast.Call) else statement.exc
            if isinstance(raised, ast.Name) and raised.id == "NotImplementedError":
                return True
    return False


def uncompile_stubs(functions, shell=None) -> None:
    """After each cell, bind every exercise function of `functions` that is a numba
    dispatcher around a stub to its Python function (see the module's docstring). A
    finished kernel is left as it is. Outside IPython this does nothing."""
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
        if shell is None:
            return

    def after_each_cell(result=None):
        for name in functions:
            fn = shell.user_ns.get(name)
            if hasattr(fn, "py_func") and is_stub(fn):
                shell.user_ns[name] = fn.py_func

    previous = getattr(shell, "_after_each_cell_of_stubs", None)
    if previous is not None:            # the lesson's first cell ran again: one hook, not two
        shell.events.unregister("post_run_cell", previous)
    shell.events.register("post_run_cell", after_each_cell)
    shell._after_each_cell_of_stubs = after_each_cell


# ------------------------------------------------------------------ numba's errors
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


def attempt(exercise: str, fn, *args, **kwargs):
    """`_core.attempt`, and numba's TypingError on `fn` as one line that names the call."""
    try:
        from numba.core.errors import TypingError
    except ImportError:                  # numba is a dependency; this only keeps it optional
        TypingError = ()                 # noqa: N806
    try:
        return _attempt(exercise, fn, *args, **kwargs)
    except TypingError as err:
        raise ExerciseError(exercise, numba_typing_line(err)) from None


# ------------------------------------------------------------------ numbers
def differing_digits(a: float, b: float, least: int = 8) -> tuple[str, str]:
    """`a` and `b` with the fewest significant digits (at least `least`, at most 17) that
    print them differently; equal numbers print alike."""
    for digits in range(least, 18):
        x, y = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if x != y:
            return x, y
    return f"{a:.17g}", f"{b:.17g}"
