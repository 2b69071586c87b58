"""`UserScopedStore`: one user's view of a LangGraph store, for the API and for graphs at run time.

The contract is LangGraph's own `BaseStore` (what `compile(store=...)`, `Runtime.store` and
`get_store()` give a graph): the API calls its public methods, a graph calls whatever it
likes, and both go through `batch`/`abatch` here, where every op is rewritten onto the
user's stored namespaces and every result is read back without the user's label
(`shared.store.namespaces`). The same class wraps the web's sync `PostgresStore` and the
workers' `AsyncPostgresStore`, so what a run writes is what the user reads over HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from langgraph.store.base import BaseStore, Op, PutOp, Result
from langgraph.store.base.batch import AsyncBatchedBaseStore

from shared import serde
from shared.errors import LimitExceeded
from shared.store.namespaces import scope_op, unscope_result
from shared.store.quota import ItemQuota


class UserScopedStore(BaseStore):
    """The namespaces of one user in `inner`: written under their label, read back without it."""

    def __init__(
        self,
        inner: BaseStore,
        user_id: str,
        *,
        max_item_bytes: int | None = None,
        quota: ItemQuota | None = None,
    ) -> None:
        self.inner = inner
        self.user_id = user_id
        self.max_item_bytes = max_item_bytes
        self.quota = quota  # `max_store_items_per_user` (None: no quota)
        # BaseStore reads both to decide TTL defaults and refusals for put/get/search.
        self.supports_ttl = inner.supports_ttl
        self.ttl_config = inner.ttl_config

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run `ops` synchronously on the user's namespaces."""
        if isinstance(self.inner, AsyncBatchedBaseStore):
            # Its sync calls wait on its own loop: from inside that loop they would hang
            # (LangGraph refuses the same for its own sync methods).
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                pass
            else:
                raise asyncio.InvalidStateError(
                    "synchronous store call inside the event loop: use aget/aput/asearch/..."
                )
        ops = self._checked(ops)
        scoped = [scope_op(self.user_id, op) for op in ops]
        if self.quota is not None:
            self.quota.check(self.user_id, [op for op in scoped if isinstance(op, PutOp)])
        results = self.inner.batch(scoped)
        return [unscope_result(self.user_id, op, r) for op, r in zip(ops, results, strict=True)]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run `ops` asynchronously on the user's namespaces."""
        ops = self._checked(ops)
        scoped = [scope_op(self.user_id, op) for op in ops]
        if self.quota is not None:
            await self.quota.acheck(self.user_id, [op for op in scoped if isinstance(op, PutOp)])
        results = await self.inner.abatch(scoped)
        return [unscope_result(self.user_id, op, r) for op, r in zip(ops, results, strict=True)]

    def _checked(self, ops: Iterable[Op]) -> list[Op]:
        """`ops`, refused whole (413 `max_store_item_bytes`) when a put's value is larger
        than the limit: the API's puts and a graph's alike, before any is written."""
        ops = list(ops)
        limit = self.max_item_bytes
        if limit is not None:
            for op in ops:
                if isinstance(op, PutOp) and op.value is not None:
                    size = len(serde.dumps(op.value))
                    if size > limit:
                        raise LimitExceeded(
                            "max_store_item_bytes",
                            f"value: {size} bytes of JSON, larger than {limit}",
                            status=413,
                            field="value",
                        )
        return ops
