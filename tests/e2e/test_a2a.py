"""A2A at /a2a/{assistant_id}, driven by the `a2a-sdk` 1.x client (and raw JSON-RPC over
httpx for what a client must never send) against a web process and a runs worker.

The mapping under test: contextId <-> thread, task <-> run, an interrupt ends the task in
input-required and the next message on it resumes the run (Command resume); the SSE of a
streamed task comes from the run's Redis Stream through the web's subscriber (B4: exact
replay after Last-Event-ID). Identity and isolation are the REST API's (A4).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
import redis
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.client.client import ClientCallContext
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError, TaskNotCancelableError, TaskNotFoundError
from google.protobuf import json_format
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient

from shared.redis_keys import Keys
from shared.tools.testing import Cluster, wait_for
from tests.e2e.conftest import ALICE, BOB

pytestmark = pytest.mark.e2e

QUICK = {"configurable": {"tokens": 4}}
SLOW = {"configurable": {"tokens": 400, "token_delay_ms": 100}}  # ~40 s unless cancelled
STEADY = {"configurable": {"tokens": 30, "token_delay_ms": 60}}  # ~2 s


@pytest.fixture(scope="module")
def graphs(graphs_cluster: Cluster) -> Cluster:
    """The session's web process and runs worker serving the test graphs (conftest)."""
    return graphs_cluster


@pytest.fixture(scope="module")
def sdk(graphs: Cluster) -> Iterator[SyncLangGraphClient]:
    """The official langgraph-sdk, as alice: to make assistants and read runs and threads."""
    client = get_sync_client(url=graphs.url, api_key=ALICE)
    yield client
    client.http.client.close()


@pytest.fixture(scope="module")
def agents(sdk: SyncLangGraphClient) -> dict[str, str]:
    """Assistants of alice with the lead agent's knobs: quick, steady and slow."""
    made = {
        name: sdk.assistants.create("lead_agent", config=config, name=f"a2a {name}")
        for name, config in (("quick", QUICK), ("steady", STEADY), ("slow", SLOW))
    }
    return {name: a["assistant_id"] for name, a in made.items()}


def run(fn: Callable[[], Awaitable[Any]]) -> Any:
    """Run one async scenario."""
    return asyncio.run(fn())


def keyed(key: str = ALICE) -> httpx.AsyncClient:
    """An httpx client presenting `key` (the a2a-sdk takes it through ClientConfig)."""
    return httpx.AsyncClient(headers={"x-api-key": key}, timeout=60)


async def client_for(
    url: str, http: httpx.AsyncClient, *, streaming: bool, polling: bool = False
) -> Any:
    """An a2a-sdk client made from the agent's card at `url` (the SDK fetches it)."""
    config = ClientConfig(httpx_client=http, streaming=streaming, polling=polling)
    return await ClientFactory(config).create_from_url(url)


def user(text: str, *, context_id: str = "", task_id: str = "") -> SendMessageRequest:
    """A user message with one text part."""
    message = Message(
        message_id=str(uuid.uuid4()),
        role=Role.ROLE_USER,
        parts=[Part(text=text)],
        context_id=context_id,
        task_id=task_id,
    )
    return SendMessageRequest(message=message)


async def responses(stream: AsyncIterator[StreamResponse]) -> list[StreamResponse]:
    """Every response of a stream."""
    return [r async for r in stream]


def the_task(got: list[StreamResponse]) -> Task:
    """The one Task of a non-streaming send."""
    assert len(got) == 1 and got[0].HasField("task"), got
    return got[0].task


def artifact_text(task: Task) -> str:
    """The text of the task's artifact."""
    assert len(task.artifacts) == 1, task
    return "".join(p.text for p in task.artifacts[0].parts)


def run_id_of(task: Task) -> tuple[str, str]:
    """(thread id, run id) of a task's first run (its id is `<contextId>:<run id>`)."""
    context_id, _, run_id = task.id.partition(":")
    assert context_id == task.context_id
    return context_id, run_id


