"""What a real framework's training step holds: PyTorch (a plain GPT as nanoGPT
writes it) and Hugging Face transformers (GPT-2 and LLaMA), op by op.

The textbook formula counts the tensors a block *needs* for its backward. A
real step holds what its code *keeps*, and that differs in four ways this
module writes down, each confirmed against PyTorch's saved-tensor hooks and
allocator (`engine.budget.torch_step` measures the same step):

1. Every op saves what its own VJP reads, so code written as many small ops
   keeps many tensors: transformers' GPT-2 GELU (`0.5*x*(1+tanh(...))`) keeps
   five B x T x 4C tensors where `F.gelu(approximate="tanh")` keeps two.
2. Under `torch.autocast` (bf16/fp16) the weights stay fp32; each matmul
   saves a 16-bit copy of its input and of its weight, while ops on the fp32
   list (layer_norm, softmax, log_softmax, pow, ...) and type promotion keep
   fp32 tensors. The autocast cache holds a 16-bit copy of every weight until
   the forward ends, even when checkpointing saves none of them.
3. The loss works over the vocabulary: log_softmax keeps its fp32 output
   [B*T, V], and its backward allocates the gradient of that output and of
   the logits while everything else is still alive. For GPT-2 small at
   B=8, T=1024 each of those is 1.65 GB: the largest tensors of the step.
4. The peak is a moment, not a sum. It is the largest of: the loss at the
   end of the forward (logits, their fp32 copy, the autocast cache), the
   loss's backward (two more [B*T, V] tensors), the backward of the first
   block when blocks are recomputed (the gradients and one rebuilt block), and
   the optimizer step (AdamW's temporaries). AdamW's state exists from the
   first `step()`, so the first step peaks lower than the steady state.

Symbols: n = B*T tokens, h = width, f = MLP width, k = width of K and V
(kv heads x head size), a = heads, s = T, V = vocabulary; `lo` = bytes of the
autocast dtype (4 under fp32). Dropout masks are one byte on CUDA (the fused
dropout kernel keeps a bool mask) and a float of the input's dtype on the CPU.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .kept import Activations, Saved
from .config import REAL_STEP_MODELS, BudgetConfig
from .counts import fixed_bytes
from .sharding import per_device_fixed

FP32 = 4
INDEX = 8         # int64 token ids and labels
ADAMW_TEMPORARIES = 2  # single-tensor AdamW: sqrt(v) and its quotient, one parameter's size


# ------------------------------------------------------------------ dtypes
def compute_bytes(cfg: BudgetConfig) -> int:
    """Bytes of the dtype matmuls produce: fp32, or autocast's 16-bit type."""
    return FP32 if cfg.precision == "fp32" else 2


def mask_bytes(cfg: BudgetConfig, device: str) -> int:
    """A dropout mask element: bool on CUDA, the input's float dtype on the CPU."""
    return 1 if device == "cuda" else compute_bytes(cfg)


def use_cache_on(cfg: BudgetConfig) -> bool:
    """The use_cache transformers runs with: the flag, else the config.json's,
    else transformers' own default (on, in every family read here)."""
    setting = getattr(cfg, "resolved_use_cache", None)
    if setting is None:
        setting = getattr(cfg, "use_cache", "default")
    return setting in (True, "on", "default")


def keeps_kv_cache(cfg: BudgetConfig) -> bool:
    """Whether the forward builds a DynamicCache: with use_cache on, except
    under gradient checkpointing in training (`merge_with_config_defaults`
    turns use_cache off there). Each layer's `DynamicLayer.update` is
    `torch.cat([empty, K])`: a copy of K and of V that attention then reads."""
    return cfg.activation_model == "hf" and use_cache_on(cfg) and cfg.recompute != "full"


def sliding_window_masks(cfg: BudgetConfig) -> bool:
    """A sliding window changes the step only from `seq_len >= sliding_window`:
    below it the window hides nothing and SDPA keeps using is_causal
    (`masking_utils._ignore_causal_mask_sdpa`)."""
    window = getattr(cfg, "sliding_window", 0)
    return bool(window) and cfg.seq_len >= window


