"""tools/budget_sweep.py: random real-step settings measured against the budget. Its
draws are the same for a seed, every family it draws from reads as a config.json the
budget accepts, and one drawn step runs end to end where torch, transformers, peft and
bitsandbytes are installed (skipped, saying so, where they are not)."""
from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

import engine.budget as bm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import budget_sweep  # noqa: E402


@pytest.mark.parametrize("wide", [False, True], ids=["narrow", "wide"])
@pytest.mark.parametrize("family", sorted(budget_sweep.FAMILIES))
def test_every_family_reads_as_a_config_the_budget_accepts(family, wide):
    cfg = bm.config_from_hf(budget_sweep.config_json(family, wide), activation_model="hf",
                            backend="cpu", seq_len=64)
    assert cfg.n_layer == 2 and cfg.d_model == (128 if wide else 64)
    assert cfg.vocab_size == (300 if wide else 1000)


def test_a_seed_draws_the_same_settings_and_recompute_pins_checkpointing():
    first = [budget_sweep.draw(random.Random(7)) for _ in range(3)]
    assert first == [budget_sweep.draw(random.Random(7)) for _ in range(3)]
    rng = random.Random(3)
    assert {budget_sweep.draw(rng, "full")[1]["recompute"] for _ in range(20)} == {"full"}


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None
                        for m in ("torch", "transformers", "peft", "bitsandbytes")),
                    reason="torch, transformers, peft and bitsandbytes are not installed "
                           "(pip install -e '.[lora]' bitsandbytes)")
def test_one_drawn_step_is_measured_and_its_ratios_printed(capsys):
    assert budget_sweep.main(["--seed", "3", "--steps", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "1 of 1 steps within 5% on all three ratios"
    assert out[-2].startswith("ok  ") and "peak in the " in out[-2]


def test_saving_never_overwrites_a_folders_measurements(tmp_path, capsys):
    """A folder already holding this seed's files is refused before anything is
    measured, naming the folder and the fix; the file there is left as it was."""
    kept = tmp_path / "3_1.pkl"
    kept.write_bytes(b"someone's measurement")
    with pytest.raises(SystemExit):
        budget_sweep.main(["--seed", "3", "--steps", "1", "--save", str(tmp_path)])
    assert "already holds this seed's measurements" in capsys.readouterr().err
    assert kept.read_bytes() == b"someone's measurement"
