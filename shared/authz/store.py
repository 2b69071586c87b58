"""The store a graph gets at run time, under the project's `store.*` handlers.

Under `auth.path` a graph's store calls go through the same decisions as `/store/...`
(app/api/store.py): each op asks `store.<action>` as the run's user with the official
server's value (`namespace`, `key`, ...) and runs with what the handler left (the usual
rule prefixes the user's identity to the namespace); a refusal raises `Denied` into the
graph, as any failing tool call would. The user is the one the run was made for
(`langgraph_auth_user` in its config, set only by the server).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchOp,
)

from shared.authz.decide import Authorizer, Decision, Denied, run_sync
from shared.authz.filters import NOTHING, merge
from shared.authz.users import AuthUser
from shared.store.namespaces import check_key, check_namespace


class AuthorizedStore(BaseStore):
    """`inner` (the run's store) with every op decided by the project's store handlers."""

    def __init__(self, inner: BaseStore, authorizer: Authorizer, user: AuthUser) -> None:
        self.inner = inner
        self.authorizer = authorizer
        self.user = user
        self.supports_ttl = inner.supports_ttl
        self.ttl_config = inner.ttl_config

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        decided = [run_sync(self._decided(op)) for op in ops]
        return self.inner.batch(decided)

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        decided = [await self._decided(op) for op in ops]
        return await self.inner.abatch(decided)

    async def _decided(self, op: Op) -> Op:
        action, value = _value_of(op)
        decision = await self.authorizer.authorize(self.user, "store", action, value)
        out = store_value(action, decision)
        return _rebuilt(op, out, out.get("namespace"))


def store_value(action: str, decision: Decision) -> dict[str, Any]:
    """The value a `store.<action>` handler left, ready for the store (the API's and the
    graph's alike): namespaces as tuples and checked like a client's (a bad one is the
    handler's doing: 403), the handler's filter added to the item filter."""
    out = dict(decision.value)
    try:
        for name in ("namespace", "suffix"):
            if out.get(name) is not None:
                out[name] = tuple(out[name])
                check_namespace(out[name], writing=action == "put" and name == "namespace")
        if "key" in out:
            check_key(out["key"])
    except (ValueError, TypeError, AttributeError) as exc:
        raise Denied(403, f"the store.{action} handler left an unusable value: {exc}") from None
    if decision.containment is not None:
        if any(isinstance(v, list) for v in decision.containment.values()):
            raise Denied(403, "the store's filters compare values; `$contains` is not supported")
        merged = merge(out.get("filter") or {}, decision.containment)
        out["filter"] = NOTHING if merged is None else merged
    return out


def _value_of(op: Op) -> tuple[str, dict[str, Any]]:
    """The action and the official server's value for `op`."""
    if isinstance(op, GetOp):
        return "get", {"namespace": op.namespace, "key": op.key}
    if isinstance(op, PutOp):
        if op.value is None:
            return "delete", {"namespace": op.namespace, "key": op.key}
        return "put", {
            "namespace": op.namespace,
            "key": op.key,
            "value": op.value,
            "index": op.index,
        }
    if isinstance(op, SearchOp):
        return "search", {
            "namespace": op.namespace_prefix,
            "filter": op.filter,
            "limit": op.limit,
            "offset": op.offset,
            "query": op.query,
        }
    if isinstance(op, ListNamespacesOp):
        prefix = next((c.path for c in op.match_conditions or () if c.match_type == "prefix"), None)
        suffix = next((c.path for c in op.match_conditions or () if c.match_type == "suffix"), None)
        return "list_namespaces", {
            "namespace": prefix,
            "suffix": suffix,
            "max_depth": op.max_depth,
            "limit": op.limit,
            "offset": op.offset,
        }
    raise TypeError(f"unknown store op {type(op).__name__}")


def _rebuilt(op: Op, out: dict[str, Any], namespace: tuple[str, ...] | None) -> Op:
    """`op` with the values the handler left."""
    if isinstance(op, GetOp):
        return op._replace(namespace=namespace or (), key=out["key"])
    if isinstance(op, PutOp):
        if op.value is None:
            return op._replace(namespace=namespace or (), key=out["key"])
        return op._replace(namespace=namespace or (), key=out["key"], value=out["value"])
    if isinstance(op, SearchOp):
        return op._replace(
            namespace_prefix=namespace or (),
            filter=out.get("filter"),
            limit=out["limit"],
            offset=out["offset"],
            query=out.get("query"),
        )
    if isinstance(op, ListNamespacesOp):
        conditions = []
        if namespace is not None:
            conditions.append(MatchCondition("prefix", namespace))
        if out.get("suffix") is not None:
            conditions.append(MatchCondition("suffix", tuple(out["suffix"])))
        return op._replace(
            match_conditions=tuple(conditions) or None,
            max_depth=out.get("max_depth"),
            limit=out["limit"],
            offset=out["offset"],
        )
    raise TypeError(f"unknown store op {type(op).__name__}")
