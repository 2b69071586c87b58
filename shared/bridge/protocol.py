"""A thread's runs as LangChain's thread streaming protocol events (`client.threads.stream`):
the envelopes, their `seq`, and what the protocol adds to what a run published. Pure: the
walk over the thread's runs is the thread follower's (thread_follow.py), the transport
app/protocols/thread_stream/'s.

**seq.** The protocol's cursor is one integer per thread (`since` on reconnect). Here it is
made of where the event is, so that any web process, at any time, computes the same number
for the same event and can turn a `since` back into a stream position without state of its
own: `seq = run_seq << 30 | n << 5 | k`, with `run_seq` the run's admission order on its
thread, `n` the event's position in its run's Redis Stream (1 = the run's `metadata`), `k`
the envelope's index among those one entry gives (an interrupt adds `input.requested` and a
lifecycle after its `values`). Seqs therefore grow along the walk but are not contiguous;
the SDK only compares them. The bounds (2^25 entries per run, 32 envelopes per entry, 2^23
runs per thread) keep every seq below 2^53, exact in JavaScript too.

**What the protocol adds.** A run admitted by the protocol publishes LangGraph's own
protocol events (workers/protocol_events.py); to those the view adds the root namespace's
`lifecycle` (`running` at the run's first event; `completed`, `failed` with the error, or
`interrupted` when it stopped on an interrupt, at its end, from its durable status) and one
`input.requested` per interrupt (`interrupt_id`, `payload`), which `input.respond` answers.
A run admitted by the REST API published stream modes: its `values`, `updates` and `custom`
events are carried as protocol events too (its messages have no protocol shape).

**Gaps.** Where events the client needs are gone (B5), the client gets an unsolicited
protocol error (`{"type": "error", "id": null, "error": "resume_gap", ...}`, which the SDK
reports) naming the run and where to reload its state; the walk goes on with what remains.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from shared import serde
from shared.bridge.base import END_EVENT, Event, Gap, Heartbeat
from shared.bridge.subscriber import StreamSubscriber
from shared.bridge.thread_follow import StartAt, ThreadCursor, ThreadFollower
from shared.vocab import PROTOCOL_METHODS, RunStatus, ThreadStatus

RUN_SHIFT = 30
ENTRY_SHIFT = 5
MAX_K = (1 << ENTRY_SHIFT) - 1
CHANNELS = frozenset(
    {"values", "updates", "messages", "tools", "lifecycle", "input", "checkpoints", "tasks"}
    | {"custom"}
)
"""The protocol's channels (and any `custom:<name>`)."""
CLASSIC_METHODS = frozenset({"values", "updates", "custom"})
"""Stream-mode events of a REST-admitted run that the protocol carries."""


def seq_of(run_seq: int, n: int, k: int = 0) -> int:
    """The protocol seq of envelope `k` of entry `n` of the run `run_seq` of a thread."""
    return (run_seq << RUN_SHIFT) | (n << ENTRY_SHIFT) | min(k, MAX_K)


def parse_seq(seq: int) -> tuple[int, int, int]:
    """`(run_seq, n, k)` of a seq (the inverse of `seq_of`)."""
    return (
        seq >> RUN_SHIFT,
        (seq >> ENTRY_SHIFT) & ((1 << (RUN_SHIFT - ENTRY_SHIFT)) - 1),
        seq & MAX_K,
    )


def is_channel(name: str) -> bool:
    """Whether `name` is a channel a client may subscribe to."""
    return name in CHANNELS or (name.startswith("custom:") and len(name) > len("custom:"))


def gap_error(gap: Gap, thread_id: str) -> dict[str, Any]:
    """The unsolicited error a client gets where events it needs are gone (B5)."""
    return {
        "type": "error",
        "id": None,
        "error": "resume_gap",
        "message": (
            f"events of run {gap.run_id} after the cursor are no longer retained; reload the"
            f" thread's state (GET /threads/{thread_id}/state) and go on from here"
        ),
        "run_id": gap.run_id,
        "earliest_available_event_id": gap.earliest_available_event_id,
        "latest_available_event_id": gap.latest_available_event_id,
    }


