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
The panels and the plots are drawn by `widgets.budget_views`, which the
stand-alone page (`widgets.budget_app`) shares.
"""

from __future__ import annotations

import html
import statistics
import time

import ipywidgets as w
from traitlets import observe

from engine import budget as B

from ._figures import PreviewHBox
from .budget_views import (BAR_PX, CURVE_PX, DPI, draw_memory_bar, draw_memory_curve,
                           fit_html, flops_html, measured_html, parallel_html, readout_html,
                           tradeoff_html)

_THIS_MACHINE: dict = {}  # "this machine" as a device, once measured
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


# The four kinds of control; each is as wide as the controls' column, its label 132 px.
WIDE = {"description_width": "132px"}
FULL = {"width": "auto", "align_self": "stretch"}  # as wide as the controls' column


def slider(description, lo, hi, step=1, tip=None) -> w.IntSlider:
    return w.IntSlider(min=lo, max=hi, step=step, description=description, tooltip=tip,
                       style=WIDE, layout=w.Layout(**FULL), continuous_update=False)


def number(description, lo=0, hi=10**13, tip=None) -> w.BoundedIntText:
    return w.BoundedIntText(min=lo, max=hi, description=description, tooltip=tip,
                            style=WIDE, layout=w.Layout(**FULL))


def choice(description, options, tip=None) -> w.Dropdown:
    return w.Dropdown(options=list(options), description=description, tooltip=tip,
                      style=WIDE, layout=w.Layout(**FULL))


def toggles(description, options, tip=None) -> RedrawnToggleButtons:
    return RedrawnToggleButtons(options=list(options), description=description, tooltip=tip,
                                style={"button_width": "auto", **WIDE},
                                layout=w.Layout(**FULL))


def control_for(k: B.Knob):
    """A control made from a knob's row of the table: toggles for choices, a checkbox
    for a switch, a bounded number for a size."""
    label = k.field.replace("_", " ")
    if k.kind is bool:
        return w.Checkbox(description=label, indent=False, tooltip=k.help,
                          layout=w.Layout(**FULL))
    if k.choices:
        return toggles(label, k.choices, tip=k.help)
    if k.kind is int:
        return number(label, 0 if k.zero_means else k.low, k.high, tip=k.help)
    # a label the model's file sets (its model_type): shown, not edited
    return w.Text(description=label, tooltip=k.help, disabled=True, style=WIDE,
                  layout=w.Layout(**FULL))


def knobs(start: B.BudgetConfig) -> dict:
    """One control per BudgetConfig field, under the field's name, so loading a preset
    and reading the screen back are one loop each (heads' choices are set on load)."""
    controls = {
        "n_layer": slider("layers L", 1, 128),
        "d_model": number("width d", 1, 1 << 20),
        "n_head": choice("heads a", [start.n_head]),
        "vocab_size": number("vocabulary V", 1, 10**7),
        "d_ff": number("MLP width", tip="0: the usual rule (4d for GPT-2, about 8d/3 "
                                        "for LLaMA)"),
        "block_size": number("positions", tip="learned positions of the model; "
                                              "0: as many as the sequence N"),
        "tied_embedding": w.Checkbox(description="output head tied to the embedding",
                                     indent=False, layout=w.Layout(**FULL)),
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
                              layout=w.Layout(**FULL)),
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
                             style=WIDE, layout=w.Layout(**FULL),
                             continuous_update=False),
    }
    for k in B.KNOBS.values():  # every other knob of the table, made from its row
        controls.setdefault(k.field, control_for(k))
    for name, control in controls.items():  # stable handles for browser tests
        control.add_class(f"budget-knob-{name.replace('_', '-')}")
    return controls


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
        self.preset = choice("preset", B.PRESET_NAMES)
        self.preset.value = preset
        self.controls = knobs(start)
        self._make_results()
        self._load(start)
        self.preset.observe(self._on_preset, names="value")
        for control in self.controls.values():
            control.observe(self._update, names="value")
        self.measure_button.on_click(self.measure)
        self._update()
        self.ui = self._layout()

    def _make_results(self) -> None:
        """The power-of-two steppers beside the sizes, and every output of the widget."""
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

    def _layout(self) -> PreviewHBox:
        """The controls in three tabs beside the results (one column where narrow)."""
        c = self.controls
        sized = {n: w.HBox([c[n], self.steppers[n]], layout=w.Layout(**FULL))
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
        ui = PreviewHBox([w.HTML(STYLE), left, right], preview=self.preview_png,
                         layout=w.Layout(flex_flow="row wrap", width="100%"))
        ui.add_class("budget-widget")
        return ui

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
