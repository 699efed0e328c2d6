"""The training-step budget calculator: `engine.budget` behind sliders.

Every number on screen comes from `engine.budget`: the widget turns its
controls into a `BudgetConfig`, asks `budget(config)` and writes the answer
into widget models (`.value`), never printing, so a notebook that shows it
replays cleanly under nbval.

Layout: the controls on the left (in three tabs: model, training, devices),
what they cost on the right, so both fit a 1280 x 800 screen.
  * the readout (DOM class `budget-readout`): peak, parameters, fixed and
    activation bytes of one device; the peak in exact bytes sits in a span
    of class `budget-peak-bytes` for tests that read the page (each control
    carries the class `budget-knob-<field>`, e.g. `budget-knob-micro-batch`;
    the power-of-two slider beside a size box `budget-step-<field>`);
  * the fit line (`budget-fit`): fits / does not fit the chosen device, the
    largest micro-batch that does, the step time and tokens/s;
  * the memory of one device, item by item, each item in its own colour in
    the table, the bar and the curve;
  * FLOPs per token, per micro-batch and per optimizer step, what the
    recompute setting saves and adds, and the collectives of data parallel;
  * a stacked bar of the memory items and the memory against B x N, with
    the device's capacity as a line: two images redrawn from two figures
    kept for the widget's life, so a move swaps the picture in place;
  * "measure": runs our engine's GPT at the current shape (when it is small
    enough for this machine) and shows measured bytes beside predicted ones;
    the button says it is working, and a result is shown only while the
    settings it was measured at are the ones on screen.
Sizes (batch, sequence, width) have a box for the exact value and a slider
that steps through powers of two; heads are chosen among the divisors of the
width; knobs that do nothing in the current mode are disabled. Impossible
settings show the message of `engine.budget` and grey out the last numbers.
"""

from __future__ import annotations

import html

from engine import budget as B

CATEGORY_COLORS = {
    "weights": "#4c72b0", "master weights": "#8172b3", "gradients": "#55a868",
    "optimizer state": "#ccb974", "activations": "#c44e52", "recompute transient": "#e8a0a2",
    "step transient": "#dd8452",
}
_THIS_MACHINE: dict = {}  # "this machine" as a device, once measured


