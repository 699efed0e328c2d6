"""DoRA (peft's `LoraConfig(use_dora=True)`): LoRA's adapters, and a trained magnitude
per output column of each adapted layer that rescales the layer's output.

peft's `DoraLinearLayer.forward` (peft/tuners/lora/dora.py) computes, per adapted
layer with base weight W, adapters A and B and scaling s,

    norm   = ||W + s * B @ A||, per output column, detached (`get_weight_norm`)
    scale  = magnitude / norm
    output = base(x) + (scale - 1) * base(x) + scale * B(A(x)) * s

and the products keep, read from torch's autograd formulas and confirmed with
saved-tensor hooks and the CPU allocator's memory events
(`tests/test_budget_recipes_lora.py`):

1. `(scale - 1) * base(x)` keeps the base layer's output (the magnitude's gradient
   reads it; a layer with a bias, GPT-2's Conv1D, keeps its output less the bias, a
   new tensor, fp32 under autocast by type promotion with the fp32 bias), and
   `scale - 1` where that output needs a gradient.
2. `scale * B(A(x))` keeps the adapter's output B(A(x)) (its own, not LoRA's
   `B(A(x)) * s`, which nothing keeps) and `scale`; the division keeps `norm`.
   Both outputs are in the compute dtype: 16 bits under autocast.
3. With `lora_dropout` the base output is made again from the dropped input
   (`F.linear(dropout(x), W.to(x.dtype))`), which keeps W when the input needs a
   gradient: the resident weight in fp32; a bf16 model's W cast to the fp32 input's
   dtype, a copy of its own; under autocast a 16-bit copy of its own (a frozen weight
   is not cached), whatever the weights' dtype.
4. The magnitudes are trained: one fp32 vector per adapted layer, registered after
   its B, with its gradient and AdamW's state.

So in a layer whose input needs no gradient (the first block's first adapters), no
`scale - 1` and no copy of W are kept. `B @ A` itself (made by running the adapters
over an identity matrix) and W + s * B @ A are transients of the forward: no op keeps
them, but B @ A and its graph (the identity, A(I)) live until the layer's forward
returns, beside the block's saved entries made so far (`_while_forward`): without
checkpointing the last block's forward holds them beside every block's entries, and
under checkpointing that happens again while a block is rebuilt in the backward; and
non-reentrant checkpointing stops the rebuild at the block's last saved entry, inside
the last adapted layer when nothing after it saves anything, with that layer's B @ A
still alive. Measured on the CPU in fp32 and under bf16 autocast; on CUDA the same ops
run, so the same tensors are kept (an assumption: no GPU measured it).
"""
from __future__ import annotations

from dataclasses import replace

from .block_backward import WEIGHT_COPIES, input_op
from .kept import Saved
from .linears import targeted, width
from .lora import input_requires_grad, inputs_alive, needs_no_gradient, saved_after
from .recipe import Recipe, Rows
from .weights_dtype import bf16_weights

FP32 = 4


def _has_bias(cfg, layer) -> bool:
    """GPT-2's Conv1D layers have biases; Qwen2's q, k and v projections (`qkv_bias`)."""
    if cfg.architecture == "gpt2":
        return True
    return getattr(cfg, "qkv_bias", False) and layer.name.split(".")[-1] in (
        "q_proj", "k_proj", "v_proj")


def _layer_terms(cfg, layer, first: bool) -> list[Saved]:
    """What one DoRA layer keeps beyond LoRA's adapter (see the module's doc)."""
    n = cfg.micro_batch * cfg.seq_len
    fan_in, fan_out = width(cfg, layer.fan_in), width(cfg, layer.fan_out)
    lo = 2 if cfg.autocast else FP32
    input_grad = not (first and needs_no_gradient(cfg, layer))
    op = f"dora {layer.name}"
    # less its bias, the base output is promoted to the fp32 bias's dtype
    minus_bias = _has_bias(cfg, layer) and not cfg.lora_dropout and not bf16_weights(cfg)
    # the base output as made: by the bf16 model's layer itself (peft's `result`) or,
    # with lora_dropout, again from the fp32 input (item 3)
    made_in = 2 if cfg.autocast or (bf16_weights(cfg) and not cfg.lora_dropout) else FP32
    items = [Saved(op, "the base layer's output" + (", less its bias" if minus_bias else "")
                   + " (for the magnitude's gradient)", n * fan_out,
                   FP32 if minus_bias else made_in),
             Saved(op, "B(A(x)), the adapter's output", n * fan_out, lo),
             Saved(op, "the norm, the scale" + (" and the scale - 1" if input_grad else ""),
                   (3 if input_grad else 2) * fan_out, FP32)]
    if cfg.lora_dropout and input_grad and (cfg.autocast or bf16_weights(cfg)):
        items.append(Saved(op, f"W, {'16-bit' if cfg.autocast else 'fp32'} copy (the base "
                           "output from the dropped input)", fan_in * fan_out, lo))
    if _transposed_weight(cfg) and cfg.autocast and not bf16_weights(cfg):
        items.append(Saved(op, "the dropped input, 16-bit copy (for the transposed weight's "
                           "gradient)", n * fan_in, 2))
    return items


