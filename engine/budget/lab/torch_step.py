"""Measure a real training step with PyTorch, to compare with `real_step`'s prediction.

`measure_step(cfg)` builds the model `cfg.activation_model` names (a plain
PyTorch GPT as nanoGPT writes it, or Hugging Face transformers' GPT-2 or
LLaMA from a config, random weights), runs two training steps (forward,
backward, `cfg.optimizer`'s `step()` under its implementation: torch's
for-loop, foreach or fused AdamW or SGD, `zero_grad(set_to_none=True)`) and
reads what was allocated:

- on CUDA, the caching allocator (`torch.cuda.memory_allocated` and
  `max_memory_allocated`, the peak reset before each step);
- on the CPU, PyTorch's profiler, whose memory events carry the running
  total of what the CPU allocator handed out.

Both count tensors only (not the cuBLAS workspace or oneDNN scratch).
"activations" is what the forward leaves alive (after it minus before it, in
step 2); "peak" the most alive during step 2 (weights and optimizer state
included), "peak_first_step" during step 1. torch (and transformers for
"hf") are optional extras: `torch_missing()` says what is missing.

Before anything is allocated, the model is built on PyTorch's meta device (shapes,
no memory) and its parameter count compared with the budget's, so the step measured
is the step predicted; and the budget's prediction of that step (with
`MEMORY_HEADROOM`) is compared with the memory available (the GPU's free memory, or
the CPU's available memory): a step that would not fit is refused, naming the
settings to lower.
"""
from __future__ import annotations

import gc
import importlib.util
import json
import math
import os
import tempfile
from dataclasses import dataclass

from ..config import BudgetConfig, BudgetError
from ..real_step import output_outlives_backward, outputs_kept
from ..optimizer_step import ADAFACTOR_TRAINER_ARGS, MOMENTUM, TORCH_SWITCHES
from .recipe_models import peft_model, quantized

# A CPU measurement runs the step for real: keep it to seconds.
CPU_MAX_LAYERS = 4
CPU_MAX_TOKENS = 512


def torch_missing(cfg: BudgetConfig) -> str | None:
    """None when the packages `cfg`'s step needs are importable, else which are not."""
    needed = (["torch"] + (["transformers"] if cfg.activation_model == "hf"
                           or cfg.optimizer == "adafactor" else [])
              + (["peft"] if cfg.lora_rank else [])
              + (["bitsandbytes"] if cfg.qlora or cfg.optimizer == "adamw-8bit" else []))
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    step = ("QLoRA " if cfg.qlora else "LoRA " if cfg.lora_rank else "") + cfg.activation_model
    return (f"{' and '.join(missing)} not installed; `pip install "
            f"{' '.join(missing)}` to measure a {step} step")