def test_agent_cards(graphs: Cluster, agents: dict[str, str]) -> None:
    """the card where the SDK looks under the agent's URL, and at the root with
    `?assistant_id=` (the official server's) or the first graph by default; its interface
    URL is this server's, its skill the assistant."""
    aid = agents["quick"]

    async def go() -> None:
        async with keyed() as http:
            card = await A2ACardResolver(http, f"{graphs.url}/a2a/{aid}").get_agent_card()
            root = await A2ACardResolver(http, graphs.url).get_agent_card(
                f"/.well-known/agent-card.json?assistant_id={aid}"
            )
            default = await A2ACardResolver(http, graphs.url).get_agent_card()
            by_graph = await A2ACardResolver(http, f"{graphs.url}/a2a/approval").get_agent_card()
        assert card.name == "a2a quick" and card.capabilities.streaming
        assert [i.url for i in card.supported_interfaces] == [f"{graphs.url}/a2a/{aid}"]
        assert card.supported_interfaces[0].protocol_binding == "JSONRPC"
        assert [s.id for s in card.skills] == [f"{aid}-main"]
        assert "x-api-key" in json_format.MessageToJson(card)
        assert root == card
        assert "lead_agent" in default.skills[0].tags
        assert "approval" in by_graph.skills[0].tags

    run(go)


def test_send_message_answers_the_completed_task(
    graphs: Cluster, agents: dict[str, str], sdk: SyncLangGraphClient
) -> None:
    """a non-streaming send waits for the run: the Task is completed, its artifact the
    thread's last AI message; the context is the thread, the task its run (A1)."""

    async def go() -> Task:
        async with keyed() as http:
            client = await client_for(f"{graphs.url}/a2a/{agents['quick']}", http, streaming=False)
            return the_task(await responses(client.send_message(user("hello over a2a"))))

    task = run(go)
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    thread_id, run_id = run_id_of(task)
    assert sdk.runs.get(thread_id, run_id)["status"] == "success"
    messages = sdk.threads.get_state(thread_id)["values"]["messages"]
    assert artifact_text(task) == messages[-1]["content"] and artifact_text(task)
    assert task.artifacts[0].artifact_id == messages[-1]["id"]
    assert [m.role for m in task.history] == [Role.ROLE_USER, Role.ROLE_AGENT]
    assert task.history[0].parts[0].text == "hello over a2a"


