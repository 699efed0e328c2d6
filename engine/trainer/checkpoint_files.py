"""Checkpoint files of the trainer: parameters plus AdamW state, written atomically.

A checkpoint is one .npz: `meta` (format, step, the settings that define the
run's mathematics, model shape, dtype, the corpus's characters and
fingerprint), the flat parameters and the optimizer's m, v and t.

A checkpoint may come from someone else, so it carries data, never
decisions: no file paths, no prompt, no thread counts (`RESUMED_SETTINGS`
lists what it does carry). `load_checkpoint` checks every field's type and
every array's shape and size before reading it (a crafted header cannot make
it allocate terabytes) and `check_resume` refuses a checkpoint whose model,
dtype, attention kernel or corpus differ from the run that wants to resume it.
A checkpoint written before the attention kernel was recorded resumes with the
run's --attention (standard unless given), and the run says so: both kernels
compute the same attention, so training continues, but only the kernel it was
trained with continues bit for bit.
"""
from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import re
import stat
import zipfile

import numpy as np

from ..gpt_config import GPTConfig, num_params
from .config import RESUMED_SETTINGS, CheckpointError, ConfigMismatch, TrainConfig, TrainError, \
    WriteError
from .data import CharTokenizer

CHECKPOINT_FORMAT = 1
MODEL_FIELDS = ("block_size", "n_layer", "n_head", "n_embd")
ARRAYS = ("meta", "params", "adam_m", "adam_v", "adam_t")
META_LIMIT = 1 << 20            # characters of JSON metadata: far more than any real one
DEFLATE_RATIO = 1100            # zlib never expands data more than about 1032 times
MAX_CHECKPOINT_BYTES = 16 * 2**30   # on disk and per array unpacked: 1.4 billion float32
                                    # parameters with their two AdamW moments
STEP_LIMIT = 10**9                  # optimizer steps: far more than any run of this trainer


def corpus_fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# ------------------------------------------------------------------- writing
def write_arrays(file, arrays: dict[str, np.ndarray]) -> None:
    """The one call that writes a checkpoint's bytes (tests replace it to fill the disk)."""
    np.savez(file, **arrays)


def _temporary_name(path: str, pid: int) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(path)),
                        f".{os.path.basename(path)}.{pid}.tmp")


def remove_stale_temporaries(path: str) -> list[str]:
    """Delete the temporary files that killed saves to `path` left behind (those
    whose writing process is gone); returns their names. A live process's
    temporary file (another run saving to the same path right now) stays."""
    folder = os.path.dirname(os.path.abspath(path))
    pattern = re.compile(re.escape(f".{os.path.basename(path)}.") + r"(\d+)\.tmp")
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for name in names:
        match = pattern.fullmatch(name)
        if match and not _process_alive(int(match.group(1))):
            try:
                os.remove(os.path.join(folder, name))
                removed.append(name)
            except OSError:
                pass
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False            # our own leftover: this process is not writing it now
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _fsync_folder(folder: str) -> None:
    """Make the rename itself durable: a crash after it must not bring the old file back."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return                  # a platform without directory handles (Windows)
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(path: str, model, optimizer, step: int, config: TrainConfig,
                    tokenizer: CharTokenizer, fingerprint: str) -> None:
    """Write the checkpoint to a temporary file in the same folder, fsync it, rename
    it over `path`, fsync the folder: a crash leaves the old checkpoint or the new
    one, never half. A failed write (disk full) raises WriteError naming the path
    and leaves the old checkpoint as it was."""
    settings = dataclasses.asdict(config)
    meta = {"format": CHECKPOINT_FORMAT, "step": step,
            "config": {name: settings[name] for name in RESUMED_SETTINGS},
            "model": model.cfg.to_dict(), "dtype": str(model.dtype), "chars": tokenizer.chars,
            "corpus": fingerprint}
    folder = os.path.dirname(os.path.abspath(path))
    tmp = _temporary_name(path, os.getpid())
    try:
        os.makedirs(folder, exist_ok=True)
        with open(tmp, "wb") as f:
            write_arrays(f, {"meta": np.array(json.dumps(meta)), "params": model.params.flat,
                             "adam_m": optimizer.m, "adam_v": optimizer.v,
                             "adam_t": np.array(optimizer.t)})
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_folder(folder)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        hint = ("free some space" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else
                f"the process may write no file larger than {_file_size_limit()} (ulimit -f); "
                f"raise that limit" if exc.errno == errno.EFBIG else
                "check the folder's permissions")
        raise WriteError(f"could not write checkpoint {path!r} at step {step}: {reason}; the "
                         f"previous checkpoint there (if any) is intact; {hint} or pass "
                         f"another --save") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _file_size_limit() -> str:
    """The largest file this process may write (RLIMIT_FSIZE), in words."""
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):
        return "the system's file-size limit"
    return "any size" if soft == resource.RLIM_INFINITY else f"{soft:,} bytes"


# ------------------------------------------------------------------- reading
class _Unusable(ValueError):
    """What is wrong with a checkpoint file, for CheckpointError's message."""


