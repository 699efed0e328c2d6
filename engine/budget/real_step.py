"""What a real framework's training step holds: PyTorch (a plain GPT as nanoGPT
writes it) and Hugging Face transformers (GPT-2 and LLaMA), op by op.

The textbook formula counts the tensors a block *needs* for its backward. A
real step holds what its code *keeps*, and that differs in four ways this
module writes down, each confirmed against PyTorch's saved-tensor hooks and
allocator (`engine.budget.lab.torch_step` measures the same step):

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

from .backends import backend as backend_of
from .gemma import is_gemma, norms_around, rotary_tables, soft_capped
from .kept import Saved
from .moments import (BACKWARD_END, FIRST_BLOCK_BACKWARD, FORWARD_END, OPTIMIZER_STEP,
                      Alive)
from .config import BudgetConfig
from .weights_dtype import bf16_weights, hidden_bytes

FP32 = 4
INDEX = 8         # int64 token ids and labels

# The ops between an MLP's up-projections and its down-projection, as the block rows
# name them: LLaMA's SiLU and Gemma's GELU with their products with up, transformers'
# GPT-2 GELU written as small ops. They keep what the up-projections output, in the
# dtype those make (`qlora`'s 4-bit layers change it).
GATED_ACTIVATIONS = ("SiLU", "GELU")
GPT2_GELU_OPS = ("GELU: x ** 3", "GELU: tanh", "GELU: product")
MLP_ELEMENTWISE = frozenset({*GATED_ACTIVATIONS, *(f"{a}(gate) * up" for a in GATED_ACTIVATIONS),
                             *GPT2_GELU_OPS})


def backward_temporaries(op: str) -> int:
    """How many tensors the size of `op`'s first row (its input) its backward holds at
    its largest beside its input's gradient. transformers writes RMSNorm as small ops
    (x.pow(2).mean(), rsqrt, x * rsqrt, the gain's product): its backward's chain
    reaches PowBackward holding the gradient through the product x * rsqrt, mean's
    expanded gradient, and pow's own three (x ** 1, 2 * x ** 1, the product with the
    gradient), five in all, one of them x's gradient. (Measured on the CPU allocator's
    events of LLaMA, Qwen3 and Gemma 3 blocks' backwards.)"""
    rms_norm = op.startswith("rms norm") or op in ("q_norm", "k_norm", "post-attention norm",
                                                    "post-feedforward norm")
    return 4 if rms_norm else 0


# ------------------------------------------------------------------ dtypes
def compute_bytes(cfg: BudgetConfig) -> int:
    """Bytes of the dtype matmuls produce: fp32, or autocast's 16-bit type."""
    return FP32 if cfg.precision == "fp32" else 2


def mask_bytes(cfg: BudgetConfig, device: str, input_bytes: int = 0) -> int:
    """A dropout mask element: bool on CUDA, on the CPU a float of the input's
    dtype (`input_bytes`; 0: the compute dtype, what most dropouts read)."""
    return backend_of(device).dropout_mask_bytes(input_bytes or compute_bytes(cfg))


def use_cache_on(cfg: BudgetConfig) -> bool:
    """The use_cache transformers runs with: the flag, else the config.json's,
    else transformers' own default (on, in every family read here): a config read
    from a file carries the file's switch, so "default" means the file was silent."""
    return cfg.use_cache != "off"


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
    the model's output (its `cache`). LLaMA's K is rotated by cos/sin in the hidden
    states' dtype, so under autocast over fp32 weights its copy is fp32."""
    if not keeps_kv_cache(cfg):
        return 0
    n, k, lo = cfg.micro_batch * cfg.seq_len, cfg.kv_heads * cfg.head_dim, compute_bytes(cfg)
    key = hidden_bytes(cfg) if cfg.architecture == "llama" else lo
    return cfg.n_layer * n * k * (key + lo)


