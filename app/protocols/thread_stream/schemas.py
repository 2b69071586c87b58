"""The request bodies of the thread streaming protocol's HTTP routes (pydantic, so a bad one
is a 422 naming the field and /openapi.json documents it). The commands' own params are
validated with the protocol's types (commands.py)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictInt, StrictStr, field_validator

from app.schemas import Strict
from shared.bridge.protocol import is_channel


class Command(Strict):
    """`POST /threads/{id}/commands`: one protocol command (`langchain_protocol.Command`)."""

    id: StrictInt = Field(ge=0)
    method: StrictStr = Field(min_length=1, max_length=64)
    params: dict[str, Any] | None = None


class EventStreamRequest(Strict):
    """`POST /threads/{id}/stream/events`: what to stream, and after which seq."""

    channels: list[StrictStr] = Field(min_length=1)
    namespaces: list[list[StrictStr]] | None = None
    depth: StrictInt | None = Field(default=None, ge=0)
    since: StrictInt | None = Field(default=None, ge=0)

    @field_validator("channels")
    @classmethod
    def _known(cls, channels: list[str]) -> list[str]:
        bad = [c for c in channels if not is_channel(c)]
        if bad:
            raise ValueError(
                f"unsupported channel(s) {', '.join(map(repr, bad[:5]))}; supported: values,"
                " updates, messages, tools, lifecycle, input, checkpoints, tasks, custom and"
                " custom:<name>"
            )
        return channels

    def subscription(self) -> dict[str, Any]:
        """The filter as the SDK's `SubscribeParams` (for `matches_subscription`)."""
        out: dict[str, Any] = {"channels": self.channels}
        if self.namespaces is not None:
            out["namespaces"] = self.namespaces
        if self.depth is not None:
            out["depth"] = self.depth
        return out
