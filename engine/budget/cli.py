"""The command line: `python -m engine.budget --help`."""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from decimal import Decimal

from .config import BudgetConfig, BudgetError, PRESET_NAMES, REAL_STEP_MODELS, preset
from .devices import DEVICES, this_machine
from .hf import LLAMA_SHAPED, config_and_sources, read_hf_config
from .hub import hub_config
from .knobs import KNOBS, PLAN_KNOBS, SWITCH, Knob, shown_on
from .plan import describe_plan, plan
from .total import budget
from .report import describe, describe_breakdown

THIS_MACHINE_FLAG = "this-machine"


# ------------------------------------------------------------ command line
_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_RATE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15}
_MAX_DIGITS = 24  # longer than any bound of the knob table: refused before int() reads it


def _with_unit(text: str, units: dict, what: str, example: str, unit: str) -> int:
    m = re.fullmatch(r"\s*([0-9]{1,24}(?:\.[0-9]{1,24})?(?:e[0-9]{1,3})?)\s*([a-z]*)\s*",
                     text.lower())
    if not m or m.group(2) not in units:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not {what}; write a positive number with an optional unit, "
            f"e.g. {example}")
    value = Decimal(m.group(1)) * units[m.group(2)]  # exact: no float overflow or rounding
    if value > 10 ** 30:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is far larger than any {what}")
    if 0 < value < 1:  # int() would make it 0, which means "the device's own"
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is below 1, but a plain number counts {unit}: a fraction is a "
            f"unit slip; write the unit, e.g. {example}")
    return int(value)


def memory_size(text: str) -> int:
    """'80GB' -> 80e9 bytes, '24GiB' -> 24 * 2^30; a plain number is bytes."""
    return _with_unit(text, _SIZE_UNITS, "a memory size", "80GB, 24GiB, 40e9", "bytes")


def flop_rate(text: str) -> int:
    """'312T' -> 312e12 FLOP/s; a plain number is FLOP/s."""
    return _with_unit(text, _RATE_UNITS, "a FLOP/s figure", "312T, 1.5e14", "FLOP/s")


def whole_number(text: str) -> int:
    """A whole number of at most _MAX_DIGITS digits (the knob's own bounds follow)."""
    digits = text.strip().lstrip("+-")
    if not digits.isdigit() or len(digits) > _MAX_DIGITS:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a whole number of at most {_MAX_DIGITS} digits")
    return int(text)


def finite_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a finite number")
    return value


# How the command line reads each kind of knob (the knob table says which exist).
_PARSE = {"device_memory": memory_size, "device_flops": flop_rate, "headroom": memory_size,
          "link_bandwidth": memory_size}
_KIND_PARSE = {int: whole_number, float: finite_number, str: str}


def _add_knob(ap: argparse.ArgumentParser, k: Knob) -> None:
    """One flag per knob of the table, its help and choices from there."""
    zero = f"; 0: {k.zero_means}" if k.zero_means else ""
    if k.field == "tied_embedding":
        head = ap.add_mutually_exclusive_group()
        head.add_argument("--untied", dest="tied_embedding", action="store_const",
                          const=False, help="separate output head")
        head.add_argument("--tied", dest="tied_embedding", action="store_const", const=True,
                          help="output head tied to the token embedding (the presets say "
                               "which they use)")
    elif k.kind is bool and k.field == "padded_batch":
        ap.add_argument(k.flag, dest=k.field, action="store_const", const=True,
                        help=k.help)
    elif k.kind is bool:
        ap.add_argument(k.flag, dest=k.field, choices=SWITCH, help=k.help)
    elif k.field == "device":
        ap.add_argument(k.flag, dest=k.field, help=f"check against: {', '.join(DEVICES)}, "
                        f"or {THIS_MACHINE_FLAG} (measured now by an sgemm timing)")
    elif k.choices:
        # The choices are checked by BudgetConfig.validate, whose message says them.
        ap.add_argument(k.flag, dest=k.field, type=_KIND_PARSE.get(k.kind, str),
                        metavar="{" + ",".join(map(str, k.choices)) + "}", help=k.help)
    else:
        ap.add_argument(k.flag, dest=k.field, type=_PARSE.get(k.field, _KIND_PARSE[k.kind]),
                        help=k.help + zero)


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
                    help="read the model shape from a Hugging Face config.json (GPT-2, the "
                         "LLaMA family: Llama, Qwen2, Qwen3, Mistral, Gemma, Gemma 2, Gemma 3 "
                         "text); batch and policy from the other flags")
    ap.add_argument("--hf-model", metavar="ID",
                    help="read the config.json of a Hugging Face Hub model by its id, e.g. "
                         "meta-llama/Llama-3.1-8B (needs huggingface_hub; fetched once, "
                         "then read from its disk cache; HF_TOKEN for a gated model)")
    for k in shown_on("cli"):
        _add_knob(ap, k)
    ap.add_argument("--breakdown", action="store_true", help="list every kept tensor and "
                    "every moment of the step that could be its peak")
    ap.add_argument("--measure", choices=("torch",), help="also run the same step in "
                    "PyTorch (pytorch and hf models; needs torch, and transformers for hf) "
                    "and print measured beside predicted: on CUDA at the given shape, on "
                    "the CPU at a scaled-down one")
    ap.add_argument("--plan", action="store_true", help="list the settings that fit the "
                    "device, fastest first (micro-batch x accumulation, recompute, attention, "
                    "ZeRO stage, LoRA or full fine-tuning), each with its step time and peak "
                    "(engine.budget.plan; needs --device)")
    for k in PLAN_KNOBS.values():
        _add_knob(ap, k)
    ap.add_argument("--json", action="store_true", help="machine-readable output (with "
                    "--plan: the plan's rows as a list)")
    return ap


