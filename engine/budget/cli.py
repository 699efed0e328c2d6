"""The command line: `python -m engine.budget --help`."""
from __future__ import annotations

import argparse
import json
import re
import sys

from .config import (ACTIVATION_MODELS, ARCHITECTURES, ATTENTIONS, BudgetConfig, BudgetError,
                     GRAD_PRECISIONS, OPTIMIZERS, PRECISIONS, PRESET_NAMES, REAL_STEP_MODELS,
                     RECOMPUTE, preset)
from .devices import DEVICES, this_machine
from .hf import config_from_hf, read_hf_config
from .total import budget
from .report import describe, describe_breakdown

THIS_MACHINE_FLAG = "this-machine"


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
    "--kv-heads": ("n_kv_head", int, "key/value heads of grouped-query attention (llama; "
                   "0: one per head)"),
    "--head-dim": ("d_head", int, "size of one attention head (llama; 0: width / heads)"),
    "--devices": ("devices", int, "data-parallel devices N (each runs its own micro-batches)"),
}

_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_RATE_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}


def _with_unit(text: str, units: dict, what: str, example: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    if not m or m.group(2) not in units or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not {what}; write a positive number with an optional unit, "
            f"e.g. {example}")
    return float(m.group(1)) * units[m.group(2)]


def memory_size(text: str) -> int:
    """'80GB' -> 80e9 bytes, '24GiB' -> 24 * 2^30; a plain number is bytes."""
    return int(_with_unit(text, _SIZE_UNITS, "a memory size", "80GB, 24GiB, 40e9"))


def flop_rate(text: str) -> int:
    """'312T' -> 312e12 FLOP/s; a plain number is FLOP/s."""
    return int(_with_unit(text, _RATE_UNITS, "a FLOP/s figure", "312T, 1.5e14"))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m engine.budget",
        description="The training-step budget of a GPT-style model: parameters, FLOPs "
                    "(forward, backward, recompute; per token, micro-batch and step) and "
                    "bytes (weights, master weights, gradients, optimizer state, "
                    "activations, peak). Start from a preset and change any knob.",
        epilog="examples:\n  python -m engine.budget --preset 7b-example\n"
               "  python -m engine.budget --preset gpt2-small --batch 4 --precision bf16 "
               "--recompute full\n  python -m engine.budget --preset tiny --json\n"
               "  python -m engine.budget --preset llama2-7b --devices 8 --zero 3 "
               "--device A100-80GB\n"
               "  python -m engine.budget --hf-config path/to/config.json --seq 2048 "
               "--device H100-80GB-SXM",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset",
                    help=f"starting configuration: {', '.join(PRESET_NAMES)} (default: tiny, "
                         f"or the shape of --hf-config)")
    ap.add_argument("--hf-config", metavar="FILE",
                    help="read the model shape from a Hugging Face config.json (GPT-2 and "
                         "LLaMA families); batch and policy from the other flags")
    for flag, (_, typ, text) in _KNOBS.items():
        ap.add_argument(flag, type=typ, help=text)
    ap.add_argument("--arch", dest="architecture",
                    help=f"block architecture: {', '.join(ARCHITECTURES)} (llama: RMSNorm, "
                         "SwiGLU, no biases, rotary positions)")
    head = ap.add_mutually_exclusive_group()
    head.add_argument("--untied", action="store_true", help="separate output head")
    head.add_argument("--tied", action="store_true", help="output head tied to the token "
                      "embedding (the presets say which they use)")
    ap.add_argument("--precision", help=f"one of {', '.join(PRECISIONS)} "
                    "(16-bit ones keep fp32 master weights)")
    ap.add_argument("--grad-precision", help=f"one of {', '.join(GRAD_PRECISIONS)}: "
                    "gradients in the weights' precision, or accumulated in fp32 (mixed-"
                    "precision AdamW: 16 or 18 bytes/param)")
    ap.add_argument("--zero", type=int, help="ZeRO stage over --devices: 0 replicate, 1 "
                    "shard optimizer state, 2 and gradients, 3 and weights")
    ap.add_argument("--device", help=f"check against: {', '.join(DEVICES)}, or "
                    f"{THIS_MACHINE_FLAG} (measured now by an sgemm timing)")
    ap.add_argument("--device-memory", type=memory_size, metavar="SIZE",
                    help="device memory, e.g. 80GB or 24GiB (overrides --device's)")
    ap.add_argument("--device-flops", type=flop_rate, metavar="RATE",
                    help="dense FLOP/s at this precision, e.g. 312T (overrides --device's)")
    ap.add_argument("--mfu", type=float, help="model FLOP utilization of the step-time "
                    "estimate (default 0.4)")
    ap.add_argument("--optimizer", help=f"one of {', '.join(OPTIMIZERS)}")
    ap.add_argument("--activations", dest="activation_model",
                    help=f"whose step is modelled: {', '.join(ACTIVATION_MODELS)} (rule: "
                         "k tensors per layer; transformer: the textbook op list; engine: "
                         "this engine's GPT; pytorch: a plain PyTorch GPT as nanoGPT writes "
                         "it; hf: Hugging Face transformers' GPT-2 or LLaMA)")
    ap.add_argument("--attention", help=f"one of {', '.join(ATTENTIONS)}: standard keeps "
                    "the T x T probabilities (eager attention), flash one number per row "
                    "(SDPA's kernels)")
    ap.add_argument("--dropout", choices=("on", "off"), help="dropout (p=0.1) in the step")
    ap.add_argument("--recompute", help=f"one of {', '.join(RECOMPUTE)} (under pytorch and "
                    "hf, full = checkpoint every block, as transformers' "
                    "gradient_checkpointing_enable() does)")
    ap.add_argument("--breakdown", action="store_true", help="list every kept tensor and "
                    "every moment of the step that could be its peak")
    ap.add_argument("--measure", choices=("torch",), help="also run the same step in "
                    "PyTorch (pytorch and hf models; needs torch, and transformers for hf) "
                    "and print measured beside predicted: on CUDA at the given shape, on "
                    "the CPU at a scaled-down one")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    return ap


