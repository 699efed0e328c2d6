"""Packaging: the pip and conda paths install the same things, and the
import-time version check says something useful when versions don't fit."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REQ = re.compile(r"^\s*-?\s*\"?([A-Za-z0-9_.\-]+)\s*(>=\s*[0-9][0-9.]*)?\"?,?\s*$")


def _requirements(lines) -> dict[str, str]:
    found = {}
    for line in lines:
        m = REQ.match(line.split("#")[0])
        if m:
            found[m.group(1).lower()] = (m.group(2) or "").replace(" ", "")
    return found


def pyproject_requirements() -> dict[str, str]:
    text = (ROOT / "pyproject.toml").read_text()
    blocks = re.findall(r"^(?:dependencies|test) = \[(.*?)\]", text, re.S | re.M)
    assert len(blocks) == 2, "pyproject.toml: expected `dependencies` and the `test` extra"
    return _requirements("\n".join(blocks).splitlines())


def conda_requirements() -> dict[str, str]:
    lines = (ROOT / "environment.yml").read_text().split("dependencies:", 1)[1].splitlines()
    reqs = _requirements(line for line in lines if line.strip().startswith("- "))
    reqs.pop("pip", None)
    reqs.pop("python", None)
    return reqs


def test_pip_and_conda_list_the_same_packages_and_bounds():
    pip, conda = pyproject_requirements(), conda_requirements()
    assert set(pip) == set(conda), (
        f"only in pyproject.toml: {sorted(set(pip) - set(conda))}; "
        f"only in environment.yml: {sorted(set(conda) - set(pip))}")
    for name in pip:
        assert pip[name] == conda[name], f"{name}: pyproject says {pip[name]!r}, conda {conda[name]!r}"


def test_every_dependency_has_a_lower_bound_and_no_pin():
    for name, bound in pyproject_requirements().items():
        assert bound.startswith(">="), f"{name} needs a tested lower bound (>=), not {bound!r}"
    text = (ROOT / "pyproject.toml").read_text()
    assert "==" not in text and "<" not in text.replace("<=", ""), "no exact pins or upper caps"


def test_installed_versions_meet_the_lower_bounds():
    from importlib.metadata import version
    for name, bound in pyproject_requirements().items():
        have = tuple(int(x) for x in re.findall(r"\d+", version(name))[:2])
        need = tuple(int(x) for x in re.findall(r"\d+", bound)[:2])
        assert have >= need, f"{name} {version(name)} is below the stated bound {bound}"


def test_version_check_names_versions_and_fix(monkeypatch):
    from engine import _versions
    found = _versions.check_versions()
    assert set(found) == {"python", "numpy", "numba"}
    monkeypatch.setattr(_versions, "MIN_NUMBA", (99, 0))
    with pytest.raises(ImportError) as err:
        _versions.check_versions()
    msg = str(err.value)
    assert "numba" in msg and "99.0" in msg and "pip install -U" in msg and found["numpy"] in msg


def test_version_check_explains_a_broken_numba():
    """numba loads where a kernel first needs it (engine.numba_config); an
    ImportError there is passed on with the fix."""
    code = ("import builtins\n"
            "real = builtins.__import__\n"
            "def fake(name, *a, **k):\n"
            "    if name == 'numba':\n"
            "        raise ImportError('Numba needs NumPy 2.9 or less. Got NumPy 3.0.')\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = fake\n"
            "import engine.numba_config\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0
    assert "Numba needs NumPy" in out.stderr and "pip install -U numba numpy" in out.stderr


def test_import_engine_runs_the_version_check():
    code = "import engine, engine._versions as v; print(v.check_versions()['numba'])"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
    assert "check_versions()" in (ROOT / "engine" / "__init__.py").read_text()
