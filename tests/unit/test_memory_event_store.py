"""`MemoryEventStore` against the event store conformance suite (J2, J4, J5)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from shared.journal import MemoryEventStore
from tests.event_store_conformance import EventStoreConformance, MakeStore, NewRun


class TestMemoryEventStore(EventStoreConformance):
    """The in-process store behaves like the Postgres one."""

    @pytest.fixture
    def make_store(self) -> MakeStore:
        def make(**settings: Any) -> MemoryEventStore:
            return MemoryEventStore(**settings)

        return make

    @pytest.fixture
    def new_run(self) -> NewRun:
        def new(thread_id: str | None = None) -> tuple[str, str]:
            return thread_id or str(uuid.uuid4()), str(uuid.uuid4())

        return new