def kv_cache_unsaved_bytes(cfg: BudgetConfig) -> int:
    """The part of `kv_cache_bytes` the backward does not keep: the copies
    attention read through `repeat_kv`, or (K) through autocast's 16-bit cast."""
    if not keeps_kv_cache(cfg):
        return 0
    n, k, lo = cfg.micro_batch * cfg.seq_len, cfg.kv_heads * cfg.head_dim, compute_bytes(cfg)
    key = hidden_bytes(cfg) if cfg.architecture == "llama" else lo
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
    # transformers' softmax is fp32 everywhere (GPT-2 adds an fp32 mask, LLaMA
    # asks for fp32); nanoGPT's F.softmax follows autocast's list: fp32 on
    # CUDA, the scores' 16 bits on the CPU
    p = FP32 if cfg.activation_model == "hf" else backend_of(device).output_bytes(
        "softmax", lo, cfg.autocast)
    items = []
    if soft_capped(cfg):  # Gemma 2: tanh(scores / cap) * cap, before the mask and softmax
        items.append(Saved("soft-capping: tanh", "output (the scores' dtype)", n_scores, lo))
    items.append(Saved("softmax", f"probabilities P ({'fp32' if p == FP32 else '16-bit'})",
                       n_scores, p))
    if cfg.dropout:  # P @ V keeps dropout's output (cast to 16 bits under autocast)
        # dropout reads P cast to V's dtype (GPT-2) or Q's (LLaMA: Q rotated by
        # fp32 cos/sin is fp32 under autocast, bf16 over bf16 weights); nanoGPT's P as
        # its softmax made it
        mask_input = p if cfg.activation_model == "pytorch" else (
            hidden_bytes(cfg) if cfg.architecture == "llama" else lo)
        items += [Saved("attention dropout", "mask", n_scores, mask_bytes(cfg, device, mask_input)),
                  Saved("P @ V", "P after dropout", n_scores, lo)]
    elif p != lo:
        items.append(Saved("P @ V", "P, 16-bit copy", n_scores, lo))
    return items


def _sdpa_math(cfg: BudgetConfig, device: str) -> list[Saved]:
    """SDPA's math path (`_scaled_dot_product_attention_math`, what the CPU
    runs with dropout): it upcasts to fp32 and repeats K and V to every head;
    its matmuls keep copies of Q and K^T (each scaled by sqrt(scale)) and of
    V, its softmax the probabilities, dropout its mask and P @ V the
    probabilities after dropout. The output, cast back, is copied for the
    projection. Q|K|V and the cache's K and V are not kept."""
    n, q, lo = cfg.micro_batch * cfg.seq_len, cfg.q_width, compute_bytes(cfg)
    n_scores = cfg.n_head * cfg.seq_len * cfg.seq_len * cfg.micro_batch
    math = backend_of(device).math_bytes
    return [Saved("SDPA math: Q @ K^T", "Q scaled (fp32 copy)", n * q, math),
            Saved("SDPA math: Q @ K^T", "K^T scaled (fp32 copy, every head)", n * q, math),
            Saved("SDPA math: softmax", "probabilities P (fp32)", n_scores, math),
            Saved("SDPA math: dropout", "mask", n_scores, mask_bytes(cfg, device, math)),
            Saved("SDPA math: P @ V", "P after dropout (fp32)", n_scores, math),
            Saved("SDPA math: P @ V", "V (fp32 copy, every head)", n * q, math),
            Saved("projection matmul", "SDPA's output (copy)", n * q, lo)]


