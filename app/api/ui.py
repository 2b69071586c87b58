"""The web chat page: GET /ui (and / redirecting to it) plus its static files.

Plain HTML/JS/CSS from `app/static/` with no build step. The page holds no data of its
own: it calls the HTTP API with `x-api-key` and the WebSocket (A2) with `?api_key=`, so
serving it needs no authentication. It is sent with a strict Content-Security-Policy (no
inline script, connections only to this origin) and `Referrer-Policy: no-referrer`, since
the page URL may carry `?api_key=`.
"""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, Response, redirect, request, send_from_directory
from werkzeug.exceptions import NotFound

from app.http import returns

bp = Blueprint("ui", __name__)
STATIC_DIR = Path(__file__).resolve().parents[1] / "static"
_STATIC_FILES = frozenset(
    {
        "index.html",
        "chat.js",
        "chat.css",
        # Vendored, unmodified builds (app/static/vendor/README.md has versions and licences).
        "vendor/marked.umd.js",
        "vendor/purify.min.js",
        "vendor/react.production.min.js",  # generative UI (docs/genui.md), loaded on demand
        "vendor/react-dom.production.min.js",
    }
)


def _csp(*, websockets: bool) -> str:
    host = request.host
    connect = f"connect-src 'self' ws://{host} wss://{host}" if websockets else "connect-src 'self'"
    return "; ".join(
        [
            "default-src 'self'",
            "script-src 'self'",
            "style-src 'self'",
            "img-src 'self' data:",
            connect,
            "object-src 'none'",
            "base-uri 'none'",
            "form-action 'self'",
            "frame-ancestors 'none'",
        ]
    )


def _harden(resp: Response) -> Response:
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Referrer-Policy"] = "no-referrer"
    resp.headers["Cache-Control"] = "no-cache"  # no build step, no hashed names: revalidate
    return resp


def page_response(name: str, *, websockets: bool) -> Response:
    """A page of `app/static/` under the strict CSP (connections to this origin only, plus
    its WebSocket when `websockets`), not frameable, revalidated on every load. Under a
    mount prefix (langgraph.json's `http.mount_prefix`: `request.script_root`) the page's
    root-relative links get the prefix; its script finds the prefix from its own URL."""
    root = request.script_root
    if root:
        html = (STATIC_DIR / name).read_text(encoding="utf-8")
        resp = Response(html.replace('="/', f'="{root}/'), mimetype="text/html")
    else:
        resp = send_from_directory(STATIC_DIR, name, max_age=0)
    resp.headers["Content-Security-Policy"] = _csp(websockets=websockets)
    resp.headers["X-Frame-Options"] = "DENY"
    return _harden(resp)


def static_response(filename: str, allowed: frozenset[str]) -> Response:
    """One of a page's own files (anything else is 404)."""
    if filename not in allowed:
        raise NotFound(f"no static file {filename[:64]!r}")
    return _harden(send_from_directory(STATIC_DIR, filename, max_age=0))


@bp.get("/")
def root() -> Response:
    """The chat page lives at /ui (the query string, e.g. `?api_key=`, is kept)."""
    query = request.query_string.decode("latin-1")
    return redirect(f"{request.script_root}/ui" + (f"?{query}" if query else ""), code=302)  # type: ignore[return-value]


@bp.get("/ui")
@bp.get("/ui/")
@returns("text/html")
def page() -> Response:
    """The chat page."""
    return page_response("index.html", websockets=True)


@bp.get("/ui/static/<path:filename>")
@returns("*/*")  # the page's scripts and styles
def static_file(filename: str) -> Response:
    """chat.js, chat.css, the vendored Markdown parser and sanitizer (only the page's own files; anything else is 404)."""
    return static_response(filename, _STATIC_FILES)
