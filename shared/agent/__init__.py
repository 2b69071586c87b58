"""The agent: graph loading, the built-in model, workspace tools and the lead agent."""

from shared.agent.graphs import (
    GraphConfigError,
    GraphNotFound,
    GraphRegistry,
    GraphSpec,
    assistant_id_for,
)
from shared.agent.model import BuiltinChatModel, make_model

__all__ = [
    "BuiltinChatModel",
    "GraphConfigError",
    "GraphNotFound",
    "GraphRegistry",
    "GraphSpec",
    "assistant_id_for",
    "make_model",
]
