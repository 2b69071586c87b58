"""The project file: one typed model of every key of a `langgraph.json`.

threadrun serves the same file the LangGraph Agent Server (`langgraph dev`, `langgraph up`)
reads. Every key is either honoured with the official meaning, or accepted as build-only
(it shapes a Docker image the official CLI builds and has no meaning for a running server
here), or refused at start-up with the key and the file named. Nothing is ignored silently:
a key this model does not know is an error, not a guess (a misspelt `disable_runs` must not
leave the runs routes open).

`load_project(path)` reads and validates once per process (cached by path and mtime);
`activate(path)` also loads the file's `env` into `os.environ` before any graph module is
imported. Process environment wins over the file, so an operator's `OPENAI_API_KEY=...`
overrides the project's default, as with `langgraph dev`.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from dotenv import dotenv_values
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from shared.errors import ConfigError

log = logging.getLogger(__name__)


class ProjectConfigError(ConfigError):
    """The project file, or one of its keys, cannot be honoured."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- store --------------------------------------------------------------------------


class IndexSection(_Section):
    """`store.index`: the embeddings index of semantic search (pgvector)."""

    dims: int = Field(ge=1, le=16000)
    embed: str = Field(min_length=1)
    fields: list[str] | None = None
    distance_type: Literal["l2", "inner_product", "cosine"] | None = None
    ann_index_config: dict[str, Any] | None = None


class StoreTTLSection(_Section):
    """`store.ttl`: expiry of items, in minutes."""

    refresh_on_read: bool = True
    default_ttl: float | None = Field(default=None, gt=0)
    sweep_interval_minutes: int | None = Field(default=None, ge=1)


class StoreSection(_Section):
    """`store`."""

    index: IndexSection | None = None
    ttl: StoreTTLSection = Field(default_factory=StoreTTLSection)


# --- checkpointer -------------------------------------------------------------------


class ThreadTTLSection(_Section):
    """`checkpointer.ttl`: expiry of threads (minutes), swept on the scheduler."""

    strategy: Literal["delete", "keep_latest"] = "delete"
    default_ttl: float | None = Field(default=None, gt=0)
    sweep_interval_minutes: int | None = Field(default=None, ge=1)
    sweep_limit: int | None = Field(default=None, ge=1)


class CheckpointerSection(_Section):
    """`checkpointer`. threadrun checkpoints through LangGraph's PostgresSaver with its own
    serializer (shared/serde.py), so `path` (a custom saver) and `serde` are refused."""

    path: str | None = None
    ttl: ThreadTTLSection | None = None
    serde: dict[str, Any] | None = None


# --- auth ---------------------------------------------------------------------------


class AuthCacheSection(_Section):
    """`auth.cache`: how long an `@auth.authenticate` answer is reused, keyed by headers."""

    cache_keys: list[str] = Field(default_factory=list)
    ttl_seconds: int = Field(default=60, ge=1)
    max_size: int = Field(default=1000, ge=1)