class BudgetWidget:
    """Controls for every knob of `engine.budget.BudgetConfig`.

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
        wide = {"description_width": "140px"}
        layout = w.Layout(width="400px")

        def slider(description, lo, hi, step=1):
            return w.IntSlider(min=lo, max=hi, step=step, description=description,
                               style=wide, layout=layout, continuous_update=False)

        def number(description, lo=0, hi=10**13, width="400px"):
            return w.BoundedIntText(min=lo, max=hi, description=description, style=wide,
                                    layout=w.Layout(width=width))

        def choice(description, options):
            return w.Dropdown(options=list(options), description=description, style=wide,
                              layout=layout)

        def toggles(description, options):
            return w.ToggleButtons(options=list(options), description=description,
                                   style={"button_width": "62px", **wide})

        self.preset = choice("preset", B.PRESET_NAMES)
        self.preset.value = preset
        # One control per BudgetConfig field; the names match so loading a
        # preset and reading the screen back are one loop each.
        self.controls = {
            "n_layer": slider("layers L", 1, 128),
            "d_model": number("width d", 1, 1 << 20, "250px"),
            "n_head": choice("heads a", [start.n_head]),
            "vocab_size": number("vocabulary V", 1, 10**7),
            "d_ff": number("MLP width (0: rule)"),
            "block_size": number("positions (0: N)"),
            "tied_embedding": w.Checkbox(description="tied output head", style=wide),
            "n_params": number("params (0: formula)"),
            "micro_batch": number("micro-batch B", 1, 1 << 20, "250px"),
            "seq_len": number("sequence N", 1, 1 << 22, "250px"),
            "accumulation": slider("accumulation K", 1, 256),
            "precision": toggles("precision", B.PRECISIONS),
            "optimizer": toggles("optimizer", B.OPTIMIZERS),
            "activation_model": toggles("activation model", B.ACTIVATION_MODELS),
            "tensors_per_layer": slider("rule: tensors/layer", 1, 64),
            "dropout": w.Checkbox(description="dropout masks", style=wide),
            "recompute": toggles("recompute", B.RECOMPUTE),
            "attention": toggles("attention", B.ATTENTIONS),
            "architecture": toggles("architecture", B.ARCHITECTURES),
            "n_kv_head": choice("key/value heads", [("one per head", 0)]),
            "d_head": number("head size (0: d / a)", 0, 1 << 16, "250px"),
            "grad_precision": toggles("gradients", B.GRAD_PRECISIONS),
            "devices": number("data-parallel devices", 1, 1 << 20),
            "zero": toggles("ZeRO stage", B.ZERO_STAGES),
            "device": choice("device", ["none", *B.DEVICES, B.THIS_MACHINE]),
            "device_memory": number("memory bytes (0: device's)", 0, 10**15),
            "device_flops": number("FLOP/s (0: device's)", 0, 10**18),
            "mfu": w.FloatSlider(min=0.05, max=1.0, step=0.05, description="MFU",
                                 style=wide, layout=layout, continuous_update=False),
        }
        for name, control in self.controls.items():  # stable handles for browser tests
            control.add_class(f"budget-knob-{name.replace('_', '-')}")
        # Power-of-two sliders beside the exact boxes of the sizes.
        self.steppers = {name: w.SelectionSlider(options=[1], description="", readout=False,
                                                 continuous_update=False,
                                                 layout=w.Layout(width="150px"))
                         for name in ("d_model", "micro_batch", "seq_len")}
        for name, stepper in self.steppers.items():
            stepper.add_class(f"budget-step-{name.replace('_', '-')}")
            stepper.observe(self._on_step, names="value")
        self.readout = w.HTML()
        self.readout.add_class("budget-readout")
        self.fit = w.HTML()
        self.fit.add_class("budget-fit")
        self.message = w.HTML()
        self.message.add_class("budget-message")
        self.memory_table = w.HTML()
        self.flops_table = w.HTML()
        self.tradeoff = w.HTML()
        self.tradeoff.add_class("budget-recompute")
        self.parallel = w.HTML()
        self.parallel.add_class("budget-parallel")
        # Images keep their size while their picture is swapped: no blank, no collapse.
        self.bar = w.Image(format="png", layout=w.Layout(width="250px", height="280px"))
        self.curve = w.Image(format="png", layout=w.Layout(width="430px", height="280px"))
        self.measure_button = w.Button(description="measure on our engine",
                                       button_style="info", layout=w.Layout(width="220px"))
        self.measure_button.add_class("budget-measure")
        self.measure_result = w.HTML()
        self.measure_result.add_class("budget-measured")
        # Filled as the tape runs the step (engine.budget.measure's progress callback).
        self.measure_progress = w.FloatProgress(value=0.0, min=0.0, max=1.0,
                                                layout=w.Layout(width="160px",
                                                                visibility="hidden"))
        self.measure_progress.add_class("budget-measure-progress")
        self._results = [self.readout, self.fit, self.memory_table, self.flops_table,
                         self.tradeoff, self.parallel, self.bar, self.curve]

        self._load(start)
        self.preset.observe(self._on_preset, names="value")
        for control in self.controls.values():
            control.observe(self._update, names="value")
        self.measure_button.on_click(self.measure)
        self._update()

        c = self.controls
        sized = {n: w.HBox([c[n], self.steppers[n]]) for n in self.steppers}
        model = w.VBox([c["architecture"], c["n_layer"], sized["d_model"], c["n_head"],
                        c["n_kv_head"], c["d_head"], c["vocab_size"], c["d_ff"], c["block_size"],
                        c["tied_embedding"], c["n_params"]])
        training = w.VBox([sized["micro_batch"], sized["seq_len"], c["accumulation"],
                           c["precision"], c["grad_precision"], c["optimizer"],
                           c["activation_model"], c["tensors_per_layer"], c["dropout"],
                           c["recompute"], c["attention"]])
        devices = w.VBox([c["device"], c["device_memory"], c["device_flops"], c["mfu"],
                          c["devices"], c["zero"]])
        tabs = w.Tab(children=[model, training, devices])
        for i, title in enumerate(("model", "training", "devices")):
            tabs.set_title(i, title)
        tabs.add_class("budget-tabs")
        style = w.HTML("<style>.budget-stale{opacity:0.35;filter:grayscale(1)}"
                       ".budget-fit{font-size:1.05em}</style>")
        left = w.VBox([self.preset, tabs], layout=w.Layout(width="440px", flex="0 0 440px"))
        right = w.VBox([self.message, self.readout, self.fit, w.HBox([self.bar, self.curve]),
                        self.memory_table, self.flops_table, self.tradeoff, self.parallel,
                        w.HBox([self.measure_button, self.measure_progress,
                                self.measure_result])],
                       layout=w.Layout(flex="1 1 auto"))
        self.ui = w.HBox([style, left, right])

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
            self._set_choices(cfg.d_model, cfg.n_head)
            for name, control in self.controls.items():
                control.value = getattr(cfg, name)
            self._sync()
        finally:
            self._loading = False

    def _on_preset(self, change) -> None:
        self._load(B.preset(change["new"]))
        self._update()

    def _on_step(self, change) -> None:
        """A power-of-two slider moved: put its value in the exact box."""
        if self._loading:
            return
        name = next(n for n, s in self.steppers.items() if s is change["owner"])
        self.controls[name].value = change["new"]

    # ------------------------------------------------- dependent controls
    def _set_choices(self, d_model: int, n_head: int) -> None:
        """Heads among the divisors of the width, K/V heads among those of the heads."""
        heads = [h for h in range(1, min(d_model, 256) + 1) if d_model % h == 0]
        if n_head not in heads:  # keep the nearest divisor
            n_head = min(heads, key=lambda h: (abs(h - n_head), h))
        control = self.controls["n_head"]
        if list(control.options) != heads:
            control.options = heads
        control.value = n_head
        kv = [("one per head", 0)] + [(str(k), k) for k in range(1, n_head)
                                      if n_head % k == 0]
        kv_control = self.controls["n_kv_head"]
        if [v for _, v in kv] != [v for _, v in kv_control.options]:
            keep = kv_control.value if kv_control.value in [v for _, v in kv] else 0
            kv_control.options = kv
            kv_control.value = keep

    def _sync(self) -> None:
        """Choices, power-of-two sliders and enabled knobs that follow the others."""
        c = self.controls
        self._set_choices(c["d_model"].value, c["n_head"].value)
        if c["architecture"].value != "llama":
            c["n_kv_head"].value = 0  # GPT-2 blocks have one K/V head per head
            c["d_head"].value = 0  # and split their width evenly among the heads
        for name, stepper in self.steppers.items():
            value = c[name].value
            top = max(value, {"d_model": 32768, "micro_batch": 4096, "seq_len": 131072}[name])
            powers = sorted({1 << k for k in range(top.bit_length()) if (1 << k) <= top}
                            | {value})
            if list(stepper.options) != powers:  # a new list re-renders the slider
                stepper.options = powers
            stepper.value = value
        model, devices = c["activation_model"].value, c["devices"].value
        disabled = {
            "tensors_per_layer": model != "rule",
            "dropout": model == "engine",
            "n_kv_head": c["architecture"].value != "llama",
            "d_head": c["architecture"].value != "llama",
            "grad_precision": c["precision"].value == "fp32" or model in B.REAL_STEP_MODELS,
            "attention": model in ("rule", "engine"),
            "zero": devices == 1,
            "mfu": c["device"].value == "none" and not c["device_flops"].value,
        }
        for name, off in disabled.items():
            c[name].disabled = off

    def _on_device(self) -> None:
        """A device chosen by name brings its own figures; "this machine" is measured."""
        c = self.controls
        if c["device"].value == B.THIS_MACHINE:
            if not _THIS_MACHINE:  # measured once per session
                self.fit.value = "measuring this machine (one large sgemm)..."
                _THIS_MACHINE.update(B.this_machine())
            c["device_memory"].value = _THIS_MACHINE["device_memory"]
            c["device_flops"].value = _THIS_MACHINE["device_flops"]
        else:
            c["device_memory"].value = 0
            c["device_flops"].value = 0

    # ----------------------------------------------------------- update
    def _update(self, change=None) -> None:
        if self._loading:
            return
        self._loading = True
        try:
            if change is not None and change["owner"] is self.controls["device"]:
                self._on_device()
            self._sync()
        finally:
            self._loading = False
        self.measure_result.value = ""
        self.measured = None
        try:
            self.result = B.budget(self.config())
        except B.BudgetError as exc:
            self.result = None
            self.message.value = (f"<b style='color:#b00'>Cannot compute this budget:</b> "
                                  f"{html.escape(str(exc))}")
            for shown in self._results:  # the old numbers stay, greyed out
                shown.add_class("budget-stale")
            return
        self.message.value = ""
        for shown in self._results:
            shown.remove_class("budget-stale")
        self.readout.value = readout_html(self.result)
        self.fit.value = fit_html(self.result)
        self.memory_table.value = memory_html(self.result)
        self.flops_table.value = flops_html(self.result)
        self.tradeoff.value = tradeoff_html(self.result)
        self.parallel.value = parallel_html(self.result)
        if self.plots:
            self._draw()

    def _draw(self) -> None:
        """Redraw the two figures kept for the widget's life and swap the images."""
        import io
        if not self._figures:
            import matplotlib.pyplot as plt
            self._figures = [plt.figure(figsize=(2.8, 3.1), dpi=90),
                             plt.figure(figsize=(4.8, 3.1), dpi=90)]
            for fig in self._figures:
                fig.add_subplot()
                plt.close(fig)  # drawn on request only, never shown by pyplot
        bar, curve = self._figures
        draw_memory_bar(bar.axes[0], self.result)
        draw_memory_curve(curve.axes[0], self.result)
        for image, fig in ((self.bar, bar), (self.curve, curve)):
            fig.tight_layout()
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png")
            image.value = buffer.getvalue()

    # ---------------------------------------------------------- measure
    def measure(self, button=None) -> None:
        """Run our engine's GPT at the shape on screen and show measured
        against predicted bytes (the "engine" activation model). The button
        says it is working; a result measured at settings no longer on
        screen is not shown."""
        if self.result is None:
            self.measure_result.value = "Fix the settings first (see the message above)."
            return
        settings = self.result.config
        try:
            B.measurable(settings)
        except B.BudgetError as exc:
            self.measured = None
            self.measure_result.value = f"<span style='color:#b00'>{html.escape(str(exc))}</span>"
            return
        self.measure_button.disabled = True
        self.measure_button.description = "measuring..."
        self.measure_result.value = "running one forward and backward of our engine's GPT..."
        self.measure_progress.value = 0.0
        self.measure_progress.layout.visibility = "visible"
        try:
            measured = B.measure(settings, progress=self._measure_progress)
        finally:
            self.measure_button.disabled = False
            self.measure_button.description = "measure on our engine"
            self.measure_progress.layout.visibility = "hidden"
        if self.result is None or self.result.config != settings:
            self.measured = None
            self.measure_result.value = ("The settings changed during the measurement; "
                                         "press measure again.")
            return
        self.measured = measured
        self.measure_result.value = measured_html(measured)

    def _measure_progress(self, fraction: float, seconds_left: float) -> None:
        """Widget values travel to the browser while the step still runs."""
        self.measure_progress.value = fraction
        self.measure_result.value = (f"running one forward and backward of our engine's GPT: "
                                     f"{fraction:.0%} done, about {seconds_left:.0f} s left")