def _transposed_weight(cfg) -> bool:
    """Whether DoRA multiplies by a weight that requires a gradient it never uses. peft's
    `transpose(W, fan_in_fan_out)` wraps GPT-2's Conv1D weight, transposed, in a new
    `nn.Parameter`, which requires a gradient; with lora_dropout DoRA makes the base
    output again from it (`F.linear(x, transpose(W))`). So that product keeps its
    input (a 16-bit copy under autocast) and its backward makes the weight's gradient,
    in the weight's dtype, which the graph holds until it goes."""
    return cfg.architecture == "gpt2" and bool(cfg.lora_dropout)


def graph_gradients(cfg) -> tuple:
    """(the DoRA op, bytes) of each adapted layer's transposed weight's gradient
    (`_transposed_weight`), one per block's backward."""
    if not _transposed_weight(cfg):
        return ()
    itemsize = 2 if bf16_weights(cfg) else FP32
    return tuple((f"dora {l.name}", width(cfg, l.fan_in) * width(cfg, l.fan_out) * itemsize)
                 for l in targeted(cfg))


def _while_forward(cfg, layer) -> tuple[int, int]:
    """(bytes alive while the layer's forward runs, beyond the saved entries made
    before it, at its largest: at the product B(A(I)) or in the weight's norm; the same
    when a recomputation stops at its last saved entry, in its last product). Read
    from peft's `DoraLinearLayer.forward` and the CPU allocator's memory events of a
    rebuilt block and of a forward: `get_lora_weight` runs the adapters over
    `torch.eye(fan_in)` in A's fp32, so the identity, A(I) and B(A(I)) exist together;
    under autocast A reads a 16-bit copy of the identity (kept by A(I)'s graph, the
    fp32 one goes when `get_lora_weight` returns) and B(A(I)) is cast to fp32
    (`lora_weight.to(x.dtype)`, x being peft's fp32 cast of the input). Then
    `get_weight_norm` makes `scaling * lora_weight` and `weight + ...` beside it, two
    more weight-sized tensors in x's dtype. The graph of B @ A lives until the layer's
    forward returns."""
    n, r = cfg.micro_batch * cfg.seq_len, cfg.lora_rank
    fan_in, fan_out = width(cfg, layer.fan_in), width(cfg, layer.fan_out)
    bf16 = bf16_weights(cfg)
    lo = 2 if cfg.autocast else FP32
    minus_bias = _has_bias(cfg, layer) and not cfg.lora_dropout and not bf16
    around = inputs_alive(cfg, layer)  # the input's tensors no op keeps
    if minus_bias or cfg.lora_dropout:
        # the base layer's output: before the bias is taken off it, or with lora_dropout
        # peft's `result` (the bf16 model's own, 16-bit), which the layer adds to, while
        # DoRA makes its own again
        around += n * fan_out * (2 if bf16 else lo)
    # A runs over an fp32 identity (and, under autocast, its 16-bit copy, which A(I)'s
    # graph keeps once the fp32 one has gone)
    eye = fan_in * fan_in * (FP32 + (2 if cfg.autocast else 0))
    at_product = around + eye + fan_in * r * lo + fan_in * fan_out * lo
    kept_eye = fan_in * fan_in * (2 if cfg.autocast else FP32)
    # in the norm: B(A(I)) in x's dtype, fp32 (peft casts the input to the adapters'
    # dtype; under autocast the 16-bit B(A(I)) has gone), the scaled copy and the sum,
    # and a bf16 model's W cast to x's dtype
    weight_copy = fan_in * fan_out * FP32 if bf16_weights(cfg) else 0
    in_norm = around + kept_eye + fan_in * r * lo + 3 * fan_in * fan_out * FP32 + weight_copy
    # at the stop: (scale - 1) * base(x), fp32 by promotion with the fp32 scale
    at_stop = around + kept_eye + fan_in * r * lo + fan_in * fan_out * FP32 + n * fan_out * FP32
    return max(at_product, in_norm), at_stop


