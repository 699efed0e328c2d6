"""DoRA (peft's `LoraConfig(use_dora=True)`): LoRA's adapters with a trained magnitude
per output column.
"""
from __future__ import annotations

from .recipes import Recipe

RECIPE = Recipe("dora", lambda cfg: bool(cfg.dora))
