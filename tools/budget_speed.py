"""How much CPU one budget answer costs: the command line's and the page's, uncached.

    python tools/budget_speed.py [--runs 7] [--profile]

Prints the CPU time (time.process_time: this process only, so other work on the
machine does not count) of
  * the command line (`engine.budget.cli.main`, its output discarded) for three
    presets with a device, so the fit searches run;
  * a page answer (`widgets.budget_page.answers._panels`, what the page computes per
    request: the budget with its fit searches, LoRA's table beside full fine-tuning,
    the HTML panels and the memory bar's picture), for the page's opening settings and
    a LoRA fine-tune, and the budget alone (`engine.budget.budget`) for the same two.
Each figure is the median of `--runs` runs, every run uncached: the page's answer
cache and the budget's own caches are emptied before each. `--profile` prints
cProfile's 25 costliest functions of one uncached page answer instead.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import budget as B  # noqa: E402
from engine.budget import fit  # noqa: E402
from engine.budget.cli import main  # noqa: E402
from widgets.budget_page import answers  # noqa: E402
from widgets.budget_page.settings import config_from_params  # noqa: E402

CLI_RUNS = {
    "gpt2-small, transformer, H100": ["--preset", "gpt2-small", "--device", "h100"],
    "llama3.1-8b, hf, recompute, 8 x ZeRO-2, H100": [
        "--preset", "llama3.1-8b", "--activations", "hf", "--recompute", "full",
        "--devices", "8", "--zero", "2", "--device", "h100"],
    "qwen2.5-7b, hf, LoRA r=16, H100": [
        "--preset", "qwen2.5-7b", "--activations", "hf", "--lora-rank", "16",
        "--device", "h100"],
}
PAGE_RUNS = {
    "the page's opening settings (gpt2-small, hf, H200)": {},
    "llama3.1-8b, LoRA r=16, H100": {"preset": "llama3.1-8b", "lora_rank": "16",
                                     "device": "H100-80GB-SXM"},
}


def uncached() -> None:
    """Empty every cache an answer could be read from."""
    answers._cache.clear()
    fit.clear_caches()


def cpu_seconds(work, runs: int) -> float:
    """The median CPU time of `runs` uncached calls of `work`."""
    times = []
    for _ in range(runs):
        uncached()
        start = time.process_time()
        work()
        times.append(time.process_time() - start)
    return statistics.median(times)


def run_cli(argv: list[str]) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0, argv


def page_config(params: dict) -> B.BudgetConfig:
    return config_from_params(params)[0]


def report(runs: int) -> None:
    # one warm-up of each, so imports and matplotlib's first figure are not counted
    for argv in CLI_RUNS.values():
        run_cli(argv)
    for params in PAGE_RUNS.values():
        answers._panels(page_config(params))
    print(f"CPU seconds, median of {runs} uncached runs (time.process_time)")
    for name, argv in CLI_RUNS.items():
        print(f"  cli     {cpu_seconds(lambda: run_cli(argv), runs):7.3f}  {name}")
    for name, params in PAGE_RUNS.items():
        cfg = page_config(params)
        print(f"  page    {cpu_seconds(lambda: answers._panels(cfg), runs):7.3f}  {name}")
        print(f"  budget  {cpu_seconds(lambda: B.budget(cfg), runs):7.3f}  {name}")


def profile() -> None:
    cfg = page_config(PAGE_RUNS["llama3.1-8b, LoRA r=16, H100"])
    answers._panels(cfg)
    uncached()
    profiler = cProfile.Profile()
    profiler.runcall(answers._panels, cfg)
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    profile() if args.profile else report(args.runs)
