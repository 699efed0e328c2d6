"""The budget's lab: code that runs a training step to measure what the budget
predicts. Nothing in the product (engine/budget outside lab/) imports it when it
loads; `python -m engine.budget --measure torch` imports it on use.

  measure        our tape engine's GPT run under `engine.memory`: the bytes it
                 saves, beside the "engine" activation model's prediction
  torch_step     a real PyTorch or transformers step measured on the CPU
                 (the profiler's memory events) or CUDA (the caching allocator)
  recipe_models  the recipes' models as peft and bitsandbytes build them
"""
from __future__ import annotations

from .measure import (MEASURE_MAX_ACTIVATION_BYTES, MEASURE_MAX_FLOPS, MEASURE_MAX_WEIGHT_BYTES,
                      measurable, measure)
from .torch_step import Measured, measure_step, torch_missing

__all__ = ['MEASURE_MAX_ACTIVATION_BYTES', 'MEASURE_MAX_FLOPS', 'MEASURE_MAX_WEIGHT_BYTES',
           'measurable', 'measure', 'Measured', 'measure_step', 'torch_missing']
