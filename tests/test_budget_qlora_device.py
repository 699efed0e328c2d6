"""A QLoRA step checked against a device: the full fine-tune it is compared with drops
every adapter knob (knobs.ADAPTER_KNOBS), QLoRA's 4-bit weights among them."""
import json
import subprocess
import sys

import engine.budget as bm
from engine.budget.fit import without_adapters
from engine.budget.knobs import ADAPTER_KNOBS, KNOBS


def test_qlora_with_a_device_runs_from_the_command_line():
    run = subprocess.run(
        [sys.executable, "-m", "engine.budget", "--preset", "llama3.1-8b", "--activations",
         "hf", "--lora-rank", "16", "--qlora", "on", "--precision", "fp32", "--device",
         "h100", "--json"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    device = json.loads(run.stdout)["device"]
    assert device["full_fine_tuning"] is not None
    assert device["full_fine_tuning"]["fits"] is False  # 8B in fp32 AdamW: 128 GB


def test_the_full_fine_tune_resets_every_adapter_knob():
    cfg = bm.preset("llama3.1-8b", activation_model="hf", precision="fp32", lora_rank=16,
                    lora_targets="q_proj,v_proj,o_proj", lora_dropout=0.1, qlora=True)
    full = without_adapters(cfg)
    assert full.lora_rank == 0
    for knob in ADAPTER_KNOBS:
        assert getattr(full, knob) == KNOBS[knob].default, knob
    assert full == cfg.with_(lora_rank=0, lora_targets="", lora_dropout=0.0, qlora=False)