def test_stream_message(graphs: Cluster, agents: dict[str, str]) -> None:
    """a streamed send: the submitted task, `working`, the artifact's text chunk by chunk
    (from the run's Redis Stream), the whole artifact, then `completed`; a follow-up
    message on the same context continues the thread in a new task."""

    async def go() -> tuple[list[StreamResponse], Task]:
        async with keyed() as http:
            client = await client_for(f"{graphs.url}/a2a/{agents['quick']}", http, streaming=True)
            got = await responses(client.send_message(user("stream it")))
            context_id = got[0].task.context_id
            again = await responses(client.send_message(user("and again", context_id=context_id)))
            return got, again[-1]

    got, _ = run(go)
    kinds = [r.WhichOneof("payload") for r in got]
    assert kinds[0] == "task" and got[0].task.status.state == TaskState.TASK_STATE_SUBMITTED
    assert got[1].status_update.status.state == TaskState.TASK_STATE_WORKING
    assert got[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    final = got[-2].artifact_update
    assert final.last_chunk and not final.append
    chunks = [
        r.artifact_update
        for r in got[2:-2]
        if r.HasField("artifact_update")
        and r.artifact_update.artifact.artifact_id == final.artifact.artifact_id
    ]
    assert len(chunks) >= 2 and not chunks[0].append and all(c.append for c in chunks[1:])
    streamed = "".join(p.text for c in chunks for p in c.artifact.parts)
    assert streamed == "".join(p.text for p in final.artifact.parts)
    assert {r.status_update.task_id or r.artifact_update.task_id for r in got[1:]} == {
        got[0].task.id
    }


def test_follow_up_on_a_context(
    graphs: Cluster, agents: dict[str, str], sdk: SyncLangGraphClient
) -> None:
    """a message with the contextId of an earlier task runs on the same thread."""

    async def go() -> tuple[Task, Task]:
        async with keyed() as http:
            client = await client_for(f"{graphs.url}/a2a/{agents['quick']}", http, streaming=False)
            first = the_task(await responses(client.send_message(user("one"))))
            second = the_task(
                await responses(client.send_message(user("two", context_id=first.context_id)))
            )
            return first, second

    first, second = run(go)
    assert second.context_id == first.context_id and second.id != first.id
    humans = [
        m["content"]
        for m in sdk.threads.get_state(first.context_id)["values"]["messages"]
        if m["type"] == "human"
    ]
    assert humans == ["one", "two"]


def test_get_and_cancel_a_task(
    graphs: Cluster, agents: dict[str, str], sdk: SyncLangGraphClient
) -> None:
    """R5 over A2A: a task sent to return at once is got while it works, cancelled (its run
    is `interrupted` as the REST API shows it), then not cancelable any more."""

    async def go() -> tuple[Task, Task, Task]:
        async with keyed() as http:
            url = f"{graphs.url}/a2a/{agents['slow']}"
            client = await client_for(url, http, streaming=False, polling=True)
            sent = the_task(await responses(client.send_message(user("take your time"))))
            got = await client.get_task(GetTaskRequest(id=sent.id))
            cancelled = await client.cancel_task(CancelTaskRequest(id=sent.id))
            with pytest.raises(TaskNotCancelableError):
                await client.cancel_task(CancelTaskRequest(id=sent.id))
            return sent, got, cancelled

    sent, got, cancelled = run(go)
    assert sent.status.state == TaskState.TASK_STATE_SUBMITTED
    assert got.id == sent.id and got.status.state in (
        TaskState.TASK_STATE_SUBMITTED,
        TaskState.TASK_STATE_WORKING,
    )
    thread_id, run_id = run_id_of(sent)
    wait_for(lambda: sdk.runs.get(thread_id, run_id)["status"] == "interrupted", 15, what="cancel")
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED


def test_interrupt_requires_input_and_a_reply_resumes(
    graphs: Cluster, sdk: SyncLangGraphClient
) -> None:
    """the approval graph's interrupt() ends the task in input-required with the
    interrupt's value; a reply on the task resumes the run (Command resume) to completed,
    under the same task id."""

    async def go() -> tuple[Task, Task]:
        async with keyed() as http:
            client = await client_for(f"{graphs.url}/a2a/approval", http, streaming=False)
            asked = the_task(await responses(client.send_message(user("may I?"))))
            reply = user("yes", context_id=asked.context_id, task_id=asked.id)
            done = the_task(await responses(client.send_message(reply)))
            return asked, done

    asked, done = run(go)
    assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    data = [
        json_format.MessageToDict(p.data) for p in asked.status.message.parts if p.HasField("data")
    ]
    assert data == [{"question": "approve?"}]
    assert done.id == asked.id and done.status.state == TaskState.TASK_STATE_COMPLETED
    assert artifact_text(done) == "approved: yes"
    assert sdk.threads.get(asked.context_id)["status"] == "idle"


def test_streamed_interrupt(graphs: Cluster) -> None:
    """a streamed send to the approval graph closes on input-required."""

    async def go() -> list[StreamResponse]:
        async with keyed() as http:
            client = await client_for(f"{graphs.url}/a2a/approval", http, streaming=True)
            return await responses(client.send_message(user("may I?")))

    got = run(go)
    assert got[-1].status_update.status.state == TaskState.TASK_STATE_INPUT_REQUIRED


def test_subscribe_replays_exactly_after_last_event_id(
    graphs: Cluster, agents: dict[str, str]
) -> None:
    """SubscribeToTask on a working task: the task, then its run's answers to the end; with
    the SSE id of an answer as Last-Event-ID, a later subscription (the task has ended by
    then) resumes exactly after it (B4)."""
    url = f"{graphs.url}/a2a/{agents['steady']}"

    async def go() -> tuple[list[StreamResponse], tuple[list[str], list[str]], list[str]]:
        async with keyed() as http:
            poller = await client_for(url, http, streaming=False, polling=True)
            streamer = await client_for(url, http, streaming=True)
            sent = the_task(await responses(poller.send_message(user("count"))))
            whole, raw = await asyncio.gather(
                responses(streamer.subscribe(SubscribeToTaskRequest(id=sent.id))),
                _sse_ids(http, url, sent.id, None),
            )
            ids = raw[0]
            _, after = await _sse_ids(http, url, sent.id, ids[len(ids) // 2])
            return whole, raw, after

    whole, (ids, texts), after = run(go)
    assert whole[0].HasField("task")
    assert whole[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    cut = ids[len(ids) // 2]
    last_at = len(ids) - 1 - ids[::-1].index(cut)
    assert after == texts[last_at + 1 :] and after


def test_gap_closes_with_the_durable_outcome(graphs: Cluster, agents: dict[str, str]) -> None:
    """B5 over A2A: the run's stream is gone (expired, lost with Redis), so a subscription
    after an event id cannot replay exactly: it says so (`gap` in the status update's
    metadata) and closes with the task's durable outcome, never a silent hole."""
    url = f"{graphs.url}/a2a/{agents['quick']}"

    async def go() -> list[StreamResponse]:
        async with keyed() as http:
            streamer = await client_for(url, http, streaming=True)
            sent = await responses(streamer.send_message(user("then lose it")))
            task_id = sent[0].task.id
            keys = Keys(graphs.settings.redis_prefix)
            r = redis.Redis.from_url(graphs.settings.redis_url)
            try:
                run_id = task_id.partition(":")[2]
                assert r.delete(keys.stream(run_id), keys.stream_meta(run_id)) == 2
            finally:
                r.close()
            context = ClientCallContext(service_parameters={"Last-Event-ID": "1-0"})
            request = SubscribeToTaskRequest(id=task_id)
            return await responses(streamer.subscribe(request, context=context))

    got = run(go)
    assert got[0].HasField("task")
    last = got[-1].status_update
    assert last.status.state == TaskState.TASK_STATE_COMPLETED
    gap = json_format.MessageToDict(last.metadata)["threadrun"]["gap"]
    assert gap["code"] == "stream_replay_gap" and gap["recovery"] == "reload_durable_state"
    assert got[-2].artifact_update.last_chunk


async def _sse_ids(
    http: httpx.AsyncClient, url: str, task_id: str, last: str | None
) -> tuple[list[str], list[str]]:
    """(SSE ids, the JSON of each message with an id) of a SubscribeToTask, raw."""
    import json

    body = {"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask", "params": {"id": task_id}}
    headers = {"Accept": "text/event-stream", **({"Last-Event-ID": last} if last else {})}
    ids: list[str] = []
    texts: list[str] = []
    async with http.stream("POST", url, json=body, headers=headers) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        event_id = None
        async for line in resp.aiter_lines():
            if line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("data: ") and event_id is not None:
                ids.append(event_id)
                texts.append(json.dumps(json.loads(line[6:])["result"], sort_keys=True))
                event_id = None
    return ids, texts


def test_another_users_task_is_not_found(graphs: Cluster, agents: dict[str, str]) -> None:
    """A4: bob neither gets, cancels nor answers alice's task (task not found)."""

    async def go() -> None:
        url = f"{graphs.url}/a2a/approval"
        async with keyed(ALICE) as a_http, keyed(BOB) as b_http:
            alice = await client_for(url, a_http, streaming=False)
            bob = await client_for(url, b_http, streaming=False)
            asked = the_task(await responses(alice.send_message(user("may I?"))))
            with pytest.raises(TaskNotFoundError):
                await bob.get_task(GetTaskRequest(id=asked.id))
            with pytest.raises(TaskNotFoundError):
                await bob.cancel_task(CancelTaskRequest(id=asked.id))
            with pytest.raises(TaskNotFoundError):
                reply = user("yes", context_id=asked.context_id, task_id=asked.id)
                await responses(bob.send_message(reply))
            still = await alice.get_task(GetTaskRequest(id=asked.id))
            assert still.status.state == TaskState.TASK_STATE_INPUT_REQUIRED

    run(go)


def rpc(
    graphs: Cluster,
    body: bytes | dict[str, Any],
    *,
    path: str = "/a2a/lead_agent",
    key: str | None = ALICE,
) -> httpx.Response:
    """One raw POST to the JSON-RPC endpoint."""
    headers = {"content-type": "application/json", **({"x-api-key": key} if key else {})}
    content = body if isinstance(body, bytes) else httpx.Request("POST", "/", json=body).content
    return httpx.post(f"{graphs.url}{path}", content=content, headers=headers, timeout=30)


def rpc_error(resp: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC error of an answer (HTTP 200, as JSON-RPC answers)."""
    assert resp.status_code == 200, resp.text
    error: dict[str, Any] = resp.json()["error"]
    return error


def send_body(message: dict[str, Any], method: str = "SendMessage") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": "r1", "method": method, "params": {"message": message}}


GOOD = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}


def test_bad_input_gets_the_protocols_errors(graphs: Cluster) -> None:
    """malformed JSON, an unknown method, bad params (naming the field), an unknown
    assistant, a task that is not one: each its JSON-RPC error, never a 500 or a hang."""
    parse = rpc_error(rpc(graphs, b"{not json"))
    assert parse["code"] == -32700 and rpc(graphs, b"{not json").json()["id"] is None
    not_rpc = rpc_error(rpc(graphs, {"jsonrpc": "1.0", "id": 3, "method": "SendMessage"}))
    assert not_rpc["code"] == -32600 and "jsonrpc" in not_rpc["message"]
    unknown = rpc(graphs, {"jsonrpc": "2.0", "id": 7, "method": "FlyToTheMoon", "params": {}})
    assert rpc_error(unknown)["code"] == -32601 and unknown.json()["id"] == 7
    no_parts = rpc_error(rpc(graphs, send_body({"messageId": "m1", "role": "ROLE_USER"})))
    assert no_parts["code"] == -32602 and "params.message.parts" in no_parts["message"]
    assert no_parts["data"][0]["metadata"]["field"] == "params.message.parts"
    two = rpc_error(rpc(graphs, send_body({**GOOD, "parts": [{"text": "a", "url": "http://x"}]})))
    assert two["code"] == -32602 and "params.message.parts[0]" in two["message"]
    nobody = rpc_error(rpc(graphs, send_body(GOOD), path="/a2a/no-such-agent"))
    assert nobody["code"] == -32602 and "no-such-agent" in nobody["message"]
    missing = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "nope"}}
    assert rpc_error(rpc(graphs, missing))["code"] == -32001
    ghost = f"{uuid.uuid4()}:{uuid.uuid4()}"
    assert rpc_error(rpc(graphs, {**missing, "params": {"id": ghost}}))["code"] == -32001
    bad_context = rpc_error(rpc(graphs, send_body({**GOOD, "contextId": "not-a-uuid"})))
    assert bad_context["code"] == -32602 and "contextId" in bad_context["message"]
    unsupported = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}}
    assert rpc_error(rpc(graphs, unsupported))["code"] == -32004
    assert rpc(graphs, send_body(GOOD), key=None).status_code == 401
    card = httpx.get(
        f"{graphs.url}/a2a/no-such-agent/.well-known/agent-card.json", headers={"x-api-key": ALICE}
    )
    assert card.status_code == 404 and "no-such-agent" in card.json()["message"]


def test_the_sdk_raises_the_errors(graphs: Cluster, agents: dict[str, str]) -> None:
    """the SDK's own error types for a task that is not found (its id is not ours)."""

    async def go() -> None:
        async with keyed() as http:
            client = await client_for(f"{graphs.url}/a2a/{agents['quick']}", http, streaming=False)
            with pytest.raises(TaskNotFoundError):
                await client.get_task(GetTaskRequest(id="nope"))
            with pytest.raises(InvalidParamsError):
                await client.get_task(GetTaskRequest(id=""))

    run(go)


def test_legacy_slash_methods(graphs: Cluster) -> None:
    """0.3's `message/send` and `tasks/get` (what the official server also takes): 0.3's
    shapes, `kind`s and lower-case states."""
    message = {
        "kind": "message",
        "messageId": "m2",
        "role": "user",
        "parts": [{"kind": "text", "text": "hi"}],
    }
    sent = rpc(graphs, send_body(message, "message/send")).json()["result"]
    assert sent["kind"] == "task" and sent["status"]["state"] == "completed"
    assert sent["artifacts"][0]["parts"][0]["kind"] == "text"
    got = rpc(
        graphs, {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": sent["id"]}}
    )
    assert got.json()["result"]["id"] == sent["id"]