def _attention(cfg: BudgetConfig, device: str, k: int, qkv_fused: bool) -> list[Saved]:
    """Q, K, V and what attention keeps of them. `k` is the width of K and V;
    `qkv_fused`: one matmul makes Q, K and V (GPT-2's c_attn)."""
    n, q, lo = cfg.micro_batch * cfg.seq_len, cfg.q_width, compute_bytes(cfg)
    rows = cfg.micro_batch * cfg.n_head * cfg.seq_len  # one number per query row
    cache = keeps_kv_cache(cfg)
    if cfg.attention == "flash" and backend_of(device).sdpa_math(cfg.dropout):
        return _sdpa_math(cfg, device)
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
    # V repeated to every head first under grouped-query attention); with one
    # sequence (B = 1) the reshape of a view of GPT-2's fused output needs no copy,
    # so Q, and K and V unless the cache copied them, keep all of Q|K|V alive
    views = qkv_fused and cfg.micro_batch == 1
    items = [Saved("Q @ K^T", "Q (a view of Q|K|V)", n * (q + 2 * k), lo) if views
             else Saved("Q @ K^T", "Q (copy)", n * q, lo)]
    if not views or cache:
        items.append(Saved("Q @ K^T", "K^T (copy)", n * q, lo))
    items += _attention_core(cfg, device)
    if not views or cache:
        items.append(Saved("P @ V", "V (copy)", n * q, lo))
    items.append(Saved("projection matmul", "merged heads (copy)", n * q, lo))
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
        # pow is on CUDA's autocast fp32 list, so x**3 and everything after it
        # is fp32 there; the CPU's list leaves pow in the input's 16 bits.
        g = backend_of(device).output_bytes("pow", lo, cfg.autocast)
        cube, tanh, product = GPT2_GELU_OPS
        items += [Saved(cube, "x (fp32 copy)" if g != lo else "x (fc's output)", n * f, g),
                  Saved(tanh, "output", n * f, g),
                  Saved(product, "1 + tanh(...)", n * f, g),
                  Saved(product, "0.5 * x", n * f, lo),
                  Saved("fc-proj matmul", "input (GELU's output)", n * f, lo)]
    else:  # F.gelu(approximate="tanh"): one op, not on any autocast list
        items += [Saved("GELU", "input (fc's output)", n * f, lo),
                  Saved("fc-proj matmul", "input (GELU's output)", n * f, lo)]
    if cfg.dropout:
        items.append(Saved("residual dropout (mlp)", "mask", n * h, mask))
    return items


def llama_block(cfg: BudgetConfig, device: str = "cuda") -> list[Saved]:
    """One LLaMA block of transformers (`LlamaDecoderLayer`), or Gemma's
    (`engine.budget.gemma`)."""
    n, h, f = cfg.micro_batch * cfg.seq_len, cfg.d_model, cfg.ffn
    k, lo = cfg.kv_heads * cfg.head_dim, compute_bytes(cfg)
    # RMSNorm keeps x, 1/rms and x/rms (fp32); under autocast each of the
    # matmuls that read its output casts its own 16-bit copy (autocast caches
    # casts of weights only), in fp32 they all read one tensor.

    # over bf16 weights x / rms is cast back to bf16 for the gain, whose product
    # keeps that copy, and the matmuls read the bf16 output as it is
    # (Gemma multiplies by its gain before casting back: x / rms stays fp32)
    fp32_normed = not bf16_weights(cfg) or is_gemma(cfg)
    x_normed = "x / rms (fp32)" if fp32_normed else "x / rms (bf16 copy)"

    def norm(which: str, readers: int, what: str) -> list[Saved]:
        items = [Saved(f"rms norm {which}", "input (the residual stream, fp32)", n * h, FP32),
                 Saved(f"rms norm {which}", "1/rms, one per token", n, FP32),
                 Saved(f"rms norm {which}", x_normed, n * h,
                       FP32 if fp32_normed else hidden_bytes(cfg))]
        copies = readers if cfg.autocast and not bf16_weights(cfg) else 1
        return items + [Saved(what, "input (the norm's output)" if copies == 1
                              else "input, one 16-bit copy per matmul", copies * n * h, lo)]
    items = norm("1", 3, "q/k/v matmuls")
    if getattr(cfg, "qk_norm", False):
        items += _qk_norms(cfg)
    items += _attention(cfg, device, k, qkv_fused=False)
    # LLaMA's only dropout is attention_dropout (inside _attention): no
    # residual or embedding dropout exists in LlamaDecoderLayer.
    if norms_around(cfg):
        items += _norm_after_matmul(cfg, "post-attention norm")
    items += norm("2", 2, "gate/up matmuls")
    silu, gelu = GATED_ACTIVATIONS
    act = gelu if is_gemma(cfg) else silu  # Gemma: gelu_pytorch_tanh
    items += [Saved(act, "input (gate's output)", n * f, lo),
              Saved(f"{act}(gate) * up", f"{act}'s output and up's output", 2 * n * f, lo),
              Saved("down matmul", "input (the product)", n * f, lo)]
    if norms_around(cfg):
        items += _norm_after_matmul(cfg, "post-feedforward norm")
    return items


