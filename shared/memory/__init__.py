"""Long-term memory (SPEC M1-M6): facts per (agent_name, user_id), a debounced queue."""

from shared.memory.base import (
    AdmitOutcome,
    Fact,
    MemoryBackend,
    MemoryFactNotFound,
    MemoryReadFailed,
    MemoryUpdate,
    NewFact,
)
from shared.memory.manager import MemoryManager
from shared.memory.queue import MemoryQueue

__all__ = [
    "AdmitOutcome",
    "Fact",
    "MemoryBackend",
    "MemoryFactNotFound",
    "MemoryManager",
    "MemoryQueue",
    "MemoryReadFailed",
    "MemoryUpdate",
    "NewFact",
]
