"""Train the GPT on the CPU: `python -m engine.train --help`.

From Python (a notebook, say):

    from engine.train import TrainConfig, train, sample
    result = train(TrainConfig(steps=300), callback=lambda r: print(r["step"], r["loss"]))
    print(sample(result.model, result.dataset.tokenizer, "def ", length=200))

One optimizer step has four phases, timed separately in every record:

    loss        forward over each micro-batch (the gradient of the loss with
                respect to the logits comes out of the same fused kernel)
    backward    gradients added into the flat gradient buffer
    optimizer   (all-reduce wait,) global norm, clipping, fused AdamW
    evaluation  validation loss, every eval_every steps

Threads: by default each core runs its own replica of the model on a slice
of the micro-batch (engine.parallel.ThreadReplicas), meeting once per step;
`--thread-mode kernels` runs one model whose kernels use every core instead.
The losses agree to rounding; a run and its resumed copy agree bit for bit.

Exit codes of the command line: 0 done; 2 bad arguments; 3 unusable data
file; 4 unreadable or corrupt checkpoint; 5 settings that do not match the
checkpoint; 6 --data-parallel without mpi4py; 7 training diverged (NaN loss).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
import time
import zipfile
from dataclasses import dataclass, field

import numpy as np

from .data import (CharTokenizer, CorpusError, Dataset, batch_at, eval_batches,
                   load_corpus, unigram_entropy)
from .gpt_config import GPTConfig

CHECKPOINT_FORMAT = 1
MODEL_FIELDS = ("block_size", "n_layer", "n_head", "n_embd")


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


@dataclass
class TrainConfig:
    """Every setting of a run. The defaults train the `tiny` model (DESIGN.md)."""
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
    data_parallel: bool = False        # under mpiexec: split each micro-batch over ranks
    threads: int | None = None         # threads per process (default: cores / processes)
    thread_mode: str = "replicas"      # "replicas": one model copy per thread; "kernels":
                                       # one model, multi-threaded kernels
    log: str | None = None             # JSON-lines log file
    save: str | None = None            # checkpoint path, written atomically
    save_every: int | None = None      # default: at every evaluation and at the end
    resume: str | None = None          # checkpoint to continue from
    prompt: str | None = None          # sample text from this prompt after training
    sample_len: int = 200
    temperature: float = 0.8
    log_every: int = 10

    def validate(self) -> None:
        positive = ("steps", "batch_size", "block_size", "n_layer", "n_head", "n_embd",
                    "grad_accum", "eval_every", "eval_batches", "log_every")
        for name in positive:
            if int(getattr(self, name)) < 1 and not (name == "steps" and self.resume):
                raise TrainError(f"--{name.replace('_', '-')} must be at least 1, got "
                                 f"{getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise TrainError(f"--n-embd {self.n_embd} is not divisible by --n-head "
                             f"{self.n_head}; pick a head count that divides it")
        if self.thread_mode not in ("replicas", "kernels"):
            raise TrainError(f"--thread-mode must be replicas or kernels, got "
                             f"{self.thread_mode!r}")
        if self.threads is not None and self.threads < 1:
            raise TrainError(f"--threads must be at least 1, got {self.threads}")
        if self.dtype not in ("float32", "float64"):
            raise TrainError(f"--dtype must be float32 or float64, got {self.dtype!r}")
        if self.lr <= 0 or not math.isfinite(self.lr):
            raise TrainError(f"--lr must be a positive number, got {self.lr}")
        if not 0 < self.val_fraction < 1:
            raise TrainError(f"--val-fraction must lie in (0, 1), got {self.val_fraction}")

    def model_config(self, vocab_size: int) -> GPTConfig:
        return GPTConfig(vocab_size=vocab_size, block_size=self.block_size,
                         n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd)


@dataclass
class TrainResult:
    history: list[dict]
    model: object
    optimizer: object
    dataset: Dataset
    config: TrainConfig
    unigram_entropy: float
    final_val_loss: float | None
    step: int
    elapsed: float
    stopped_early: bool = False
    sample: str | None = None
    rank: int = 0                      # this process's rank under --data-parallel
    extra: dict = field(default_factory=dict)


# ------------------------------------------------------------------ checkpoints
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


def _check_resume(state: dict, config: TrainConfig, tokenizer: CharTokenizer,
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


# --------------------------------------------------------------------- sampling
def sample(model, tokenizer: CharTokenizer, prompt: str, length: int = 200,
           temperature: float = 0.8, seed: int = 0) -> str:
    """Continue `prompt` by `length` characters drawn from the model.

    Runs a batch-1 copy of the model on a window of the last T characters,
    padded on the right: attention is causal, so the padding cannot change the
    logits at the last real position, and one buffer layout serves every length."""
    from .gpt import GPT
    if temperature <= 0:
        raise ValueError(f"sample: temperature must be positive, got {temperature}")
    cfg = model.cfg
    gen = GPT(cfg, 1, params=model.named_params(), dtype=model.dtype)
    rng = np.random.default_rng(seed)
    ids = list(tokenizer.encode(prompt)) if prompt else [0]
    window = np.zeros((1, cfg.block_size), np.int64)
    for _ in range(length):
        context = ids[-cfg.block_size:]
        window[0, :] = 0
        window[0, :len(context)] = context
        logits = gen.forward(window)[0, len(context) - 1].astype(np.float64) / temperature
        p = np.exp(logits - logits.max())
        ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return tokenizer.decode(ids if prompt else ids[1:])


# --------------------------------------------------------------------- training
def train_step(model, optimizer, batches, rows: slice = slice(None), *, lr: float,
               clip: float | None, loss_scale: float = 1.0, allreduce=None) -> dict:
    """One optimizer step over the micro-batches `batches` (a list of (x, y)), in the
    phases the trainer times: loss and backward per micro-batch, then the
    optimizer. Returns {loss, grad_norm, clip_scale, lr, phases}.

    The gradient buffer is zeroed first (backward adds into it). With an
    MPI `allreduce`, only the last micro-batch's backward starts the bucket
    all-reduces; the optimizer phase begins by waiting for them."""
    from .optim import clip_scale, global_norm
    phases = {"loss": 0.0, "backward": 0.0, "optimizer": 0.0, "evaluation": 0.0}
    model.zero_grad()
    loss_sum = 0.0
    for k, (x, y) in enumerate(batches):
        last = k == len(batches) - 1
        loss_k, t_loss, t_backward = model.forward_backward(
            x[rows], y[rows], loss_scale=loss_scale, last=last,
            grad_ready=allreduce.start if (allreduce is not None and last) else None)
        loss_sum += loss_k
        phases["loss"] += t_loss
        phases["backward"] += t_backward
    t0 = time.perf_counter()
    loss = loss_sum / len(batches)
    if allreduce is not None:
        allreduce.wait()
        loss = allreduce.mean(loss)
    norm = global_norm(model.grads.flat)        # log it before clipping: the health signal
    scale = clip_scale(norm, clip)
    if math.isfinite(norm):
        optimizer.step(model.grads.flat, grad_scale=scale, lr=lr)
    phases["optimizer"] = time.perf_counter() - t0
    return {"loss": loss, "grad_norm": norm, "clip_scale": scale, "lr": lr, "phases": phases}


def evaluate(model, data: np.ndarray, config: TrainConfig, rows: slice, allreduce=None) -> float:
    """Mean validation loss over the fixed evaluation windows."""
    losses = [model.loss(x[rows], y[rows])
              for x, y in eval_batches(data, config.batch_size, config.block_size,
                                       config.eval_batches)]
    value = float(np.mean(losses))
    return allreduce.mean(value) if allreduce is not None else value


def _format_seconds(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def progress_line(r: dict, steps: int) -> str:
    val = f" | val {r['val_loss']:.4f}" if "val_loss" in r else ""
    return (f"step {r['step']:>5}/{steps} | loss {r['loss']:.4f}{val} | "
            f"{r['tokens_per_s']:>8,.0f} tok/s | {r['step_time'] * 1e3:6.1f} ms/step | "
            f"norm {r['grad_norm']:.3f} | left {_format_seconds(r['time_left'])}")


def train(config: TrainConfig | None = None, *, callback=None, progress=None,
          dataset: Dataset | None = None, **overrides) -> TrainResult:
    """Train; returns a TrainResult with the per-step history.

    callback(record) runs after every step (record: step, loss, lr, grad_norm,
    tokens_per_s, step_time, phases{loss, backward, optimizer, evaluation} and
    val_loss when evaluated); returning False stops the run. progress(line)
    receives the human-readable progress lines (print, for instance)."""
    from .fused.threads import concurrent_kernels_ok, cores, restore_threads, set_threads

    config = dataclasses.replace(config or TrainConfig(), **overrides)
    config.validate()
    say = progress or (lambda line: None)

    # -- processes and threads
    comm, rank, world_size = None, 0, 1
    if config.data_parallel:
        from .parallel import MPIUnavailable, shard_rows, world
        try:
            comm, rank, world_size = world()
        except MPIUnavailable as exc:
            raise ParallelUnavailable(str(exc)) from None
        try:
            rows = shard_rows(config.batch_size, rank, world_size)
        except ValueError as exc:
            raise TrainError(str(exc)) from None
    else:
        rows = slice(0, config.batch_size)
    local_batch = rows.stop - rows.start
    n_threads = config.threads or max(1, cores() // world_size)
    if config.thread_mode == "replicas" and not concurrent_kernels_ok():
        config = dataclasses.replace(config, thread_mode="kernels")   # workqueue layer only
    if config.thread_mode == "replicas":
        n_replicas = max(d for d in range(1, n_threads + 1) if local_batch % d == 0)
        thread_info = set_threads(1)
    else:
        n_replicas = 1
        thread_info = set_threads(n_threads)
    config = dataclasses.replace(config, threads=n_threads)   # recorded in checkpoints
    try:
        return _run(config, callback, say, dataset, comm if world_size > 1 else None, rank,
                    world_size, rows, n_threads, n_replicas)
    finally:
        restore_threads(thread_info)


def _run(config, callback, say, dataset, comm, rank, world_size, rows, n_threads, n_replicas):
    """train() once processes and threads are settled: data, model, the loop."""
    from .gpt import decay_segments
    from .optim import AdamW, lr_at
    from .parallel import GradientAllReduce, ThreadReplicas
    allreduce = None
    local_batch = rows.stop - rows.start

    # -- data
    try:
        text = load_corpus(config.data) if dataset is None else None
        if dataset is None:
            dataset = Dataset.from_text(text, config.val_fraction)
        dataset.check_block(config.block_size)
    except CorpusError as exc:
        raise DataError(str(exc)) from None
    fingerprint = corpus_fingerprint(text if text is not None else
                                     dataset.tokenizer.decode(np.concatenate(
                                         [dataset.train, dataset.val])))
    tok = dataset.tokenizer
    entropy = unigram_entropy(dataset.train, tok.vocab_size)

    # -- model, optimizer, resumed state
    cfg = config.model_config(tok.vocab_size)
    dtype = np.dtype(config.dtype)
    model = ThreadReplicas(cfg, local_batch, n_replicas, seed=config.seed, dtype=dtype,
                           checkpointing=config.checkpointing)
    opt = AdamW(model.params.flat, decay_segments(model.params), lr=config.lr,
                betas=(config.beta1, config.beta2), weight_decay=config.weight_decay)
    start = 0
    if config.resume:
        state = load_checkpoint(config.resume)
        _check_resume(state, config, tok, fingerprint, config.resume)
        if state["params"].size != model.params.flat.size:
            raise CheckpointError(f"checkpoint {config.resume!r} holds {state['params'].size} "
                                  f"parameters, the model needs {model.params.flat.size}")
        model.params.flat[...] = state["params"]
        opt.load_state_dict({"m": state["adam_m"], "v": state["adam_v"],
                             "t": int(state["adam_t"])})
        start = int(state["meta"]["step"])
    if comm is not None:
        allreduce = GradientAllReduce(comm, model.grads.flat)

    stop = min(config.steps, config.stop_at or config.steps)
    lead = rank == 0
    log_file = open(config.log, "a") if (config.log and lead) else None
    header = {"event": "start", "params": model.num_params(), "vocab_size": tok.vocab_size,
              "train_chars": int(len(dataset.train)), "val_chars": int(len(dataset.val)),
              "unigram_entropy": entropy, "start_step": start, "steps": config.steps,
              "processes": world_size, "threads": n_threads, "replicas": n_replicas,
              "thread_mode": config.thread_mode,
              "tokens_per_step": config.batch_size * config.block_size * config.grad_accum,
              "config": dataclasses.asdict(config)}
    from .gpt import kernel_owners
    replaced = {k: v for k, v in kernel_owners().items() if v != "engine"}
    header["kernels_replaced"] = replaced
    if log_file:
        log_file.write(json.dumps(header) + "\n")
    if lead:
        if replaced:
            say("kernels not the engine's: " + ", ".join(f"{k} ({v})" for k, v in
                                                        sorted(replaced.items())))
        say(f"model {model.num_params():,} parameters | corpus {len(dataset.train):,} train / "
            f"{len(dataset.val):,} val characters, vocabulary {tok.vocab_size} | unigram "
            f"entropy {entropy:.4f} nats | {world_size} process(es) x {n_threads} "
            f"thread(s) ({config.thread_mode}) | steps {start}->{stop}")

    history: list[dict] = []
    K = config.grad_accum
    tokens_per_step = config.batch_size * config.block_size * K
    loss_scale = 1.0 / (K * world_size)
    t_start = time.perf_counter()
    recent: list[float] = []
    val_loss = None
    stopped_early = False
    step = start
    for step in range(start, stop):
        t_step = time.perf_counter()
        lr = lr_at(step, lr=config.lr, warmup=config.warmup, total=config.steps,
                   min_ratio=config.min_lr_ratio)
        batches = [batch_at(dataset.train, config.seed, step * K + k, config.batch_size,
                            config.block_size) for k in range(K)]
        record = train_step(model, opt, batches, rows, lr=lr, clip=config.clip,
                            loss_scale=loss_scale, allreduce=allreduce)
        train_time = time.perf_counter() - t_step
        if not (math.isfinite(record["loss"]) and math.isfinite(record["grad_norm"])):
            raise Diverged(f"the loss became {record['loss']} (gradient norm "
                           f"{record['grad_norm']}) at step {step + 1}; lower --lr (now "
                           f"{config.lr}) or keep --clip on")
        record["step"] = step + 1
        phases = record["phases"]
        if world_size > 1:
            record["rank"] = rank
        done = step + 1 == stop
        over_time = (config.time_limit is not None
                     and time.perf_counter() - t_start > config.time_limit)
        if (step + 1) % config.eval_every == 0 or done or over_time:
            t0 = time.perf_counter()
            val_loss = evaluate(model, dataset.val, config, rows, allreduce)
            phases["evaluation"] = time.perf_counter() - t0
            record["val_loss"] = val_loss
        recent = (recent + [train_time])[-20:]
        record.update(step_time=train_time, tokens_per_s=tokens_per_step / train_time,
                      phases=phases, elapsed=time.perf_counter() - t_start,
                      time_left=float(np.median(recent)) * (stop - step - 1))
        history.append(record)
        if lead:
            if log_file:
                log_file.write(json.dumps(record) + "\n")
                log_file.flush()
            if (step + 1) % config.log_every == 0 or "val_loss" in record or done:
                say(progress_line(record, config.steps))
        save_now = config.save and (done or over_time or "val_loss" in record or (
            config.save_every and (step + 1) % config.save_every == 0))
        if save_now and lead:
            save_checkpoint(config.save, model, opt, step + 1, config, tok, fingerprint)
        if callback is not None and callback(record) is False:
            stopped_early = True
        if over_time:
            stopped_early = True
            if lead:
                say(f"time limit of {config.time_limit:g} s reached after step {step + 1}")
        if stopped_early:
            step += 1
            break
    else:
        step = stop
    if config.save and lead and history and "val_loss" not in history[-1]:
        save_checkpoint(config.save, model, opt, step, config, tok, fingerprint)

    text_sample = None
    if config.prompt is not None and lead:
        text_sample = sample(model, tok, config.prompt, config.sample_len, config.temperature,
                             config.seed)
    elapsed = time.perf_counter() - t_start
    result = TrainResult(history, model, opt, dataset, config, entropy, val_loss, step,
                         elapsed, stopped_early, text_sample, rank)
    if log_file:
        log_file.write(json.dumps(summary(result)) + "\n")
        log_file.close()
    model.close()          # helper threads stop; they restart if result.model is used again
    return result


def summary(result: TrainResult) -> dict:
    h = result.history
    times = [r["step_time"] for r in h[1:]] or [r["step_time"] for r in h]
    return {"event": "end", "step": result.step, "elapsed": result.elapsed,
            "final_loss": h[-1]["loss"] if h else None, "final_val_loss": result.final_val_loss,
            "unigram_entropy": result.unigram_entropy,
            "median_step_ms": float(np.median(times)) * 1e3 if times else None,
            "median_tokens_per_s": (float(np.median([r["tokens_per_s"] for r in h[1:] or h]))
                                    if h else None),
            "phases_total": {k: float(sum(r["phases"][k] for r in h))
                             for k in ("loss", "backward", "optimizer", "evaluation")},
            "stopped_early": result.stopped_early, "sample": result.sample}


# --------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    p = argparse.ArgumentParser(
        prog="python -m engine.train",
        description="Train a character-level GPT on the CPU with the fused kernels.",
        epilog="Examples:\n"
               "  python -m engine.train --steps 300 --prompt 'The '\n"
               "  python -m engine.train --data notes.txt --save run.npz --stop-at 100\n"
               "  python -m engine.train --resume run.npz          # continues bit for bit\n"
               "  mpiexec -n 2 python -m engine.train --data-parallel --steps 100\n"
               "Exit codes: 0 done, 2 bad arguments, 3 unusable data file, 4 corrupt "
               "checkpoint,\n5 settings that do not match the checkpoint, 6 no mpi4py, "
               "7 diverged.",
        formatter_class=argparse.RawDescriptionHelpFormatter, argument_default=None)
    a = p.add_argument
    a("--data", help="UTF-8 text file to train on (default: the built-in Python docs corpus)")
    a("--steps", type=int, help=f"optimizer steps (default {d.steps})")
    a("--stop-at", type=int, help="stop after this step; continue later with --resume")
    a("--time-limit", type=float, help="stop after this many seconds (saves with --save)")
    a("--batch-size", type=int, help=f"micro-batch of sequences (default {d.batch_size})")
    a("--block-size", type=int, help=f"context length T (default {d.block_size})")
    a("--n-layer", type=int, help=f"blocks (default {d.n_layer})")
    a("--n-head", type=int, help=f"attention heads (default {d.n_head})")
    a("--n-embd", type=int, help=f"width C (default {d.n_embd})")
    a("--grad-accum", type=int, help="micro-batches per optimizer step (default 1)")
    a("--lr", type=float, help=f"peak learning rate (default {d.lr})")
    a("--warmup", type=int, help=f"warm-up steps (default {d.warmup})")
    a("--weight-decay", type=float, help=f"AdamW decay of the matrices (default {d.weight_decay})")
    a("--clip", type=float, help=f"global gradient-norm clip, 0 for none (default {d.clip})")
    a("--eval-every", type=int, help=f"validation loss every N steps (default {d.eval_every})")
    a("--eval-batches", type=int, help=f"validation batches (default {d.eval_batches})")
    a("--val-fraction", type=float, help=f"share held out (default {d.val_fraction})")
    a("--seed", type=int, help="initialisation and batch seed (default 0)")
    a("--dtype", choices=("float32", "float64"), help="float32 trains, float64 checks")
    a("--checkpointing", action="store_true", default=None,
      help="activation checkpointing: recompute each block in the backward")
    a("--data-parallel", action="store_true", default=None,
      help="split each micro-batch over the processes of mpiexec")
    a("--threads", type=int, help="threads per process (default: cores / processes)")
    a("--thread-mode", choices=("replicas", "kernels"),
      help="replicas (default): one model copy per thread, each single-threaded; "
           "kernels: one model whose kernels use every thread")
    a("--log", help="append a JSON-lines log of every step to this file")
    a("--log-every", type=int, help=f"progress line every N steps (default {d.log_every})")
    a("--save", help="write a checkpoint here (atomically) at each evaluation and the end")
    a("--save-every", type=int, help="also save every N steps")
    a("--resume", help="continue from this checkpoint (its settings, unless given here)")
    a("--prompt", help="after training, print a sample continuing this text")
    a("--sample-len", type=int, help=f"characters to sample (default {d.sample_len})")
    a("--temperature", type=float, help=f"sampling temperature (default {d.temperature})")
    a("--json", action="store_true", help="machine output: one JSON object per line")
    return p


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    given = {k: v for k, v in vars(args).items() if v is not None and k != "json"}
    if args.resume:
        state = load_checkpoint(args.resume)
        base = {k: v for k, v in state["meta"]["config"].items()
                if k in {f.name for f in dataclasses.fields(TrainConfig)}}
        for transient in ("resume", "stop_at", "time_limit"):
            base.pop(transient, None)
        base.update(given)
        return TrainConfig(**base)
    return TrainConfig(**given)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    as_json = args.json

    def emit(obj_or_line):
        if as_json:
            print(json.dumps(obj_or_line), flush=True)
        else:
            print(obj_or_line, flush=True)

    try:
        config = config_from_args(args)
        result = train(config, progress=None if as_json else emit,
                       callback=(lambda r: emit(r) if r.get("rank", 0) == 0 else None)
                       if as_json else None)
    except TrainError as exc:
        if as_json:
            print(json.dumps({"event": "error", "error": type(exc).__name__,
                              "message": str(exc), "exit_code": exc.exit_code}), flush=True)
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    if result.rank != 0:
        return 0
    if as_json:
        emit(summary(result))
    else:
        s = summary(result)
        if result.history and (result.final_val_loss is not None):
            emit(f"done: step {s['step']}, validation loss {s['final_val_loss']:.4f} vs unigram "
                 f"entropy {s['unigram_entropy']:.4f} nats, {s['median_tokens_per_s']:,.0f} "
                 f"tokens/s median, {s['elapsed']:.1f} s")
        if result.sample is not None:
            emit("--- sample ---\n" + result.sample)
    return 0


if __name__ == "__main__":
    sys.exit(main())
