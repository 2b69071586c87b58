"""A checkpoint saver that refuses the writes of an attempt that lost its run's lease (L2).

The stream publish and the terminal status are fenced atomically (Lua, `UPDATE … WHERE
owner_epoch`). A checkpoint write goes through LangGraph's saver, whose SQL we do not
own, so this wrapper checks the lease just before each write: a worker frozen past its
lease (SIGSTOP, a long GC pause, a partition) that wakes up mid-step has its next
checkpoint refused with `LeaseLost` instead of racing the new owner. The check and the
write are two steps, so a freeze falling exactly between them can still let one write
through; the window is one Redis round trip instead of the keeper's whole tick.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from shared.errors import LeaseLost
from shared.leases import LeaseManager

RUN_KEY = "__threadrun_run_id"
LEASE_KEY = "__threadrun_lease"
"""configurable keys naming the run and the lease value the writer believes it holds
("__" keys are LangGraph-internal style: never copied into checkpoint metadata)."""


class FencedPostgresSaver(AsyncPostgresSaver):
    """AsyncPostgresSaver whose writes require the run's current lease."""

    def __init__(self, conn: Any, leases: LeaseManager) -> None:
        super().__init__(conn)
        self._leases = leases

    async def _fence(self, config: RunnableConfig) -> None:
        conf = config.get("configurable") or {}
        run_id, value = conf.get(RUN_KEY), conf.get(LEASE_KEY)
        if run_id and value and not await self._leases.holds(str(run_id), str(value)):
            raise LeaseLost(f"run {run_id}: checkpoint write fenced (lease {value} is not current)")

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Write a checkpoint if the attempt still owns the run."""
        await self._fence(config)
        return await super().aput(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Write pending writes if the attempt still owns the run."""
        await self._fence(config)
        await super().aput_writes(config, writes, task_id, task_path)