def _norm_after_matmul(cfg: BudgetConfig, which: str) -> list[Saved]:
    """A Gemma RMSNorm over a matmul's output (Gemma 2 and 3): its fp32 input (the
    output itself in fp32, `x.float()`'s copy of it under autocast), 1/rms and
    x / rms in fp32 (the (1 + gain) product keeps it)."""
    n, h = cfg.micro_batch * cfg.seq_len, cfg.d_model
    return [Saved(which, "input (fp32)", n * h, FP32),
            Saved(which, "1/rms, one per token", n, FP32),
            Saved(which, "x / rms (fp32)", n * h, FP32)]


def _qk_norms(cfg: BudgetConfig) -> list[Saved]:
    """Qwen3's q_norm and k_norm: an RMSNorm over each head of q and of k
    (before rotary). Each keeps its input in fp32 (pow and the product read
    it; under autocast `.to(float32)` makes that fp32 copy of the 16-bit
    matmul output), 1/rms per head, and x / rms cast back to the input's
    dtype (the gain's product reads it; Gemma 3's norm multiplies before casting,
    so it keeps x / rms in fp32)."""
    n, lo = cfg.micro_batch * cfg.seq_len, compute_bytes(cfg)
    normed = FP32 if is_gemma(cfg) else lo
    items = []
    for which, heads in (("q", cfg.n_head), ("k", cfg.kv_heads)):
        width = heads * cfg.head_dim
        items += [Saved(f"{which}_norm", "input (fp32)", n * width, FP32),
                  Saved(f"{which}_norm", "1/rms, one per head and token", n * heads, FP32),
                  Saved(f"{which}_norm", "x / rms (fp32)" if normed == FP32
                        else "x / rms (the input's dtype)", n * width, normed)]
    return items


def block_weights(cfg: BudgetConfig) -> int:
    """Elements of one block's matmul weights: what autocast copies to 16 bits."""
    h, f = cfg.d_model, cfg.ffn
    if cfg.architecture == "llama":
        k = cfg.kv_heads * cfg.head_dim
        return 2 * h * cfg.q_width + 2 * h * k + 3 * h * f
    return 4 * h * h + 2 * h * f


def block_biases(cfg: BudgetConfig) -> int:
    """Elements of one block's matmul biases (cast and cached, never saved:
    `addmm`'s backward reads its two matrices, and the bias's gradient is a sum
    of the output's): GPT-2's qkv (3h), projection (h), fc (f) and fc-proj (h);
    LLaMA has none, Qwen2 those of q, k and v, LlamaConfig's `attention_bias`
    those and the output projection's, its `mlp_bias` gate's, up's and down's."""
    h, f = cfg.d_model, cfg.ffn
    if cfg.architecture == "llama":
        attention = getattr(cfg, "attention_bias", False)
        qkv = cfg.q_width + 2 * cfg.kv_heads * cfg.head_dim
        return ((qkv if attention or getattr(cfg, "qkv_bias", False) else 0)
                + (h if attention else 0)
                + (2 * f + h if getattr(cfg, "mlp_bias", False) else 0))
    return 3 * h + h + f + h


def block_saved(cfg: BudgetConfig, device: str = "cuda") -> list[Saved]:
    """Everything one block keeps for its backward, the weights' 16-bit
    copies included under autocast."""
    items = llama_block(cfg, device) if cfg.architecture == "llama" else gpt2_block(cfg, device)
    if cfg.autocast and not bf16_weights(cfg):
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
        items.append(Saved("embedding dropout", "mask", n * h,  # of the fp32 embeddings' sum
                           mask_bytes(cfg, device, FP32), until_end=True))
    if cfg.architecture == "llama":
        items += [Saved("final rms norm", "input (fp32)", n * h, FP32),
                  *_final_rms(cfg),
                  _rotary(cfg)]
    else:
        items += [Saved("final layer norm", "input (fp32)", n * h, FP32),
                  Saved("final layer norm", "mean and 1/std", 2 * n, FP32)]
    items.append(Saved("head matmul", "input (the final norm's output)", n * h, lo))
    if cfg.autocast and not bf16_weights(cfg):  # a bf16 weight is used as it is
        items.append(Saved("head matmul", "weight, 16-bit copy", V * h, lo))
    if soft_capped(cfg):  # Gemma 2: tanh(logits / cap) * cap
        items.append(Saved("final logit soft-capping", "tanh output", n * V, lo))
    if outputs_kept(cfg):  # the caller holds the returned logits (and the cache)
        items.append(Saved("the caller's output", "logits", n * V, lo))
        if kv_cache_kept_unsaved(cfg, device):
            items.append(Saved("the caller's output", "key/value cache attention did not keep",
                               kv_cache_kept_unsaved(cfg, device), 1))
    items += loss_log_probs(cfg, device)
    if cfg.activation_model == "hf":  # the labels, shifted by one: a new int64 tensor
        items.append(Saved("cross-entropy", "shifted labels (int64)", n, INDEX))
    return items


