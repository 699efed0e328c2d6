"""A real framework's step (PyTorch as nanoGPT writes it, Hugging Face transformers) as
moments: what each moment holds, from what the model keeps (`real_step`), what the loop
keeps (the model's output) and what the optimizer's code allocates (`optimizer_step`).

The moments, in the order they happen (names in `moments`):
  the loss at the end of the forward  the forward's saved tensors, the loss's
                                      vocabulary-sized tensors, the model's output
                                      until it returns, autocast's weight cache
  the loss's backward                 everything saved, plus the gradients of the
                                      log_softmax output and of the logits
  the head's backward                 the head's weight gradient, vocabulary by width,
                                      beside everything saved
  the first block's backward          with checkpointing: every gradient so far and
                                      one rebuilt block
  the end of the backward             every gradient, the token embedding's last, and a
                                      tied head's two contributions and their sum
  the optimizer step                  the gradients, the state and the temporaries of
                                      the optimizer's implementation
Under accumulation, later micro-batches run beside the earlier ones' gradients. The
optimizer state appears in the first `step()`, so step 1's earlier moments run
without it. The peak is the largest moment (`moments.peak`).
"""
from __future__ import annotations

from dataclasses import replace

from . import lora
from . import moments as M
from . import optimizer_step as opt
from .config import REAL_STEP_MODELS, BudgetConfig
from .counts import bytes_per_parameter, fixed_bytes
from .kept import Activations, Saved
from .real_step import (FP32, block_biases, block_saved, block_weights, compute_bytes,
                        kept_output_terms, mask_bytes, outside_saved, sdpa_gets_mask,
                        vocab_fp32_bytes)
from .sharding import per_device_fixed
from .weights_dtype import BF16, bf16_weights, hidden_bytes, trains_bf16, training_bytes


RNG_STATE_BYTES = 5056  # torch.get_rng_state(): the CPU generator's state


def checkpoint_kept(cfg: BudgetConfig, device: str) -> list[Saved]:
    """What checkpointing every block keeps: each block's input; in transformers'
    step also the attention mask every block is handed (eager's float mask, SDPA's
    bool one when it gets a mask), and, on the CPU, the CPU generator's state each
    checkpoint stashes (`preserve_rng_state`: a CPU tensor, no device memory on CUDA)."""
    L, n, h = cfg.n_layer, cfg.micro_batch * cfg.seq_len, cfg.d_model
    e = hidden_bytes(cfg)  # the hidden states' dtype: the weights'
    dtype = "fp32" if e == FP32 else "bf16"
    held = [Saved("block", f"input (checkpoint, {dtype})", n * h, e, L)]
    if cfg.activation_model != "hf":
        return held
    mask = cfg.micro_batch * cfg.seq_len * cfg.seq_len
    if cfg.attention == "standard":
        held.append(Saved("checkpoints", f"the attention mask ({dtype}, B x T x T)", mask, e))
    elif sdpa_gets_mask(cfg):
        held.append(Saved("checkpoints", "the attention mask (bool, B x T x T)", mask, 1))
    if device == "cpu":
        held.append(Saved("checkpoints", "the CPU generator's state", RNG_STATE_BYTES, 1, L))
    return held


def _kept(cfg: BudgetConfig, device: str) -> tuple[list[Saved], list[Saved], int]:
    """Saved entries (blocks then outside), and the bytes of one block."""
    block, outside = block_saved(cfg, device), outside_saved(cfg, device)
    held = checkpoint_kept(cfg, device) if cfg.recompute == "full" else None
    if cfg.lora_rank:
        return lora.kept(cfg, mask_bytes(cfg, device, FP32), block, outside, held)
    blocks = held or [replace(x, count=cfg.n_layer) for x in block]
    return blocks, outside, sum(x.bytes for x in block)


