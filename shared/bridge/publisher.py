"""Worker side of the bridge: fenced, idempotent, batched publishing (B1, B2, L2).

Every run of a worker process emits into its own `EventSink`; one `PublishBatcher`
per process sends everything that is pending, for all runs, as one pipeline of script
calls per round trip. On a 2-core machine the cost of a run's stream is dominated by
round trips (each one wakes Redis and us), not by bytes, so under load this turns
thousands of small calls per second into a few hundred larger ones, while an idle
process still sends its first event at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
import redis.asyncio as aredis

from shared import lua, metrics, serde
from shared.bridge.base import END_EVENT, LOST_EVENT
from shared.bridge.codec import CodecSettings, Dictionary, EventEncoder, encode_plain, needed
from shared.errors import LeaseLost, StreamTailLost
from shared.redis_keys import STREAM_TTL_RUNNING_S, Keys
from shared.settings import Settings

log = logging.getLogger(__name__)

PUBLISH_RETRY_DELAYS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)
"""Back-off between retries of a pipeline on connection errors (about 8 s in all)."""

MAX_EVENTS_PER_CALL = 256
"""Cap on one script call: a huge call would block Redis (and every other run) for its whole
length; after a stall the backlog drains in bounded steps instead (bench: 13k events in one
call blocked Redis for 135 ms)."""


TAIL_KEEP_EVENTS = 512
TAIL_KEEP_BYTES = 512 * 1024
"""What a sink keeps of the events Redis acknowledged, to republish them when a failover
promotes a replica that lacked them (asynchronous replication loses milliseconds of writes,
so the newest few hundred events cover it); beyond this a `lost` marker stands for them."""


def trim_slack(maxlen: int) -> int:
    """Entries allowed above maxlen before a trim batch (approximate retention, B3)."""
    return max(1, min(100, maxlen // 10))


def codec_settings(settings: Settings) -> CodecSettings:
    """The stream encoding's thresholds from the settings."""
    return CodecSettings(
        min_bytes=settings.stream_compress_min_bytes,
        max_dicts=settings.stream_dictionaries_max,
        enabled=settings.stream_compress,
    )


@dataclass(frozen=True, slots=True)
class PublishCall:
    """One run's events for one script call; `first_seq` makes retries idempotent.

    `events` hold the JSON data as published unless `encoded` (then already in the stream
    encoding, with `dictionaries` the ones they use: the first `new_dictionaries` of them
    are stored by this call, the others only checked, shared/bridge/codec.py).
    """

    run_id: str
    lease_value: str
    first_seq: int
    events: list[tuple[str, bytes]]
    end: bool = False
    dictionaries: tuple[Dictionary, ...] = ()
    new_dictionaries: int = 0
    encoded: bool = False
    repair: str = ""  # a repair call: the last id the attempt was answered (publish.lua)


@dataclass(frozen=True, slots=True)
class PublishResult:
    """Ids added by the call, and a cancel request the owner must honour ('' if none)."""

    ids: list[str]
    cancel_action: str


