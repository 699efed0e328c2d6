"""The training-step budget: parameters, FLOPs and bytes of one optimizer step.

Pure functions over one frozen `BudgetConfig`. The command line
(`python -m engine.budget`), the widget (`widgets.BudgetWidget`), the page
(`widgets.budget_page`), the tests and the lessons all call `budget(config)`,
so they all read the same numbers. The files, shelf by shelf:

Settings: what a budget is asked (they import no step model)
  knobs.py             the table of knobs: name, type, choices or bounds, default, help
  compat.py            which knob applies under which model or recipe, and why
  frameworks.py        whose loop the step follows, and the defaults it brings
  devices.py           accelerators' memory and FLOP/s, and this machine measured
  linears.py           a block's linear layers as peft names them; which a target list picks
  config.py            BudgetConfig, the presets, the byte sizes of each precision
  hf.py                a model's shape and switches from a Hugging Face config.json
  hub.py               that config.json from the Hugging Face Hub, by the model's id

Models: what a step costs
  counts.py            parameters, FLOPs and the fixed memory
  kept.py              one saved tensor (`Saved`), one micro-batch's activations
  activations.py       the activation models: rule, transformer, engine, pytorch, hf
  moments.py           the step as moments: the table of step terms, one peak rule
  real_step.py         what a real PyTorch or transformers model keeps, op by op
  backends.py          where a real step runs, and what that changes in what it keeps
  gemma.py             Gemma, Gemma 2 and Gemma 3's traits in that step
  weights_dtype.py     a model loaded in bf16: its weights as 16-bit leaves
  optimizer_step.py    what the optimizer's step and the end of the backward allocate
  block_backward.py    one block's backward walked op by op: the most it holds
  framework_step.py    a real framework's step as moments: model, loop and optimizer
  recipe.py            what a fine-tuning recipe is: its rewriters, the rows they rewrite
  recipes.py           the fine-tuning recipes' registry: rewriters of the base rows
  lora.py              LoRA's adapters over the frozen model
  dora.py              DoRA's magnitudes over LoRA's adapters
  qlora.py             QLoRA: the frozen linear weights in 4-bit NF4
  trained_modules.py   peft's modules_to_save: whole modules trained beside the adapters
  sharding.py          data parallelism with ZeRO 0-3: what a device holds, what it sends
  fit.py               whether a step fits a device; largest batch, fewest devices, time
  plan.py              the settings that fit a device, fastest first (`--plan`)
  total.py             the whole budget of a step (`Budget`, `budget`) and its sweeps
  report.py            units, and the budget as text
  cli.py               the command line (`python -m engine.budget --help`)
  __main__.py          runs the command line
  __init__.py          this index, and the names the package exports

Lab: running a step to measure it (not exported here; `engine.budget.lab`)
  lab/__init__.py      the lab's names: measure, measurable, measure_step
  lab/measure.py       our tape engine's step under `engine.memory`, beside the prediction
  lab/torch_step.py    a real step measured in PyTorch, on the CPU or CUDA
  lab/recipe_models.py the recipes' models as peft and bitsandbytes build them

What the budget assumes is said where it is modelled, in each module's own
docstring: the FLOPs and fixed memory in counts.py, what is resident when in
total.py, the activation models in activations.py and real_step.py, each recipe in
its module, ZeRO in sharding.py, the fit and step time in fit.py. The steps measured
on a GPU are in engine/budget/measured/.
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
           'engine_activations', 'Budget', 'budget', 'crossover_batch', 'batch_sweep',
           'recompute_tradeoff', 'human_bytes', 'human_flops', 'describe', 'human_count',
           'config_from_args', 'main', 'ARCHITECTURES', 'GRAD_PRECISIONS', 'ZERO_STAGES',
           'llama_layer_ops', 'layer_ops', 'Device', 'DEVICES', 'THIS_MACHINE', 'find_device',
           'device_figures', 'sgemm_flops', 'this_machine', 'SHARDED', 'per_device_fixed',
           'communication', 'DeviceFit', 'largest_micro_batch', 'read_hf_config',
           'config_from_hf', 'human_seconds', 'describe_breakdown', 'human_device_memory', 'Moment', 'StepMoments',
           'STEP_TERMS', 'StepTerm', 'peak', 'framework_step', 'real_step_activations']