def sdpa_gets_mask(cfg: BudgetConfig) -> bool:
    """SDPA is handed a 4-D bool mask (B x 1 x T x T) instead of is_causal: a
    batch with padding, or a sliding window that hides keys. Eager attention
    gets its float mask always, so neither changes what eager keeps."""
    return cfg.attention == "flash" and cfg.activation_model == "hf" and (
        getattr(cfg, "padded_batch", False) or sliding_window_masks(cfg))


def repeats_kv(cfg: BudgetConfig) -> bool:
    """transformers' `repeat_kv` copies K and V to every query head under
    grouped-query attention: always in eager attention, and in SDPA when a
    mask is given (`use_gqa_in_sdpa` asks for no mask before enable_gqa)."""
    grouped = cfg.kv_heads != cfg.n_head
    return grouped and (cfg.attention == "standard" or sdpa_gets_mask(cfg))


def kv_cache_bytes(cfg: BudgetConfig) -> int:
    """Every layer's K and V copies in the cache, alive while the caller holds
    the model's output (its `cache`). LLaMA's K is rotated by fp32 cos/sin,
    so under autocast its copy is fp32."""
    if not keeps_kv_cache(cfg):
        return 0
    n, k, lo = cfg.micro_batch * cfg.seq_len, cfg.kv_heads * cfg.head_dim, compute_bytes(cfg)
    key = FP32 if cfg.architecture == "llama" else lo
    return cfg.n_layer * n * k * (key + lo)


def kv_cache_unsaved_bytes(cfg: BudgetConfig) -> int:
    """The part of `kv_cache_bytes` the backward does not keep: the copies
    attention read through `repeat_kv`, or (K) through autocast's 16-bit cast."""
    if not keeps_kv_cache(cfg):
        return 0
    n, k, lo = cfg.micro_batch * cfg.seq_len, cfg.kv_heads * cfg.head_dim, compute_bytes(cfg)
    key = FP32 if cfg.architecture == "llama" else lo
    unsaved = 0 if not repeats_kv(cfg) and key == lo else n * k * key
    unsaved += n * k * lo if repeats_kv(cfg) else 0
    return cfg.n_layer * unsaved


# ------------------------------------------------------------------ blocks
def _attention_core(cfg: BudgetConfig, device: str) -> list[Saved]:
    """The T x T part of standard (eager) attention, after Q @ K^T: the
    softmax's fp32 output (the additive mask or autocast's fp32 list makes it
    fp32), a 16-bit copy of it for P @ V under autocast, dropout's mask and
    output when dropout is on."""
    n_scores = cfg.n_head * cfg.seq_len * cfg.seq_len * cfg.micro_batch
    lo = compute_bytes(cfg)
    items = [Saved("softmax", "probabilities P (fp32)", n_scores, FP32)]
    if cfg.dropout:  # P @ V keeps dropout's output (cast to 16 bits under autocast)
        items += [Saved("attention dropout", "mask", n_scores, mask_bytes(cfg, device)),
                  Saved("P @ V", "P after dropout", n_scores, lo)]
    elif cfg.autocast:
        items.append(Saved("P @ V", "P, 16-bit copy", n_scores, lo))
    return items


