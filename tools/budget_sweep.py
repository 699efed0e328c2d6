"""Steps nobody chose: random real-step settings measured on this CPU against the budget.

    python tools/budget_sweep.py [--seed 1] [--steps 40] [--wide] [--recompute none|full]
                                 [--save FOLDER]

The tests measure steps someone picked. This draws settings at random (a family's
config.json shrunk to seconds, LoRA, DoRA, QLoRA, trained modules, the optimizers and
their implementations, bf16 autocast, bf16 weights, checkpointing, accumulation, what
the loop keeps), skips what the compatibility table refuses, measures each step with
PyTorch's profiler (`engine.budget.lab.torch_step.measure_step`) and prints the three
ratios the tests hold within 5%: activations, the peak, step 1's peak (predicted over
measured), with the moment the budget puts the peak in. `--wide` widens the blocks
(width 128, MLP 352) and shrinks the vocabulary (300), so the blocks rather than the
loss decide the peak; `--recompute` draws only steps with (full) or without (none)
checkpointing. Needs torch, transformers, peft and bitsandbytes (the extra `lora`); a
step needing a package that is missing is skipped, saying so. The same seed draws the
same settings.
"""
from __future__ import annotations

import argparse
import json
import pickle
import random
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import budget as B  # noqa: E402
from engine.budget import real_step_activations  # noqa: E402
from engine.budget.lab.torch_step import measure_step, torch_missing  # noqa: E402

SHRUNK = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 160,
          "vocab_size": 1000, "max_position_embeddings": 128, "query_pre_attn_scalar": 32}
FAMILIES = {
    "gpt2": {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000,
             "n_positions": 128, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5},
    "llama": {"model_type": "llama", "tie_word_embeddings": False},
    "qwen2": {"model_type": "qwen2", "tie_word_embeddings": True, "use_sliding_window": False},
    "qwen3": {"model_type": "qwen3", "tie_word_embeddings": True},
    "mistral": {"model_type": "mistral", "sliding_window": 4096, "tie_word_embeddings": False},
    "gemma": {"model_type": "gemma", "hidden_act": "gelu"},
    "gemma2": {"model_type": "gemma2", "sliding_window": 4096, "attn_logit_softcapping": 50.0,
               "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh"},
    "gemma3": {"model_type": "gemma3_text", "sliding_window": 512, "sliding_window_pattern": 6,
               "hidden_activation": "gelu_pytorch_tanh"},
}
WIDE = {"hidden_size": 128, "intermediate_size": 352, "vocab_size": 300}
WIDE_GPT2 = {"n_embd": 128, "vocab_size": 300}


def config_json(family: str, wide: bool) -> dict:
    """The family's config.json, shrunk (and widened with `wide`)."""
    data = dict(FAMILIES[family])
    if family == "gpt2":
        return {**data, **(WIDE_GPT2 if wide else {})}
    return {**data, **SHRUNK, **(WIDE if wide else {})}


def draw(rng: random.Random, recompute: str | None = None) -> tuple[str, dict]:
    """One family and one setting of the knobs, at random (checkpointing as
    `recompute` says, when it says)."""
    knobs = dict(activation_model="hf", backend="cpu", micro_batch=rng.choice([1, 2, 3]),
                 seq_len=rng.choice([32, 48, 64]), precision=rng.choice(["fp32", "bf16"]),
                 attention=rng.choice(["standard", "flash"]),
                 recompute=recompute or rng.choice(["none", "full"]),
                 accumulation=rng.choice([1, 1, 2]),
                 optimizer_impl=rng.choice(["for-loop", "foreach", "fused"]))
    rank = rng.choice([0, 0, 8, 32])
    if rank:
        knobs.update(lora_rank=rank, lora_targets=rng.choice(["", "all-linear"]),
                     lora_dropout=rng.choice([0.0, 0.1]))
        recipe = rng.random()
        if recipe < 0.2:
            knobs["dora"] = True
        elif recipe < 0.35:
            knobs["qlora"] = True
        elif recipe < 0.45:
            knobs["modules_to_save"] = "lm_head"
    else:
        knobs["optimizer"] = rng.choice(["adamw", "adamw", "adafactor", "adamw-8bit"])
    if knobs["precision"] == "bf16" and rng.random() < 0.15:
        knobs.update(weights_dtype="bf16", autocast_mode=rng.choice(["on", "off"]))
    if rng.random() < 0.2:
        knobs["outputs"] = "freed-after-backward"
    return rng.choice(sorted(FAMILIES)), knobs


def ratios(cfg, measured) -> tuple[tuple[float, float, float], str]:
    """Predicted over measured (activations, the peak, step 1's peak), and the moment
    the budget puts the peak in."""
    acts = real_step_activations(cfg, device="cpu")
    peak = B.budget(cfg).fixed_total + acts.peak
    return ((acts.saved / measured.activations, peak / measured.peak,
             acts.step.first_step_peak_moment.bytes / measured.peak_first_step),
            acts.step.peak_moment.name)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--wide", action="store_true")
    parser.add_argument("--recompute", choices=("none", "full"))
    parser.add_argument("--save", type=Path, help="a folder for each (config, measurement), "
                        "pickled as SEED_N.pkl; a folder already holding the seed's is refused")
    args = parser.parse_args(argv)
    if args.save and any(args.save.glob(f"{args.seed}_*.pkl")):
        parser.error(f"--save {args.save}: it already holds this seed's measurements "
                     f"({args.seed}_*.pkl); name an empty folder or another seed, so none "
                     f"is overwritten")
    warnings.filterwarnings("ignore")
    rng, measured, outside = random.Random(args.seed), 0, 0
    while measured < args.steps:
        family, knobs = draw(rng, args.recompute)
        try:
            cfg = B.config_from_hf(config_json(family, args.wide), **knobs)
        except B.BudgetError:
            continue  # a setting the compatibility table refuses
        missing = torch_missing(cfg)
        if missing:
            print(f"skipped {family}: {missing}")
            continue
        m = measure_step(cfg, device="cpu")
        measured += 1
        r, moment = ratios(cfg, m)
        out = max(abs(x - 1) for x in r) > 0.05
        outside += out
        print(f"{'OUT' if out else 'ok '} {r[0]:.3f} {r[1]:.3f} {r[2]:.3f}  {family:8} "
              f"peak in {moment}  {json.dumps(knobs)}", flush=True)
        if args.save:
            args.save.mkdir(parents=True, exist_ok=True)
            with open(args.save / f"{args.seed}_{measured}.pkl", "xb") as f:  # never over one
                pickle.dump((cfg, m), f)
    print(f"{measured - outside} of {measured} steps within 5% on all three ratios")
    return 0


if __name__ == "__main__":
    sys.exit(main())