def _open_checkpoint(path: str):
    """(the open file, its size) of the regular file `path`, at most MAX_CHECKPOINT_BYTES.
    It is opened without blocking (a named pipe would wait for a writer forever) and
    checked on the open file (/dev/zero has size 0 and never ends)."""
    if not path:
        raise CheckpointError("the checkpoint path is empty; pass a file written by --save, "
                              "or leave --resume out for a fresh run")
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist; check the path, or start "
                              f"a fresh run without --resume")
    if os.path.isdir(path):
        raise CheckpointError(f"checkpoint {path!r} is a folder; pass the checkpoint file "
                              f"in it that --save wrote, e.g. "
                              f"{os.path.join(path, 'run.npz')!r}")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise CheckpointError(f"cannot open checkpoint {path!r}: {exc.strerror}; pass a "
                              f"readable checkpoint file") from None
    file = os.fdopen(fd, "rb")
    info = os.fstat(fd)
    problem = (None if stat.S_ISREG(info.st_mode) else
               "is not a regular file (a pipe, a device or a socket)")
    if info.st_size > MAX_CHECKPOINT_BYTES:
        problem = f"holds more than {MAX_CHECKPOINT_BYTES:,} bytes, the most the trainer reads"
    if problem:
        file.close()
        raise CheckpointError(f"checkpoint {path!r} {problem}; pass a checkpoint file "
                              f"written by --save")
    return file, info.st_size


def load_checkpoint(path: str) -> dict:
    """{'meta': dict, 'params', 'adam_m', 'adam_v', 'adam_t'}; CheckpointError if unusable.
    Every read is bounded by the file's size (see _header)."""
    file, size_on_disk = _open_checkpoint(path)
    try:
        with file, zipfile.ZipFile(file) as z:
            members = {name[:-4]: z.getinfo(name) for name in z.namelist()
                       if name.endswith(".npy")}
            missing = [key for key in ARRAYS if key not in members]
            if missing:
                raise _Unusable(f"it lacks {missing}")
            meta = _read_meta(z, members["meta"], size_on_disk)
            n = num_params(GPTConfig(vocab_size=len(meta["chars"]),
                                     **{k: meta["model"][k] for k in MODEL_FIELDS}))
            dtype = np.dtype(meta["dtype"])
            state = {"meta": meta}
            for key, shape, kinds in (("params", (n,), dtype), ("adam_m", (n,), dtype),
                                      ("adam_v", (n,), dtype), ("adam_t", (), "int")):
                state[key] = _read_array(z, members[key], size_on_disk, key, shape, kinds)
    except CheckpointError:
        raise
    except OSError as exc:      # the system refuses to read it (/proc/self/mem, a bad disk)
        raise CheckpointError(f"cannot read checkpoint {path!r}: {exc.strerror or exc}; pass "
                              f"a readable checkpoint file") from None
    except Exception as exc:    # noqa: BLE001  (any flaw of a foreign file ends here, named)
        what = str(exc) if isinstance(exc, _Unusable) else f"{type(exc).__name__}: {exc}"
        raise CheckpointError(f"checkpoint {path!r} is corrupt or not a trainer checkpoint "
                              f"({what}); delete it or pass another file to --resume") from None
    if not np.isfinite(state["params"]).all():
        raise CheckpointError(f"checkpoint {path!r} holds NaN or infinite parameters; resume "
                              f"from an earlier checkpoint")
    if int(state["adam_t"]) < 0:
        raise CheckpointError(f"checkpoint {path!r} has a negative optimizer step count")
    if int(state["adam_t"]) > STEP_LIMIT:
        raise CheckpointError(f"checkpoint {path!r} has an optimizer step count of "
                              f"{int(state['adam_t']):,}, more than {STEP_LIMIT:,}: it was not "
                              f"written by a run; resume from another checkpoint")
    problem = _optimizer_problem(state["adam_m"], state["adam_v"])
    if problem:
        raise CheckpointError(f"checkpoint {path!r} holds an unusable AdamW state ({problem}): "
                              f"every step from it would be NaN whatever --lr is; resume from "
                              f"an earlier checkpoint")
    return state


