"""engine.numba_config: what it sets up before any kernel compiles."""
from __future__ import annotations


def test_cached_machine_code_goes_when_any_engine_source_changes(tmp_path):
    """numba checks a cached kernel against its own file only; the engine drops
    every cache file of its own when any of its sources changed, and only then."""
    from engine.numba_config import drop_stale_caches
    (tmp_path / "kernels" / "__pycache__").mkdir(parents=True)
    (tmp_path / "kernels" / "attention.py").write_text("def attention(): pass\n")
    (tmp_path / "_lanes.py").write_text("LANES = 16\n")
    cached = [tmp_path / "kernels" / "__pycache__" / name
              for name in ("attention.attention-1.py311.nbi", "attention.attention-1.py311.1.nbc")]
    mine = tmp_path / "kernels" / "__pycache__" / "attention.cpython-311.pyc"
    for path in cached + [mine]:
        path.write_bytes(b"x")
    drop_stale_caches(tmp_path)                       # no stamp yet: dropped
    assert not any(p.exists() for p in cached) and mine.exists()
    for path in cached:
        path.write_bytes(b"x")
    drop_stale_caches(tmp_path)                       # nothing changed: kept
    assert all(p.exists() for p in cached)
    (tmp_path / "_lanes.py").write_text("LANES = 8\n")  # another file than the kernel's
    drop_stale_caches(tmp_path)
    assert not any(p.exists() for p in cached) and mine.exists()


def test_a_child_gets_the_users_environment_without_the_engines_defaults():
    """The engine asks for sleeping idle threads (OMP_WAIT_POLICY=PASSIVE) unless the
    user chose; users_environment() (PyTorch's process in the benchmark) leaves
    out what the engine set, and keeps what the user set."""
    import json
    import os
    import subprocess
    import sys
    probe = ("import os, json, engine.numba_config as c; "
             "print(json.dumps([os.environ.get('OMP_WAIT_POLICY'), "
             "c.users_environment().get('OMP_WAIT_POLICY'), "
             "c.users_environment().get('USER_SET')]))")
    for chosen in (None, "ACTIVE"):
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        env["USER_SET"] = "kept"
        if chosen:
            env["OMP_WAIT_POLICY"] = chosen
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                             text=True, check=True).stdout
        engine_sees, child_gets, other = json.loads(out)
        assert engine_sees == (chosen or "PASSIVE")
        assert child_gets == chosen and other == "kept"


def test_one_module_owns_the_idle_threads_setting():
    """OMP_WAIT_POLICY is set in engine/numba_config.py alone; the lessons that run
    numba's threads import that module in their first code cell, before numba."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    setting = re.compile(r"""(setdefault\(|environ\[)\s*["']OMP_WAIT_POLICY["']""")
    sources = [p for folder in ("engine", "coursework", "widgets", "tools", "course/source")
               for p in (root / folder).rglob("*.py")] + [root / "conftest.py"]
    setters = sorted(str(p.relative_to(root)) for p in sources if setting.search(p.read_text()))
    assert setters == [], f"OMP_WAIT_POLICY set outside engine/numba_config.py: {setters}"
    assert "_set_default(\"OMP_WAIT_POLICY\"" in (root / "engine" / "numba_config.py").read_text()
    for lesson in sorted((root / "course" / "source").glob("1[0-3]_*.py")):
        first_cell = lesson.read_text().split("\n# %%\n")[1]
        imports = [line for line in first_cell.splitlines() if line.startswith("import ")]
        assert imports[0].startswith("import engine.numba_config"), (lesson.name, imports[:2])
