"""A Python child process that imports this very engine.

The benchmark's PyTorch side (torch_twin.py) and the cold cache's compile
helper (compile_ahead.py) run in child processes. The child is this
interpreter, with the folder that holds this `engine` package first on
PYTHONPATH, so it imports the same code as its parent even where the parent
found the engine through its working folder rather than an install.
"""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_python(code: str, *args: str, env: dict[str, str] | None = None,
                 **popen) -> subprocess.Popen:
    """`python -c code args...` under `env` (default: this process's environment);
    `popen` goes to subprocess.Popen (stdin, stdout, stderr)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, **popen)
