"""L2 for checkpoints: a stale attempt's checkpoint writes are refused by the fenced saver."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aredis

from shared.agent.lead_agent import build_lead_agent
from shared.db import make_async_pool
from shared.errors import LeaseLost
from shared.leases import LeaseManager, lease_value
from shared.redis_keys import Keys
from shared.settings import Settings
from shared.state.fenced_saver import LEASE_KEY, RUN_KEY, FencedPostgresSaver


def test_l2_stale_attempt_cannot_write_a_checkpoint(settings: Settings, tmp_path: Path) -> None:
    """L2: with the lease taken over by a newer epoch, the old attempt's next write raises
    LeaseLost and the thread's checkpoints stay exactly as the new owner left them."""

    async def scenario() -> None:
        client = aredis.Redis.from_url(settings.redis_url)
        pool = await make_async_pool(settings, name="test-fenced", max_size=2)
        try:
            keys = Keys(f"{settings.redis_prefix}fence{uuid.uuid4().hex[:6]}:")
            leases = LeaseManager(client, keys, ttl_s=30)
            saver = FencedPostgresSaver(pool, leases)
            graph = build_lead_agent().copy(update={"checkpointer": saver})
            run_id, thread_id = str(uuid.uuid4()), str(uuid.uuid4())

            def config(lease: str) -> dict[str, object]:
                return {
                    "configurable": {
                        "thread_id": thread_id,
                        "workspace_dir": tmp_path,
                        "tokens": 3,
                        RUN_KEY: run_id,
                        LEASE_KEY: lease,
                    }
                }

            old = lease_value(1, "old")
            assert await leases.acquire(run_id, 1, "old")
            await graph.ainvoke({"messages": [{"role": "user", "content": "hi"}]}, config(old))
            written = [c async for c in saver.alist({"configurable": {"thread_id": thread_id}})]
            assert written
            assert await leases.acquire(run_id, 2, "new")  # a newer owner takes over
            with pytest.raises(LeaseLost):
                await graph.ainvoke(
                    {"messages": [{"role": "user", "content": "again"}]}, config(old)
                )
            after = [c async for c in saver.alist({"configurable": {"thread_id": thread_id}})]
            assert [c.checkpoint["id"] for c in after] == [c.checkpoint["id"] for c in written]
            # The current owner writes normally.
            new = lease_value(2, "new")
            await graph.ainvoke({"messages": [{"role": "user", "content": "ok"}]}, config(new))
            assert len(
                [c async for c in saver.alist({"configurable": {"thread_id": thread_id}})]
            ) > len(written)
            await client.delete(keys.lease(run_id))
        finally:
            await pool.close()
            await client.aclose()

    asyncio.run(scenario())
