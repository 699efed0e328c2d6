"""The files and lengths `python -m engine.train` reads are bounded: --resume refuses
what is not a regular file as --data does (no FIFO blocks, no device is read without
end), an empty path is an error, --sample-len has a ceiling, and a file the system
will not read is a one-line error with its exit code (issue 49, item 6)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from engine import train as T
from engine.trainer import checkpoint_files
from engine.trainer.config import MAX_SAMPLE_LEN, TrainConfig, TrainError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "4", "--eval-every", "2", "--eval-batches", "1", "--threads", "1",
        "--steps", "1"]


def _special(tmp_path, which: str) -> str:
    if which != "fifo":
        return which
    path = tmp_path / "pipe"
    os.mkfifo(path)              # nobody writes: a blocking open or read would wait forever
    return str(path)


def _train(*args, timeout=90):
    """`python -m engine.train ARGS` in a child, so that a hang fails the test."""
    return subprocess.run([sys.executable, "-m", "engine.train", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("which", ["fifo", "/dev/zero", "/dev/urandom"])
def test_resume_from_a_pipe_or_a_device_is_refused_at_once_with_exit_4(tmp_path, which):
    run = _train("--resume", _special(tmp_path, which), *TINY, timeout=60)
    assert run.returncode == 4, run.stderr
    assert "is not a regular file" in run.stderr
    assert run.stderr.strip().count("\n") == 0, run.stderr       # one line, no traceback


def test_a_checkpoint_over_the_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint_files, "MAX_CHECKPOINT_BYTES", 1000)
    big = tmp_path / "big.npz"
    with open(big, "wb") as f:
        f.truncate(1001)
    with pytest.raises(T.CheckpointError, match="more than 1,000 bytes"):
        checkpoint_files.load_checkpoint(str(big))


@pytest.mark.parametrize("flag", ["--resume", "--data", "--save", "--log"])
def test_an_empty_path_is_an_argument_error_not_a_setting_left_out(flag, capsys):
    assert T.main(TINY + [flag, ""]) == 2
    assert f"{flag} is an empty path" in capsys.readouterr().err


def test_an_empty_resume_path_is_refused_by_the_config_too():
    with pytest.raises(TrainError, match="--resume is an empty path"):
        TrainConfig(resume="").validate()


def test_sample_len_has_a_stated_ceiling(capsys):
    assert T.main(TINY + ["--sample-len", str(10**12), "--prompt", "a"]) == 2
    err = capsys.readouterr().err
    assert f"at most {MAX_SAMPLE_LEN:,}" in err and "1,000,000,000,000" in err
    assert f"{MAX_SAMPLE_LEN:,}" in T.build_parser().format_help()      # --help states it


def test_the_sampler_refuses_a_length_over_the_ceiling_before_any_forward():
    class NoModel:                       # sample must stop before it touches the model
        cfg = None
    with pytest.raises(ValueError, match="length must lie in"):
        T.sample(NoModel(), None, "a", length=MAX_SAMPLE_LEN + 1)


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs Linux's /proc")
@pytest.mark.parametrize("flag,code", [("--data", 3), ("--resume", 4)])
def test_a_file_the_system_will_not_read_is_a_one_line_error(flag, code):
    run = _train(flag, "/proc/self/mem", *TINY, timeout=60)
    assert run.returncode == code, run.stderr
    assert run.stderr.startswith("error: ") and "/proc/self/mem" in run.stderr
    assert run.stderr.strip().count("\n") == 0, run.stderr


def test_a_checkpoint_read_that_fails_says_it_cannot_be_read(tmp_path, monkeypatch):
    path = tmp_path / "run.npz"
    path.write_bytes(b"PK")

    def failing_disk(*args, **kwargs):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(checkpoint_files.zipfile, "ZipFile", failing_disk)
    with pytest.raises(T.CheckpointError, match="cannot read checkpoint .*Input/output error"):
        checkpoint_files.load_checkpoint(str(path))
