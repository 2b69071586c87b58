"""The user prefix of store namespaces: every namespace a user (or their run) names is stored
as `(user_label(user_id), *namespace)`, and read back without that first label.

Why a reserved first label: LangGraph's `PostgresStore` keeps a namespace as its labels joined
with `.` and scopes reads by whole labels (`prefix = 'a.b' OR prefix LIKE 'a.b.%'`, a regex
anchored on `.` for namespace listings). The first stored label is always the caller's
`threadrun:user:<percent-encoded user id>`, never one the caller chose, so what a user names
can only ever extend their own label: no namespace, prefix or listing condition of one user
reaches another's rows. The encoding is injective and leaves no `.` (it is percent-encoded
like every other byte outside `[A-Za-z0-9_~-]`), so two users never share a first label and the
stored text splits back into exactly the labels written. The readable `threadrun:user:`
prefix makes rows self-describing for an operator, and keeps user data apart from anything
else written to the same table (LangGraph reserves the root label `langgraph`).

Pure functions, no IO: `tests/unit/test_store_namespaces.py` checks them with hypothesis.
"""

from __future__ import annotations

from typing import cast
from urllib.parse import quote, unquote

from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    validate_op_namespace,
)

from shared.errors import StoreError

USER_LABEL_PREFIX = "threadrun:user:"
"""First label of every namespace a user owns; the rest of the label is their encoded id."""

RESERVED_ROOT = "langgraph"
"""LangGraph refuses to write under this root label (`BaseStore.put`); so does the API."""

MAX_KEY_BYTES = 1024
MAX_NAMESPACE_BYTES = 1024
"""API bounds (UTF-8 bytes): PostgreSQL's btree refuses a (prefix, key) entry above ~2.7 kB."""

Namespace = tuple[str, ...]


class ForeignNamespace(StoreError):
    """A stored namespace that does not carry this user's label (a bug, never shown)."""


def user_label(user_id: str) -> str:
    """The first stored label of `user_id`'s namespaces (ASCII, no `.`, never empty)."""
    encoded = quote(user_id, safe="", errors="surrogatepass").replace(".", "%2E")
    return USER_LABEL_PREFIX + encoded


def label_user(label: str) -> str | None:
    """The user id whose label this is, or None for any other label."""
    if not label.startswith(USER_LABEL_PREFIX):
        return None
    return unquote(label[len(USER_LABEL_PREFIX) :], errors="surrogatepass")


def scope(user_id: str, namespace: Namespace) -> Namespace:
    """The stored form of a user's namespace."""
    return (user_label(user_id), *namespace)


def unscope(user_id: str, stored: Namespace) -> Namespace:
    """The user's view of a stored namespace; ForeignNamespace if it is not theirs."""
    if not stored or stored[0] != user_label(user_id):
        raise ForeignNamespace(f"namespace {stored[:1]!r} is not the user's")
    return stored[1:]


def check_labels(namespace: Namespace) -> None:
    """LangGraph's label rules (strings, non-empty, no `.`, no NUL): InvalidNamespaceError."""
    validate_op_namespace(GetOp(namespace, ""))


def check_namespace(namespace: Namespace, *, required: bool = False, writing: bool = False) -> None:
    """A namespace the API accepts (InvalidNamespaceError otherwise): LangGraph's label rules
    and a size bound; non-empty if `required` or `writing`; and, when `writing`, not under
    the reserved root (the rules `BaseStore.put` applies)."""
    check_labels(namespace)
    if len(".".join(namespace).encode("utf-8", "surrogatepass")) > MAX_NAMESPACE_BYTES:
        raise InvalidNamespaceError(f"namespace is longer than {MAX_NAMESPACE_BYTES} bytes")
    if (required or writing) and not namespace:
        raise InvalidNamespaceError("namespace cannot be empty")
    if writing and namespace[0] == RESERVED_ROOT:
        raise InvalidNamespaceError(f'the root label "{RESERVED_ROOT}" is reserved')


def check_key(key: str) -> None:
    """A key the API accepts: non-empty and bounded (ValueError otherwise)."""
    if not key:
        raise ValueError("key cannot be empty")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise ValueError(f"key is longer than {MAX_KEY_BYTES} bytes")


def scope_op(user_id: str, op: Op) -> Op:
    """The op on the user's stored namespaces (labels checked first, as LangGraph does)."""
    validate_op_namespace(op)
    if isinstance(op, (GetOp, PutOp)):
        if isinstance(op, PutOp) and not op.namespace:
            raise InvalidNamespaceError("namespace cannot be empty")
        return op._replace(namespace=scope(user_id, op.namespace))
    if isinstance(op, SearchOp):
        return op._replace(namespace_prefix=scope(user_id, op.namespace_prefix))
    if isinstance(op, ListNamespacesOp):
        return _scope_listing(user_id, op)
    raise TypeError(f"unknown store op {type(op).__name__}")


def _scope_listing(user_id: str, op: ListNamespacesOp) -> ListNamespacesOp:
    """Prefix conditions gain the label; one more prefix condition anchors the listing on it,
    with `*` labels so that a suffix condition can only match the user's own labels."""
    label = user_label(user_id)
    conditions = [
        MatchCondition("prefix", (label, *c.path)) if c.match_type == "prefix" else c
        for c in op.match_conditions or ()
    ]
    depth = max((len(c.path) for c in conditions if c.match_type == "suffix"), default=0)
    conditions.append(MatchCondition("prefix", (label, *("*",) * depth)))
    max_depth = None if op.max_depth is None else op.max_depth + 1
    return op._replace(match_conditions=tuple(conditions), max_depth=max_depth)


def unscope_result(user_id: str, op: Op, result: Result) -> Result:
    """The result of a scoped op as the user sees it: namespaces without their label."""
    if result is None:
        return None
    if isinstance(result, Item):
        return _unscoped_item(user_id, result)
    if isinstance(op, ListNamespacesOp):
        return [unscope(user_id, cast(Namespace, ns)) for ns in result]
    return [_unscoped_item(user_id, cast(Item, item)) for item in result]


def _unscoped_item(user_id: str, item: Item) -> Item:
    namespace = unscope(user_id, item.namespace)
    if isinstance(item, SearchItem):
        return SearchItem(
            namespace, item.key, item.value, item.created_at, item.updated_at, item.score
        )
    return Item(
        value=item.value,
        key=item.key,
        namespace=namespace,
        created_at=item.created_at,
        updated_at=item.updated_at,
    )
