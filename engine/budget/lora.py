"""LoRA fine-tuning (peft's `LoraConfig`) in a Hugging Face step: what freezing the
base model and adding low-rank adapters changes in the step's memory.

peft replaces each targeted linear layer by `base(x) + B(A(dropout(x))) * scaling`,
A of rank r by the layer's input width, B of its output width by r. The base model
is frozen: no gradient, no optimizer state, and the optimizer (transformers'
Trainer, over the parameters that require a gradient) sees only the adapters.

What the forward keeps changes in five ways, each read from torch's autograd
formulas (an op saves an input only for the gradient that needs it) and
confirmed with the CPU allocator's memory events (`tests/test_budget_lora.py`):

1. A frozen matmul keeps no input: its weight gets no gradient, and the input's
   gradient reads only the weight. A layer's input is kept when an adapter
   reads it (A's weight gradient), not otherwise: GPT-2's c_fc input goes
   when c_fc is not a target, the head's input always (the head is frozen).
2. Each adapter keeps its low-rank output A(x), n x r, for B's weight gradient.
3. With `lora_dropout` p > 0 each adapter keeps a dropped copy of its input
   (A's weight gradient reads it) instead of the input, and dropout's mask (a
   float of the input's dtype on the CPU, a bool on CUDA).
4. A frozen gain keeps nothing for its own gradient: LLaMA's RMSNorm (`weight *
   x_normed`, written in Python) no longer keeps x / rms; GPT-2's LayerNorm is
   one op (`native_layer_norm`) that keeps its input and statistics anyway.
5. Nothing needs a gradient before the first adapter: the embeddings are frozen,
   so the first block keeps nothing before the first adapter reads its input, and
   the embedding's dropout keeps no mask. peft's recipes for checkpointing
   (`gradient_checkpointing_enable()` and `enable_input_require_grads()`, which
   `prepare_model_for_kbit_training` calls) make the embedding's output require
   a gradient, so under checkpointing every block keeps the same.

Under autocast (bf16, fp16) the frozen weights stay fp32 and are not cached
(autocast caches casts of leaves that require a gradient): each frozen matmul
keeps its own 16-bit copy of its weight when its input needs a gradient, as the
full fine-tune keeps the cached one. peft casts each adapter's input to the
adapters' fp32 and A casts it back, so each adapter keeps its own 16-bit copy
of its input. A model loaded in bf16 keeps no frozen weight copies
(`engine.budget.weights_dtype`).

Which layers a target list picks: `linears`. The recipes that build on LoRA's
adapters: `dora`, `qlora`, `trained_modules` (`recipes` applies them in order).
"""
from __future__ import annotations

from dataclasses import replace

from .block_backward import WEIGHT_COPIES
from .kept import Saved
from .linears import (ALL_LINEAR, BLOCK_LINEARS, OUTPUT_PROJECTIONS, Linear, target_names,
                      targeted, width)
from . import real_step
from .recipe import Recipe, Rows
from .weights_dtype import bf16_weights, frozen_weight_bytes

FP32 = 4


def adapter_shapes(cfg) -> list[tuple[str, int, int]]:
    """(name, fan_in, fan_out) of every adapted layer of one block."""
    return [(l.name, width(cfg, l.fan_in), width(cfg, l.fan_out)) for l in targeted(cfg)]


def trainable_parameters(cfg) -> int:
    """Every adapter's A (r x fan_in) and B (fan_out x r), in every block."""
    r = cfg.lora_rank
    return cfg.n_layer * sum(r * (i + o) for _, i, o in adapter_shapes(cfg))


def adapter_tensors(cfg, tensor):
    """The trainable tensors in the order the model registers them (`tensor(name,
    numel, decays, rows_and_columns)` makes each; all are in the Trainer's weight-decay
    group): A is r x fan_in, B fan_out x r."""
    r, out, shapes = cfg.lora_rank, [], adapter_shapes(cfg)
    prefix = "h" if cfg.architecture == "gpt2" else "layers"
    for i in range(cfg.n_layer):
        for name, fan_in, fan_out in shapes:
            out += [tensor(f"{prefix}.{i}.{name}.lora_A.weight", r * fan_in, True, r + fan_in),
                    tensor(f"{prefix}.{i}.{name}.lora_B.weight", fan_out * r, True,
                           fan_out + r)]
    return out


