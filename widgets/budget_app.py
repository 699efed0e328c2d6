"""The budget calculator as a page of its own: `python -m widgets.budget_app`.

One small web server (Python's standard library, no notebook, no kernel): a
form of the knobs practitioners set (model, micro-batch, sequence, precision,
activations, recompute, attention, devices, ZeRO stage, device) and, beside
it, what `engine.budget` says about them, written by the same functions as
`BudgetWidget`'s readout: the verdict for the device, one device's memory as
a table and a bar, when the peak happens, and every kept tensor.

    python -m widgets.budget_app                 # http://127.0.0.1:8866/, opens a browser
    python -m widgets.budget_app --preset llama2-7b --port 8870 --no-browser
    python -m widgets.budget_app --listen 0.0.0.0 --allow-host mybox.lan   # serve a network

Safety, by construction:
  * the settings live in the URL (`/?preset=gpt2-small&micro_batch=16`): the
    server renders the page for them, and the page rewrites the URL as knobs
    move, so a link reproduces what its sender saw;
  * every visitor is served by this one process: no kernel, no process per
    visitor, nothing to cull;
  * it listens on 127.0.0.1 unless `--listen` says otherwise, and answers only
    requests whose Host header names it (a web page in the same browser cannot
    reach it through DNS rebinding);
  * the page loads nothing from elsewhere (a Content-Security-Policy says so to
    the browser too), and it writes no files; SIGTERM and Ctrl-C stop it.
"""
from __future__ import annotations

import argparse
import base64
import html
import io
import json
import signal
import sys
import threading
import webbrowser
from dataclasses import fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlencode, urlsplit

from engine import budget as B

DEFAULT_PRESET = "gpt2-small"
# The knobs on the page, each with its choices (None: a whole number of at least `low`).
CHOICES = {
    "precision": B.PRECISIONS, "activation_model": B.ACTIVATION_MODELS,
    "recompute": B.RECOMPUTE, "attention": B.ATTENTIONS, "zero": B.ZERO_STAGES,
    "device": ("none", *B.DEVICES),
}
NUMBERS = {"micro_batch": 1, "seq_len": 1, "devices": 1}
LABELS = {"micro_batch": "micro-batch B", "seq_len": "sequence N", "precision": "precision",
          "activation_model": "activations of", "recompute": "recompute",
          "attention": "attention", "devices": "data-parallel devices",
          "zero": "ZeRO stage", "device": "device"}
KNOBS = tuple(LABELS)
_FIELD_TYPES = {f.name: f.type for f in fields(B.BudgetConfig)}
_DRAWING = threading.Lock()  # matplotlib draws one figure at a time


def config_from_query(query: str) -> B.BudgetConfig:
    """The configuration a URL's query names: a preset and the knobs changed from
    it. A bad value raises BudgetError naming it and what is allowed."""
    pairs = dict(parse_qsl(query, keep_blank_values=True))
    name = pairs.pop("preset", DEFAULT_PRESET)
    if name not in B.PRESET_NAMES:
        raise B.BudgetError(f"preset={name!r} is not one of {', '.join(B.PRESET_NAMES)}.")
    changes = {}
    for knob, text in pairs.items():
        if knob not in KNOBS:
            raise B.BudgetError(f"{knob!r} is not a setting of this page; "
                                f"the settings are preset, {', '.join(KNOBS)}.")
        if knob in NUMBERS or knob == "zero":
            try:
                value = int(text)
            except ValueError:
                raise B.BudgetError(f"{knob}={text!r} is not a whole number.") from None
        else:
            value = text
        if knob in CHOICES and value not in CHOICES[knob]:
            raise B.BudgetError(f"{knob}={text!r} is not one of "
                                f"{', '.join(map(str, CHOICES[knob]))}.")
        if knob in NUMBERS and value < NUMBERS[knob]:
            raise B.BudgetError(f"{knob}={value} must be at least {NUMBERS[knob]}.")
        changes[knob] = value
    return B.preset(name, **changes)


