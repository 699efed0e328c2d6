"""`python -m engine.bench`: tokens/s and ms/step of the trainer (the lab, engine/trainer/lab/).

    python -m engine.bench                  # the tiny config in detail, next to PyTorch eager
    python -m engine.bench --shapes         # one table: tiny, T=512, T=1024, C=256 L=6 H=8
    python -m engine.bench --threads 1 2 4  # one scaling table: the plan at each count
"""
import sys

from .trainer.lab.cli import main
from .trainer.lab.machine import kept_traffic, step_cores
from .trainer.lab.profile import cached_step_ms
from .trainer.lab.report import format_memory, format_report, format_scaling, format_table
from .trainer.lab.torch_twin import torch_gpt
from .trainer.lab.versus_torch import SHAPES, TOKENS_PER_STEP, parse_shape, run, run_shapes

__all__ = ["run", "format_report", "main", "torch_gpt", "run_shapes", "format_table",
           "parse_shape", "cached_step_ms", "format_scaling", "format_memory", "kept_traffic", "step_cores",
           "SHAPES", "TOKENS_PER_STEP"]

if __name__ == "__main__":
    sys.exit(main())