class OpenAPISecurity(_Section):
    """`auth.openapi`: how the OpenAPI document describes the project's auth."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    security_schemes: dict[str, dict[str, Any]] = Field(
        default_factory=dict, alias="securitySchemes"
    )
    security: list[dict[str, list[str]]] = Field(default_factory=list)
    paths: dict[str, dict[str, list[dict[str, list[str]]]]] = Field(default_factory=dict)


class AuthSection(_Section):
    """`auth`: the project's `langgraph_sdk.Auth` object and its OpenAPI description.
    `disable_studio_auth` is accepted with no effect: threadrun has no LangSmith Studio
    sign-in to turn off (every caller goes through the project's `@auth.authenticate`)."""

    path: str | None = None
    disable_studio_auth: bool = False
    openapi: OpenAPISecurity | None = None
    cache: AuthCacheSection | None = None


# --- http ---------------------------------------------------------------------------


class CorsSection(_Section):
    """`http.cors`, as Starlette's CORSMiddleware takes it."""

    allow_origins: list[str] = Field(default_factory=list)
    allow_methods: list[str] = Field(default_factory=lambda: ["GET"])
    allow_headers: list[str] = Field(default_factory=list)
    allow_credentials: bool = False
    allow_origin_regex: str | None = None
    expose_headers: list[str] = Field(default_factory=list)
    max_age: int = Field(default=600, ge=0)


NEVER_COPIED_HEADERS = frozenset({"authorization", "x-api-key", "x-service-key", "x-tenant-id"})
"""Credentials: never copied into a run's configurable, whatever the patterns say."""


class HeaderRules(_Section):
    """`includes` / `excludes` patterns of header names (`*` wildcards, case-insensitive).
    A header is admitted when an include matches and no exclude does (no includes: none)."""

    includes: list[str] | None = None
    excludes: list[str] | None = None

    def admits(self, name: str) -> bool:
        """Whether the header `name` (any case) is admitted."""
        key = name.lower()
        if any(fnmatch.fnmatchcase(key, p.lower()) for p in self.excludes or ()):
            return False
        return any(fnmatch.fnmatchcase(key, p.lower()) for p in self.includes or ())

    def pick(self, headers: Iterable[tuple[str, str]]) -> dict[str, str]:
        """The admitted headers (lower-case names), credentials never among them."""
        return {
            k.lower(): v
            for k, v in headers
            if k.lower() not in NEVER_COPIED_HEADERS and self.admits(k)
        }


class HttpSection(_Section):
    """`http`: the project's own app, the built-in routes it turns off, a prefix, headers."""

    app: str | None = None
    disable_assistants: bool = False
    disable_threads: bool = False
    disable_runs: bool = False
    disable_store: bool = False
    disable_mcp: bool = False
    disable_a2a: bool = False
    disable_meta: bool = False
    disable_ui: bool = False
    disable_webhooks: bool = False
    cors: CorsSection | None = None
    configurable_headers: HeaderRules | None = None
    logging_headers: HeaderRules | None = None
    middleware_order: Literal["auth_first", "middleware_first"] = "middleware_first"
    enable_custom_route_auth: bool = False
    mount_prefix: str | None = None

    @field_validator("mount_prefix")
    @classmethod
    def _prefix(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith("/") or value.endswith("/") or "//" in value:
            raise ValueError("must start with '/' and not end with one, e.g. '/api'")
        return value


# --- webhooks -----------------------------------------------------------------------


class WebhookUrlSection(_Section):
    """`webhooks.url`: which URLs a run's webhook may name."""

    require_https: bool = False
    allowed_domains: list[str] | None = None
    allowed_ports: list[int] | None = None
    max_url_length: int | None = Field(default=None, ge=16)
    disable_loopback: bool = False


class WebhooksSection(_Section):
    """`webhooks`."""

    env_prefix: str | None = None
    url: WebhookUrlSection | None = None
    headers: dict[str, str] | None = None


# --- ui (generative UI) -------------------------------------------------------------


class UiConfigSection(_Section):
    """`ui_config`: modules the bundles leave to the page, besides React and the SDK."""

    shared: list[str] = Field(default_factory=list)

    @field_validator("shared")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not name.strip() or name != name.strip():
                raise ValueError(f"{name!r} is not a module name")
        return value


UI_SOURCE_SUFFIXES = (".tsx", ".jsx", ".ts", ".js")
"""What a `ui` entry may name: a module whose default export maps names to components."""
UI_RESERVED_NAMES = frozenset({"static"})
"""`/ui/static/...` is the chat page's own files (app/api/ui.py)."""


# --- the file -----------------------------------------------------------------------


class GraphDef(_Section):
    """A graph given as an object: `{"path": "./g.py:graph", "description": "..."}`."""

    path: str = Field(min_length=1)
    description: str | None = None


BUILD_ONLY_KEYS: dict[str, str] = {
    "$schema": "the editor's JSON schema",
    "python_version": "the Python of the official image; threadrun runs in its own venv",
    "node_version": "the Node.js of the official image (JS graphs are not served here)",
    "api_version": "the langgraph-api version of the official image",
    "base_image": "the official image's base",
    "image_distro": "the official image's distribution",
    "pip_config_file": "pip's config inside the official image",
    "pip_installer": "the installer inside the official image",
    "source": "uv workspace sources of the official image's build",
    "dockerfile_lines": "extra Dockerfile lines of the official image",
    "keep_pkg_tools": "whether the official image keeps pip/setuptools",
    "_INTERNAL_docker_tag": "the official CLI's internal image tag",
}
"""Keys that only shape the image the official CLI builds: accepted, no effect here."""


class ProjectConfig(_Section):
    """A whole `langgraph.json`."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    graphs: dict[str, str | GraphDef] = Field(min_length=1)
    dependencies: list[str] = Field(default_factory=list)
    env: dict[str, str] | str | None = None
    store: StoreSection | None = None
    # (not `.checkpointer`: that name is the state boundary's, tests/unit/test_state_boundary.py)
    checkpointer_section: CheckpointerSection | None = Field(default=None, alias="checkpointer")
    auth: AuthSection | None = None
    http: HttpSection | None = None
    webhooks: WebhooksSection | None = None
    ui: dict[str, str] | None = None
    ui_config: UiConfigSection | None = None
    encryption: dict[str, Any] | None = None
    priority: dict[str, Any] | None = None
    # build-only (BUILD_ONLY_KEYS): typed loosely, never read
    schema_: str | None = Field(default=None, alias="$schema")
    python_version: str | None = None
    node_version: str | None = None
    api_version: str | None = None
    base_image: str | None = None
    image_distro: str | None = None
    pip_config_file: str | None = None
    pip_installer: str | None = None
    source: dict[str, Any] | None = None
    dockerfile_lines: list[str] | None = None
    keep_pkg_tools: bool | list[str] | None = None
    internal_docker_tag: str | None = Field(default=None, alias="_INTERNAL_docker_tag")


REFUSED: dict[tuple[str, ...], str] = {
    ("checkpointer", "path"): (
        "threadrun checkpoints in PostgreSQL through LangGraph's PostgresSaver, with the"
        " fencing and replay guarantees built on it; a custom checkpointer cannot keep them"
    ),
    ("checkpointer", "serde"): (
        "threadrun's serializer is fixed (shared/serde.py): every worker and web process must"
        " read what any other wrote"
    ),
    ("encryption",): "encryption of checkpoints at rest is not supported",
    ("priority",): "custom run priority handlers are not supported (runs are fair per user)",
}
"""Keys that are valid for the official server but that threadrun cannot honour: set, they
stop the start with the reason (a configured behaviour silently missing is worse)."""


class Project:
    """A validated project file and the folder its relative paths start from."""

    def __init__(self, path: Path, config: ProjectConfig) -> None:
        self.path = path
        self.base = path.parent
        self.config = config

    @property
    def store(self) -> StoreSection:
        return self.config.store or StoreSection()

    @property
    def http(self) -> HttpSection:
        return self.config.http or HttpSection()

    @property
    def auth(self) -> AuthSection:
        return self.config.auth or AuthSection()

    @property
    def owner_quotas(self) -> bool:
        """Whether the per-user quotas (`max_threads_per_user`, `max_assistants_per_user`)
        apply: they count per storage owner, and under `auth.path` every project user is
        the one tenant owner, so there they are the project's handlers' to enforce."""
        return not self.auth.path

    @property
    def thread_ttl(self) -> ThreadTTLSection | None:
        section = self.config.checkpointer_section
        return section.ttl if section else None

    @property
    def ui_config(self) -> UiConfigSection:
        return self.config.ui_config or UiConfigSection()

    def ui_sources(self) -> dict[str, Path]:
        """`ui`: name -> the component module it names (absolute; checked at parse)."""
        return {name: (self.base / file).resolve() for name, file in (self.config.ui or {}).items()}

    def graph_specs(self) -> dict[str, str]:
        """Graph id -> its `file.py:var` / `module:var` spec."""
        return {
            graph_id: spec if isinstance(spec, str) else spec.path
            for graph_id, spec in self.config.graphs.items()
        }

    def graph_descriptions(self) -> dict[str, str]:
        """Graph id -> the description an object spec gives."""
        return {
            graph_id: spec.description
            for graph_id, spec in self.config.graphs.items()
            if isinstance(spec, GraphDef) and spec.description
        }

    def env_values(self) -> dict[str, str]:
        """The file's `env`: its mapping, or the `.env` file it names (relative to the file)."""
        env = self.config.env
        if env is None:
            return {}
        if isinstance(env, dict):
            return dict(env)
        file = (self.base / env).resolve()
        if not file.is_file():
            raise ProjectConfigError(f"{self.path}: env file {file} does not exist")
        return {k: v for k, v in dotenv_values(file).items() if v is not None}


_UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "GraphDef", "none"})
"""Names pydantic puts in an error's location for the arm of a union it tried."""


