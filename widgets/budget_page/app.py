"""The page's web application (Starlette): five routes, the Host allow-list, and the
security headers every response carries (the server gives them to uvicorn, which adds
them to each answer it sends, its own 400 and 503 included).

    GET /                the page (static: its script builds the controls)
    GET /static/NAME     its script and style, held in memory (no file is opened
                         per request, so a flood holds no handle)
    GET /api/knobs       the controls, from engine.budget's knob table
    GET /api/budget?...  what engine.budget says for the settings: 200 with the
                         panels, 400 naming the knob and its fix, 503 when busy
                         (`hf_model=owner/name`: a Hub model's config.json, fetched
                         on a worker thread, once per model)
    GET /api/plan?...    the plan for the same settings: the ones that fit, fastest
                         first (engine.budget.plan), or 400 naming the fix
    GET /assumptions?... what the answer for the settings assumes: the docstrings of
                         the modules that model its step (budget_page.assumptions)

Every route but the budget's is async: it runs on the event loop, so a crowd waiting
for the worker threads that compute budgets never delays the page itself.
"""
from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from engine import budget as B

from . import answers, assumptions, settings

STATIC = Path(__file__).with_name("static")
_KINDS = {".js": "text/javascript", ".css": "text/css", ".html": "text/html"}
SECURITY_HEADERS = [
    ("content-security-policy",
     "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
     "img-src data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
     "base-uri 'none'"),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
    ("cross-origin-opener-policy", "same-origin"),
    ("cross-origin-resource-policy", "same-origin"),
    ("cache-control", "no-store"),
]


def _load_static() -> dict[str, tuple[bytes, str]]:
    return {p.name: (p.read_bytes(), _KINDS[p.suffix]) for p in STATIC.iterdir()
            if p.suffix in _KINDS}


def _cross_site(request: Request) -> bool:
    """A request another web site's page made (the browser says so): the API
    answers only the page itself."""
    return request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none")


# Budgets being computed or waiting for a worker: beyond this a request is told 503 at
# once, rather than queueing behind a crowd (counted on the event loop: no lock needed).
MAX_PENDING = 4 * answers.MAX_DRAWINGS
_pending = 0


async def _compute(cfg) -> dict:
    global _pending
    if _pending >= MAX_PENDING:
        raise answers.Busy()
    _pending += 1
    try:
        return await run_in_threadpool(answers.answer, cfg)
    finally:
        _pending -= 1


async def budget_route(request: Request) -> Response:
    if _cross_site(request):
        return JSONResponse({"ok": False, "error": "This calculator answers its own page "
                             "only; open it at its address."}, status_code=403)
    params = dict(request.query_params)
    try:
        if "hf_model" in params:  # the network, at most once per model: off the event loop
            await run_in_threadpool(settings.hub_model, params["hf_model"])
        cfg, query, notes = settings.settings_of(params)
        panels = answers.cached(cfg) or await _compute(cfg)
    except B.BudgetError as exc:
        message = str(exc)
        return JSONResponse({"ok": False, "error": message,
                             "knobs": settings.named_knobs(message)}, status_code=400)
    except answers.Busy:
        return JSONResponse({"ok": False, "busy": True, "error": "The calculator is busy "
                             "with other visitors' settings; try again in a moment."},
                            status_code=503, headers={"Retry-After": "1"})
    return JSONResponse({"ok": True, "query": query, "values": settings.control_values(cfg),
                         "idle": settings.idle_reasons(cfg), "notes": notes,
                         "panels": panels})


async def plan_route(request: Request) -> Response:
    """engine.budget.plan's table for the same settings as api/budget (computed on a
    worker thread only when the visitor opens the plan)."""
    if _cross_site(request):
        return JSONResponse({"ok": False, "error": "This calculator answers its own page "
                             "only; open it at its address."}, status_code=403)
    params = dict(request.query_params)
    try:
        if "hf_model" in params:
            await run_in_threadpool(settings.hub_model, params["hf_model"])
        cfg, _ = settings.config_from_params(params)
        table = await run_in_threadpool(answers.plan_html, cfg)
    except B.BudgetError as exc:
        return JSONResponse({"ok": False, "error": str(exc)}, status_code=400)
    return JSONResponse({"ok": True, "plan": table})


async def knobs_route(request: Request) -> Response:
    return JSONResponse({"knobs": settings.describe_knobs(), "presets": B.PRESET_NAMES,
                         "default_preset": request.app.state.preset,
                         "hardware": settings.hardware_fields(),
                         "max_config_chars": settings.MAX_CONFIG_CHARS})


async def assumptions_route(request: Request) -> Response:
    params = dict(request.query_params)
    try:  # a Hub model's config.json may be fetched: off the event loop
        cfg, query = await run_in_threadpool(settings.config_from_params, params)
        return HTMLResponse(assumptions.assumptions_html(cfg, query))
    except B.BudgetError as exc:
        return HTMLResponse(assumptions.assumptions_html(None, refused=str(exc)))


def create_app(allowed_hosts, preset: str = settings.DEFAULT_PRESET):
    """The application answering requests whose Host is one of `allowed_hosts`."""
    files = _load_static()

    async def static_route(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in files:
            return PlainTextResponse("Not found.", status_code=404)
        body, kind = files[name]
        return Response(body, media_type=kind)

    async def page_route(request: Request) -> Response:
        return Response(files["page.html"][0], media_type="text/html")

    app = Starlette(routes=[
        Route("/", page_route), Route("/static/{name}", static_route),
        Route("/api/knobs", knobs_route), Route("/api/budget", budget_route),
        Route("/api/plan", plan_route),
        Route("/assumptions", assumptions_route)],
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))])
    app.state.preset = preset
    return app
