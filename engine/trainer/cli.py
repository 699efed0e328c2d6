"""The command line of the trainer: `python -m engine.train --help`."""
from __future__ import annotations

import argparse
import json
import sys

from ..fused_buffers import ATTENTION_KINDS
from .checkpoint_files import load_checkpoint, resumed_settings
from .config import MAX_SAMPLE_LEN, TrainConfig, TrainError, check_paths_not_empty
from .mpi_job import launch_rank
from .train import summary, train
from .thread_plan import MODES as THREAD_MODES


# --------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    p = argparse.ArgumentParser(
        prog="python -m engine.train",
        description="Train a character-level GPT on the CPU with the fused kernels.",
        epilog="Examples:\n"
               "  python -m engine.train --steps 300 --prompt 'The '\n"
               "  python -m engine.train --data notes.txt --save run.npz --stop-at 100\n"
               "  python -m engine.train --resume run.npz          # continues bit for bit\n"
               "  mpiexec -n 2 python -m engine.train --data-parallel --steps 100\n"
               "Exit codes: 0 done, 2 bad arguments, 3 unusable data file, 4 corrupt "
               "checkpoint,\n5 settings that do not match the checkpoint, 6 no mpi4py, "
               "7 diverged, 8 a checkpoint or log could not be written.",
        formatter_class=argparse.RawDescriptionHelpFormatter, argument_default=None)
    a = p.add_argument
    a("--data", help="UTF-8 text file to train on (default: the built-in Python docs corpus)")
    a("--steps", type=int, help=f"optimizer steps (default {d.steps})")
    a("--stop-at", type=int, help="stop after this step; continue later with --resume")
    a("--time-limit", type=float, help="stop after this many seconds (saves with --save)")
    a("--batch-size", type=int, help=f"micro-batch of sequences (default {d.batch_size})")
    a("--block-size", type=int, help=f"context length T (default {d.block_size})")
    a("--n-layer", type=int, help=f"blocks (default {d.n_layer})")
    a("--n-head", type=int, help=f"attention heads (default {d.n_head})")
    a("--n-embd", type=int, help=f"width C (default {d.n_embd})")
    a("--grad-accum", type=int, help="micro-batches per optimizer step (default 1)")
    a("--lr", type=float, help=f"peak learning rate (default {d.lr})")
    a("--warmup", type=int, help=f"warm-up steps (default {d.warmup})")
    a("--weight-decay", type=float, help=f"AdamW decay of the matrices (default {d.weight_decay})")
    a("--clip", type=float, help=f"global gradient-norm clip, 0 for none (default {d.clip})")
    a("--eval-every", type=int, help=f"validation loss every N steps (default {d.eval_every})")
    a("--eval-batches", type=int, help=f"validation batches (default {d.eval_batches})")
    a("--val-fraction", type=float, help=f"share held out (default {d.val_fraction})")
    a("--seed", type=int, help="initialisation and batch seed (default 0)")
    a("--dtype", choices=("float32", "float64"), help="float32 trains, float64 checks")
    a("--checkpointing", action="store_true", default=None,
      help="activation checkpointing: recompute each block in the backward")
    a("--attention", choices=ATTENTION_KINDS,
      help="attention kernel: standard keeps the T x T probabilities for the backward, "
           "flash keeps one number per row and recomputes them (default standard)")
    a("--data-parallel", action="store_true", default=None,
      help="split each micro-batch over the processes of mpiexec")
    a("--threads", type=int, help="threads per process (default: cores / processes)")
    a("--thread-mode", choices=THREAD_MODES,
      help="replicas: one model copy per thread, each single-threaded; kernels: one "
           "model whose kernels use every thread (default: chosen from the cores, the "
           "batch and the context length; the run's first lines say which and why)")
    a("--log", help="append a JSON-lines log of every step to this file")
    a("--log-every", type=int, help=f"progress line every N steps (default {d.log_every})")
    a("--save", help="write a checkpoint here (atomically) at each evaluation and the end")
    a("--save-every", type=int, help="also save every N steps")
    a("--resume", help="continue from this checkpoint: the model, optimizer and the run's "
                       "mathematical settings (unless given here); saves back to it unless "
                       "--save says otherwise. Paths, the prompt and threads are never read "
                       "from a checkpoint")
    a("--prompt", help="after training, print a sample continuing this text")
    a("--sample-len", type=int, help=f"characters to sample, at most {MAX_SAMPLE_LEN:,} "
                                     f"(default {d.sample_len})")
    a("--temperature", type=float, help=f"sampling temperature (default {d.temperature})")
    a("--json", action="store_true", help="machine output: one JSON object per line")
    return p


def config_from_args(args: argparse.Namespace, say=None) -> TrainConfig:
    """The run's TrainConfig. With --resume, the settings not given on the command
    line come from the checkpoint, but only those of RESUMED_SETTINGS (a file never
    chooses paths, the prompt or threads), and the run saves back to the file it
    resumed from unless --save says otherwise. say(event) is told which settings
    the checkpoint supplied (describe_resume words it for a person)."""
    given = {k: v for k, v in vars(args).items() if v is not None and k != "json"}
    check_paths_not_empty(given)
    if args.resume is None:
        return TrainConfig(**given)
    state = load_checkpoint(args.resume)
    from_file = {k: v for k, v in resumed_settings(state["meta"]).items() if k not in given}
    given.setdefault("save", args.resume)
    if say is not None:
        say({"event": "resume", "checkpoint": args.resume, "step": state["meta"]["step"],
             "from_checkpoint": from_file, "save": given["save"]})
    return TrainConfig(**{**from_file, **given})


def describe_resume(event: dict) -> str:
    settings = ", ".join(f"{k}={v}" for k, v in event["from_checkpoint"].items()) or "none"
    return (f"resuming {event['checkpoint']!r} at step {event['step']}; settings from the "
            f"checkpoint: {settings}; saving to {event['save']!r}")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    as_json = args.json
    # Under --data-parallel every process runs this; one of them speaks.
    lead = not args.data_parallel or launch_rank() == 0

    def emit(obj_or_line):
        if not lead:
            return
        if as_json:
            print(json.dumps(obj_or_line), flush=True)
        else:
            print(obj_or_line, flush=True)

    try:
        config = config_from_args(args, say=lambda event: emit(
            event if as_json else describe_resume(event)))
        result = train(config, progress=None if as_json else emit,
                       callback=(lambda r: emit(r) if r.get("rank", 0) == 0 else None)
                       if as_json else None)
    except TrainError as exc:
        if lead:
            if as_json:
                print(json.dumps({"event": "error", "error": type(exc).__name__,
                                  "message": str(exc), "exit_code": exc.exit_code}), flush=True)
            print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    if result.rank != 0:
        return 0
    if as_json:
        emit(summary(result))
    else:
        s = summary(result)
        if result.history and (result.final_val_loss is not None):
            emit(f"done: step {s['step']}, validation loss {s['final_val_loss']:.4f} vs unigram "
                 f"entropy {s['unigram_entropy']:.4f} nats, {s['median_tokens_per_s']:,.0f} "
                 f"tokens/s median, {s['elapsed']:.1f} s")
        if result.sample is not None:
            emit("--- sample ---\n" + result.sample)
    return 0
