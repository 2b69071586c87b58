"""The store (cross-thread memory): items and namespaces of the caller, on LangGraph's store.

Each view works on `UserScopedStore` for the caller: the namespaces a client names are the
caller's own (stored under their label, `shared.store.namespaces`), so another user's item
under the same namespace is simply not there: GET answers `null` (as the LangGraph Agent
Server does for a missing item), DELETE deletes nothing, search and listings omit it.
Graphs get the same store at run time (`workers.runtime.WorkerRuntime.run_graph`).

Under the project's auth (`auth.path`) every user of the project shares one store tenant
and each view asks `store.<action>` first with the official server's value (`namespace`,
`key`, ...): a handler may refuse, or rewrite the namespace (the usual rule prefixes the
user's identity), and the view uses the namespace the handler left, checked again; a
search handler's filter is added to the item filter.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from flask import Blueprint, Response
from pydantic import AfterValidator, Field, field_validator

from app import authz
from app.auth import principal
from app.http import answers, body, query
from app.responses import json_response
from app.schemas import PG_BIGINT_MAX, Strict
from app.services import current_services
from shared.authz.store import store_value
from shared.errors import ValidationFailed
from shared.store import UserScopedStore, check_namespace
from shared.store.config import whole_minutes
from shared.store.namespaces import check_key

bp = Blueprint("store", __name__)

FILTER_OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"})
"""What `PostgresStore` compares with; a dict value of a filter holds only these."""
MAX_TTL_MINUTES = 10_000_000  # ~19 years; PostgreSQL intervals overflow far above


def _labels(*, required: bool = False, writing: bool = False) -> AfterValidator:
    def check(value: list[str]) -> list[str]:
        check_namespace(tuple(value), required=required, writing=writing)
        return value

    return AfterValidator(check)


def _joined_labels(value: str) -> str:
    check_namespace(tuple(value.split(".")), required=True)
    return value


def _key(value: str) -> str:
    check_key(value)
    return value


Key = Annotated[str, AfterValidator(_key)]
Labels = Annotated[list[str], _labels()]


class StorePut(Strict):
    """PUT /store/items."""

    namespace: Annotated[list[str], _labels(writing=True)]
    key: Key
    value: dict[str, Any]
    index: Literal[False] | list[str] | None = None
    ttl: float | None = Field(default=None, gt=0, le=MAX_TTL_MINUTES)


class StoreDelete(Strict):
    """DELETE /store/items."""

    namespace: Annotated[list[str], _labels(required=True)]
    key: Key


class StoreGetQuery(Strict):
    """GET /store/items: `namespace` is the labels joined with `.`, as the SDK sends it."""

    namespace: Annotated[str, AfterValidator(_joined_labels)]
    key: Key
    refresh_ttl: bool | None = None


class StoreSearch(Strict):
    """POST /store/items/search."""

    namespace_prefix: Labels = Field(default_factory=list)
    filter: dict[str, Any] | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=PG_BIGINT_MAX)
    query: str | None = Field(default=None, min_length=1, max_length=10_000)
    refresh_ttl: bool | None = None

    @field_validator("filter")
    @classmethod
    def _check_filter(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        for name, condition in (value or {}).items():
            if isinstance(condition, dict) and not set(condition) <= FILTER_OPERATORS:
                raise ValueError(
                    f"{name}: an object compares with {sorted(FILTER_OPERATORS)}; "
                    'to match an object value use {"$eq": {...}}'
                )
        return value


class StoreNamespaces(Strict):
    """POST /store/namespaces."""

    prefix: Labels | None = None
    suffix: Labels | None = None
    max_depth: int | None = Field(default=None, ge=1, le=100)
    limit: int = Field(default=100, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=PG_BIGINT_MAX)


def callers_store() -> UserScopedStore:
    """The store as the caller sees it."""
    return current_services().items.for_user(principal().user_id)


def decided(action: str, value: dict[str, Any]) -> dict[str, Any]:
    """`value` as the project's `store.<action>` handler left it (as is without project
    auth); a namespace it rewrote is checked like a client's."""
    decision = authz.authorize("store", action, value)
    return value if decision is None else store_value(action, decision)


def _require_index(field: str) -> None:
    if not current_services().items.semantic:
        raise ValidationFailed(
            f"{field}: semantic search needs an embeddings index (store.index in the config)",
            field=field,
        )


@bp.put("/store/items")
@answers(204, "stored")
@body(StorePut)
def put_item(body: StorePut) -> Response:
    """Store or replace an item in one of the caller's namespaces."""
    if isinstance(body.index, list):
        _require_index("index")
    store = callers_store()
    value = decided(
        "put",
        {
            "namespace": tuple(body.namespace),
            "key": body.key,
            "value": body.value,
            "index": body.index,
        },
    )
    args = (value["namespace"], value["key"], value["value"], value["index"])
    if "ttl" in body.model_fields_set:
        store.put(*args, ttl=None if body.ttl is None else whole_minutes(body.ttl))
    else:  # the store's default_ttl applies
        store.put(*args)
    return Response(status=204)


@bp.get("/store/items")
@query(StoreGetQuery)
def get_item(query: StoreGetQuery) -> Response:
    """One of the caller's items, or `null`."""
    value = decided("get", {"namespace": tuple(query.namespace.split(".")), "key": query.key})
    item = callers_store().get(value["namespace"], value["key"], refresh_ttl=query.refresh_ttl)
    return json_response(None if item is None else item.dict())


@bp.delete("/store/items")
@answers(204, "deleted (or there was nothing)")
@body(StoreDelete)
def delete_item(body: StoreDelete) -> Response:
    """Delete one of the caller's items (nothing happens if there is none)."""
    value = decided("delete", {"namespace": tuple(body.namespace), "key": body.key})
    callers_store().delete(value["namespace"], value["key"])
    return Response(status=204)


@bp.post("/store/items/search")
@body(StoreSearch, required=False)
def search_items(body: StoreSearch) -> Response:
    """The caller's items under a namespace prefix: filter, limit/offset, `query` with an index."""
    if body.query is not None:
        _require_index("query")
    value = decided(
        "search",
        {
            "namespace": tuple(body.namespace_prefix),
            "filter": body.filter,
            "limit": body.limit,
            "offset": body.offset,
            "query": body.query,
        },
    )
    items = callers_store().search(
        value["namespace"],
        query=value["query"],
        filter=value["filter"],
        limit=value["limit"],
        offset=value["offset"],
        refresh_ttl=body.refresh_ttl,
    )
    return json_response({"items": [item.dict() for item in items]})


@bp.post("/store/namespaces")
@body(StoreNamespaces, required=False)
def list_namespaces(body: StoreNamespaces) -> Response:
    """The caller's namespaces (`prefix`, `suffix`, `max_depth`, limit/offset)."""
    value = decided(
        "list_namespaces",
        {
            "namespace": tuple(body.prefix) if body.prefix else None,
            "suffix": tuple(body.suffix) if body.suffix else None,
            "max_depth": body.max_depth,
            "limit": body.limit,
            "offset": body.offset,
        },
    )
    namespaces = callers_store().list_namespaces(
        prefix=value["namespace"] or None,
        suffix=value["suffix"] or None,
        max_depth=value["max_depth"],
        limit=value["limit"],
        offset=value["offset"],
    )
    return json_response({"namespaces": [list(ns) for ns in namespaces]})
