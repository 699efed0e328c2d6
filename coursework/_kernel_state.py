"""What a learner's piece could change in the process that loads it, taken down and put back.

`KernelState()` records, before a piece runs:

* the functions of the libraries every cell uses: numpy (its functions, and the methods
  of its array, scalar and ufunc types, such as `np.add.reduce` or `np.ndarray.sum`),
  math, numba's decorators, the builtins, time, os, signal, warnings, threading, gc;
* the engine's and the course's own modules, the classes defined there (`Tensor`) and
  the code object of every function among them (`numba.njit.__code__ = ...`);
* every numpy ufunc's own attributes (`np.maximum.reduce = ...` hides the method of
  that one ufunc, and `np.max` calls it), and the `sys.modules` entries of the engine,
  the course, numpy and numba (a replaced `sys.modules['engine.gradcheck']`);
* the process: working directory, environment variables, recursion limit, warning
  filters, signal handlers, interval timers, whether gc runs, the trace hooks.

`restore()` puts back whatever differs and returns its names, e.g.
['np.ufunc.reduce', 'the working directory']. Attributes a module gains (a lazily
imported submodule) are not changes; a replaced or removed one is. In the engine's
and the course's modules only functions, classes and modules count, so a cache a
module fills on first use is not mistaken for a change.
"""
from __future__ import annotations

import builtins
import ctypes
import gc
import math
import os
import signal
import sys
import threading
import time
import types
import warnings

import numba
import numba.core.decorators
import numpy as np

# every attribute of these is watched (a replaced constant such as math.pi counts too)
FULL_MODULES = {"np": np, "np.random": np.random, "np.linalg": np.linalg, "math": math,
                "numba": numba, "builtins": builtins}
# the functions, classes and submodules of these
CALLABLE_MODULES = {"np.fft": np.fft, "numba.core.decorators": numba.core.decorators,
                    "time": time, "os": os, "os.path": os.path, "signal": signal,
                    "warnings": warnings, "threading": threading, "gc": gc}
OWN_PACKAGES = ("engine", "coursework")
# types implemented in C, whose methods live in a dict Python code cannot reach but
# through gc: the piece's `gc.get_referents(np.ndarray.__dict__)[0]["sum"] = ...`
C_TYPES = {"np.ndarray": np.ndarray, "np.ufunc": np.ufunc, "np.generic": np.generic,
           "np.floating": np.floating, "np.float64": np.float64, "np.float32": np.float32,
           "np.integer": np.integer, "np.int64": np.int64, "int": int, "float": float,
           "list": list, "dict": dict, "tuple": tuple, "str": str, "object": object}
TIMERS = ("ITIMER_REAL", "ITIMER_VIRTUAL", "ITIMER_PROF")
# packages whose sys.modules entries are watched: replaced or removed ones are put back
MODULE_OWNERS = OWN_PACKAGES + ("numpy", "numba")
_MISSING = object()


def _is_code(value) -> bool:
    return callable(value) or isinstance(value, (types.ModuleType, property, classmethod,
                                                 staticmethod))


def _ufuncs() -> dict:
    """Label -> ufunc for numpy's ufuncs: each has a dict of its own, which hides the
    methods of np.ufunc (`np.maximum.reduce`) for that ufunc."""
    return {f"np.{name}": value for name, value in vars(np).items()
            if isinstance(value, np.ufunc)}


def _owned_entries() -> dict:
    return {name: module for name, module in list(sys.modules.items())
            if name.split(".")[0] in MODULE_OWNERS}


def _own_modules() -> dict:
    return {name: module for name, module in list(sys.modules.items())
            if isinstance(module, types.ModuleType) and name.split(".")[0] in OWN_PACKAGES}


def _type_dict(cls) -> dict:
    """The real, writable dict behind a type's read-only `__dict__` view."""
    return gc.get_referents(cls.__dict__)[0]


def _set_type_attribute(cls, key, value) -> None:
    try:
        if value is _MISSING:
            delattr(cls, key)
        else:
            setattr(cls, key, value)
    except (TypeError, AttributeError):         # a C type: write its dict, then tell Python
        if value is _MISSING:
            _type_dict(cls).pop(key, None)
        else:
            _type_dict(cls)[key] = value
        ctypes.pythonapi.PyType_Modified(ctypes.py_object(cls))


def _signal_handlers() -> dict:
    handlers = {}
    for number in signal.valid_signals():
        try:
            handlers[number] = signal.getsignal(number)
        except (ValueError, OSError):
            pass
    return handlers


def _timers() -> dict:
    """Which interval timers run (and how often they repeat): their time left moves."""
    if not hasattr(signal, "getitimer"):
        return {}
    return {name: (signal.getitimer(getattr(signal, name))[0] > 0,
                   signal.getitimer(getattr(signal, name))[1]) for name in TIMERS}


