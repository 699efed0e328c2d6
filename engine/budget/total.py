"""The whole budget of a training step, and the sweeps built on it.

Three kinds of bytes live through a step: the fixed memory (`counts`: weights,
master weights, gradients, optimizer state), the activations (every tensor the
backward will read, kept from the op that made it until that op's VJP runs:
`activations`), and working buffers. The textbook models (rule, transformer,
engine) leave the working buffers out; a real framework's step counts the ones its
loop and its optimizer allocate (`framework_step`, `optimizer_step`).

In the textbook models, what is resident when:
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
So the peak is reached at the end of the forward (without recompute) or while
the last block is rebuilt (with it): the fixed memory plus the activation peak
(`kept.Activations`), and accumulating K micro-batches adds tokens per step but
not memory. A real step follows its own moments (`moments`, `framework_step`):
its gradients appear during the first backward, its optimizer state in the first
`step()`, and a later micro-batch's forward runs beside the gradients of the
earlier ones.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from .config import BudgetConfig, BudgetError
from .counts import fixed_bytes, fixed_bytes_per_parameter, fixed_bytes_per_parameter_by_buffer, flops, parameter_breakdown, parameter_count, tokens_per_micro_batch, tokens_per_step, trainable_parameter_count
from .activations import Activations, activations, tensor_bytes
from .devices import device_figures, find_device
from .fit import DeviceFit, device_fit
from .frameworks import FRAMEWORKS, resolved_optimizer_impl, resolved_outputs
from .moments import REBUILT, SAVED_ALL
from .sharding import communication, engine_name, per_device_fixed, shards_gradients


# --------------------------------------------------------------- the budget
@dataclass(frozen=True)
class Budget:
    """Everything one training step costs, in integers (FLOPs and bytes).

    `fixed` is the whole model's fixed memory; `fixed_per_device` what one of
    `config.devices` holds under its ZeRO stage (the same on one device).
    `flops` are per device (each runs its own micro-batches). `peak` and
    `memory()` are one device's."""
    config: BudgetConfig
    parameters: int
    parameter_breakdown: dict
    flops: dict
    fixed: dict
    activations: Activations
    one_tensor_bytes: int
    fixed_per_device: dict = None
    communication: tuple = ()
    device: DeviceFit | None = None

    def __post_init__(self):
        if self.fixed_per_device is None:
            object.__setattr__(self, "fixed_per_device", dict(self.fixed))

    @property
    def fixed_total(self) -> int:
        """Fixed bytes of one device (the whole model's on one device)."""
        return sum(self.fixed_per_device.values())

    @property
    def real_step(self) -> bool:
        """Whether the step follows a real framework's code (its moments, step 1)."""
        return FRAMEWORKS[self.config.activation_model].real_step

    @property
    def peak(self) -> int:
        """The largest moment of the step (moments.peak), one device's."""
        return self.activations.step.peak_moment.bytes

    @property
    def tokens_per_step_all_devices(self) -> int:
        return self.config.devices * tokens_per_step(self.config)

    @property
    def peak_first_step(self) -> int:
        """The first step's peak: a real step's optimizer state is created at its
        first `step()`; the other models keep everything resident throughout."""
        return self.activations.step.first_step_peak_moment.bytes

    def memory(self) -> dict[str, int]:
        """One device's categories of the stacked bar, in the order they are
        resident: what is alive at the peak's moment (moments.STEP_TERMS)."""
        parts = self.activations.step.peak_moment.by_category()
        if self.activations.step.peak_moment.name in (SAVED_ALL, REBUILT):
            return {k: v for k, v in parts.items() if k != "step transient"}
        return {k: v for k, v in parts.items() if k != "recompute transient"}

    def loop(self) -> dict | None:
        """A real step's loop: the optimizer's implementation, whether the loop keeps
        the model's output, and where each choice came from."""
        if not self.real_step:
            return None
        impl, impl_from = resolved_optimizer_impl(self.config)
        outputs, outputs_from = resolved_outputs(self.config)
        return {"optimizer_impl": impl, "optimizer_impl_from": impl_from,
                "outputs": outputs, "outputs_from": outputs_from,
                "padded_batch": self.config.padded_batch, "backend": self.config.backend}

    def as_dict(self) -> dict:
        cfg = asdict(self.config)
        return {
            "config": cfg,
            "parameters": self.parameters,
            "trainable_parameters": trainable_parameter_count(self.config),
            "parameter_breakdown": self.parameter_breakdown,
            "tokens": {"per_micro_batch": tokens_per_micro_batch(self.config),
                       "per_step": tokens_per_step(self.config)},
            "flops": self.flops,
            "bytes_per_parameter": fixed_bytes_per_parameter_by_buffer(self.config),
            "fixed_bytes_per_parameter": fixed_bytes_per_parameter(self.config),
            "memory": {**self.memory(), "activations": self.activations.saved,
                       "fixed_total": self.fixed_total,
                       "activations_peak": self.activations.peak, "peak": self.peak,
                       "peak_first_step": self.peak_first_step,
                       "peak_moment": _moment(self.activations.step, "peak_moment"),
                       "peak_first_step_moment": _moment(self.activations.step,
                                                         "first_step_peak_moment")},
            "loop": self.loop(),
            "model_fixed": self.fixed,
            "data_parallel": {"devices": self.config.devices, "zero": self.config.zero,
                              "gradients_as": (engine_name(self.config)
                                               if self.real_step
                                               and shards_gradients(self.config) else None),
                              "tokens_per_step_all_devices":
                                  self.tokens_per_step_all_devices,
                              "communication": list(self.communication)},
            "device": _finite(asdict(self.device)) if self.device else None,
            "one_tensor_bytes": self.one_tensor_bytes,
            "activation_items": [{**asdict(x), "bytes": x.bytes} for x in self.activations.items],
        }


