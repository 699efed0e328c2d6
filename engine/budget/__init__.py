"""The training-step budget: parameters, FLOPs and bytes of one optimizer step.

Pure functions over one frozen `BudgetConfig`. The command line
(`python -m engine.budget`), the widget (`widgets.BudgetWidget`), the tests
and the lessons all call `budget(config)`, so they all read the same numbers.

What one training step costs
----------------------------
FLOPs. A matmul with a (K, M) weight costs 2*K*M FLOPs per token (a
multiply-add is two), so the forward pass costs 2 FLOPs per weight per token,
plus the attention term that has no weights: Q @ K^T and P @ V each cost
2*N*d per token and layer (the full N x N score matrix, as our engine
computes it). The backward pass runs two matmuls for every forward one
(dX = dY W^T and dW = X^T dY), so it costs 2x the forward. Recompute adds
forward work inside the backward: a whole forward with full recompute, the
attention core with selective recompute.

Memory. Three kinds of bytes live through a step:
  * fixed, set by the parameter count P: weights, fp32 master weights (only
    with 16-bit storage), gradients, optimizer state (SGD none, momentum one
    fp32 buffer, AdamW two). Mixed-precision AdamW: 2 + 2 + 4 + 4 + 4 = 16
    bytes per parameter;
  * activations, set by the batch shape: every tensor the backward pass will
    read, kept from the op that made it until that op's VJP runs;
  * small working buffers (the gradient flowing back, one op at a time),
    which we leave out except where the engine measures them.

The peak of a step, and what is resident when:
  1. before the forward: weights, master weights, optimizer state, and the
     gradient buffer (allocated once and accumulated into across the K
     micro-batches, then consumed by the optimizer);
  2. during the forward the saved activations pile up; they are all alive
     when the loss is computed;
  3. the backward walks the tape in reverse and frees each op's saved
     tensors as its VJP runs, while parameter gradients are summed into the
     gradient buffer; with recompute, the head and loss are freed first,
     then one block's (or one attention core's) insides are rebuilt and
     live for a moment on top of what the blocks kept;
  4. the optimizer reads the gradients and updates weights and state.
So the peak is reached at the end of the forward (without recompute) or
while the last block is rebuilt (with it):
    peak = weights + master + gradients + optimizer state + activation peak
    activation peak = saved - freed_first + max(freed_first, one rebuilt block)
(`Activations`; without recompute it is simply what the forward saved).
Accumulating K micro-batches adds tokens per step but not memory: the
activations of one micro-batch are freed before the next begins.

Three models of the activation bytes
------------------------------------
  "rule"        the source texts' rule of thumb: k saved tensors of
                B x N x d per layer. k=4 gives the 7B example's 17 GB,
                k=16 the 24-layer example's 12.9 GB.
  "transformer" a per-op count for a GPT block (see `transformer_layer_ops`)
                that agrees with Korthikanti et al. 2022, "Reducing
                Activation Recomputation in Large Transformer Models": per
                layer s*b*h*(34 + 5*a*s/h) bytes at 16-bit with dropout,
                34*s*b*h with selective recompute, 2*s*b*h with full recompute.
  "engine"      exactly what our tape engine saves for its reference GPT
                (`engine.nn.GPT`), tensor by tensor; `engine.memory` measures
                the same number.

Units: sizes are printed in decimal units (1 MB = 10^6 bytes, 1 GB = 10^9
bytes), FLOPs in G (10^9) and T (10^12), as the source texts do.

Beyond one device
-----------------
Data parallel over N devices with ZeRO stage 0-3 (`sharding`): each device
runs its own micro-batches, so activations stay per device, while the fixed
memory is split N ways item by item (stage 1 the optimizer state with the
master weights, 2 the gradients too, 3 the weights too); the collectives of
a step are counted in bytes. A device (`devices`: data-sheet presets, or
"this machine" measured by an sgemm timing) gives its memory and FLOP/s:
the budget says whether one device's peak fits, the largest micro-batch
that does, and a step time at a stated model FLOP utilization (`fit`).

Architectures: GPT-2 blocks and LLaMA blocks (RMSNorm, SwiGLU, no biases,
grouped-query attention), with presets of both families (the open models
practitioners fine-tune among them) and a reader for Hugging Face config.json
files (`hf`).

Fine-tuning: under the `hf` step, `lora_rank` freezes the model and trains
peft's LoRA adapters on `lora_targets` (`lora`): weights stay, gradients and
optimizer state shrink to the adapters', and the activations change by what
autograd no longer keeps (frozen layers' inputs) and what the adapters add
(their low-rank outputs, `lora_dropout`'s copies and masks); `qlora` stores the
blocks' linear weights in bitsandbytes' 4-bit NF4, `dora` adds DoRA's magnitudes,
`modules_to_save` trains whole modules beside the adapters (`recipes`).

Modules: config (BudgetConfig, presets), counts (parameters, FLOPs, fixed
memory), kept (Saved, Activations), activations (the rule, transformer and
engine activation models),
real_step (a real PyTorch or transformers step: what it keeps, its peak's
moment), recipes (fine-tuning recipes as rewriters of that step: lora, dora, qlora,
trained_modules), torch_step (that step measured in PyTorch; optional, imported on
use), measure (the tape's measured bytes), sharding (ZeRO, collectives), devices (device figures),
fit (fits, largest micro-batch, step time), hf (config.json), total (the
Budget and its sweeps), report (units, text), cli (`python -m engine.budget`).
"""
from __future__ import annotations

