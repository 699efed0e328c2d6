"""What a training run is told (TrainConfig) and the errors a user can fix.

Each error carries the exit code `python -m engine.train` returns for it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..fused_buffers import ATTENTION_KINDS
from ..gpt_config import GPTConfig
from .thread_plan import MODES as THREAD_MODES


class TrainError(Exception):
    """A problem the user can fix; `exit_code` is what the command line returns."""
    exit_code = 2


class DataError(TrainError):
    exit_code = 3


class CheckpointError(TrainError):
    exit_code = 4


class ConfigMismatch(TrainError):
    exit_code = 5


class ParallelUnavailable(TrainError):
    exit_code = 6


class Diverged(TrainError):
    exit_code = 7


class WriteError(TrainError):
    """A checkpoint or log that could not be written (disk full, permissions)."""
    exit_code = 8


# Sampling runs one batch-1 forward per character (about 3 ms on the tiny model on
# one core), so this many characters take minutes, not the hours a typo could ask for.
MAX_SAMPLE_LEN = 100_000
# The settings a path fills; an empty one is a mistake, never "leave it out".
PATH_SETTINGS = ("data", "save", "log", "resume")


def check_paths_not_empty(settings: dict) -> None:
    """TrainError for a path setting given as the empty string ('' would otherwise
    read as "not given": --resume '' would silently train a fresh run)."""
    for name in PATH_SETTINGS:
        if settings.get(name) == "":
            raise TrainError(f"--{name} is an empty path; pass a file name, or leave "
                             f"--{name} out")


# The settings that define a run's mathematics: a checkpoint records these and
# `--resume` takes them from it. Paths, the prompt, threads and reporting
# options are never read from a file someone else may have written.
RESUMED_SETTINGS = ("steps", "batch_size", "block_size", "n_layer", "n_head", "n_embd",
                    "grad_accum", "lr", "min_lr_ratio", "warmup", "weight_decay", "beta1",
                    "beta2", "clip", "val_fraction", "eval_every", "eval_batches", "seed",
                    "dtype", "checkpointing", "attention")


@dataclass
class TrainConfig:
    """Every setting of a run. The defaults train the `tiny` model
    (`engine.gpt_config.tiny_config`)."""
    data: str | None = None            # None: the built-in corpus (pydoc_data.topics)
    steps: int = 1000                  # optimizer steps; the learning-rate schedule spans them
    stop_at: int | None = None         # stop after this step (resume later with --resume)
    time_limit: float | None = None    # seconds; stop (and save) once exceeded
    batch_size: int = 16               # micro-batch B (sequences), split over ranks if parallel
    block_size: int = 128              # T
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    grad_accum: int = 1                # K micro-batches per optimizer step
    lr: float = 2e-3
    min_lr_ratio: float = 0.1          # cosine decay ends at lr * min_lr_ratio
    warmup: int = 30
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    clip: float = 1.0                  # global-norm clipping threshold (0: off)
    val_fraction: float = 0.1
    eval_every: int = 100
    eval_batches: int = 8
    seed: int = 0
    dtype: str = "float32"
    checkpointing: bool = False        # recompute each block in the backward
    attention: str = "standard"        # "flash": tiled kernel, no T x T probabilities kept
    data_parallel: bool = False        # under mpiexec: split each micro-batch over ranks
    threads: int | None = None         # threads per process (default: cores / processes)
    thread_mode: str | None = None     # None: thread_plan.py's rule chooses; "replicas":
                                       # model copies, one per thread; "kernels": one
                                       # model, multi-threaded kernels
    log: str | None = None             # JSON-lines log file
    save: str | None = None            # checkpoint path, written atomically
    save_every: int | None = None      # default: at every evaluation and at the end
    resume: str | None = None          # checkpoint to continue from
    prompt: str | None = None          # sample text from this prompt after training
    sample_len: int = 200
    temperature: float = 0.8
    log_every: int = 10

    def validate(self) -> None:
        """TrainError naming the first setting that cannot work, before any work starts."""
        positive = ("steps", "batch_size", "block_size", "n_layer", "n_head", "n_embd",
                    "grad_accum", "eval_every", "eval_batches", "log_every")
        for name in positive:
            if int(getattr(self, name)) < 1 and not (name == "steps" and self.resume):
                raise TrainError(f"--{name.replace('_', '-')} must be at least 1, got "
                                 f"{getattr(self, name)}")
        for name in ("stop_at", "save_every", "threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise TrainError(f"--{name.replace('_', '-')} must be at least 1, got {value} "
                                 f"(leave it out for the default)")
        for name in ("seed", "warmup", "sample_len"):
            if getattr(self, name) < 0:
                raise TrainError(f"--{name.replace('_', '-')} must be 0 or more, got "
                                 f"{getattr(self, name)}")
        if self.sample_len > MAX_SAMPLE_LEN:
            raise TrainError(f"--sample-len must be at most {MAX_SAMPLE_LEN:,} characters (one "
                             f"forward each), got {self.sample_len:,}")
        check_paths_not_empty(vars(self))
        if self.n_embd % self.n_head:
            raise TrainError(f"--n-embd {self.n_embd} is not divisible by --n-head "
                             f"{self.n_head}; pick a head count that divides it")
        if self.thread_mode is not None and self.thread_mode not in THREAD_MODES:
            raise TrainError(f"--thread-mode must be replicas or kernels, got "
                             f"{self.thread_mode!r}")
        if self.attention not in ATTENTION_KINDS:
            raise TrainError(f"--attention must be {' or '.join(ATTENTION_KINDS)}, got "
                             f"{self.attention!r}")
        if self.dtype not in ("float32", "float64"):
            raise TrainError(f"--dtype must be float32 or float64, got {self.dtype!r}")
        if self.lr <= 0 or not math.isfinite(self.lr):
            raise TrainError(f"--lr must be a positive number, got {self.lr}")
        for name, fix in (("clip", "0 turns clipping off"), ("weight_decay", "0 for none")):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise TrainError(f"--{name.replace('_', '-')} must be a number >= 0 ({fix}), "
                                 f"got {value}")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise TrainError(f"--temperature must be a positive number, got "
                             f"{self.temperature}; 1 samples the model's distribution, lower "
                             f"values sharpen it")
        if self.time_limit is not None and not (self.time_limit > 0
                                                and math.isfinite(self.time_limit)):
            raise TrainError(f"--time-limit must be a positive number of seconds, got "
                             f"{self.time_limit}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise TrainError(f"{name} must lie in [0, 1), got {getattr(self, name)}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise TrainError(f"min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio}")
        if not 0 < self.val_fraction < 1:
            raise TrainError(f"--val-fraction must lie in (0, 1), got {self.val_fraction}")

    def model_config(self, vocab_size: int) -> GPTConfig:
        return GPTConfig(vocab_size=vocab_size, block_size=self.block_size,
                         n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd)
