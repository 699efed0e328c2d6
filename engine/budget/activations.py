"""The activation models: what one micro-batch's forward keeps for its backward.

Five models, the `activation_model` knob:
  "rule"        the source texts' rule of thumb: k saved tensors of B x N x d
                per layer. k=4 gives the 7B example's 17 GB, k=16 the
                24-layer example's 12.9 GB.
  "transformer" a per-op count for a GPT block (`transformer_layer_ops`, and
                `llama_layer_ops` for LLaMA blocks) that agrees with Korthikanti
                et al. 2022, "Reducing Activation Recomputation in Large
                Transformer Models": per layer s*b*h*(34 + 5*a*s/h) bytes at
                16-bit with dropout, 34*s*b*h with selective recompute, 2*s*b*h
                with full recompute.
  "engine"      exactly what our tape engine saves for its reference GPT
                (`engine.nn.GPT`), tensor by tensor; `engine.memory` measures
                the same number (`engine.budget.lab.measure`).
  "pytorch"     a real PyTorch step (a plain GPT as nanoGPT writes it) and
  "hf"          a Hugging Face transformers step (GPT-2, LLaMA-shaped families):
                what their code keeps, op by op (`real_step`), as the moments of
                the whole step (`framework_step`).
"""
from __future__ import annotations

import math
from dataclasses import replace

from .config import BudgetConfig, BudgetError, LOGITS_BYTES, MASK_BYTES, RECOMPUTE, STORAGE_BYTES
from .. import fused_buffers, gpt_saved
from .kept import Activations, Saved
from .counts import fixed_bytes
from .framework_step import real_step_activations
from .moments import textbook_moments
from .sharding import per_device_fixed


# ---------------------------------------------------------------- activations
def activation_bytes_per_element(cfg: BudgetConfig) -> int:
    return STORAGE_BYTES[cfg.precision]


def tensor_bytes(cfg: BudgetConfig) -> int:
    """One B x N x d activation tensor (the source texts' unit)."""
    return cfg.micro_batch * cfg.seq_len * cfg.d_model * activation_bytes_per_element(cfg)


def transformer_layer_ops(cfg: BudgetConfig) -> list[Saved]:
    """What one pre-LN GPT block saves for its backward, op by op, with s=N,
    b=B, h=d, a heads, e bytes per element, f = MLP width:

        op                 saved tensor                 elements   bytes
        layer norm 1       its input                    sbh        e
        qkv matmul         its input (LN1 output)       sbh        e
        Q @ K^T            Q and K                      2sbh       e
        softmax            its output                   as^2b      e
        attention dropout  mask                         as^2b      1   (dropout)
        P @ V              P (dropout output) and V     as^2b+sbh  e   (P: dropout only;
                                                                    else the softmax output)
        projection matmul  its input                    sbh        e
        residual dropout   mask                         sbh        1   (dropout)
        layer norm 2       its input                    sbh        e
        fc matmul          its input (LN2 output)       sbh        e
        GELU               its input                    sbf        e
        fc-proj matmul     its input (GELU output)      sbf        e
        residual dropout   mask                         sbh        1   (dropout)

    With e=2, f=4h and dropout this is 34*sbh + 5*as^2*b bytes, the per-layer
    total of Korthikanti et al. 2022. Selective recompute drops the three
    as^2b tensors (rebuilt in the backward); full recompute keeps only the
    block input (the next block's saved LN input is that same tensor, so we
    count it once per block: 2*sbh at 16-bit).
    """
    s, b, h, a, f = cfg.seq_len, cfg.micro_batch, cfg.d_model, cfg.n_head, cfg.ffn
    e = activation_bytes_per_element(cfg)
    sbh, scores = s * b * h, a * s * s * b
    ops = [
        Saved("layer norm 1", "input", sbh, e),
        Saved("qkv matmul", "input", sbh, e),
        Saved("Q @ K^T", "Q and K", 2 * sbh, e),
        Saved("softmax", "output", scores, e, 1),
    ]
    if cfg.dropout:
        ops += [Saved("attention dropout", "mask", scores, MASK_BYTES),
                Saved("P @ V", "P (dropout output)", scores, e)]
    ops += [
        Saved("P @ V", "V", sbh, e),
        Saved("projection matmul", "input", sbh, e),
    ]
    if cfg.dropout:
        ops.append(Saved("residual dropout (attention)", "mask", sbh, MASK_BYTES))
    ops += [
        Saved("layer norm 2", "input", sbh, e),
        Saved("fc matmul", "input", sbh, e),
        Saved("GELU", "input", s * b * f, e),
        Saved("fc-proj matmul", "input", s * b * f, e),
    ]
    if cfg.dropout:
        ops.append(Saved("residual dropout (mlp)", "mask", sbh, MASK_BYTES))
    return ops


