"""The command line: `python -m engine.budget --help`."""
from __future__ import annotations

import argparse
import json
import re
import sys

from .config import ACTIVATION_MODELS, BudgetConfig, BudgetError, OPTIMIZERS, PRECISIONS, PRESET_NAMES, RECOMPUTE, preset
from .total import budget
from .report import describe


# ------------------------------------------------------------ command line
_KNOBS = {  # flag -> (config field, type, help)
    "--layers": ("n_layer", int, "number of blocks L"),
    "--width": ("d_model", int, "model width d (C)"),
    "--heads": ("n_head", int, "attention heads a; must divide the width"),
    "--vocab": ("vocab_size", int, "vocabulary size V"),
    "--mlp-width": ("d_ff", int, "MLP width (0: 4 x width)"),
    "--positions": ("block_size", int, "learned positions (0: the sequence length)"),
    "--params": ("n_params", int, "plain parameter count instead of the formula (0: formula)"),
    "--batch": ("micro_batch", int, "micro-batch B (sequences)"),
    "--seq": ("seq_len", int, "sequence length N (tokens)"),
    "--accum": ("accumulation", int, "micro-batches per optimizer step K"),
    "--tensors-per-layer": ("tensors_per_layer", int, "k of the rule of thumb"),
}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m engine.budget",
        description="The training-step budget of a GPT-style model: parameters, FLOPs "
                    "(forward, backward, recompute; per token, micro-batch and step) and "
                    "bytes (weights, master weights, gradients, optimizer state, "
                    "activations, peak). Start from a preset and change any knob.",
        epilog="examples:\n  python -m engine.budget --preset 7b-example\n"
               "  python -m engine.budget --preset gpt2-small --batch 4 --precision bf16 "
               "--recompute full\n  python -m engine.budget --preset tiny --json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny",
                    help=f"starting configuration: {', '.join(PRESET_NAMES)} (default: tiny)")
    for flag, (_, typ, text) in _KNOBS.items():
        ap.add_argument(flag, type=typ, help=text)
    ap.add_argument("--untied", action="store_true", help="separate output head (default tied)")
    ap.add_argument("--precision", help=f"one of {', '.join(PRECISIONS)} "
                    "(16-bit ones keep fp32 master weights)")
    ap.add_argument("--optimizer", help=f"one of {', '.join(OPTIMIZERS)}")
    ap.add_argument("--activations", dest="activation_model",
                    help=f"activation model: {', '.join(ACTIVATION_MODELS)}")
    ap.add_argument("--dropout", choices=("on", "off"), help="dropout masks in the "
                    "transformer model")
    ap.add_argument("--recompute", help=f"one of {', '.join(RECOMPUTE)}")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    return ap


def config_from_args(args: argparse.Namespace) -> BudgetConfig:
    changes = {field_: getattr(args, flag.lstrip("-").replace("-", "_"))
               for flag, (field_, _, _) in _KNOBS.items()}
    changes = {k: v for k, v in changes.items() if v is not None}
    for knob in ("precision", "optimizer", "activation_model", "recompute"):
        if getattr(args, knob) is not None:
            changes[knob] = getattr(args, knob)
    if args.untied:
        changes["tied_embedding"] = False
    if args.dropout is not None:
        changes["dropout"] = args.dropout == "on"
    return preset(args.preset, **changes)


_FLAG_OF = {**{field_: flag for flag, (field_, _, _) in _KNOBS.items()},
            "activation_model": "--activations", "precision": "--precision",
            "optimizer": "--optimizer", "recompute": "--recompute", "dropout": "--dropout",
            "tied_embedding": "--untied"}


def _with_flags(message: str) -> str:
    """Say `--batch 0` where the library says `micro_batch=0`."""
    for field_, flag in _FLAG_OF.items():
        message = re.sub(rf"(?<![\w-]){field_}[= ]", f"{flag} ", message)
    return message


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        b = budget(config_from_args(args))
    except BudgetError as exc:
        print(f"error: {_with_flags(str(exc))}", file=sys.stderr)
        return 2
    try:
        print(json.dumps(b.as_dict(), indent=1) if args.json else describe(b))
    except BrokenPipeError:  # `... | head` closed the pipe early: not an error of ours
        sys.stderr.close()
    return 0
