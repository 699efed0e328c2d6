"""Gemma, Gemma 2 and Gemma 3 (text) as transformers writes them: a LLaMA-shaped
block (rotary positions, grouped-query attention, three MLP matrices, RMSNorm)
whose `model_type` ("gemma", "gemma2", "gemma3_text") brings these traits, each
read from transformers' modeling code and confirmed against its step on the CPU
(`tests/test_budget_gemma.py`):

- GeGLU: `gelu_pytorch_tanh(gate) * up`. F.gelu keeps its input as SiLU does, and
  neither autocast list casts it: the MLP keeps what LLaMA's keeps.
- RMSNorm of (1 + gain): `(x.float() * rsqrt(...)) * (1 + w.float())`, then
  `.type_as(x)`. The gain's product keeps x / rms in fp32 (LLaMA's keeps it cast
  back to the input's dtype), and a 16-bit input is first copied to fp32.
  Over bf16 weights (`weights_dtype`) the input is a bf16 tensor and x / rms
  still fp32, where LLaMA's norm keeps a bf16 copy.
- Embeddings scaled by sqrt(width): a product by a constant buffer, which keeps
  nothing. The head is tied to the token table (every released Gemma).
- Gemma 2 and 3: norms around attention and the MLP (`post_attention_layernorm`
  after the output projection, `pre_`/`post_feedforward_layernorm` around the MLP).
  A norm after a matmul reads its 16-bit output under autocast, so it keeps an fp32
  copy of it, 1/rms and x / rms (fp32).
- Gemma 2's soft-capped scores (`attn_logit_softcapping`): `tanh(scores / cap) * cap`
  keeps tanh's output, B x a x T x T, before the softmax; transformers runs Gemma 2
  in eager attention only (`_supports_sdpa = False`: SDPA cannot cap). Its
  `final_logit_softcapping` does the same to the logits: one more B x T x V tensor
  kept until the loss's backward.
- Gemma 3's q and k norms: a Gemma RMSNorm over each head (x / rms in fp32), and two
  rotary tables (local and global layers), cos and sin each (one below six layers,
  where every layer is local; the CPU's four-layer steps show only that case).
- Checkpointing keeps the attention mask each checkpointed layer is handed: with
  windowed and global layers, one of each (Gemma 2 from two layers on).
- `query_pre_attn_scalar` changes the scores' scale only, and head_dim is 256 by
  default: nothing more is kept.
- Sliding windows: Gemma 2 and 3 alternate windowed and full layers. Eager attention
  is handed a float mask in every layer anyway, so the window keeps nothing more
  there; under SDPA (Gemma and Gemma 3) the windowed layers are handed a mask once
  the sequence reaches the window, which is not modelled (`compat.RULES` refuses it).
"""
from __future__ import annotations

GEMMA_TYPES = ("gemma", "gemma2", "gemma3_text")


def is_gemma(cfg) -> bool:
    return getattr(cfg, "model_type", "") in GEMMA_TYPES


def norms_around(cfg) -> bool:
    """Gemma 2 and 3: a norm after attention and one after the MLP too."""
    return getattr(cfg, "model_type", "") in ("gemma2", "gemma3_text")


def soft_capped(cfg) -> bool:
    """Gemma 2: tanh soft-capping of the attention scores and of the logits (its
    config class's attn_logit_softcapping 50 and final_logit_softcapping 30)."""
    return getattr(cfg, "model_type", "") == "gemma2"


# every how many layers one is global (full attention): Gemma 2 alternates, Gemma 3's
# config class (sliding_window_pattern) and every released Gemma 3 make every sixth one
GLOBAL_EVERY = {"gemma2": 2, "gemma3_text": 6}


def layer_kinds(cfg) -> int:
    """Kinds of layer present, windowed and global: each has its own attention mask
    (`causal_mask_mapping`), and in Gemma 3 its own rotary table."""
    every = GLOBAL_EVERY.get(getattr(cfg, "model_type", ""))
    return 2 if every and cfg.n_layer >= every else 1


def rotary_tables(cfg) -> int:
    """cos/sin pairs the model makes: Gemma 3 one per kind of layer present
    (`for layer_type in set(config.layer_types)`), the others one."""
    return layer_kinds(cfg) if getattr(cfg, "model_type", "") == "gemma3_text" else 1


def extra_norm_gains(cfg) -> int:
    """Elements of one block's norm gains beyond LLaMA's two."""
    return 2 * cfg.d_model if norms_around(cfg) else 0
