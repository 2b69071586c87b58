"""Generative UI, as the official Agent Server serves it: `POST /ui/{name}` answers the
`<link>`/`<script>` tags that load a `ui` bundle and render one of its components (what
`LoadExternalComponent` of `@langchain/langgraph-sdk/react-ui` inserts into a shadow root),
and `GET /ui/{name}/{file}` serves the bundle's files.

The POST is authenticated like every route (the official server's too); the files are not
(a `<script src>` cannot send a key, and the official server exempts GET /ui/... from auth).
The bundles are built once at the web's start (shared/genui/build.py) and held in
`app.extensions`; every web process of a host builds or finds the same files, so any of them
serves any request. The file names are the official ones (`entrypoint.js`, `entrypoint.css`),
so the tags carry `?v=<sha256>`: a file asked for with its current digest is cached for a
year (immutable), any other request revalidates (ETag, 304).
"""

from __future__ import annotations

from typing import cast

from flask import Blueprint, Flask, Response, current_app, request
from flask.sansio.blueprints import BlueprintSetupState
from pydantic import BaseModel, ConfigDict, Field

from app.http import answers, body, returns
from shared.errors import NotFound
from shared.genui import UiBundle, UiCatalog, build_catalog
from shared.project import Project

bp = Blueprint("genui", __name__)
assets_bp = Blueprint("genui_assets", __name__)
"""The bundles' files: public (app/auth.py PUBLIC_BLUEPRINTS)."""
EXTENSION = "threadrun_genui"
IMMUTABLE = "public, max-age=31536000, immutable"


class UiComponentRequest(BaseModel):
    """The body `LoadExternalComponent` posts: which component of the bundle to render."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=256, description="The component's name.")


@bp.record_once
def _build(state: BlueprintSetupState) -> None:
    """Bundle the project's `ui` when the blueprint is registered (create_app): a build
    error stops the start; without `ui`, or with `http.disable_ui` (these routes are then
    removed), this costs nothing."""
    app = cast(Flask, state.app)
    project: Project = app.extensions["threadrun_project"]
    if project.http.disable_ui:
        app.extensions[EXTENSION] = UiCatalog()
        return
    app.extensions[EXTENSION] = build_catalog(project, app.extensions["threadrun"].settings)


def catalog() -> UiCatalog:
    """The bundles this web process serves."""
    return cast(UiCatalog, current_app.extensions.get(EXTENSION) or UiCatalog())


def _bundle(graph_id: str) -> UiBundle:
    bundle = catalog().get(graph_id)
    if bundle is None:
        raise NotFound(f"UI not found for graph {graph_id[:128]!r}")
    return bundle


@bp.post("/ui/<graph_id>")
@returns("text/html")
@answers(404, "no `ui` entry of that name in langgraph.json", json=True)
@body(UiComponentRequest)
def component_tags(graph_id: str, body: UiComponentRequest) -> Response:
    """The tags that load `graph_id`'s bundle and render the component `name`."""
    html = _bundle(graph_id).tags(body.name, prefix=request.script_root)
    resp = Response(html, mimetype="text/html")
    resp.headers["Cache-Control"] = "no-cache"
    resp.headers["X-Content-Type-Options"] = "nosniff"
    return resp


@assets_bp.get("/ui/<graph_id>/<path:filename>")
@returns("*/*")  # the bundle's own files: scripts, styles
def asset(graph_id: str, filename: str) -> Response:
    """One file of `graph_id`'s bundle (anything else is 404)."""
    bundle = _bundle(graph_id)
    found = bundle.asset(filename)
    if found is None:
        raise NotFound(f"no file {filename[:64]!r} in the UI of graph {graph_id[:128]!r}")
    etag = found.digest
    if request.if_none_match.contains(etag):
        resp = Response(status=304)
    else:
        resp = Response(found.path.read_bytes(), content_type=found.media_type)
    resp.set_etag(etag)
    versioned = request.args.get("v") == found.digest
    resp.headers["Cache-Control"] = IMMUTABLE if versioned else "no-cache"
    resp.headers["X-Content-Type-Options"] = "nosniff"
    # A React client on another origin loads the script with a plain <script src>.
    resp.headers["Cross-Origin-Resource-Policy"] = "cross-origin"
    return resp
