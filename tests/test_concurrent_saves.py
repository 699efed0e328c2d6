"""Two notebooks saving pieces at once keep every entry of the index."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coursework import pieces

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_PIECES_DIR", str(tmp_path / "pieces"))
    (tmp_path / "pieces").mkdir()
    return tmp_path / "pieces"


# ------------------------------------------------- saves from two notebooks at once
SAVER = """
import sys
from pathlib import Path
from coursework import pieces
scratch = Path(sys.argv[2])
for i in range(25):
    name = f"piece_{sys.argv[1]}_{i}"
    path = scratch / f"{name}.py"
    path.write_text(f"def {name}(x):\\n    return x\\n")
    namespace = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    assert pieces.save_piece(name, namespace[name], "99.1") is not None
"""


def test_two_processes_saving_25_pieces_each_keep_all_50(tmp_path):
    folder = tmp_path / "pieces"
    folder.mkdir()
    env = dict(os.environ, BACKPROP_PIECES_DIR=str(folder),
               PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    savers = []
    for who in ("a", "b"):
        (tmp_path / who).mkdir()
        savers.append(subprocess.Popen([sys.executable, "-c", SAVER, who, str(tmp_path / who)],
                                       env=env, cwd=tmp_path))
    assert [saver.wait(timeout=300) for saver in savers] == [0, 0]
    index = json.loads((folder / "index.json").read_text())
    assert len(index) == 50
    assert sorted(p.stem for p in folder.glob("*.py")) == sorted(index)


def test_the_index_lock_is_held_across_the_read_and_the_write(folder):
    import fcntl
    fd = os.open(folder, os.O_RDONLY)
    with pieces.index_lock(folder):
        with pytest.raises(BlockingIOError):   # another notebook waits for it
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)

