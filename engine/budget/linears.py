"""The linear layers of a block, as peft names them, and which a LoRA target list picks.

A settings-level fact (the names a practitioner writes in `target_modules`), read by the
validation and by the recipes that adapt those layers (`lora`).

Targets resolve as peft resolves a list of names: a module matches a name when
its own name is that name or ends with `.` and that name, so GPT-2's `c_proj`
is the attention's projection and the MLP's. No targets given: peft's own
default for the family (`TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`):
`c_attn` for GPT-2, `q_proj,v_proj` for the LLaMA-shaped families. `all-linear` is
peft's shorthand for every linear layer (`nn.Linear`, GPT-2's `Conv1D`) but the output
head: every linear layer of the blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

# peft's default target_modules when none are given, by the budget's architecture
DEFAULT_TARGETS = {"gpt2": ("c_attn",), "llama": ("q_proj", "v_proj")}
ALL_LINEAR = "all-linear"  # peft's name for every linear layer but the output head


@dataclass(frozen=True)
class Linear:
    """One linear layer of a block, as peft names it inside the block, with the
    op of `real_step` whose saved entry is its input ("" when no entry is: an
    input some other op keeps anyway, SDPA's output under SDPA)."""
    name: str
    fan_in: str     # BudgetConfig property or field giving its input width
    fan_out: str
    reads: str


BLOCK_LINEARS = {
    "gpt2": (Linear("attn.c_attn", "d_model", "qkv_width", "qkv matmul"),
             Linear("attn.c_proj", "d_model", "d_model", "projection matmul"),
             Linear("mlp.c_fc", "d_model", "ffn", "fc matmul"),
             Linear("mlp.c_proj", "ffn", "d_model", "fc-proj matmul")),
    "llama": (Linear("self_attn.q_proj", "d_model", "q_width", "q/k/v matmuls"),
              Linear("self_attn.k_proj", "d_model", "kv_width", "q/k/v matmuls"),
              Linear("self_attn.v_proj", "d_model", "kv_width", "q/k/v matmuls"),
              Linear("self_attn.o_proj", "q_width", "d_model", "projection matmul"),
              Linear("mlp.gate_proj", "d_model", "ffn", "gate/up matmuls"),
              Linear("mlp.up_proj", "d_model", "ffn", "gate/up matmuls"),
              Linear("mlp.down_proj", "ffn", "d_model", "down matmul")),
}


# The block's output projections, named by the op whose row holds their input: each
# reads a matmul's output (attention's, the MLP's product; 16 bits under autocast) and
# writes the residual stream.
OUTPUT_PROJECTIONS = ("projection matmul", "fc-proj matmul", "down matmul")


# The modules outside the blocks that peft's `modules_to_save` can train, by the names
# a practitioner writes: the token embedding, then the output head.
OUTSIDE_MODULES = {"gpt2": ("wte", "lm_head"), "llama": ("embed_tokens", "lm_head")}


def trained_modules(cfg) -> tuple[str, ...]:
    """The names in `cfg.modules_to_save` (a comma list)."""
    return tuple(m.strip() for m in cfg.modules_to_save.split(",") if m.strip())


def width(cfg, what: str) -> int:
    if what == "qkv_width":
        return 3 * cfg.d_model
    if what == "kv_width":
        return cfg.kv_heads * cfg.head_dim
    return getattr(cfg, what)


def target_names_given(cfg) -> tuple[str, ...]:
    """The names `cfg.lora_targets` lists (a comma list; empty items skipped)."""
    return tuple(t.strip() for t in cfg.lora_targets.split(",") if t.strip())


def target_names(cfg) -> tuple[str, ...]:
    """The names of `cfg.lora_targets` (a comma list, or every block linear layer's
    for `all-linear`), or peft's family default."""
    if cfg.lora_targets.strip() == ALL_LINEAR:
        return tuple(l.name for l in BLOCK_LINEARS[cfg.architecture])
    return target_names_given(cfg) or DEFAULT_TARGETS[cfg.architecture]


def matches(module: str, target: str) -> bool:
    """peft's rule for a list of names: the name itself, or a `.`-separated suffix."""
    return module == target or module.endswith("." + target)


SHOWN_TARGETS = 3  # unknown targets named in a refusal; the rest are counted


def targeted(cfg) -> tuple[Linear, ...]:
    """The block's linear layers that get adapters, in the block's order; a
    ValueError naming the targets that match no layer (peft refuses them too),
    or a list of commas alone (which would silently mean peft's default)."""
    linears = BLOCK_LINEARS[cfg.architecture]
    names = ", ".join(l.name for l in linears)
    if cfg.lora_targets.strip() and not target_names_given(cfg):
        raise ValueError(
            f"lora_targets={cfg.lora_targets[:40]!r} names no layer (only commas and "
            f"spaces); name the layers ({names}), or leave lora_targets empty for peft's "
            f"default ({','.join(DEFAULT_TARGETS[cfg.architecture])}).")
    unknown = [t for t in target_names(cfg) if not any(matches(l.name, t) for l in linears)]
    if unknown:
        shown = ", ".join(repr(t[:40]) for t in unknown[:SHOWN_TARGETS])
        more = (f" and {len(unknown) - SHOWN_TARGETS:,} more" if len(unknown) > SHOWN_TARGETS
                else "")
        verb = "matches" if len(unknown) == 1 else "match"
        raise ValueError(
            f"lora_targets {shown}{more} {verb} no linear layer of a {cfg.architecture} "
            f"block ({names}; a name matches itself or a '.'-separated suffix, as in peft).")
    return tuple(l for l in linears if any(matches(l.name, t) for t in target_names(cfg)))
