"""Human-readable output: byte, FLOP and count units, the budget as text.

Sizes are printed in decimal units (1 MB = 10^6 bytes, 1 GB = 10^9 bytes), FLOPs
in G (10^9) and T (10^12), as the source texts do; a device's memory also in GiB
when it is a whole number of them, as its data sheet quotes it.
"""
from __future__ import annotations

from decimal import Decimal

from .config import MASTER_BYTES
from .devices import GiB
from . import recipes
from .knobs import KNOBS
from .linears import target_names
from .weights_dtype import bf16_weights, trains_bf16, training_bytes
from .counts import (bytes_per_parameter, fixed_bytes_per_parameter,
                     fixed_bytes_per_parameter_by_buffer, tokens_per_micro_batch,
                     tokens_per_step, total_parameter_count, trainable_parameter_count)
from .sharding import engine_name, shards_gradients
from .total import Budget


# ------------------------------------------------------------ human output
_BYTE_UNITS = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_FLOP_UNITS = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def _scaled(value, units, suffix: str) -> str:
    """Three significant digits in the largest unit the value reaches;
    beyond 1000 of the largest unit, powers of ten (any size of integer)."""
    if value >= 1000 * units[0][0]:
        return f"{Decimal(value):.2e} {suffix}"
    value = float(value)
    for scale, unit in units:
        if value >= scale:
            shown = value / scale
            text = f"{shown:.3g}" if shown < 999.5 else f"{shown:.0f}"
            return f"{text} {unit}{suffix}"
    return f"{value:.3g} {suffix}"


def human_bytes(n: float) -> str:
    """Decimal units, three significant digits: 134217728 -> '134 MB'."""
    return _scaled(n, _BYTE_UNITS, "B")


def human_flops(n: float) -> str:
    """FLOPs with G/T prefixes, three significant digits: 7.5e11 -> '750 GFLOP'."""
    return _scaled(n, _FLOP_UNITS, "FLOP")


def human_seconds(t: float) -> str:
    """0.0123 -> '12.3 ms', 1.51 -> '1.51 s', 7200 -> '2 h'."""
    if t != t or t == float("inf"):
        return "inf s"
    for scale, unit in ((3600, "h"), (60, "min"), (1, "s"), (1e-3, "ms"), (1e-6, "us")):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t:.3g} s"


def _trainable(c) -> list[str]:
    """Under LoRA, the line of the parameters the optimizer updates."""
    if not recipes.freezes_base(c):
        return []
    count = trainable_parameter_count(c)
    # the recipes built on LoRA, each with its setting (the defaults included)
    said = ", ".join(f"{KNOBS[k].flag} " + (("on" if v else "off") if isinstance(v, bool)
                                             else v or "none")
                     for k, v in ((r.knob, getattr(c, r.knob)) for r in recipes.registry()
                                   if r.knob))
    return [f"trainable  {count:,} ({human_count(count)}): LoRA rank {c.lora_rank} on "
            f"{','.join(target_names(c))}, the model's own parameters frozen ({said})"]