def input_requires_grad(cfg) -> bool:
    """Whether the embedding's output requires a gradient: under checkpointing,
    where peft's recipes call `enable_input_require_grads()`."""
    return cfg.recompute == "full"


# ------------------------------------------------------- what the step keeps
def _adapter_terms(cfg, layer: Linear, mask_bytes: int, needs_mask: bool) -> list[Saved]:
    """What one adapter keeps: its dropped input and mask under lora_dropout (or,
    under autocast, its own 16-bit copy of the input), and its low-rank output."""
    n, fan_in = cfg.micro_batch * cfg.seq_len, width(cfg, layer.fan_in)
    lo, items = (2 if cfg.autocast else FP32), []
    if cfg.lora_dropout:  # dropout runs on peft's fp32 cast of the input, A on its own cast
        items.append(Saved(f"lora {layer.name}", "input after lora_dropout", n * fan_in, lo))
        if needs_mask:
            items.append(Saved(f"lora {layer.name}", "lora_dropout's mask", n * fan_in,
                               mask_bytes))
    elif cfg.autocast:  # autocast caches casts of weights only: A casts the input anew
        items.append(Saved(f"lora {layer.name}", "input, A's 16-bit copy", n * fan_in, lo))
    elif bf16_weights(cfg):  # no autocast: peft casts the bf16 input to the fp32 adapter's
        items.append(Saved(f"lora {layer.name}", "input, peft's fp32 copy", n * fan_in, FP32))
    items.append(Saved(f"lora {layer.name}", "A(x), the low-rank output", n * cfg.lora_rank,
                       lo))
    return items


def _adapter_weights(cfg) -> int:
    """Elements of one block's adapters (A and B of each)."""
    return sum(cfg.lora_rank * (i + o) for _, i, o in adapter_shapes(cfg))


def needs_no_gradient(cfg, layer: Linear) -> bool:
    """In the first block (without `input_requires_grad`): the layer reads an input
    made before any adapter's output, which needs no gradient."""
    order = [l.reads for l in BLOCK_LINEARS[cfg.architecture]]
    return order.index(layer.reads) <= order.index(targeted(cfg)[0].reads)


def weight_copies(cfg, first: bool) -> list[Saved]:
    """Under autocast, the 16-bit weight copies a block keeps. autocast caches the
    casts of leaves that require a gradient only, so each frozen matmul casts its
    weight anew and keeps the copy for its input's gradient, when that input needs
    one; the adapters' casts are cached and kept."""
    if not cfg.autocast:
        return []
    bf16 = bf16_weights(cfg)  # a bf16 weight is used as it is: no copy
    frozen = 0 if bf16 else sum(width(cfg, l.fan_in) * width(cfg, l.fan_out)
                 for l in BLOCK_LINEARS[cfg.architecture]
                 if not (first and needs_no_gradient(cfg, l)))
    # an A whose input needs no gradient keeps no weight (its cached copy goes when
    # autocast ends)
    unkept = sum(cfg.lora_rank * width(cfg, l.fan_in) for l in targeted(cfg)
                 if first and needs_no_gradient(cfg, l))
    return [Saved("frozen matmuls", "weights, 16-bit copies", frozen, 2),
            Saved("lora adapters", "A and B, 16-bit copies", _adapter_weights(cfg) - unkept, 2)]


def autocast_cache_bytes(cfg) -> int:
    """The autocast cache's copies that no op keeps: under checkpointing the
    adapters' (frozen weights are never cached)."""
    if not cfg.autocast or cfg.recompute != "full":
        return 0
    return cfg.n_layer * _adapter_weights(cfg) * 2


def _frozen_gain(item: Saved) -> bool:
    """A norm's normalised input, kept only for its gain's gradient (LLaMA's
    RMSNorm and Qwen3's q/k norms, written as `weight * x_normed`)."""
    return item.tensor.startswith("x / rms") and "norm" in item.op


# SDPA keeps its output for its own backward, and that output is the attention
# projection's input: kept whether the projection is frozen or not.
SDPA_OUTPUT = "output (also the projection's input)"