# --------------------------------------------------------------- rendering
def readout_html(b: B.Budget) -> str:
    """The main readout; the exact peak sits in span.budget-peak-bytes."""
    c = b.config
    # a real step's activations: what its forward leaves alive (the peak is a moment)
    acts = b.activations.saved if b.activations.step else b.activations.peak
    per_parameter = sum(B.bytes_per_parameter(c.precision, c.optimizer, c.grad_precision,
                                              c.autocast).values())
    return (
        f"<div><b>peak of the step: <span class='budget-peak'>{B.human_bytes(b.peak)}</span></b>"
        f" (<span class='budget-peak-bytes'>{b.peak:,}</span> bytes)"
        f" &nbsp;|&nbsp; parameters {B.human_count(b.parameters)}"
        f" &nbsp;|&nbsp; fixed {B.human_bytes(b.fixed_total)}"
        f" ({per_parameter} bytes/param)"
        f" &nbsp;|&nbsp; activations <span class='budget-activations'>"
        f"{B.human_bytes(acts)}</span>"
        f" &nbsp;|&nbsp; one B x N x d tensor {B.human_bytes(b.one_tensor_bytes)}</div>"
        + peak_moment_html(b))


def peak_moment_html(b: B.Budget) -> str:
    """For a real step: when the peak happens and the largest things alive then."""
    step = b.activations.step
    if step is None:
        return ""
    m = step.peak_moment
    terms = ", ".join(f"{html.escape(w)} {B.human_bytes(v)}" for w, v in m.alive[:3])
    return (f"<div class='budget-peak-moment'>peak during {html.escape(m.name)}: {terms}; "
            f"step 1 peaks at {B.human_bytes(b.peak_first_step)} "
            f"(AdamW's state is created by its first step)</div>")


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
                   label=f"{d.device} memory")


