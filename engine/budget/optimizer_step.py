"""The optimizer's step and the end of the backward: what torch allocates there
beyond the weights, the gradients and the optimizer state.

Every term below is read from torch 2.13's own code (torch/optim/adam.py,
sgd.py, the autograd engine) and confirmed with the CPU allocator's memory
events (`tests/test_budget_optimizer_step.py`); on the CPU `foreach=True` and
`fused=True` run the same Python as on CUDA, over per-tensor fallbacks.

The optimizer step, by implementation (torch's names)
------------------------------------------------------
  for-loop  (`foreach=False, fused=False`: `_single_tensor_adam`, `_single_tensor_sgd`)
            one parameter at a time. AdamW computes
            `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`: `sqrt`
            allocates one tensor of the parameter's size and the division another
            before the first is freed, while the local `denom` still holds the
            previous parameter's quotient (it is rebound only after the division):
            the previous parameter's size plus 2 x this one's, at its largest over
            the group's order (`denom` goes when the group's call returns).
            SGD and momentum update in place (`buf.mul_(momentum).add_(grad)`,
            `param.add_(grad, alpha=-lr)`): nothing.
  foreach   (`_multi_tensor_adam`, `_multi_tensor_sgd`) one list op over every
            tensor of a (device, dtype) bucket of a param group. AdamW's
            `exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)` holds one
            tensor per parameter of the group at once; the bias corrections and step
            sizes are Python floats (no tensors) unless `capturable=True`. The lists
            are locals of one call of `adam()` per param group, so they are freed
            between groups: the peak is the largest group's. SGD and momentum: in
            place (`_foreach_mul_`, `_foreach_add_`): nothing.
  fused     (`torch._fused_adamw_`, `torch._fused_sgd_`): one kernel reads and writes
            in place; nothing beyond a 4-byte `step` tensor per parameter.

With `weight_decay != 0`, SGD (not AdamW, whose decay is `param.mul_`) adds the
decay to a copy of the gradient: `grad.add(param, alpha=weight_decay)`, one
parameter at a time for the for-loop (the largest), `torch._foreach_add(
device_grads, device_params)` over the whole group for foreach, nothing fused.
Neither torch's `SGD` nor transformers' Trainer decays by default.

The optimizer's state appears in the first `step()`: AdamW's `exp_avg` and
`exp_avg_sq` (`torch.zeros_like` in `Adam._init_group`, before any update, so
step 1's optimizer moment already holds them), momentum's buffer a
`grad.detach().clone()` (`_single_tensor_sgd`), or `torch.empty_like(g)` (fused).
The optimizer moment is therefore the same in step 1 and step 2; only the moments
before the first `step()` run without the state.

The end of the backward
-----------------------
The token embedding is the first op of the forward, so its gradient is the last
of the backward, when every other gradient exists. A tied head (GPT-2, nanoGPT)
sends the weight two contributions: the head's (the matmul's `mm_mat2_backward`
returns `grad.t().mm(input).t()`, a transposed view) and the embedding's
(`embedding_dense_backward`: `zeros` then `index_add_`). Autograd's input buffer
sums them before `AccumulateGrad` (`InputBuffer::accumulate`): in place only when
it holds the last reference to the first one's storage, which a view never is,
so in fp32 it allocates `old_var + var`, a third vocabulary-by-width tensor.
Under autocast the head's contribution is a fresh fp32 copy
(`ToCopyBackward0` casts the 16-bit weight's gradient back), so the sum is in place
and only the two contributions are alive. `AccumulateGrad` then steals the sum as
`.grad` (first micro-batch) or adds it in place (`variable_grad += new_grad`, later
micro-batches: no temporary beyond the new gradient itself). An untied
embedding's gradient is simply stolen: nothing extra in the first micro-batch,
the new gradient beside the earlier ones' in later micro-batches.

The head's backward comes first: its matmul makes the head's vocabulary-by-width
weight gradient while the forward's saved tensors are still alive; beside the
earlier micro-batches' gradients that moment can outgrow both the loss's
backward and the end of the backward (an untied head under accumulation).

`engine.budget.framework_step` puts these terms into the step's moments.
"""
from __future__ import annotations

from dataclasses import dataclass

from .lora import adapter_tensors
from .moments import Alive