def llama_layer_ops(cfg: BudgetConfig) -> list[Saved]:
    """What one LLaMA block saves, in the notation of `transformer_layer_ops`
    with k = kv_heads * head_dim, the width of K and V, and q = heads *
    head_dim, the width of Q (h unless the config sets its own head size):

        op                 saved tensor                 elements   bytes
        rms norm 1         its input                    sbh        e
        q/k/v matmuls      their input (norm 1 output)  sbh        e
        Q @ K^T            Q and K (rotated; rotary     sbq+sbk    e
                           embedding itself keeps none)
        softmax            its output                   as^2b      e
        P @ V              V                            sbk        e
        output matmul      its input                    sbq        e
        rms norm 2         its input                    sbh        e
        gate/up matmuls    their input (norm 2 output)  sbh        e
        SiLU               its input (gate output)      sbf        e
        gate * up          SiLU output and up output    2sbf       e
        down matmul        its input (the product)      sbf        e

    plus the attention and residual dropout masks (and P after dropout) when
    `dropout` is on, as in the GPT block. LLaMA trains without dropout.
    """
    s, b, h, a, f = cfg.seq_len, cfg.micro_batch, cfg.d_model, cfg.n_head, cfg.ffn
    k, q = cfg.kv_heads * cfg.head_dim, cfg.q_width
    e = activation_bytes_per_element(cfg)
    sbh, scores = s * b * h, a * s * s * b
    ops = [
        Saved("rms norm 1", "input", sbh, e),
        Saved("q/k/v matmuls", "input", sbh, e),
        Saved("Q @ K^T", "Q and K", s * b * (q + k), e),
        Saved("softmax", "output", scores, e, 1),
    ]
    if cfg.dropout:
        ops += [Saved("attention dropout", "mask", scores, MASK_BYTES),
                Saved("P @ V", "P (dropout output)", scores, e)]
    ops += [Saved("P @ V", "V", s * b * k, e), Saved("output matmul", "input", s * b * q, e)]
    if cfg.dropout:
        ops.append(Saved("residual dropout (attention)", "mask", sbh, MASK_BYTES))
    ops += [
        Saved("rms norm 2", "input", sbh, e),
        Saved("gate/up matmuls", "input", sbh, e),
        Saved("SiLU", "input", s * b * f, e),
        Saved("gate * up", "SiLU output and up output", 2 * s * b * f, e),
        Saved("down matmul", "input", s * b * f, e),
    ]
    if cfg.dropout:
        ops.append(Saved("residual dropout (mlp)", "mask", sbh, MASK_BYTES))
    return ops


def layer_ops(cfg: BudgetConfig) -> list[Saved]:
    """The per-op list of one block of `cfg.architecture`."""
    return llama_layer_ops(cfg) if cfg.architecture == "llama" else transformer_layer_ops(cfg)


ATTENTION_CORE = ("softmax", "attention dropout")  # rebuilt by selective recompute


def _is_attention_core(item: Saved) -> bool:
    return item.op in ATTENTION_CORE or item.tensor.startswith("P (")


