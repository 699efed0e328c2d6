"""`python -m engine.bench`: tokens/s and ms/step of the trainer (see engine/trainer/bench.py).

    python -m engine.bench                  # the tiny config in detail, next to PyTorch eager
    python -m engine.bench --shapes         # one table: tiny, T=512, T=1024, C=256 L=6 H=8
"""
import sys

from .trainer.bench import (SHAPES, TOKENS_PER_STEP, cached_step_ms, format_memory,
                            format_report, format_table, kept_traffic, main, parse_shape, run,
                            run_shapes, step_cores, torch_gpt)

__all__ = ["run", "format_report", "main", "torch_gpt", "run_shapes", "format_table",
           "parse_shape", "cached_step_ms", "format_memory", "kept_traffic", "step_cores",
           "SHAPES", "TOKENS_PER_STEP"]

if __name__ == "__main__":
    sys.exit(main())
