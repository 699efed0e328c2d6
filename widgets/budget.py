"""The training-step budget calculator: `engine.budget` behind sliders.

Every number on screen comes from `engine.budget`: the widget turns its
controls into a `BudgetConfig`, asks `budget(config)` and writes the answer
into widget models (`.value`, `Output.outputs`), never printing, so a notebook
that shows it replays cleanly under nbval.

What it shows:
  * the readout (DOM class `budget-readout`): peak, parameters, fixed and
    activation bytes; the peak in exact bytes sits in a span of class
    `budget-peak-bytes` for tests that read the page (each control carries
    the class `budget-knob-<field>`, e.g. `budget-knob-micro-batch`);
  * FLOPs per token, per micro-batch and per optimizer step;
  * what the recompute setting saves (activation bytes) and adds (FLOPs);
  * a stacked bar of the memory categories;
  * memory against B x N, with the batch where activations overtake the
    fixed memory (weights + master + gradients + optimizer state) marked;
  * "measure": runs our engine's GPT at the current shape (when it is small
    enough for this machine) and shows measured bytes beside predicted ones.
Impossible settings (heads not dividing the width, ...) show the message of
`engine.budget` in the widget instead of a traceback.
"""
from __future__ import annotations

import html

from engine import budget as B

CATEGORY_COLORS = {
    "weights": "#4c72b0", "master weights": "#8172b3", "gradients": "#55a868",
    "optimizer state": "#ccb974", "activations": "#c44e52", "recompute transient": "#e8a0a2",
}


class BudgetWidget:
    """Sliders and dropdowns for every knob of `engine.budget.BudgetConfig`.

    `BudgetWidget(preset="gpt2-small", micro_batch=4)` starts from a preset
    with some knobs changed; `.ui` is the widget to display (displaying the
    object itself works too). `.config()` is the configuration on screen and
    `.result` the last `Budget` computed (None while the settings are invalid).
    """

    def __init__(self, preset: str = "gpt2-small", plots: bool = True, **changes):
        import ipywidgets as w
        self.plots = plots
        self.result: B.Budget | None = None
        self.measured: dict | None = None
        self._loading = False
        self._figures: list = []
        start = B.preset(preset, **changes)
        wide = {"description_width": "150px"}
        layout = w.Layout(width="420px")

        def slider(description, lo, hi, step=1):
            return w.IntSlider(min=lo, max=hi, step=step, description=description,
                               style=wide, layout=layout, continuous_update=False)

        def number(description, lo=0, hi=10**13):
            return w.BoundedIntText(min=lo, max=hi, description=description, style=wide,
                                    layout=layout)

        def choice(description, options):
            return w.Dropdown(options=list(options), description=description, style=wide,
                              layout=layout)

        self.preset = choice("preset", B.PRESET_NAMES)
        self.preset.value = preset
        # One control per BudgetConfig field; the names match so loading a
        # preset and reading the screen back are one loop each.
        self.controls = {
            "n_layer": slider("layers L", 1, 128),
            "d_model": slider("width d", 32, 16384, 32),
            "n_head": slider("heads a", 1, 128),
            "vocab_size": number("vocabulary V", 1, 10**7),
            "d_ff": number("MLP width (0: 4d)"),
            "block_size": number("positions (0: N)"),
            "tied_embedding": w.Checkbox(description="tied output head", style=wide),
            "n_params": number("params (0: formula)"),
            "micro_batch": slider("micro-batch B", 1, 1024),
            "seq_len": slider("sequence N", 16, 32768, 16),
            "accumulation": slider("accumulation K", 1, 256),
            "precision": choice("precision", B.PRECISIONS),
            "optimizer": choice("optimizer", B.OPTIMIZERS),
            "activation_model": choice("activation model", B.ACTIVATION_MODELS),
            "tensors_per_layer": slider("rule: tensors/layer", 1, 64),
            "dropout": w.Checkbox(description="dropout masks", style=wide),
            "recompute": w.ToggleButtons(options=list(B.RECOMPUTE), description="recompute",
                                         style={"button_width": "80px", **wide}),
        }
        for name, control in self.controls.items():  # stable handles for browser tests
            control.add_class(f"budget-knob-{name.replace('_', '-')}")
        self.readout = w.HTML()
        self.readout.add_class("budget-readout")
        self.message = w.HTML()
        self.message.add_class("budget-message")
        self.flops_table = w.HTML()
        self.tradeoff = w.HTML()
        self.tradeoff.add_class("budget-recompute")
        self.bar = w.Output()
        self.curve = w.Output()
        self.measure_button = w.Button(description="measure on our engine",
                                       button_style="info", layout=w.Layout(width="220px"))
        self.measure_result = w.HTML()
        self.measure_result.add_class("budget-measured")

        self._load(start)
        self.preset.observe(self._on_preset, names="value")
        for control in self.controls.values():
            control.observe(self._update, names="value")
        self.measure_button.on_click(self.measure)
        self._update()

        knobs = list(self.controls.values())
        self.ui = w.VBox([
            w.HBox([w.VBox([self.preset] + knobs[:10]), w.VBox(knobs[10:])]),
            self.message, self.readout, self.flops_table, self.tradeoff,
            w.HBox([self.bar, self.curve]),
            w.HBox([self.measure_button, self.measure_result]),
        ])

    def _repr_mimebundle_(self, **kwargs):
        return self.ui._repr_mimebundle_(**kwargs)

    def summary(self) -> str:
        """The readout as one line of plain text (or the message, if invalid)."""
        if self.result is None:
            return "invalid settings: " + html.unescape(
                self.message.value.split("</b> ", 1)[-1])
        b = self.result
        return (f"peak {B.human_bytes(b.peak)} = fixed {B.human_bytes(b.fixed_total)} + "
                f"activations {B.human_bytes(b.activations.peak)}; "
                f"{B.human_flops(b.flops['per_step']['total'])} per step "
                f"({B.tokens_per_step(b.config):,} tokens)")

    # ------------------------------------------------------------ state
    def config(self) -> B.BudgetConfig:
        """The configuration on screen (validated; raises BudgetError)."""
        values = {name: c.value for name, c in self.controls.items()}
        return B.BudgetConfig(name=self.preset.value, **values).validate()

    def _load(self, cfg: B.BudgetConfig) -> None:
        """Put a configuration on screen without recomputing after each knob."""
        self._loading = True
        try:
            for name, control in self.controls.items():
                control.value = getattr(cfg, name)
        finally:
            self._loading = False

    def _on_preset(self, change) -> None:
        self._load(B.preset(change["new"]))
        self._update()

    # ----------------------------------------------------------- update
    def _update(self, change=None) -> None:
        if self._loading:
            return
        self.measure_result.value = ""
        self.measured = None
        try:
            self.result = B.budget(self.config())
        except B.BudgetError as exc:
            self.result = None
            self.message.value = (f"<b style='color:#b00'>Cannot compute this budget:</b> "
                                  f"{html.escape(str(exc))}")
            return
        self.message.value = ""
        self.readout.value = readout_html(self.result)
        self.flops_table.value = flops_html(self.result)
        self.tradeoff.value = tradeoff_html(self.result)
        if self.plots:
            self._draw()

    def _draw(self) -> None:
        import matplotlib.pyplot as plt
        for fig in self._figures:
            plt.close(fig)
        self._figures = [memory_bar_figure(self.result), memory_curve_figure(self.result)]
        for out, fig in zip((self.bar, self.curve), self._figures):
            out.outputs = ()
            out.append_display_data(fig)

    # ---------------------------------------------------------- measure
    def measure(self, button=None) -> None:
        """Run our engine's GPT at the shape on screen and show measured
        against predicted bytes (the "engine" activation model)."""
        if self.result is None:
            self.measure_result.value = "Fix the settings first (see the message above)."
            return
        try:
            self.measured = B.measure(self.result.config)
        except B.BudgetError as exc:
            self.measured = None
            self.measure_result.value = f"<span style='color:#b00'>{html.escape(str(exc))}</span>"
            return
        self.measure_result.value = measured_html(self.measured)


