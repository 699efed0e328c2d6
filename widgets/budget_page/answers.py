"""What the page shows for a configuration: engine.budget's numbers written by the
widget's renderers (widgets.budget_views; nothing computed here), kept in a small
cache keyed by the normalised settings, and computed a few at a time.

A BudgetConfig is frozen and compares by its knobs, so it is the cache's key: two
links that differ only in how they spell the same settings share one answer.
"""
from __future__ import annotations

import base64
import html
import io
import re
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from engine import budget as B
from engine.budget.devices import NO_DEVICE

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
