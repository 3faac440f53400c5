"""The FastAPI app behind ``ragen view``: the page, its two static files and a JSON API.

Safety, because the page shows model text and the server reads a folder:
- every response carries a strict Content-Security-Policy (scripts and styles only from this
  server, nothing inline, no framing), so even a rendering bug cannot run model text;
- static files come from a fixed table of names, API paths take step numbers validated as
  integers, and the store builds every path itself: no request string reaches the file
  system;
- bound to loopback, requests must name a loopback Host, which stops a web page from
  reading the run through DNS rebinding.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from ragen.viewer.store import (
    MAX_PAGE,
    EpisodeQuery,
    NotFound,
    RunStore,
    parse_step,
    parse_steps,
)

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
STATIC = {
    "viewer.js": "text/javascript; charset=utf-8",
    "viewer.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


def static_text(name: str) -> str:
    """A file shipped in ragen/viewer/static (package data)."""
    return resources.files("ragen.viewer").joinpath("static", name).read_text(encoding="utf-8")


def host_name(header: str) -> str:
    """The host part of a Host header: ``[::1]:8765`` -> ``::1``, ``a.b:80`` -> ``a.b``."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def create_app(root: str | Path, *, allowed_hosts: Sequence[str] | None = None) -> FastAPI:
    """The viewer over run directory ``root``. ``allowed_hosts``: Host names accepted (None:
    any, for a server bound to a public address, where names cannot be known)."""
    store = RunStore(root)
    app = FastAPI(title="ragen viewer", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.store = store
    _add_guard(app, {h.lower() for h in allowed_hosts} if allowed_hosts is not None else None)
    _add_page_routes(app)
    _add_api_routes(app, store)
    return app


def _add_guard(app: FastAPI, allowed: set[str] | None) -> None:
    @app.middleware("http")
    async def guard(request: Request, call_next):
        host = host_name(request.headers.get("host", "")).lower()
        if allowed is not None and host not in allowed:
            response: Response = PlainTextResponse(
                f"host {host!r} not served; open http://127.0.0.1:PORT/", status_code=400
            )
        else:
            response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        if request.url.path.startswith("/api/"):
            response.headers["Cache-Control"] = "no-store"  # a live run changes underneath
        return response

    @app.exception_handler(NotFound)
    async def not_found(_: Request, err: NotFound) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=404)


def _add_page_routes(app: FastAPI) -> None:
    page = static_text("index.html")
    files = {name: static_text(name) for name in STATIC}

    @app.get("/")
    def index() -> Response:
        return Response(page, media_type="text/html; charset=utf-8")

    @app.get("/static/{name}")
    def static(name: str) -> Response:
        if name not in STATIC:  # a fixed table: the name never reaches the file system
            raise HTTPException(404, "no such file")
        return Response(files[name], media_type=STATIC[name])


def _add_api_routes(app: FastAPI, store: RunStore) -> None:
    @app.get("/api/version")
    def version() -> dict:
        return {"version": store.version()}

    @app.get("/api/run")
    def run() -> dict:
        return store.overview()

    @app.get("/api/steps/{step}/episodes")
    def episodes(
        step: str,
        env: str | None = None,
        success: bool | None = None,
        end: str | None = None,
        q: str = Query("", max_length=1000),
        group: int | None = Query(None, ge=-1),
        offset: int = Query(0, ge=0),
        limit: int = Query(100, ge=1, le=MAX_PAGE),
    ) -> dict:
        query = EpisodeQuery(env or None, success, end or None, q, group, offset, limit)
        return store.episodes(_step(step), query)

    @app.get("/api/steps/{step}/episodes/{number}")
    def episode(step: str, number: int) -> dict:
        return store.episode(_step(step), number)

    @app.get("/api/groups/{group}")
    def group_over_time(group: int, steps: str = Query("", max_length=400)) -> dict:
        try:
            chosen = parse_steps(steps)
        except ValueError as err:
            raise HTTPException(400, str(err)) from err
        return store.group_over_time(group, chosen)


def _step(text: str):
    try:
        return parse_step(text)
    except ValueError as err:
        raise HTTPException(400, str(err)) from err
