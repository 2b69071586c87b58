"""The thread streaming protocol's envelopes (shared/bridge/protocol.py), pure: seqs that any
web process computes alike and that grow along the walk, envelopes that depend only on the
entry they come from (so a walk resumed at any seq gives exactly the rest, B4/B5), the root
lifecycle and input requests the protocol adds, and the agent tree."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from shared import serde
from shared.bridge.base import Event
from shared.bridge.protocol import (
    ProtocolRun,
    agent_tree,
    is_channel,
    parse_seq,
    seq_of,
)
from shared.vocab import RunStatus

RUN = "6a3f2f8e-58a4-4b5c-9d2e-3f4f1d0e9b11"


def entry(n: int, name: str, data: Any) -> Event:
    return Event(f"{RUN}:{1000 + n}-0", name, serde.dumps_str(data), n)


def protocol_run(events: bool = True) -> ProtocolRun:
    return ProtocolRun(RUN, 7, "approval", events)


def message(n: int, text: str) -> Event:
    data = {
        "event": "content-block-delta",
        "index": 0,
        "delta": {"type": "text-delta", "text": text},
    }
    return entry(n, "messages", {"namespace": [], "timestamp": 1, "data": data})


def values(n: int, interrupts: list[dict[str, Any]] | None = None) -> Event:
    params: dict[str, Any] = {"namespace": [], "timestamp": 1, "data": {"messages": []}}
    if interrupts is not None:
        params["interrupts"] = interrupts
    return entry(n, "values", params)


def done(n: int, status: RunStatus) -> Event:
    data = {"status": "run_done", "run_id": RUN, "run_status": status}
    return Event(f"{RUN}:done", "metadata", serde.dumps_str(data), n)


def a_run(tokens: int, interrupted: bool, status: RunStatus) -> list[Event]:
    out = [entry(1, "metadata", {"run_id": RUN, "attempt": 1}), values(2)]
    out += [message(3 + i, f"t{i}") for i in range(tokens)]
    n = 3 + tokens
    if interrupted:
        out.append(values(n, [{"id": "i-1", "value": {"question": "approve?"}}]))
        n += 1
    elif status is RunStatus.ERROR:
        out.append(entry(n, "error", {"error": "ValueError", "message": "boom"}))
        n += 1
    out.append(done(n, status))
    return out


def stripped(envelopes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Envelopes without their timestamps (wall clock, the one thing that may differ)."""
    out = []
    for e in envelopes:
        params = {k: v for k, v in e["params"].items() if k != "timestamp"}
        out.append({**e, "params": params})
    return out


def feed(run: ProtocolRun, events: list[Event], on_hold: bool = False) -> list[dict[str, Any]]:
    return [env for ev in events for env in run.feed(ev, lambda: on_hold)]


@given(st.integers(0, (1 << 23) - 1), st.integers(0, (1 << 25) - 1), st.integers(0, 31))
def test_seq_round_trips_below_2_53(run_seq: int, n: int, k: int) -> None:
    """A seq is (run, entry, envelope) and nothing else; exact in JavaScript too."""
    seq = seq_of(run_seq, n, k)
    assert parse_seq(seq) == (run_seq, n, k)
    assert seq < 1 << 53


@given(st.integers(0, 6), st.booleans(), st.sampled_from(list(RunStatus)), st.data())
def test_a_resumed_walk_gives_exactly_the_rest(
    tokens: int, interrupted: bool, status: RunStatus, data: st.DataObject
) -> None:
    """B4/B5 for the protocol: from any envelope's seq, the envelopes of a run fed again from
    the entry that gave it, filtered after that seq, are exactly those after it in a walk
    that saw everything: same ids, same seqs, same payloads; and seqs only grow."""
    events = a_run(tokens, interrupted, status)
    whole = stripped(feed(protocol_run(), events, on_hold=interrupted))
    seqs = [e["seq"] for e in whole]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert len({e["event_id"] for e in whole}) == len(whole)
    cut = data.draw(st.integers(0, len(whole) - 1))
    since = whole[cut]["seq"]
    _, n, _ = parse_seq(since)
    rest = [ev for ev in events if (ev.n or 0) >= n]
    resumed = [
        e for e in stripped(feed(protocol_run(), rest, on_hold=interrupted)) if e["seq"] > since
    ]
    assert resumed == whole[cut + 1 :]