def describe_fixed(b: Budget) -> list[str]:
    """The memory section's head and its fixed buffers, each with its bytes per parameter."""
    c = b.config
    lines = []
    bpp = training_bytes(c, bytes_per_parameter(c.precision, c.optimizer, c.grad_precision,
                                                c.real_16bit))
    sharded = c.devices > 1 and c.zero > 0
    lines += ["", "memory" + (f" of one device (ZeRO stage {c.zero} over {c.devices} devices"
                              + (f"; gradients as {engine_name(c)}"
                                 if b.real_step and shards_gradients(c) else "") + ")"
                              if c.devices > 1 else
                              f" (ZeRO stage {c.zero} shards nothing on one device: set the "
                              f"number of data-parallel devices)" if c.zero else "")]
    frozen = recipes.freezes_base(c)
    per = "param" if not frozen else "trainable param"
    for k, v in b.fixed_per_device.items():
        note = f"({bpp[k]} bytes/{'param' if k == 'weights' else per}"
        if k == "weights" and bf16_weights(c) and frozen:  # peft's adapters in fp32
            note = f"(2 bytes/frozen param, {bpp[k]} bytes/trainable param"
        if k == "weights" and c.qlora:
            note = (f"({per_parameter(fixed_bytes_per_parameter_by_buffer(c)[k])} bytes/param: "
                    f"the blocks' linear weights in 4 bits with an fp32 absmax per 64")
        if sharded and v != b.fixed[k]:
            note += f"; 1/{c.devices} of {human_bytes(b.fixed[k])}"
        lines.append(f"  {k:<22}{human_bytes(v):>12}   {note})")
    lines.append(f"  {'fixed total':<22}{human_bytes(b.fixed_total):>12}   "
                 + (f"(of {human_bytes(sum(b.fixed.values()))} for the whole model, " if sharded
                    else "(") + describe_per_parameter(c) + ")")
    return lines


def describe(b: Budget) -> str:
    """The human-readable report the command line prints."""
    c = b.config
    family = f" ({c.model_type})" if c.model_type not in ("", c.architecture) else ""
    shape = (f"{c.architecture}{family} L={c.n_layer} d={c.d_model} heads={c.n_head}"
             + (f" kv-heads={c.kv_heads}" if c.kv_heads != c.n_head else "")
             + f" V={c.vocab_size} d_ff={c.ffn} positions={c.positions} "
             f"{'tied' if c.tied_embedding else 'untied'} head")
    source = "given" if c.n_params else "from the shape"
    grads = "fp32 gradients" if c.grad_precision == "fp32" else f"{c.precision} gradients"
    lines = [
        f"model      {c.name}: {shape}",
        f"parameters {b.parameters:,} ({human_count(b.parameters)}, {source})",
        *_trainable(c),
        f"batch      B={c.micro_batch} x N={c.seq_len}, accumulation K={c.accumulation}: "
        f"{tokens_per_micro_batch(c):,} tokens per micro-batch, "
        f"{tokens_per_step(c):,} per optimizer step"
        + (f" per device, {b.tokens_per_step_all_devices:,} over {c.devices} devices"
           if c.devices > 1 else ""),
        (f"policy     torch.autocast to {c.precision} over {c.weights_dtype} weights, "
         f"{'bf16' if trains_bf16(c) else 'fp32'} gradients"
         if c.autocast else
         f"policy     {c.precision} weights without autocast, every op in {c.precision}, "
         f"{'bf16' if trains_bf16(c) else 'fp32'} gradients"
         if c.real_16bit else
         f"policy     {c.precision} storage"
         + (" + fp32 master weights" if MASTER_BYTES[c.precision] else "") + f", {grads}")
        + f", {c.optimizer}, activations: {MODEL_NAMES[c.activation_model]}"
        + (f", {c.attention} attention" if c.activation_model != "rule" else "")
        + (f" ({c.tensors_per_layer} tensors per layer)" if c.activation_model == "rule" else "")
        + (", dropout" if c.dropout else "") + f", recompute {c.recompute}",
        *describe_loop(b),
        "",
        f"{'FLOPs':<12}{'per token':>14}{'per micro-batch':>18}{'per step':>16}",
    ]
    for k in ("forward", "backward", "recompute", "total"):
        row = [b.flops[w][k] for w in ("per_token", "per_micro_batch", "per_step")]
        lines.append(f"  {k:<10}" + "".join(f"{human_flops(v):>{w}}"
                                            for v, w in zip(row, (14, 18, 16))))
    lines += describe_fixed(b)
    lines.append(f"  {'one B x N x d tensor':<22}{human_bytes(b.one_tensor_bytes):>12}")
    lines.append(f"  {'activations (saved)':<22}{human_bytes(b.activations.saved):>12}")
    if b.activations.transient and not b.real_step:
        lines.append(f"  {'recompute transient':<22}{human_bytes(b.activations.transient):>12}")
    if not b.real_step:
        lines.append(f"  {'peak of the step':<22}{human_bytes(b.peak):>12}   "
                     f"(fixed total + activation peak)")
    else:
        lines += describe_peak(b)
    if b.communication:
        lines += ["", f"communication per optimizer step (ring collectives over "
                      f"{c.devices} devices)"]
        for row in b.communication:
            lines.append(f"  {row['collective'] + ' ' + row['buffer']:<30}"
                         f"{human_bytes(row['bytes']):>12} x {row['times_per_step']}"
                         f"   sends {human_bytes(row['sent_per_device'])} per device")
        lines.append(f"  {'total sent per device':<30}"
                     f"{human_bytes(sum(r['sent_per_device'] for r in b.communication)):>12}")
    if b.device:
        lines += ["", *describe_device(b)]
    return "\n".join(lines)