def draw_memory_bar(ax, b: B.Budget) -> None:
    """One stacked bar of one device's memory items, in the order they become
    resident, each in its colour; the device's capacity as a line."""
    ax.clear()
    items = {k: v for k, v in b.memory().items() if v}
    top = max(b.peak, b.device.memory if b.device and b.device.memory else 0, 1)
    scale, unit = _unit(top)
    bottom = 0.0
    for name, value in items.items():
        ax.bar(["one device"], [value / scale], bottom=bottom / scale, label=name,
               color=CATEGORY_COLORS[name], width=0.6)
        bottom += value
    _capacity(ax, b, scale)
    ax.set_ylim(0, 1.12 * top / scale)
    ax.set_ylabel(unit)
    ax.set_title(f"peak {B.human_bytes(b.peak)}", fontsize=10)
    if b.device and b.device.memory:  # the items' colours are keyed in the table beside
        ax.legend(fontsize=7, loc="upper left", frameon=False)


def memory_bar_figure(b: B.Budget):
    """The stacked bar as a figure of its own."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(2.8, 3.1))
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
        ax.axvline(cross * c.seq_len, color=CATEGORY_COLORS["activations"], ls=":", lw=1.5)
        ax.annotate(f"crossover B={cross}", (cross * c.seq_len, 0.5),
                    xycoords=("data", "axes fraction"), xytext=(4, 0),
                    textcoords="offset points", fontsize=8,
                    color=CATEGORY_COLORS["activations"], va="top")
    _capacity(ax, b, scale)
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(5))  # tick labels that fit the width
    ax.set_xlim(tokens[0], tokens[-1])
    ax.set_ylim(0, 1.12 * largest / scale)
    ax.set_xlabel(f"tokens per micro-batch B x N (N={c.seq_len})")
    ax.set_ylabel(unit)
    ax.set_title("activations overtake the fixed memory" if cross else
                 "activations stay below the fixed memory", fontsize=10)
    ax.legend(fontsize=6, loc="upper left", frameon=False, ncol=2)


def memory_curve_figure(b: B.Budget, points: int = 24):
    """The memory curve as a figure of its own."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(4.8, 3.1))
    draw_memory_curve(ax, b, points)
    fig.tight_layout()
    plt.close(fig)
    return fig