def query_of(cfg: B.BudgetConfig) -> str:
    """The query that reproduces `cfg`'s knobs on this page."""
    return urlencode({"preset": cfg.name, **{k: getattr(cfg, k) for k in KNOBS}})


def results(cfg: B.BudgetConfig) -> dict[str, str]:
    """The page's result panels as HTML, by element id, from engine.budget and the
    widget's renderers (nothing computed here)."""
    from widgets import budget_views as W
    try:
        b = B.budget(cfg)
    except B.BudgetError as exc:
        return {"message": f"<b>Cannot compute this budget:</b> {html.escape(str(exc))}"}
    with _DRAWING:
        fig = W.memory_bar_figure(b)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=W.DPI)
    picture = base64.b64encode(buffer.getvalue()).decode("ascii")
    return {"message": "", "fit": W.fit_html(b), "readout": W.readout_html(b),
            "bar": f"<img alt='the memory of one device, item by item' width='{W.BAR_PX[0]}' "
                   f"src='data:image/png;base64,{picture}'>",
            "parallel": W.parallel_html(b),
            "breakdown": f"<pre>{html.escape(B.describe_breakdown(b))}</pre>"}


def _control(knob: str, cfg: B.BudgetConfig) -> str:
    value = getattr(cfg, knob)
    label = f"<label for='{knob}'>{LABELS[knob]}</label>"
    if knob in NUMBERS:
        return (f"{label}<input type='number' id='{knob}' name='{knob}' "
                f"min='{NUMBERS[knob]}' value='{value}'>")
    if knob in ("zero", "precision", "recompute", "attention"):  # a row of buttons
        buttons = "".join(
            f"<label class='choice'><input type='radio' name='{knob}' value='{v}'"
            f"{' checked' if v == value else ''}><span>{v}</span></label>"
            for v in CHOICES[knob])
        return f"<span class='label'>{LABELS[knob]}</span><div class='buttons' id='{knob}'>" \
               f"{buttons}</div>"
    options = "".join(f"<option{' selected' if v == value else ''}>{html.escape(str(v))}"
                      f"</option>" for v in CHOICES[knob])
    return f"{label}<select id='{knob}' name='{knob}'>{options}</select>"


def page(query: str) -> str:
    """The whole page for the settings in `query`."""
    try:
        cfg, problem = config_from_query(query), ""
    except B.BudgetError as exc:
        cfg, problem = B.preset(DEFAULT_PRESET), str(exc)
    shown = results(cfg)
    if problem:
        shown["message"] = (f"<b>This link's settings were not understood:</b> "
                            f"{html.escape(problem)} Showing {DEFAULT_PRESET} instead.")
    presets = "".join(f"<option{' selected' if n == cfg.name else ''}>{n}</option>"
                      for n in B.PRESET_NAMES)
    knobs = "".join(f"<div class='knob'>{_control(k, cfg)}</div>" for k in KNOBS)
    panels = "".join(f"<div id='{k}' class='panel'>{shown.get(k, '')}</div>"
                     for k in ("message", "fit", "readout"))
    return TEMPLATE.format(
        style=W_STYLE, presets=presets, knobs=knobs, panels=panels,
        bar=shown.get("bar", ""), parallel=shown.get("parallel", ""),
        breakdown=shown.get("breakdown", ""), script=SCRIPT)


def assumptions_page() -> str:
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>Assumptions of the training-step budget</title></head><body>"
            f"<h1>What the budget assumes</h1><p><a href='./'>back to the calculator</a></p>"
            f"<pre style='white-space:pre-wrap;max-width:90ch'>"
            f"{html.escape(B.__doc__ or '')}</pre></body></html>")