from .knobs import (KNOBS, Knob, OPTIMIZER_IMPLS, OUTPUTS, BACKENDS, knob, shown_on)
from .frameworks import FRAMEWORKS, Framework
from .config import (PRECISIONS, OPTIMIZERS, ACTIVATION_MODELS, REAL_STEP_MODELS, ATTENTIONS,
                     RECOMPUTE, ARCHITECTURES,
                     GRAD_PRECISIONS, ZERO_STAGES, STORAGE_BYTES,
                     MASTER_BYTES, OPTIMIZER_BUFFERS, OPTIMIZER_STATE_BYTES, MASK_BYTES,
                     LOGITS_BYTES, BudgetError, BudgetConfig, corpus_vocab_size, PRESET_NAMES,
                     preset)
from .counts import (parameter_breakdown, parameter_count, matmul_weights,
                     attention_flops_per_token, forward_flops_per_token,
                     recompute_flops_per_token, tokens_per_micro_batch, tokens_per_step, flops,
                     bytes_per_parameter, fixed_bytes, trainable_parameter_count)
from .activations import (Saved, activation_bytes_per_element, tensor_bytes,
                          transformer_layer_ops, ATTENTION_CORE, transformer_outside_ops,
                          korthikanti_layer_bytes, Activations, activations, INDEX_BYTES,
                          engine_block_saved, engine_outside_saved, engine_saved_tensors,
                          engine_activations, llama_layer_ops, layer_ops)
from .devices import Device, DEVICES, THIS_MACHINE, device_figures, find_device, sgemm_flops, this_machine
from .sharding import SHARDED, per_device_fixed, communication
from .fit import DeviceFit, largest_micro_batch
from .hf import read_hf_config, config_from_hf
from .measure import (MEASURE_MAX_ACTIVATION_BYTES, MEASURE_MAX_FLOPS, MEASURE_MAX_WEIGHT_BYTES,
                      measurable, measure)
from .total import (Budget, budget, crossover_batch, batch_sweep, recompute_tradeoff)
from .report import (human_bytes, human_flops, describe, describe_breakdown, human_count,
                     human_device_memory, human_seconds)
from .moments import STEP_TERMS, Moment, StepMoments, StepTerm, peak
from .framework_step import framework_step, real_step_activations
from .cli import (config_from_args, main)

__all__ = ['KNOBS', 'Knob', 'OPTIMIZER_IMPLS', 'OUTPUTS', 'BACKENDS', 'knob', 'shown_on',
           'FRAMEWORKS', 'Framework', 'PRECISIONS', 'OPTIMIZERS', 'ACTIVATION_MODELS', 'REAL_STEP_MODELS', 'ATTENTIONS',
           'RECOMPUTE', 'STORAGE_BYTES',
           'MASTER_BYTES', 'OPTIMIZER_BUFFERS', 'OPTIMIZER_STATE_BYTES', 'MASK_BYTES',
           'LOGITS_BYTES', 'BudgetError', 'BudgetConfig', 'corpus_vocab_size', 'PRESET_NAMES',
           'preset', 'parameter_breakdown', 'parameter_count', 'matmul_weights',
           'attention_flops_per_token', 'forward_flops_per_token', 'recompute_flops_per_token',
           'tokens_per_micro_batch', 'tokens_per_step', 'flops', 'bytes_per_parameter',
           'fixed_bytes', 'trainable_parameter_count', 'Saved', 'activation_bytes_per_element', 'tensor_bytes',
           'transformer_layer_ops', 'ATTENTION_CORE', 'transformer_outside_ops',
           'korthikanti_layer_bytes', 'Activations', 'activations', 'INDEX_BYTES',
           'engine_block_saved', 'engine_outside_saved', 'engine_saved_tensors',
           'engine_activations', 'MEASURE_MAX_ACTIVATION_BYTES', 'MEASURE_MAX_FLOPS',
           'MEASURE_MAX_WEIGHT_BYTES',
           'measurable', 'measure', 'Budget', 'budget', 'crossover_batch', 'batch_sweep',
           'recompute_tradeoff', 'human_bytes', 'human_flops', 'describe', 'human_count',
           'config_from_args', 'main', 'ARCHITECTURES', 'GRAD_PRECISIONS', 'ZERO_STAGES',
           'llama_layer_ops', 'layer_ops', 'Device', 'DEVICES', 'THIS_MACHINE', 'find_device',
           'device_figures', 'sgemm_flops', 'this_machine', 'SHARDED', 'per_device_fixed',
           'communication', 'DeviceFit', 'largest_micro_batch', 'read_hf_config',
           'config_from_hf', 'human_seconds', 'describe_breakdown', 'human_device_memory', 'Moment', 'StepMoments',
           'STEP_TERMS', 'StepTerm', 'peak', 'framework_step', 'real_step_activations']
