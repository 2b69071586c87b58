"""Behaviours a peer's end-to-end suite (written with the official `langgraph-sdk` against
any Agent Server) relies on, checked here with the same client: the `events` stream mode
carries the graph's raw `on_chain_stream` events, `messages-tuple` carries the model's
tokens, and a state update on a thread that has no graph is the official server's 400,
fixed by setting the thread's `graph_id` metadata (A1, A3)."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import BadRequestError

from shared.tools.testing import Cluster
from tests.e2e.conftest import human
from tests.e2e.conftest import run_sdk as run
from tests.e2e.test_sdk_e2e import ai_tokens, knobs


def test_a1_events_mode_streams_on_chain_stream_events(cluster: Cluster) -> None:
    """A1: `stream_mode="events"` sends the graph's raw events (`astream_events`), among
    them `on_chain_stream`, for a run that sends no `context`, and no `error` event."""

    async def scenario(c: LangGraphClient) -> list[Any]:
        tid = (await c.threads.create())["thread_id"]
        return [
            p
            async for p in c.runs.stream(
                tid, "lead_agent", input=human("2+2?"), config=knobs(4), stream_mode="events"
            )
        ]

    parts = run(scenario, cluster.url)
    kinds = [p.data.get("event") for p in parts if p.event == "events"]
    assert "on_chain_stream" in kinds, kinds
    assert not [p for p in parts if p.event == "error"]


def test_a1_messages_tuple_streams_the_model_tokens(cluster: Cluster) -> None:
    """A1: `stream_mode="messages-tuple"` sends each model token as an `AIMessageChunk`
    (the chat clients' token stream), in order."""

    async def scenario(c: LangGraphClient) -> list[Any]:
        tid = (await c.threads.create())["thread_id"]
        return [
            p
            async for p in c.runs.stream(
                tid,
                "lead_agent",
                input=human("hello"),
                config=knobs(5),
                stream_mode="messages-tuple",
            )
        ]

    tokens = ai_tokens(run(scenario, cluster.url))
    assert len(tokens) >= 5, tokens


def test_a3_state_update_without_a_graph_is_a_400_naming_graph_id(cluster: Cluster) -> None:
    """A3: updating the state of a thread no run has used is a 400 (the official server's
    status) naming `metadata.graph_id`; once the thread's metadata names a served graph, the
    same update writes a checkpoint."""

    async def scenario(c: LangGraphClient) -> dict[str, Any]:
        tid = (await c.threads.create())["thread_id"]
        values = {"messages": [{"role": "user", "content": "set by hand", "id": "m1"}]}
        with pytest.raises(BadRequestError) as refused:
            await c.threads.update_state(tid, values)
        assert refused.value.response.status_code == 400
        body = refused.value.response.json()
        assert body["field"] == "metadata.graph_id" and "no associated graph" in body["message"]
        await c.threads.update(tid, metadata={"graph_id": "lead_agent"})
        await c.threads.update_state(tid, values)
        return dict(await c.threads.get_state(tid))

    state = run(scenario, cluster.url)
    assert [m["content"] for m in state["values"]["messages"]] == ["set by hand"]
