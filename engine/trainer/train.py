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

Reading order, from the command to the first kernel: `train` below places the
process (`_place`: the MPI job of mpi_job.py, the thread plan), prepares the
run (`_prepare`: checks, data, model) and loops (`_loop`); each step is
step.accumulate_and_step, which calls the model's forward_backward
(parallel.ThreadReplicas, one FusedGPT per replica, model.py), whose forward
runs each kernel by name through kernel_registry.py, starting with
kernels/embedding.py's embedding_forward.

A run is three frozen records: where it runs (`Placement`), what it starts
from (`Start`) and where it reports (`Reports`).

Threads: a rule (engine.trainer.thread_plan, lab/THREADS.md) chooses between
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

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..blas import library as blas_library
from .checkpoint_files import (check_resume, corpus_fingerprint, load_checkpoint,
                               remove_stale_temporaries, save_checkpoint)
from .compile_ahead import start_if_cold
from .config import MAX_SAMPLE_LEN, DataError, Diverged, TrainConfig, TrainError, WriteError
from .data import (READ_CHUNK_BYTES, CharTokenizer, CorpusError, Dataset, batch_at,
                   load_corpus, unigram_entropy)
from .kernels.linear import product_routes
from .kernels.threads import cores, restore_threads
from .model import FusedGPT, decay_segments, kernel_owners
from .mpi_job import GradientAllReduce, abort_job_on_failure, agree, join, shard_rows
from .optim import AdamW, lr_at
from .parallel import ThreadReplicas
from .preflight import check_memory, check_paths, check_prompt
from .step import accumulate_and_step, evaluate
from .thread_plan import ThreadPlan, block_matmul_weights, plan_threads


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


# ------------------------------------------------------- what a run is made of
@dataclass(frozen=True)
class Placement:
    """Where the run runs: this process's place in the MPI job (one process
    without --data-parallel) and how it spends its threads."""
    comm: object                       # the MPI communicator; None in a one-process job
    rank: int
    world_size: int
    rows: slice                        # this process's rows of every micro-batch
    threads: int
    plan: ThreadPlan                   # replicas or threaded kernels, and why
    thread_pools: dict                 # what set_threads changed, for restore_threads

    @property
    def lead(self) -> bool:
        """Rank 0 alone logs, saves and samples."""
        return self.rank == 0

    @property
    def local_batch(self) -> int:
        return self.rows.stop - self.rows.start


@dataclass(frozen=True)
class Start:
    """What the run starts from, every check passed: the data, the model (thread
    replicas) with its optimizer, and the step to start at (0, or a checkpoint's)."""
    dataset: Dataset
    fingerprint: str                   # the corpus's, written into every checkpoint
    entropy: float                     # the unigram entropy: the loss to beat
    model: ThreadReplicas
    optimizer: AdamW
    step: int


@dataclass(frozen=True)
class Reports:
    """Where the run reports: progress lines, a callback per step, the --log file
    (opened on rank 0 once the loop is about to start)."""
    say: Callable[[str], None]
    callback: Callable[[dict], object] | None
    log_file: object = None
    log_path: str | None = None

    def log(self, record: dict, steps: int, every: int, done: bool) -> None:
        """A step's record to the --log file, and its progress line when one is due."""
        if self.log_file:
            _write_log(self.log_file, self.log_path, record)
        if record["step"] % every == 0 or "val_loss" in record or done:
            self.say(progress_line(record, steps))


