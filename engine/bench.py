"""`python -m engine.bench`: tokens/s and ms/step of the trainer (see engine/trainer/bench.py)."""
import sys

from .trainer.bench import format_report, main, run, torch_gpt

__all__ = ["run", "format_report", "main", "torch_gpt"]

if __name__ == "__main__":
    sys.exit(main())
