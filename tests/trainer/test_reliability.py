"""engine.train at its edges: a checkpoint never chooses where the trainer writes,
nothing a user made is lost, and every mistake ends cleanly before step 1 with a
message that names the setting (issue 16)."""
from __future__ import annotations

import errno
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from engine import train as T
from engine.trainer import checkpoint_files, preflight

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "4", "--eval-every", "2", "--eval-batches", "1", "--threads", "1"]


@pytest.fixture(scope="module")
def checkpoint(corpus, tmp_path_factory):
    """A 2-step checkpoint of a 4-step run on `corpus`."""
    path = str(tmp_path_factory.mktemp("ckpt") / "run.npz")
    assert T.main(TINY + ["--data", corpus, "--steps", "4", "--stop-at", "2", "--save", path,
                          "--json"]) == 0
    return path


def _rewrite_meta(src, dst, change):
    """Copy checkpoint src to dst with change(meta) applied to its metadata."""
    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays["meta"]))
    meta = change(meta)
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(dst, **arrays)
    return dst


def _step_of(path):
    with np.load(path) as z:
        return json.loads(str(z["meta"]))["step"]


# ------------------------------------------------------------------ security
def test_resume_never_takes_paths_prompt_or_threads_from_the_checkpoint(checkpoint, corpus,
                                                                        tmp_path, capsys):
    victim = tmp_path / "victim"
    shell_rc = tmp_path / "bashrc"
    shell_rc.write_text("# the user's shell start-up file\n")

    def plant(meta):
        meta["config"].update(save=str(victim / "overwritten.npz"), log=str(shell_rc),
                              data=str(tmp_path / "elsewhere.txt"), prompt="$(rm -rf ~)",
                              threads=64, resume=str(victim / "x.npz"))
        return meta

    crafted = _rewrite_meta(checkpoint, str(tmp_path / "shared.npz"), plant)
    capsys.readouterr()
    mine = tmp_path / "mine.jsonl"
    assert T.main(["--resume", crafted, "--data", corpus, "--log", str(mine), "--json"]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert not victim.exists(), "a checkpoint chose where to save"
    assert shell_rc.read_text() == "# the user's shell start-up file\n", "it chose the log"
    assert not any("sample" in r and r["sample"] for r in out), "it chose a prompt"
    start = next(r for r in out if r.get("event") == "resume")
    assert set(start["from_checkpoint"]) & {"save", "log", "data", "prompt", "threads"} == set()
    assert start["from_checkpoint"]["steps"] == 4 and start["save"] == crafted
    assert _step_of(crafted) == 4, "a resumed run saves back to the file it resumed from"
    header = json.loads(mine.read_text().splitlines()[0])
    assert header["event"] == "start" and header["threads"] < 64


def test_checkpoints_record_no_paths_and_resume_says_what_it_read(checkpoint, corpus, tmp_path,
                                                                 capsys):
    with np.load(checkpoint) as z:
        stored = json.loads(str(z["meta"]))["config"]
    assert not {"save", "log", "data", "prompt", "threads", "resume"} & set(stored)
    copy = str(tmp_path / "copy.npz")
    shutil.copy(checkpoint, copy)
    capsys.readouterr()
    assert T.main(["--resume", copy, "--data", corpus, "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "settings from the checkpoint:" in out and "n_embd=16" in out
    assert "steps=" not in out.split("settings from the checkpoint:")[1].split(";")[0], \
        "--steps was given here, so it does not come from the file"


def test_resuming_a_copy_leaves_the_original_alone(checkpoint, corpus, tmp_path):
    a, b = str(tmp_path / "a.npz"), str(tmp_path / "b.npz")
    shutil.copy(checkpoint, a)
    shutil.copy(a, b)
    before = open(a, "rb").read()
    assert T.main(["--resume", b, "--data", corpus]) == 0
    assert open(a, "rb").read() == before, "resuming b.npz overwrote a.npz"
    assert _step_of(b) == 4


def _corrupt_cases(good, tmp_path):
    def meta_as(value):
        return lambda meta: value

    def set_in(path, value):
        def change(meta):
            d = meta
            for key in path[:-1]:
                d = d[key]
            d[path[-1]] = value
            return meta
        return change

    cases = {
        "meta is a list": meta_as([1, 2, 3]),
        "meta is a number": meta_as(7),
        "step is text": set_in(["step"], "ten"),
        "step is negative": set_in(["step"], -3),
        "model is a list": set_in(["model"], [16, 1]),
        "n_embd is text": set_in(["model", "n_embd"], "sixteen"),
        "n_head is zero": set_in(["model", "n_head"], 0),
        "chars is a number": set_in(["chars"], 12),
        "config is text": set_in(["config"], "lr=1"),
        "lr is text": set_in(["config", "lr"], "fast"),
        "lr is negative": set_in(["config", "lr"], -1.0),
        "dtype is unknown": set_in(["dtype"], "float16"),
        "vocabulary too large for the params": set_in(["chars"],
                                                      "".join(map(chr, range(300, 400)))),
    }
    for name, change in cases.items():
        yield name, _rewrite_meta(good, str(tmp_path / f"{len(name)}-{abs(hash(name))}.npz"),
                                  change)
    with np.load(good) as z:
        arrays = {k: z[k] for k in z.files}
    shapes = {"params is 2-D": dict(params=arrays["params"].reshape(1, -1)),
              "adam_m is short": dict(adam_m=arrays["adam_m"][:-1]),
              "adam_v is float64": dict(adam_v=arrays["adam_v"].astype(np.float64)),
              "adam_t is a float": dict(adam_t=np.array(2.5)),
              "meta is bytes": dict(meta=np.frombuffer(b"{}", np.uint8))}
    for i, (name, change) in enumerate(shapes.items()):
        path = str(tmp_path / f"shape{i}.npz")
        np.savez(path, **{**arrays, **change})
        yield name, path


def test_crafted_metadata_exits_4_with_a_message_never_a_traceback(checkpoint, tmp_path,
                                                                   capsys):
    for name, path in _corrupt_cases(checkpoint, tmp_path):
        capsys.readouterr()
        code = T.main(["--resume", path])
        err = capsys.readouterr().err
        assert code == 4, f"{name}: exit {code}, {err}"
        assert "corrupt or not a trainer checkpoint" in err, f"{name}: {err}"
        assert path in err and "Traceback" not in err


def test_a_header_claiming_a_trillion_floats_is_refused_before_allocating(checkpoint, tmp_path,
                                                                          capsys, monkeypatch):
    """The .npy header of `params` claims 10^12 float32 (3.6 TiB); the member is small."""
    with zipfile.ZipFile(checkpoint) as z:
        members = {name: z.read(name) for name in z.namelist()}
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (10**12,)})
    members["params.npy"] = header.getvalue() + b"\0" * 64
    crafted = tmp_path / "huge.npz"
    with zipfile.ZipFile(crafted, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    allocations = []
    real_empty, real_ndarray = np.empty, np.ndarray

    def watched_empty(shape, *a, **k):
        allocations.append(shape)
        return real_empty(shape, *a, **k)
    monkeypatch.setattr(np, "empty", watched_empty)
    capsys.readouterr()
    assert T.main(["--resume", str(crafted)]) == 4
    err = capsys.readouterr().err
    assert "claims" in err and "Traceback" not in err
    assert not [s for s in allocations if np.prod(s, dtype=object) >= 10**9]
    assert real_ndarray is np.ndarray


# ----------------------------------------------------------------- data loss
def test_save_or_log_onto_the_corpus_or_each_other_is_refused(corpus, tmp_path, capsys):
    original = open(corpus, "rb").read()
    link = tmp_path / "same-notes.txt"
    os.symlink(corpus, link)
    relative = os.path.relpath(corpus)
    cases = [["--save", corpus], ["--log", corpus], ["--save", str(link)],
             ["--log", relative],
             ["--save", str(tmp_path / "x.npz"), "--log", str(tmp_path / "x.npz")]]
    for extra in cases:
        capsys.readouterr()
        code = T.main(TINY + ["--data", corpus, "--steps", "1"] + extra)
        captured = capsys.readouterr()
        assert code == 2, f"{extra}: exit {code}"
        assert "is the same file as" in captured.err, captured.err
        assert "step " not in captured.out, "refused before step 1"
    assert open(corpus, "rb").read() == original
    assert not (tmp_path / "x.npz").exists()


def test_log_onto_the_checkpoint_being_resumed_is_refused(checkpoint, corpus, capsys):
    before = open(checkpoint, "rb").read()
    assert T.main(["--resume", checkpoint, "--data", corpus, "--log", checkpoint]) == 2
    assert "is the same file as" in capsys.readouterr().err
    assert open(checkpoint, "rb").read() == before


def test_save_refuses_to_replace_a_file_that_is_not_a_checkpoint(corpus, tmp_path, capsys):
    notes = tmp_path / "thesis.npz"
    notes.write_text("three years of work")
    assert T.main(TINY + ["--data", corpus, "--steps", "1", "--save", str(notes)]) == 2
    assert "is not a trainer checkpoint" in capsys.readouterr().err
    assert notes.read_text() == "three years of work"


def test_temporary_files_of_killed_saves_are_removed_on_the_next_run(corpus, tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()                                      # a pid that no longer runs
    stale = tmp_path / f".run.npz.{gone.pid}.tmp"
    stale.write_bytes(b"half a checkpoint")
    alive = tmp_path / f".run.npz.{os.getppid()}.tmp"  # a process that still runs: kept
    alive.write_bytes(b"someone else is writing")
    assert T.main(TINY + ["--data", corpus, "--steps", "1", "--save",
                          str(tmp_path / "run.npz")]) == 0
    assert not stale.exists()
    assert alive.exists()
    assert sorted(os.listdir(tmp_path)) == sorted(["run.npz", alive.name])


def test_the_folder_is_fsynced_after_the_rename(corpus, tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        return real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    assert T.main(TINY + ["--data", corpus, "--steps", "1", "--save",
                          str(tmp_path / "run.npz")]) == 0
    assert synced[-2:] == ["file", "dir"]


def test_a_full_disk_ends_with_the_path_and_the_old_checkpoint_intact(corpus, tmp_path,
                                                                       monkeypatch, capsys):
    path = str(tmp_path / "run.npz")
    assert T.main(TINY + ["--data", corpus, "--steps", "2", "--save", path]) == 0
    before = open(path, "rb").read()
    real_write = checkpoint_files.write_arrays

    def disk_full(file, arrays):
        real_write(file, {"meta": arrays["meta"]})    # a part gets written, then no space
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(checkpoint_files, "write_arrays", disk_full)
    capsys.readouterr()
    assert T.main(["--resume", path, "--data", corpus, "--steps", "4"]) == 8
    err = capsys.readouterr().err
    assert path in err and "No space left on device" in err and "intact" in err
    assert "Traceback" not in err
    assert open(path, "rb").read() == before
    assert os.listdir(tmp_path) == ["run.npz"], "no temporary file left"


# ------------------------------------------------- argument errors, up front
def _folder_with_a_file(tmp_path):
    (tmp_path / "a-file").write_text("x")
    return str(tmp_path / "a-file" / "run.npz")


ARGUMENT_ERRORS = [
    (["--prompt", "日本"], "--prompt"),
    (["--prompt", "x", "--temperature", "0"], "--temperature"),
    (["--prompt", "x", "--temperature", "nan"], "--temperature"),
    (["--seed", "-1"], "--seed"),
    (["--clip", "-1"], "--clip"),
    (["--clip", "nan"], "--clip"),
    (["--weight-decay", "-0.1"], "--weight-decay"),
    (["--weight-decay", "nan"], "--weight-decay"),
    (["--warmup", "-1"], "--warmup"),
    (["--save-every", "-1"], "--save-every"),
    (["--sample-len", "-5"], "--sample-len"),
    (["--stop-at", "-1"], "--stop-at"),
    (["--time-limit", "nan"], "--time-limit"),
    (["--batch-size", "10000000"], "--batch-size"),
    (["--block-size", "40000", "--batch-size", "100"], "--block-size"),
]


@pytest.mark.parametrize("extra,flag", ARGUMENT_ERRORS, ids=[" ".join(a) for a, _ in
                                                              ARGUMENT_ERRORS])
def test_argument_errors_are_found_before_training(corpus, extra, flag, capsys):
    data = corpus if "--block-size" not in extra else None
    args = TINY + ["--steps", "2"] + (["--data", data] if data else [])
    code = T.main(args + extra)
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert flag in captured.err and "Traceback" not in captured.err
    assert "step " not in captured.out


def test_unwritable_save_and_log_paths_are_found_before_training(corpus, tmp_path, capsys):
    cases = [(["--save", _folder_with_a_file(tmp_path)], "which is a file"),
             (["--save", str(tmp_path)], "is a directory"),
             (["--log", str(tmp_path)], "is a directory"),
             (["--log", str(tmp_path / "missing" / "log.jsonl")], "does not exist"),
             (["--log", str(tmp_path / "a-file" / "log.jsonl")], "which is a file")]
    for extra, message in cases:
        capsys.readouterr()
        code = T.main(TINY + ["--data", corpus, "--steps", "1"] + extra)
        captured = capsys.readouterr()
        assert code == 2 and message in captured.err, (extra, captured.err)
        assert "step " not in captured.out


def test_resuming_with_no_steps_left_is_an_error(checkpoint, corpus, capsys):
    for steps in ("2", "1"):
        capsys.readouterr()
        assert T.main(["--resume", checkpoint, "--data", corpus, "--steps", steps]) == 2
        err = capsys.readouterr().err
        assert "is at step 2" in err and "nothing left to train" in err
    assert T.main(["--resume", checkpoint, "--data", corpus, "--stop-at", "2"]) == 2


def test_the_memory_estimate_matches_the_buffers_the_model_allocates():
    """preflight sums the table engine.fused_buffers; StepBuffers must allocate
    exactly its arrays (no array outside it, each layer set counted)."""
    from engine.trainer.model import StepBuffers
    cfg = T.TrainConfig(n_layer=2, n_head=2, n_embd=16, block_size=8).model_config(11)
    for attention in ("standard", "flash"):
        for checkpointing in (False, True):
            for dtype in (np.float32, np.float64):
                real = StepBuffers(cfg, 3, cfg.block_size, dtype, checkpointing, attention)
                total = sum(a.nbytes for a in vars(real).values() if isinstance(a, np.ndarray))
                total += sum(s.nbytes() for s in real.layer_sets)
                assert preflight.step_bytes(cfg, 3, np.dtype(dtype).itemsize, checkpointing,
                                            attention) == total, (attention, checkpointing)


def test_the_memory_estimate_of_a_flash_run_counts_no_t_by_t_probabilities():
    standard = T.TrainConfig(batch_size=8, block_size=1024)
    flash = T.TrainConfig(batch_size=8, block_size=1024, attention="flash")
    acts = {c.attention: preflight.training_bytes(c, 100, 8, 2)["activations"]
            for c in (standard, flash)}
    cfg = standard.model_config(100)
    probabilities = 4 * 8 * cfg.n_head * 1024 * (1024 - 1) * cfg.n_layer   # P, less the lse
    assert acts["standard"] - acts["flash"] == probabilities


def test_the_memory_check_refuses_what_does_not_fit():
    config = T.TrainConfig(batch_size=64, block_size=1024)
    needed = sum(preflight.training_bytes(config, 100, 64, 2).values())
    assert preflight.check_memory(config, 100, 64, 2, available=needed) == needed
    with pytest.raises(T.TrainError, match="needs about .* GiB per process"):
        preflight.check_memory(config, 100, 64, 2, available=needed - 1)


@pytest.mark.parametrize("flag", ["--batch-size", "--threads"])
def test_bench_refuses_zero_batch_size_and_threads(flag, capsys):
    from engine import bench
    with pytest.raises(SystemExit) as exit_info:
        bench.main([flag, "0", "--no-torch", "--steps", "1"])
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err


# ---------------------------------------------------------------------- MPI
def _mpiexec():
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install -e '.[mpi]')")
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = here if os.path.exists(here) else shutil.which("mpiexec")
    if found is None:
        pytest.skip("no mpiexec on PATH (pip install -e '.[mpi]' installs MPICH's)")
    return found


def _under_mpi(script, timeout=240):
    return subprocess.run([_mpiexec(), "-n", "2", sys.executable, "-c", script], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


MPI_ARGS = TINY[:-2] + ["--data-parallel", "--threads", "1"]


def test_an_argument_error_under_mpi_is_printed_once():
    done = _under_mpi("import sys; from engine.train import main; "
                      f"sys.exit(main({MPI_ARGS + ['--steps', '2', '--seed', '-1']!r}))")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("--seed must be 0 or more") == 1, done.stderr


def test_a_check_failing_on_one_process_stops_every_process_before_step_1():
    script = ("import sys\n"
              "from mpi4py import MPI\n"
              "from engine.trainer import train as tr\n"
              "from engine.trainer.config import TrainError\n"
              "real = tr.check_paths\n"
              "def check(config):\n"
              "    if MPI.COMM_WORLD.Get_rank() == 1:\n"
              "        raise TrainError('--save: this disk is not mounted here')\n"
              "    real(config)\n"
              "tr.check_paths = check\n"
              "from engine.train import main\n"
              f"sys.exit(main({MPI_ARGS + ['--steps', '2', '--json']!r}))\n")
    done = _under_mpi(script)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("process 1: --save: this disk is not mounted here") == 1
    assert '"loss"' not in done.stdout


def test_a_failure_on_one_process_aborts_the_job_instead_of_hanging(tmp_path):
    save = str(tmp_path / "run.npz")
    script = ("import errno, os, sys\n"
              "import numpy\n"
              "def disk_full(file, **arrays):\n"
              "    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
              "numpy.savez = disk_full\n"
              "from engine.train import main\n"
              f"sys.exit(main({MPI_ARGS + ['--steps', '6', '--save-every', '1']!r}"
              f" + ['--save', {save!r}]))\n")
    done = _under_mpi(script, timeout=180)   # before the fix: rank 1 waited forever
    assert done.returncode != 0
    assert "No space left on device" in done.stderr and save in done.stderr
    assert "aborting all 2 processes" in done.stderr
