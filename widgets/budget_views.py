"""What the budget calculator shows, drawn from one `engine.budget.Budget`: the HTML
panels (the fit line, the memory table, FLOPs, recompute, data parallel, a measurement)
and the two plots (the memory bar and the memory against B x N).

Pure functions of a Budget, shared by the notebook widget (`widgets.budget`) and the
stand-alone page (`widgets.budget_app`); neither computes a number of its own.
"""
from __future__ import annotations

import html
from dataclasses import replace

from engine import budget as B
from engine.budget.fit import without_adapters
from engine.budget.counts import fixed_bytes_per_parameter
from engine.budget.report import per_parameter as per_parameter_figure

CATEGORY_COLORS = {
    "weights": "#4c72b0", "master weights": "#8172b3", "gradients": "#55a868",
    "optimizer state": "#ccb974", "activations": "#c44e52", "recompute transient": "#e8a0a2",
    "step transient": "#dd8452",
}
DPI = 90
GiB = 2 ** 30  # data sheets quote device memory in these
BAR_PX, CURVE_PX = (216, 288), (414, 288)  # the two pictures, width x height in pixels


def readout_html(b: B.Budget) -> str:
    """The peak of one device (exact bytes in span.budget-peak-bytes), its items as a
    table, when the peak happens and its largest tensor, and the sizes behind them."""
    c = b.config
    per_parameter = per_parameter_figure(fixed_bytes_per_parameter(c))
    covers = (" (every weight, the adapters' gradients and optimizer state)"
              if c.lora_rank else "")
    one_device = "one device" if c.devices > 1 else "the device"
    return (f"<div class='budget-headline'><b>peak of {one_device}: "
            f"<span class='budget-peak'>{B.human_bytes(b.peak)}</span></b> "
            f"(<span class='budget-peak-bytes'>{b.peak:,}</span> bytes)</div>"
            + memory_html(b) + peak_moment_html(b)
            + f"<div class='budget-hint'>{B.human_count(b.parameters)} parameters, "
              f"{per_parameter} bytes of fixed memory per parameter{covers}; one "
              f"B x N x d tensor {B.human_bytes(b.one_tensor_bytes)}. "
              f"1 GB = 10<sup>9</sup> bytes.</div>")


def _swatch(name: str) -> str:
    return (f"<span style='display:inline-block;width:0.8em;height:0.8em;"
            f"background:{CATEGORY_COLORS[name]};margin-right:0.3em'></span>")


def memory_html(b: B.Budget) -> str:
    """One device's memory at the peak, item by item in its colour: bytes, share of the
    peak and, over several devices, the whole model's bytes of that item."""
    sharded = b.config.devices > 1
    head = ("<tr><th>what</th><th class='num'>bytes</th><th class='num'>share</th>"
            + ("<th class='num'>whole model</th>" if sharded else "") + "</tr>")
    rows = []
    for name, value in b.memory().items():
        if not value:
            continue
        whole = B.human_bytes(b.fixed[name]) if name in b.fixed else "each device its own"
        rows.append(f"<tr><td>{_swatch(name)}{name}</td>"
                    f"<td class='num'>{B.human_bytes(value)}</td>"
                    f"<td class='num'>{_share(value, b.peak)}</td>"
                    + (f"<td class='num'>{whole}</td>" if sharded else "") + "</tr>")
    rows.append(f"<tr class='budget-total'><td>peak</td><td class='num'>"
                f"{B.human_bytes(b.peak)}</td><td class='num'>100%</td>"
                + ("<td></td>" if sharded else "") + "</tr>")
    return f"<table class='budget-memory'>{head}{''.join(rows)}</table>"


def _share(part: int, whole: int) -> str:
    """A percentage for a table: '<1%' rather than a misleading '0%'."""
    share = 100 * part / whole
    return "<1%" if 0 < share < 0.5 else f"{share:.0f}%"


def peak_moment_html(b: B.Budget) -> str:
    """One line: when the peak happens (a real step's moments) and the largest tensor
    the forward keeps (engine.budget's breakdown of the activations)."""
    parts = []
    step = b.activations.step
    if b.real_step:
        parts.append(f"peak during {html.escape(step.peak_moment.name)}")
        if b.peak_first_step != b.peak:
            parts.append(f"step 1 peaks at {B.human_bytes(b.peak_first_step)}")
    if b.activations.items:
        top = max(b.activations.items, key=lambda x: x.bytes)
        each = f", {B.human_bytes(top.bytes // top.count)} x {top.count}" if top.count > 1 else ""
        parts.append(f"largest kept tensor: {html.escape(top.op)}, {html.escape(top.tensor)} "
                     f"{B.human_bytes(top.bytes)}{each}")
    return f"<div class='budget-peak-moment'>{'; '.join(parts)}</div>" if parts else ""