FP32 = 4
IMPLS = ("for-loop", "foreach", "fused")
# torch's keyword arguments for each implementation, for torch.optim.AdamW and SGD.
TORCH_SWITCHES = {"for-loop": dict(foreach=False, fused=False),
                  "foreach": dict(foreach=True, fused=False),
                  "fused": dict(foreach=False, fused=True)}
MOMENTUM = 0.9    # torch.optim.SGD(momentum=0.9): the budget's "momentum"


# ------------------------------------------------------- the parameter tensors
@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor: its name (as transformers names it), its element
    count, and whether transformers' Trainer puts it in the weight-decay group
    (every tensor but biases and norm gains: `Trainer.get_decay_parameter_names`)."""
    name: str
    numel: int
    decays: bool


def _gpt2_tensors(cfg) -> list[ParamTensor]:
    C, f, V = cfg.d_model, cfg.ffn, cfg.vocab_size
    out = [ParamTensor("wte.weight", V * C, True),
           ParamTensor("wpe.weight", cfg.positions * C, True)]
    for i in range(cfg.n_layer):
        for name, numel, decays in (
                ("ln_1.weight", C, False), ("ln_1.bias", C, False),
                ("attn.c_attn.weight", 3 * C * C, True), ("attn.c_attn.bias", 3 * C, False),
                ("attn.c_proj.weight", C * C, True), ("attn.c_proj.bias", C, False),
                ("ln_2.weight", C, False), ("ln_2.bias", C, False),
                ("mlp.c_fc.weight", C * f, True), ("mlp.c_fc.bias", f, False),
                ("mlp.c_proj.weight", f * C, True), ("mlp.c_proj.bias", C, False)):
            out.append(ParamTensor(f"h.{i}.{name}", numel, decays))
    out += [ParamTensor("ln_f.weight", C, False), ParamTensor("ln_f.bias", C, False)]
    return out


def _llama_tensors(cfg) -> list[ParamTensor]:
    C, f, q = cfg.d_model, cfg.ffn, cfg.q_width
    kv = cfg.kv_heads * cfg.head_dim
    out = [ParamTensor("embed_tokens.weight", cfg.vocab_size * C, True)]
    for i in range(cfg.n_layer):
        for name, numel, decays in (
                ("input_layernorm.weight", C, False),
                ("self_attn.q_proj.weight", q * C, True), ("self_attn.k_proj.weight", kv * C, True),
                ("self_attn.v_proj.weight", kv * C, True), ("self_attn.o_proj.weight", C * q, True),
                ("post_attention_layernorm.weight", C, False),
                ("mlp.gate_proj.weight", f * C, True), ("mlp.up_proj.weight", f * C, True),
                ("mlp.down_proj.weight", C * f, True)):
            out.append(ParamTensor(f"layers.{i}.{name}", numel, decays))
        out += _llama_traits(cfg, f"layers.{i}.self_attn.", q, kv)
    out.append(ParamTensor("norm.weight", C, False))
    return out


def _llama_traits(cfg, prefix: str, q: int, kv: int) -> list[ParamTensor]:
    """Qwen2's q/k/v biases and Qwen3's per-head q/k norm gains (no weight decay)."""
    out = []
    if getattr(cfg, "qkv_bias", False):
        out += [ParamTensor(prefix + "q_proj.bias", q, False),
                ParamTensor(prefix + "k_proj.bias", kv, False),
                ParamTensor(prefix + "v_proj.bias", kv, False)]
    if getattr(cfg, "qk_norm", False):
        out += [ParamTensor(prefix + "q_norm.weight", cfg.head_dim, False),
                ParamTensor(prefix + "k_norm.weight", cfg.head_dim, False)]
    return out


def parameter_tensors(cfg) -> list[ParamTensor]:
    """Every parameter tensor of `cfg`'s model in the order the model registers
    them (a tied head is the embedding itself: not listed again). Their element
    counts add up to `counts.parameter_count(cfg)`."""
    tensors = _llama_tensors(cfg) if cfg.architecture == "llama" else _gpt2_tensors(cfg)
    if not cfg.tied_embedding:
        tensors.append(ParamTensor("lm_head.weight", cfg.vocab_size * cfg.d_model, True))
    return tensors


def trainable_tensors(cfg) -> list[ParamTensor]:
    """The tensors the optimizer updates, the last of the backward's gradients
    first: LoRA's adapters (`engine.budget.lora`), else `parameter_tensors`."""
    if not cfg.lora_rank:
        return parameter_tensors(cfg)
    return adapter_tensors(cfg, ParamTensor)