def _optimizer_problem(m: np.ndarray, v: np.ndarray) -> str | None:
    """What makes AdamW's moments unusable (AdamW divides by the root of v), or None."""
    for name, moment in (("first moment", m), ("second moment", v)):
        bad = np.count_nonzero(~np.isfinite(moment))
        if bad:
            return f"{bad:,} NaN or infinite values in its {name}"
    negative = np.count_nonzero(v < 0)
    if negative:
        return f"{negative:,} negative values in its second moment, a mean of squares"
    return None


def _header(z: zipfile.ZipFile, info: zipfile.ZipInfo, size_on_disk: int, key: str):
    """(shape, dtype) of one .npy member, read from its header alone, after checking
    that the bytes it claims fit in the member and the member in the file."""
    if info.compress_size > size_on_disk:
        raise _Unusable(f"{key} claims {info.compress_size} bytes, more than the file holds")
    if info.file_size > MAX_CHECKPOINT_BYTES:
        raise _Unusable(f"{key} claims to unpack to {info.file_size} bytes, more than the "
                        f"{MAX_CHECKPOINT_BYTES:,} the trainer reads")
    ratio = 1 if info.compress_type == zipfile.ZIP_STORED else DEFLATE_RATIO
    if info.file_size > ratio * max(info.compress_size, 1):
        raise _Unusable(f"{key} claims to unpack to {info.file_size} bytes from "
                        f"{info.compress_size}")
    with z.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise _Unusable(f"{key} has .npy format {version}")
        header_bytes = f.tell()
    if dtype.hasobject:
        raise _Unusable(f"{key} holds Python objects (pickles are refused)")
    claimed = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if header_bytes + claimed != info.file_size:
        raise _Unusable(f"{key}'s header claims {claimed} bytes of data, the file holds "
                        f"{info.file_size - header_bytes}")
    return shape, dtype


def _read_array(z, info, size_on_disk, key, shape, kinds):
    """The member `key`, once its header matches the shape and dtype the metadata implies."""
    found_shape, dtype = _header(z, info, size_on_disk, key)
    if kinds == "int":
        if dtype.kind not in "iu":
            raise _Unusable(f"{key} has dtype {dtype}, not an integer")
    elif dtype != kinds:
        raise _Unusable(f"{key} has dtype {dtype}, the metadata says {kinds}")
    if tuple(found_shape) != shape:
        raise _Unusable(f"{key} has shape {tuple(found_shape)}, the model described in the "
                        f"metadata needs {shape}")
    with z.open(info) as f:
        return np.lib.format.read_array(f, allow_pickle=False)


