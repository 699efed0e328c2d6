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


def target_names(cfg) -> tuple[str, ...]:
    """The names of `cfg.lora_targets` (a comma list, or every block linear layer's
    for `all-linear`), or peft's family default."""
    if cfg.lora_targets.strip() == ALL_LINEAR:
        return tuple(l.name for l in BLOCK_LINEARS[cfg.architecture])
    given = tuple(t.strip() for t in cfg.lora_targets.split(",") if t.strip())
    return given or DEFAULT_TARGETS[cfg.architecture]


def matches(module: str, target: str) -> bool:
    """peft's rule for a list of names: the name itself, or a `.`-separated suffix."""
    return module == target or module.endswith("." + target)


def targeted(cfg) -> tuple[Linear, ...]:
    """The block's linear layers that get adapters, in the block's order; a
    ValueError naming a target that matches no layer (peft refuses it too)."""
    linears = BLOCK_LINEARS[cfg.architecture]
    for target in target_names(cfg):
        if not any(matches(l.name, target) for l in linears):
            names = ", ".join(l.name for l in linears)
            raise ValueError(
                f"lora_targets={cfg.lora_targets!r}: {target!r} matches no linear layer of "
                f"a {cfg.architecture} block ({names}; a name matches itself or a "
                f"'.'-separated suffix, as in peft).")
    return tuple(l for l in linears if any(matches(l.name, t) for t in target_names(cfg)))
