"""`python -m engine.train`: train the GPT on the CPU (the trainer lives in engine/trainer/).

From Python (a notebook, say):

    from engine.train import TrainConfig, train, sample
    result = train(TrainConfig(steps=300), callback=lambda r: print(r["step"], r["loss"]))
    print(sample(result.model, result.dataset.tokenizer, "def ", length=200))
"""
import sys

from .trainer.checkpoint_files import load_checkpoint, save_checkpoint
from .trainer.cli import build_parser, config_from_args, main
from .trainer.config import (CheckpointError, ConfigMismatch, DataError, Diverged,
                             ParallelUnavailable, TrainConfig, TrainError)
from .trainer.step import accumulate_and_step, evaluate
from .trainer.train import TrainResult, sample, summary, train

__all__ = ["TrainConfig", "TrainResult", "train", "sample", "accumulate_and_step", "evaluate", "summary",
           "save_checkpoint", "load_checkpoint", "main", "build_parser", "config_from_args",
           "TrainError", "DataError", "CheckpointError", "ConfigMismatch",
           "ParallelUnavailable", "Diverged"]

if __name__ == "__main__":
    sys.exit(main())
