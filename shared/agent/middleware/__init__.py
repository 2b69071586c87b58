"""Our agent middlewares (SPEC §8, §9), on LangChain's `AgentMiddleware` API."""

from shared.agent.middleware.durable_context import DurableContextMiddleware
from shared.agent.middleware.memory import MemoryInjectionMiddleware, MemoryWriteMiddleware
from shared.agent.middleware.summarization import SummarizationMiddleware, Summarizer

__all__ = [
    "DurableContextMiddleware",
    "MemoryInjectionMiddleware",
    "MemoryWriteMiddleware",
    "SummarizationMiddleware",
    "Summarizer",
]
