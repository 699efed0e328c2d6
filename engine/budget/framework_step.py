"""A real framework's step (PyTorch as nanoGPT writes it, Hugging Face transformers) as
moments: what each moment holds, from what the model keeps (`real_step`), what the loop
keeps (the model's output) and what the optimizer's code allocates (`optimizer_step`).

The moments, in the order they happen (names in `moments`):
  the last block's forward            where a recipe's layers hold transients no op
                                      keeps (DoRA's B @ A): every block's saved
                                      tensors and the last block's transient
  the loss at the end of the forward  the forward's saved tensors, the loss's
                                      vocabulary-sized tensors, the model's output
                                      until it returns, autocast's weight cache
  the loss's backward                 everything saved, plus the gradients of the
                                      log_softmax output and of the logits
  the head's backward                 the head's weight gradient, vocabulary by width,
                                      beside everything saved
  the last block's backward           the block walked back op by op (block_backward):
                                      its rows, its own gradients and those it is
                                      making, beside the earlier blocks' rows (their
                                      checkpoints, and the block rebuilt first, under
                                      checkpointing) and the gradients made so far
  the first block's backward          the same at block 0: the later blocks' gradients
                                      made, no earlier block's rows
  the end of the backward             every gradient, the token embedding's last, and a
                                      tied head's two contributions and their sum
  the optimizer step                  the gradients, the state and the temporaries of
                                      the optimizer's implementation
Under accumulation, later micro-batches run beside the earlier ones' gradients. The
optimizer state appears in the first `step()`, so step 1's earlier moments run
without it. The peak is the largest moment (`moments.peak`).
"""
from __future__ import annotations

from . import moments as M
from . import optimizer_step as opt
from . import recipes
from .block_backward import backward_by_op
from .config import REAL_STEP_MODELS, BudgetConfig
from .counts import bytes_per_parameter, fixed_bytes
from .gemma import layer_kinds
from .kept import Activations, Saved
from .real_step import (FP32, block_biases, block_saved, block_weights, compute_bytes,
                        forward_locals, kept_output_terms, log_probs_bytes, output_outlives_backward,
                        outside_saved,
                        sdpa_gets_mask, vocab_fp32_bytes)
from .sharding import (gradients_in_flight, per_device_fixed, shard, shards_gradients,
                       shards_optimizer, weights_gathered)
from .weights_dtype import BF16, bf16_weights, hidden_bytes, trains_bf16, training_bytes


RNG_STATE_BYTES = 5056  # torch.get_rng_state(): the CPU generator's state
GRAPH_GRADIENTS = "gradients no optimizer holds, held by the graph (Rows.graph_gradients)"


def checkpoint_kept(cfg: BudgetConfig, device: str, blocks: int | None = None) -> list[Saved]:
    """What checkpointing every block keeps: each block's input; in transformers'
    step also the attention mask every block is handed (eager's float mask, SDPA's
    bool one when it gets a mask), and, on the CPU, the CPU generator's state each
    checkpoint stashes (`preserve_rng_state`: a CPU tensor, no device memory on CUDA).
    `blocks`: how many blocks' checkpoints are still alive (all by default; the
    backward frees each block's as it ends)."""
    L, n, h = blocks or cfg.n_layer, cfg.micro_batch * cfg.seq_len, cfg.d_model
    e = hidden_bytes(cfg)  # the hidden states' dtype: the weights'
    dtype = "fp32" if e == FP32 else "bf16"
    held = [Saved("block", f"input (checkpoint, {dtype})", n * h, e, L)]
    if cfg.activation_model != "hf":
        return held
    mask = cfg.micro_batch * cfg.seq_len * cfg.seq_len
    if cfg.attention == "standard":  # one per kind of layer (Gemma's windowed and global)
        held.append(Saved("checkpoints", f"the attention mask ({dtype}, B x T x T)", mask, e,
                          layer_kinds(cfg)))
    elif sdpa_gets_mask(cfg):
        held.append(Saved("checkpoints", "the attention mask (bool, B x T x T)", mask, 1))
    if device == "cpu":
        held.append(Saved("checkpoints", "the CPU generator's state", RNG_STATE_BYTES, 1, L))
    return held