def flops_html(b: B.Budget) -> str:
    rows = "".join(
        f"<tr><td>{k}</td>" + "".join(f"<td style='text-align:right'>"
                                      f"{B.human_flops(b.flops[w][k])}</td>"
                                      for w in ("per_token", "per_micro_batch", "per_step"))
        + "</tr>" for k in ("forward", "backward", "recompute", "total"))
    c = b.config
    return (f"<table><tr><th>FLOPs</th><th>per token</th><th>per micro-batch "
            f"({B.tokens_per_micro_batch(c):,} tokens)</th><th>per step "
            f"({B.tokens_per_step(c):,} tokens)</th></tr>{rows}</table>")


def tradeoff_html(b: B.Budget) -> str:
    c = b.config
    if c.recompute == "none":
        return "recompute off: every saved activation is kept until its VJP runs."
    t = B.recompute_tradeoff(c)
    saved_pct = 100 * t["bytes_saved"] / t["base_activation_peak"]
    added_pct = 100 * t["flops_added"] / t["base_flops_per_step"]
    return (f"recompute {c.recompute}: activation peak {B.human_bytes(t['base_activation_peak'])}"
            f" &rarr; {B.human_bytes(b.activations.peak)}, <b>saves "
            f"{B.human_bytes(t['bytes_saved'])}</b> ({saved_pct:.0f}%), <b>adds "
            f"{B.human_flops(t['flops_added'])}</b> per step ({added_pct:+.0f}% compute)")


def measured_html(m: dict) -> str:
    rows = [("activations saved", m["predicted_saved"], m["measured_saved"]),
            ("activation peak", m["predicted_peak"], m["measured_peak"])]
    body = "".join(
        f"<tr><td>{name}</td><td style='text-align:right'>{p:,}</td>"
        f"<td style='text-align:right'>{q:,}</td>"
        f"<td style='text-align:right'>{100 * (q - p) / p:+.2f}%</td></tr>"
        for name, p, q in rows)
    return (f"<table><tr><th>{html.escape(m['shape'])}</th><th>predicted bytes</th>"
            f"<th>measured bytes</th><th>difference</th></tr>{body}</table>")


