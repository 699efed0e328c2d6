"""Checkpoint files of the trainer: parameters plus AdamW state, written atomically.

A checkpoint is one .npz: `meta` (format, step, run settings, model shape,
dtype, the corpus's characters and fingerprint), the flat parameters and the
optimizer's m, v and t. `check_resume` refuses a checkpoint whose model,
dtype or corpus differ from the run that wants to resume it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import zipfile

import numpy as np

from .config import CheckpointError, ConfigMismatch, TrainConfig
from .data import CharTokenizer

CHECKPOINT_FORMAT = 1
MODEL_FIELDS = ("block_size", "n_layer", "n_head", "n_embd")


def corpus_fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def save_checkpoint(path: str, model, optimizer, step: int, config: TrainConfig,
                    tokenizer: CharTokenizer, fingerprint: str) -> None:
    """Write the checkpoint to a temporary file in the same folder, then rename it
    over `path`: a crash leaves the old checkpoint or the new one, never half."""
    meta = {"format": CHECKPOINT_FORMAT, "step": step, "config": dataclasses.asdict(config),
            "model": model.cfg.to_dict(), "dtype": str(model.dtype), "chars": tokenizer.chars,
            "corpus": fingerprint}
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, meta=np.array(json.dumps(meta)), params=model.params.flat,
                     adam_m=optimizer.m, adam_v=optimizer.v, adam_t=np.array(optimizer.t))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load_checkpoint(path: str) -> dict:
    """{'meta': dict, 'params', 'adam_m', 'adam_v', 'adam_t'}; CheckpointError if unusable."""
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist; check the path, or start "
                              f"a fresh run without --resume")
    try:
        with np.load(path, allow_pickle=False) as z:
            state = {key: z[key] for key in ("meta", "params", "adam_m", "adam_v", "adam_t")}
        state["meta"] = json.loads(str(state["meta"]))
        meta = state["meta"]
        if meta.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"format {meta.get('format')!r}, this trainer reads "
                             f"{CHECKPOINT_FORMAT}")
        for key in ("step", "config", "model", "dtype", "chars", "corpus"):
            meta[key]  # noqa: B018  (KeyError if missing)
        n = state["params"].size
        if state["adam_m"].size != n or state["adam_v"].size != n:
            raise ValueError("optimizer state and parameters differ in size")
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, json.JSONDecodeError,
            TypeError) as exc:
        raise CheckpointError(f"checkpoint {path!r} is corrupt or not a trainer checkpoint "
                              f"({type(exc).__name__}: {exc}); delete it or pass another "
                              f"file to --resume") from None
    return state


def check_resume(state: dict, config: TrainConfig, tokenizer: CharTokenizer,
                  fingerprint: str, path: str) -> None:
    meta = state["meta"]
    for name in MODEL_FIELDS:
        theirs = meta["model"][name]
        ours = getattr(config, name)
        if theirs != ours:
            flag = "--" + name.replace("_", "-")
            raise ConfigMismatch(f"{flag} is {ours}, but checkpoint {path!r} was trained with "
                                 f"{theirs}; drop {flag} (it is read from the checkpoint) "
                                 f"or start a new run without --resume")
    if meta["dtype"] != config.dtype:
        raise ConfigMismatch(f"--dtype is {config.dtype}, the checkpoint holds {meta['dtype']}; "
                             f"use --dtype {meta['dtype']}")
    if meta["chars"] != tokenizer.chars or meta["corpus"] != fingerprint:
        raise ConfigMismatch(f"the corpus differs from the one checkpoint {path!r} was trained "
                             f"on (vocabulary {len(meta['chars'])} vs {tokenizer.vocab_size} "
                             f"characters); pass the same --data as the original run")