def _reads(item: Saved) -> str:
    """The op name of the linear layer whose input `item` is ("" for none)."""
    return "projection matmul" if item.tensor == SDPA_OUTPUT else item.op


# In the first block only some of Q, K and V may need a gradient (peft's default
# q_proj,v_proj leaves K without one), and an op keeps an operand only for the
# gradient of another: (op's name ends with, tensor starts with) -> the heads of
# which one of them must need a gradient for the entry to be kept.
_OPERAND_NEEDS = {("Q @ K^T", "Q"): "k", ("Q @ K^T", "K^T"): "q", ("softmax", ""): "qk",
                  ("dropout", ""): "qk", ("P @ V", "V"): "qk", ("P @ V", "P"): "v",
                  ("q_norm", ""): "q", ("k_norm", ""): "k"}


def _first_block_needs(cfg) -> str:
    """Which of q, k and v need a gradient in the first block (LLaMA's q/k/v
    projections are separate layers; GPT-2's c_attn makes all three or none)."""
    names = {l.name.split(".")[-1] for l in targeted(cfg)}
    if cfg.architecture == "gpt2":
        return "qkv"
    return "".join(x for x in "qkv" if f"{x}_proj" in names)


def _kept_for_heads(item: Saved, needs: str, full: list[Saved]) -> bool:
    """Whether `item` is kept when only the heads in `needs` need a gradient. P @ V
    reads the softmax's own output when no copy of P is made for it (fp32, no
    dropout), so V's gradient keeps the softmax's entry then."""
    for (op, tensor), heads in _OPERAND_NEEDS.items():
        if item.op.endswith(op) and item.tensor.startswith(tensor):
            if op == "softmax" and not any(x.op.endswith("P @ V") and x.tensor.startswith("P")
                                           for x in full):
                heads += "v"
            return any(h in needs for h in heads)
    return True


def lora_block(cfg, full: list[Saved], mask_bytes: int, first: bool) -> list[Saved]:
    """One block's saved entries under LoRA, from the full fine-tune's `full` (in
    forward order). `first`: the first block without `input_requires_grad`, which
    keeps nothing before the first adapter and no dropout mask of that input."""
    adapted = targeted(cfg)
    readers = {l.reads for l in BLOCK_LINEARS[cfg.architecture]}
    out, started = [], not first
    needs = _first_block_needs(cfg) if first else "qkv"
    for item in full:
        layers = [l for l in adapted if l.reads == _reads(item)]
        if (not started and not layers) or _frozen_gain(item):
            continue
        if not _kept_for_heads(item, needs, full):
            continue
        if _reads(item) in readers:  # a linear layer's input
            kept_anyway = item.tensor == SDPA_OUTPUT and started
            # A reads the tensor itself (no cast, no dropout)
            shared = not cfg.lora_dropout and not cfg.autocast and not bf16_weights(cfg)
            if kept_anyway or (layers and shared):
                out.append(item)
            for layer in layers:
                out += _adapter_terms(cfg, layer, mask_bytes, needs_mask=started)
            started = started or bool(layers)
            continue
        out.append(item)
    return out


def inputs_alive(cfg, layer: Linear) -> int:
    """Bytes of an adapted layer's input alive while its forward runs that no op keeps
    (A keeps its own copy of the input, a frozen matmul none): the norm's output the
    block holds (fp32 under autocast, bf16 over bf16 weights), a 16-bit input a matmul
    made (an output projection's; SDPA keeps its own output), peft's fp32 cast of a
    16-bit input where A keeps another tensor (its 16-bit copy under autocast, the
    dropped input with lora_dropout), and under autocast lora_dropout's fp32 output
    (A keeps its 16-bit copy). Over fp32 weights without autocast A keeps the input
    itself: nothing more. (DoRA's layers read their input the same way.)"""
    bf16 = bf16_weights(cfg)
    if not (cfg.autocast or bf16):
        return 0
    n, fan_in = cfg.micro_batch * cfg.seq_len, width(cfg, layer.fan_in)
    projection = layer.reads in OUTPUT_PROJECTIONS
    alive = n * cfg.d_model * (2 if bf16 else FP32)
    if projection and not (layer.reads == "projection matmul" and cfg.attention == "flash"):
        alive += n * fan_in * 2
    if (cfg.autocast or cfg.lora_dropout) and (bf16 or projection):
        alive += n * fan_in * FP32
    if cfg.autocast and cfg.lora_dropout:
        alive += n * fan_in * FP32
    return alive