# --------------------------------------------------------------------- sampling
def sample(model, tokenizer: CharTokenizer, prompt: str, length: int = 200,
           temperature: float = 0.8, seed: int = 0) -> str:
    """Continue `prompt` by `length` characters drawn from the model.

    Runs a batch-1 copy of the model on a window of the last T characters,
    padded on the right: attention is causal, so the padding cannot change the
    logits at the last real position, and one buffer layout serves every length."""
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
    them all with the same TrainError (mpi_job.agree). A failure after step 1 on
    one process aborts the whole MPI job (the others would wait for it forever)."""
    config = dataclasses.replace(config or TrainConfig(), **overrides)
    reports = Reports(say=progress or (lambda line: None), callback=callback)
    comm, rank, world_size = join(config.data_parallel)
    with abort_job_on_failure(comm, rank, world_size):
        config, where = agree(comm, lambda: _place(config, comm, rank, world_size))
        try:
            start = agree(comm, lambda: _prepare(config, dataset, where, reports.say))
            return _run(config, where, start, reports)
        finally:
            restore_threads(where.thread_pools)


def _place(config: TrainConfig, comm, rank: int, world_size: int):
    """Validate the settings, split the batch over processes and threads, set the
    thread pools. Returns (the config with its thread count and mode, Placement)."""
    config.validate()
    try:
        rows = shard_rows(config.batch_size, rank, world_size)
    except ValueError as exc:
        raise TrainError(str(exc)) from None
    n_threads = config.threads or max(1, cores() // world_size)
    mode, _, pools = plan_threads(n_threads, rows.stop - rows.start, config.block_size,
                                  config.thread_mode,
                                  block_weights=block_matmul_weights(config.n_layer,
                                                                     config.n_embd))
    config = dataclasses.replace(config, threads=n_threads, thread_mode=mode)
    return config, Placement(comm, rank, world_size, rows, n_threads, pools["plan"], pools)


def _prepare(config: TrainConfig, dataset, where: Placement, say) -> Start:
    """Everything before step 1 that can fail on the user's input: paths, data,
    prompt, checkpoint, memory; then the model, from the checkpoint if resumed."""
    check_paths(config)
    if config.save and where.lead:             # rank 0 alone writes checkpoints
        remove_stale_temporaries(config.save)
    dataset, fingerprint, entropy = _load_data(config, dataset, say)
    tok = dataset.tokenizer
    check_prompt(config, tok)
    state = None
    if config.resume is not None:
        state = load_checkpoint(config.resume)
        check_resume(state, config, tok, fingerprint, config.resume)
        if "attention" not in state["meta"]["config"]:
            say(f"checkpoint {config.resume!r} does not record its attention kernel (it was "
                f"written before checkpoints kept it); resuming with --attention "
                f"{config.attention}. If it was trained with the other kernel, pass that one "
                f"to continue bit for bit")
    check_memory(config, tok.vocab_size, where.local_batch, where.plan.replicas)
    try:
        model, opt = _build_model(config, tok, where)
    except MemoryError:
        raise TrainError(f"out of memory building the model for --batch-size "
                         f"{config.batch_size} and --block-size {config.block_size}; lower "
                         f"them or add --checkpointing") from None
    step = 0
    if state is not None:
        model.params.flat[...] = state["params"]
        opt.load_state_dict({"m": state["adam_m"], "v": state["adam_v"],
                             "t": int(state["adam_t"])})
        step = int(state["meta"]["step"])
    return Start(dataset, fingerprint, entropy, model, opt, step)


def _run(config: TrainConfig, where: Placement, start: Start, reports: Reports) -> TrainResult:
    """train() once everything is checked and built: the loop, the last save, the sample."""
    allreduce = GradientAllReduce(where.comm, start.model.grads.flat) if where.comm else None
    stop = min(config.steps, config.stop_at or config.steps)
    if config.log and where.lead:
        reports = dataclasses.replace(reports, log_file=_open_log(config.log),
                                      log_path=config.log)
    header = _header(config, where, start)
    if reports.log_file:
        _write_log(reports.log_file, config.log, header)
    if where.lead:
        _announce(reports.say, header, config, stop)
    t_start = time.perf_counter()
    history, val_loss, step, stopped_early = _loop(config, where, start, reports, allreduce,
                                                   stop, t_start)
    if config.save and where.lead and history and "val_loss" not in history[-1]:
        _save(config, start, step)
    text_sample = None
    if config.prompt is not None and where.lead:
        text_sample = sample(start.model, start.dataset.tokenizer, config.prompt,
                             config.sample_len, config.temperature, config.seed)
    result = TrainResult(history, start.model, start.optimizer, start.dataset, config,
                         start.entropy, val_loss, step, time.perf_counter() - t_start,
                         stopped_early, text_sample, where.rank)
    if reports.log_file:
        _write_log(reports.log_file, config.log, summary(result))
        reports.log_file.close()
    start.model.close()    # helper threads stop; they restart if result.model is used again
    return result


def _save(config: TrainConfig, start: Start, step: int) -> None:
    save_checkpoint(config.save, start.model, start.optimizer, step, config,
                    start.dataset.tokenizer, start.fingerprint)


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


def _build_model(config: TrainConfig, tok: CharTokenizer, where: Placement):
    """Model replicas and AdamW with fresh weights; on a cold numba cache, the
    backward's and the optimizer's kernels start compiling in a helper process,
    to be ready when the first forward, compiled here, ends (compile_ahead.py)."""
    model = ThreadReplicas(config.model_config(tok.vocab_size), where.local_batch,
                           where.plan.replicas, seed=config.seed,
                           dtype=np.dtype(config.dtype), checkpointing=config.checkpointing,
                           attention=config.attention)
    start_if_cold(model)
    opt = AdamW(model.params.flat, decay_segments(model.params), lr=config.lr,
                betas=(config.beta1, config.beta2), weight_decay=config.weight_decay)
    return model, opt


def _header(config: TrainConfig, where: Placement, start: Start) -> dict:
    """The run's first log record."""
    dataset = start.dataset
    return {"event": "start", "params": start.model.num_params(),
            "vocab_size": dataset.tokenizer.vocab_size,
            "train_chars": int(len(dataset.train)), "val_chars": int(len(dataset.val)),
            "unigram_entropy": start.entropy, "start_step": start.step, "steps": config.steps,
            "processes": where.world_size, "threads": where.threads,
            "replicas": where.plan.replicas, "thread_mode": config.thread_mode,
            "thread_plan": where.plan.describe(), "blas": blas_library().description,
            "products": product_routes(),
            "tokens_per_step": config.batch_size * config.block_size * config.grad_accum,
            "config": dataclasses.asdict(config),
            "kernels_replaced": {k: v for k, v in kernel_owners().items() if v != "engine"}}


