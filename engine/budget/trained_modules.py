"""peft's `modules_to_save`: modules outside the blocks trained in full beside LoRA's
adapters.
"""
from __future__ import annotations

from .recipes import Recipe

RECIPE = Recipe("modules_to_save", lambda cfg: bool(cfg.modules_to_save))
