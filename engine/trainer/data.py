"""Text for the trainer: the built-in corpus, a character tokenizer, batches.

The built-in corpus is the Python documentation that ships inside every
CPython (`pydoc_data.topics`, about 465 KB of English): no download, always
there. Any UTF-8 text file can replace it.

Batches are a pure function of (seed, step): the trainer does not carry a
random generator's state, so a run resumed from a checkpoint at step s draws
exactly the batches an uninterrupted run draws from step s on.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass

import numpy as np

BUILTIN = "pydoc"
MAX_CORPUS_BYTES = 256 * 2**20      # 550 times the built-in corpus; ids take 8 bytes a character
READ_CHUNK_BYTES = 16 * 2**20       # a bigger file is read in parts, with a progress line each


class CorpusError(ValueError):
    """A corpus that cannot be used, with what to do about it."""


def builtin_text() -> str:
    """The Python documentation topics of this interpreter, joined in name order."""
    try:
        from pydoc_data.topics import topics
    except ImportError as exc:  # stripped-down Pythons may lack it
        raise CorpusError("the built-in corpus needs the standard module pydoc_data.topics, "
                          "which this Python lacks; pass a UTF-8 text file instead "
                          "(--data path/to/file.txt)") from exc
    return "\n\n".join(topics[name] for name in sorted(topics))


def _read_corpus_bytes(path: str, progress=None) -> bytes:
    """The bytes of the regular file `path`, at most MAX_CORPUS_BYTES of them. It is opened
    without blocking (a named pipe would wait for a writer forever) and checked on the
    open file (/dev/zero has size 0 and never ends); progress(line) hears about big files."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise CorpusError(f"cannot open corpus file {path!r}: {exc.strerror}; pass a "
                          f"readable UTF-8 text file") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CorpusError(f"corpus path {path!r} is not a regular file (a pipe, a device "
                              f"or a socket); pass a UTF-8 text file")
        too_big = CorpusError(f"corpus file {path!r} holds more than {MAX_CORPUS_BYTES:,} "
                              f"bytes, the most the trainer reads (a character model on a "
                              f"CPU sees a small part of that in any run); pass a shorter "
                              f"text file")
        if info.st_size > MAX_CORPUS_BYTES:
            raise too_big
        chunks, done = [], 0
        while chunk := _read_part(f, path):
            done += len(chunk)
            if done > MAX_CORPUS_BYTES:           # the file grew while it was read
                raise too_big
            chunks.append(chunk)
            if progress is not None and info.st_size > READ_CHUNK_BYTES:
                progress(f"reading {path}: {done / 2**20:,.0f} of "
                         f"{info.st_size / 2**20:,.0f} MiB")
    return b"".join(chunks)


def _read_part(f, path: str) -> bytes:
    """The next READ_CHUNK_BYTES of the open corpus file; a file the system will not
    read (/proc/self/mem, a failing disk) is a CorpusError that names it."""
    try:
        return f.read(READ_CHUNK_BYTES)
    except OSError as exc:
        raise CorpusError(f"cannot read corpus file {path!r}: {exc.strerror}; pass a "
                          f"readable UTF-8 text file") from None


def load_corpus(path: str | None = None, progress=None) -> str:
    """The text of the built-in corpus (path None or "pydoc") or of a UTF-8 file of at
    most MAX_CORPUS_BYTES; progress(line), if given, hears how a big file's read goes."""
    if path is None or path == BUILTIN:
        return builtin_text()
    if not path:
        raise CorpusError("the corpus path is empty; pass a UTF-8 text file, or leave --data "
                          "out for the built-in corpus")
    if not os.path.exists(path):
        raise CorpusError(f"corpus file {path!r} does not exist; pass an existing UTF-8 text "
                          f"file, or leave --data out for the built-in corpus")
    if os.path.isdir(path):
        raise CorpusError(f"corpus path {path!r} is a directory; pass a text file")
    raw = _read_corpus_bytes(path, progress)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorpusError(f"corpus file {path!r} is not UTF-8 (byte {exc.start} is "
                          f"0x{raw[exc.start]:02x}); convert it, e.g. "
                          f"`iconv -f latin1 -t utf-8 {path} > {path}.utf8`") from None
    return text


def _code_points(text: str) -> np.ndarray:
    """The Unicode code point of each character of `text` (lone surrogates included)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


@dataclass(frozen=True)
class CharTokenizer:
    """Characters <-> integer ids; the vocabulary is the sorted set of characters."""
    chars: str

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """int64 ids, looked up from each character's code point in one array operation
        (a file of 100 million characters takes seconds, not minutes)."""
        codes, table = _code_points(text), _code_points(self.chars)
        size = max(int(codes.max(initial=0)), int(table.max(initial=0))) + 1
        lookup = np.full(size, -1, np.int64)
        lookup[table] = np.arange(len(table))
        ids = lookup[codes]
        if len(ids) and ids.min() < 0:
            unknown = sorted(set(text) - set(self.chars))
            raise ValueError(f"CharTokenizer.encode: characters {unknown[:5]!r} are not in the "
                             f"vocabulary of {self.vocab_size} characters")
        return ids

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def unigram_entropy(ids: np.ndarray, vocab_size: int) -> float:
    """Entropy in nats of the character frequencies: the loss of a model that
    ignores context. A trained model must get clearly below it."""
    counts = np.bincount(ids, minlength=vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


@dataclass
class Dataset:
    """A tokenized corpus split into a training and a validation part."""
    tokenizer: CharTokenizer
    train: np.ndarray
    val: np.ndarray

    @classmethod
    def from_text(cls, text: str, val_fraction: float = 0.1) -> "Dataset":
        if not 0 < val_fraction < 1:
            raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction}")
        tok = CharTokenizer.from_text(text)
        ids = tok.encode(text)
        n_val = max(1, int(len(ids) * val_fraction))
        return cls(tok, ids[:-n_val], ids[-n_val:])

    def check_block(self, block_size: int) -> None:
        for name, part in (("training", self.train), ("validation", self.val)):
            if len(part) <= block_size:
                raise CorpusError(f"the {name} part holds {len(part)} characters, fewer than "
                                  f"block_size + 1 = {block_size + 1}; use a longer text or a "
                                  f"smaller --block-size")


def batch_at(data: np.ndarray, seed: int, step: int, batch_size: int, block_size: int,
             out_x: np.ndarray | None = None, out_y: np.ndarray | None = None):
    """The batch of training step `step`: B random windows of T+1 characters,
    inputs x and next-character targets y, both (B, T) int64. Depends only on
    (seed, step), so resumed runs see the same data."""
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(data) - block_size, size=batch_size)
    x = np.empty((batch_size, block_size), np.int64) if out_x is None else out_x
    y = np.empty((batch_size, block_size), np.int64) if out_y is None else out_y
    for b, s in enumerate(starts):
        x[b] = data[s:s + block_size]
        y[b] = data[s + 1:s + 1 + block_size]
    return x, y


def eval_batches(data: np.ndarray, batch_size: int, block_size: int, n_batches: int):
    """The validation batches: n_batches * batch_size windows spread evenly over
    the data, the same ones at every evaluation (so the curve is not noisy)."""
    n_windows = n_batches * batch_size
    starts = np.linspace(0, len(data) - block_size - 1, n_windows).astype(np.int64)
    for k in range(n_batches):
        chunk = starts[k * batch_size:(k + 1) * batch_size]
        x = np.stack([data[s:s + block_size] for s in chunk])
        y = np.stack([data[s + 1:s + 1 + block_size] for s in chunk])
        yield x, y