def config_from_args(args: argparse.Namespace) -> BudgetConfig:
    changes = {field_: getattr(args, flag.lstrip("-").replace("-", "_"))
               for flag, (field_, _, _) in _KNOBS.items()}
    changes = {k: v for k, v in changes.items() if v is not None}
    for knob in ("precision", "optimizer", "activation_model", "recompute", "architecture",
                 "attention", "grad_precision", "zero", "device_memory", "device_flops", "mfu"):
        if getattr(args, knob) is not None:
            changes[knob] = getattr(args, knob)
    if args.untied:
        changes["tied_embedding"] = False
    if args.tied:
        changes["tied_embedding"] = True
    if args.dropout is not None:
        changes["dropout"] = args.dropout == "on"
    if args.device is not None and args.device != THIS_MACHINE_FLAG:
        changes["device"] = args.device
    if args.hf_config is not None:
        if args.preset is not None:
            raise BudgetError("give --preset or --hf-config, not both: both set the model.")
        data = read_hf_config(args.hf_config)
        if "architecture" in changes and changes["architecture"] != data.get("model_type"):
            raise BudgetError(
                f"--arch {changes['architecture']} contradicts the file's model_type "
                f"{data.get('model_type')!r}; leave out --arch (the file says the "
                f"architecture).")
        cfg = config_from_hf(data, source=args.hf_config, **changes)
    else:
        start = preset(args.preset or "tiny")
        # The starting model's limits (its learned positions, the engine's own GPT-2
        # model) belong to it, not to a shape of your own (no preset named) or to
        # another block than the preset's.
        own_shape = args.preset is None and set(changes) & _SHAPE_FIELDS
        other_block = changes.get("architecture", start.architecture) != start.architecture
        if own_shape or other_block:
            changes = {"block_size": 0, **changes}
            if start.activation_model == "engine":
                changes = {"activation_model": "transformer", **changes}
        cfg = start.with_(**changes)
    if args.device == THIS_MACHINE_FLAG:  # measured only once the rest is known to be valid
        measured = this_machine()
        cfg = cfg.with_(**{**measured, **{k: changes[k] for k in
                                          ("device_memory", "device_flops") if k in changes}})
    return cfg


# Knobs that describe the model's shape: set without a preset, they start a model of your own.
_SHAPE_FIELDS = {"n_layer", "d_model", "n_head", "vocab_size", "d_ff", "n_params", "n_kv_head",
                 "d_head", "seq_len", "architecture"}

