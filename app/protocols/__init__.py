"""The protocols clients speak besides the Agent Server's REST API, each a front end of its
own over the same admission, bridge and authorization calls the REST API uses (so a guarantee
proven for runs holds for every protocol), none reaching into another's views:

- `thread_stream/`: LangChain's thread-centric streaming protocol (`client.threads.stream`):
  `POST /threads/{id}/commands`, `POST` and `WS /threads/{id}/stream/events`;
- `mcp/`: the Model Context Protocol at `/mcp` (Streamable HTTP), one tool per assistant;
- `a2a/`: Agent2Agent at `/a2a/{assistant_id}` and the agent cards.

`http.disable_mcp` and `http.disable_a2a` remove theirs (app/project_http/routes.py).
"""

from __future__ import annotations

from flask import Flask


def init_app(app: Flask) -> None:
    """Register every protocol's routes on `app` (after Services are built)."""
    from app.protocols import a2a, mcp, thread_stream

    for protocol in (thread_stream, mcp, a2a):
        protocol.init_app(app)