def _swatch(name: str) -> str:
    return (f"<span style='display:inline-block;width:0.8em;height:0.8em;"
            f"background:{CATEGORY_COLORS[name]};margin-right:0.3em'></span>")


def memory_html(b: B.Budget) -> str:
    """One device's memory items, each with its colour, beside the whole model's."""
    c = b.config
    sharded = c.devices > 1
    head = "<tr><th>memory of one device</th><th>bytes</th>" + (
        "<th>whole model</th>" if sharded else "") + "</tr>"
    rows = []
    for name, value in b.memory().items():
        whole = b.fixed.get(name, value)
        rows.append(f"<tr><td>{_swatch(name)}{name}</td>"
                    f"<td style='text-align:right'>{B.human_bytes(value)}</td>"
                    + (f"<td style='text-align:right'>{B.human_bytes(whole)}</td>"
                       if sharded else "") + "</tr>")
    return f"<table class='budget-memory'>{head}{''.join(rows)}</table>"


def fit_html(b: B.Budget) -> str:
    """Fits / does not fit the device, the largest micro-batch, the step time."""
    d, c = b.device, b.config
    if d is None:
        return ("<span class='budget-fit-verdict'>no device chosen</span>: pick one in "
                "the devices tab to see whether a step fits and how long it takes.")
    parts = []
    if d.fits is not None:
        verdict = ("fits" if d.fits else "does not fit")
        colour = "#2a7d2a" if d.fits else "#b00"
        parts.append(f"<b class='budget-fit-verdict' style='color:{colour}'>{verdict}</b> "
                     f"on {html.escape(d.device)}: peak {B.human_bytes(d.peak)} of "
                     f"{B.human_bytes(d.memory)}")
        parts.append("largest micro-batch that fits: "
                     + (f"<b>B={d.largest_micro_batch}</b>" if d.largest_micro_batch
                        else "none (shard with ZeRO, recompute, or shorten N)"))
    if d.step_seconds is not None:
        parts.append(f"step {B.human_seconds(d.step_seconds)} at MFU {c.mfu:g}, "
                     f"{d.tokens_per_second:,.0f} tokens/s"
                     + (f" over {c.devices} devices" if c.devices > 1 else ""))
    return " &nbsp;|&nbsp; ".join(parts)


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
