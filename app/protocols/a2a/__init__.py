"""Agent2Agent (A2A) at `/a2a/{assistant_id}`: each assistant an A2A agent, its card at
`/a2a/{assistant_id}/.well-known/agent-card.json` (and `/.well-known/agent-card.json`).

    routes.py    the HTTP edge: the JSON-RPC endpoint and the cards
    dispatch.py  JSON-RPC: envelope, method table, errors, SSE of stream answers
    wire.py      the request models (A2A 1.0 and 0.3) and the error codes
    tasks.py     tasks over runs: admission, lookup, views, cancel (the REST API's calls)
    stream.py    a task's run followed through its Redis Stream (replay, gaps)
    mapping.py   pure: runs, threads and run events <-> A2A objects
    cards.py     pure: the agent card of an assistant

docs/a2a.md says how to connect and what is left out.
"""

from __future__ import annotations

from flask import Flask

from app.protocols.a2a.routes import bp

__all__ = ["bp", "init_app"]


def init_app(app: Flask) -> None:
    """Register the routes on `app`."""
    app.register_blueprint(bp)