def _read_meta(z, info, size_on_disk) -> dict:
    shape, dtype = _header(z, info, size_on_disk, "meta")
    if dtype.kind != "U" or shape != () or dtype.itemsize > 4 * META_LIMIT:
        raise _Unusable(f"meta must be one string of at most {META_LIMIT} characters, got "
                        f"dtype {dtype} and shape {shape}")
    with z.open(info) as f:
        meta = json.loads(str(np.lib.format.read_array(f, allow_pickle=False)))
    _check_meta(meta)
    return meta


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_meta(meta) -> None:
    """_Unusable unless meta has every field, each of the right type and range."""
    if not isinstance(meta, dict):
        raise _Unusable(f"meta is a JSON {type(meta).__name__}, not an object")
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise _Unusable(f"format {meta.get('format')!r}, this trainer reads {CHECKPOINT_FORMAT}")
    expected = {"step": _is_int, "config": lambda v: isinstance(v, dict),
                "model": lambda v: isinstance(v, dict), "dtype": lambda v: v in ("float32",
                                                                                 "float64"),
                "chars": lambda v: isinstance(v, str) and len(v) > 0,
                "corpus": lambda v: isinstance(v, str)}
    for key, ok in expected.items():
        if key not in meta:
            raise _Unusable(f"meta lacks {key!r}")
        if not ok(meta[key]):
            raise _Unusable(f"meta[{key!r}] = {_short(meta[key])} has the wrong type or value")
    if not 0 <= meta["step"] <= STEP_LIMIT:
        raise _Unusable(f"meta['step'] is {_short(meta['step'])}, not between 0 and "
                        f"{STEP_LIMIT:,}")
    if len(set(meta["chars"])) != len(meta["chars"]):
        raise _Unusable("meta['chars'] repeats a character")
    for key in MODEL_FIELDS:
        value = meta["model"].get(key)
        if not (_is_int(value) and value >= 1):
            raise _Unusable(f"meta['model'][{key!r}] = {_short(value)} is not a positive "
                            f"integer")
    if meta["model"]["n_embd"] % meta["model"]["n_head"]:
        raise _Unusable("meta['model']: n_embd is not divisible by n_head")
    settings = resumed_settings(meta)
    try:
        TrainConfig(**settings).validate()
    except TrainError as exc:
        raise _Unusable(f"a setting it holds is invalid: {exc}") from None


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def resumed_settings(meta: dict) -> dict:
    """The settings a resumed run takes from the checkpoint: RESUMED_SETTINGS only,
    each of the type TrainConfig declares (a crafted value of another type is refused)."""
    defaults = TrainConfig()
    stored = meta["config"]
    settings = {}
    for name in RESUMED_SETTINGS:
        if name not in stored:
            continue
        value, default = stored[name], getattr(defaults, name)
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int):
            ok = _is_int(value)
        elif isinstance(default, float):
            ok = (_is_int(value) or isinstance(value, float))
            value = float(value) if ok else value
        else:
            ok = isinstance(value, str)
        if not ok:
            raise _Unusable(f"meta['config'][{name!r}] = {_short(value)} is not a "
                            f"{type(default).__name__}")
        settings[name] = value
    return settings


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
    kernel = meta["config"].get("attention")
    if kernel is not None and kernel != config.attention:
        raise ConfigMismatch(f"--attention is {config.attention}, but checkpoint {path!r} was "
                             f"trained with {kernel} attention, and the two kernels round "
                             f"differently; drop --attention (it is read from the checkpoint) "
                             f"or pass --attention {kernel}")
    if meta["chars"] != tokenizer.chars or meta["corpus"] != fingerprint:
        raise ConfigMismatch(f"the corpus differs from the one checkpoint {path!r} was trained "
                             f"on (vocabulary {len(meta['chars'])} vs {tokenizer.vocab_size} "
                             f"characters); pass the same --data as the original run (the "
                             f"checkpoint does not record file paths)")
    stop = min(config.steps, config.stop_at or config.steps)
    if stop <= meta["step"]:
        flag = "--stop-at" if config.stop_at and config.stop_at < config.steps else "--steps"
        raise TrainError(f"checkpoint {path!r} is at step {meta['step']} and {flag} is "
                         f"{stop}: nothing left to train; pass {flag} above {meta['step']}")