def log_probs_bytes(cfg: BudgetConfig, device: str = "cuda") -> int:
    """Bytes per element of the log-probabilities the loss's log_softmax makes:
    fp32, but 16 bits for `F.cross_entropy` on 16-bit logits on CUDA (nanoGPT's
    loss; `backends`). transformers upcasts the logits itself (`logits.float()`)."""
    if cfg.activation_model == "hf":
        return FP32
    return backend_of(device).output_bytes("cross_entropy", compute_bytes(cfg), cfg.autocast)


def loss_log_probs(cfg: BudgetConfig, device: str = "cuda") -> list[Saved]:
    """What the loss keeps over the vocabulary: log_softmax's fp32 output, read by
    nll_loss too; or, where log_softmax runs in 16 bits, its 16-bit output and the
    fp32 copy autocast hands nll_loss, each kept by its own op."""
    n, V = cfg.micro_batch * cfg.seq_len, cfg.vocab_size
    lp = log_probs_bytes(cfg, device)
    if lp == FP32:
        return [Saved("cross-entropy", "log_softmax output (fp32)", n * V, FP32)]
    return [Saved("cross-entropy", "log_softmax output (16-bit: cross_entropy passes the "
                  "logits' dtype)", n * V, lp),
            Saved("cross-entropy", "nll_loss's input, autocast's fp32 copy", n * V, FP32)]


def _final_rms(cfg: BudgetConfig) -> list[Saved]:
    """The final RMSNorm's 1/rms and x / rms (fp32, or a bf16 copy over bf16 weights
    but Gemma's)."""
    n, h = cfg.micro_batch * cfg.seq_len, cfg.d_model
    if not bf16_weights(cfg) or is_gemma(cfg):
        return [Saved("final rms norm", "1/rms and x / rms", n + n * h, FP32)]
    return [Saved("final rms norm", "1/rms", n, FP32),
            Saved("final rms norm", "x / rms (bf16 copy)", n * h, hidden_bytes(cfg))]


def _rotary(cfg: BudgetConfig) -> Saved:
    """cos and sin, made once for all blocks in the hidden states' dtype: fp32,
    or bf16 when the model is loaded in bf16 (`engine.budget.weights_dtype`)."""
    size, tables = hidden_bytes(cfg), rotary_tables(cfg)
    return Saved("rotary embedding", f"cos and sin ({'fp32' if size == FP32 else 'bf16'}, "
                 f"all blocks{', local and global' if tables > 1 else ''})",
                 2 * tables * cfg.seq_len * cfg.head_dim, size, until_end=True)


def logits_bytes(cfg: BudgetConfig) -> int:
    return cfg.micro_batch * cfg.seq_len * cfg.vocab_size * compute_bytes(cfg)


def vocab_fp32_bytes(cfg: BudgetConfig) -> int:
    """One fp32 [B*T, V] tensor: log_softmax's output, its gradient, the logits' gradient."""
    return cfg.micro_batch * cfg.seq_len * cfg.vocab_size * FP32


# ------------------------------------------------------- what the loop keeps
def outputs_kept(cfg: BudgetConfig) -> bool:
    """Whether the loop holds the model's output through backward ("default":
    its framework's loop; nanoGPT's keeps the logits, the Trainer only the loss)."""
    return cfg.resolved_outputs in ("kept", "freed-after-backward")


def output_outlives_backward(cfg: BudgetConfig) -> bool:
    """Whether the loop still holds the output after `backward()` returns: until the
    next forward rebinds its variable ("kept"), not when it deletes it ("freed-after-
    backward": `loss.backward(); del logits`)."""
    return cfg.resolved_outputs == "kept"