def _kept(cfg: BudgetConfig, device: str, block: list[Saved]) -> recipes.Rows:
    """What the forward keeps: the base model's rows (a block's: `block`) as the
    fine-tuning recipes rewrite them (`recipes`), with what a block's layers hold
    beyond them."""
    held = checkpoint_kept(cfg, device) if cfg.recompute == "full" else None
    return recipes.rows(cfg, recipes.Rows(block, block, outside_saved(cfg, device), held),
                        device)


def _gradient_bytes(cfg: BudgetConfig) -> int:
    """Bytes of one trained parameter's gradient."""
    return training_bytes(cfg, bytes_per_parameter(
        cfg.precision, cfg.optimizer, cfg.grad_precision, cfg.real_16bit))["gradients"]


def _walked_rows(cfg: BudgetConfig, rows: recipes.Rows) -> list[Saved]:
    """A block's rows as its backward finds them. Under checkpointing its rebuild makes
    them again but the first norm's input: that is the block's input, the checkpoint
    itself (counted with the checkpoints), when the norm keeps it in its own dtype."""
    first = rows.block[0] if rows.block else None
    if (cfg.recompute == "full" and first is not None and first.itemsize == hidden_bytes(cfg)
            and first.tensor.startswith("input (the residual stream")):
        return rows.block[1:]
    return rows.block


def _block_walk(cfg: BudgetConfig, rows: recipes.Rows, tensors,
                base: list[Saved]) -> list[int]:
    """What a block's backward holds beyond what was alive before it, arrangement by
    arrangement: op by op (`block_backward`), and under checkpointing its rebuild (its
    rows and its layers' forward transient). Every block has the same rows and
    tensors, so the last block's walk is every block's. Its own gradients are new
    tensors only in one micro-batch with the gradients whole; otherwise they are added
    in place or held by the ZeRO engine (`_gradients`)."""
    own = 0 if shards_gradients(cfg) or cfg.accumulation > 1 else _gradient_bytes(cfg)
    rebuilt = cfg.recompute == "full"
    walked = _walked_rows(cfg, rows)
    held = backward_by_op(cfg, walked, tensors, cfg.n_layer - 1, own,
                          rows.layer_backwards, rebuilt, base, rows.graph_gradients)
    if rebuilt:
        held.append(sum(x.bytes for x in walked) + rows.forward_transient)
    return held


def autocast_cache_bytes(cfg: BudgetConfig) -> int:
    """16-bit weight copies autocast caches until the forward ends but no op saves:
    the biases always, the matmul weights too when checkpointing saves none of them."""
    if not cfg.autocast:
        return 0
    return recipes.autocast_cache(cfg, _base_autocast_cache_bytes(cfg))


def _base_autocast_cache_bytes(cfg: BudgetConfig) -> int:
    """The full fine-tune's: every weight and bias cast once."""
    if bf16_weights(cfg):  # a bf16 weight or bias is used as it is: nothing cast
        return 0
    lo = compute_bytes(cfg)
    all_casts = cfg.n_layer * (block_weights(cfg) + block_biases(cfg)) * lo
    kept_casts = 0 if cfg.recompute == "full" else cfg.n_layer * block_weights(cfg) * lo
    return all_casts - kept_casts


