"""Flask front end: parse, authorize, admit, dispatch, relay. It never runs the agent."""

from __future__ import annotations

import logging

from flask import Flask

from shared.settings import Settings


def create_app(settings: Settings | None = None) -> Flask:
    """The application factory."""
    # Imported here, not at the top: gunicorn's config imports this package in the master,
    # and LangChain (through the providers' preflight) pulls in ssl and urllib3, which a
    # gevent worker must patch before they are imported.
    from app import auth, cors, errors, limits, public_ids
    from app.api import (
        artifacts,
        assistants,
        events,
        genui,
        meta,
        openapi,
        runs,
        state,
        threads,
        ui,
    )
    from app.services import Services
    from app.streaming import ws
    from shared.agent.providers import require_models
    from shared.project import activate

    settings = settings or Settings()
    # The project file (shared/project.py) first: a key it cannot honour stops the start,
    # and its `env` is in place before any graph or provider is imported.
    project = activate(settings.config)
    # Like the workers: a provider model whose package or key is missing stops the start
    # with what to install or set, instead of runs that can never succeed.
    require_models(settings)
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions["threadrun_project"] = project  # read once (app/services.py)
    app.extensions["threadrun"] = Services.build(settings)
    auth.init_app(app, settings)  # refuses an open server on a public address (A4)
    errors.register(app)
    limits.init_app(app)
    cors.init_app(app, settings)
    public_ids.init_app(app)  # public thread ids out, in place of storage ids (A4)
    for bp in (
        meta.bp,
        assistants.bp,
        threads.bp,
        state.bp,
        artifacts.bp,
        runs.bp,
        events.bp,
        ui.bp,
        genui.bp,  # generative UI: builds langgraph.json's `ui` when registered
        genui.assets_bp,
        openapi.bp,
    ):
        app.register_blueprint(bp)
    ws.init_app(app)  # flask-sock: /ws and /threads/<thread_id>/ws (A2)
    from app.api import memory

    app.register_blueprint(memory.bp)  # memory facts (M6) and manual /compact (C1)
    from app.api import ops

    app.register_blueprint(ops.bp)  # the ops view and /metrics
    from app.api import store

    app.register_blueprint(store.bp)  # the store's items and namespaces
    from app.api import crons

    app.register_blueprint(crons.bp)  # crons; the scheduler process fires them
    from app.api import thread_stream

    app.register_blueprint(thread_stream.bp)  # GET /threads/{id}/stream: follow a thread
    from app import protocols

    protocols.init_app(app)  # the thread streaming protocol, MCP and A2A (app/protocols/)
    from app import project_http

    # Last: `http.disable_*` removes registered rules; `http.app` and `http.mount_prefix`
    # wrap the whole WSGI app (app/project_http/).
    project_http.init_app(app, project)
    logging.getLogger(__name__).info("threadrun web ready")
    return app
