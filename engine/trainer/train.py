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

Threads: a rule (engine.trainer.thread_plan, THREADS.md) chooses between
replicas of the model, each on one core with a slice of the micro-batch
(engine.trainer.parallel.ThreadReplicas), meeting once per step, and one model
whose kernels use every core; `--thread-mode` forces either.
The losses agree to rounding; a run and its resumed copy agree bit for bit.

Exit codes of the command line: 0 done; 2 bad arguments; 3 unusable data
file; 4 unreadable or corrupt checkpoint; 5 settings that do not match the
checkpoint; 6 --data-parallel without mpi4py; 7 training diverged (NaN loss);
8 a checkpoint or log could not be written (disk full, say).

Every check runs before step 1 (engine/trainer/preflight.py); a checkpoint
gives a resumed run its weights, optimizer state and mathematical settings,
never a path to write, a prompt or a thread count.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .checkpoint_files import (check_resume, corpus_fingerprint, load_checkpoint,
                               remove_stale_temporaries, save_checkpoint)
from .config import MAX_SAMPLE_LEN, DataError, Diverged, ParallelUnavailable, TrainConfig, TrainError, WriteError
from .preflight import check_memory, check_paths, check_prompt
from .data import READ_CHUNK_BYTES, CharTokenizer, CorpusError, Dataset, batch_at, load_corpus, \
    unigram_entropy
from .step import evaluate, train_step
from .thread_plan import block_matmul_weights


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


@dataclass(frozen=True)
class _RunContext:
    """What the steps of one run read, built once everything is checked and the
    clock starts: the settings, the data, the model and its optimizer, this
    process's place among the others, and where the run reports."""
    config: TrainConfig
    dataset: Dataset
    model: object                      # parallel.ThreadReplicas
    optimizer: object                  # optim.AdamW
    allreduce: object                  # parallel.GradientAllReduce, None in one process
    rows: slice                        # this process's rows of every micro-batch
    rank: int
    world_size: int
    fingerprint: str                   # the corpus's, written into every checkpoint
    log_file: object                   # the open --log on rank 0, else None
    say: Callable[[str], None]         # hears the progress lines
    callback: Callable[[dict], object] | None
    t_start: float                     # perf_counter() at the start of the first step

    @property
    def lead(self) -> bool:
        """Rank 0 alone logs, saves and samples."""
        return self.rank == 0

    def save(self, step: int) -> None:
        save_checkpoint(self.config.save, self.model, self.optimizer, step, self.config,
                        self.dataset.tokenizer, self.fingerprint)

    def log(self, record: dict, done: bool) -> None:
        """A step's record to the --log file, and its progress line when one is due."""
        config = self.config
        if self.log_file:
            _write_log(self.log_file, config.log, record)
        if record["step"] % config.log_every == 0 or "val_loss" in record or done:
            self.say(progress_line(record, config.steps))


# --------------------------------------------------------------------- sampling
def sample(model, tokenizer: CharTokenizer, prompt: str, length: int = 200,
           temperature: float = 0.8, seed: int = 0) -> str:
    """Continue `prompt` by `length` characters drawn from the model.

    Runs a batch-1 copy of the model on a window of the last T characters,
    padded on the right: attention is causal, so the padding cannot change the
    logits at the last real position, and one buffer layout serves every length."""
    from .model import FusedGPT
    if temperature <= 0:
        raise ValueError(f"sample: temperature must be positive, got {temperature}")
    if not 0 <= length <= MAX_SAMPLE_LEN:
        raise ValueError(f"sample: length must lie in [0, {MAX_SAMPLE_LEN:,}] characters, got "
                         f"{length:,}")
    cfg = model.cfg
    gen = FusedGPT(cfg, 1, params=model.named_params(), dtype=model.dtype)
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
    receives the human-readable progress lines (print, for instance).

    Every check (settings, paths, data, checkpoint, memory) runs before step 1,
    on every process under --data-parallel; a problem on any one of them stops
    them all with the same TrainError. A failure after step 1 on one process
    aborts the whole MPI job (the others would wait for it forever)."""
    from .kernels.threads import restore_threads

    config = dataclasses.replace(config or TrainConfig(), **overrides)
    say = progress or (lambda line: None)
    comm, rank, world_size = _processes(config)
    comm = comm if world_size > 1 else None
    with abort_job_on_failure(comm, rank, world_size):
        config, rows, n_threads, n_replicas, thread_info = agree(
            comm, lambda: _threads(config, rank, world_size))
        try:
            prepared = agree(comm, lambda: _prepare(config, dataset, rows, n_replicas,
                                                    saves=rank == 0, say=say))
            return _run(config, callback, say, prepared, comm, rank, world_size, rows,
                        n_threads, thread_info["plan"])
        finally:
            restore_threads(thread_info)


def _processes(config):
    """(comm, rank, world size): MPI's under --data-parallel, else (None, 0, 1)."""
    if not config.data_parallel:
        return None, 0, 1
    from .parallel import MPIUnavailable, world
    try:
        return world()
    except MPIUnavailable as exc:
        raise ParallelUnavailable(str(exc)) from None


