"""Before/after in one process: the trainer of an older commit against this tree's.

On a machine whose speed drifts by tens of percent within minutes, two benchmark
runs minutes apart cannot show a 5% change. This script imports the engine of
another commit beside this one (extracted with `git archive` into a temporary
folder, as a package named `engine_before`), builds the same single-threaded
model with each, and times them in alternating rounds (before first in even
rounds, after first in odd ones). It prints the median step of each, the median
of the per-round ratios with their range, and the per-kernel profile of both.

    python tools/ab_steps.py 808facc                      # tiny shape, one replica
    python tools/ab_steps.py 808facc --T 1024 --B 1 --attention flash
    python tools/ab_steps.py 808facc --replicas 2         # the trainer's default on 2 cores
    python tools/ab_steps.py 808facc --replicas 2 --whole-step   # zero_grad ... AdamW too

One thread, one replica by default: what the kernels cost without the other
replica's contention (the trainer's default runs one such replica per core).
With --replicas N, each side is the trainer's ThreadReplicas, N replicas of
B sequences each, one thread apiece: what changes in how they share a step.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def extract_engine(commit: str, into: Path) -> None:
    """engine/ of `commit` as the package `engine_before` under `into`."""
    # Resolved to a commit hash first, so the argument can only name a commit, never
    # reach git as an option (git archive --output=FILE would write a file).
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet",
                          "--end-of-options", f"{commit}^{{commit}}"],
                         capture_output=True, text=True, check=True).stdout.strip()
    archive = into / "engine.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(ROOT), "archive", sha, "engine"], stdout=out,
                       check=True)
    with tarfile.open(archive) as tar:                # our own repository's files
        if hasattr(tarfile, "data_filter"):
            tar.extractall(into, filter="data")
        else:                                         # Python < 3.10.12 / 3.11.4
            tar.extractall(into)
    (into / "engine").rename(into / "engine_before")


def build(package: str, args, vocab: int):
    gpt_config = importlib.import_module(f"{package}.gpt_config")
    model = importlib.import_module(f"{package}.trainer.model")
    cfg = gpt_config.GPTConfig(vocab_size=vocab, block_size=args.T, n_layer=args.L,
                               n_head=args.H, n_embd=args.C)
    if args.replicas == 1:
        return model.FusedGPT(cfg, args.B, attention=args.attention)
    parallel = importlib.import_module(f"{package}.trainer.parallel")
    return parallel.ThreadReplicas(cfg, args.B * args.replicas, args.replicas,
                                   attention=args.attention)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", help="the commit to compare with (e.g. a hash or HEAD~3)")
    for name, default in (("B", 8), ("T", 128), ("L", 4), ("H", 4), ("C", 128)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--attention", choices=("standard", "flash"), default="standard")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=4, help="steps per round and side")
    p.add_argument("--replicas", type=int, default=1,
                   help="thread replicas per side, B sequences each (default 1)")
    p.add_argument("--whole-step", action="store_true",
                   help="time the trainer's whole step (step.accumulate_and_step: zero_grad, forward "
                        "and backward, clipping, AdamW), not forward and backward alone")
    args = p.parse_args(argv)
    if args.replicas < 1:
        p.error(f"--replicas {args.replicas}: a side needs at least 1 replica")

    folder = Path(tempfile.mkdtemp(prefix="ab_steps_"))   # removed when done
    try:
        return compare(args, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def compare(args, folder: Path) -> int:
    try:
        extract_engine(args.before, folder)
    except subprocess.CalledProcessError:
        print(f"ab_steps: git could not archive engine/ at {args.before!r}; "
              f"pass a commit of this repository", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    sys.path.insert(1, str(folder))
    from engine.trainer.kernels.threads import set_threads
    set_threads(1, blas=1)
    vocab = 103
    packages = {"before": "engine_before", "after": "engine"}
    models = {name: build(package, args, vocab) for name, package in packages.items()}
    rng = np.random.default_rng(0)
    ids, targets = (rng.integers(0, vocab, (args.B * args.replicas, args.T)) for _ in range(2))

    def forward_backward(model):
        model.zero_grad()
        t0 = time.perf_counter()
        model.forward_backward(ids, targets)
        return time.perf_counter() - t0

    # each side's timer: its forward and backward, or its own whole step and AdamW
    timers = {name: whole_step(packages[name], model, ids, targets) if args.whole_step
              else functools.partial(forward_backward, model) for name, model in models.items()}
    try:
        return _rounds(args, models, timers)
    finally:
        for model in models.values():
            if hasattr(model, "close"):                # ThreadReplicas: stop its threads
                model.close()


def whole_step(package: str, model, ids, targets):
    """A function timing one step of the trainer of `package` on `model`: its own
    accumulate_and_step, with its own AdamW (the benchmark's settings)."""
    model_module = importlib.import_module(f"{package}.trainer.model")
    optim = importlib.import_module(f"{package}.trainer.optim")
    step_module = importlib.import_module(f"{package}.trainer.step")
    opt = optim.AdamW(model.params.flat, model_module.decay_segments(model.params), lr=1e-3,
                      weight_decay=0.1)
    # (named train_step in commits before the exercise's train_step got the name alone)
    step = getattr(step_module, "accumulate_and_step", None) or step_module.train_step

    def one():
        t0 = time.perf_counter()
        step(model, opt, [(ids, targets)], lr=1e-3, clip=1.0)
        return time.perf_counter() - t0
    return one


def _rounds(args, models, timers) -> int:
    """timers[name]() runs one step of side `name` and returns its seconds."""
    from engine.trainer.lab.profile import KernelProfiler
    for name in models:                               # compile (or load) and warm up
        for _ in range(3):
            timers[name]()
    medians = {name: [] for name in models}
    profiles = {name: {} for name in models}
    for r in range(args.rounds):
        for name in (("before", "after") if r % 2 == 0 else ("after", "before")):
            with KernelProfiler(models[name]) as prof:
                medians[name].append(float(np.median([timers[name]() for _ in range(args.steps)])))
            for kernel, seconds in prof.seconds.items():
                profiles[name].setdefault(kernel, []).append(seconds / args.steps)
    ratios = np.array(medians["before"]) / np.array(medians["after"])
    who = "one thread" if args.replicas == 1 else f"{args.replicas} replicas (profile: replica 0)"
    print(f"B={args.B} T={args.T} L={args.L} H={args.H} C={args.C} {args.attention}, {who}, "
          f"{args.rounds} rounds of {args.steps} steps (profiled"
          + ("; each the whole step, zero_grad to AdamW" if args.whole_step else "") + "):")
    print(f"  step: before {np.median(medians['before']) * 1e3:.1f} ms, after "
          f"{np.median(medians['after']) * 1e3:.1f} ms; before/after {np.median(ratios):.3f} "
          f"(range {ratios.min():.3f}-{ratios.max():.3f})")
    after = profiles["after"]
    for kernel in sorted(after, key=lambda k: -np.median(after[k])):
        a = np.median(after[kernel]) * 1e3
        b = np.median(profiles["before"].get(kernel, [np.nan])) * 1e3
        print(f"  {kernel:28s} before {b:7.2f} ms  after {a:7.2f} ms  before/after {b / a:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