class StreamPublisher:
    """Runs the fenced publish script, alone or many calls in one pipeline."""

    def __init__(self, client: aredis.Redis, keys: Keys, settings: Settings) -> None:
        self._client = client
        self._keys = keys
        self._maxlen = settings.stream_maxlen
        self._slack = trim_slack(settings.stream_maxlen)
        self._end_ttl = settings.stream_ttl_after_end_s
        self.coalesce_turns = settings.publish_coalesce_turns
        self._codec = codec_settings(settings)
        self._source = lua.source("publish")
        self._sha: str | None = None

    def _argv(self, call: PublishCall) -> list[str | bytes | int]:
        k = self._keys
        rid = call.run_id
        argv: list[str | bytes | int] = [
            4,
            k.lease(rid),
            k.stream(rid),
            k.stream_meta(rid),
            k.cancel(rid),
            call.lease_value,
            self._maxlen,
            self._slack,
            self._end_ttl if call.end else STREAM_TTL_RUNNING_S,
            call.first_seq,
            call.new_dictionaries,
            len(call.dictionaries) - call.new_dictionaries,
            call.repair,
        ]
        for i, dictionary in enumerate(call.dictionaries):
            argv.append(dictionary.id)
            if i < call.new_dictionaries:
                argv.append(dictionary.body)
        for name, data in call.events:
            argv.append(name)
            argv.append(data if call.encoded else encode_plain(data, self._codec))
        return argv

    def encoder(self, lease_value: str) -> EventEncoder:
        """A new run attempt's encoder (its dictionary ids carry the attempt's epoch)."""
        return EventEncoder(lease_value.partition("|")[0], self._codec)

    @staticmethod
    def _result(call: PublishCall, out: object) -> PublishResult | Exception:
        if isinstance(out, Exception):
            return out
        assert isinstance(out, list)
        head = out[0].decode() if isinstance(out[0], bytes) else str(out[0])
        if head == "!fenced":
            metrics.fenced_write("stream")
            return LeaseLost(
                f"run {call.run_id}: publish fenced (lease {call.lease_value} is not current)"
            )
        if head == "!dict":  # resent with its dictionaries and still refused: a bug
            return RuntimeError(f"run {call.run_id}: publish refused its own dictionaries")
        if head == "!tail":
            return StreamTailLost(call.run_id, int(out[1]))
        return PublishResult(ids=[i.decode() for i in out[1:]], cancel_action=head)

    async def publish_many(self, calls: list[PublishCall]) -> list[PublishResult | Exception]:
        """One round trip for every call, plus one for calls whose dictionaries Redis lost
        (a restart without persistence mid-run): those are resent with them."""
        outs = await self._execute(calls)
        lost = [i for i, o in enumerate(outs) if _head(o) == "!dict"]
        if lost:
            again = [
                dataclasses.replace(calls[i], new_dictionaries=len(calls[i].dictionaries))
                for i in lost
            ]
            for i, o in zip(lost, await self._execute(again), strict=True):
                outs[i] = o
        return [self._result(c, o) for c, o in zip(calls, outs, strict=True)]

    async def _execute(self, calls: list[PublishCall]) -> list[object]:
        """The script's replies, one per call (no MULTI: each script call is atomic by itself).

        Uses EVALSHA directly rather than redis-py's pipeline script support, which
        would add a SCRIPT EXISTS round trip to every pipeline.
        """
        if self._sha is None:
            self._sha = await self._client.script_load(self._source)
        for _ in range(2):
            pipe = self._client.pipeline(transaction=False)
            for call in calls:
                pipe.execute_command("EVALSHA", self._sha, *self._argv(call))
            outs = await pipe.execute(raise_on_error=False)
            if any(isinstance(o, redis.exceptions.NoScriptError) for o in outs):
                # Redis restarted (script cache empty): load again and redo the whole
                # batch; calls that did run are skipped by their sequence numbers.
                self._sha = await self._client.script_load(self._source)
                continue
            return list(outs)
        raise RuntimeError("publish script could not be loaded")

    async def publish(self, call: PublishCall) -> PublishResult:
        """One call; raises LeaseLost when fenced."""
        res = (await self.publish_many([call]))[0]
        if isinstance(res, Exception):
            raise res
        return res


def _head(out: object) -> str | None:
    """The first element of a script reply ('!fenced', '!dict', a cancel action)."""
    if not isinstance(out, list) or not out:
        return None
    head = out[0]
    return head.decode() if isinstance(head, bytes) else str(head)


class PublishBatcher:
    """Collects the pending events of every sink and sends them in one pipeline per turn."""

    def __init__(self, publisher: StreamPublisher) -> None:
        self._pub = publisher
        self._coalesce_turns = publisher.coalesce_turns
        self._ready: dict[EventSink, None] = {}
        self._task: asyncio.Task[None] | None = None
        self.round_trips = 0
        self.calls = 0

    def encoder(self, lease_value: str) -> EventEncoder:
        """The stream encoder of a new sink (one per run attempt)."""
        return self._pub.encoder(lease_value)

    def schedule(self, sink: EventSink) -> None:
        """Mark a sink as having events to send."""
        self._ready[sink] = None
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while self._ready:
            # Let the loop turn a few times first: the events every graph emits meanwhile
            # join this call instead of the next (~40 % fewer publish calls, Redis round
            # trips and reader wake-ups per run at C=50; no wait when nothing else runs).
            for _ in range(self._coalesce_turns):
                await asyncio.sleep(0)
            sinks = list(self._ready)
            self._ready.clear()
            calls = [s._take() for s in sinks]
            results = await self._send_with_retry(calls)
            self.round_trips += 1
            self.calls += len(calls)
            for sink, call, res in zip(sinks, calls, results, strict=True):
                sink._complete(call, res)

    async def _send_with_retry(self, calls: list[PublishCall]) -> list[PublishResult | Exception]:
        """Retry connection errors; idempotent thanks to each call's sequence numbers."""
        for attempt, delay in enumerate((*PUBLISH_RETRY_DELAYS_S, None)):
            try:
                return await self._pub.publish_many(calls)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if delay is None:
                    return [exc for _ in calls]
                log.warning(
                    "publish pipeline failed (%s); retry %d in %.2fs", exc, attempt + 1, delay
                )
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")