W_STYLE = """
body {font-family: system-ui, sans-serif; margin: 16px 24px; color: #222}
h1 {font-size: 1.5em; margin: 0 0 4px}
.intro {max-width: 75ch; margin: 0 0 12px}
.layout {display: flex; flex-wrap: wrap; gap: 12px 32px; align-items: flex-start}
form {flex: 1 1 300px; max-width: 380px}
.results {flex: 1 1 420px; min-width: 0}
.knob {display: flex; flex-wrap: wrap; align-items: center; gap: 4px 8px; margin: 6px 0}
.knob > label, .knob > .label {flex: 0 0 150px}
.knob input[type=number], .knob select {flex: 1 1 120px; min-width: 0; padding: 3px}
.buttons {display: flex; flex-wrap: wrap; gap: 2px; flex: 1 1 150px}
.choice input {position: absolute; opacity: 0}
.choice span {display: inline-block; padding: 3px 9px; border: 1px solid #999;
  border-radius: 3px; cursor: pointer; background: #f3f3f3}
.choice input:checked + span {background: #2a5db0; color: white; border-color: #2a5db0}
.choice input:focus-visible + span {outline: 2px solid #2a5db0}
.panel:empty {display: none}
#message {color: #b00}
#fit {font-size: 1.1em; margin-bottom: 8px}
table {border-collapse: collapse; margin: 4px 0}
th, td {padding: 1px 8px; white-space: nowrap}
th {text-align: left; border-bottom: 1px solid #bbb}
td.num, th.num {text-align: right; font-variant-numeric: tabular-nums}
tr.budget-total td {border-top: 1px solid #bbb; font-weight: bold}
.budget-hint {font-size: 0.85em; color: #555; margin: 4px 0}
.pictures {display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start}
.pictures img {max-width: 100%; height: auto}
#readout, #parallel {overflow-x: auto; max-width: 100%}
details pre {font-size: 11px; overflow-x: auto; max-width: 100%}
.stale {opacity: 0.4}
"""

TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Training-step memory budget</title>
<style>{style}</style></head>
<body>
<h1>How much memory does one training step need?</h1>
<p class="intro">For a transformer, a batch shape and a precision, this page computes what
one device holds during a training step (weights, gradients, optimizer state and the
activations kept for the backward pass), the moment that memory peaks, and whether it fits
the device you pick. Every number comes from the course's <code>engine.budget</code>;
its assumptions are <a href="assumptions">written out here</a>.</p>
<div class="layout">
<form id="knobs" autocomplete="off">
<div class="knob"><label for="preset">model</label><select id="preset" name="preset">
{presets}</select></div>
{knobs}
</form>
<div class="results">
{panels}
<div class="pictures"><div id="bar">{bar}</div><div id="parallel">{parallel}</div></div>
<details><summary>every tensor kept for the backward pass, and the moments of the
step</summary><div id="breakdown">{breakdown}</div></details>
</div></div>
<script>{script}</script>
</body></html>
"""

# The page's only script: send the form, show the answer, keep the URL in step.
SCRIPT = """
const form = document.getElementById('knobs');
let asked = 0;
async function update(event) {
  const preset = event && event.target.name === 'preset';
  const query = preset ? 'preset=' + encodeURIComponent(form.preset.value)
                       : new URLSearchParams(new FormData(form)).toString();
  const mine = ++asked;
  document.querySelector('.results').classList.add('stale');
  const reply = await fetch('api/budget?' + query);
  const data = await reply.json();
  if (mine !== asked) return;  // a later move is on its way
  document.querySelector('.results').classList.remove('stale');
  for (const [id, value] of Object.entries(data.values || {})) {
    const radios = form.querySelectorAll('input[name="' + id + '"][type=radio]');
    if (radios.length) radios.forEach(r => { r.checked = r.value === String(value); });
    else if (form.elements[id]) form.elements[id].value = value;
  }
  for (const [id, value] of Object.entries(data.html)) {
    document.getElementById(id).innerHTML = value;
  }
  if (data.query) history.replaceState(null, '', '?' + data.query);
}
form.addEventListener('change', update);
form.addEventListener('submit', e => { e.preventDefault(); update(); });
"""


class Handler(BaseHTTPRequestHandler):
    """GET / (the page), /api/budget (its panels as JSON), /assumptions; nothing else."""
    allowed_hosts: frozenset = frozenset()
    server_version = "budget-app"
    sys_version = ""

    def do_GET(self) -> None:
        if self.headers.get("Host", "").lower() not in self.allowed_hosts:
            return self._send(403, "text/plain", "This server answers only its own "
                                                 "address; check the link.\n")
        url = urlsplit(self.path)
        if url.path == "/":
            return self._send(200, "text/html", page(url.query))
        if url.path == "/assumptions":
            return self._send(200, "text/html", assumptions_page())
        if url.path == "/api/budget":
            return self._send(200, "application/json", json.dumps(answer(url.query)))
        return self._send(404, "text/plain", "Not found.\n")

    def _send(self, status: int, kind: str, body: str) -> None:
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", f"{kind}; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Security-Policy",
                         "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
                         "script-src 'unsafe-inline'; connect-src 'self'; "
                         "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format, *args) -> None:  # quiet: one line per error only
        if args and str(args[1] if len(args) > 1 else "").startswith(("4", "5")):
            super().log_message(format, *args)


def answer(query: str) -> dict:
    """The JSON the page's script asks for: panels, the knobs' values, the URL query."""
    try:
        cfg = config_from_query(query)
    except B.BudgetError as exc:
        return {"html": {"message": f"<b>Cannot compute this budget:</b> "
                                    f"{html.escape(str(exc))}"}}
    return {"html": results(cfg), "values": {"preset": cfg.name,
                                             **{k: getattr(cfg, k) for k in KNOBS}},
            "query": query_of(cfg)}


def host_names(listen: str, port: int, extra=()) -> frozenset:
    """The Host headers this server answers: its own address and the loopback names."""
    names = {"127.0.0.1", "localhost", "[::1]", *extra}
    if listen not in ("0.0.0.0", "::", ""):
        names.add(f"[{listen}]" if ":" in listen else listen)
    return frozenset(f"{n.lower()}:{port}" for n in names)


def serve(listen: str, port: int, extra_hosts=()) -> ThreadingHTTPServer:
    import matplotlib
    matplotlib.use("Agg")  # pictures as PNG bytes; no window, no display
    handler = type("BudgetHandler", (Handler,),
                   {"allowed_hosts": host_names(listen, port, extra_hosts)})
    server = ThreadingHTTPServer((listen, port), handler)
    server.daemon_threads = True
    return server


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m widgets.budget_app",
                                 description="The training-step budget calculator as a "
                                             "page of its own.")
    ap.add_argument("--preset", default=DEFAULT_PRESET, choices=B.PRESET_NAMES,
                    help=f"the model the page opens with (default: {DEFAULT_PRESET})")
    ap.add_argument("--port", type=int, default=8866, help="port (default 8866)")
    ap.add_argument("--listen", default="127.0.0.1", metavar="ADDRESS",
                    help="the address to serve on (default 127.0.0.1: this machine only); "
                         "0.0.0.0 serves every network this machine is on")
    ap.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                    help="a host name visitors use to reach it (with --listen), e.g. "
                         "mybox.lan; repeat for several")
    ap.add_argument("--no-browser", action="store_true", help="only serve; open no browser")
    args = ap.parse_args(argv)
    if not 0 < args.port < 65536:
        ap.error(f"--port {args.port}: choose a port between 1 and 65535, e.g. 8866")
    try:
        server = serve(args.listen, args.port, args.allow_host)
    except OSError as exc:
        print(f"error: cannot serve on {args.listen}:{args.port}: {exc.strerror}; "
              f"choose another --port.", file=sys.stderr)
        return 2
    results(B.preset(args.preset))  # the first visitor need not wait for matplotlib to load
    # SIGTERM stops the server as Ctrl-C does; it started nothing else and wrote no file.
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    host = "127.0.0.1" if args.listen in ("0.0.0.0", "::") else args.listen
    url = f"http://{host}:{args.port}/?" + query_of(B.preset(args.preset))
    print(f"the budget calculator: {url} (Ctrl-C stops it)", flush=True)
    if not args.no_browser:
        webbrowser.open(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