def _layer_forward(cfg, layer: Linear) -> int:
    """What an adapted layer's forward holds beyond the rows made before it, at its
    largest (peft's `result + lora_B(lora_A(dropout(x))) * scaling`): its input's
    tensors no op keeps (`inputs_alive`), the base layer's output (16-bit under autocast
    or over bf16 weights), and two more of its size in the adapters' compute dtype:
    B(A(x)) and its scaled copy, then the scaled copy and the sum."""
    n, fan_out = cfg.micro_batch * cfg.seq_len, width(cfg, layer.fan_out)
    lo = 2 if cfg.autocast else FP32
    base = 2 if cfg.autocast or bf16_weights(cfg) else FP32
    return inputs_alive(cfg, layer) + n * fan_out * (base + 2 * lo)


def saved_after(cfg, rows: list[Saved], k: int) -> int:
    """Bytes a block saves after its k-th adapted layer's forward (`rows`: the block's
    rows less the weight copies): the rows after that layer's adapter's, the later
    linear layers' autocast copies of their frozen weights and the later adapters'
    copies of A and B."""
    layers, linears = targeted(cfg), BLOCK_LINEARS[cfg.architecture]
    layer = layers[k]
    copy = 2 if cfg.autocast else 0                  # autocast's 16-bit copy, per element
    frozen_copy = 0 if bf16_weights(cfg) else copy   # a bf16 weight is used as it is
    last = max(i for i, x in enumerate(rows) if x.op == f"lora {layer.name}")
    return (sum(x.bytes for x in rows[last + 1:])
            + sum(width(cfg, l.fan_in) * width(cfg, l.fan_out) * frozen_copy
                  for l in linears[linears.index(layer) + 1:])
            + sum(cfg.lora_rank * (width(cfg, l.fan_in) + width(cfg, l.fan_out)) * copy
                  for l in layers[k + 1:]))


def block_forward_extra(cfg, block: list[Saved]) -> int:
    """What a block's forward holds at its largest beyond everything the block saves:
    the largest, over the adapted layers, of a layer's forward (`_layer_forward`) less
    what the block saves after it (`saved_after`)."""
    rows = [x for x in block if x.op not in WEIGHT_COPIES]
    adapted = {x.op for x in rows}
    return max((_layer_forward(cfg, layer) - saved_after(cfg, rows, k)
                for k, layer in enumerate(targeted(cfg)) if f"lora {layer.name}" in adapted),
               default=0)


def rebuild_stop(cfg, block: list[Saved]) -> int:
    """What a rebuilt block holds beyond its rows where its rebuild stops. Non-reentrant
    checkpointing stops once the block's last saved entry is made again; when the
    last adapted layer's adapter keeps the block's last entries (LLaMA's down_proj
    among the targets), that is inside the layer's forward, after A. Alive then beside
    the rows: the base layer's output, peft's cast of the input to the adapters' fp32,
    lora_dropout's output of that cast, and the input itself, which no row holds when
    A reads a copy of it. (Measured on the CPU allocator's events of Qwen3's rebuilt
    blocks under bf16 autocast with lora_dropout.)"""
    ops = [x.op for x in block if x.op not in WEIGHT_COPIES]
    layer = targeted(cfg)[-1]
    if not ops or ops[-1] != f"lora {layer.name}":
        return 0
    n, fan_in = cfg.micro_batch * cfg.seq_len, width(cfg, layer.fan_in)
    fan_out = width(cfg, layer.fan_out)
    sixteen = bf16_weights(cfg) or (cfg.autocast and layer.reads in OUTPUT_PROJECTIONS)
    x_bytes = 2 if sixteen else FP32
    cast = n * fan_in * FP32 if x_bytes != FP32 else 0
    dropped = n * fan_in * FP32 if cfg.lora_dropout else 0
    x_itself = n * fan_in * x_bytes if (cfg.lora_dropout or cfg.autocast or cast) else 0
    return n * fan_out * real_step.compute_bytes(cfg) + cast + dropped + x_itself


