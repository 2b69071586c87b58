"""The stream bridge (SPEC §4): live run events on Redis Streams.

`base` holds the contract (`StreamBridge` and its two sides) and the items a subscriber
receives; `publisher` is the worker side, `subscriber` the web side, `hub` the web process's
shared follower.
"""

from typing import TYPE_CHECKING

from shared.bridge.base import (
    END_EVENT,
    BridgePublisher,
    BridgeSubscriber,
    Event,
    Gap,
    Heartbeat,
    StreamBridge,
    StreamItem,
    parse_cursor,
)

if TYPE_CHECKING:  # mypy proves that the Redis sides keep the contract
    from shared.bridge.publisher import StreamPublisher
    from shared.bridge.subscriber import StreamSubscriber

    _publisher: type[BridgePublisher] = StreamPublisher
    _subscriber: type[BridgeSubscriber] = StreamSubscriber

__all__ = [
    "END_EVENT",
    "BridgePublisher",
    "BridgeSubscriber",
    "Event",
    "Gap",
    "Heartbeat",
    "StreamBridge",
    "StreamItem",
    "parse_cursor",
]