def config_from_args(args: argparse.Namespace) -> BudgetConfig:
    return config_and_sources_from_args(args)[0]


def config_and_sources_from_args(args: argparse.Namespace) -> tuple[BudgetConfig, dict]:
    """The configuration the flags describe, and where each switch of a --hf-config
    file came from (engine.budget.hf.Source; empty without a file)."""
    changes = {k.field: getattr(args, k.field) for k in shown_on("cli")}
    changes = {f: v for f, v in changes.items() if v is not None}
    for f, v in list(changes.items()):
        if KNOBS[f].kind is bool and isinstance(v, str):
            changes[f] = v == "on"
    if changes.get("device") == THIS_MACHINE_FLAG:
        del changes["device"]
    sources = {}
    hf_model = getattr(args, "hf_model", None)
    if args.hf_config is not None or hf_model is not None:
        named = [flag for flag, value in (("--preset", args.preset), ("--hf-config",
                 args.hf_config), ("--hf-model", hf_model)) if value is not None]
        if len(named) > 1:
            raise BudgetError(f"give {' or '.join(named)}, not both: each sets the model.")
        data = read_hf_config(args.hf_config) if hf_model is None else hub_config(hf_model)
        kind = data.get("model_type")
        block = "llama" if kind in LLAMA_SHAPED else kind
        if "architecture" in changes and changes["architecture"] != block:
            raise BudgetError(
                f"--arch {changes['architecture']} contradicts the file's model_type "
                f"{kind!r} (a {block} block); leave out --arch (the file says the "
                f"architecture).")
        cfg, sources = config_and_sources(data, source=args.hf_config or hf_model, **changes)
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
    return cfg, sources


# Knobs that describe the model's shape: set without a preset, they start a model of your own.
_SHAPE_FIELDS = {"n_layer", "d_model", "n_head", "vocab_size", "d_ff", "n_params", "n_kv_head",
                 "d_head", "seq_len", "architecture"}

# Whole phrases first: the head's switch is a pair of flags, not a value.
_PHRASES = {"set tied_embedding=True": "leave out --untied (or pass --tied)",
            "set tied_embedding=False": "pass --untied",
            "device=": "--device ",  # only with '=': "device" is also an English word
            "hf_model=": "--hf-model ", "hf_model ": "--hf-model "}


def _with_flags(message: str) -> str:
    """Say `--batch 0` where the library says `micro_batch=0`."""
    for phrase, flags in _PHRASES.items():
        message = message.replace(phrase, flags)
    for k in (*shown_on("cli"), *PLAN_KNOBS.values()):
        if k.field in ("device", "tied_embedding"):
            continue
        message = re.sub(rf"(?<![\w-]){k.field}[= ]", f"{k.flag} ", message)
    return message


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg, sources = config_and_sources_from_args(args)
        b = budget(cfg)
        if args.measure and b.config.activation_model not in REAL_STEP_MODELS:
            raise BudgetError(f"--measure torch runs a PyTorch step, so it needs --activations "
                              f"pytorch or hf, not {b.config.activation_model}.")
        comparison = measured_beside_predicted(b.config) if args.measure else None
        planned = _plan_from_args(cfg, args) if args.plan else None
    except BudgetError as exc:
        print(f"error: {_with_flags(str(exc))}", file=sys.stderr)
        return 2
    try:
        if planned is not None:
            print(json.dumps(planned.as_list(), indent=1) if args.json
                  else describe_plan(planned, cfg, _plan_values(args)))
        elif args.json:
            out = b.as_dict()
            out["config_sources"] = {knob: str(where) for knob, where in sources.items()}
            if comparison:
                out["measured"] = comparison
            print(json.dumps(out, indent=1))
        else:
            print(describe(b) + _describe_sources(args.hf_config or args.hf_model, sources)
                  + (f"\n\n{describe_breakdown(b)}" if args.breakdown else "")
                  + (f"\n\n{describe_comparison(comparison)}" if comparison else ""))
    except BrokenPipeError:  # `... | head` closed the pipe early: not an error of ours
        sys.stderr.close()
    return 0


def _plan_values(args: argparse.Namespace) -> dict:
    """The plan's knobs the flags set (None: not given)."""
    values = {k.field: getattr(args, k.field) for k in PLAN_KNOBS.values()}
    return {f: (v == "on" if isinstance(v, str) else v) for f, v in values.items()}


def _plan_from_args(cfg: BudgetConfig, args: argparse.Namespace):
    given = {f: v for f, v in _plan_values(args).items() if v is not None}
    return plan(cfg, tokens_per_step=given.get("tokens_per_step", 0),
                link_bandwidth=given.get("link_bandwidth", PLAN_KNOBS["link_bandwidth"].default),
                full_fine_tuning=given.get("plan_full_fine_tuning", True))


def _describe_sources(path, sources: dict) -> str:
    """Where the switches of a --hf-config file came from, one line each."""
    if not sources:
        return ""
    return (f"\n\nread from {path}:\n"
            + "\n".join(f"  {knob:<15}{where}" for knob, where in sources.items()))


def measured_beside_predicted(cfg: BudgetConfig) -> dict:
    """Run the step in PyTorch (see engine.budget.lab.torch_step) and predict the
    very step that ran, on the device it ran on."""
    from .counts import fixed_bytes
    from .framework_step import real_step_activations
    from .lab.torch_step import measure_step
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
