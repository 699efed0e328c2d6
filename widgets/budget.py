"""The training-step budget calculator: `engine.budget` behind sliders.

Every number on screen comes from `engine.budget`: the widget turns its
controls into a `BudgetConfig`, asks `budget(config)` and writes the answer
into widget models (`.value`), never printing, so a notebook that shows it
replays cleanly under nbval.

Layout: the controls (three tabs: model, training, devices, and "measure"
under them) beside what they cost, side by side where the output area is
wide enough and in one column where it is not; labels wrap, never cut.
  * the fit line (`budget-fit`): fits / does not fit the chosen device (its
    memory in GB, with the GiB its data sheet quotes), the largest
    micro-batch that does, the step time and tokens/s;
  * the readout (DOM class `budget-readout`): the peak of one device (exact
    bytes in a span of class `budget-peak-bytes` for tests that read the
    page; each control carries the class `budget-knob-<field>`, e.g.
    `budget-knob-micro-batch`, the power-of-two slider beside a size box
    `budget-step-<field>`), a table of its items (bytes, share of the peak,
    the whole model's bytes over several devices), each item in its own
    colour in the table, the bar and the curve; then one line on when the
    peak happens and the largest tensor the forward keeps;
  * a stacked bar of the memory items and the memory against B x N, with
    the device's capacity as a line and the legends under the axes: two
    images redrawn from two figures kept for the widget's life, so a move
    swaps the picture in place;
  * what the recompute setting saves and adds, FLOPs per token, per
    micro-batch and per optimizer step, and the collectives of data parallel;
  * "measure": runs our engine's GPT at the current shape (when it is small
    enough for this machine) and shows measured bytes beside predicted ones;
    the button says it is working with a steady time-left, and a result is
    shown only while the settings it was measured at are the ones on screen
    (after that, a line says they changed).
Sizes (batch, sequence, width) have a box for the exact value and a slider
that steps through powers of two; heads are chosen among the divisors of the
width; knobs that do nothing in the current mode are disabled. Impossible
settings show the message of `engine.budget` and grey out the last numbers.
"""

from __future__ import annotations

import html
import statistics
import time

import ipywidgets as w
from traitlets import observe

from engine import budget as B

from ._figures import PreviewHBox

CATEGORY_COLORS = {
    "weights": "#4c72b0", "master weights": "#8172b3", "gradients": "#55a868",
    "optimizer state": "#ccb974", "activations": "#c44e52", "recompute transient": "#e8a0a2",
    "step transient": "#dd8452",
}
_THIS_MACHINE: dict = {}  # "this machine" as a device, once measured
DPI = 90
GiB = 2 ** 30  # data sheets quote device memory in these
BAR_PX, CURVE_PX = (216, 288), (414, 288)  # the two pictures, width x height in pixels
SETTINGS_CHANGED = ("The settings changed since the measurement; press measure again to "
                    "measure these.")
# Responsive rules: the pictures shrink with their column and keep their box while a
# new picture loads; toggle buttons size to their labels and wrap; labels wrap, not cut.
STYLE = f"""<style>
.budget-widget {{gap: 6px 24px; align-items: flex-start}}
.budget-stale {{opacity: 0.35; filter: grayscale(1)}}
.budget-widget img.budget-plot-bar {{max-width: 100%; height: auto;
  aspect-ratio: {BAR_PX[0]} / {BAR_PX[1]}; flex: 0 1 {BAR_PX[0]}px; min-width: 0}}
.budget-widget img.budget-plot-curve {{max-width: 100%; height: auto;
  aspect-ratio: {CURVE_PX[0]} / {CURVE_PX[1]}; flex: 1 1 300px; min-width: 0}}
.budget-controls .widget-toggle-buttons > div {{display: flex; flex-wrap: wrap; gap: 2px;
  flex: 1 1 0; min-width: 0}}
.budget-controls .widget-toggle-button {{width: auto; min-width: 0; margin: 0;
  padding: 0 9px}}
.budget-widget .widget-label, .budget-widget .widget-label-basic {{white-space: normal;
  overflow-wrap: anywhere; line-height: 1.15}}
.budget-widget .widget-inline-hbox .widget-label {{align-self: center}}
.budget-widget .widget-text input, .budget-widget select {{min-width: 0}}
.budget-widget .widget-button {{overflow: visible}}
.budget-hint {{display: block; font-size: 0.85em; line-height: 1.35; color: #555;
  margin: 2px 0}}
.budget-widget table {{border-collapse: collapse; margin: 4px 0}}
.budget-widget th, .budget-widget td {{padding: 1px 8px; white-space: nowrap}}
.budget-widget th {{text-align: left; border-bottom: 1px solid #bbb}}
.budget-widget td.num, .budget-widget th.num {{text-align: right;
  font-variant-numeric: tabular-nums}}
.budget-widget tr.budget-total td {{border-top: 1px solid #bbb; font-weight: bold}}
.budget-results .widget-html-content {{overflow-x: auto; max-width: 100%}}
.budget-results pre {{font-size: 11px; overflow-x: auto}}
.budget-fit {{font-size: 1.05em}}
</style>"""


