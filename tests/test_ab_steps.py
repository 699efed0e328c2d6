"""tools/ab_steps.py: an older commit's trainer timed beside this tree's, in one process."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args, tmp):
    env = {**os.environ, "TMPDIR": str(tmp)}          # where its temporary folder goes
    return subprocess.run([sys.executable, str(ROOT / "tools" / "ab_steps.py"), *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)


def test_ab_steps_times_both_trees_and_reports_each_kernel(tmp_path):
    r = _run("HEAD", "--B", "2", "--T", "16", "--L", "1", "--H", "2", "--C", "16",
             "--rounds", "2", "--steps", "1", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert list(tmp_path.iterdir()) == []              # the archived engine is gone again
    lines = r.stdout.splitlines()
    step = next(line for line in lines if line.strip().startswith("step:"))
    assert "before" in step and "after" in step and "range" in step
    kernels = [line.split()[0] for line in lines if "before/after" in line and "ms" in line]
    assert {"matmul", "attention_forward", "layernorm_backward"} <= set(kernels)


def test_ab_steps_times_thread_replicas_on_each_side(tmp_path):
    r = _run("HEAD", "--B", "2", "--T", "16", "--L", "1", "--H", "2", "--C", "16",
             "--rounds", "2", "--steps", "1", "--replicas", "2", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "2 replicas" in r.stdout and "step: before" in r.stdout
    bad = _run("HEAD", "--replicas", "0", tmp=tmp_path)
    assert bad.returncode == 2 and "--replicas 0" in bad.stderr


def test_ab_steps_times_the_whole_step_on_request(tmp_path):
    r = _run("HEAD", "--B", "2", "--T", "16", "--L", "1", "--H", "2", "--C", "16",
             "--rounds", "2", "--steps", "1", "--replicas", "2", "--whole-step", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "the whole step, zero_grad to AdamW" in r.stdout and "step: before" in r.stdout
    plain = _run("HEAD", "--B", "2", "--T", "16", "--L", "1", "--H", "2", "--C", "16",
                 "--rounds", "1", "--steps", "1", tmp=tmp_path)
    assert plain.returncode == 0 and "whole step" not in plain.stdout


def test_ab_steps_names_a_commit_git_does_not_know(tmp_path):
    r = _run("no-such-commit-abc", tmp=tmp_path)
    assert r.returncode == 2
    assert "no-such-commit-abc" in r.stderr and "commit" in r.stderr


def test_ab_steps_passes_nothing_but_a_commit_to_git(tmp_path):
    # an argument shaped like a git option (after "--", so argparse lets it through)
    # is refused as not a commit, and writes no file
    target = tmp_path / "written.tar"
    r = _run("--", f"--output={target}", tmp=tmp_path)
    assert r.returncode == 2 and "pass a commit" in r.stderr
    assert not target.exists()
