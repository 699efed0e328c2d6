"""Special files never hang a command, a big corpus is bounded and reports its progress,
and a resumed run keeps the attention kernel it was trained with."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine import train as T
from engine.budget.config import BudgetError
from engine.budget.hf import read_hf_config
from engine.trainer import data
from engine.trainer.data import CorpusError, load_corpus

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "4", "--eval-every", "2", "--eval-batches", "1", "--threads", "1"]
SPECIAL = ["fifo", "/dev/zero", "/dev/urandom"]


def _special(tmp_path, which: str) -> str:
    if which != "fifo":
        return which
    path = tmp_path / "pipe"
    os.mkfifo(path)              # nobody writes: a blocking open or read would wait forever
    return str(path)


def _run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


# ------------------------------------------------------ item 3: --hf-config, --data
@pytest.mark.parametrize("which", SPECIAL)
def test_a_special_file_as_the_hf_config_is_refused_at_once(tmp_path, which):
    with pytest.raises(BudgetError, match="is not a regular file"):
        read_hf_config(_special(tmp_path, which))


def test_the_budget_cli_refuses_a_fifo_as_hf_config_with_exit_2(tmp_path):
    run = _run("engine.budget", "--hf-config", _special(tmp_path, "fifo"), timeout=60)
    assert run.returncode == 2 and "is not a regular file" in run.stderr + run.stdout


@pytest.mark.parametrize("which", SPECIAL)
def test_a_special_file_as_the_corpus_is_refused_at_once(tmp_path, which):
    with pytest.raises(CorpusError, match="is not a regular file"):
        load_corpus(_special(tmp_path, which))


def test_the_trainer_refuses_dev_zero_as_data_with_the_data_exit_code():
    run = _run("engine.train", "--data", "/dev/zero", *TINY, "--steps", "1", timeout=60)
    assert run.returncode == 3 and "is not a regular file" in run.stderr


def test_a_corpus_over_the_limit_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:                       # sparse: no disk space used
        f.truncate(data.MAX_CORPUS_BYTES + 1)
    with pytest.raises(CorpusError, match=f"more than {data.MAX_CORPUS_BYTES:,} bytes"):
        load_corpus(str(big))


def test_a_big_corpus_reports_its_progress_as_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "READ_CHUNK_BYTES", 1000)
    path = tmp_path / "notes.txt"
    text = load_corpus()[:3500]
    path.write_text(text, encoding="utf-8")
    lines = []
    assert load_corpus(str(path), progress=lines.append) == text
    assert len(lines) == 4 and all(line.startswith(f"reading {path}: ") for line in lines)


def test_the_tokenizer_gives_the_same_ids_as_a_character_by_character_lookup():
    text = load_corpus()[:50_000] + "\u00e9\U0001F600"
    tok = data.CharTokenizer.from_text(text)
    index = {c: i for i, c in enumerate(tok.chars)}
    want = np.array([index[c] for c in text], dtype=np.int64)
    got = tok.encode(text)
    assert got.dtype == np.int64 and np.array_equal(got, want)
    with pytest.raises(ValueError, match="are not in the vocabulary"):
        tok.encode("\u2603")


# ------------------------------------------ item 6: the attention kernel of a checkpoint
@pytest.fixture(scope="module")
def flash_run(corpus, tmp_path_factory):
    """A 2-step checkpoint of a 4-step flash-attention run, and that run's step-4 loss."""
    folder = tmp_path_factory.mktemp("flash")
    args = TINY + ["--data", corpus, "--steps", "4", "--attention", "flash", "--json"]
    whole = _losses(args + ["--save", str(folder / "whole.npz")])
    path = str(folder / "half.npz")
    assert T.main(args + ["--stop-at", "2", "--save", path]) == 0
    return path, whole


def _losses(argv) -> dict:
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert T.main(argv) == 0
    return {r["step"]: r["loss"] for r in map(json.loads, out.getvalue().splitlines())
            if "loss" in r and "step" in r}


def test_a_flash_checkpoint_resumed_without_the_flag_continues_bit_for_bit(flash_run,
                                                                            corpus, tmp_path):
    path, whole = flash_run
    resumed = _losses(["--resume", path, "--data", corpus, "--threads", "1", "--save",
                       str(tmp_path / "resumed.npz"), "--json"])   # threads are never resumed
    assert resumed[4] == whole[4]


def test_a_resume_with_another_attention_kernel_is_refused(flash_run, corpus, tmp_path,
                                                           capsys):
    path, _ = flash_run
    code = T.main(["--resume", path, "--data", corpus, "--attention", "standard",
                   "--threads", "1", "--save", str(tmp_path / "other.npz")])
    assert code == 5
    assert "trained with flash attention" in capsys.readouterr().err


def test_an_older_checkpoint_without_the_kernel_resumes_and_says_which_it_uses(
        flash_run, corpus, tmp_path, capsys):
    path, _ = flash_run
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays["meta"]))
    del meta["config"]["attention"]
    arrays["meta"] = np.array(json.dumps(meta))
    old = str(tmp_path / "old.npz")
    np.savez(old, **arrays)
    capsys.readouterr()
    assert T.main(["--resume", old, "--data", corpus, "--threads", "1",
                   "--save", str(tmp_path / "o.npz")]) == 0
    assert "does not record its attention kernel" in capsys.readouterr().out
