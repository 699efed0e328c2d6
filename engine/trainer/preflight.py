"""Checks a run passes before step 1, so that a mistake costs seconds, not a run.

    check_paths       --save and --log: writable, not a folder, not the corpus,
                      not each other, never replacing a file that is not a checkpoint
    check_prompt      the prompt's characters are in the corpus's vocabulary
    check_memory      the buffers fit in the memory the machine has available

Each raises a TrainError that names the setting, the value and the fix.
"""
from __future__ import annotations

import os
import zipfile

from ..fused_buffers import model_dims, step_elements
from .config import TrainConfig, TrainError
from .data import BUILTIN, CharTokenizer


# --------------------------------------------------------------------- paths
def _same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def check_paths(config: TrainConfig) -> None:
    """TrainError if --save or --log could destroy a file or cannot be written."""
    outputs = [(flag, path) for flag, path in (("--save", config.save), ("--log", config.log))
               if path]
    inputs = [(flag, path) for flag, path in (("--data", config.data),
                                              ("--resume", config.resume))
              if path and path != BUILTIN]
    for flag, path in outputs:
        for other_flag, other in inputs + [o for o in outputs if o[0] != flag]:
            if flag == "--save" and other_flag == "--resume":
                continue                 # saving back to the checkpoint is the default
            if _same_file(path, other):
                raise TrainError(f"{flag} {path!r} is the same file as {other_flag} {other!r}: "
                                 f"the run would {'replace' if flag == '--save' else 'append to'}"
                                 f" it; pass another file name to {flag}")
    if config.save:
        check_writable(config.save, "--save", make_folders=True)
        if os.path.exists(config.save) and not _is_checkpoint(config.save):
            raise TrainError(f"--save {config.save!r} exists and is not a trainer checkpoint; "
                             f"saving would replace it. Pass another file name, or delete it "
                             f"first if it is yours to lose")
    if config.log:
        check_writable(config.log, "--log", make_folders=False)
        if _is_zip(config.log):
            raise TrainError(f"--log {config.log!r} is a zip file (a checkpoint?); appending "
                             f"text would corrupt it. Pass another file name to --log")


def check_writable(path: str, flag: str, *, make_folders: bool) -> None:
    """TrainError unless `path` can be created or overwritten as a file (its folder
    created first when make_folders)."""
    if os.path.isdir(path):
        raise TrainError(f"{flag} {path!r} is a directory; pass a file name, e.g. "
                         f"{os.path.join(path, 'run.npz' if flag == '--save' else 'run.jsonl')!r}")
    folder = os.path.dirname(os.path.abspath(path))
    existing = folder
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise TrainError(f"{flag} {path!r} lies under {existing!r}, which is a file, not a "
                         f"folder; pass a path inside a folder")
    if existing != folder and not make_folders:
        raise TrainError(f"{flag} {path!r}: the folder {folder!r} does not exist; create it "
                         f"(mkdir -p {folder}) or pass a path in an existing folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise TrainError(f"{flag} {path!r}: no permission to write in {existing!r}; pass a "
                         f"path in a folder you can write")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise TrainError(f"{flag} {path!r} exists and is read-only; pass another file name")


def _is_zip(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def _is_checkpoint(path: str) -> bool:
    try:
        with zipfile.ZipFile(path) as z:
            return "meta.npy" in z.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


# -------------------------------------------------------------------- prompt
def check_prompt(config: TrainConfig, tokenizer: CharTokenizer) -> None:
    if config.prompt is None:
        return
    unknown = sorted(set(config.prompt) - set(tokenizer.chars))
    if unknown:
        raise TrainError(f"--prompt has {len(unknown)} character(s) the corpus never uses "
                         f"({''.join(unknown[:10])!r}), so the model cannot read them; write "
                         f"the prompt with characters of the training text")


# -------------------------------------------------------------------- memory
def step_bytes(cfg, batch_size: int, itemsize: int, checkpointing: bool,
               attention: str = "standard") -> int:
    """Bytes of engine.trainer.model.StepBuffers for a micro-batch of batch_size
    sequences of cfg.block_size tokens: the table engine.fused_buffers, summed."""
    d = model_dims(cfg, batch_size, cfg.block_size)
    return itemsize * step_elements(d, attention, checkpointing)


def training_bytes(config: TrainConfig, vocab_size: int, local_batch: int,
                   n_replicas: int) -> dict:
    """What one process allocates to train: weights, AdamW moments, gradients and
    the step buffers of each thread replica (plus the batch-1 copy that samples)."""
    from ..gpt_config import num_params
    cfg = config.model_config(vocab_size)
    item = 4 if config.dtype == "float32" else 8
    P = num_params(cfg) * item
    grads = P * n_replicas + (P if n_replicas > 1 else 0)
    parts = {"weights and AdamW moments": 3 * P, "gradients": grads,
             "activations": n_replicas * step_bytes(cfg, local_batch // n_replicas, item,
                                                    config.checkpointing, config.attention)}
    if config.prompt is not None:
        parts["sampling copy"] = P + step_bytes(cfg, 1, item, False)   # samples with the standard kernel
    return parts


def available_memory() -> int | None:
    """Bytes the machine can give now without swapping (None where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**26 else f"{n / 2**20:,.1f} MiB"


def check_memory(config: TrainConfig, vocab_size: int, local_batch: int, n_replicas: int,
                 available: int | None = None) -> int:
    """The estimated bytes; TrainError when they exceed the available memory."""
    parts = training_bytes(config, vocab_size, local_batch, n_replicas)
    total = sum(parts.values())
    available = available_memory() if available is None else available
    if available is not None and total > available:
        detail = ", ".join(f"{k} {_gib(v)}" for k, v in parts.items())
        raise TrainError(
            f"--batch-size {config.batch_size} with --block-size {config.block_size} needs "
            f"about {_gib(total)} per process ({detail}), but this machine has "
            f"{_gib(available)} available; lower --batch-size (use --grad-accum for the same "
            f"tokens per step) or --block-size, or add --checkpointing")
    return total