def _made_before_dora(cfg, row: Saved) -> bool:
    """Whether an adapter's row is made before DoRA's forward starts: peft drops the
    input (lora_dropout's mask, and its output unless autocast's 16-bit copy of it is
    kept instead, made by A), or casts it to the adapters' fp32, first."""
    return ("lora_dropout's mask" in row.tensor or "peft's fp32 copy" in row.tensor
            or ("after lora_dropout" in row.tensor and not cfg.autocast))


def _made_after_product(cfg, layer, lora_terms: int) -> int:
    """Bytes of the layer's own saved entries made after B(A(I)) and the weight's norm:
    its adapter's (`lora_terms`, less what peft makes before DoRA's forward starts:
    `_made_before_dora`), and its DoRA terms but a base output made
    before (the layer's output itself, when no bias is taken off and no dropout makes
    it again)."""
    made_before = not _has_bias(cfg, layer) and not cfg.lora_dropout
    return lora_terms + sum(t.bytes for t in _layer_terms(cfg, layer, False)
                            if not (made_before and t.tensor.startswith("the base layer")))


def _block_forward_extra(cfg, lora_block: list[Saved], rebuilt: bool) -> int:
    """What a block's forward holds at its peak beyond everything the block saves: the
    largest, over the adapted layers, of what a layer's forward holds less the
    entries made after that moment. When the block is `rebuilt` under non-reentrant
    checkpointing, the recomputation stops at the last saved entry (`early_stop`):
    when nothing after the last adapted layer saves anything, that is in its last
    product, with all the block saved."""
    layers = targeted(cfg)
    rows = [x for x in lora_block if x.op not in WEIGHT_COPIES]
    best = 0
    for k, layer in enumerate(layers):
        mine = sum(x.bytes for x in rows
                   if x.op == f"lora {layer.name}" and not _made_before_dora(cfg, x))
        # saved after this layer's forward: LoRA's (`lora.saved_after`) and the later
        # adapted layers' DoRA terms
        later = saved_after(cfg, rows, k) + sum(
            t.bytes for l in layers[k + 1:] for t in _layer_terms(cfg, l, False))
        at_largest, at_stop = _while_forward(cfg, layer)
        best = max(best, at_largest - _made_after_product(cfg, layer, mine) - later)
        if rebuilt and layer is layers[-1] and later == 0:
            best = max(best, at_stop)
    return best


def _beside_adapters(cfg, block: list[Saved], first: bool) -> list[Saved]:
    """`block` with each adapted layer's DoRA terms right after its adapter's rows (or,
    without any, after the rows of the op that holds its input): the rows stay in
    forward order, and a block's backward releases them with their layer's."""
    out = list(block)
    ops = [x.op for x in block]
    for layer in targeted(cfg):
        where = f"lora {layer.name}" if f"lora {layer.name}" in ops else input_op(layer, ops)
        at = (max(i for i, x in enumerate(out) if x.op == where) + 1 if where is not None
              else len(out))
        out[at:at] = _layer_terms(cfg, layer, first)
    return out


def rows(cfg, base: Rows, rows: Rows, device: str) -> Rows:
    """Each adapted layer's DoRA terms added to LoRA's block (and first block), beside
    its adapter's. What its layers' forwards make and no op keeps
    (`_block_forward_extra`) is the block's forward transient; under checkpointing the
    rebuilt block's forward holds it again."""
    first = not input_requires_grad(cfg)  # the first block starts without gradients
    block = _beside_adapters(cfg, rows.block, False)
    head = _beside_adapters(cfg, rows.first, first)
    transient = _block_forward_extra(cfg, rows.block, rebuilt=rows.checkpointed is not None)
    return replace(rows, block=block, first=head,
                   forward_transient=max(rows.forward_transient, transient),
                   graph_gradients=rows.graph_gradients + graph_gradients(cfg))


def tensors(cfg, trained: list, make) -> list:
    """Each adapted layer's magnitude vector, after its B (peft's order)."""
    out = []
    for t in trained:
        out.append(t)
        if t.name.endswith(".lora_B.weight"):
            name = t.name.removesuffix(".lora_B.weight")
            layer = next(l for l in targeted(cfg) if name.endswith(l.name))
            out.append(make(f"{name}.lora_magnitude_vector.weight",
                            width(cfg, layer.fan_out), True))
    return out


RECIPE = Recipe("dora", lambda cfg: bool(cfg.lora_rank and cfg.dora), rows=rows,
                tensors=tensors, knob="dora", peft_options=lambda cfg: {"use_dora": True})
