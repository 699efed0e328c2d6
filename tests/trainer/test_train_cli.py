"""engine.train: the loss falls, a resumed run continues bit for bit, bad inputs
get their error and exit code, and the command line speaks JSON."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from engine import train as T
from engine.trainer.data import CharTokenizer, Dataset, batch_at, load_corpus, unigram_entropy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=8, eval_every=10,
             eval_batches=2, lr=3e-3, warmup=5)
SMALL_ARGS = ["--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
              "--batch-size", "8", "--eval-every", "10", "--eval-batches", "2"]


@pytest.fixture(scope="module")
def dataset():
    return Dataset.from_text(load_corpus()[:60_000])


def losses(result):
    return [r["loss"] for r in result.history]


def test_loss_falls_over_50_steps(dataset):
    result = T.train(T.TrainConfig(steps=50, **SMALL), dataset=dataset)
    first, last = np.mean(losses(result)[:5]), np.mean(losses(result)[-5:])
    assert last < first - 0.8, f"loss went from {first:.3f} to {last:.3f}"
    assert result.final_val_loss < np.log(dataset.tokenizer.vocab_size)
    phases = result.history[-1]["phases"]
    assert set(phases) == {"loss", "backward", "optimizer", "evaluation"}
    assert phases["backward"] > 0 and phases["evaluation"] > 0


def test_resume_reproduces_the_uninterrupted_losses_bit_for_bit(dataset, tmp_path):
    cfg = dict(SMALL, steps=20, grad_accum=2)
    whole = T.train(T.TrainConfig(**cfg), dataset=dataset)
    path = str(tmp_path / "run.npz")
    first = T.train(T.TrainConfig(**cfg, stop_at=9, save=path), dataset=dataset)
    assert first.step == 9 and os.path.exists(path)
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")], "temporary file left"
    rest = T.train(T.TrainConfig(**cfg, resume=path), dataset=dataset)
    assert losses(first) + losses(rest) == losses(whole)      # exact float equality
    assert rest.final_val_loss == whole.final_val_loss


def test_cli_resume_takes_its_settings_from_the_checkpoint(tmp_path, capsys):
    path = str(tmp_path / "c.npz")
    args = SMALL_ARGS + ["--steps", "6", "--json"]
    assert T.main(args + ["--save", path, "--stop-at", "3"]) == 0
    assert T.main(["--resume", path, "--json"]) == 0          # model flags from the checkpoint
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    steps = [r["step"] for r in out if "loss" in r and "event" not in r]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert out[-1]["event"] == "end" and out[-1]["step"] == 6


def test_missing_and_non_utf8_files_exit_3(tmp_path, capsys):
    assert T.main(["--data", str(tmp_path / "nope.txt"), "--steps", "1"]) == 3
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 au lait ".encode("latin-1") * 50)
    assert T.main(["--data", str(bad), "--steps", "1"]) == 3
    err = capsys.readouterr().err
    assert "is not UTF-8" in err and "0xe9" in err and "iconv" in err


def test_corrupt_checkpoints_exit_4(tmp_path, capsys, dataset):
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a checkpoint at all")
    assert T.main(["--resume", str(garbage)]) == 4
    assert "corrupt or not a trainer checkpoint" in capsys.readouterr().err
    good = str(tmp_path / "good.npz")
    T.train(T.TrainConfig(steps=1, save=good, **SMALL), dataset=dataset)
    data = open(good, "rb").read()
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(data[: len(data) // 2])
    assert T.main(["--resume", str(truncated)]) == 4
    assert T.main(["--resume", str(tmp_path / "missing.npz")]) == 4


def test_settings_that_do_not_match_the_checkpoint_exit_5(tmp_path, capsys):
    path = str(tmp_path / "c.npz")
    assert T.main(SMALL_ARGS + ["--steps", "1", "--save", path]) == 0
    capsys.readouterr()
    assert T.main(["--resume", path, "--n-layer", "3"]) == 5
    err = capsys.readouterr().err
    assert "--n-layer is 3" in err and "trained with 2" in err
    other = tmp_path / "other.txt"
    other.write_text("a different corpus, with different letters! " * 100, encoding="utf-8")
    assert T.main(["--resume", path, "--data", str(other)]) == 5
    assert "corpus differs" in capsys.readouterr().err


def test_bad_arguments_exit_2(capsys):
    assert T.main(["--n-embd", "30", "--n-head", "4", "--steps", "1"]) == 2
    assert "not divisible" in capsys.readouterr().err


def test_data_parallel_without_mpi4py_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "mpi4py", None)       # import mpi4py -> ImportError
    assert T.main(SMALL_ARGS + ["--steps", "1", "--data-parallel"]) == 6
    assert "pip install -e '.[mpi]'" in capsys.readouterr().err


def test_command_line_help_and_exit_code_in_a_real_process(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "engine.train", *a], cwd=ROOT,  # noqa: E731
                                    capture_output=True, text=True, timeout=120)
    helped = run("--help")
    assert helped.returncode == 0 and "--data-parallel" in helped.stdout
    assert "Exit codes" in helped.stdout
    missing = run("--data", str(tmp_path / "none.txt"))
    assert missing.returncode == 3 and "does not exist" in missing.stderr


def test_sampling_continues_the_prompt(dataset):
    result = T.train(T.TrainConfig(steps=2, **SMALL), dataset=dataset)
    text = T.sample(result.model, dataset.tokenizer, "The ", length=20, seed=1)
    assert text.startswith("The ") and len(text) == 24
    assert text == T.sample(result.model, dataset.tokenizer, "The ", length=20, seed=1)


def test_data_helpers():
    tok = CharTokenizer.from_text("hello world")
    assert tok.decode(tok.encode("low")) == "low" and tok.vocab_size == 8
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.encode("xyz")
    ids = tok.encode("hello world" * 20)
    x1, y1 = batch_at(ids, 0, 5, 4, 8)
    x2, _ = batch_at(ids, 0, 5, 4, 8)
    assert np.array_equal(x1, x2) and np.array_equal(x1[:, 1:], y1[:, :-1])
    assert 0 < unigram_entropy(ids, tok.vocab_size) < np.log(tok.vocab_size)


@pytest.mark.parametrize("replicas", [0, 1, 2])
def test_accumulated_micro_batches_equal_one_big_batch(dataset, replicas):
    """accumulate_and_step: K micro-batches of B with loss/K give the gradient of one batch
    of K*B, on a bare GPT (0) or on thread replicas (1, 2)."""
    from engine.trainer.model import FusedGPT, decay_segments
    from engine.trainer.optim import AdamW
    from engine.trainer.parallel import ThreadReplicas
    cfg = T.TrainConfig(**SMALL).model_config(dataset.tokenizer.vocab_size)
    x1, y1 = batch_at(dataset.train, 0, 1, 4, 32)
    x2, y2 = batch_at(dataset.train, 0, 2, 4, 32)
    model = (FusedGPT(cfg, 4, dtype=np.float64) if replicas == 0
             else ThreadReplicas(cfg, 4, replicas, dtype=np.float64))
    opt = AdamW(model.params.flat, decay_segments(model.params), lr=0.0)
    record = T.accumulate_and_step(model, opt, [(x1, y1), (x2, y2)], lr=0.0, clip=None,
                          loss_scale=0.5)
    big = FusedGPT(cfg, 8, dtype=np.float64)
    big.zero_grad()
    loss = big.forward(np.concatenate([x1, x2]), np.concatenate([y1, y2]))
    big.backward()
    assert record["loss"] == pytest.approx(loss, rel=1e-12)
    np.testing.assert_allclose(model.grads.flat, big.grads.flat, rtol=1e-9, atol=1e-14)
    assert set(record["phases"]) == {"loss", "backward", "optimizer", "evaluation"}