class RedrawnToggleButtons(w.ToggleButtons):
    """Toggle buttons that show a change of `disabled` at once. ipywidgets 8's view
    applies `disabled` only when it rebuilds its buttons, which it does when the
    labels or the icons change; so each change of `disabled` also swaps `icons`
    between two lists that draw no icon."""

    @observe("disabled")
    def _redraw(self, change) -> None:
        with self.hold_sync():
            self.icons = [""] * len(self.options) if not self.icons else []


class TimeLeft:
    """The seconds left of a run, said steadily: the estimates of the whole run's
    length (elapsed + left) are reduced to their median, so one odd estimate does
    not make the figure jump, and the figure shown never goes up."""

    def start(self) -> None:
        self.began, self.totals, self.shown = time.monotonic(), [], None

    def __call__(self, seconds_left: float) -> str:
        elapsed = time.monotonic() - self.began
        self.totals.append(elapsed + seconds_left)
        left = max(statistics.median(self.totals) - elapsed, 0.0)
        self.shown = left if self.shown is None else min(left, self.shown)
        if len(self.totals) < 3:
            return "estimating the time left"
        if self.shown < 1:
            return "almost done"
        return f"about {self.shown:.0f} s left" if self.shown < 10 else \
            f"about {5 * round(self.shown / 5):.0f} s left"