def _attention(cfg: BudgetConfig, device: str, k: int, qkv_fused: bool) -> list[Saved]:
    """Q, K, V and what attention keeps of them. `k` is the width of K and V;
    `qkv_fused`: one matmul makes Q, K and V (GPT-2's c_attn)."""
    n, q, lo = cfg.micro_batch * cfg.seq_len, cfg.q_width, compute_bytes(cfg)
    rows = cfg.micro_batch * cfg.n_head * cfg.seq_len  # one number per query row
    cache = keeps_kv_cache(cfg)
    if cfg.attention == "flash":
        items = []
        if qkv_fused:
            # Q is a view of the fused matmul's output, so all of it stays alive;
            # K and V too unless the cache's concatenation copied them.
            items.append(Saved("scaled_dot_product_attention", "Q (a view of Q|K|V)",
                               n * (q + 2 * k), lo))
            if cache:
                items.append(Saved("kv cache", "K and V (concatenated copies)", 2 * n * k, lo))
        else:  # LLaMA: Q and K are rotated (fp32 under autocast), then cast back
            items += [Saved("scaled_dot_product_attention", "Q rotated, compute copy", n * q, lo),
                      Saved("scaled_dot_product_attention", "K rotated, compute copy", n * k, lo),
                      Saved("scaled_dot_product_attention",
                            "V (cache copy)" if cache else "V", n * k, lo)]
            if repeats_kv(cfg):  # the repeated copies replace K and V
                items[-2:] = [Saved("scaled_dot_product_attention",
                                    f"{what}, repeated to every head", n * q, lo)
                              for what in ("K rotated", "V")]
        if sdpa_gets_mask(cfg):  # each layer's SDPA converts the bool mask to a float copy
            items.append(Saved("scaled_dot_product_attention",
                               "attention mask, float copy (B x T x T)",
                               cfg.micro_batch * cfg.seq_len * cfg.seq_len, lo))
        items += [Saved("scaled_dot_product_attention", "output (also the projection's input)",
                        n * q, lo),
                  Saved("scaled_dot_product_attention", "logsumexp, one per row", rows, FP32)]
        return items
    # standard: Q @ K^T and P @ V reshape their 4-D operands into copies (K and
    # V repeated to every head first under grouped-query attention)
    items = [Saved("Q @ K^T", "Q (copy)", n * q, lo),
             Saved("Q @ K^T", "K^T (copy)", n * q, lo)]
    items += _attention_core(cfg, device)
    items += [Saved("P @ V", "V (copy)", n * q, lo),
              Saved("projection matmul", "merged heads (copy)", n * q, lo)]
    return items


def gpt2_block(cfg: BudgetConfig, device: str = "cuda") -> list[Saved]:
    """One GPT-2 block of transformers (`GPT2Block`) or of a plain PyTorch GPT."""
    n, h, f = cfg.micro_batch * cfg.seq_len, cfg.d_model, cfg.ffn
    lo, mask = compute_bytes(cfg), mask_bytes(cfg, device)

    def stats(which: str) -> Saved:
        return Saved(f"layer norm {which}", "mean and 1/std, two per token", 2 * n, FP32)
    items = [Saved("layer norm 1", "input (the residual stream, fp32)", n * h, FP32), stats("1"),
             Saved("qkv matmul", "input (layer norm 1's output)", n * h, lo)]
    items += _attention(cfg, device, h, qkv_fused=True)
    if cfg.dropout:
        items.append(Saved("residual dropout (attention)", "mask", n * h, mask))
    items += [Saved("layer norm 2", "input (the residual stream, fp32)", n * h, FP32), stats("2"),
              Saved("fc matmul", "input (layer norm 2's output)", n * h, lo)]
    if cfg.activation_model == "hf":
        # GELU as transformers' "gelu_new": 0.5*x*(1+tanh(c*(x+0.044715*x**3))).
        # pow is on autocast's fp32 list, so x**3 and everything after it is fp32.
        items += [Saved("GELU: x ** 3", "x (fp32)", n * f, FP32),
                  Saved("GELU: tanh", "output", n * f, FP32),
                  Saved("GELU: product", "1 + tanh(...)", n * f, FP32),
                  Saved("GELU: product", "0.5 * x", n * f, lo),
                  Saved("fc-proj matmul", "input (GELU's output)", n * f, lo)]
    else:  # F.gelu(approximate="tanh"): one op, not on any autocast list
        items += [Saved("GELU", "input (fc's output)", n * f, lo),
                  Saved("fc-proj matmul", "input (GELU's output)", n * f, lo)]
    if cfg.dropout:
        items.append(Saved("residual dropout (mlp)", "mask", n * h, mask))
    return items