def cpu_shape(cfg: BudgetConfig) -> BudgetConfig:
    """The scaled-down step a CPU measures: at most CPU_MAX_LAYERS blocks,
    CPU_MAX_TOKENS tokens and two micro-batches, on one device. A step
    predicted for CUDA runs in fp32 (the CPU's autocast casts other ops than
    CUDA's, so a bf16 run here would not be that step); a step predicted for
    backend "cpu" runs its own precision."""
    seq = min(cfg.seq_len, CPU_MAX_TOKENS)
    batch = max(1, min(cfg.micro_batch, CPU_MAX_TOKENS // seq))
    precision = cfg.precision if getattr(cfg, "backend", "cuda") == "cpu" else "fp32"
    return cfg.with_(n_layer=min(cfg.n_layer, CPU_MAX_LAYERS), micro_batch=batch,
                     seq_len=seq, precision=precision, accumulation=min(cfg.accumulation, 2),
                     devices=1, zero=0)


# ------------------------------------------------------------------ models
# transformers' class prefix of each LLaMA-shaped model_type `hf.py` reads
LLAMA_FAMILY = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral", "qwen3": "Qwen3",
                "gemma": "Gemma", "gemma2": "Gemma2", "gemma3_text": "Gemma3"}
# a config class not named after its model class
CONFIG_CLASS = {"Gemma3": "Gemma3TextConfig"}


def _use_cache(cfg: BudgetConfig) -> bool:
    """The use_cache the config gives transformers ("default": transformers' own, on)."""
    setting = getattr(cfg, "resolved_use_cache", None)
    return (getattr(cfg, "use_cache", "default") if setting is None else setting) in (
        True, "on", "default")


def _llama_family(cfg: BudgetConfig) -> str:
    """The file's model_type, else the class that has the traits set by flags."""
    kind = getattr(cfg, "model_type", "")
    if kind in LLAMA_FAMILY:
        return LLAMA_FAMILY[kind]
    if getattr(cfg, "qk_norm", False):
        return "Qwen3"
    if getattr(cfg, "qkv_bias", False):
        return "Qwen2"
    return "Mistral" if getattr(cfg, "sliding_window", 0) else "Llama"


def _llama_config(cfg: BudgetConfig, common: dict):
    """The config of `cfg.model_type`'s class, with the traits the budget reads."""
    import transformers
    family = _llama_family(cfg)
    window = getattr(cfg, "sliding_window", 0) or None
    biases = {"attention_bias": getattr(cfg, "attention_bias", False)}
    traits = {"Llama": {**biases, "mlp_bias": getattr(cfg, "mlp_bias", False)},
              "Mistral": {"sliding_window": window},
              "Qwen2": {"use_sliding_window": window is not None,
                        "sliding_window": window, "max_window_layers": 0},
              "Qwen3": {"use_sliding_window": window is not None, **biases,
                        "sliding_window": window, "max_window_layers": 0},
              "Gemma": biases,
              "Gemma2": {**biases, "sliding_window": window},
              "Gemma3": {**biases, "sliding_window": window}}[family]
    config = getattr(transformers, CONFIG_CLASS.get(family, f"{family}Config"))(
        num_hidden_layers=cfg.n_layer, hidden_size=cfg.d_model,
        num_attention_heads=cfg.n_head, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_dim, intermediate_size=cfg.ffn,
        max_position_embeddings=cfg.positions,
        attention_dropout=0.1 if cfg.dropout else 0.0, **traits, **common)
    return config, getattr(transformers, f"{family}ForCausalLM")


def _hf_model(cfg: BudgetConfig):
    import transformers
    common = dict(vocab_size=cfg.vocab_size, tie_word_embeddings=cfg.tied_embedding,
                  use_cache=_use_cache(cfg))
    if cfg.architecture == "llama":
        config, cls = _llama_config(cfg, common)
    else:
        p = 0.1 if cfg.dropout else 0.0
        config = transformers.GPT2Config(
            n_layer=cfg.n_layer, n_embd=cfg.d_model, n_head=cfg.n_head,
            n_inner=cfg.d_ff or None, n_positions=cfg.positions,
            attn_pdrop=p, resid_pdrop=p, embd_pdrop=p, **common)
        cls = transformers.GPT2LMHeadModel
    config.bos_token_id = config.eos_token_id = config.pad_token_id = None
    model = cls._from_config(config, attn_implementation=(
        "sdpa" if cfg.attention == "flash" else "eager"))
    if cfg.weights_dtype == "bf16":  # from_pretrained(..., torch_dtype=torch.bfloat16)
        import torch
        model.to(torch.bfloat16)
    if cfg.qlora and model.device.type != "meta":  # quantized as transformers loads it
        from peft import prepare_model_for_kbit_training
        model = prepare_model_for_kbit_training(
            quantized(model), use_gradient_checkpointing=cfg.recompute == "full",
            gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.recompute == "full":  # checkpoint every block (the method's newer name first)
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if cfg.lora_rank:  # peft's adapters over the frozen model
        model = peft_model(model, cfg)
    return model


def _hf_batch(cfg: BudgetConfig, ids) -> dict:
    """The model's keyword arguments. A padded batch is what a collator makes:
    the last quarter of the first row is padding, masked out of the attention
    and labelled -100 so the loss skips it."""
    if not getattr(cfg, "padded_batch", False):
        return {"input_ids": ids, "labels": ids}
    mask = ids.new_ones(ids.shape)
    mask[0, cfg.seq_len - cfg.seq_len // 4:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def _plain_model(cfg: BudgetConfig):
    """nanoGPT's GPT (its model.py, written again here): pre-LN blocks, fused
    qkv, F.gelu(approximate="tanh"), SDPA or manual attention, the head tied to the
    token table as nanoGPT ties it, or a table of its own (`tied_embedding=False`)."""
    import torch
    from torch import nn
    from torch.nn import functional as F
    p, flash = (0.1 if cfg.dropout else 0.0), cfg.attention == "flash"
    C, H = cfg.d_model, cfg.n_head

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.mlp_proj = nn.Linear(C, cfg.ffn), nn.Linear(cfg.ffn, C)
            self.attn_drop, self.resid_drop = nn.Dropout(p), nn.Dropout(p)
            self.register_buffer("causal", torch.tril(torch.ones(cfg.seq_len, cfg.seq_len))
                                 .view(1, 1, cfg.seq_len, cfg.seq_len), persistent=False)

        def attention(self, x):
            B, T, _ = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            if flash:
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=p if self.training else 0,
                                                   is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(self.causal[:, :, :T, :T] == 0, float("-inf"))
                y = self.attn_drop(F.softmax(att, dim=-1)) @ v
            return self.resid_drop(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))

        def forward(self, x):
            x = x + self.attention(self.ln_1(x))
            h = F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")
            return x + self.resid_drop(self.mlp_proj(h))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(cfg.vocab_size, C), nn.Embedding(cfg.positions, C)
            self.drop, self.ln_f = nn.Dropout(p), nn.LayerNorm(C)
            self.h = nn.ModuleList(Block() for _ in range(cfg.n_layer))
            self.lm_head = nn.Linear(C, cfg.vocab_size, bias=False)
            if cfg.tied_embedding:
                self.lm_head.weight = self.wte.weight

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.drop(self.wte(idx) + self.wpe(pos))
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
            return logits, loss

    return GPT()


def _build(cfg: BudgetConfig):
    return _hf_model(cfg) if cfg.activation_model == "hf" else _plain_model(cfg)


# ------------------------------------------------- before anything is allocated
# What a step holds beyond the budget's prediction (the allocator's rounding, cuBLAS
# and oneDNN workspaces, the CPU profiler's records): the prediction is raised by this
# fraction before it is compared with the memory available.
MEMORY_HEADROOM = 0.25


def _same_shape_as_predicted(run: BudgetConfig) -> int:
    """Build `run`'s model on PyTorch's meta device (shapes only, no memory) and compare
    its parameter count with the budget's; BudgetError when they differ, so the step
    measured is the step predicted (tied or untied head, head_dim, biases, norms).
    Returns the bytes of the model's buffers (a causal mask), which the budget does not
    count but the step allocates. LoRA adapters and peft's trained copies of whole
    modules are left out of the comparison: the budget counts the frozen model they
    sit on."""
    import torch

    from ..counts import parameter_count
    with torch.device("meta"):
        model = _build(run)
    built = sum(p.numel() for name, p in model.named_parameters()
                if "lora_" not in name and "modules_to_save" not in name)
    counted = parameter_count(run)
    if built != counted:
        raise BudgetError(
            f"--measure torch would build a model of {built:,} parameters, but the budget "
            f"counts {counted:,} for this shape ({run.architecture}, "
            f"{'tied' if run.tied_embedding else 'untied'} head, head_dim={run.head_dim}, "
            f"qkv_bias={getattr(run, 'qkv_bias', False)}): it would measure another model than "
            f"it predicts, so nothing was run. Measure without these settings, or report "
            f"the shape as a bug of engine/budget/lab/torch_step.py.")
    return sum(b.numel() * b.element_size() for b in model.buffers())


def available_memory(device: str) -> tuple[int | None, str]:
    """(bytes a step may still allocate on `device`, where that number comes from);
    None when the system does not say."""
    if device == "cuda":
        import torch
        free, _ = torch.cuda.mem_get_info()
        return free, "the GPU's free memory (torch.cuda.mem_get_info)"
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "the CPU's available memory " \
                                                      "(MemAvailable in /proc/meminfo)"
    except (OSError, ValueError, IndexError):
        pass
    try:
        pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return pages, "the CPU's free memory (sysconf)"
    except (AttributeError, ValueError, OSError):
        return None, "unknown"


def step_bytes(run: BudgetConfig, device: str) -> dict:
    """The budget's prediction of the step `measure_step` runs, by part."""
    from ..counts import fixed_bytes
    from ..framework_step import real_step_activations
    return {**fixed_bytes(run), "activations": real_step_activations(run, device=device).peak}


def _fits(run: BudgetConfig, device: str, buffers: int) -> None:
    """BudgetError, naming the settings and the fix, when the step's predicted bytes
    (with MEMORY_HEADROOM) exceed what `device` has available."""
    from ..report import human_bytes
    parts = step_bytes(run, device)
    need = int((sum(parts.values()) + buffers) * (1 + MEMORY_HEADROOM))
    have, where = available_memory(device)
    if have is None or need <= have:
        return
    fixed = sum(v for k, v in parts.items() if k != "activations")
    if fixed + buffers >= parts["activations"]:
        what = (f"{human_bytes(fixed + buffers)} of weights, their gradients and the "
                f"optimizer's state: lower vocab_size={run.vocab_size:,}, "
                f"d_model={run.d_model:,}, n_layer={run.n_layer} or block_size={run.positions:,}")
    else:
        what = (f"{human_bytes(parts['activations'])} of activations: lower "
                f"micro_batch={run.micro_batch} or seq_len={run.seq_len}, or set recompute=full")
    scaled = ", already scaled down for the CPU" if device == "cpu" else ""
    raise BudgetError(
        f"--measure torch would run a step predicted to need {human_bytes(need)} on "
        f"{device} (a margin of {MEMORY_HEADROOM:.0%} included{scaled}), but {where} is "
        f"{human_bytes(have)}. Nothing was allocated. Most of it is {what}; or measure on "
        f"a device with more memory.")


def _optimizer(model, cfg: BudgetConfig):
    """`cfg.optimizer` as torch runs it under `cfg`'s implementation (torch's
    foreach/fused switches): AdamW, or SGD with or without momentum. A Hugging
    Face model's parameters go in the Trainer's two groups (`Trainer.
    create_optimizer`: weight decay for all but biases and norms, its default
    weight_decay 0.0), a plain model's in one, as `AdamW(model.parameters())`."""
    import torch
    impl = cfg.resolved_optimizer_impl or "for-loop"
    params = list(model.parameters())
    if cfg.activation_model == "hf":
        from transformers.trainer_pt_utils import get_parameter_names
        decay = set(get_parameter_names(model, [torch.nn.LayerNorm], [
            r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]))
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        params = [{"params": [p for n, p in named if n in decay], "weight_decay": 0.0},
                  {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
    if cfg.optimizer == "adafactor":  # as the Trainer builds it for optim="adafactor"
        from transformers.optimization import Adafactor
        return Adafactor(params, lr=1e-4, **ADAFACTOR_TRAINER_ARGS)
    if cfg.optimizer == "adamw-8bit":  # the Trainer's optim="adamw_bnb_8bit"
        import bitsandbytes as bnb
        return bnb.optim.AdamW8bit(params, lr=1e-4)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, **TORCH_SWITCHES[impl])
    momentum = MOMENTUM if cfg.optimizer == "momentum" else 0.0
    return torch.optim.SGD(params, lr=1e-4, momentum=momentum, **TORCH_SWITCHES[impl])


# -------------------------------------------------------------- measuring
@dataclass(frozen=True)
class Measured:
    """Bytes a real step held, read from the allocator."""
    config: BudgetConfig    # the step that ran (scaled down on a CPU)
    device: str
    weights: int
    activations: int
    peak: int
    peak_first_step: int


def measure_step(cfg: BudgetConfig, device: str | None = None, seed: int = 0) -> Measured:
    """Run two steps of `cfg`'s model and measure them (see the module's doc)."""
    missing = torch_missing(cfg)
    if missing:
        raise BudgetError(missing)
    import torch
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    # one process measures one device: no data-parallel replicas, nothing sharded
    run = cfg.with_(devices=1, zero=0) if device == "cuda" else cpu_shape(cfg)
    buffers = _same_shape_as_predicted(run)        # both before anything is allocated
    _fits(run, device, buffers)
    torch.manual_seed(seed)
    with torch.device(device):
        model = _build(run)
    model.to(device).train()
    ids = torch.randint(0, run.vocab_size, (run.micro_batch, run.seq_len), device=device)
    batch = _hf_batch(run, ids) if run.activation_model == "hf" else None
    opt = _optimizer(model, run)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(run.precision)

    keep = outputs_kept(run)  # the loop holds the model's output through backward
    keep_after = output_outlives_backward(run)  # ... and after it, until the next forward

    def forward():
        """(the loss, what the caller holds: the whole output when the loop keeps it)."""
        with torch.autocast(device, dtype=dtype or torch.float32, enabled=run.autocast):
            if run.activation_model == "hf":
                output = model(**batch)
                return output.loss, (output if keep else None)
            logits, loss = model(ids, ids)
            return loss, (logits if keep else None)

    held = [None]  # the loop's `outputs` variable, alive across micro-batches and steps

    def step(mark):
        """One optimizer step over `accumulation` micro-batches; the marks frame
        the first micro-batch's forward (no gradient exists yet)."""
        for k in range(run.accumulation):
            if k == 0:
                mark("before")
            loss, output = forward()
            if k == 0:
                mark("after forward")
            # `outputs = model(**batch)` rebinds only once the new forward has
            # returned: the previous output lived through it
            held[0] = output
            del output
            (loss / run.accumulation).backward()
            del loss
            if not keep_after:  # `del logits` after backward()
                held[0] = None
        opt.step()
        opt.zero_grad(set_to_none=True)

    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    weights += sum(p.quant_state.absmax.nbytes for p in model.parameters()  # QLoRA's scales
                   if getattr(p, "quant_state", None) is not None)
    read = _cuda_steps if device == "cuda" else _cpu_steps
    gc.collect()  # a previous step's cycles, freed inside this one, would read as negative
    activations, peak, first = read(step, torch)
    return Measured(run, device, weights, activations, weights + peak, weights + first)


def _cuda_steps(step, torch):
    """(activations, peak above the weights in step 2, the same in step 1)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    marks, peaks = {}, []
    for n in (1, 2):
        torch.cuda.reset_peak_memory_stats()
        step(lambda what, n=n: marks.__setitem__((n, what), torch.cuda.memory_allocated()))
        peaks.append(torch.cuda.max_memory_allocated() - base)
    return (marks[2, "after forward"] - marks[2, "before"], peaks[1], peaks[0])


def _cpu_steps(step, torch):
    """The same from the profiler's memory events: their running total starts
    at zero when profiling starts, after the weights exist."""
    from torch.profiler import ProfilerActivity, profile, record_function

    def mark(n, what):  # an empty range whose start time says when
        with record_function(f"mark {n} {what}"):
            pass

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for n in (1, 2):
            with record_function(f"step {n}"):
                step(lambda what, n=n: mark(n, what))
    trace = _trace_events(prof)
    events = sorted((e for e in trace if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    # The running total is the allocator's since the process started: count from
    # what it was just before the first event of this run.
    start = events[0]["args"]["Total Allocated"] - events[0]["args"]["Bytes"] if events else 0
    memory = [(e["ts"], e["args"]["Total Allocated"] - start) for e in events]
    spans = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in trace
             if e.get("ph") == "X" and e.get("name", "").startswith(("step ", "mark "))}

    def total_at(t):  # the running total just before time t
        before = [m for ts, m in memory if ts <= t]
        return before[-1] if before else 0

    def peak_in(span):
        return max([total_at(span[0])] + [m for ts, m in memory if span[0] <= ts <= span[1]])

    activations = (total_at(spans["mark 2 after forward"][0])
                   - total_at(spans["mark 2 before"][0]))
    return activations, peak_in(spans["step 2"]), peak_in(spans["step 1"])


def _trace_events(prof) -> list:
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            return json.load(f)["traceEvents"]
    finally:
        os.remove(path)