def lora_outside(cfg, outside: list[Saved]) -> list[Saved]:
    """The entries outside the blocks under LoRA: the frozen head keeps no input,
    the frozen final RMSNorm no x / rms (1/rms stays), and the embedding's dropout
    no mask unless the embedding's output requires a gradient."""
    out = []
    for item in outside:
        if item.op == "head matmul" and item.tensor.startswith("input"):
            continue
        if item.op == "embedding dropout" and not input_requires_grad(cfg):
            continue
        if item.op == "final rms norm" and item.tensor.startswith("x / rms"):
            continue  # an entry of its own (over bf16 weights): the gain's alone
        if item.op == "final rms norm" and "x / rms" in item.tensor:
            item = replace(item, tensor="1/rms", elements=cfg.micro_batch * cfg.seq_len)
        out.append(item)
    return out


def rows(cfg, base: Rows, rows: Rows, device: str) -> Rows:
    """The rows under LoRA, from the full fine-tune's (`real_step`): each block's
    entries rewritten (`lora_block`, the matmuls' weight copies replaced by
    `weight_copies`), the first block's apart when nothing before its first adapter
    needs a gradient, and the entries outside the blocks (`lora_outside`)."""
    mask = real_step.mask_bytes(cfg, device, FP32)  # a dropout mask element of an fp32 input
    block = [x for x in rows.block if x.op != "block matmuls"]  # the weights' copies: below
    starts = not input_requires_grad(cfg)
    one = lora_block(cfg, block, mask, first=False) + weight_copies(cfg, first=False)
    first = lora_block(cfg, block, mask, first=starts) + weight_copies(cfg, first=starts)
    outside = lora_outside(cfg, rows.outside)
    if rows.checkpointed is not None and cfg.architecture == "gpt2":
        # enable_input_require_grads makes the token embedding's output a leaf
        # that requires a gradient: its AccumulateGrad node holds it until the
        # graph goes (LLaMA's is the first block's input, kept anyway)
        n, h = cfg.micro_batch * cfg.seq_len, cfg.d_model
        outside.append(Saved("token embedding", "output, a leaf requiring a gradient",
                             n * h, FP32, until_end=True))
    stop = rebuild_stop(cfg, one) if rows.checkpointed is not None else 0
    return replace(rows, block=one, first=first, outside=outside,
                   forward_transient=max(rows.forward_transient, stop,
                                         block_forward_extra(cfg, one)))


# ------------------------------------------------------- the fixed bytes
def fixed(cfg, fixed: dict, per_parameter: dict, parameters: int, trained: int) -> dict:
    """The frozen model's weights (in the dtype it was loaded in) beside the trained
    tensors' weights, gradients and optimizer state."""
    frozen = parameters * (frozen_weight_bytes(cfg) if bf16_weights(cfg)
                                     else per_parameter["weights"])
    return {k: trained * b + (frozen if k == "weights" else 0)
            for k, b in per_parameter.items()}


def peft_options(cfg) -> dict:
    """LoRA's `LoraConfig` as practitioners write it: rank r with alpha 2r (alpha scales
    the output, not the memory) and the targets (peft resolves `all-linear` itself, so
    the step measured is peft's meaning of it); GPT-2's Conv1D weights are transposed."""
    targets = (ALL_LINEAR if cfg.lora_targets.strip() == ALL_LINEAR
               else list(target_names(cfg)))
    return dict(r=cfg.lora_rank, lora_alpha=2 * cfg.lora_rank, target_modules=targets,
                lora_dropout=cfg.lora_dropout, fan_in_fan_out=cfg.architecture == "gpt2",
                bias="none", task_type="CAUSAL_LM")


RECIPE = Recipe(
    "lora", lambda cfg: bool(cfg.lora_rank), rows=rows, peft_options=peft_options,
    tensors=lambda cfg, tensors, make: adapter_tensors(cfg, make), fixed=fixed,
    autocast_cache=lambda cfg, _: autocast_cache_bytes(cfg),
    head_gradient=lambda cfg, _: 0,  # the head is frozen
    freezes_base=True)