def llama_block(cfg: BudgetConfig, device: str = "cuda") -> list[Saved]:
    """One LLaMA block of transformers (`LlamaDecoderLayer`)."""
    n, h, f = cfg.micro_batch * cfg.seq_len, cfg.d_model, cfg.ffn
    k, lo = cfg.kv_heads * cfg.head_dim, compute_bytes(cfg)
    # RMSNorm keeps x, 1/rms and x/rms (fp32); under autocast each of the
    # matmuls that read its output casts its own 16-bit copy (autocast caches
    # casts of weights only), in fp32 they all read one tensor.

    def norm(which: str, readers: int, what: str) -> list[Saved]:
        items = [Saved(f"rms norm {which}", "input (the residual stream, fp32)", n * h, FP32),
                 Saved(f"rms norm {which}", "1/rms, one per token", n, FP32),
                 Saved(f"rms norm {which}", "x / rms (fp32)", n * h, FP32)]
        copies = readers if cfg.autocast else 1
        return items + [Saved(what, "input (the norm's output)" if copies == 1
                              else f"input, one 16-bit copy per matmul", copies * n * h, lo)]
    items = norm("1", 3, "q/k/v matmuls")
    if getattr(cfg, "qk_norm", False):
        items += _qk_norms(cfg)
    items += _attention(cfg, device, k, qkv_fused=False)
    # LLaMA's only dropout is attention_dropout (inside _attention): no
    # residual or embedding dropout exists in LlamaDecoderLayer.
    items += norm("2", 2, "gate/up matmuls")
    items += [Saved("SiLU", "input (gate's output)", n * f, lo),
              Saved("SiLU(gate) * up", "SiLU's output and up's output", 2 * n * f, lo),
              Saved("down matmul", "input (the product)", n * f, lo)]
    return items


def _qk_norms(cfg: BudgetConfig) -> list[Saved]:
    """Qwen3's q_norm and k_norm: an RMSNorm over each head of q and of k
    (before rotary). Each keeps its input in fp32 (pow and the product read
    it; under autocast `.to(float32)` makes that fp32 copy of the 16-bit
    matmul output), 1/rms per head, and x / rms cast back to the input's
    dtype (the gain's product reads it)."""
    n, lo = cfg.micro_batch * cfg.seq_len, compute_bytes(cfg)
    items = []
    for which, heads in (("q", cfg.n_head), ("k", cfg.kv_heads)):
        width = heads * cfg.head_dim
        items += [Saved(f"{which}_norm", "input (fp32)", n * width, FP32),
                  Saved(f"{which}_norm", "1/rms, one per head and token", n * heads, FP32),
                  Saved(f"{which}_norm", "x / rms (the input's dtype)", n * width, lo)]
    return items


def block_weights(cfg: BudgetConfig) -> int:
    """Elements of one block's matmul weights: what autocast copies to 16 bits."""
    h, f = cfg.d_model, cfg.ffn
    if cfg.architecture == "llama":
        k = cfg.kv_heads * cfg.head_dim
        return 2 * h * cfg.q_width + 2 * h * k + 3 * h * f
    return 4 * h * h + 2 * h * f


def block_biases(cfg: BudgetConfig) -> int:
    """Elements of one block's matmul biases (cast and cached, never saved):
    GPT-2's qkv (3h), projection (h), fc (f) and fc-proj (h); LLaMA has
    none, Qwen2 those of q, k and v."""
    h, f = cfg.d_model, cfg.ffn
    if cfg.architecture == "llama":
        qkv = cfg.q_width + 2 * cfg.kv_heads * cfg.head_dim
        return qkv if getattr(cfg, "qkv_bias", False) else 0
    return 3 * h + h + f + h


def block_saved(cfg: BudgetConfig, device: str = "cuda") -> list[Saved]:
    """Everything one block keeps for its backward, the weights' 16-bit
    copies included under autocast."""
    items = llama_block(cfg, device) if cfg.architecture == "llama" else gpt2_block(cfg, device)
    if cfg.autocast:
        items.append(Saved("block matmuls", "weights, 16-bit copies", block_weights(cfg),
                           compute_bytes(cfg)))
    return items


