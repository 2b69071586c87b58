"""The Model Context Protocol at `/mcp` (Streamable HTTP): one tool per assistant the caller
may see, a call runs it as a run and answers its final output (docs/mcp.md).

- `routes.py`: the edge (HTTP, sessions, SSE or JSON answers);
- `jsonrpc.py`: JSON-RPC messages in and out, pure, in the `mcp` package's types;
- `calls.py`: tools/list and tools/call over the REST API's admission and bridge;
- `tools.py`: tool names, input schemas and results, pure;
- `sessions.py`: sessions and calls in flight, in Redis (any web process serves any).
"""

from __future__ import annotations

from flask import Flask

from app.protocols.mcp.routes import bp
from app.protocols.mcp.sessions import SessionStore
from app.services import Services
from shared.redis_keys import McpKeys

__all__ = ["bp", "init_app"]


def init_app(app: Flask) -> None:
    """Register the routes on `app`, with the session store on the app's Redis client."""
    svc: Services = app.extensions["threadrun"]
    app.extensions["threadrun_mcp"] = SessionStore(
        svc.redis, McpKeys(svc.settings.redis_prefix), svc.settings.mcp_session_ttl_s
    )
    app.register_blueprint(bp)