def kv_cache_kept_unsaved(cfg: BudgetConfig, device: str = "cuda") -> int:
    """Bytes of the output's key/value cache that attention's backward does not
    keep. SDPA's math path keeps fp32 copies instead, except of a V it can
    use as it is (fp32 already, one per head: its bmm reads the cache's V)."""
    if cfg.attention == "flash" and backend_of(device).sdpa_math(cfg.dropout):
        n, k, lo = cfg.micro_batch * cfg.seq_len, cfg.kv_heads * cfg.head_dim, compute_bytes(cfg)
        v_read = lo == backend_of(device).math_bytes and cfg.kv_heads == cfg.n_head
        return kv_cache_bytes(cfg) - (cfg.n_layer * n * k * lo if v_read and keeps_kv_cache(cfg)
                                      else 0)
    return kv_cache_unsaved_bytes(cfg)


def forward_locals(cfg: BudgetConfig, device: str = "cuda") -> list[tuple[str, int]]:
    """(what, bytes) the model's forward holds in its own variables while its last
    block runs, which no op keeps and which go when the forward returns: the cache
    copies attention did not keep (every layer's: a layer's largest transient is in its
    MLP, after its attention filled the cache), the causal mask for eager attention
    (B x T x T in the hidden states' dtype; SDPA's is_causal needs none), GPT-2's token
    and position embeddings' outputs (one position row per token of a sequence), and
    over bf16 weights the hidden states RMSNorm copies to fp32 instead of keeping: the
    embeddings' output (`inputs_embeds`), the last block's input and its stream after
    attention (`residual`)."""
    n, h = cfg.micro_batch * cfg.seq_len, cfg.d_model
    found = [("key/value cache attention did not keep", kv_cache_kept_unsaved(cfg, device))]
    if cfg.activation_model != "hf":
        return [(what, size) for what, size in found if size]
    if cfg.attention == "standard":
        found.append(("eager attention's causal mask",
                      cfg.micro_batch * cfg.seq_len ** 2 * hidden_bytes(cfg)))
    if cfg.architecture == "gpt2":  # summed into the stream, which dropout or ln_1 keeps
        found.append(("the token and position embeddings' outputs",
                      (n + cfg.seq_len) * h * hidden_bytes(cfg)))
    elif bf16_weights(cfg):
        found.append(("bf16 hidden states: the embeddings' output, the last block's "
                      "input and its stream after attention", 3 * n * h * hidden_bytes(cfg)))
    return [(what, size) for what, size in found if size]


def kept_output_terms(cfg: BudgetConfig, device: str = "cuda",
                      first_step: bool = False) -> dict[str, list[Alive]]:
    """What the model's output adds to each moment of the step (moments.Alive
    entries: "the loop's output" where the loop holds it, else "the forward's
    output"), beyond the forward's saved tensors (`outside_saved` already carries
    a kept output's logits and unkept cache through the loss's backward).

    Freed (`loss = model(**batch).loss`): the output lives until the forward
    returns, so its logits and the cache copies attention did not keep are
    alive while the loss runs, and nowhere after. Kept (`outputs =
    model(**batch)`, `logits, loss = model(x, y)`): after the backward the
    output still holds the logits and every layer's K and V in its cache,
    through the optimizer step; and the loop's variable is rebound only when
    the next forward returns, so the previous micro-batch's output is alive
    at the next loss too (from the second micro-batch on). Freed after the
    backward (`loss.backward(); del logits`): held through the backward only."""
    logits, cache = logits_bytes(cfg), kv_cache_bytes(cfg)
    if not outputs_kept(cfg):
        unsaved = kv_cache_kept_unsaved(cfg, device)
        return {FORWARD_END: [Alive("the forward's output", "logits", logits)] + (
            [Alive("the forward's output", "key/value cache, until the forward returns",
                   unsaved)] if unsaved else [])}
    output = [("the caller's output: logits", logits)] + (
        [("the caller's output: key/value cache", cache)] if cache else [])
    held = [Alive("the loop's output", what, b) for what, b in output]
    terms = {FIRST_BLOCK_BACKWARD: held, BACKWARD_END: held}
    if not output_outlives_backward(cfg):
        return terms
    terms[OPTIMIZER_STEP] = held
    if not first_step or cfg.accumulation > 1:
        terms[FORWARD_END] = [
            Alive("the loop's output",
                  what.replace("the caller's output", "the previous output"), b)
            for what, b in output]
    return terms