# ------------------------------------------------------------ head and loss
def outside_saved(cfg: BudgetConfig, device: str = "cuda") -> list[Saved]:
    """What the model keeps outside its blocks: the embedding's dropout mask,
    the final norm, the head's input (and weight copy), the loss."""
    n, h, V = cfg.micro_batch * cfg.seq_len, cfg.d_model, cfg.vocab_size
    lo = compute_bytes(cfg)
    items = []
    if cfg.dropout and cfg.architecture != "llama":  # GPT-2's embd_pdrop; LLaMA has none
        items.append(Saved("embedding dropout", "mask", n * h, mask_bytes(cfg, device),
                           until_end=True))
    if cfg.architecture == "llama":
        items += [Saved("final rms norm", "input (fp32)", n * h, FP32),
                  Saved("final rms norm", "1/rms and x / rms", n + n * h, FP32),
                  Saved("rotary embedding", "cos and sin (fp32, all blocks)",
                        2 * cfg.seq_len * cfg.head_dim, FP32, until_end=True)]
    else:
        items += [Saved("final layer norm", "input (fp32)", n * h, FP32),
                  Saved("final layer norm", "mean and 1/std", 2 * n, FP32)]
    items.append(Saved("head matmul", "input (the final norm's output)", n * h, lo))
    if cfg.autocast:
        items.append(Saved("head matmul", "weight, 16-bit copy", V * h, lo))
    if cfg.activation_model == "pytorch":  # the caller holds the returned logits
        items.append(Saved("head matmul", "logits (returned to the caller)", n * V, lo))
    items.append(Saved("cross-entropy", "log_softmax output (fp32)", n * V, FP32))
    if cfg.activation_model == "hf":  # the labels, shifted by one: a new int64 tensor
        items.append(Saved("cross-entropy", "shifted labels (int64)", n, INDEX))
    return items


def logits_bytes(cfg: BudgetConfig) -> int:
    return cfg.micro_batch * cfg.seq_len * cfg.vocab_size * compute_bytes(cfg)


def vocab_fp32_bytes(cfg: BudgetConfig) -> int:
    """One fp32 [B*T, V] tensor: log_softmax's output, its gradient, the logits' gradient."""
    return cfg.micro_batch * cfg.seq_len * cfg.vocab_size * FP32


# --------------------------------------------------------------- the step
@dataclass(frozen=True)
class Moment:
    """One moment of the step and what is alive then, largest terms first."""
    name: str
    alive: tuple  # (what, bytes) pairs

    @property
    def bytes(self) -> int:
        return sum(b for _, b in self.alive)


@dataclass(frozen=True)
class RealStep:
    """The saved tensors of one micro-batch and the step's candidate peaks."""
    items: tuple          # Saved entries alive at the end of the forward
    moments: tuple        # Moment, steady state (AdamW's state exists)
    first_step: tuple     # Moment, the first step

    @property
    def saved(self) -> int:
        return sum(x.bytes for x in self.items)

    @property
    def peak_moment(self) -> Moment:
        return max(self.moments, key=lambda m: m.bytes)

    @property
    def first_step_peak_moment(self) -> Moment:
        return max(self.first_step, key=lambda m: m.bytes)


def _kept(cfg: BudgetConfig, device: str) -> tuple[list[Saved], list[Saved], int]:
    """Saved entries (blocks then outside), and the bytes of one block."""
    L, n, h = cfg.n_layer, cfg.micro_batch * cfg.seq_len, cfg.d_model
    block = block_saved(cfg, device)
    one_block = sum(x.bytes for x in block)
    if cfg.recompute == "full":  # each block keeps only its input
        blocks = [Saved("block", "input (checkpoint, fp32)", n * h, FP32, L)]
    else:
        blocks = [replace(x, count=L) for x in block]
    return blocks, outside_saved(cfg, device), one_block