def _moment(step, which: str) -> dict:
    """A step's moment as JSON: its name, its bytes, what is alive."""
    m = getattr(step, which)
    return {"moment": m.name, "bytes": m.bytes,
            "alive": [{"what": w, "bytes": b} for w, b in m.alive]}


def _finite(row: dict) -> dict:
    """JSON has no infinity: a step time beyond float range becomes null."""
    return {k: None if isinstance(v, float) and v in (float("inf"), float("-inf")) else v
            for k, v in row.items()}


def budget(cfg: BudgetConfig) -> Budget:
    """The whole training-step budget for one configuration."""
    cfg.validate()
    if cfg.devices > parameter_count(cfg):
        raise BudgetError(
            f"devices={cfg.devices:,} is more than the model's {parameter_count(cfg):,} "
            f"parameters: data parallelism needs a replica per device and ZeRO cannot split "
            f"one parameter; use at most {parameter_count(cfg):,} devices.")
    fixed = fixed_bytes(cfg)
    mine = per_device_fixed(cfg, fixed)
    acts = activations(cfg)
    step_flops = flops(cfg)
    figures = device_figures(cfg)
    fit = None
    if figures:
        memory, rate = figures
        step = acts.step
        fit = device_fit(cfg, _device_name(cfg), memory, rate,
                         max(step.peak_moment.bytes, step.first_step_peak_moment.bytes),
                         step_flops["per_step"]["total"], cfg.devices * tokens_per_step(cfg))
    return Budget(config=cfg, parameters=parameter_count(cfg),
                  parameter_breakdown=parameter_breakdown(cfg), flops=step_flops,
                  fixed=fixed, activations=acts, one_tensor_bytes=tensor_bytes(cfg),
                  fixed_per_device=mine, communication=tuple(communication(cfg, fixed)),
                  device=fit)


def _device_name(cfg: BudgetConfig) -> str:
    """The device's full name when `cfg.device` selects one ("h200" -> "H200-141GB")."""
    named = find_device(cfg.device)
    return named.name if named else cfg.device


def crossover_batch(cfg: BudgetConfig, max_batch: int = 1 << 20) -> int | None:
    """The smallest micro-batch B (at this N) whose activation peak exceeds
    the fixed memory (weights + master + gradients + optimizer state), or
    None if none up to `max_batch` does. Activations grow with B; the fixed
    memory does not."""
    fixed = budget(cfg).fixed_total

    def over(b: int) -> bool:
        return activations(replace(cfg, micro_batch=b)).peak > fixed

    if not over(max_batch):
        return None
    lo, hi = 1, max_batch  # over(hi) is true; find the first b with over(b)
    if over(lo):
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if over(mid) else (mid, hi)
    return hi


def batch_sweep(cfg: BudgetConfig, batches) -> dict[str, list[int]]:
    """Memory against B x N: for each micro-batch B (at this N) the tokens
    B*N, the fixed bytes (flat) and the activation peak (growing)."""
    fixed = budget(cfg).fixed_total
    rows = {"micro_batch": [], "tokens": [], "fixed": [], "activations": [], "peak": []}
    for b in batches:
        acts = activations(cfg.with_(micro_batch=int(b))).peak
        rows["micro_batch"].append(int(b))
        rows["tokens"].append(int(b) * cfg.seq_len)
        rows["fixed"].append(fixed)
        rows["activations"].append(acts)
        rows["peak"].append(fixed + acts)
    return rows


def recompute_tradeoff(cfg: BudgetConfig) -> dict[str, int]:
    """What `cfg.recompute` buys against no recompute: activation-peak bytes
    saved and FLOPs per step added."""
    base = budget(cfg.with_(recompute="none"))
    this = budget(cfg)
    return {"bytes_saved": base.activations.peak - this.activations.peak,
            "flops_added": this.flops["per_step"]["total"] - base.flops["per_step"]["total"],
            "base_activation_peak": base.activations.peak,
            "base_flops_per_step": base.flops["per_step"]["total"]}