def transformer_outside_ops(cfg: BudgetConfig) -> list[Saved]:
    """What the model saves outside its blocks (our own count; the paper's
    per-layer formula covers the blocks only): the embedding dropout mask,
    the final layer norm's input, the head matmul's input and the
    cross-entropy's softmax over the vocabulary, kept in fp32."""
    s, b, h = cfg.seq_len, cfg.micro_batch, cfg.d_model
    e = activation_bytes_per_element(cfg)
    ops = []
    if cfg.dropout:
        ops.append(Saved("embedding dropout", "mask", s * b * h, MASK_BYTES, until_end=True))
    ops += [
        Saved("final layer norm", "input", s * b * h, e),
        Saved("head matmul", "input", s * b * h, e),
        Saved("cross-entropy", "softmax over the vocabulary", s * b * cfg.vocab_size,
              LOGITS_BYTES),
    ]
    return ops


def korthikanti_layer_bytes(s: int, b: int, h: int, a: int, recompute: str = "none") -> int:
    """The published per-layer activation bytes (16-bit, with dropout):
    s*b*h*(34 + 5*a*s/h) with no recompute, 34*s*b*h with selective
    recompute, 2*s*b*h with full recompute. Exact integers."""
    if recompute == "none":
        return 34 * s * b * h + 5 * a * s * s * b
    if recompute == "selective":
        return 34 * s * b * h
    if recompute == "full":
        return 2 * s * b * h
    raise BudgetError(f"recompute={recompute!r} is unknown; allowed: {', '.join(RECOMPUTE)}.")


def _with_recompute_peak(model: str, kept: list, outside: list, rebuilt: int) -> Activations:
    """Activations whose peak follows the backward's order (see Activations)."""
    items = tuple(kept + outside)
    saved = sum(x.bytes for x in items)
    freed_first = sum(x.bytes for x in outside if not x.until_end)
    peak = saved - freed_first + max(freed_first, rebuilt) if rebuilt else saved
    return Activations(model, saved, peak, items)


def _rule_activations(cfg: BudgetConfig) -> Activations:
    e = activation_bytes_per_element(cfg)
    unit = tensor_bytes(cfg) // e
    k, L = cfg.tensors_per_layer, cfg.n_layer
    if cfg.recompute == "full":  # keep each block's input, rebuild one block's k tensors
        kept = [Saved("block", "input (checkpoint)", unit, e, L)]
        return _with_recompute_peak("rule", kept, [], k * unit * e)
    return _with_recompute_peak("rule", [Saved("block", f"{k} tensors of B x N x d",
                                               k * unit, e, L)], [], 0)


def _transformer_activations(cfg: BudgetConfig) -> Activations:
    L = cfg.n_layer
    layer = layer_ops(cfg)
    outside = transformer_outside_ops(cfg)
    e = activation_bytes_per_element(cfg)
    sbh = cfg.seq_len * cfg.micro_batch * cfg.d_model
    if cfg.attention == "flash":  # one number per query row instead of the T x T tensors
        layer = [x for x in layer if not _is_attention_core(x)]
        layer.append(Saved("flash attention", "logsumexp, one per row",
                           cfg.n_head * cfg.seq_len * cfg.micro_batch, 4))
    if cfg.recompute == "full":
        kept = [Saved("block", "input (checkpoint)", sbh, e, L)]
        rebuilt = sum(x.bytes for x in layer)
    elif cfg.recompute == "selective":
        kept = [replace(x, count=L) for x in layer if not _is_attention_core(x)]
        rebuilt = sum(x.bytes for x in layer if _is_attention_core(x))
    else:
        kept, rebuilt = [replace(x, count=L) for x in layer], 0
    return _with_recompute_peak("transformer", kept, outside, rebuilt)


def activations(cfg: BudgetConfig) -> Activations:
    """Activation bytes of one micro-batch under `cfg.activation_model`, with the
    step's moments (`step`), whose largest is the peak."""
    cfg.validate()
    if cfg.activation_model in ("pytorch", "hf"):
        return real_step_activations(cfg)
    if cfg.activation_model == "rule":
        acts = _rule_activations(cfg)
    elif cfg.activation_model == "transformer":
        acts = _transformer_activations(cfg)
    else:
        acts = engine_activations(cfg)
    fixed = per_device_fixed(cfg, fixed_bytes(cfg))
    return replace(acts, step=textbook_moments(fixed, acts.saved, acts.peak, acts.items))