def _head_weights(cfg: BudgetConfig) -> int:
    """The head's weight gradient, made by its matmul's backward (`MmBackward0`) first
    of all the weight gradients, while the forward's saved tensors are alive:
    vocabulary by width (none for LoRA's frozen head). Under autocast the matmul makes
    it in 16 bits and `ToCopyBackward0` casts it to fp32 while the 16-bit one is
    alive, but by then the node has released the 16-bit copy of the weight it saved,
    the same bytes: the sum is unchanged. The moment outgrows the loss's backward when
    the width exceeds twice the micro-batch's tokens, and the end of the backward under
    accumulation with an untied head. A recipe may say otherwise (LoRA's frozen head
    makes none)."""
    return recipes.head_gradient(cfg, cfg.vocab_size * cfg.d_model)


def _head_itemsize(tensors, grad_bytes: int) -> int:
    """Bytes of an element of the head's weight gradient: `grad_bytes`, or the dtype of
    a trained head of its own (a bf16 model's trained copy of its head is bf16). An
    untied head is the last of the trained tensors."""
    head = tensors[-1] if tensors and tensors[-1].name.startswith("lm_head") else None
    return (head.itemsize if head is not None else 0) or grad_bytes


def _gradients(cfg: BudgetConfig, fixed: dict, grad_bytes: int, tensors) -> dict:
    """Moment -> the (term, what, bytes) entries of the gradients one device holds then,
    beyond the head's new weight gradient. On one device, or under ZeRO 0 and 1, the
    gradients of earlier micro-batches, every gradient from the first block's backward
    on, and at the end of the backward every other gradient beside the embedding's
    (optimizer_step.backward_end_terms). Under ZeRO 2 and 3 this device's shard from
    the head's backward on, and what the engine holds whole beyond it
    (sharding.gradients_in_flight)."""
    later = cfg.accumulation > 1
    earlier = [("gradients of earlier micro-batches", fixed["gradients"])] if later else []
    tied = cfg.tied_embedding and not recipes.freezes_base(cfg)
    autocast = cfg.autocast and not bf16_weights(cfg)
    total = sum(t.numel for t in tensors) * grad_bytes + sum(
        t.numel * (t.itemsize - grad_bytes) for t in tensors if t.itemsize)
    embedding = tensors[0].bytes_in(grad_bytes)
    if not shards_gradients(cfg):
        end = opt.backward_end_terms(total, embedding, tied, later, autocast)
        every = [("gradients", fixed["gradients"])]
        return {M.FORWARD_END: earlier, M.LOSS_BACKWARD: earlier, M.HEAD_BACKWARD: earlier,
                M.FIRST_BLOCK_BACKWARD: every, M.BACKWARD_END: end,
                M.OPTIMIZER_STEP: every}
    # Each micro-batch's gradients are reduced into the shard as they are made, so
    # every micro-batch ends its backward as the first does.
    end = opt.backward_end_terms(total, embedding, tied, False, autocast)
    end = [a for a in end if a.term != "gradients"]  # every other gradient: in the shard
    shard = [("gradients", "gradients: this device's shard", fixed["gradients"])]
    flight = gradients_in_flight(cfg, tensors, grad_bytes, _head_weights(cfg))
    held = {at: [("gradients in flight", what, size) for what, size in flight.get(at, [])]
            for at in (M.FORWARD_END, M.LOSS_BACKWARD, M.HEAD_BACKWARD, M.FIRST_BLOCK_BACKWARD,
                       M.BACKWARD_END, M.OPTIMIZER_STEP)}
    return {M.FORWARD_END: earlier + held[M.FORWARD_END],
            M.LOSS_BACKWARD: earlier + held[M.LOSS_BACKWARD],
            M.HEAD_BACKWARD: shard + held[M.HEAD_BACKWARD],
            M.FIRST_BLOCK_BACKWARD: shard + held[M.FIRST_BLOCK_BACKWARD],
            M.BACKWARD_END: shard + held[M.BACKWARD_END] + end,
            M.OPTIMIZER_STEP: shard + held[M.OPTIMIZER_STEP]}


