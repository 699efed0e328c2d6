"""Compiled exercise stubs that say which exercise they belong to.

* `uncompile_stubs`: in a notebook, an exercise cell still holding its `@njit` stub binds
  the stub's plain Python function in place of numba's dispatcher. A compiled stub raises
  its NotImplementedError from compiled code, which has no frame in the notebook, so a
  cell that calls it cannot tell which exercise it needs; the Python function raises the
  same error from the notebook, and the cell says which exercise to finish.
"""
from __future__ import annotations

import ast

from ._core import function_syntax, register_once


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

    register_once(shell, "post_run_cell", "_after_each_cell_of_stubs", after_each_cell)