def _announce(say, header: dict, config: TrainConfig, stop: int) -> None:
    replaced = header["kernels_replaced"]
    if replaced:
        say("kernels not the engine's: " + ", ".join(f"{k} ({v})" for k, v in
                                                    sorted(replaced.items())))
    say(f"model {header['params']:,} parameters | corpus {header['train_chars']:,} train / "
        f"{header['val_chars']:,} val characters, vocabulary {header['vocab_size']} | unigram "
        f"entropy {header['unigram_entropy']:.4f} nats | {header['processes']} process(es) x "
        f"{header['threads']} thread(s) ({config.thread_mode}) | steps "
        f"{header['start_step']}->{stop}")
    say(header["thread_plan"])


def _loop(config: TrainConfig, where: Placement, start: Start, reports: Reports, allreduce,
          stop: int, t_start: float):
    """Steps start.step..stop: train, evaluate, log, save. Returns (history, last
    validation loss, the step reached, whether it stopped early)."""
    history: list[dict] = []
    K = config.grad_accum
    tokens_per_step = config.batch_size * config.block_size * K
    loss_scale = 1.0 / (K * where.world_size)
    recent: list[float] = []
    val_loss = None
    stopped_early = False
    step = start.step
    for step in range(start.step, stop):
        t_step = time.perf_counter()
        lr = lr_at(step, lr=config.lr, warmup=config.warmup, total=config.steps,
                   min_ratio=config.min_lr_ratio)
        batches = [batch_at(start.dataset.train, config.seed, step * K + k, config.batch_size,
                            config.block_size) for k in range(K)]
        record = accumulate_and_step(start.model, start.optimizer, batches, where.rows, lr=lr,
                                     clip=config.clip, loss_scale=loss_scale,
                                     allreduce=allreduce)
        train_time = time.perf_counter() - t_step
        if not (math.isfinite(record["loss"]) and math.isfinite(record["grad_norm"])):
            raise Diverged(f"the loss became {record['loss']} (gradient norm "
                           f"{record['grad_norm']}) at step {step + 1}; lower --lr (now "
                           f"{config.lr}) or keep --clip on")
        record["step"] = step + 1
        if where.world_size > 1:
            record["rank"] = where.rank
        done = step + 1 == stop
        over_time = (config.time_limit is not None
                     and time.perf_counter() - t_start > config.time_limit)
        if (step + 1) % config.eval_every == 0 or done or over_time:
            t0 = time.perf_counter()
            val_loss = evaluate(start.model, start.dataset.val, config, where.rows, allreduce)
            record["phases"]["evaluation"] = time.perf_counter() - t0
            record["val_loss"] = val_loss
        recent = (recent + [train_time])[-20:]
        record.update(step_time=train_time, tokens_per_s=tokens_per_step / train_time,
                      elapsed=time.perf_counter() - t_start,
                      time_left=float(np.median(recent)) * (stop - step - 1))
        history.append(record)
        if where.lead:
            reports.log(record, config.steps, config.log_every, done)
        save_now = config.save and (done or over_time or "val_loss" in record or (
            config.save_every and (step + 1) % config.save_every == 0))
        if save_now and where.lead:
            _save(config, start, step + 1)
        if reports.callback is not None and reports.callback(record) is False:
            stopped_early = True
        if over_time:
            stopped_early = True
            if where.lead:
                reports.say(f"time limit of {config.time_limit:g} s reached after step "
                            f"{step + 1}")
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
