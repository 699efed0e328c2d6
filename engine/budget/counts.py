"""Parameters, FLOPs and the fixed memory (weights, gradients, optimizer state) of a step.

FLOPs. A matmul with a (K, M) weight costs 2*K*M FLOPs per token (a multiply-add
is two), so the forward pass costs 2 FLOPs per weight per token, plus the attention
term that has no weights: Q @ K^T and P @ V each cost 2*N*d per token and layer (the
full N x N score matrix, as our engine computes it). The backward pass runs two
matmuls for every forward one (dX = dY W^T and dW = X^T dY), so it costs 2x the
forward. Recompute adds forward work inside the backward: a whole forward with full
recompute, the attention core with selective recompute.

Fixed memory, set by the parameter count P: weights, fp32 master weights (only with
16-bit storage), gradients and the optimizer state (SGD none, momentum one fp32
buffer, AdamW two; Adafactor's factored second moment and 8-bit AdamW's blockwise
states are counted tensor by tensor in `optimizer_step`). Mixed-precision AdamW:
2 + 2 + 4 + 4 + 4 = 16 bytes per parameter. The fine-tuning recipes rewrite these
(`recipes`): under LoRA the frozen weights keep no gradient and no state.
"""
from __future__ import annotations

from .config import BudgetConfig, BudgetError, GRAD_PRECISIONS, MASTER_BYTES, PRECISIONS, STATE_BYTES_PER_PARAMETER, STORAGE_BYTES
from . import recipes
from .gemma import extra_norm_gains
from .lora import trainable_parameters
from .optimizer_step import optimizer_state_bytes
from .weights_dtype import training_bytes


# ----------------------------------------------------------------- parameters
def parameter_breakdown(cfg: BudgetConfig) -> dict[str, int]:
    """Parameter counts by part of the model (the formula, even when
    `n_params` overrides the total)."""
    if cfg.architecture == "llama":
        return _llama_breakdown(cfg)
    L, d, V, f = cfg.n_layer, cfg.d_model, cfg.vocab_size, cfg.ffn
    per_layer = {
        "layer norms": 4 * d,
        "attention qkv": 3 * d * d + 3 * d,
        "attention projection": d * d + d,
        "mlp": d * f + f + f * d + d,
    }
    parts = {
        "token embedding": V * d,
        "position embedding": cfg.positions * d,
        **{k: L * v for k, v in per_layer.items()},
        "final layer norm": 2 * d,
    }
    if not cfg.tied_embedding:
        parts["output head"] = d * V
    return parts


def _llama_breakdown(cfg: BudgetConfig) -> dict[str, int]:
    """LLaMA: no position table (rotary), RMSNorm gains only, no biases, K and
    V projections of n_kv_head * head_dim columns, SwiGLU's three matrices.
    Qwen2 adds biases to q, k and v (`qkv_bias`); LlamaConfig's
    `attention_bias` to q, k, v and the output projection, its `mlp_bias` to
    gate, up and down; Qwen3 an RMSNorm gain over one head's size for q and for
    k (`qk_norm`)."""
    L, d, V, f = cfg.n_layer, cfg.d_model, cfg.vocab_size, cfg.ffn
    kv, q = cfg.kv_heads * cfg.head_dim, cfg.q_width
    per_layer = {
        "rms norms": 2 * d + extra_norm_gains(cfg),
        "attention q and output": 2 * d * q,
        "attention k and v": 2 * d * kv,
        "mlp gate, up and down": 3 * d * f,
    }
    if getattr(cfg, "qkv_bias", False) or getattr(cfg, "attention_bias", False):
        per_layer["attention q, k and v biases"] = q + 2 * kv
    if getattr(cfg, "attention_bias", False):
        per_layer["attention output bias"] = d
    if getattr(cfg, "mlp_bias", False):
        per_layer["mlp gate, up and down biases"] = 2 * f + d
    if getattr(cfg, "qk_norm", False):
        per_layer["q and k rms norms"] = 2 * cfg.head_dim
    parts = {"token embedding": V * d, **{k: L * v for k, v in per_layer.items()},
             "final rms norm": d}
    if not cfg.tied_embedding:
        parts["output head"] = d * V
    return parts