def _threads(config, rank, world_size):
    """Validate the settings, split the batch over processes and threads, set the pools."""
    from .kernels.threads import cores
    from .thread_plan import plan_threads
    from .parallel import shard_rows
    config.validate()
    try:
        rows = shard_rows(config.batch_size, rank, world_size)
    except ValueError as exc:
        raise TrainError(str(exc)) from None
    local_batch = rows.stop - rows.start
    n_threads = config.threads or max(1, cores() // world_size)
    mode, n_replicas, thread_info = plan_threads(
        n_threads, local_batch, config.block_size, config.thread_mode,
        block_weights=block_matmul_weights(config.n_layer, config.n_embd))
    config = dataclasses.replace(config, threads=n_threads, thread_mode=mode)
    return config, rows, n_threads, n_replicas, thread_info


def _prepare(config, dataset, rows, n_replicas, saves=True, say=lambda line: None):
    """Everything before step 1 that can fail on the user's input: paths, data,
    prompt, checkpoint, memory; then the model. Returns (dataset, fingerprint,
    unigram entropy, model, optimizer, first step)."""
    check_paths(config)
    if config.save and saves:                   # rank 0 alone writes checkpoints
        remove_stale_temporaries(config.save)
    dataset, fingerprint, entropy = _load_data(config, dataset, say)
    tok = dataset.tokenizer
    check_prompt(config, tok)
    state = None
    if config.resume:
        state = load_checkpoint(config.resume)
        check_resume(state, config, tok, fingerprint, config.resume)
        if "attention" not in state["meta"]["config"]:
            say(f"checkpoint {config.resume!r} does not record its attention kernel (it was "
                f"written before checkpoints kept it); resuming with --attention "
                f"{config.attention}. If it was trained with the other kernel, pass that one "
                f"to continue bit for bit")
    check_memory(config, tok.vocab_size, rows.stop - rows.start, n_replicas)
    try:
        model, opt = _build_model(config, tok, rows.stop - rows.start, n_replicas)
    except MemoryError:
        raise TrainError(f"out of memory building the model for --batch-size "
                         f"{config.batch_size} and --block-size {config.block_size}; lower "
                         f"them or add --checkpointing") from None
    start = 0
    if state is not None:
        model.params.flat[...] = state["params"]
        opt.load_state_dict({"m": state["adam_m"], "v": state["adam_v"],
                             "t": int(state["adam_t"])})
        start = int(state["meta"]["step"])
    return dataset, fingerprint, entropy, model, opt, start


def agree(comm, prepare):
    """prepare() on every process; if it raised a TrainError on any, raise one on all
    (the lowest failing rank's), so that no process starts step 1 alone and waits
    forever for the others. Without MPI (comm None): just prepare()."""
    if comm is None:
        return prepare()
    failure = None
    try:
        result = prepare()
    except TrainError as exc:
        failure = exc
    reports = comm.allgather(None if failure is None else
                             (type(failure).__name__, failure.exit_code, str(failure)))
    failed = [(r, report) for r, report in enumerate(reports) if report is not None]
    if not failed:
        return result
    r, (_, code, message) = failed[0]
    error = failure if r == comm.Get_rank() else TrainError(f"process {r}: {message}")
    error.exit_code = code
    error.on_every_rank = True          # the command line prints it once, on rank 0
    raise error


@contextlib.contextmanager
def abort_job_on_failure(comm, rank, world_size):
    """Under MPI with several processes: an exception on this one (other than a
    divergence, which every process sees at the same step) prints the error and
    aborts the whole job with a non-zero exit, instead of leaving the others
    blocked in the next all-reduce."""
    try:
        yield
    except BaseException as exc:
        if comm is None or getattr(exc, "on_every_rank", False) or isinstance(exc, Diverged):
            raise
        code = getattr(exc, "exit_code", 130 if isinstance(exc, KeyboardInterrupt) else 1)
        print(f"error on process {rank} of {world_size}: {type(exc).__name__}: {exc}; "
              f"aborting all {world_size} processes", file=sys.stderr, flush=True)
        # The launcher forwards each process's output through a pipe, and Abort
        # kills every process at once: on a loaded machine the message was once
        # lost before it was forwarded (the job ended with an empty stderr).
        time.sleep(0.5)
        comm.Abort(code)
        raise


def _run(config, callback, say, prepared, comm, rank, world_size, rows, n_threads, thread_plan):
    """train() once everything is checked and built: the loop, the last save, the sample."""
    from .parallel import GradientAllReduce
    dataset, fingerprint, entropy, model, opt, start = prepared
    tok = dataset.tokenizer
    allreduce = GradientAllReduce(comm, model.grads.flat) if comm is not None else None
    stop = min(config.steps, config.stop_at or config.steps)
    lead = rank == 0
    log_file = _open_log(config.log) if (config.log and lead) else None
    header = _header(config, model, dataset, entropy, start, world_size, n_threads, thread_plan)
    if log_file:
        _write_log(log_file, config.log, header)
    if lead:
        _announce(say, header, model, dataset, config, stop)

    run = _RunContext(config, dataset, model, opt, allreduce, rows, rank, world_size,
                      fingerprint, log_file, say, callback, t_start=time.perf_counter())
    history, val_loss, step, stopped_early = _loop(run, start, stop)
    if config.save and lead and history and "val_loss" not in history[-1]:
        run.save(step)

    text_sample = None
    if config.prompt is not None and lead:
        text_sample = sample(model, tok, config.prompt, config.sample_len, config.temperature,
                             config.seed)
    elapsed = time.perf_counter() - run.t_start
    result = TrainResult(history, model, opt, dataset, config, entropy, val_loss, step,
                         elapsed, stopped_early, text_sample, rank)
    if log_file:
        _write_log(log_file, config.log, summary(result))
        log_file.close()
    model.close()          # helper threads stop; they restart if result.model is used again
    return result


def _open_log(path):
    try:
        return open(path, "a")
    except OSError as exc:
        raise WriteError(f"cannot open --log {path!r}: {exc.strerror}; pass another path") \
            from None


def _write_log(log_file, path, record) -> None:
    try:
        log_file.write(json.dumps(record) + "\n")
        log_file.flush()
    except OSError as exc:
        raise WriteError(f"could not append to --log {path!r}: {exc.strerror}; free some "
                         f"space or pass another --log") from None


def _load_data(config, dataset, say=lambda line: None):
    """The dataset (read from config.data unless given), its fingerprint and unigram
    entropy; say(line) hears how the reading of a big file goes."""
    try:
        text = load_corpus(config.data, progress=say) if dataset is None else None
        if dataset is None:
            if len(text) > READ_CHUNK_BYTES:
                say(f"tokenizing {len(text):,} characters")
            dataset = Dataset.from_text(text, config.val_fraction)
        dataset.check_block(config.block_size)
    except CorpusError as exc:
        raise DataError(str(exc)) from None
    fingerprint = corpus_fingerprint(text if text is not None else
                                     dataset.tokenizer.decode(np.concatenate(
                                         [dataset.train, dataset.val])))
    return dataset, fingerprint, unigram_entropy(dataset.train, dataset.tokenizer.vocab_size)


def _build_model(config, tok, local_batch, n_replicas):
    """Model replicas and AdamW with fresh weights; on a cold numba cache, the
    backward's and the optimizer's kernels start compiling in a helper process,
    to be ready when the first forward, compiled here, ends (compile_ahead.py)."""
    from .compile_ahead import start_if_cold
    from .model import decay_segments
    from .optim import AdamW
    from .parallel import ThreadReplicas
    cfg = config.model_config(tok.vocab_size)
    model = ThreadReplicas(cfg, local_batch, n_replicas, seed=config.seed,
                           dtype=np.dtype(config.dtype), checkpointing=config.checkpointing,
                           attention=config.attention)
    start_if_cold(model)
    opt = AdamW(model.params.flat, decay_segments(model.params), lr=config.lr,
                betas=(config.beta1, config.beta2), weight_decay=config.weight_decay)
    return model, opt


def _header(config, model, dataset, entropy, start, world_size, n_threads, thread_plan) -> dict:
    """The run's first log record."""
    from .model import kernel_owners
    from ..blas import library as blas_library
    from .kernels.linear import product_routes
    return {"event": "start", "params": model.num_params(),
            "vocab_size": dataset.tokenizer.vocab_size,
            "train_chars": int(len(dataset.train)), "val_chars": int(len(dataset.val)),
            "unigram_entropy": entropy, "start_step": start, "steps": config.steps,
            "processes": world_size, "threads": n_threads, "replicas": thread_plan.replicas,
            "thread_mode": config.thread_mode, "thread_plan": thread_plan.describe(),
            "blas": blas_library().description,
            "products": product_routes(),
            "tokens_per_step": config.batch_size * config.block_size * config.grad_accum,
            "config": dataclasses.asdict(config),
            "kernels_replaced": {k: v for k, v in kernel_owners().items() if v != "engine"}}


def _announce(say, header, model, dataset, config, stop) -> None:
    replaced = header["kernels_replaced"]
    if replaced:
        say("kernels not the engine's: " + ", ".join(f"{k} ({v})" for k, v in
                                                    sorted(replaced.items())))
    say(f"model {model.num_params():,} parameters | corpus {len(dataset.train):,} train / "
        f"{len(dataset.val):,} val characters, vocabulary {header['vocab_size']} | unigram "
        f"entropy {header['unigram_entropy']:.4f} nats | {header['processes']} process(es) x "
        f"{header['threads']} thread(s) ({config.thread_mode}) | steps "
        f"{header['start_step']}->{stop}")
    say(header["thread_plan"])


def _loop(run: _RunContext, start: int, stop: int):
    """Steps start..stop: train, evaluate, log, save. Returns (history, last validation
    loss, the step reached, whether it stopped early)."""
    from .optim import lr_at
    config, train_data = run.config, run.dataset.train
    history: list[dict] = []
    K = config.grad_accum
    tokens_per_step = config.batch_size * config.block_size * K
    loss_scale = 1.0 / (K * run.world_size)
    recent: list[float] = []
    val_loss = None
    stopped_early = False
    step = start
    for step in range(start, stop):
        t_step = time.perf_counter()
        lr = lr_at(step, lr=config.lr, warmup=config.warmup, total=config.steps,
                   min_ratio=config.min_lr_ratio)
        batches = [batch_at(train_data, config.seed, step * K + k, config.batch_size,
                            config.block_size) for k in range(K)]
        record = train_step(run.model, run.optimizer, batches, run.rows, lr=lr,
                            clip=config.clip, loss_scale=loss_scale, allreduce=run.allreduce)
        train_time = time.perf_counter() - t_step
        if not (math.isfinite(record["loss"]) and math.isfinite(record["grad_norm"])):
            raise Diverged(f"the loss became {record['loss']} (gradient norm "
                           f"{record['grad_norm']}) at step {step + 1}; lower --lr (now "
                           f"{config.lr}) or keep --clip on")
        record["step"] = step + 1
        phases = record["phases"]
        if run.world_size > 1:
            record["rank"] = run.rank
        done = step + 1 == stop
        over_time = (config.time_limit is not None
                     and time.perf_counter() - run.t_start > config.time_limit)
        if (step + 1) % config.eval_every == 0 or done or over_time:
            t0 = time.perf_counter()
            val_loss = evaluate(run.model, run.dataset.val, config, run.rows, run.allreduce)
            phases["evaluation"] = time.perf_counter() - t0
            record["val_loss"] = val_loss
        recent = (recent + [train_time])[-20:]
        record.update(step_time=train_time, tokens_per_s=tokens_per_step / train_time,
                      phases=phases, elapsed=time.perf_counter() - run.t_start,
                      time_left=float(np.median(recent)) * (stop - step - 1))
        history.append(record)
        if run.lead:
            run.log(record, done)
        save_now = config.save and (done or over_time or "val_loss" in record or (
            config.save_every and (step + 1) % config.save_every == 0))
        if save_now and run.lead:
            run.save(step + 1)
        if run.callback is not None and run.callback(record) is False:
            stopped_early = True
        if over_time:
            stopped_early = True
            if run.lead:
                run.say(f"time limit of {config.time_limit:g} s reached after step {step + 1}")
        if stopped_early:
            step += 1
            break
    else:
        step = stop
    return history, val_loss, step, stopped_early


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