class KernelState:
    """A record of the state a piece could change; `restore()` puts it back."""

    def __init__(self):
        self.namespaces = {}           # label -> (object, {key: value}, set_attribute)
        for label, module in FULL_MODULES.items():
            self.namespaces[label] = (module, dict(vars(module)), setattr)
        self.closed = {builtins}       # objects that gain no attribute: a new one is a change
        for label, ufunc in _ufuncs().items():
            self.namespaces[f"{label}"] = (ufunc, dict(vars(ufunc)), setattr)
            self.closed.add(ufunc)
        self.entries = _owned_entries()
        owned = _own_modules()
        for label, module in {**CALLABLE_MODULES, **owned}.items():
            watched = {k: v for k, v in vars(module).items() if _is_code(v)}
            self.namespaces[label] = (module, watched, setattr)
        classes = {f"{label}.{key}": value for label, module in owned.items()
                   for key, value in vars(module).items()
                   if isinstance(value, type) and value.__module__ == label}
        for label, cls in {**C_TYPES, **classes}.items():
            watched = {k: v for k, v in cls.__dict__.items()
                       if cls in C_TYPES.values() or _is_code(v)}
            self.namespaces[label] = (cls, watched, _set_type_attribute)
        self.code = {}
        for _, watched, _ in self.namespaces.values():
            for value in watched.values():
                if isinstance(value, types.FunctionType):
                    self.code[id(value)] = (value, value.__code__, value.__defaults__,
                                            value.__kwdefaults__)
        self.process = self._process()

    @staticmethod
    def _process() -> dict:
        try:
            cwd = os.getcwd()
        except OSError:
            cwd = None
        return {"the working directory": cwd, "environ": dict(os.environ),
                "the recursion limit": sys.getrecursionlimit(),
                "the warning filters": list(warnings.filters), "signals": _signal_handlers(),
                "timers": _timers(), "gc.enable()": gc.isenabled(),
                "sys.settrace()": sys.gettrace(), "sys.setprofile()": sys.getprofile()}

    def restore(self) -> list[str]:
        """Put back everything that differs from the record; return what did."""
        changed = (self._restore_entries() + self._restore_namespaces()
                   + self._restore_code())
        return sorted(changed) + self._restore_process()

    def _restore_entries(self) -> list[str]:
        """sys.modules as recorded, for the watched packages: a replaced or removed entry
        is put back, one added that is not a module is removed."""
        changed, now = [], _owned_entries()
        for name, module in self.entries.items():
            if now.get(name, _MISSING) is not module:
                changed.append(f"sys.modules[{name!r}]")
                sys.modules[name] = module
        for name in set(now) - set(self.entries):
            if not isinstance(now[name], types.ModuleType) or now[name].__name__ != name:
                changed.append(f"sys.modules[{name!r}]")
                del sys.modules[name]
        return changed

    def _restore_namespaces(self) -> list[str]:
        changed = []
        for label, (owner, watched, set_attribute) in self.namespaces.items():
            now = vars(owner)
            for key, value in watched.items():
                if now.get(key, _MISSING) is not value:
                    changed.append(f"{label}.{key}")
                    set_attribute(owner, key, value)
            if any(owner is closed for closed in self.closed):
                for key in set(now) - set(watched):
                    changed.append(f"{label}.{key}")
                    delattr(owner, key)
        return changed

    def _restore_code(self) -> list[str]:
        changed = []
        for fn, code, defaults, kwdefaults in self.code.values():
            if (fn.__code__, fn.__defaults__, fn.__kwdefaults__) != (code, defaults,
                                                                       kwdefaults):
                changed.append(f"{fn.__module__}.{fn.__qualname__}.__code__")
                fn.__code__, fn.__defaults__, fn.__kwdefaults__ = code, defaults, kwdefaults
        return changed

    def _restore_process(self) -> list[str]:
        before, now, changed = self.process, self._process(), []
        if now["the working directory"] != before["the working directory"] and \
                before["the working directory"] is not None:
            changed.append("the working directory")
            os.chdir(before["the working directory"])
        engines = getattr(sys.modules.get("engine.numba_config"), "_SET_HERE", {})
        for key in sorted(set(before["environ"]) | set(now["environ"])):
            if key not in before["environ"] and now["environ"][key] == engines.get(key):
                continue              # the engine's own setting, made where it is imported
            if before["environ"].get(key) != now["environ"].get(key):
                changed.append(f"the environment variable {key}")
                if key in before["environ"]:
                    os.environ[key] = before["environ"][key]
                else:
                    del os.environ[key]
        if now["the recursion limit"] != before["the recursion limit"]:
            changed.append("the recursion limit")
            sys.setrecursionlimit(before["the recursion limit"])
        if now["the warning filters"] != before["the warning filters"]:
            changed.append("the warning filters")
            warnings.filters[:] = before["the warning filters"]
            warnings._filters_mutated()
        for number, handler in before["signals"].items():
            if now["signals"].get(number) is not handler and handler is not None:
                changed.append(f"the handler of {signal.Signals(number).name}")
                try:
                    signal.signal(number, handler)
                except ValueError:          # only the main thread may set a handler
                    pass
        for name, (running, interval) in before["timers"].items():
            if now["timers"][name] != (running, interval) and not running:
                changed.append(f"the timer {name}")
                signal.setitimer(getattr(signal, name), 0)
        if now["gc.enable()"] != before["gc.enable()"]:
            changed.append("gc.enable()")
            gc.enable() if before["gc.enable()"] else gc.disable()
        for name, setter in (("sys.settrace()", sys.settrace),
                             ("sys.setprofile()", sys.setprofile)):
            if now[name] is not before[name]:
                changed.append(name)
                setter(before[name])
        return changed
