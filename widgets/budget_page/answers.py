"""What the page shows for a configuration: engine.budget's numbers written by the
widget's renderers (widgets.budget_views; nothing computed here), kept in a small
cache keyed by the normalised settings, and computed a few at a time.

A BudgetConfig is frozen and compares by its knobs, so it is the cache's key: two
links that differ only in how they spell the same settings share one answer.
"""
from __future__ import annotations

import base64
import functools
import html
import io
import re
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from engine import budget as B
from engine.budget.devices import NO_DEVICE
from engine.budget.plan import plan

CACHE_SIZE = 256
MAX_DRAWINGS = 2            # one per core: more would only queue inside matplotlib
SLOT_WAIT_SECONDS = 2.0     # a visitor's quick changes overlap; a flood gets 503 after this
_cache: OrderedDict = OrderedDict()
_cache_lock = threading.Lock()
# matplotlib draws one figure at a time, always on this one thread: its font cache is
# per thread, each entry an open font file, so drawing on many threads holds many files.
_drawer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="budget-drawing")
_slots = threading.BoundedSemaphore(MAX_DRAWINGS)


class Busy(Exception):
    """Every drawing slot is taken: the visitor is asked to retry (503)."""


def cached(cfg: B.BudgetConfig) -> dict | None:
    with _cache_lock:
        if cfg in _cache:
            _cache.move_to_end(cfg)
            return _cache[cfg]
    return None


def answer(cfg: B.BudgetConfig) -> dict:
    """The panels for `cfg`, from the cache or computed now; Busy when MAX_DRAWINGS
    others have been computing for SLOT_WAIT_SECONDS (the caller says 503 rather than
    queueing without end)."""
    found = cached(cfg)
    if found is not None:
        return found
    if not _slots.acquire(timeout=SLOT_WAIT_SECONDS):
        raise Busy()
    try:
        panels = _panels(cfg)
    finally:
        _slots.release()
    with _cache_lock:
        _cache[cfg] = panels
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return panels


def _draw_bar(b: B.Budget) -> bytes:
    from widgets import budget_views as W
    fig = W.memory_bar_figure(b)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=W.DPI)
    return buffer.getvalue()


def _picture(b: B.Budget) -> str:
    from widgets import budget_views as W
    data = base64.b64encode(_drawer.submit(_draw_bar, b).result()).decode("ascii")
    return (f"<img alt='the memory of one device, item by item' width='{W.BAR_PX[0]}' "
            f"src='data:image/png;base64,{data}'>")


def _panels(cfg: B.BudgetConfig) -> dict:
    from widgets import budget_views as W
    b = B.budget(cfg)
    fit = W.fit_html(b) + fit_answers_html(b) + checkpointing_html(b)
    return {"fit": fit, "verdict": plain_text(fit), "readout": W.readout_html(b),
            "bar": _picture(b), "parallel": W.parallel_html(b),
            "breakdown": f"<pre>{html.escape(B.describe_breakdown(b))}</pre>",
            "lora": W.lora_html(b),
            "model": html.escape(cfg.name), "peak": b.peak}


def fit_answers_html(b: B.Budget) -> str:
    """What the widget's fit line leaves unsaid (it gives the headroom, the largest
    micro-batch, the longest sequence and the fewest devices): that no number of these
    devices fits, when none does."""
    d = b.device
    if d is None or d.fits is not False or d.fewest_devices:
        return ""
    return ("<div class='fit-more'>No number of these devices fits this micro-batch: "
            "recompute, a shorter sequence or a larger card.</div>")


def checkpointing_html(b: B.Budget) -> str:
    """Where a device is chosen, nothing is recomputed and the activations are most of
    the peak, gradient checkpointing offered with its peak (the budget at recompute
    full) and whether that fits, as a button that turns it on."""
    c, d = b.config, b.device
    if (d is None or not d.memory or c.recompute != "none"
            or 2 * b.memory().get("activations", 0) <= b.peak):
        return ""
    try:
        full = B.budget(c.with_(recompute="full", device=NO_DEVICE, device_memory=0,
                                device_flops=0))
    except B.BudgetError:  # a step that cannot recompute offers nothing
        return ""
    peak = max(full.peak, full.peak_first_step)  # as the verdict reads a peak
    fits = "fits" if peak + c.headroom <= d.memory else "does not fit"
    return ("<div class='fit-offer'><button type='button' class='set' data-knob='recompute' "
            "data-value='full'>turn on gradient checkpointing</button>: "
            f"{B.human_bytes(peak)}, {fits}.</div>")


def plain_text(fragment: str) -> str:
    """An HTML fragment's words, for the screen reader's announcement."""
    words = re.sub(r"<[^>]+>", "", re.sub(r"</?div[^>]*>", " ", fragment))
    return html.unescape(re.sub(r"\s+", " ", words)).strip()


# ------------------------------------------------------------------------- the plan
PLAN_COLUMNS = ("#", "micro-batch x accum.", "recompute", "attention", "ZeRO",
                "tuning", "step", "peak", "why slower than the row above")


@functools.lru_cache(maxsize=64)
def plan_html(cfg: B.BudgetConfig) -> str:
    """engine.budget.plan's table for `cfg`, at the tokens per step its settings give
    (micro-batch x sequence x accumulation x devices), with what the step time assumes
    and what the compatibility table refused. BudgetError where no device is chosen."""
    found = plan(cfg)
    head = "".join(f"<th scope='col'{' class=num' if c in ('step', 'peak') else ''}>"
                   f"{c}</th>" for c in PLAN_COLUMNS)
    rows = []
    for i, r in enumerate(found.rows, 1):
        s = r.settings()
        cells = (f"<td class='num'>{i}</td><td>{s['micro_batch']} x {s['accumulation']}</td>"
                 f"<td>{s['recompute']}</td><td>{s['attention']}</td><td>{s['zero']}</td>"
                 f"<td>{html.escape(s['fine_tuning'])}</td>"
                 f"<td class='num'>{r.step_seconds:.3g} s</td>"
                 f"<td class='num'>{B.human_bytes(r.peak)}</td>"
                 f"<td class='why'>{html.escape(r.why)}</td>")
        rows.append(f"<tr>{cells}</tr>")
    table = (f"<table class='plan-table'><thead><tr>{head}</tr></thead>"
             f"<tbody>{''.join(rows)}</tbody></table>" if rows else
             "<p class='plan-none'>No setting fits: more devices, a shorter sequence, LoRA "
             "or a larger card would.</p>")
    refused = "".join(f"<li>{n} setting(s): {html.escape(why)}</li>" for why, n in found.refused)
    assumptions = "".join(f"<li>{html.escape(a)}</li>" for a in found.assumptions)
    return (f"<p class='plan-count'>{len(found.rows)} setting(s) fit, fastest first.</p>"
            f"<div class='plan-scroll' tabindex='0' role='region' aria-label='the plan, "
            f"fastest first'>{table}</div>"
            f"<p class='budget-hint'>The step time assumes:</p><ul class='budget-why'>"
            f"{assumptions}</ul>"
            + (f"<p class='budget-hint'>Refused by the compatibility table, never listed:"
               f"</p><ul class='budget-why'>{refused}</ul>" if refused else ""))