_FLAG_OF = {**{field_: flag for flag, (field_, _, _) in _KNOBS.items()},
            "activation_model": "--activations", "precision": "--precision",
            "optimizer": "--optimizer", "recompute": "--recompute", "dropout": "--dropout",
            "architecture": "--arch", "grad_precision": "--grad-precision", "zero": "--zero",
            "attention": "--attention",
            "device_memory": "--device-memory", "device_flops": "--device-flops",
            "mfu": "--mfu"}
# Whole phrases first: the head's switch is a pair of flags, not a value.
_PHRASES = {"set tied_embedding=True": "leave out --untied (or pass --tied)",
            "set tied_embedding=False": "pass --untied",
            "device=": "--device "}  # only with '=': "device" is also an English word


def _with_flags(message: str) -> str:
    """Say `--batch 0` where the library says `micro_batch=0`."""
    for phrase, flags in _PHRASES.items():
        message = message.replace(phrase, flags)
    for field_, flag in _FLAG_OF.items():
        message = re.sub(rf"(?<![\w-]){field_}[= ]", f"{flag} ", message)
    return message


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        b = budget(config_from_args(args))
        if args.measure and b.config.activation_model not in REAL_STEP_MODELS:
            raise BudgetError(f"--measure torch runs a PyTorch step, so it needs --activations "
                              f"pytorch or hf, not {b.config.activation_model}.")
        comparison = measured_beside_predicted(b.config) if args.measure else None
    except BudgetError as exc:
        print(f"error: {_with_flags(str(exc))}", file=sys.stderr)
        return 2
    try:
        if args.json:
            out = b.as_dict()
            if comparison:
                out["measured"] = comparison
            print(json.dumps(out, indent=1))
        else:
            print(describe(b) + (f"\n\n{describe_breakdown(b)}" if args.breakdown else "")
                  + (f"\n\n{describe_comparison(comparison)}" if comparison else ""))
    except BrokenPipeError:  # `... | head` closed the pipe early: not an error of ours
        sys.stderr.close()
    return 0


def measured_beside_predicted(cfg: BudgetConfig) -> dict:
    """Run the step in PyTorch (see engine.budget.torch_step) and predict the
    very step that ran, on the device it ran on."""
    from .counts import fixed_bytes
    from .real_step import real_step_activations
    from .torch_step import measure_step
    print("measuring: building the model in PyTorch and running two training steps ...",
          file=sys.stderr, flush=True)
    m = measure_step(cfg)
    fixed = fixed_bytes(m.config)      # the step ran on one device: nothing sharded
    acts = real_step_activations(m.config, device=m.device)
    rows = {"weights": (fixed["weights"], m.weights),
            "activations": (acts.saved, m.activations),
            "peak": (sum(fixed.values()) + acts.peak, m.peak),
            "peak_first_step": (acts.step.first_step_peak_moment.bytes, m.peak_first_step)}
    return {"device": m.device, "config": {"micro_batch": m.config.micro_batch,
                                          "seq_len": m.config.seq_len,
                                          "n_layer": m.config.n_layer,
                                          "precision": m.config.precision},
            "scaled_down": m.config != cfg,
            "rows": {k: {"predicted": p, "measured": v} for k, (p, v) in rows.items()}}


def describe_comparison(comparison: dict) -> str:
    from .report import human_bytes
    c = comparison["config"]
    lines = [f"measured with PyTorch on {comparison['device']}: B={c['micro_batch']} "
             f"N={c['seq_len']} L={c['n_layer']} {c['precision']}"
             + (" (not the budget's shape: one device, and on the CPU scaled down; the "
                "prediction below is for the step that ran)" if comparison["scaled_down"]
                else ""),
             f"  {'':<18}{'predicted':>12}{'measured':>12}{'ratio':>8}"]
    for what, row in comparison["rows"].items():
        ratio = row["predicted"] / row["measured"] if row["measured"] else float("nan")
        lines.append(f"  {what:<18}{human_bytes(row['predicted']):>12}"
                     f"{human_bytes(row['measured']):>12}{ratio:>8.3f}")
    return "\n".join(lines)
