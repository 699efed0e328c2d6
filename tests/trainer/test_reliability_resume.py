"""`--resume` of a folder, a checkpoint whose AdamW state or step count no run could
have written, and a save stopped by the file-size limit: each ends in one line naming
the value and the fix, never a traceback, and nothing a user made is lost."""
from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest

from engine import train as T
from engine.trainer import checkpoint_files

from .test_reliability import TINY, _rewrite_meta, checkpoint  # noqa: F401


def _main(args, capsys):
    capsys.readouterr()
    code = T.main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def test_resuming_a_folder_names_it_and_the_file_to_pass(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = _main(["--resume", ".", "--steps", "1"], capsys)
    assert code == 4, (code, err)
    assert err.count("\n") == 1 and "'.' is a folder" in err and "run.npz" in err, err


def _with_arrays(src, dst, **change):
    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files}
    arrays.update({k: f(arrays[k]) for k, f in change.items()})
    np.savez(dst, **arrays)
    return str(dst)


def _nan_at_0(a):
    a = a.copy()
    a[0] = np.nan
    return a


def _negative_at_0(a):
    a = a.copy()
    a[0] = -1.0
    return a


@pytest.mark.parametrize("key, change, says", [
    ("adam_m", _nan_at_0, "NaN or infinite values in its first moment"),
    ("adam_v", _nan_at_0, "NaN or infinite values in its second moment"),
    ("adam_v", _negative_at_0, "negative values in its second moment"),
])
def test_an_unusable_adamw_state_is_refused_and_not_blamed_on_lr(checkpoint, corpus, tmp_path,
                                                                  capsys, key, change, says):
    path = _with_arrays(checkpoint, tmp_path / "bad.npz", **{key: change})
    code, err = _main(["--resume", path, "--data", corpus], capsys)
    assert code == 4 and says in err and "unusable AdamW state" in err, (code, err)
    assert "--lr" in err and "whatever --lr is" in err


def test_a_crafted_step_of_10_to_the_30_is_refused(checkpoint, corpus, tmp_path, capsys):
    path = _rewrite_meta(checkpoint, str(tmp_path / "far.npz"), lambda m: {**m, "step": 10**30})
    code, err = _main(["--resume", path, "--data", corpus, "--steps", str(10**30 + 2)], capsys)
    assert code == 4 and "meta['step']" in err and "1,000,000,000" in err, (code, err)


def test_a_crafted_optimizer_step_count_is_refused(checkpoint, corpus, tmp_path, capsys):
    path = _with_arrays(checkpoint, tmp_path / "t.npz", adam_t=lambda t: np.array(2**62))
    code, err = _main(["--resume", path, "--data", corpus], capsys)
    assert code == 4 and "optimizer step count" in err, (code, err)


def test_a_save_stopped_by_the_file_size_limit_names_the_limit(corpus, tmp_path, capsys,
                                                              monkeypatch):
    path = str(tmp_path / "run.npz")
    assert T.main(TINY + ["--data", corpus, "--steps", "2", "--save", path]) == 0
    before = open(path, "rb").read()

    def too_large(file, arrays):
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
    monkeypatch.setattr(checkpoint_files, "write_arrays", too_large)
    code, err = _main(["--resume", path, "--data", corpus, "--steps", "4"], capsys)
    assert code == 8, (code, err)
    assert "File too large" in err and "ulimit -f" in err and "permissions" not in err, err
    assert open(path, "rb").read() == before