def per_parameter(value: float) -> str:
    """A bytes-per-parameter figure: 16, 4.02, 1.01."""
    return str(int(value)) if float(value).is_integer() else f"{value:.3g}"


def describe_per_parameter(c) -> str:
    """The recipe's fixed bytes over every parameter ("16 bytes/param"), and under LoRA
    what they cover, the adapters counted among the parameters."""
    figure = f"{per_parameter(fixed_bytes_per_parameter(c))} bytes/param"
    if not recipes.freezes_base(c):
        return figure
    return (f"{figure}: every weight, the adapters' gradients and optimizer state, over "
            f"{human_count(total_parameter_count(c))} parameters with the adapters")


MODEL_NAMES = {"rule": "rule of thumb", "transformer": "transformer op list",
               "engine": "this engine's GPT", "pytorch": "plain PyTorch GPT (nanoGPT)",
               "hf": "Hugging Face transformers"}


def describe_loop(b: Budget) -> list[str]:
    """What a real framework's loop does beyond the model, and where each choice came
    from (a flag, or the framework's usual loop)."""
    if not b.real_step:
        return []
    loop = b.loop()
    return [f"loop       {b.config.optimizer} {loop['optimizer_impl']} "
            f"({loop['optimizer_impl_from']}); outputs {loop['outputs']} "
            f"({loop['outputs_from']}); {loop['backend']} kernels"
            + ("; padded batch" if b.config.padded_batch else "")]


def _terms(alive, shown: int = 3) -> str:
    return ", ".join(f"{what} {human_bytes(size)}" for what, size in alive[:shown])


def describe_peak(b: Budget) -> list[str]:
    """A real step's peak: when it happens and the largest things alive then."""
    step = b.activations.step
    m, first = step.peak_moment, step.first_step_peak_moment
    when = ("in its optimizer step" if first.name == "the optimizer step"
            else "before the optimizer state exists")
    return [f"  {'peak of the step':<22}{human_bytes(m.bytes):>12}   (steady state)",
            f"  {'peak of step 1':<22}{human_bytes(first.bytes):>12}   ({when})",
            f"peak       during {m.name}: {_terms(m.alive)}"]


def describe_breakdown(b: Budget) -> str:
    """Every kept tensor of one micro-batch, largest first, and the peak's moments."""
    dtype = {1: "bool", 2: "16-bit", 4: "fp32", 8: "int64"}
    c = b.config
    rows = sorted(b.activations.items, key=lambda x: -x.bytes)
    lines = [f"kept for the backward ({MODEL_NAMES[c.activation_model]}, B={c.micro_batch} "
             f"N={c.seq_len}), largest first",
             f"  {'op':<30}{'tensor':<44}{'dtype':>7}{'each':>11}{'x':>5}{'total':>11}"]
    for x in rows:
        lines.append(f"  {x.op[:29]:<30}{x.tensor[:43]:<44}{dtype.get(x.itemsize, '?'):>7}"
                     f"{human_bytes(x.elements * x.itemsize):>11}{x.count:>5}"
                     f"{human_bytes(x.bytes):>11}")
    lines.append(f"  {'total':<30}{'':<44}{'':>7}{'':>11}{'':>5}"
                 f"{human_bytes(b.activations.saved):>11}")
    step = b.activations.step
    if step is not None:
        for title, moments in (("steady state", step.moments), ("step 1", step.first_step)):
            lines += ["", f"moments of the step ({title}), what is alive at each"]
            for m in sorted(moments, key=lambda m: -m.bytes):
                lines.append(f"  {human_bytes(m.bytes):>10}  {m.name}: {_terms(m.alive, 9)}")
    return "\n".join(lines)