# ----------------------------------------------------- "this engine" model
INDEX_BYTES = gpt_saved.INT64_BYTES  # the engine keeps token ids and targets as int64


def engine_block_saved(cfg: BudgetConfig) -> list[Saved]:
    """What one block of `engine.nn.GPT` saves (engine/gpt_saved.py's table,
    explained in engine/nn.py's docstring), per block, with f bytes per float
    element:

        ln1 layer_norm        xhat (B,T,C), rstd (B,T)
        attn qkv matmul       its input ln1(x) (B,T,C)
             causal_attention q, k, v: views of one (B,T,3C) buffer, att (B,H,T,T)
             proj matmul      the merged heads (B,T,C)
        ln2 layer_norm        xhat (B,T,C), rstd (B,T)
        mlp fc matmul         its input ln2(x) (B,T,C)
             gelu             its input (B,T,4C)
             fcproj matmul    gelu's output (B,T,4C)

    = f * (16*B*T*C + 2*B*T + B*H*T*T). The weights the matmuls keep for dx
    are parameters, not activations; bias and residual adds save nothing.
    """
    entries = gpt_saved.block_entries(cfg.micro_batch, cfg.seq_len, cfg.d_model, cfg.n_head,
                                      activation_bytes_per_element(cfg))
    return [Saved(op, tensor, n, size) for op, tensor, n, size in entries]


def engine_outside_saved(cfg: BudgetConfig) -> list[Saved]:
    """What `engine.nn.GPT` saves outside its blocks: the token ids, the final
    layer norm, the tied head's input, the loss's probabilities and targets."""
    entries = gpt_saved.outside_entries(cfg.micro_batch, cfg.seq_len, cfg.d_model,
                                        cfg.vocab_size, activation_bytes_per_element(cfg))
    # the ids stay until the very last VJP, the embedding's
    return [Saved(op, tensor, n, size, until_end=tensor == "ids")
            for op, tensor, n, size in entries]


def _is_engine_attention_core(item: Saved) -> bool:
    return item.tensor == gpt_saved.ATTENTION_PROBABILITIES  # rebuilt by selective recompute


def engine_saved_tensors(cfg: BudgetConfig) -> list[Saved]:
    """Every tensor `engine.nn.GPT` keeps for its backward, one entry per kind
    (`count` = number of blocks). With recompute='full' each block keeps only
    its input (B,T,C), and its insides are rebuilt during the backward; with
    recompute='selective' each block keeps all but its probabilities att."""
    block = engine_block_saved(cfg)
    if cfg.recompute == "selective":
        block = [x for x in block if not _is_engine_attention_core(x)]
    if cfg.recompute == "full":
        f = activation_bytes_per_element(cfg)
        kept = [Saved("block", "input (checkpoint)", cfg.micro_batch * cfg.seq_len
                      * cfg.d_model, f, cfg.n_layer)]
    else:
        kept = [replace(x, count=cfg.n_layer) for x in block]
    return kept + engine_outside_saved(cfg)


def engine_activations(cfg: BudgetConfig) -> Activations:
    """Exactly the bytes our tape engine saves for `engine.nn.GPT` (float
    tensors at the policy's bytes per element: fp32 = 4, as the engine runs;
    ids and targets at 8). `engine.memory` measures the same number."""
    items = engine_saved_tensors(cfg)
    if cfg.recompute == "selective":
        return _engine_selective_activations(cfg, items)
    n_kept = 1 if cfg.recompute == "full" else len(engine_block_saved(cfg))
    rebuilt = sum(x.bytes for x in engine_block_saved(cfg)) if cfg.recompute == "full" else 0
    return _with_recompute_peak("engine", items[:n_kept], items[n_kept:], rebuilt)