def parameter_count(cfg: BudgetConfig) -> int:
    """P: `n_params` when given, else the sum of `parameter_breakdown`."""
    return cfg.n_params or sum(parameter_breakdown(cfg).values())


def matmul_weights(cfg: BudgetConfig) -> int:
    """The weights that multiply an activation once per token: every block's
    four matrices and the output head (the token table, when tied). Biases,
    norm gains and the embedding lookups do no matmul. With a plain parameter
    count, all of `n_params` is taken to be matmul weights."""
    if cfg.n_params:
        return cfg.n_params
    d = cfg.d_model
    if cfg.architecture == "llama":
        kv = cfg.kv_heads * cfg.head_dim
        return (cfg.n_layer * (2 * d * cfg.q_width + 2 * d * kv + 3 * d * cfg.ffn)
                + d * cfg.vocab_size)
    return cfg.n_layer * (4 * d * d + 2 * d * cfg.ffn) + d * cfg.vocab_size


# ---------------------------------------------------------------------- FLOPs
def attention_flops_per_token(cfg: BudgetConfig) -> int:
    """Forward FLOPs with no weights: Q @ K^T and P @ V, 2*N*d each per layer
    (per head 2*N*(d/a), times a heads), over the full N x N matrix. Grouped
    K/V heads change no product: every query head still scores every key."""
    return cfg.n_layer * 2 * (2 * cfg.seq_len * cfg.d_model)


def adapter_weights(cfg: BudgetConfig) -> int:
    """LoRA's adapter weights (each A and B multiplies an activation once per token);
    0 for a full fine-tune."""
    return trainable_parameters(cfg) if recipes.freezes_base(cfg) else 0


def forward_flops_per_token(cfg: BudgetConfig) -> int:
    """2 FLOPs per matmul weight per token (LoRA's adapters' too), plus the
    attention term."""
    return 2 * (matmul_weights(cfg) + adapter_weights(cfg)) + attention_flops_per_token(cfg)


def backward_flops_per_token(cfg: BudgetConfig) -> int:
    """Twice the forward: each matmul makes its input's gradient and its weight's,
    each as costly as the forward product. A frozen weight (LoRA's base model)
    gets no gradient, so its matmul makes the input's gradient only. (Layers before
    the first adapter need not even that; the count keeps it, a small overcount.)"""
    if not recipes.freezes_base(cfg):
        return 2 * forward_flops_per_token(cfg)
    return (2 * matmul_weights(cfg) + 2 * attention_flops_per_token(cfg)
            + 4 * adapter_weights(cfg))


def recompute_flops_per_token(cfg: BudgetConfig) -> int:
    """Forward work redone inside the backward pass."""
    if cfg.recompute == "full":
        return forward_flops_per_token(cfg)
    if cfg.recompute == "selective":
        return attention_flops_per_token(cfg)
    return 0


def tokens_per_micro_batch(cfg: BudgetConfig) -> int:
    return cfg.micro_batch * cfg.seq_len


def tokens_per_step(cfg: BudgetConfig) -> int:
    """K micro-batches of B sequences of N tokens feed one optimizer step."""
    return cfg.accumulation * tokens_per_micro_batch(cfg)


def flops(cfg: BudgetConfig) -> dict[str, dict[str, int]]:
    """Forward, backward (2x forward, less under LoRA), recompute and total FLOPs,
    per token, per micro-batch and per optimizer step."""
    fwd = forward_flops_per_token(cfg)
    per_token = {"forward": fwd, "backward": backward_flops_per_token(cfg),
                 "recompute": recompute_flops_per_token(cfg)}
    per_token["total"] = sum(per_token.values())
    scale = {"per_token": 1, "per_micro_batch": tokens_per_micro_batch(cfg),
             "per_step": tokens_per_step(cfg)}
    return {where: {k: v * n for k, v in per_token.items()} for where, n in scale.items()}