def _optimizer_terms(cfg: BudgetConfig, fixed: dict, tensors, device: str,
                     first_step: bool) -> list:
    """The optimizer's state and temporaries at its step (optimizer_step): the whole
    state, except in step 1 of an optimizer that makes each tensor's state as it
    visits it (only what it has made by its largest moment). Under ZeRO 1 and up each
    device steps over its shard of the parameters, so they shrink with it."""
    state = [("optimizer state", fixed["optimizer state"])]
    impl = cfg.resolved_optimizer_impl
    if not impl:
        return state
    found = opt.step_temporaries(cfg, tensors, impl, device,
                                 BF16 if trains_bf16(cfg) else FP32)
    so_far = opt.first_step_state_and_temporaries(cfg, tensors, device) if first_step else None
    if so_far is not None:
        made, whole, found = so_far
        state = [("optimizer state", "optimizer state: what step 1 has made by then",
                  fixed["optimizer state"] * made // whole if whole else 0)]
    if shards_optimizer(cfg):
        found = [M.Alive(a.term, f"{a.what} (this device's shard)", shard(a.bytes, cfg.devices))
                 for a in found]
    return state + found


def _last_block(cfg: BudgetConfig, resident: list, grads: dict, before_loss: int,
                transient: int, output: dict, device: str) -> list:
    """The last block's forward, where a block's forward transient peaks beside
    everything saved before it (none without a transient): every block's entries and
    the embeddings' (`before_loss`), the autocast cache made by then, the forward's own
    variables (`real_step.forward_locals`), the loop's previous output."""
    if not transient or cfg.recompute == "full":  # checkpointed: the rebuild holds it
        return []
    return [M.moment(M.LAST_BLOCK, [
        *resident, *grads[M.FORWARD_END],
        ("saved by the forward", "saved by the embeddings and every block", before_loss),
        ("autocast cache", "autocast cache: 16-bit weight copies", autocast_cache_bytes(cfg)),
        ("forward transient", "what a layer's forward holds beyond what the block saves "
         "(the recipe's rows)", transient),
        *(("forward transient", what, size) for what, size in forward_locals(cfg, device)),
        *(a for a in output.get(M.FORWARD_END, ()) if a.term == "the loop's output")])]


def _block_backwards(cfg: BudgetConfig, resident: list, grads: dict, grad_bytes: int,
                     one_block: int, walk: list[int], blocks_saved: int, kept_to_end: int,
                     output: dict, tensors, device: str, graph: int) -> list:
    """The last block's backward and the first's. A block's backward walks the block
    back op by op (`walk`, `_block_walk`): its rows, and as the walk goes on its own
    gradients and the gradients it is making, beside the gradients made so far (the
    later blocks', the final norm's and the head's; every gradient under accumulation),
    what the embeddings keep to the end and the gradient of the block's output. Without
    checkpointing the earlier blocks' rows wait beside it; with it, only their
    checkpoints, and the block is rebuilt first (its rows and its layers' forward
    transient). From one block to the one before it, a block's rows or checkpoint go
    and its gradients come: the largest is the last block's backward or the first's.
    Under ZeRO 2 and 3 the gradients are the shard and what the engine holds whole at
    the first block (sharding), at most as much at the last. `graph`: the bytes of
    gradients no optimizer holds that each block's backward makes (`Rows.
    graph_gradients`), held by the graph: the later blocks' are alive."""
    n, h, L = cfg.micro_batch * cfg.seq_len, cfg.d_model, cfg.n_layer
    tied = cfg.tied_embedding and not recipes.freezes_base(cfg)
    found = []
    for i in sorted({L - 1, 0}, reverse=True):
        if shards_gradients(cfg) or cfg.accumulation > 1:
            made = grads[M.FIRST_BLOCK_BACKWARD]
            if tied and not shards_gradients(cfg):
                # a later micro-batch: the tied head's new gradient waits in autograd's
                # input buffer for the embedding's, beside every gradient made before
                made = [*made, ("backward's last gradients", "tied weight: the head's "
                                "gradient contribution", tensors[0].bytes_in(grad_bytes))]
        else:
            made = [("gradients", "gradients made before this block's backward",
                     opt.gradients_before_block(tensors, i, tied, grad_bytes))]
        made = [*made, ("gradients", GRAPH_GRADIENTS, (L - 1 - i) * graph)]
        if cfg.recompute == "full":
            before = [("recompute", "the block's recomputed tensors", one_block),
                      ("saved by the forward", "the checkpoints of this block and those "
                       "before it", sum(x.bytes for x in checkpoint_kept(cfg, device, i + 1)))]
        else:
            before = [("saved by the forward", "this block's entries", one_block),
                      ("saved by the forward", "the entries of the blocks before it",
                       blocks_saved - one_block if i else 0)]
        at = M.moment(M.FIRST_BLOCK_BACKWARD if i == 0 else M.LAST_BLOCK_BACKWARD, [
            *resident, *made, *before,
            ("the block's backward", "what rebuilding the block or walking it back holds "
             "beyond its rows at its largest: a layer's forward transient, or its own "
             "gradients and those it is making", max(walk) - one_block),
            ("saved by the forward", "what the embeddings keep to the end", kept_to_end),
            ("the block's backward", "the gradient of the block's output",
             n * h * hidden_bytes(cfg)),
            *output.get(M.FIRST_BLOCK_BACKWARD, ())])
        found.append(M.with_arrangements(at, (at.bytes - max(walk) + x for x in walk)))
    return found


def _moments(cfg: BudgetConfig, fixed: dict, rows: recipes.Rows, blocks: list[Saved],
             walk: list[int], device: str, first_step: bool, tensors) -> tuple:
    """Every moment of one step (step 1 when `first_step`) from what the forward keeps
    (`rows`, every block's entries `blocks`) and a block's walk back (`_block_walk`);
    `tensors` are the trained parameters (optimizer_step.trainable_tensors)."""
    saved = sum(x.bytes for x in blocks + rows.outside)
    # made before the loss: the blocks' entries and the embeddings' (kept to the end)
    kept_to_end = sum(x.bytes for x in rows.outside if x.until_end)
    before_loss = sum(x.bytes for x in blocks) + kept_to_end
    weights = fixed["weights"] + fixed["master weights"]
    output = kept_output_terms(cfg, device, first_step)  # what the loop's output adds
    state = [] if first_step else [("optimizer state", fixed["optimizer state"])]
    resident = [("weights", weights), *state]
    vocab = vocab_fp32_bytes(cfg)
    grad_bytes = _gradient_bytes(cfg)
    grads = _gradients(cfg, fixed, grad_bytes, tensors)
    fwd_end = [*resident, *grads[M.FORWARD_END],
               ("saved by the forward", "saved by the forward (but the loss's)", saved - vocab),
               ("loss", "log_softmax output (fp32)", vocab),
               ("autocast cache", "autocast cache: 16-bit weight copies",
                autocast_cache_bytes(cfg)),
               *output.get(M.FORWARD_END, ())]
    fp32_log_probs = log_probs_bytes(cfg, device) == FP32
    if compute_bytes(cfg) != FP32 and fp32_log_probs:  # 16-bit logits: the loss upcasts them
        fwd_end.append(("loss", "logits, fp32 copy for the loss", vocab))
    if fp32_log_probs:  # log_softmax's backward: its output's gradient and the logits'
        loss_grads = [("loss", "gradient of the log_softmax output", vocab),
                      ("loss", "gradient of the logits (fp32)", vocab)]
        at_head = saved
    else:  # nll_loss's fp32 gradient first; the 16-bit ones follow as its copy goes
        loss_grads = [("loss", "gradient of nll_loss's fp32 input", vocab)]
        at_head = saved - vocab  # 16-bit log-probs and fp32 copy gone, 16-bit gradient
    found = [*_last_block(cfg, resident, grads, before_loss, rows.forward_transient, output,
                          device),
             M.moment(M.FORWARD_END, fwd_end),
             M.moment(M.LOSS_BACKWARD, [
                 *resident, *grads[M.LOSS_BACKWARD], ("saved by the forward", saved),
                 *loss_grads]),
             M.moment(M.HEAD_BACKWARD, [
                 *resident, *grads[M.HEAD_BACKWARD],
                 ("saved by the forward", "saved by the forward (the log_softmax output's "
                  "place now the gradient of the logits)", at_head),
                 ("backward's last gradients", "the head's new weight gradient",
                  _head_weights(cfg) * _head_itemsize(tensors, grad_bytes))])]
    graph = sum(size for _, size in rows.graph_gradients)  # per block, held by the graph
    found += _block_backwards(cfg, resident, grads, grad_bytes,
                              sum(x.bytes for x in _walked_rows(cfg, rows)), walk,
                              before_loss - kept_to_end, kept_to_end, output, tensors, device,
                              graph)
    by_graph = [("gradients", GRAPH_GRADIENTS, cfg.n_layer * graph)]
    found.append(M.moment(M.BACKWARD_END, [*resident, *grads[M.BACKWARD_END], *by_graph,
                                           *output.get(M.BACKWARD_END, ())]))
    found.append(M.moment(M.OPTIMIZER_STEP, [
        ("weights", weights), *grads[M.OPTIMIZER_STEP],
        *(by_graph if output_outlives_backward(cfg) else ()),  # the output holds the graph
        *_optimizer_terms(cfg, fixed, tensors, device, first_step),
        *output.get(M.OPTIMIZER_STEP, ())]))
    gathered = weights_gathered(cfg, first_step)  # ZeRO 3's whole weights (sharding)
    if not gathered:  # every step but ZeRO 3's over several devices: nothing to add
        return tuple(found)
    return tuple(_with_gathered(m, gathered.get(m.name, ())) for m in found)


def _with_gathered(found: M.Moment, gathered) -> M.Moment:
    """A moment with ZeRO 3's gathered weights beside what it holds (each of its
    arrangements holds them too)."""
    at = M.moment(found.name, [*found.terms, *(("gathered weights", what, size)
                                               for what, size in gathered)])
    if not found.arrangements:
        return at
    return M.with_arrangements(at, (x + at.bytes - found.bytes for x in found.arrangements))


def framework_step(cfg: BudgetConfig, fixed: dict[str, int],
                   device: str | None = None) -> M.StepMoments:
    """The step of `cfg.activation_model` ("pytorch" or "hf") on one device holding
    `fixed` (bytes of weights, master weights, gradients, optimizer state)."""
    device = device or cfg.backend
    base = block_saved(cfg, device)  # a block's rows in a full fine-tune
    rows = _kept(cfg, device, base)
    tensors = opt.trainable_tensors(cfg)
    blocks = rows.blocks(cfg.n_layer)
    walk = _block_walk(cfg, rows, tensors, base)  # the same in step 1 and later steps
    return M.StepMoments(items=tuple(blocks + rows.outside),
                         moments=_moments(cfg, fixed, rows, blocks, walk, device, False,
                                          tensors),
                         first_step=_moments(cfg, fixed, rows, blocks, walk, device, True,
                                             tensors))


def real_step_activations(cfg: BudgetConfig, device: str | None = None) -> Activations:
    """The Activations of a real step on one device: `saved` alive at the end of the
    forward, `peak` the steady-state peak above the fixed bytes."""
    assert cfg.activation_model in REAL_STEP_MODELS, cfg.activation_model
    fixed = per_device_fixed(cfg, fixed_bytes(cfg))
    step = framework_step(cfg, fixed, device)
    return Activations(cfg.activation_model, step.saved,
                       step.peak_moment.bytes - sum(fixed.values()), step.items, step=step)
