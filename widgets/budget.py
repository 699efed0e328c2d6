"""The training-step budget calculator: `engine.budget` behind sliders.

Every number on screen comes from `engine.budget`: the widget turns its
controls into a `BudgetConfig`, asks `budget(config)` and writes the answer
into widget models (`.value`), never printing, so a notebook that shows it
replays cleanly under nbval.

Layout: the controls (a tab per group of knobs: model, training, real step,
devices; "measure" under them) beside what they cost, side by side where the
output area is wide enough and in one column where it is not; labels wrap,
never cut.
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
  * under activations of hf, full fine-tuning against LoRA at two ranks: which
    terms shrink (gradients, optimizer state) and which do not (weights,
    activations), and why;
  * what the recompute setting saves and adds, FLOPs per token, per
    micro-batch and per optimizer step, and the collectives of data parallel;
  * "measure": runs our engine's GPT at the current shape (when it is small
    enough for this machine) and shows measured bytes beside predicted ones;
    the button says it is working with a steady time-left, and a result is
    shown only while the settings it was measured at are the ones on screen
    (after that, a line says they changed).
The controls are made from `engine.budget`'s table of knobs by
`widgets.budget_knobs`: a knob added to the table appears here with its help
and its bounds. Sizes (batch, sequence, width, accumulation) have a box for
the exact value and a slider that steps through powers of two; heads are
chosen among the divisors of the width. A knob that does nothing in the
current mode is greyed out, its reason said under its tab; one the mode
refuses is put back for the learner, and the widget says so. Impossible
settings show the message of `engine.budget` with the controls it names, all
of them enabled, and withdraw the last numbers: nothing stale is shown.
The panels and the plots are drawn by `widgets.budget_views`, which the
stand-alone page (`widgets.budget_app`) shares.
"""

from __future__ import annotations

import html
import statistics
import time

import ipywidgets as w

from engine import budget as B
from engine.budget import lab

from ._figures import PreviewHBox
from .budget_knobs import (FULL, STEPPED, WIDE, idle_knobs, label, make_controls,
                           named_fields, tab_of, zeros_hint)
from .budget_views import (BAR_PX, CURVE_PX, DPI, draw_memory_bar, draw_memory_curve,
                           fit_html, flops_html, lora_html, measured_html, parallel_html,
                           readout_html, tradeoff_html)

_THIS_MACHINE: dict = {}  # "this machine" as a device, once measured
SETTINGS_CHANGED = ("The settings changed since the measurement; press measure again to "
                    "measure these.")
# A selected toggle: white on dark blue (8.6:1; JupyterLab's own is grey on light grey,
# 1.6:1), and a black ring outside any control focused from the keyboard, so focus
# shows on a selected button too (JupyterLab's 1px light-blue ring does not).
SELECTED_BG, SELECTED_FG, FOCUS_RING = "#1f4e79", "#ffffff", "#000000"
SELECTED_AND_FOCUS = f"""
.budget-widget .widget-toggle-button.mod-active,
.budget-widget .widget-toggle-button.mod-active:hover:enabled {{
  background-color: {SELECTED_BG}; color: {SELECTED_FG}; font-weight: bold}}
.budget-widget .jupyter-button:focus-visible:enabled, .budget-widget input:focus-visible,
.budget-widget select:focus-visible {{outline: 2px solid {FOCUS_RING};
  outline-offset: 2px}}"""