@dataclass(slots=True)
class ProtocolRun:
    """One run of the walk, turning its events (ids `R:E`, with `n`) into envelopes.

    Every envelope depends only on the entry it comes from (and the run's durable status),
    never on what the walk saw before: a walk resumed at any `since` gives the same
    envelopes, ids and seqs as one that saw the whole run. So the root's `running` comes
    with the run's first entry (its `metadata`), and an interrupt's `input.requested` and
    `interrupted` with the `values` entry that carries it."""

    run_id: str
    run_seq: int
    graph_name: str
    protocol_events: bool
    last_n: int = 0
    error: str | None = None

    def feed(
        self, event: Event, on_hold: Callable[[], bool] = lambda: False
    ) -> list[dict[str, Any]]:
        """The envelopes of one event of this run; `on_hold()`: whether the run's thread
        waits on an interrupt (asked only at a successful run's end)."""
        n = event.n or self.last_n + 1
        self.last_n = max(self.last_n, n)
        out = _Out(self, event, n)
        name = event.event
        if name == "metadata":
            data = _loads(event.data)
            if isinstance(data, Mapping) and data.get("status") == "run_done":
                left = data.get("thread_status")
                held = (lambda: left == ThreadStatus.INTERRUPTED) if left is not None else on_hold
                self._end(out, data.get("run_status"), held)
            elif n == 1:
                out.lifecycle("running")
        elif name == "error":
            data = _loads(event.data)
            message = data.get("message") if isinstance(data, Mapping) else None
            self.error = str(message or data or "the run failed")
        elif name != END_EVENT:  # the follower sends the run's `run_done` in its place
            method, namespace = _method_and_namespace(name)
            data = _loads(event.data)
            if self.protocol_events:
                if method in PROTOCOL_METHODS and isinstance(data, dict):
                    _published(out, method, data)
            elif method in CLASSIC_METHODS:
                data = {"payload": data} if method == "custom" else data
                _published(out, method, {"namespace": namespace, "data": data})
        return out.items

    def _end(self, out: _Out, status: Any, on_hold: Callable[[], bool]) -> None:
        if status == RunStatus.SUCCESS:
            # An interrupted run told its `interrupted` with its last `values`.
            if not on_hold():
                out.lifecycle("completed")
            return
        why = {
            RunStatus.INTERRUPTED: "the run was cancelled",
            RunStatus.TIMEOUT: "the run exceeded its time limit",
        }.get(status, self.error or "the run failed")
        out.lifecycle("failed", error=why)


def _published(out: _Out, method: str, params: dict[str, Any]) -> None:
    """A published event, and the input requests its interrupts make."""
    interrupts = params.pop("interrupts", None)
    data = params.get("data")
    if isinstance(data, dict) and "__interrupt__" in data:
        if method == "updates":
            return  # the interrupt is told with the `values` that follows
        interrupts = data.pop("__interrupt__")
    namespace = list(params.setdefault("namespace", []))
    if method != "values" or not interrupts:
        out.add(method, params)
        return
    # The `values` an interrupt rides on repeats the state before it: the interrupt's
    # `input.requested` (and the root's `interrupted`) stand in its place, as the official
    # server sends them.
    for item in interrupts:
        interrupt_id = item.get("id") if isinstance(item, Mapping) else None
        if isinstance(interrupt_id, str):
            value = item.get("value")
            # `payload` is the protocol's field; the Python SDK 0.4 reads `value`.
            body = {"interrupt_id": interrupt_id, "payload": value, "value": value}
            out.add("input.requested", {"namespace": namespace, "data": body})
    if not namespace:
        out.lifecycle("interrupted")


class _Out:
    """The envelopes one entry gives, numbered `k` = 0, 1, ..."""

    def __init__(self, run: ProtocolRun, event: Event, n: int) -> None:
        self.run = run
        self.entry = event.id.partition(":")[2] or event.id
        self.n = n
        self.items: list[dict[str, Any]] = []

    def add(self, method: str, params: dict[str, Any], event_id: str | None = None) -> None:
        k = len(self.items)
        params.setdefault("timestamp", int(time.time() * 1000))
        self.items.append(
            {
                "type": "event",
                "event_id": event_id or f"{self.run.run_id}:{self.entry}.{k}",
                "seq": seq_of(self.run.run_seq, self.n, k),
                "method": method,
                "params": params,
            }
        )

    def lifecycle(self, status: str, *, error: str | None = None) -> None:
        data: dict[str, Any] = {"event": status, "graph_name": self.run.graph_name}
        if error is not None:
            data["error"] = error
        # Synthesized: the same id from every web process, whatever entry carried it.
        self.add(
            "lifecycle",
            {"namespace": [], "data": data},
            event_id=f"{self.run.run_id}:lifecycle:{status}",
        )


def _method_and_namespace(name: str) -> tuple[str, list[str]]:
    method, _, rest = name.partition("|")
    return method, rest.split("|") if rest else []


def _loads(data: str) -> Any:
    try:
        return serde.loads(data)
    except ValueError:
        return None


# --- the walk ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RunFacts:
    """What the walk needs to know of a run."""

    run_id: str
    seq: int
    graph_name: str
    protocol_events: bool