def test_the_root_lifecycle_frames_a_run() -> None:
    """`running` with the run's first entry, `completed` at its end (the root's)."""
    got = feed(protocol_run(), a_run(2, False, RunStatus.SUCCESS))
    lifecycles = [e["params"]["data"]["event"] for e in got if e["method"] == "lifecycle"]
    assert lifecycles == ["running", "completed"]
    assert got[0]["params"]["data"] == {"event": "running", "graph_name": "approval"}
    assert [e["method"] for e in got[1:-1]] == ["values", "messages", "messages"]


def test_an_interrupt_requests_input_and_pauses_the_root() -> None:
    """The `values` carrying an interrupt gives, in its place, `input.requested` (its id and
    value) and the root's `interrupted` (as the official server sends them); the run's
    successful end adds nothing while the thread waits."""
    got = feed(protocol_run(), a_run(0, True, RunStatus.SUCCESS), on_hold=True)
    methods = [e["method"] for e in got]
    assert methods == ["lifecycle", "values", "input.requested", "lifecycle"]
    request = got[2]["params"]["data"]
    assert request["interrupt_id"] == "i-1" and request["payload"] == {"question": "approve?"}
    assert got[-1]["params"]["data"]["event"] == "interrupted"


def test_the_end_says_what_the_run_left_whenever_it_is_read() -> None:
    """A run's `end` carries the thread status it left: an interrupted run's end adds no
    `completed`, read while the thread still waits or after it was resumed; without that
    (an `end` from before, or none), the thread's status now decides."""
    held = {"status": "run_done", "run_id": RUN, "run_status": "success"}
    for on_hold in (True, False):
        ended = Event(
            f"{RUN}:done", "metadata", serde.dumps_str({**held, "thread_status": "interrupted"}), 9
        )
        assert protocol_run().feed(ended, lambda h=on_hold: h) == []  # type: ignore[misc]
        idle = Event(
            f"{RUN}:done", "metadata", serde.dumps_str({**held, "thread_status": "idle"}), 9
        )
        (done_,) = protocol_run().feed(idle, lambda h=on_hold: h)  # type: ignore[misc]
        assert done_["params"]["data"]["event"] == "completed"


def test_a_failed_run_says_why() -> None:
    """An error ends the root `failed` with the run's error message; a cancel and a timeout
    say so."""
    failed = feed(protocol_run(), a_run(1, False, RunStatus.ERROR))[-1]["params"]["data"]
    assert failed == {"event": "failed", "graph_name": "approval", "error": "boom"}
    cancelled = feed(protocol_run(), a_run(0, False, RunStatus.INTERRUPTED))[-1]
    assert cancelled["params"]["data"]["error"] == "the run was cancelled"


def test_a_rest_run_is_carried_by_its_stream_modes() -> None:
    """A run admitted by the REST API: its values, updates (of a subgraph: its namespace)
    and custom events; what has no protocol shape is left out."""
    run = protocol_run(events=False)
    got = feed(
        run,
        [
            entry(1, "metadata", {"run_id": RUN, "attempt": 1}),
            entry(2, "values", {"messages": []}),
            entry(3, "updates|sub:1", {"node": {"x": 1}}),
            entry(4, "custom", {"progress": 1}),
            entry(5, "messages/partial", [{"content": "x"}]),
        ],
    )
    assert [(e["method"], e["params"]["namespace"]) for e in got[1:]] == [
        ("values", []),
        ("updates", ["sub:1"]),
        ("custom", []),
    ]
    assert got[3]["params"]["data"] == {"payload": {"progress": 1}}


def test_channels() -> None:
    """The protocol's channels and any named custom channel; nothing else."""
    assert all(is_channel(c) for c in ("values", "input", "custom", "custom:a2ui"))
    assert not any(is_channel(c) for c in ("custom:", "events", "debug", ""))


def test_the_agent_tree_nests_the_subgraphs_a_run_entered() -> None:
    """agent.getTree: the root with the run's status, each subgraph under its parent with
    its last lifecycle status."""
    started = {"event": "started", "graph_name": "research"}
    lifecycles = [
        {"namespace": ["research:1"], "data": started},
        {"namespace": ["research:1", "search:2"], "data": {"event": "started"}},
        {"namespace": ["research:1", "search:2"], "data": {"event": "completed"}},
        {"namespace": ["research:1"], "data": {"event": "completed"}},
    ]
    tree = agent_tree("lead", RunStatus.SUCCESS, lifecycles)
    assert tree["status"] == "completed" and tree["graph_name"] == "lead"
    (child,) = tree["children"]
    assert (child["graph_name"], child["status"]) == ("research", "completed")
    (grandchild,) = child["children"]
    assert grandchild["namespace"] == ["research:1", "search:2"]
    assert (grandchild["graph_name"], grandchild["status"]) == ("search", "completed")