class BudgetWidget:
    """Controls for every knob of `engine.budget.BudgetConfig`.

    `BudgetWidget(preset="gpt2-small", micro_batch=4)` starts from a preset
    with some knobs changed; `.ui` is the widget to display (displaying the
    object itself works too). `.config()` is the configuration on screen and
    `.result` the last `Budget` computed (None while the settings are invalid).
    """

    def __init__(self, preset: str = "gpt2-small", plots: bool = True, **changes):
        self.plots = plots
        self.result: B.Budget | None = None
        self.measured: dict | None = None
        self._loading = False
        self._figures: list = []
        start = B.preset(preset, **changes)
        wide = {"description_width": "132px"}
        full = {"width": "auto", "align_self": "stretch"}  # as wide as the controls' column

        def slider(description, lo, hi, step=1, tip=None):
            return w.IntSlider(min=lo, max=hi, step=step, description=description,
                               tooltip=tip, style=wide, layout=w.Layout(**full),
                               continuous_update=False)

        def number(description, lo=0, hi=10**13, tip=None):
            return w.BoundedIntText(min=lo, max=hi, description=description, tooltip=tip,
                                    style=wide, layout=w.Layout(**full))

        def choice(description, options, tip=None):
            return w.Dropdown(options=list(options), description=description, tooltip=tip,
                              style=wide, layout=w.Layout(**full))

        def toggles(description, options, tip=None):
            return RedrawnToggleButtons(options=list(options), description=description,
                                        tooltip=tip, style={"button_width": "auto", **wide},
                                        layout=w.Layout(**full))

        self.preset = choice("preset", B.PRESET_NAMES)
        self.preset.value = preset
        # One control per BudgetConfig field; the names match so loading a
        # preset and reading the screen back are one loop each.
        self.controls = {
            "n_layer": slider("layers L", 1, 128),
            "d_model": number("width d", 1, 1 << 20),
            "n_head": choice("heads a", [start.n_head]),
            "vocab_size": number("vocabulary V", 1, 10**7),
            "d_ff": number("MLP width", tip="0: the usual rule (4d for GPT-2, about 8d/3 "
                                            "for LLaMA)"),
            "block_size": number("positions", tip="learned positions of the model; "
                                                  "0: as many as the sequence N"),
            "tied_embedding": w.Checkbox(description="output head tied to the embedding",
                                         indent=False, layout=w.Layout(**full)),
            "n_params": number("parameter count", tip="0: counted from the shape; a number "
                                                      "here replaces that count"),
            "micro_batch": number("micro-batch B", 1, 1 << 20),
            "seq_len": number("sequence N", 1, 1 << 22),
            "accumulation": slider("accumulation K", 1, 256,
                                   tip="micro-batches summed into one optimizer step"),
            "precision": toggles("precision", B.PRECISIONS),
            "optimizer": toggles("optimizer", B.OPTIMIZERS),
            "activation_model": toggles("activations of", B.ACTIVATION_MODELS,
                                        tip="rule: k tensors per layer; transformer: op by "
                                            "op; engine: our GPT; pytorch, hf: a real "
                                            "PyTorch / Hugging Face step"),
            "tensors_per_layer": slider("tensors per layer", 1, 64,
                                        tip="the rule of thumb's k (activations of: rule)"),
            "dropout": w.Checkbox(description="dropout masks", indent=False,
                                  layout=w.Layout(**full)),
            "recompute": toggles("recompute", B.RECOMPUTE),
            "attention": toggles("attention", B.ATTENTIONS,
                                 tip="standard keeps the N x N probabilities; flash one "
                                     "number per row"),
            "architecture": toggles("architecture", B.ARCHITECTURES),
            "n_kv_head": choice("key/value heads", [("one per head", 0)]),
            "d_head": number("head size", 0, 1 << 16, tip="0: width / heads (LLaMA only)"),
            "grad_precision": toggles("gradients in", B.GRAD_PRECISIONS,
                                      tip="storage: the weights' precision; fp32: "
                                          "accumulated in fp32"),
            "devices": number("data-parallel devices", 1, 1 << 20),
            "zero": toggles("ZeRO stage", B.ZERO_STAGES,
                            tip="what the devices shard: 1 optimizer state, 2 and "
                                "gradients, 3 and weights"),
            "device": choice("device", ["none", *B.DEVICES, B.THIS_MACHINE]),
            "device_memory": number("memory (bytes)", 0, 10**15,
                                    tip="0: the chosen device's"),
            "device_flops": number("FLOP/s", 0, 10**18, tip="0: the chosen device's"),
            "mfu": w.FloatSlider(min=0.05, max=1.0, step=0.05, description="MFU",
                                 tooltip="model FLOP utilization: the share of the device's "
                                         "FLOP/s a step achieves",
                                 style=wide, layout=w.Layout(**full),
                                 continuous_update=False),
        }
        for name, control in self.controls.items():  # stable handles for browser tests
            control.add_class(f"budget-knob-{name.replace('_', '-')}")
        # Power-of-two sliders beside the exact boxes of the sizes.
        self.steppers = {name: w.SelectionSlider(options=[1], description="", readout=False,
                                                 continuous_update=False,
                                                 layout=w.Layout(width="110px",
                                                                 flex="0 0 110px"))
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
        self.flops_table = w.HTML()
        self.tradeoff = w.HTML()
        self.tradeoff.add_class("budget-recompute")
        self.parallel = w.HTML()
        self.parallel.add_class("budget-parallel")
        # Images keep their box (CSS aspect-ratio) while their picture is swapped:
        # no blank, no collapse; they shrink with a narrow column.
        self.bar = w.Image(format="png", layout=w.Layout(width=f"{BAR_PX[0]}px"))
        self.curve = w.Image(format="png", layout=w.Layout(width=f"{CURVE_PX[0]}px"))
        self.bar.add_class("budget-plot-bar")
        self.curve.add_class("budget-plot-curve")
        self.measure_button = w.Button(description="measure on our engine",
                                       tooltip="run one step of this course's engine at this "
                                               "shape and show the bytes it used",
                                       button_style="info",
                                       layout=w.Layout(width="auto", min_width="190px"))
        self.measure_button.add_class("budget-measure")
        self.measure_result = w.HTML()
        self.measure_result.add_class("budget-measured")
        # Filled as the tape runs the step (engine.budget.measure's progress callback).
        self.measure_progress = w.FloatProgress(value=0.0, min=0.0, max=1.0,
                                                layout=w.Layout(width="140px",
                                                                visibility="hidden"))
        self.measure_progress.add_class("budget-measure-progress")
        self._eta = TimeLeft()
        self._results = [self.readout, self.fit, self.flops_table, self.tradeoff,
                         self.parallel, self.bar, self.curve]

        self._load(start)
        self.preset.observe(self._on_preset, names="value")
        for control in self.controls.values():
            control.observe(self._update, names="value")
        self.measure_button.on_click(self.measure)
        self._update()

        c = self.controls
        sized = {n: w.HBox([c[n], self.steppers[n]], layout=w.Layout(**full))
                 for n in self.steppers}
        zeros = w.HTML("<span class='budget-hint'>A 0 in MLP width, positions, parameter "
                       "count or head size means the usual value (hover a label).</span>")
        model = w.VBox([c["architecture"], c["n_layer"], sized["d_model"], c["n_head"],
                        c["n_kv_head"], c["d_head"], c["vocab_size"], c["d_ff"],
                        c["block_size"], c["tied_embedding"], c["n_params"], zeros])
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
        measuring = w.VBox([w.HBox([self.measure_button, self.measure_progress]),
                            self.measure_result])
        left = w.VBox([self.preset, tabs, measuring], layout=w.Layout(
            flex="1 1 340px", max_width="440px", min_width="0"))
        left.add_class("budget-controls")
        plots = w.HBox([self.bar, self.curve], layout=w.Layout(flex_flow="row wrap"))
        right = w.VBox([self.message, self.fit, self.readout, plots, self.tradeoff,
                        self.flops_table, self.parallel],
                       layout=w.Layout(flex="1 1 420px", min_width="0"))
        right.add_class("budget-results")
        # Side by side where there is room; one column (controls first) where there is not.
        self.ui = PreviewHBox([w.HTML(STYLE), left, right], preview=self.preview_png,
                              layout=w.Layout(flex_flow="row wrap", width="100%"))
        self.ui.add_class("budget-widget")

    def _repr_mimebundle_(self, **kwargs):
        return self.ui._repr_mimebundle_(**kwargs)

    def preview_png(self) -> bytes | None:
        """The peak's readout and the two pictures as one PNG: what a notebook saved
        without the widget's state shows in its place."""
        if self.result is None or not self.plots:
            return None
        import io
        import matplotlib.pyplot as plt
        fig, (bar, curve) = plt.subplots(1, 2, figsize=(8.4, 3.4), dpi=DPI,
                                         gridspec_kw={"width_ratios": (1, 2.2)})
        draw_memory_bar(bar, self.result)
        draw_memory_curve(curve, self.result)
        fig.suptitle(f"{self.result.config.name}: peak of one device "
                     f"{B.human_bytes(self.result.peak)} (a picture of the calculator; run "
                     f"the cell for the live one)", fontsize=9)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        plt.close(fig)
        return buffer.getvalue()

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
        # A measurement belongs to the settings it ran at; say so when they move on.
        self.measure_result.value = SETTINGS_CHANGED if self.measured else ""
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
            self._figures = [plt.figure(figsize=(BAR_PX[0] / DPI, BAR_PX[1] / DPI), dpi=DPI),
                             plt.figure(figsize=(CURVE_PX[0] / DPI, CURVE_PX[1] / DPI),
                                        dpi=DPI)]
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
        self._eta.start()
        try:
            measured = B.measure(settings, progress=self._measure_progress)
        finally:
            self.measure_button.disabled = False
            self.measure_button.description = "measure on our engine"
            self.measure_progress.layout.visibility = "hidden"
        if self.result is None or self.result.config != settings:
            self.measured = None
            self.measure_result.value = SETTINGS_CHANGED
            return
        self.measured = measured
        self.measure_result.value = measured_html(measured)

    def _measure_progress(self, fraction: float, seconds_left: float) -> None:
        """Widget values travel to the browser while the step still runs."""
        self.measure_progress.value = fraction
        self.measure_result.value = (f"running one forward and backward of our engine's GPT: "
                                     f"{fraction:.0%} done, {self._eta(seconds_left)}")


# --------------------------------------------------------------- rendering
def readout_html(b: B.Budget) -> str:
    """The peak of one device (exact bytes in span.budget-peak-bytes), its items as a
    table, when the peak happens and its largest tensor, and the sizes behind them."""
    c = b.config
    per_parameter = sum(B.bytes_per_parameter(c.precision, c.optimizer, c.grad_precision,
                                              c.autocast).values())
    one_device = "one device" if c.devices > 1 else "the device"
    return (f"<div class='budget-headline'><b>peak of {one_device}: "
            f"<span class='budget-peak'>{B.human_bytes(b.peak)}</span></b> "
            f"(<span class='budget-peak-bytes'>{b.peak:,}</span> bytes)</div>"
            + memory_html(b) + peak_moment_html(b)
            + f"<div class='budget-hint'>{B.human_count(b.parameters)} parameters, "
              f"{per_parameter} bytes of fixed memory per parameter; one "
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
    if step is not None:
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
    """The verdict for the chosen device, the largest micro-batch that fits, the step time."""
    d, c = b.device, b.config
    if d is None:
        return ("<span class='budget-fit-verdict'>no device chosen</span>: pick one under "
                "devices to see whether a step fits and how long it takes.")
    parts = []
    if d.fits is not None:
        verdict = ("fits" if d.fits else "does not fit")
        colour = "#2a7d2a" if d.fits else "#b00"
        parts.append(f"<b class='budget-fit-verdict' style='color:{colour}'>{verdict}</b> "
                     f"on {html.escape(d.device)}: peak {B.human_bytes(d.peak)} of "
                     f"{B.human_device_memory(d.memory)}.")
        parts.append("Largest micro-batch that fits: "
                     + (f"<b>B={d.largest_micro_batch}</b>." if d.largest_micro_batch
                        else "none (more devices with a ZeRO stage, recompute, or a "
                             "shorter N)."))
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
