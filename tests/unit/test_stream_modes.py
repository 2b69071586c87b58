"""A1: the `messages` and `messages-tuple` stream modes, against what LangGraph itself yields.

The same graph (a node calling a streaming chat model) is streamed by LangGraph with its
`messages` mode; the translator's events are then checked against those tuples and against
the graph's final state.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langgraph.graph import START, MessagesState, StateGraph

from workers.stream_modes import StreamTranslator, graph_modes

REPLY = "the quick brown fox jumps over the lazy dog"


def _graph() -> Any:
    model = GenericFakeChatModel(messages=iter([AIMessage(content=REPLY)]))

    def chat(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("chat", chat)
    builder.add_edge(START, "chat")
    return builder.compile()


def _stream(modes: list[str]) -> tuple[list[Any], dict[str, Any]]:
    graph = _graph()
    items = list(
        graph.stream(
            {"messages": [HumanMessage("hi")]}, stream_mode=[*graph_modes(modes), "values"]
        )
    )
    return items, items[-1][1]


def test_a1_graph_modes_ask_langgraph_once_per_underlying_mode() -> None:
    """A1: both message modes are fed by LangGraph's single `messages` mode."""
    assert graph_modes(["messages", "messages-tuple", "values"]) == ["messages", "values"]
    assert graph_modes(["updates"]) == ["updates"]


def test_a1_messages_mode_accumulates_what_langgraph_streams() -> None:
    """A1: `messages/metadata` once per message, then `messages/partial` with the whole
    message so far for every chunk LangGraph yields; the last partial is the final reply."""
    items, final = _stream(["messages"])
    tuples = [chunk for mode, chunk in items if mode == "messages"]
    chunks = [m for m, _ in tuples if isinstance(m, AIMessageChunk)]
    assert len(chunks) > 3  # the fake model streams word by word
    translator = StreamTranslator(["messages"], subgraphs=False)
    events = [e for item in items for e in translator.events(item)]
    names = [name for name, _ in events]
    assert names.count("messages/metadata") == 1
    assert names.count("messages/partial") == len(chunks)
    assert "messages" not in names  # the tuple form is not asked for
    meta_name, meta = next(e for e in events if e[0] == "messages/metadata")
    (msg_id, doc) = next(iter(meta.items()))
    assert msg_id == chunks[0].id and doc["metadata"]["langgraph_node"] == "chat"
    partials = [data[0] for name, data in events if name == "messages/partial"]
    texts = [p.content for p in partials]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))
    assert texts[-1] == REPLY == final["messages"][-1].content
    assert all(isinstance(p, AIMessage) and p.id == msg_id for p in partials)


def test_a1_messages_tuple_passes_langgraphs_tuples_unchanged() -> None:
    """A1: `messages-tuple` is LangGraph's own `(chunk, metadata)` stream, event `messages`."""
    items, _ = _stream(["messages-tuple"])
    translator = StreamTranslator(["messages-tuple"], subgraphs=False)
    events = [e for item in items for e in translator.events(item)]
    assert [d for n, d in events if n == "messages"] == [c for m, c in items if m == "messages"]
    assert not [n for n, _ in events if n.startswith("messages/")]


def test_a1_both_message_modes_and_other_modes_together() -> None:
    """A1: asking both forms gives both; other modes pass through with their data."""
    items, _ = _stream(["messages", "messages-tuple", "values"])
    translator = StreamTranslator(["messages", "messages-tuple", "values"], subgraphs=False)
    names = [n for item in items for n, _ in translator.events(item)]
    assert {"messages", "messages/metadata", "messages/partial", "values"} <= set(names)


def test_a1_a_whole_message_is_complete_and_subgraph_events_carry_the_namespace() -> None:
    """A1: a message that arrives whole is `messages/complete`; a subgraph's events are
    named `<event>|<namespace>`."""
    whole = AIMessage(content="done", id="m1")
    translator = StreamTranslator(["messages", "updates"], subgraphs=True)
    events = translator.events((("child:1",), "messages", (whole, {"langgraph_node": "x"})))
    assert [n for n, _ in events] == ["messages/metadata|child:1", "messages/complete|child:1"]
    assert events[1][1] == [whole]
    assert translator.events(((), "updates", {"x": 1})) == [("updates", {"x": 1})]


def _events(modes: list[str], *, subgraphs: bool = False) -> tuple[list[tuple[str, Any]], Any]:
    import asyncio
    import uuid

    graph = _graph()
    translator = StreamTranslator(modes, subgraphs=subgraphs)
    root = str(uuid.uuid4())

    async def go() -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        async for event in graph.astream_events(
            {"messages": [HumanMessage("hi")]},
            {"run_id": root},
            version="v2",
            stream_mode=graph_modes(modes),
            subgraphs=subgraphs,
        ):
            out.extend(translator.callback_event(event, root))
        return out

    return asyncio.run(go()), graph


def test_a1_events_mode_is_langchains_astream_events_and_still_feeds_other_modes() -> None:
    """A1: `events` sends LangChain's astream_events v2 events (the model's tokens among
    them); the graph's own stream inside them still gives the other modes asked for."""
    events, _ = _events(["events", "messages", "values"])
    kinds = [data["event"] for name, data in events if name == "events"]
    assert "on_chain_start" in kinds and "on_chat_model_stream" in kinds
    streamed = "".join(
        data["data"]["chunk"].content
        for name, data in events
        if name == "events" and data["event"] == "on_chat_model_stream"
    )
    assert streamed == REPLY
    partial = [data[0].content for name, data in events if name == "messages/partial"]
    assert partial[-1] == REPLY
    values = [data for name, data in events if name == "values"]
    assert values[-1]["messages"][-1].content == REPLY


def test_a1_events_alone_sends_no_other_mode() -> None:
    """A1: asking only `events` sends only `events` (the stream mode LangGraph needs for
    the graph's own stream is not passed on)."""
    events, _ = _events(["events"])
    assert events and {name for name, _ in events} == {"events"}