class WalkSource(Protocol):
    """What the walk reads besides the streams (the web's stores)."""

    def run_facts(self, run_id: str) -> RunFacts | None:
        """One run (None: gone)."""
        ...

    def run_at(self, thread_id: str, seq: int) -> str | None:
        """The id of the thread's run admitted `seq`-th (None: there is none, or it is gone)."""
        ...

    def on_hold(self, thread_id: str) -> bool:
        """Whether the thread waits on an interrupt."""
        ...


ProtocolItem = dict[str, Any] | Heartbeat
"""An envelope (an event, or an unsolicited error) or a heartbeat."""


class ProtocolWalk:
    """A thread's runs, one after the other, as protocol envelopes after `since`."""

    def __init__(
        self, follower: ThreadFollower, subscriber: StreamSubscriber, source: WalkSource
    ) -> None:
        self._follower = follower
        self._subscriber = subscriber
        self._source = source

    def walk(self, thread_id: str, since: int | None) -> Generator[list[ProtocolItem], None, None]:
        """Batches of items until the client leaves or the thread is deleted: without
        `since`, the run in progress or else the newest one from its start, then every
        later run; with it, exactly what follows that seq."""
        start: StartAt | ThreadCursor = StartAt.LATEST
        if since is not None:
            resumed = self._resume_at(thread_id, since)
            if isinstance(resumed, Gap):
                yield [gap_error(resumed, thread_id)]
            else:
                start = resumed
        runs: dict[str, ProtocolRun | None] = {}
        floor = since if since is not None else -1
        for batch in self._follower.follow(thread_id, start):
            out: list[ProtocolItem] = []
            for item in batch:
                if isinstance(item, Event):
                    run = self._run(runs, item.id.partition(":")[0])
                    if run is None:
                        continue
                    for envelope in run.feed(item, lambda: self._source.on_hold(thread_id)):
                        if envelope["seq"] > floor:
                            out.append(envelope)
                elif isinstance(item, Gap):
                    out.append(gap_error(item, thread_id))
                elif isinstance(item, Heartbeat):
                    out.append(item)
            yield out

    def _resume_at(self, thread_id: str, since: int) -> ThreadCursor | Gap:
        """Where the walk after `since` starts: the entry that gave it (its later
        envelopes are kept, the others filtered), or a gap when that run or entry is gone."""
        run_seq, n, _ = parse_seq(since)
        run_id = self._source.run_at(thread_id, run_seq)
        if run_id is None:
            return Gap(f"#{run_seq}", str(since), None, None)
        cursor = self._subscriber.cursor_before_entry(run_id, max(n, 1))
        if cursor is None:
            return Gap(run_id, str(since), None, None)
        return ThreadCursor(run_id, cursor)

    def _run(self, runs: dict[str, ProtocolRun | None], run_id: str) -> ProtocolRun | None:
        if run_id not in runs:
            facts = self._source.run_facts(run_id)
            runs[run_id] = (
                None
                if facts is None
                else ProtocolRun(facts.run_id, facts.seq, facts.graph_name, facts.protocol_events)
            )
        return runs[run_id]


def lifecycle_status(status: RunStatus | None) -> str:
    """A run's status as the protocol's `AgentStatus`."""
    return {
        RunStatus.PENDING: "started",
        RunStatus.RUNNING: "running",
        RunStatus.SUCCESS: "completed",
        RunStatus.INTERRUPTED: "interrupted",
    }.get(status, "failed")  # type: ignore[arg-type]


def agent_tree(
    graph_name: str, status: RunStatus | None, lifecycles: list[dict[str, Any]]
) -> dict[str, Any]:
    """`agent.getTree`'s tree: the run's root and the subgraphs its `lifecycle` events (their
    params, in order) entered, each with its last status."""
    root: dict[str, Any] = {
        "namespace": [],
        "status": lifecycle_status(status),
        "graph_name": graph_name,
        "children": [],
    }
    nodes: dict[tuple[str, ...], dict[str, Any]] = {(): root}
    for params in lifecycles:
        ns = tuple(params.get("namespace") or ())
        data = params.get("data") or {}
        if not ns or not isinstance(data, Mapping) or not isinstance(data.get("event"), str):
            continue
        node = nodes.get(ns)
        if node is None:
            node = {
                "namespace": list(ns),
                "status": data["event"],
                "graph_name": data.get("graph_name") or ns[-1].partition(":")[0],
                "children": [],
            }
            nodes[ns] = node
            parent = next(nodes[ns[:i]] for i in range(len(ns) - 1, -1, -1) if ns[:i] in nodes)
            parent["children"].append(node)
        node["status"] = data["event"]
    return root