def _engine_selective_activations(cfg: BudgetConfig, items: list) -> Activations:
    """Selective recompute's peak, in the backward's order: the last block's
    probabilities are rebuilt once the head, the loss and everything that
    block kept after its attention core (projection input, ln2, MLP) have
    been consumed and freed; each earlier block rebuilds the same bytes with
    less alive. So the peak is the larger of the end of the forward and that
    moment."""
    block = engine_block_saved(cfg)
    rebuilt = sum(x.bytes for x in block if _is_engine_attention_core(x))
    after_core = sum(x.bytes for x in block if x.op.startswith(("attn proj", "ln2", "mlp")))
    saved = sum(x.bytes for x in items)
    freed = after_core + sum(x.bytes for x in engine_outside_saved(cfg) if not x.until_end)
    return Activations("engine", saved, max(saved, saved - freed + rebuilt), tuple(items))


# Largest run `measure` starts: a few seconds of numpy on a laptop.


# ------------------------------------------- the fused trainer's attention kernels
FUSED_ATTENTION_KERNELS = fused_buffers.ATTENTION_KINDS
_ATTENTION_ROWS = {"standard": ("attention", "probabilities"),       # (op, tensor) of a Saved
                   "flash": ("flash attention", "row log-sum-exp")}


def _fused_dims(cfg: BudgetConfig) -> fused_buffers.Dims:
    return fused_buffers.Dims(cfg.micro_batch, cfg.seq_len, cfg.d_model, cfg.n_head,
                              cfg.vocab_size, cfg.n_layer)


def fused_attention_saved(cfg: BudgetConfig, attention: str = "standard") -> Saved:
    """What one block of engine.trainer's FusedGPT keeps for attention's
    backward beyond Q, K, V and the output: the probabilities, (B, H, T, T),
    with the standard kernel, or one log-sum-exp per row, (B, H, T), with the
    flash kernel, which rebuilds the probabilities tile by tile. O(T^2)
    against O(T) per head."""
    if attention not in FUSED_ATTENTION_KERNELS:
        raise BudgetError(f"attention={attention!r} is not a kernel of the fused trainer; "
                          f"choose one of {', '.join(FUSED_ATTENTION_KERNELS)}.")
    kept = fused_buffers.attention_buffer(attention)
    return Saved(*_ATTENTION_ROWS[attention], math.prod(kept.shape(_fused_dims(cfg))),
                 activation_bytes_per_element(cfg))


def fused_trainer_saved(cfg: BudgetConfig, attention: str = "standard") -> list[Saved]:
    """The buffers engine.trainer's FusedGPT keeps from forward to backward
    (its StepBuffers.saved_nbytes): the groups "stream", "layer" and "final" of
    the table engine.fused_buffers, as five rows: the residual stream (one per
    block boundary), what one block keeps beyond attention's own, attention's
    own (fused_attention_saved), the final layer norm, and the logits.

    GELU's output (4C per row) is not kept, where the tape engine keeps it:
    the fused GELU backward writes it again from the fc output it reads anyway,
    one multiply per element (engine/trainer/kernels/gelu.py).

    recompute='full' is the trainer's --checkpointing: one block's buffers,
    shared by all blocks, refilled in the backward."""
    if cfg.recompute == "selective":
        raise BudgetError("the fused trainer recomputes whole blocks (recompute 'full') or "
                          "nothing; for attention without the T x T matrix choose "
                          "attention='flash' instead of recompute='selective'.")
    attention_row = fused_attention_saved(cfg, attention)
    d, f = _fused_dims(cfg), activation_bytes_per_element(cfg)
    sets = fused_buffers.layer_sets(d.L, cfg.recompute == "full")
    stream = sum(fused_buffers.elements("stream", d, attention).values())
    block = fused_buffers.elements("layer", d, attention)
    del block[fused_buffers.attention_buffer(attention).name]
    final = fused_buffers.elements("final", d, attention)
    logits = final.pop("logits")
    return [
        Saved("residual stream", "block inputs and output", stream // (d.L + 1), f, d.L + 1),
        Saved("block", "layer norms, qkv, attention output, residual, fc output",
              sum(block.values()), f, sets),
        replace(attention_row, count=sets),
        Saved("final layer norm", "output, mean, rstd", sum(final.values()), f),
        Saved("head", "logits (become their gradient)", logits, f),
    ]
