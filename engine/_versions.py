"""Check at import time that Python, NumPy and numba fit together.

numba compiles against a narrow range of NumPy releases; when they do not
fit, the failure deep inside numba is cryptic. We check first and say what
to install instead.
"""
from __future__ import annotations

import sys

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
        import numba
        found["numba"] = numba.__version__
        if _as_tuple(numba.__version__) < MIN_NUMBA:
            problems.append(f"numba {numba.__version__} is older than {_fmt(MIN_NUMBA)}; "
                            f"run `pip install -U 'numba>={_fmt(MIN_NUMBA)}'`.")
    except ImportError as exc:
        # numba raises ImportError itself when the installed NumPy is outside
        # the range it was built for; pass its explanation on, with the fix.
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "not installed"
        problems.append(
            f"numba cannot be imported with NumPy {found.get('numpy', '?')} on Python "
            f"{found['python']} ({reason}). Run `pip install -U numba numpy` so pip picks "
            f"a matching pair, or `make lab`, which does it for you.")
    if problems:
        raise ImportError("engine cannot start:\n  - " + "\n  - ".join(problems)
                          + f"\n(found: {found})")
    return found