def _unit(largest: float) -> tuple[float, str]:
    """The decimal byte unit a plot's axis reads in, from its largest value."""
    for scale, name in ((1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if largest >= scale:
            return scale, name
    return 1.0, "B"


def _capacity(ax, b: B.Budget, scale: float) -> None:
    """The device's memory as a horizontal line, when a device is chosen."""
    d = b.device
    if d and d.memory:
        ax.axhline(d.memory / scale, color="black", ls="-.", lw=1.2,
                   label=f"{d.device} memory" + (f" ({d.memory // GiB} GiB)"
                                                 if d.memory % GiB == 0 else ""))


def draw_memory_bar(ax, b: B.Budget) -> None:
    """One stacked bar of one device's memory items, in the order they become
    resident, each in its colour; the device's capacity as a line."""
    ax.clear()
    items = {k: v for k, v in b.memory().items() if v}
    top = max(b.peak, b.device.memory if b.device and b.device.memory else 0, 1)
    scale, unit = _unit(top)
    bottom = 0.0
    for name, value in items.items():
        ax.bar([0], [value / scale], bottom=bottom / scale, label=name,
               color=CATEGORY_COLORS[name], width=0.6)
        bottom += value
    ax.set_xlim(-0.5, 0.5)
    ax.set_xticks([])
    ax.set_ylim(0, 1.12 * top / scale)
    ax.set_ylabel(unit)
    ax.set_title(f"peak {B.human_bytes(b.peak)}", fontsize=10)
    if b.device and b.device.memory:  # under the bar, so it covers none of it
        _capacity(ax, b, scale)
        ax.legend(handles=ax.lines, fontsize=7, loc="upper center",
                  bbox_to_anchor=(0.5, -0.04), frameon=False, borderaxespad=0)


def memory_bar_figure(b: B.Budget):
    """The stacked bar as a figure of its own."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(BAR_PX[0] / DPI, BAR_PX[1] / DPI), dpi=DPI)
    draw_memory_bar(ax, b)
    fig.tight_layout()
    plt.close(fig)
    return fig


def draw_memory_curve(ax, b: B.Budget, points: int = 24) -> None:
    """One device's memory against B x N (B varied at this N), stacked in the
    items' colours: the fixed items flat, the activations growing; the
    crossover batch and the device's capacity marked."""
    ax.clear()
    c = b.config
    cross = B.crossover_batch(c)
    fit = b.device.largest_micro_batch if b.device else None
    top_b = max(2 * c.micro_batch, 2 * cross if cross else 0, (fit or 0) + 1, 8)
    batches = sorted({max(1, round(top_b * i / points)) for i in range(points + 1)})
    rows = B.batch_sweep(c, batches)
    largest = max(rows["peak"][-1], b.device.memory if b.device and b.device.memory else 0)
    scale, unit = _unit(largest)
    tokens = rows["tokens"]
    layers = [(name, [v / scale] * len(tokens)) for name, v in b.fixed_per_device.items() if v]
    layers.append(("activations", [v / scale for v in rows["activations"]]))
    ax.stackplot(tokens, *[v for _, v in layers], labels=[n for n, _ in layers],
                 colors=[CATEGORY_COLORS[n] for n, _ in layers], alpha=0.9)
    ax.axvline(B.tokens_per_micro_batch(c), color="0.3", lw=1, ls="--",
               label=f"B={c.micro_batch} (set)")
    if cross:
        ax.axvline(cross * c.seq_len, color=CATEGORY_COLORS["activations"], ls=":", lw=1.5,
                   label=f"crossover B={cross}")
    _capacity(ax, b, scale)
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(5))  # tick labels that fit the width
    ax.set_xlim(tokens[0], tokens[-1])
    ax.set_ylim(0, 1.12 * largest / scale)
    ax.set_ylabel(unit)
    ax.set_title("activations overtake the fixed memory" if cross else
                 "activations stay below the fixed memory", fontsize=10)
    ax.set_xlabel(f"tokens per micro-batch B x N (N={c.seq_len})", fontsize=8)
    # Under the axes, so it covers nothing; the areas' colours are keyed in the table.
    ax.legend(handles=ax.lines, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2),
              frameon=False, ncol=len(ax.lines), handlelength=1.5, borderaxespad=0,
              columnspacing=1)


def fit_html(b: B.Budget) -> str:
    """The verdict for the chosen device (the peak plus the headroom set aside for the
    CUDA context and the allocator), the largest micro-batch and the longest sequence
    that fit, the fewest devices where one does not, the step time."""
    d, c = b.device, b.config
    if d is None:
        return ("<span class='budget-fit-verdict'>no device chosen</span>: pick one under "
                "devices to see whether a step fits and how long it takes.")
    parts = []
    if d.fits is not None:
        verdict = ("fits" if d.fits else "does not fit")
        colour = "#2a7d2a" if d.fits else "#b00"
        parts.append(f"<b class='budget-fit-verdict' style='color:{colour}'>{verdict}</b> "
                     f"on {html.escape(d.device)}: peak {B.human_bytes(d.peak)} + "
                     f"<span title='{html.escape(B.knob('headroom').help, quote=True)}'>"
                     f"headroom {B.human_bytes(d.headroom)}</span> of "
                     f"{B.human_device_memory(d.memory)}.")
        parts.append("Largest micro-batch that fits: "
                     + (f"<b>B={d.largest_micro_batch}</b>." if d.largest_micro_batch
                        else "none (more devices with a ZeRO stage, recompute, or a "
                             "shorter N)."))
        if d.longest_sequence:
            parts.append(f"Longest sequence at B=1: N={d.longest_sequence:,}.")
        if d.fewest_devices and not d.fits:
            parts.append(f"Fewest devices that fit: {d.fewest_devices['devices']:,} "
                         f"with ZeRO stage {d.fewest_devices['zero']}.")
    if d.step_seconds is not None:
        parts.append(f"Step {B.human_seconds(d.step_seconds)} at MFU {c.mfu:g}, "
                     f"{d.tokens_per_second:,.0f} tokens/s"
                     + (f" over {c.devices} devices." if c.devices > 1 else "."))
    return " ".join(parts)