def real_step(cfg: BudgetConfig, fixed: dict[str, int], largest_parameter: int,
              device: str = "cuda") -> RealStep:
    """The step of `cfg.activation_model` ("pytorch" or "hf") on one device
    holding `fixed` (bytes of weights, gradients, optimizer state), whose
    largest parameter has `largest_parameter` elements."""
    blocks, outside, one_block = _kept(cfg, device)
    items = tuple(blocks + outside)
    saved = sum(x.bytes for x in items)
    weights = fixed["weights"] + fixed["master weights"]
    grads, state = fixed["gradients"], fixed["optimizer state"]
    lo = compute_bytes(cfg)
    vocab = vocab_fp32_bytes(cfg)
    cast_weights = 0
    if cfg.autocast:
        all_casts = cfg.n_layer * (block_weights(cfg) + block_biases(cfg)) * lo
        kept_casts = 0 if cfg.recompute == "full" else cfg.n_layer * block_weights(cfg) * lo
        cast_weights = all_casts - kept_casts  # cached until the forward ends, not saved
    # With accumulation, micro-batches after the first run beside the gradients so far.
    earlier_grads = [("gradients of earlier micro-batches", grads)] if cfg.accumulation > 1 else []

    def moments(state_bytes: int) -> tuple:
        resident = [("weights", weights)] + ([("optimizer state", state_bytes)]
                                             if state_bytes else [])
        base = resident + earlier_grads
        fwd_end = [*base, ("saved by the forward", saved - vocab)]
        if cfg.activation_model == "hf":
            fwd_end.append(("logits", logits_bytes(cfg)))
        if cfg.autocast:
            fwd_end.append(("logits, fp32 copy for the loss", vocab))
            if cast_weights:
                fwd_end.append(("autocast cache: 16-bit weight copies", cast_weights))
        fwd_end.append(("log_softmax output", vocab))
        loss_bwd = [*base, ("saved by the forward", saved),
                    ("gradient of the log_softmax output", vocab),
                    ("gradient of the logits (fp32)", vocab)]
        found = [Moment("the loss at the end of the forward", tuple(fwd_end)),
                 Moment("the loss's backward", tuple(loss_bwd))]
        if cfg.recompute == "full":  # at least: its own backward adds a few more tensors
            n, h = cfg.micro_batch * cfg.seq_len, cfg.d_model
            found.append(Moment("the first block's backward (recomputed)", (
                *resident, ("gradients", grads),
                ("the first block's recomputed tensors", one_block),
                ("its checkpointed input", n * h * FP32))))
        opt = [("weights", weights), ("gradients", grads), ("optimizer state", state)]
        if cfg.optimizer == "adamw":
            opt.append(("AdamW temporaries (sqrt(v) and the update, largest parameter)",
                        ADAMW_TEMPORARIES * largest_parameter * FP32))
        found.append(Moment("the optimizer step", tuple(opt)))
        return tuple(Moment(m.name, tuple(sorted(((w, b) for w, b in m.alive if b),
                                                 key=lambda wb: -wb[1]))) for m in found)

    return RealStep(items=items, moments=moments(state), first_step=moments(0))


def largest_parameter(cfg: BudgetConfig) -> int:
    """Elements of the largest parameter tensor: the token embedding (or an
    untied head of the same size), else one MLP matrix."""
    return max(cfg.vocab_size * cfg.d_model, cfg.d_model * cfg.ffn)


def real_step_activations(cfg: BudgetConfig, device: str = "cuda") -> Activations:
    """The Activations of a real step on one device: `saved` alive at the end
    of the forward, `peak` the steady-state peak above the fixed bytes."""
    assert cfg.activation_model in REAL_STEP_MODELS, cfg.activation_model
    fixed = per_device_fixed(cfg, fixed_bytes(cfg))
    step = real_step(cfg, fixed, largest_parameter(cfg), device)
    return Activations(cfg.activation_model, step.saved,
                       step.peak_moment.bytes - sum(fixed.values()), step.items, step=step)