# ------------------------------------------------------------- fixed memory
def bytes_per_parameter(precision: str, optimizer: str,
                        grad_precision: str = "storage", autocast: bool = False) -> dict[str, int]:
    """Bytes per parameter of each fixed buffer: weights in the storage
    precision, gradients in it too ("storage") or in fp32 ("fp32"), an fp32
    master copy for 16-bit storage, fp32 optimizer state. Mixed-precision
    (bf16/fp16) AdamW: 2 + 2 + 4 + 8 = 16, or 2 + 4 + 4 + 8 = 18 with fp32
    gradients. Under `autocast` the weights and gradients stay fp32 (the
    16-bit copies are made during the step): 4 + 0 + 4 + 8 = 16."""
    if precision not in PRECISIONS:
        raise BudgetError(f"precision={precision!r} is unknown; allowed: {', '.join(PRECISIONS)}.")
    if optimizer not in STATE_BYTES_PER_PARAMETER:
        raise BudgetError(f"optimizer={optimizer!r} is unknown; allowed: "
                          f"{', '.join(STATE_BYTES_PER_PARAMETER)}.")
    if grad_precision not in GRAD_PRECISIONS:
        raise BudgetError(f"grad_precision={grad_precision!r} is unknown; allowed: "
                          f"{', '.join(GRAD_PRECISIONS)}.")
    if autocast:
        precision, grad_precision = "fp32", "storage"
    return {
        "weights": STORAGE_BYTES[precision],
        "master weights": MASTER_BYTES[precision],
        "gradients": STORAGE_BYTES["fp32" if grad_precision == "fp32" else precision],
        "optimizer state": STATE_BYTES_PER_PARAMETER[optimizer],
    }


def trainable_parameter_count(cfg: BudgetConfig) -> int:
    """The parameters the optimizer updates: every parameter, or under a recipe that
    freezes the model the tensors it trains (`recipes`: LoRA's adapters and more)."""
    if not recipes.freezes_base(cfg):
        return parameter_count(cfg)
    from .optimizer_step import trainable_tensors
    return sum(t.numel for t in trainable_tensors(cfg))


def fixed_bytes(cfg: BudgetConfig) -> dict[str, int]:
    """Bytes of weights, master weights, gradients and optimizer state (the
    whole model, before any sharding): every parameter trained, as the fine-tuning
    recipes rewrite it (`recipes`: under LoRA the frozen model's weights, and the
    rest the trained tensors' alone)."""
    per = training_bytes(cfg, bytes_per_parameter(cfg.precision, cfg.optimizer,
                                                  cfg.grad_precision, cfg.real_16bit))
    P = parameter_count(cfg)
    fixed = recipes.fixed(cfg, {k: P * b for k, b in per.items()}, per, P,
                          trainable_parameter_count(cfg))
    state = optimizer_state_bytes(cfg)  # counted tensor by tensor (Adafactor, 8-bit AdamW)
    if state is not None:
        fixed["optimizer state"] = state
    return fixed


def total_parameter_count(cfg: BudgetConfig) -> int:
    """Every parameter the step holds: the model's and, under LoRA, the adapters'."""
    return parameter_count(cfg) + (trainable_parameter_count(cfg) if recipes.freezes_base(cfg) else 0)


def fixed_bytes_per_parameter(cfg: BudgetConfig) -> float:
    """The whole model's fixed bytes (weights, master weights, gradients and optimizer
    state, `fixed_bytes`) over every parameter (`total_parameter_count`): the
    recipe's true bytes per parameter. Mixed-precision AdamW 16, a bf16 model's full
    fine-tune 8; under LoRA each frozen weight costs its dtype's 4 or 2 bytes and each
    adapter weight 16, so a little above 4 or 2; under QLoRA each 4-bit weight half a
    byte and its share of an fp32 absmax per 64, the embeddings and head 4."""
    return sum(fixed_bytes(cfg).values()) / total_parameter_count(cfg)


def fixed_bytes_per_parameter_by_buffer(cfg: BudgetConfig) -> dict[str, float]:
    """`fixed_bytes_per_parameter` buffer by buffer (whole numbers stay ints)."""
    total = total_parameter_count(cfg)
    return {k: v // total if v % total == 0 else v / total
            for k, v in fixed_bytes(cfg).items()}