@dataclass(eq=False)
class EventSink:
    """One run attempt's ordered event buffer; `emit` never waits for Redis.

    It also keeps the newest events Redis acknowledged (TAIL_KEEP_*): when a failover
    promoted a replica that lacked some of them, the publish script answers `!tail` and the
    sink republishes them, behind a LOST_EVENT marker for any it no longer holds
    (shared/lua/publish.lua, "Tail repair").
    """

    batcher: PublishBatcher
    run_id: str
    lease_value: str
    on_cancel: Callable[[str], None]
    on_lost: Callable[[LeaseLost], None]
    lost: LeaseLost | None = None
    error: Exception | None = None
    published: int = 0
    repairs: int = 0  # tail repairs made (republished or marked lost)
    republished: int = 0  # events sent again by those repairs
    marked_lost: int = 0  # events a marker stands for (no longer held)
    _buf: list[tuple[str, bytes]] = field(default_factory=list)
    _end: bool = False
    _next_seq: int = 1
    _idle: asyncio.Event = field(default_factory=asyncio.Event)
    _encoder: EventEncoder | None = None
    _held: deque[tuple[int, str, bytes]] = field(default_factory=deque)
    _held_bytes: int = 0
    _dicts: dict[str, Dictionary] = field(default_factory=dict)
    _last_id: str = ""
    _repair: tuple[int, PublishCall] | None = None
    _check: bool = False
    _progress: asyncio.Event = field(default_factory=asyncio.Event)
    _dropped: int = 0  # events (other than `end`) that a failed publish left out of the stream

    def __post_init__(self) -> None:
        self._idle.set()
        self._encoder = self.batcher.encoder(self.lease_value)

    @property
    def acked_seq(self) -> int:
        """The sequence number of the newest event Redis acknowledged (0: none yet)."""
        return self._held[-1][0] if self._held else 0

    def emit(self, event: str, data: bytes) -> None:
        """Queue one event (in order)."""
        if self.lost is not None or self.error is not None:
            self._count_dropped([event])
            return
        self._buf.append((event, data))
        self._idle.clear()
        self.batcher.schedule(self)

    def check_tail(self) -> None:
        """Ask Redis whether the stream still has every acknowledged event (an empty call;
        the lease keeper asks after a renewal saw the stream behind, L1/B5)."""
        if self.lost is not None or self.error is not None or self._end:
            return
        self._check = True
        self._idle.clear()
        self.batcher.schedule(self)

    def _take(self) -> PublishCall:
        if self._repair is not None:
            done, failed = self._repair
            self._repair = None
            if self._buf:
                self.batcher.schedule(self)  # the rest goes after the repair, in order
            return self._repair_call(done, failed)
        self._check = False
        events, self._buf = self._buf[:MAX_EVENTS_PER_CALL], self._buf[MAX_EVENTS_PER_CALL:]
        assert self._encoder is not None
        batch = self._encoder.encode(events)
        for d in batch.dictionaries:
            self._dicts[d.id] = d
        call = PublishCall(
            self.run_id,
            self.lease_value,
            self._next_seq,
            batch.events,
            end=self._end and not self._buf,
            dictionaries=tuple(batch.dictionaries),
            new_dictionaries=batch.new,
            encoded=True,
        )
        self._next_seq += len(events)
        if self._buf:
            self.batcher.schedule(self)  # the rest goes in the next round trip, in order
        return call

    def _repair_call(self, done: int, failed: PublishCall) -> PublishCall:
        """Everything after `done` again: held events, a marker for the ones not held, then
        the call that found the tail missing. Every dictionary goes along (Redis may have
        lost them with the tail)."""
        tail = [(name, data) for seq, name, data in self._held if seq > done]
        first_held = failed.first_seq - len(tail)
        events = [*tail, *failed.events]
        first = done + 1
        if first_held > first:
            missing = first_held - first
            marker = encode_plain(serde.dumps({"lost_events": missing}))
            events.insert(0, (LOST_EVENT, marker))
            first = first_held - 1
            self.marked_lost += missing
        dictionaries = tuple(self._dicts[r] for r in sorted(needed(d for _, d in events)))
        self.repairs += 1
        self.republished += len(tail)
        log.warning(
            "stream tail lost (failover?): republishing %d held events%s",
            len(tail),
            f", marking {first_held - done - 1} lost" if first_held > done + 1 else "",
            extra={"run_id": self.run_id, "acknowledged": failed.first_seq - 1, "kept": done},
        )
        return dataclasses.replace(
            failed,
            first_seq=first,
            events=events,
            dictionaries=dictionaries,
            new_dictionaries=len(dictionaries),
            repair=self._last_id or "0-0",
        )

    def _hold(self, call: PublishCall) -> None:
        """Keep the acknowledged events of `call` (newest TAIL_KEEP_* of them)."""
        newest = self.acked_seq
        for i, (name, data) in enumerate(call.events):
            seq = call.first_seq + i
            if seq > newest:
                self._held.append((seq, name, data))
                self._held_bytes += len(data)
        while len(self._held) > 1 and (
            len(self._held) > TAIL_KEEP_EVENTS or self._held_bytes > TAIL_KEEP_BYTES
        ):
            self._held_bytes -= len(self._held.popleft()[2])

    def _complete(self, call: PublishCall, res: PublishResult | Exception) -> None:
        if isinstance(res, StreamTailLost):
            self._repair = (res.done, call)
            self.batcher.schedule(self)
            return
        if isinstance(res, Exception):
            self._count_dropped([name for name, _ in (*call.events, *self._buf)])
        if isinstance(res, LeaseLost):
            self.lost = res
            self._buf = []
            self.on_lost(res)
        elif isinstance(res, Exception):
            self.error = res
            self._buf = []
        else:
            self.published += len(res.ids)
            if res.ids:
                self._last_id = res.ids[-1]
            self._hold(call)
            if res.cancel_action:
                self.on_cancel(res.cancel_action)
        if not self._buf and not self._check:
            self._idle.set()
        self._progress.set()  # wake the flushes waiting on this call
        self._progress = asyncio.Event()

    async def flush(self) -> None:
        """Wait until every event emitted before this call is in the stream; events emitted
        meanwhile are not waited for (unlike `drain`). Raises LeaseLost, or the publish
        error, if one of them cannot be published or an event was already dropped."""
        target = self._next_seq - 1 + len(self._buf)
        while True:
            if self.lost is not None:
                raise self.lost
            if self.error is not None:
                raise self.error
            if self.acked_seq >= target:
                return
            await self._progress.wait()

    async def drain(self) -> None:
        """Wait until everything emitted so far is published; raise if it cannot be."""
        await self._idle.wait()
        if self.lost is not None:
            raise self.lost
        if self.error is not None:
            raise self.error

    async def publish_end(self, data: bytes) -> None:
        """Publish `end` (with the after-end TTL, B3/B7) after everything else."""
        await self.drain()
        self._end = True
        self.emit(END_EVENT, data)
        await self.drain()

    def _count_dropped(self, names: list[str]) -> None:
        # `end` is published again by whoever retries it; a marker stands for nothing.
        self._dropped += sum(1 for n in names if n not in (END_EVENT, LOST_EVENT))

    def rearm(self) -> None:
        """Publish again after a failure (Redis unreachable past the retries, or a lease
        that lapsed meanwhile and was taken back): the failure is forgotten and the next
        event numbered right after the last one Redis acknowledged, so a call whose reply
        was lost adds nothing twice (publish.lua). Events a failure left out of the stream
        are not sent again: a `lost` marker stands for them, which readers get as a gap
        (B5), never a silent hole."""
        self.lost = None
        self.error = None
        self._buf = []
        self._end = False
        self._check = False
        self._repair = None
        self._next_seq = self.acked_seq + 1
        self._idle.set()
        if self._dropped:
            marker = serde.dumps({"lost_events": self._dropped})
            self._dropped = 0
            self.emit(LOST_EVENT, marker)