# --------------------------------------------------------------- rendering
def readout_html(b: B.Budget) -> str:
    """The main readout; the exact peak sits in span.budget-peak-bytes."""
    return (
        f"<div><b>peak of the step: <span class='budget-peak'>{B.human_bytes(b.peak)}</span></b>"
        f" (<span class='budget-peak-bytes'>{b.peak:,}</span> bytes)"
        f" &nbsp;|&nbsp; parameters {B.human_count(b.parameters)}"
        f" &nbsp;|&nbsp; fixed {B.human_bytes(b.fixed_total)}"
        f" ({sum(B.bytes_per_parameter(b.config.precision, b.config.optimizer).values())}"
        f" bytes/param)"
        f" &nbsp;|&nbsp; activations <span class='budget-activations'>"
        f"{B.human_bytes(b.activations.peak)}</span>"
        f" &nbsp;|&nbsp; one B x N x d tensor {B.human_bytes(b.one_tensor_bytes)}</div>")


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


def memory_bar_figure(b: B.Budget):
    """One stacked bar of the memory categories, in the order they become resident."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(3.6, 3.6))
    bottom = 0.0
    for name, value in b.memory().items():
        if value:
            ax.bar(["peak"], [value / 1e9], bottom=bottom / 1e9, label=name,
                   color=CATEGORY_COLORS[name])
            bottom += value
    ax.set_ylabel("GB")
    ax.set_title(f"peak {B.human_bytes(b.peak)}", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    plt.close(fig)
    return fig


def memory_curve_figure(b: B.Budget, points: int = 24):
    """Fixed and activation memory against B x N (B varied at this N), with
    the crossover batch marked."""
    import matplotlib.pyplot as plt
    c = b.config
    cross = B.crossover_batch(c)
    top = max(2 * c.micro_batch, 2 * cross if cross else 0, 8)
    batches = sorted({max(1, round(top * i / points)) for i in range(points + 1)})
    rows = B.batch_sweep(c, batches)
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    ax.plot(rows["tokens"], [v / 1e9 for v in rows["fixed"]], label="weights+grads+optimizer")
    ax.plot(rows["tokens"], [v / 1e9 for v in rows["activations"]], label="activations")
    ax.plot(rows["tokens"], [v / 1e9 for v in rows["peak"]], "k--", lw=1, label="peak")
    ax.axvline(B.tokens_per_micro_batch(c), color="0.6", lw=1, label=f"B={c.micro_batch} (set)")
    if cross:
        ax.axvline(cross * c.seq_len, color="#c44e52", ls=":", lw=1.5)
        ax.annotate(f"crossover B={cross}", (cross * c.seq_len, 0.96),
                    xycoords=("data", "axes fraction"), xytext=(4, 0),
                    textcoords="offset points", fontsize=8, color="#c44e52", va="top")
    ax.set_xlabel(f"tokens per micro-batch B x N (N={c.seq_len})")
    ax.set_ylabel("GB")
    ax.set_title("activations overtake the fixed memory" if cross else
                 "activations stay below the fixed memory", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    plt.close(fig)
    return fig