def describe_device(b: Budget) -> list[str]:
    """The device lines: does it fit, the largest micro-batch, the step time."""
    d, c = b.device, b.config
    figures = []
    if d.memory:
        figures.append(human_device_memory(d.memory))
    if d.flops_per_second:
        figures.append(f"{human_flops(d.flops_per_second)}/s dense {c.precision}")
    lines = [f"device     {d.device}: {', '.join(figures)}"]
    if d.fits is not None:
        lines += _fit_lines(d, c)
    if d.step_seconds is not None:
        lines.append(f"step time  {human_seconds(d.step_seconds)} at MFU {c.mfu:g} "
                     f"(compute only, communication assumed overlapped): "
                     f"{d.tokens_per_second:,.0f} tokens/s"
                     + (f" over {c.devices} devices" if c.devices > 1 else ""))
    return lines


def _fit_lines(d, c) -> list[str]:
    """Whether the step fits beside the headroom, and the settings that would."""
    room = (f"{human_bytes(d.usable)} usable: {human_bytes(d.memory)} less "
            f"{human_bytes(d.headroom)} headroom for the CUDA context and the allocator")
    if d.fits:
        lines = [f"fits       yes: peak {human_bytes(d.peak)} of {room} "
                 f"({human_bytes(d.spare)} spare)"]
    else:
        lines = [f"fits       no: peak {human_bytes(d.peak)} is {human_bytes(-d.spare)} "
                 f"more than {room}"]
    lines.append(f"largest    micro-batch that fits at N={c.seq_len}: "
                 + (f"B={d.largest_micro_batch}" if d.largest_micro_batch else
                    "none (even B=1 does not fit; shard with --zero, recompute, or "
                    "use more devices)"))
    lines.append("longest    sequence that fits at B=1: "
                 + (f"N={d.longest_sequence:,}" if d.longest_sequence else "none"))
    lines.append(f"fewest     devices that fit B={c.micro_batch}, N={c.seq_len}: "
                 + _fewest(d.fewest_devices))
    full = d.full_fine_tuning
    if full:
        lines.append(f"full FT    without adapters: fits {'yes' if full['fits'] else 'no'}; "
                     f"largest B={full['largest_micro_batch'] or 'none'}, longest N at B=1 "
                     + (f"{full['longest_sequence']:,}" if full["longest_sequence"] else
                        "none") + f"; fewest devices {_fewest(full['fewest_devices'])}")
    return lines


def _fewest(few: dict | None) -> str:
    if few:
        return f"{few['devices']:,} at ZeRO stage {few['zero']}"
    return ("none (ZeRO shards the fixed memory, not a micro-batch's activations, which "
            "alone do not fit: a smaller micro-batch or sequence, recompute, or flash "
            "attention)")


def human_device_memory(memory: int) -> str:
    """A device's memory in the decimal units of the budget, with the GiB its data
    sheet quotes when it is a whole number of them: '85.9 GB (80 GiB)'."""
    if memory % GiB == 0:
        return f"{human_bytes(memory)} ({memory // GiB} GiB)"
    return human_bytes(memory)


def human_count(n: int) -> str:
    """7_000_000_000 -> '7B', 124_439_808 -> '124M'."""
    if n >= 1e12:
        return f"{Decimal(n):.2e}"
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)