def _location(loc: tuple[int | str, ...]) -> str:
    parts = [
        str(p) for p in loc if str(p) not in _UNION_TAGS and "[" not in str(p) and "-" not in str(p)
    ]
    return ".".join(parts) or "(top level)"


def _explain(path: Path, exc: ValidationError) -> str:
    problems = []
    for error in exc.errors()[:8]:
        where = _location(tuple(error["loc"]))
        if error["type"] == "extra_forbidden":
            problems.append(f"unknown key {where!r}")
        else:
            problems.append(f"{where}: {error['msg']}")
    more = len(exc.errors()) - len(problems)
    tail = f" (and {more} more)" if more > 0 else ""
    return f"{path}: " + "; ".join(problems) + tail


def _refusals(path: Path, raw: dict[str, Any]) -> None:
    for keys, why in REFUSED.items():
        value: Any = raw
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if value not in (None, {}, []):
            raise ProjectConfigError(f"{path}: {'.'.join(keys)!r} is set, but {why}")


def _check_ui(project: Project) -> None:
    """Every `ui` entry names an existing component module under a usable name."""
    for name, file in (project.config.ui or {}).items():
        where = f"{project.path}: 'ui.{name}'"
        if not name or "/" in name or name in UI_RESERVED_NAMES:
            taken = " (the chat page's files live at /ui/static)" if name == "static" else ""
            raise ProjectConfigError(f"{where}: not a usable component name{taken}")
        source = (project.base / file).resolve()
        if source.suffix not in UI_SOURCE_SUFFIXES:
            raise ProjectConfigError(
                f"{where} names {file!r}: not one of {', '.join(UI_SOURCE_SUFFIXES)}"
            )
        if not source.is_file():
            raise ProjectConfigError(f"{where} names {file!r}: {source} does not exist")