def parallel_html(b: B.Budget) -> str:
    """The collectives of one optimizer step under data parallel."""
    c = b.config
    if not b.communication:
        return "one device: no communication."
    rows = "".join(
        f"<tr><td>{r['collective']} {r['buffer']}</td>"
        f"<td style='text-align:right'>{B.human_bytes(r['bytes'])}</td>"
        f"<td style='text-align:right'>x {r['times_per_step']}</td>"
        f"<td style='text-align:right'>{B.human_bytes(r['sent_per_device'])}</td></tr>"
        for r in b.communication)
    return (f"<table><tr><th>ZeRO stage {c.zero} over {c.devices} devices</th><th>buffer</th>"
            f"<th>per step</th><th>sent per device</th></tr>{rows}</table>")


# What LoRA changes in each term, and why (engine.budget.lora says it term by term).
LORA_RANKS = (8, 64)
LORA_ROWS = (
    ("trainable parameters", "only the adapters train: A (r x input) and B (output x r) "
                             "per targeted layer"),
    ("weights", "the frozen base model stays whole; the adapters add a little"),
    ("gradients", "a frozen weight gets none; only the adapters' remain"),
    ("optimizer state", "AdamW's two moments of the adapters only"),
    ("activations", "a frozen layer keeps no input, but each adapter keeps its low-rank "
                    "output (and, under lora dropout, a dropped copy of its input)"),
    ("peak", "what is left: the frozen weights and the activations"),
)


def lora_terms(cfg: B.BudgetConfig) -> dict[str, int]:
    """The terms LoRA moves, for one configuration: trainable parameters, the whole
    model's weights, gradients and optimizer state, the activations the forward keeps
    and one device's peak over the first and later steps. The step's memory only: not
    `B.budget`, whose fit searches the table does not show."""
    fixed, step = B.fixed_bytes(cfg.validate()), B.activations(cfg)
    return {"trainable parameters": B.trainable_parameter_count(cfg),
            "weights": fixed.get("weights", 0) + fixed.get("master weights", 0),
            "gradients": fixed.get("gradients", 0),
            "optimizer state": fixed.get("optimizer state", 0),
            "activations": step.saved,
            "peak": max(step.step.peak_moment.bytes, step.step.first_step_peak_moment.bytes)}


def _change(lora: int, full: int) -> str:
    """How a LoRA term compares with full fine-tuning's, in words a table can hold."""
    if not full:
        return ""
    ratio = lora / full
    if ratio < 0.5:
        return f"{ratio:.1%} of it" if ratio >= 0.001 else "&lt;0.1% of it"
    change = 100 * (ratio - 1)
    return f"{change:+.1f}%" if abs(change) < 2 else f"{change:+.0f}%"


def lora_html(b: B.Budget) -> str:
    """For the model on screen (activations of hf), full fine-tuning against LoRA at
    two ranks (and the rank on screen): which terms shrink, which do not, and why."""
    c = b.config
    if c.activation_model != "hf":
        return ("<span class='budget-hint'>Full fine-tuning against LoRA: choose "
                "activations of <b>hf</b> (peft's adapters over a transformers model).</span>")
    full = lora_terms(without_adapters(c))
    ranks = sorted({*LORA_RANKS, c.lora_rank} - {0})
    try:
        columns = {r: lora_terms(replace(c, lora_rank=r)) for r in ranks}
    except B.BudgetError as exc:
        return f"<span class='budget-hint'>LoRA: {html.escape(str(exc))}</span>"
    head = "".join(f"<th class='num'>LoRA r={r}" + (" (set)" if r == c.lora_rank else "")
                   + "</th>" for r in ranks)
    rows = []
    for name, why in LORA_ROWS:
        say = B.human_count if name == "trainable parameters" else B.human_bytes
        cells = "".join(f"<td class='num'>{say(columns[r][name])} "
                        f"<span class='budget-hint'>{_change(columns[r][name], full[name])}"
                        f"</span></td>" for r in ranks)
        rows.append(f"<tr title='{html.escape(why, quote=True)}'><td>{name}</td>"
                    f"<td class='num'>{say(full[name])}</td>{cells}</tr>")
    whys = "".join(f"<li><b>{name}</b>: {why}</li>" for name, why in LORA_ROWS)
    targets = html.escape(c.lora_targets or "peft's default")
    return (f"<div><b>Full fine-tuning against LoRA</b> (targets: {targets}; one "
            f"device's peak over step 1 and later steps)</div><table class='budget-lora'>"
            f"<tr><th>term</th><th class='num'>full fine-tuning</th>{head}</tr>"
            f"{''.join(rows)}</table><ul class='budget-hint budget-why'>{whys}</ul>")
