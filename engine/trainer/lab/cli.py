"""`python -m engine.bench`: the command line of the benchmark."""
from __future__ import annotations

import argparse
import json
import sys

from ...gpt_config import GPTConfig
from ..thread_plan import MODES as THREAD_MODES
from .attention_sweep import SWEEP_LENGTHS, format_sweep, sweep_attention
from .report import (format_first_step, format_profile, format_report, format_scaling,
                     format_table)
from .versus_torch import DEFAULT_SHAPES, SHAPES, parse_shape, run, run_shapes


def build_parser() -> argparse.ArgumentParser:
    """Every flag of `python -m engine.bench`."""
    p = argparse.ArgumentParser(prog="python -m engine.bench",
                                description="Tokens/s and ms/step of the fused GPT trainer, "
                                            "next to PyTorch eager when it is installed.")
    p.add_argument("--steps", type=int, default=20, help="timed steps (median; default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=None,
                   help="default: the built-in corpus's character count")
    p.add_argument("--threads", type=int, nargs="+", default=None, metavar="N",
                   help="threads (default: all cores); several, e.g. --threads 1 2 4: "
                        "one scaling table, each count's plan beside PyTorch's with as "
                        "many threads")
    p.add_argument("--thread-mode", choices=THREAD_MODES, default=None,
                   help="replicas: one model copy per thread; kernels: one model with "
                        "multi-threaded kernels (default: the trainer's rule chooses, "
                        "engine/trainer/lab/THREADS.md)")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    p.add_argument("--torch-attention", choices=("sdpa", "manual"), default="sdpa")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--shapes", nargs="*", metavar="SHAPE", default=None,
                   help="instead of one shape: one table over these shapes (presets "
                        + ", ".join(f"{k}=B{v[0]},T{v[1]},L{v[2]},H{v[3]},C{v[4]}"
                                    for k, v in SHAPES.items())
                        + "; or key=value pairs over tiny's, e.g. T=256,B=8); "
                        "no names: all the presets")
    p.add_argument("--block", type=int, default=4,
                   help="steps per block when alternating with PyTorch (default 4)")
    p.add_argument("--alone-steps", type=int, default=None,
                   help="steps of each side run alone first (default steps // 2; 0: none)")
    p.add_argument("--attention", choices=("standard", "flash"), default="standard",
                   help="our attention kernel: standard keeps the T x T probabilities, "
                        "flash one number per row")
    p.add_argument("--sweep-attention", action="store_true",
                   help="instead: saved bytes and forward+backward ms of both kernels and "
                        "PyTorch SDPA at T = " + ", ".join(map(str, SWEEP_LENGTHS))
                        + " (B = 2048 // T; median of --steps forward+backward passes)")
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.block < 1 or (args.alone_steps or 0) < 0:
        p.error("--steps and --block must be >= 1, --warmup and --alone-steps >= 0")
    for flag, value in [("--batch-size", args.batch_size)] + [("--threads", n) for n
                                                               in args.threads or ()]:
        if value is not None and value < 1:
            p.error(f"{flag} must be at least 1, got {value}")
    thread_counts = args.threads or [None]
    if len(thread_counts) > 1 and args.sweep_attention:
        p.error(f"--sweep-attention runs at one thread count; got --threads "
                f"{' '.join(map(str, thread_counts))}: give one")
    from ..data import Dataset, builtin_text
    data = None
    vocab = args.vocab_size
    if vocab is None:
        ds = Dataset.from_text(builtin_text())
        vocab, data = ds.tokenizer.vocab_size, ds.train
    progress = None if args.json else (lambda s: print(s, file=sys.stderr))
    options = dict(steps=args.steps, warmup=args.warmup, with_torch=not args.no_torch,
                   torch_attention=args.torch_attention, threads=thread_counts[0],
                   thread_mode=args.thread_mode, attention=args.attention, block=args.block,
                   alone=args.alone_steps)
    if args.shapes is not None:
        try:
            shapes = [parse_shape(s) for s in (args.shapes or DEFAULT_SHAPES)]
        except ValueError as exc:
            p.error(str(exc))
        if len(thread_counts) > 1:
            reports = [r for n in thread_counts for r in
                       run_shapes(shapes, vocab, data=data, progress=progress,
                                  **{**options, "threads": n})]
            print(json.dumps(reports, indent=2) if args.json else format_scaling(reports))
            return 0
        reports = run_shapes(shapes, vocab, data=data, progress=progress, **options)
        if args.json:
            print(json.dumps(reports, indent=2))
        else:
            print(format_table(reports))
            for r in reports:
                print(f"\n[{r['shape']}] {format_first_step(r)}; " + "\n".join(format_profile(r)))
        return 0
    try:
        cfg = GPTConfig(vocab_size=vocab, block_size=args.block_size, n_layer=args.n_layer,
                        n_head=args.n_head, n_embd=args.n_embd)
    except ValueError as exc:
        p.error(str(exc))
    if args.sweep_attention:
        sweep = sweep_attention(cfg, repeats=args.steps, threads=thread_counts[0],
                                with_torch=not args.no_torch,
                                progress=None if args.json else
                                (lambda s: print(s, file=sys.stderr)))
        print(json.dumps(sweep, indent=2) if args.json else format_sweep(sweep))
        return 0
    if len(thread_counts) > 1:
        reports = [run(cfg, args.batch_size, data=data, progress=progress,
                       **{**options, "threads": n}) for n in thread_counts]
        print(json.dumps(reports, indent=2) if args.json else format_scaling(reports))
        return 0
    report = run(cfg, args.batch_size, data=data, progress=progress, **options)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0