def autocast_cache_bytes(cfg: BudgetConfig) -> int:
    """16-bit weight copies autocast caches until the forward ends but no op saves:
    the biases always, the matmul weights too when checkpointing saves none of them."""
    if not cfg.autocast:
        return 0
    if cfg.lora_rank:
        return lora.autocast_cache_bytes(cfg)
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
    accumulation with an untied head."""
    return 0 if cfg.lora_rank else cfg.vocab_size * cfg.d_model


def _moments(cfg: BudgetConfig, fixed: dict, saved: int, one_block: int, device: str,
             first_step: bool) -> tuple:
    """Every moment of one step (step 1 when `first_step`)."""
    weights = fixed["weights"] + fixed["master weights"]
    output = kept_output_terms(cfg, device, first_step)  # what the loop's output adds
    state = [] if first_step else [("optimizer state", fixed["optimizer state"])]
    resident = [("weights", weights), *state]
    earlier = ([("gradients of earlier micro-batches", fixed["gradients"])]
               if cfg.accumulation > 1 else [])
    vocab = vocab_fp32_bytes(cfg)
    grad_bytes = training_bytes(cfg, bytes_per_parameter(
        cfg.precision, cfg.optimizer, cfg.grad_precision, cfg.real_16bit))["gradients"]
    fwd_end = [*resident, *earlier,
               ("saved by the forward", "saved by the forward (but the loss's)", saved - vocab),
               ("loss", "log_softmax output (fp32)", vocab),
               ("autocast cache", "autocast cache: 16-bit weight copies",
                autocast_cache_bytes(cfg)),
               *output.get(M.FORWARD_END, ())]
    if compute_bytes(cfg) != FP32:  # 16-bit logits: the loss upcasts them
        fwd_end.append(("loss", "logits, fp32 copy for the loss", vocab))
    found = [M.moment(M.FORWARD_END, fwd_end),
             M.moment(M.LOSS_BACKWARD, [
                 *resident, *earlier, ("saved by the forward", saved),
                 ("loss", "gradient of the log_softmax output", vocab),
                 ("loss", "gradient of the logits (fp32)", vocab)]),
             M.moment(M.HEAD_BACKWARD, [
                 *resident, *earlier,
                 ("saved by the forward", "saved by the forward (the log_softmax output's "
                  "place now the gradient of the logits)", saved),
                 ("backward's last gradients", "the head's new weight gradient",
                  _head_weights(cfg) * grad_bytes)])]
    if cfg.recompute == "full":
        n, h = cfg.micro_batch * cfg.seq_len, cfg.d_model
        found.append(M.moment(M.RECOMPUTED, [
            *resident, ("gradients", fixed["gradients"]),
            ("recompute", "the first block's recomputed tensors", one_block),
            ("saved by the forward", "its checkpointed input", n * h * hidden_bytes(cfg)),
            *output.get(M.RECOMPUTED, ())]))
    tensors = opt.trainable_tensors(cfg)
    end = opt.backward_end_terms([t.numel for t in tensors], grad_bytes, tensors[0].numel,
                                 cfg.tied_embedding and not cfg.lora_rank,
                                 cfg.accumulation > 1, cfg.autocast and not bf16_weights(cfg))
    found.append(M.moment(M.BACKWARD_END, [*resident, *end,
                                           *output.get(M.BACKWARD_END, ())]))
    impl = cfg.resolved_optimizer_impl
    temporaries = opt.step_temporaries(cfg, tensors, impl, device,
                                       BF16 if trains_bf16(cfg) else FP32) if impl else []
    found.append(M.moment(M.OPTIMIZER_STEP, [
        ("weights", weights), ("gradients", fixed["gradients"]),
        ("optimizer state", fixed["optimizer state"]),
        *temporaries,
        *output.get(M.OPTIMIZER_STEP, ())]))
    return tuple(found)


def framework_step(cfg: BudgetConfig, fixed: dict[str, int],
                   device: str | None = None) -> M.StepMoments:
    """The step of `cfg.activation_model` ("pytorch" or "hf") on one device holding
    `fixed` (bytes of weights, master weights, gradients, optimizer state)."""
    device = device or cfg.backend
    blocks, outside, one_block = _kept(cfg, device)
    items = tuple(blocks + outside)
    saved = sum(x.bytes for x in items)
    return M.StepMoments(items=items,
                         moments=_moments(cfg, fixed, saved, one_block, device, False),
                         first_step=_moments(cfg, fixed, saved, one_block, device, True))


def real_step_activations(cfg: BudgetConfig, device: str | None = None) -> Activations:
    """The Activations of a real step on one device: `saved` alive at the end of the
    forward, `peak` the steady-state peak above the fixed bytes."""
    assert cfg.activation_model in REAL_STEP_MODELS, cfg.activation_model
    fixed = per_device_fixed(cfg, fixed_bytes(cfg))
    step = framework_step(cfg, fixed, device)
    return Activations(cfg.activation_model, step.saved,
                       step.peak_moment.bytes - sum(fixed.values()), step.items, step=step)
