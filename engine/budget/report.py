"""Human-readable output: byte, FLOP and count units, the budget as text."""
from __future__ import annotations

from .config import MASTER_BYTES
from .counts import bytes_per_parameter, tokens_per_micro_batch, tokens_per_step
from .total import Budget


# ------------------------------------------------------------ human output
_BYTE_UNITS = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_FLOP_UNITS = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def _scaled(value: float, units, suffix: str) -> str:
    """Three significant digits in the largest unit the value reaches."""
    for scale, unit in units:
        if value >= scale:
            shown = value / scale
            text = f"{shown:.3g}" if shown < 999.5 else f"{shown:.0f}"
            return f"{text} {unit}{suffix}"
    return f"{value:.3g} {suffix}"


def human_bytes(n: float) -> str:
    """Decimal units, three significant digits: 134217728 -> '134 MB'."""
    return _scaled(float(n), _BYTE_UNITS, "B")


def human_flops(n: float) -> str:
    """FLOPs with G/T prefixes, three significant digits: 7.5e11 -> '750 GFLOP'."""
    return _scaled(float(n), _FLOP_UNITS, "FLOP")


def describe(b: Budget) -> str:
    """The human-readable report the command line prints."""
    c = b.config
    shape = (f"L={c.n_layer} d={c.d_model} heads={c.n_head} V={c.vocab_size} "
             f"d_ff={c.ffn} positions={c.positions} "
             f"{'tied' if c.tied_embedding else 'untied'} head")
    source = "given" if c.n_params else "from the shape"
    lines = [
        f"model      {c.name}: {shape}",
        f"parameters {b.parameters:,} ({human_count(b.parameters)}, {source})",
        f"batch      B={c.micro_batch} x N={c.seq_len}, accumulation K={c.accumulation}: "
        f"{tokens_per_micro_batch(c):,} tokens per micro-batch, "
        f"{tokens_per_step(c):,} per optimizer step",
        f"policy     {c.precision} storage"
        + (" + fp32 master weights" if MASTER_BYTES[c.precision] else "")
        + f", {c.optimizer}, activations: {c.activation_model} model"
        + (f" ({c.tensors_per_layer} tensors per layer)" if c.activation_model == "rule" else "")
        + (", dropout" if c.dropout else "") + f", recompute {c.recompute}",
        "",
        f"{'FLOPs':<12}{'per token':>14}{'per micro-batch':>18}{'per step':>16}",
    ]
    for k in ("forward", "backward", "recompute", "total"):
        row = [b.flops[w][k] for w in ("per_token", "per_micro_batch", "per_step")]
        lines.append(f"  {k:<10}" + "".join(f"{human_flops(v):>{w}}"
                                            for v, w in zip(row, (14, 18, 16))))
    bpp = bytes_per_parameter(c.precision, c.optimizer)
    lines += ["", "memory"]
    for k, v in b.fixed.items():
        lines.append(f"  {k:<22}{human_bytes(v):>12}   ({bpp[k]} bytes/param)")
    lines.append(f"  {'fixed total':<22}{human_bytes(b.fixed_total):>12}   "
                 f"({sum(bpp.values())} bytes/param)")
    lines.append(f"  {'one B x N x d tensor':<22}{human_bytes(b.one_tensor_bytes):>12}")
    lines.append(f"  {'activations (saved)':<22}{human_bytes(b.activations.saved):>12}")
    if b.activations.transient:
        lines.append(f"  {'recompute transient':<22}{human_bytes(b.activations.transient):>12}")
    lines.append(f"  {'peak of the step':<22}{human_bytes(b.peak):>12}   "
                 f"(fixed total + activation peak)")
    return "\n".join(lines)


def human_count(n: int) -> str:
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)