def param_groups(cfg, tensors: list[ParamTensor]) -> list[list[int]]:
    """The element counts of each param group of the optimizer `cfg`'s framework
    builds: transformers' Trainer two (`Trainer.create_optimizer`: the decay
    group, then biases and norms with weight_decay 0.0), `torch.optim.AdamW(
    model.parameters())` one."""
    if cfg.activation_model == "hf":
        return [[t.numel for t in tensors if t.decays], [t.numel for t in tensors if not t.decays]]
    return [[t.numel for t in tensors]]


# ------------------------------------------------------ the optimizer's step
def optimizer_temporaries(optimizer: str, impl: str, groups: list[list[int]],
                          state_bytes: int = FP32, weight_decay: bool = False) -> list:
    """The "optimizer temporaries" (moments.Alive entries) of what `optimizer` ("adamw", "momentum", "sgd") run by
    `impl` allocates at its peak inside `step()` beyond weights, gradients and
    state, over param groups of `groups` element counts in tensors of
    `state_bytes` each (the optimizer's math runs in the parameters' dtype).
    `weight_decay`: SGD's coupled decay (AdamW's is in place either way)."""
    if impl not in IMPLS:
        raise ValueError(f"optimizer implementation {impl!r} is unknown; allowed: "
                         f"{', '.join(IMPLS)}.")
    largest_tensor = max((n for g in groups for n in g), default=0)
    largest_group = max((sum(g) for g in groups), default=0)
    if impl == "fused":
        return []
    if optimizer == "adamw":
        if impl == "for-loop":
            return [_temporary("AdamW for-loop: exp_avg_sq.sqrt() and its quotient by the bias "
                     "correction, beside the previous parameter's quotient",
                     max(map(_denominators_peak, groups), default=0) * state_bytes)]
        return [_temporary("AdamW foreach: torch._foreach_sqrt(exp_avg_sq) over the largest param "
                 "group", largest_group * state_bytes)]
    if optimizer not in ("sgd", "momentum"):
        raise ValueError(f"optimizer {optimizer!r} is unknown; allowed: adamw, momentum, sgd.")
    if not weight_decay:
        return []
    if impl == "for-loop":
        return [_temporary("SGD for-loop: grad.add(param, alpha=weight_decay) for the largest "
                 "parameter", largest_tensor * state_bytes)]
    return [_temporary("SGD foreach: torch._foreach_add(grads, params) over the largest param group",
             largest_group * state_bytes)]


def _temporary(what: str, size: int) -> Alive:
    return Alive("optimizer temporaries", what, size)


def _denominators_peak(numels: list[int]) -> int:
    """Elements alive at once in `_single_tensor_adam`'s loop over one group: the
    previous parameter's `denom`, and this one's sqrt and quotient."""
    return max((previous + 2 * n for previous, n in zip([0, *numels], numels)), default=0)


# ---------------------------------------------------- the end of the backward
def backward_end_terms(numels: list[int], grad_bytes: int, embedding: int, tied: bool,
                       later_micro_batch: bool, autocast: bool) -> list:
    """The gradients alive (moments.Alive entries) when the backward's last gradient,
    the token embedding's (`embedding` elements), is accumulated: every other
    parameter's gradient (or, in a later micro-batch, every gradient of the
    earlier ones), the embedding's new gradient, and for a tied head the head's
    contribution and, in fp32, their out-of-place sum (see the module's doc)."""
    total = sum(numels)
    if later_micro_batch:
        terms = [Alive("gradients of earlier micro-batches",
                       "gradients of earlier micro-batches", total * grad_bytes)]
    else:
        terms = [Alive("gradients", "gradients of every other parameter",
                       (total - embedding) * grad_bytes)]
    one = embedding * grad_bytes

    def last(what: str) -> Alive:
        return Alive("backward's last gradients", what, one)
    if not tied:
        return terms + [last("the token embedding's new gradient (added in place next)"
                             if later_micro_batch else "the token embedding's gradient")]
    terms += [last("tied weight: the head's gradient contribution"),
              last("tied weight: the embedding's gradient contribution")]
    if not autocast:  # the head's contribution is a transposed view: no in-place sum
        terms.append(last("tied weight: the two contributions' out-of-place sum"))
    return terms
