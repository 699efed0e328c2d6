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
Their optimizer moment is therefore the same in step 1 and step 2; only the moments
before the first `step()` run without the state. Adafactor and 8-bit AdamW make each
tensor's state as they first visit it, so their step 1 holds only the state made so
far beside each tensor's temporaries (`first_step_state_and_temporaries`).

Adafactor and 8-bit AdamW
-------------------------
transformers' Adafactor (`optim="adafactor"`: `scale_parameter=False,
relative_step=False`, the learning rate given, no first moment) and bitsandbytes'
8-bit AdamW (`bnb.optim.AdamW8bit`, the Trainer's `adamw_bnb_8bit`) visit one tensor
at a time, with state shaped by each tensor: `optimizer_state_bytes`,
`adafactor_temporaries` and `adamw_8bit_temporaries` follow their code, confirmed on
the CPU allocator (`tests/test_budget_recipes_step.py`). bitsandbytes runs its 8-bit
step on the CPU through a PyTorch fallback; its CUDA kernel updates the 8-bit state in
place, which this machine cannot show (a stated assumption).

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

import functools
from dataclasses import dataclass

from . import recipes
from .gemma import norms_around
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
    count, whether transformers' Trainer puts it in the weight-decay group
    (every tensor but biases and norm gains: `Trainer.get_decay_parameter_names`),
    and a matrix's rows plus columns (0 for a vector): what Adafactor's factored
    second moment keeps. `itemsize`: the bytes of its own dtype, where it is stored
    and trained in one the recipe's other trained tensors are not (peft's copy of a
    module of a model loaded in bf16 stays bf16 beside the fp32 adapters); 0 for the
    recipe's."""
    name: str
    numel: int
    decays: bool
    rows_and_columns: int = 0
    itemsize: int = 0

    def bytes_in(self, itemsize: int) -> int:
        """Bytes of a tensor like it (its gradient, an AdamW state) in its own dtype,
        or else in `itemsize` bytes an element."""
        return self.numel * (self.itemsize or itemsize)

    @functools.cached_property
    def block(self) -> int | None:
        """The index of the block it belongs to; None outside the blocks."""
        unit = block_of(self.name)
        return None if unit is None else int(unit.split(".")[1])


def block_of(name: str) -> str | None:
    """The block a parameter belongs to ("h.3", "layers.3"), None for the root's."""
    parts = name.split(".")
    if len(parts) > 2 and parts[0] in ("h", "layers") and parts[1].isdigit():
        return ".".join(parts[:2])
    return None


def gradients_before_block(tensors: list[ParamTensor], block: int, tied: bool,
                           grad_bytes: int) -> int:
    """Bytes of the gradients (`grad_bytes` an element, or a tensor's own dtype's) that
    exist when block `block`'s backward starts, in one micro-batch with nothing
    accumulated: the later blocks' and those of what follows the blocks (the final
    norm, an untied head, a tied head's contribution to the embedding). The
    embeddings' come last. `tensors` are in `trainable_tensors`' order: the embeddings
    first, the blocks, then what follows them."""
    first_block = next((k for k, t in enumerate(tensors) if t.block is not None),
                       len(tensors))
    return sum(t.numel * (t.itemsize or grad_bytes) for k, t in enumerate(tensors)
               if (t.block is not None and t.block > block)
               or (t.block is None and k > first_block) or (k == 0 and tied))


def _matrix(name: str, rows: int, columns: int) -> ParamTensor:
    """A weight matrix (in the decay group)."""
    return ParamTensor(name, rows * columns, True, rows + columns)


def _gpt2_tensors(cfg) -> list[ParamTensor]:
    C, f, V = cfg.d_model, cfg.ffn, cfg.vocab_size
    out = [_matrix("wte.weight", V, C), _matrix("wpe.weight", cfg.positions, C)]
    for i in range(cfg.n_layer):
        for name, shape in (
                ("ln_1.weight", C), ("ln_1.bias", C),
                ("attn.c_attn.weight", (C, 3 * C)), ("attn.c_attn.bias", 3 * C),
                ("attn.c_proj.weight", (C, C)), ("attn.c_proj.bias", C),
                ("ln_2.weight", C), ("ln_2.bias", C),
                ("mlp.c_fc.weight", (C, f)), ("mlp.c_fc.bias", f),
                ("mlp.c_proj.weight", (f, C)), ("mlp.c_proj.bias", C)):
            out.append(_matrix(f"h.{i}.{name}", *shape) if isinstance(shape, tuple)
                       else ParamTensor(f"h.{i}.{name}", shape, False))
    out += [ParamTensor("ln_f.weight", C, False), ParamTensor("ln_f.bias", C, False)]
    return out


def _llama_tensors(cfg) -> list[ParamTensor]:
    C, f, q = cfg.d_model, cfg.ffn, cfg.q_width
    kv = cfg.kv_heads * cfg.head_dim
    out = [_matrix("embed_tokens.weight", cfg.vocab_size, C)]
    for i in range(cfg.n_layer):
        for name, shape in (
                ("input_layernorm.weight", C),
                ("self_attn.q_proj.weight", (q, C)), ("self_attn.k_proj.weight", (kv, C)),
                ("self_attn.v_proj.weight", (kv, C)), ("self_attn.o_proj.weight", (C, q)),
                ("post_attention_layernorm.weight", C),
                ("mlp.gate_proj.weight", (f, C)), ("mlp.up_proj.weight", (f, C)),
                ("mlp.down_proj.weight", (C, f))):
            out.append(_matrix(f"layers.{i}.{name}", *shape) if isinstance(shape, tuple)
                       else ParamTensor(f"layers.{i}.{name}", shape, False))
        out += _llama_traits(cfg, f"layers.{i}.self_attn.", q, kv)
    out.append(ParamTensor("norm.weight", C, False))
    return out


def _llama_traits(cfg, prefix: str, q: int, kv: int) -> list[ParamTensor]:
    """Qwen2's q/k/v biases, LlamaConfig's attention and MLP biases and Qwen3's
    per-head q/k norm gains (no weight decay)."""
    out = []
    if getattr(cfg, "qkv_bias", False) or getattr(cfg, "attention_bias", False):
        out += [ParamTensor(prefix + "q_proj.bias", q, False),
                ParamTensor(prefix + "k_proj.bias", kv, False),
                ParamTensor(prefix + "v_proj.bias", kv, False)]
    if getattr(cfg, "attention_bias", False):
        out.append(ParamTensor(prefix + "o_proj.bias", cfg.d_model, False))
    if getattr(cfg, "mlp_bias", False):
        mlp = prefix.replace("self_attn.", "mlp.")
        out += [ParamTensor(mlp + "gate_proj.bias", cfg.ffn, False),
                ParamTensor(mlp + "up_proj.bias", cfg.ffn, False),
                ParamTensor(mlp + "down_proj.bias", cfg.d_model, False)]
    if norms_around(cfg):  # Gemma 2 and 3
        layer = prefix.replace("self_attn.", "")
        out += [ParamTensor(layer + f"{where}_feedforward_layernorm.weight", cfg.d_model, False)
                for where in ("pre", "post")]
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
        tensors.append(_matrix("lm_head.weight", cfg.vocab_size, cfg.d_model))
    return tensors


def trainable_tensors(cfg) -> list[ParamTensor]:
    """The tensors the optimizer updates, the last of the backward's gradients
    first: `parameter_tensors` as the fine-tuning recipes rewrite them (`recipes`:
    LoRA's adapters instead, DoRA's magnitudes beside them, trained modules)."""
    return list(_trainable_tensors(cfg.one_shape()))


@functools.lru_cache(maxsize=256)
def _trainable_tensors(shape) -> tuple[ParamTensor, ...]:
    return tuple(recipes.tensors(shape, parameter_tensors(shape), ParamTensor))


def clear_caches() -> None:
    """Forget every shape's tensors (a benchmark's uncached run starts here)."""
    _trainable_tensors.cache_clear()


def grouped_tensors(cfg, tensors: list[ParamTensor]) -> list[list[ParamTensor]]:
    """The param groups of the optimizer `cfg`'s framework builds, in the order the
    optimizer visits them: transformers' Trainer two (`Trainer.create_optimizer`: the
    decay group, then biases and norms with weight_decay 0.0), `torch.optim.AdamW(
    model.parameters())` one."""
    if cfg.activation_model == "hf":
        return [[t for t in tensors if t.decays], [t for t in tensors if not t.decays]]
    return [list(tensors)]


def param_groups(cfg, tensors: list[ParamTensor], state_bytes: int = FP32) -> list[list[int]]:
    """The element counts of each param group (`grouped_tensors`), in elements of
    `state_bytes`: a tensor in a dtype of its own counts as many of them as its bytes
    fill (the optimizer's elementwise math on it makes as many bytes)."""
    return [[t.numel * t.itemsize // state_bytes if t.itemsize else t.numel for t in group]
            for group in grouped_tensors(cfg, tensors)]


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


# ------------------------------------ Adafactor and 8-bit AdamW, tensor by tensor
ADAFACTOR_TRAINER_ARGS = dict(scale_parameter=False, relative_step=False)  # and lr
MIN_8BIT_SIZE = 4096   # bitsandbytes' min_8bit_size: smaller tensors keep fp32 state
BLOCK_8BIT = 256       # its blockwise quantization: one fp32 absmax per block and state
QMAP_BYTES = 2 * 256 * FP32  # the signed and unsigned dynamic maps, shared by every tensor


def _blocks(numel: int) -> int:
    return -(-numel // BLOCK_8BIT)


def optimizer_state_bytes(cfg) -> int | None:
    """The state of the optimizers counted tensor by tensor (None for the others,
    whose state is a number of bytes per parameter).

    transformers' Adafactor (`optimization.Adafactor`, beta1=None as the Trainer
    leaves it: no first moment) keeps, per tensor, a matrix's second moment
    factored into a row vector and a column vector (`exp_avg_sq_row`,
    `exp_avg_sq_col`), a vector's in full (`exp_avg_sq`), and the parameter's RMS
    as a 0-dim fp32 tensor (`state["RMS"] = self._rms(p)`), all fp32.

    bitsandbytes' 8-bit AdamW (`Optimizer2State.init_state`) keeps a tensor of
    `min_8bit_size` (4096) elements or more as two uint8 states and one fp32 absmax
    per block of 256 for each (`absmax1`, `absmax2`), beside the two 256-entry
    dynamic maps every tensor shares (`name2qmap`); a smaller tensor two fp32
    states, as 32-bit AdamW."""
    if cfg.optimizer not in ("adafactor", "adamw-8bit"):
        return None
    return sum(_state_made(cfg, trainable_tensors(cfg)))


def _state_made(cfg, tensors: list[ParamTensor]) -> list[int]:
    """The state bytes Adafactor or 8-bit AdamW makes for each of `tensors` as it first
    visits it (`optimizer_state_bytes`); the 8-bit maps with the first 8-bit tensor."""
    if cfg.optimizer == "adafactor":
        return [(t.rows_and_columns or t.numel) * (t.itemsize or FP32) + FP32 for t in tensors]
    made, maps = [], QMAP_BYTES
    for t in tensors:
        if t.numel < MIN_8BIT_SIZE:
            made.append(2 * FP32 * t.numel)
        else:
            made.append(2 * t.numel + 2 * FP32 * _blocks(t.numel) + maps)
            maps = 0
    return made


def adafactor_temporaries(tensors: list[ParamTensor]) -> list:
    """What `Adafactor.step()` allocates at its largest, over fp32 tensors visited in
    `tensors`' order. Per tensor of n elements: `update = (grad**2) + eps` holds
    grad**2 and the sum at once while the local `update` still holds the previous
    tensor's (rebound only after the sum): the previous n plus 2n. A matrix then
    builds `torch.mul(r_factor, c_factor)` (a new n beside the old update and the
    row and column factors, `rsqrt` of a quotient and of the column vector), a vector
    `exp_avg_sq.rsqrt()` (n beside n), and both apply `p.add_(-update)` (n beside n).
    The RMS clipping (`update.div_`, `update.mul_(lr)`) is in place."""
    return _largest(_adafactor_each(tensors))


def _adafactor_each(tensors: list[ParamTensor]) -> list[tuple[int, str]]:
    """(bytes, what) at the largest while each tensor is updated (see above)."""
    each, previous = [], 0
    for t in tensors:
        each.append(max(
            (previous + 2 * t.numel, "(grad**2) + eps beside the previous tensor's update"),
            (2 * t.numel + t.rows_and_columns, "the approximated rsqrt (row and column "
             "factors) beside the update" if t.rows_and_columns
             else "exp_avg_sq.rsqrt() beside the update"), key=lambda x: x[0]))
        previous = t.numel
    return [(size * FP32, f"Adafactor: {what}") for size, what in each]


def _largest(each: list[tuple[int, str]]) -> list:
    """The largest of the per-tensor temporaries, as the step's term (the first of
    equals)."""
    size, what = max(each, key=lambda x: x[0], default=(0, ""))
    return [_temporary(what, size)] if size else []


def adamw_8bit_temporaries(tensors: list[ParamTensor], device: str) -> list:
    """What bitsandbytes' 8-bit AdamW allocates at its largest inside `step()`, one
    tensor at a time. On CUDA one fused kernel updates the uint8 states in place
    (`optimizer_update_8bit_blockwise`; not measured here: a stated assumption,
    nothing). On the CPU its PyTorch fallback (`backends/cpu/ops.py`,
    `_optimizer_update_8bit_blockwise_cpu`) dequantizes both states to fp32, copies
    the gradient (`g.float() * gnorm_scale`) and builds
    `denom = (state2_fp32.sqrt() / correction2)`: five fp32 tensors of n at once.
    A 32-bit tensor (below min_8bit_size) holds the gradient's copy, `state2.sqrt()`
    and its sum with eps: three."""
    if device != "cpu":
        return []
    return _largest(_adamw_8bit_each(tensors))


def _adamw_8bit_each(tensors: list[ParamTensor]) -> list[tuple[int, str]]:
    """(bytes, what) while each tensor is updated on the CPU (see above)."""
    return [(5 * t.numel * FP32, "8-bit AdamW on the CPU: both states dequantized to fp32, "
             "the gradient's copy, sqrt and its quotient") if t.numel >= MIN_8BIT_SIZE
            else (3 * t.numel * FP32, "8-bit AdamW on the CPU, a 32-bit tensor: the "
                  "gradient's copy, sqrt and its sum with eps") for t in tensors]


def first_step_state_and_temporaries(cfg, tensors: list[ParamTensor],
                                     device: str) -> tuple[int, int, list] | None:
    """Step 1 of an optimizer that makes each tensor's state as it first visits it
    (Adafactor's and bitsandbytes' `step()`: `if len(state) == 0: init` inside the
    loop over the parameters, where torch's AdamW makes every state before any
    update): the largest, over the tensors in the order visited, of the state made so
    far and that tensor's temporaries, as (state bytes made by then, the whole state's
    bytes, the temporaries' terms). None for the optimizers whose step 1 holds its
    whole state throughout."""
    if cfg.optimizer not in ("adafactor", "adamw-8bit"):
        return None
    visited = [t for group in grouped_tensors(cfg, tensors) for t in group]
    each = (_adafactor_each(visited) if cfg.optimizer == "adafactor"
            else _adamw_8bit_each(visited) if device == "cpu" else [(0, "")] * len(visited))
    made, best = 0, (-1, 0, [])
    for state, (size, what) in zip(_state_made(cfg, visited), each):
        made += state
        if made + size > best[0]:
            best = (made + size, made, [_temporary(what, size)] if size else [])
    return best[1], made, best[2]


def step_temporaries(cfg, tensors: list[ParamTensor], impl: str, device: str,
                     state_bytes: int = FP32) -> list:
    """The optimizer temporaries of `cfg`'s step over its trainable `tensors`."""
    if cfg.optimizer == "adafactor":
        return adafactor_temporaries([t for g in grouped_tensors(cfg, tensors) for t in g])
    if cfg.optimizer == "adamw-8bit":
        return adamw_8bit_temporaries(tensors, device)
    return optimizer_temporaries(cfg.optimizer, impl, param_groups(cfg, tensors, state_bytes),
                                 state_bytes)


# ---------------------------------------------------- the end of the backward
def backward_end_terms(total: int, one: int, tied: bool, later_micro_batch: bool,
                       autocast: bool) -> list:
    """The gradients alive (moments.Alive entries) when the backward's last gradient,
    the token embedding's (`one` bytes of the gradients' `total`), is accumulated:
    every other parameter's gradient (or, in a later micro-batch, every gradient of the
    earlier ones), the embedding's new gradient, and for a tied head the head's
    contribution and, in fp32, their out-of-place sum (see the module's doc)."""
    if later_micro_batch:
        terms = [Alive("gradients of earlier micro-batches",
                       "gradients of earlier micro-batches", total)]
    else:
        terms = [Alive("gradients", "gradients of every other parameter", total - one)]

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