# Responsive rules: the pictures shrink with their column and keep their box while a
# new picture loads; toggle buttons size to their labels and wrap; labels wrap, not cut.
STYLE = f"""<style>
.budget-widget {{gap: 6px 24px; align-items: flex-start}}
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
.budget-widget ul.budget-why {{margin: 2px 0; padding-left: 1.2em}}
.budget-widget table.budget-lora th, .budget-widget table.budget-lora td:first-child {{
  white-space: normal}}
.budget-widget table.budget-lora th, .budget-widget table.budget-lora td {{
  padding: 1px 4px}}
.budget-widget th {{text-align: left; border-bottom: 1px solid #bbb}}
.budget-widget td.num, .budget-widget th.num {{text-align: right;
  font-variant-numeric: tabular-nums}}
.budget-widget tr.budget-total td {{border-top: 1px solid #bbb; font-weight: bold}}
.budget-results .widget-html-content {{overflow-x: auto; max-width: 100%}}
.budget-results pre {{font-size: 11px; overflow-x: auto}}
.budget-fit {{font-size: 1.05em}}
.budget-note {{color: #1f4e79}}
{SELECTED_AND_FOCUS}
</style>"""


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
        self.error = ""          # engine.budget's message while the settings are invalid
        self._notes: list = []   # what the widget set for the learner, said once
        start = B.preset(preset, **changes)
        self.preset = w.Dropdown(options=list(B.PRESET_NAMES), value=preset,
                                 description="preset", style=WIDE,
                                 layout=w.Layout(**FULL))
        self.controls = make_controls(start)
        # Knobs the table keeps off the widget (a preset sets them): held as values.
        self.hidden = {f: getattr(start, f) for f in B.BudgetConfig.__dataclass_fields__
                       if f != "name" and f not in self.controls}
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
                         for name in STEPPED if name in self.controls}
        for name, stepper in self.steppers.items():
            stepper.add_class(f"budget-step-{name.replace('_', '-')}")
            stepper.observe(self._on_step, names="value")
        self.readout = w.HTML()
        self.readout.add_class("budget-readout")
        self.fit = w.HTML()
        self.fit.add_class("budget-fit")
        self.message = w.HTML()
        self.message.add_class("budget-message")
        self.note = w.HTML()
        self.note.add_class("budget-note")
        # Per tab, the controls greyed out now and why.
        self.idle_hints = {title: w.HTML() for title in
                           dict.fromkeys(tab_of(k) for k in B.shown_on("widget"))}
        for hint in self.idle_hints.values():
            hint.add_class("budget-idle")
        self.flops_table = w.HTML()
        self.tradeoff = w.HTML()
        self.tradeoff.add_class("budget-recompute")
        self.parallel = w.HTML()
        self.parallel.add_class("budget-parallel")
        self.lora = w.HTML()
        self.lora.add_class("budget-lora-panel")
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
        # Filled as the tape runs the step (engine.budget.lab.measure's progress callback).
        self.measure_progress = w.FloatProgress(value=0.0, min=0.0, max=1.0,
                                                layout=w.Layout(width="140px",
                                                                visibility="hidden"))
        self.measure_progress.add_class("budget-measure-progress")
        self._eta = TimeLeft()
        self._results = [self.readout, self.fit, self.flops_table, self.tradeoff,
                         self.parallel, self.lora, self.bar, self.curve]

    def _layout(self) -> PreviewHBox:
        """The controls in a tab per group of knobs, in the table's order, beside the
        results (one column where narrow)."""
        c = self.controls
        boxed = {n: w.HBox([c[n], self.steppers[n]], layout=w.Layout(**FULL))
                 if n in self.steppers else c[n] for n in c}
        groups: dict[str, list] = {}
        for k in B.shown_on("widget"):
            groups.setdefault(tab_of(k), []).append(k)
        pages = []
        for title, knobs in groups.items():
            hint = zeros_hint(knobs)
            extra = [w.HTML(f"<span class='budget-hint'>{hint}</span>")] if hint else []
            pages.append(w.VBox([boxed[k.field] for k in knobs] + extra
                                + [self.idle_hints[title]]))
        tabs = w.Tab(children=pages, titles=tuple(groups))
        tabs.add_class("budget-tabs")
        measuring = w.VBox([w.HBox([self.measure_button, self.measure_progress]),
                            self.measure_result])
        left = w.VBox([self.preset, tabs, measuring], layout=w.Layout(
            flex="1 1 340px", max_width="440px", min_width="0"))
        left.add_class("budget-controls")
        plots = w.HBox([self.bar, self.curve], layout=w.Layout(flex_flow="row wrap"))
        right = w.VBox([self.message, self.note, self.fit, self.readout, plots, self.lora,
                        self.tradeoff, self.flops_table, self.parallel],
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
            return "invalid settings: " + self.error
        b = self.result
        return (f"peak {B.human_bytes(b.peak)} = fixed {B.human_bytes(b.fixed_total)} + "
                f"activations {B.human_bytes(b.activations.peak)}; "
                f"{B.human_flops(b.flops['per_step']['total'])} per step "
                f"({B.tokens_per_step(b.config):,} tokens)")

    # ------------------------------------------------------------ state
    def config(self) -> B.BudgetConfig:
        """The configuration on screen (validated; raises BudgetError)."""
        return B.BudgetConfig(name=self.preset.value, **self.values()).validate()

    def values(self) -> dict:
        """Every knob's value: the controls' and those the widget does not show."""
        return {**self.hidden, **{name: c.value for name, c in self.controls.items()}}

    def _set(self, field: str, value) -> None:
        if field in self.controls:
            self.controls[field].value = value
        else:
            self.hidden[field] = value

    def _load(self, cfg: B.BudgetConfig) -> None:
        """Put a configuration on screen without recomputing after each knob."""
        self._loading = True
        try:
            self._set_choices(cfg.d_model, cfg.n_head)
            for name in self.values():
                self._set(name, getattr(cfg, name))
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
        for name, stepper in self.steppers.items():
            value = c[name].value
            top = max(value, STEPPED[name])
            powers = sorted({1 << k for k in range(top.bit_length()) if (1 << k) <= top}
                            | {value})
            if list(stepper.options) != powers:  # a new list re-renders the slider
                stepper.options = powers
            stepper.value = value
        self._grey_out_idle_knobs()

    def _grey_out_idle_knobs(self) -> None:
        """Knobs that do nothing now are greyed out, their reasons said under their tab;
        a value the mode refuses goes back to the knob's default, and a note says so."""
        values = self.values()
        idle = idle_knobs(values)
        greyed: dict[str, list] = {title: [] for title in self.idle_hints}
        for field, rule in idle.items():
            reason = rule.reason
            default = B.knob(field).default
            if rule.resets and values[field] != default:
                self._set(field, default)
                self._notes.append(f"<b>{html.escape(label(field))}</b> set back to "
                                   f"{html.escape(_said(default))} for you: "
                                   f"{html.escape(reason)}.")
            if field in self.controls:
                greyed[tab_of(B.knob(field))].append(
                    f"<b>{html.escape(label(field))}</b>: {html.escape(reason)}")
        for name, control in self.controls.items():
            control.disabled = name in idle
        for title, hint in self.idle_hints.items():
            hint.value = (f"<span class='budget-hint'>Greyed out now: "
                          f"{'; '.join(greyed[title])}.</span>" if greyed[title] else "")

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
        self.note.value = " ".join(self._notes)
        self._notes = []
        # A measurement belongs to the settings it ran at; say so when they move on.
        self.measure_result.value = SETTINGS_CHANGED if self.measured else ""
        self.measured = None
        try:
            self.result = B.budget(self.config())
        except B.BudgetError as exc:
            self.result, self.error = None, str(exc)
            self.message.value = self._message_html()
            for shown in self._results:  # the old numbers are withdrawn, not shown as current
                shown.layout.visibility = "hidden"
            return
        self.message.value, self.error = "", ""
        for shown in self._results:
            shown.layout.visibility = "visible"
        self.readout.value = readout_html(self.result)
        self.fit.value = fit_html(self.result)
        self.flops_table.value = flops_html(self.result)
        self.tradeoff.value = tradeoff_html(self.result)
        self.parallel.value = parallel_html(self.result)
        self.lora.value = lora_html(self.result)
        if self.plots:
            self._draw()

    def _message_html(self) -> str:
        """engine.budget's message, then where each knob it names is set, every one of
        them enabled: a message never sends the learner to a greyed-out control."""
        named = named_fields(self.error, self.values())
        where = []
        for field in named:
            if field in self.controls:
                self.controls[field].disabled = False
                where.append(f"<b>{html.escape(label(field))}</b> "
                             f"({tab_of(B.knob(field))} tab)")
        here = (f"<br><span class='budget-hint'>Change it here: {', '.join(where)}.</span>"
                if where else "")
        return (f"<b style='color:#b00'>Cannot compute this budget:</b> "
                f"{html.escape(self.error)}{here}")

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
            lab.measurable(settings)
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
            measured = lab.measure(settings, progress=self._measure_progress)
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


def _said(value) -> str:
    """A knob's value as a sentence says it: on/off for a switch."""
    return ("on" if value else "off") if isinstance(value, bool) else repr(value)


# --------------------------------------------------------------- rendering
