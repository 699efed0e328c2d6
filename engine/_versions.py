"""Check at import time that Python, NumPy and numba fit together.

numba compiles against a narrow range of NumPy releases; when they do not
fit, the failure deep inside numba is cryptic. We check first and say what
to install instead. numba's version is read from its package metadata, so
`import engine` does not load numba (nor the SciPy and llvmlite it loads):
engine.numba_config imports it when a kernel is first needed, and
`numba_import_error` explains a failure there.
"""
from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

MIN_PYTHON = (3, 10)
MIN_NUMPY = (1, 24)
MIN_NUMBA = (0, 59)


def _as_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def _fmt(t: tuple[int, ...]) -> str:
    return ".".join(str(x) for x in t)


def check_versions() -> dict[str, str]:
    """Return the versions in use, or raise ImportError with a fix to apply."""
    found = {"python": _fmt(sys.version_info[:3])}
    problems = []
    if sys.version_info[:2] < MIN_PYTHON:
        problems.append(f"Python {found['python']} is older than {_fmt(MIN_PYTHON)}; "
                        f"install Python {_fmt(MIN_PYTHON)} or newer and run `make lab` again.")
    try:
        import numpy
        found["numpy"] = numpy.__version__
        if _as_tuple(numpy.__version__) < MIN_NUMPY:
            problems.append(f"NumPy {numpy.__version__} is older than {_fmt(MIN_NUMPY)}; "
                            f"run `pip install -U 'numpy>={_fmt(MIN_NUMPY)}'`.")
    except ImportError:
        problems.append("NumPy is not installed; run `make lab` (or `pip install -e .`).")
    try:
        found["numba"] = version("numba")
        if _as_tuple(found["numba"]) < MIN_NUMBA:
            problems.append(f"numba {found['numba']} is older than {_fmt(MIN_NUMBA)}; "
                            f"run `pip install -U 'numba>={_fmt(MIN_NUMBA)}'`.")
    except PackageNotFoundError:
        problems.append("numba is not installed; run `make lab` (or `pip install -e .`).")
    if problems:
        raise ImportError("engine cannot start:\n  - " + "\n  - ".join(problems)
                          + f"\n(found: {found})")
    return found


def numba_import_error(exc: ImportError) -> ImportError:
    """The error to raise when `import numba` fails: numba raises ImportError
    itself when the installed NumPy is outside the range it was built for;
    pass its explanation on, with the fix."""
    import numpy
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "not installed"
    return ImportError(
        f"numba cannot be imported with NumPy {numpy.__version__} on Python "
        f"{_fmt(sys.version_info[:3])} ({reason}). Run `pip install -U numba numpy` so pip "
        f"picks a matching pair, or `make lab`, which does it for you.")
