"""The stream bridge (SPEC §4): live run events on Redis Streams."""

from shared.bridge.base import (
    END_EVENT,
    Event,
    Gap,
    Heartbeat,
    StreamItem,
    parse_cursor,
)

__all__ = ["END_EVENT", "Event", "Gap", "Heartbeat", "StreamItem", "parse_cursor"]