def parse_project(path: Path) -> Project:
    """Read and validate a project file (no caching, no side effects)."""
    path = Path(path).resolve()
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProjectConfigError(f"project file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProjectConfigError(f"project file {path} cannot be read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ProjectConfigError(f"project file {path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("graphs"), dict) or not raw["graphs"]:
        raise ProjectConfigError(f'project file {path} has no "graphs" object')
    try:
        config = ProjectConfig.model_validate(raw)
    except ValidationError as exc:
        raise ProjectConfigError(_explain(path, exc)) from exc
    _refusals(path, raw)
    project = Project(path, config)
    _check_ui(project)
    return project


_cache: dict[Path, tuple[float, Project]] = {}
_cache_lock = threading.Lock()


def load_project(path: Path) -> Project:
    """The project file at `path`, validated once per process (re-read when it changes)."""
    path = Path(path).resolve()
    try:
        mtime = path.stat().st_mtime
    except OSError:
        mtime = -1.0
    with _cache_lock:
        hit = _cache.get(path)
        if hit is not None and hit[0] == mtime:
            return hit[1]
    project = parse_project(path)
    with _cache_lock:
        _cache[path] = (mtime, project)
    return project


def activate(path: Path) -> Project:
    """Load the project and put its `env` into this process's environment (variables the
    process already has win), before any graph module is imported."""
    project = load_project(path)
    applied = 0
    for name, value in project.env_values().items():
        if name not in os.environ:
            os.environ[name] = value
            applied += 1
    if applied:
        log.info("project env: %d variable(s) from %s", applied, project.path.name)
    return project
