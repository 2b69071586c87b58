"""A4: the worker writes a client-chosen thread's public id into its stream events
(`PublicIds.at_source`, workers/stream_modes.py, workers/public_ids.py), so the web relays
them unparsed; what a client is answered is what the web's translation of the storage id
answered before, event for event, whatever the user's content holds, and the graph's own
objects (LangGraph's metadata, the config it checkpoints with) are never changed."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import uuid
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, cast

from hypothesis import given
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph

from shared import serde
from shared.runs.model import MultitaskStrategy, OnDisconnect, Run, RunStatus, StreamOptions
from shared.runs.thread_ids import (
    ID_EVENTS,
    PublicIds,
    SseTranslator,
    protocol_event_data,
    run_event_data,
    storage_id,
    storage_shaped,
)
from tests.unit.test_public_ids_typed import ALIASES, OTHER, S1, S2, X1, X2, _events, content
from workers.public_ids import write_public_ids
from workers.runtime import WorkerRuntime
from workers.stream_modes import StreamTranslator, graph_modes


def _sse(events: list[tuple[str, Any]]) -> bytes:
    return b"".join(
        f"id: 1-{n}\nevent: {name}\ndata: {serde.dumps_str(data)}\n\n".encode()
        for n, (name, data) in enumerate(events)
    )


def _parsed(body: bytes) -> list[Any]:
    return [serde.loads(m.split(b"data: ", 1)[1]) for m in body.split(b"\n\n") if m]


def test_a4_only_an_id_that_cannot_be_a_storage_id_is_written_at_the_source() -> None:
    """A4: X1 (not a version 5 UUID) is written; X2, which is X1's storage id, is left to
    the web (a reader that knows both would read it as X1), as is a server-made id."""
    assert storage_shaped(S1) and storage_shaped(S1.upper()) and not storage_shaped(X1)
    assert not storage_shaped(str(uuid.uuid4())) and not storage_shaped("nope")
    assert PublicIds.at_source(S1, X1) is not None
    assert PublicIds.at_source(S2, X2) is None
    assert PublicIds.at_source(OTHER, OTHER) is None
    assert PublicIds.at_source(S1, None) is None


@given(user=content)
def test_a4_events_written_at_the_source_answer_what_the_web_translated(user: Any) -> None:
    """A4: each event of X1's run written at the source is the web's translation of the
    event as an older worker wrote it (the storage id), through SSE, WebSocket frames and
    the protocol alike, with the user's content as it went in; the worker's objects are not
    changed; and the web relays the written stream as it is (translated again: unchanged)."""
    source = PublicIds.at_source(S1, X1)
    assert source is not None
    events = _events(S1, user)
    before = copy.deepcopy(events)
    written = [(name, source.event_data(name, data)) for name, data in events]
    assert events == before  # nothing of the graph's was changed in place
    old, new = _sse(events), _sse(written)
    web = PublicIds(ALIASES)
    assert _parsed(SseTranslator(web, run_event_data).feed(old)) == _parsed(new)
    assert _parsed(SseTranslator(web, run_event_data).feed(new)) == _parsed(new)
    for (name, data), (_, sent) in zip(events, written, strict=True):
        frame = {"type": "event", "run_id": OTHER, "id": "1-0", "event": name}
        old_frame = serde.dumps_str({**frame, "data": data})
        new_frame = serde.dumps_str({**frame, "data": sent})
        assert serde.loads(web.ws_frame(old_frame)) == serde.loads(web.ws_frame(new_frame))
        assert serde.loads(web.ws_frame(new_frame)) == serde.loads(new_frame)
        message = {"type": "event", "seq": 1, "method": name}
        old_msg = serde.dumps({**message, "params": {"data": data}})
        new_msg = serde.dumps({**message, "params": {"data": sent}})
        assert serde.loads(protocol_event_data(web, name, old_msg)) == serde.loads(new_msg)


def test_a4_a_written_stream_without_storage_ids_in_content_is_relayed_unparsed() -> None:
    """A4: the hot path: X1's written events that hold an id name no storage id, so the
    web's chunk is the same object out; the older worker's stream of the same events is
    translated into exactly those bytes."""
    source = PublicIds.at_source(S1, X1)
    assert source is not None
    events = [(n, d) for n, d in _events(S1, {"a": 1}) if n.split("|")[0] in ID_EVENTS]
    body = _sse([(name, source.event_data(name, data)) for name, data in events])
    assert S1.encode() not in body
    sse = SseTranslator(PublicIds(ALIASES), run_event_data)
    assert sse.feed(body) is body
    assert sse.feed(_sse(events)) == body


def _graph(saver: InMemorySaver) -> Any:
    model = GenericFakeChatModel(messages=iter([AIMessage(content="one two three")]))

    def chat(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("chat", chat)
    builder.add_edge(START, "chat")
    return builder.compile(checkpointer=saver)


def test_a4_the_translator_writes_langgraphs_own_events_and_leaves_the_graph_alone() -> None:
    """A4: a real LangGraph stream (token chunks, messages, checkpoints, debug) on a
    client-chosen thread: every event names the public id where the web would have written
    it, none names the storage id, and the graph still checkpoints under the storage id."""
    public = str(uuid.uuid4())
    storage = storage_id("bob", public)
    modes = ["messages", "messages-tuple", "checkpoints", "debug", "values"]
    saver = InMemorySaver()
    translator = StreamTranslator(modes, subgraphs=False)
    translator.ids = PublicIds.at_source(storage, public)
    plain = StreamTranslator(modes, subgraphs=False)
    config = {"configurable": {"thread_id": storage}, "metadata": {"thread_id": storage}}
    items = list(
        _graph(saver).stream(
            {"messages": [HumanMessage("hi")]}, config, stream_mode=graph_modes(modes)
        )
    )
    written = [(n, serde.dumps(d)) for item in items for n, d in translator.events(item)]
    old = [(n, serde.dumps(d)) for item in items for n, d in plain.events(item)]
    names = {n for n, _ in written}
    assert {"messages", "messages/metadata", "checkpoints", "debug"} <= names
    named = ("messages", "messages/metadata", "checkpoints")  # the storage id, unwritten
    assert all(storage.encode() in data for name, data in old if name in named)
    assert all(storage.encode() not in data for _, data in written)
    web = PublicIds({storage: public})
    for (name, data), (_, before) in zip(written, old, strict=True):
        assert serde.loads(data) == serde.loads(web.event_bytes(name, before)), name
    stored = list(saver.list(None))
    assert stored and {c.config["configurable"]["thread_id"] for c in stored} == {storage}


MODES = ["messages-tuple", "values"]


def _run(thread_id: str, **fields: Any) -> Run:
    now = dt.datetime.now(dt.UTC)
    run = Run(
        str(uuid.uuid4()),
        thread_id,
        "lead_agent",
        "lead_agent",
        RunStatus.RUNNING,
        MultitaskStrategy.ENQUEUE,
        OnDisconnect.CONTINUE,
        now,
        now,
        user_id="bob",
    )
    return replace(run, **fields)


def test_a4_the_worker_learns_the_public_id_beside_the_attempt() -> None:
    """A4: a joined public id is used at once; a storage id that can be a client-chosen
    one is looked up (events before the answer keep the storage id: the web translates
    them); a server-made id, a run whose modes name no thread and a thread streaming
    protocol run are never looked up; a failed lookup leaves it to the web."""
    public = str(uuid.uuid4())
    storage = storage_id("bob", public)
    asked: list[tuple[str, list[str]]] = []

    def public_ids(owner: str, ids: list[str]) -> dict[str, str]:
        asked.append((owner, ids))
        return {storage: public} if ids == [storage] else {}

    rt = cast(WorkerRuntime, SimpleNamespace(store=SimpleNamespace(public_ids=public_ids)))

    async def main() -> None:
        joined = StreamTranslator(MODES, subgraphs=False)
        write_public_ids(rt, _run(storage, thread_public_id=public), joined)
        assert joined.ids is not None and joined.lookup is None
        made = StreamTranslator(MODES, subgraphs=False)
        write_public_ids(rt, _run(str(uuid.uuid4())), made)
        assert made.ids is None and made.lookup is None
        values = StreamTranslator(["values", "updates"], subgraphs=False)
        write_public_ids(rt, _run(storage), values)
        assert values.ids is None and values.lookup is None
        protocol = StreamTranslator(MODES, subgraphs=False)
        kwargs = StreamOptions(stream_mode=["messages-tuple"], protocol_events=True)
        write_public_ids(rt, _run(storage, kwargs=kwargs), protocol)
        assert protocol.ids is None and protocol.lookup is None
        chosen = StreamTranslator(MODES, subgraphs=False)
        write_public_ids(rt, _run(storage), chosen)
        assert chosen.ids is None and chosen.lookup is not None
        await chosen.lookup
        assert chosen.ids is not None and chosen.ids.aliases == {storage: public}
        broken = StreamTranslator(MODES, subgraphs=False)
        write_public_ids(
            cast(WorkerRuntime, SimpleNamespace(store=SimpleNamespace(public_ids=_down))),
            _run(storage),
            broken,
        )
        assert broken.lookup is not None
        await broken.lookup
        assert broken.ids is None

    asyncio.run(main())
    assert asked == [("bob", [storage])]


def _down(owner: str, ids: list[str]) -> dict[str, str]:
    raise OSError("postgres is down")
