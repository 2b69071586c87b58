"""Webhooks end to end: the official langgraph-sdk against real processes (web,
a runs worker, a worker on the `webhooks` queue) and a local receiver (a threaded
http.server on 127.0.0.1, on THREADRUN_WEBHOOK_ALLOW).

A run's `webhook` receives the run as `runs.get` returns it plus the thread's final
values, signed (verified with `threadrun.webhooks.verify`); a 500 is retried; a private
address not on the allow list is refused at admission (a literal IP, 422) or at delivery
(a name resolving to one: the attempt is recorded as refused); runs without a thread and
pending runs cancelled by the web deliver too.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import orjson
import pytest
from langgraph_sdk.client import LangGraphClient

from shared.runs.thread_ids import storage_id
from shared.tools.testing import Cluster, wait_for
from tests.e2e.conftest import ALICE, FAST_LEASES, ClusterFactory, human
from tests.e2e.conftest import run_sdk as run
from threadrun import webhooks

pytestmark = pytest.mark.e2e

SECRET = "e2e-webhook-secret"
ENV = {
    **FAST_LEASES,
    "THREADRUN_WEBHOOK_SECRET": SECRET,
    "THREADRUN_WEBHOOK_ALLOW": "127.0.0.1",
    "THREADRUN_WEBHOOK_BACKOFF_BASE_S": "0.2",
    "THREADRUN_WEBHOOK_TIMEOUT_S": "3",
    "THREADRUN_WEBHOOK_STALE_S": "2",
    # The recovery pass deletes a delivered temporary thread this long after its run ended
    # (default 30 s): the stateless test waits for that deletion.
    "THREADRUN_TEMPORARY_THREAD_GRACE_S": "1",
    "THREADRUN_CRON_TICK_S": "0.5",
    "THREADRUN_CRON_MIN_INTERVAL_S": "1",
}


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    """Records every POST; `/fail-once/<key>` answers 500 the first time, then 200."""

    server: ThreadingHTTPServer
    got: list[Received] = field(default_factory=list)
    failed: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def on(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.got if r.path == path]


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    holder: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            rec = holder[0]
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with rec.lock:
                rec.got.append(Received(self.path, dict(self.headers), body, time.time()))
                status = 200
                if self.path.startswith("/fail-once/") and self.path not in rec.failed:
                    rec.failed.add(self.path)
                    status = 500
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder.append(Receiver(server))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield holder[0]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def hooks(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    """Web, one runs worker and one webhooks worker on their own database and prefix."""
    with private_cluster("webhooks", ENV) as c:
        c.side_by_side(
            c.start_web, lambda: c.start_worker("w1", concurrency=4), c.start_webhooks_worker
        )
        yield c


def knobs(tokens: int = 4, delay_ms: float = 0) -> dict[str, Any]:
    return {"configurable": {"tokens": tokens, "token_delay_ms": delay_ms}}


def events(c: Cluster, thread_id: str, run_id: str) -> list[dict[str, Any]]:
    """The run's webhook attempts among its audit events (GET …/runs/{r}/events)."""
    r = httpx.get(
        f"{c.url}/threads/{thread_id}/runs/{run_id}/events",
        params={"category": "delivery", "limit": 100},
        headers={"x-api-key": ALICE},
        timeout=10,
    )
    r.raise_for_status()
    return [e for e in r.json()["events"] if e["type"] == "webhook.attempt"]


def received(rec: Receiver, path: str, n: int = 1) -> list[Received]:
    wait_for(lambda: len(rec.on(path)) >= n, timeout=30, what=f"{n} POSTs to {path}")
    return rec.on(path)


def test_a_thread_run_delivers_the_run_and_final_values_signed(
    hooks: Cluster, receiver: Receiver
) -> None:
    """Webhooks: the run as runs.get returns it plus the thread's final values, with a
    signature that verifies with the client helper, and one audit event per attempt."""
    path = "/hook/thread-run"

    async def go(c: LangGraphClient) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        thread = await c.threads.create()
        created = await c.runs.create(
            thread["thread_id"],
            "lead_agent",
            input=human("hello webhook"),
            config=knobs(),
            webhook=receiver.url(path),
        )
        await c.runs.join(thread["thread_id"], created["run_id"])
        got = await c.runs.get(thread["thread_id"], created["run_id"])
        state = await c.threads.get_state(thread["thread_id"])
        return dict(got), dict(state), dict(thread)

    run_obj, state, thread = run(go, hooks.url)
    (hit,) = received(receiver, path)
    webhooks.verify(SECRET, hit.headers, hit.body)
    body = orjson.loads(hit.body)
    assert hit.headers["X-Threadrun-Delivery"] == run_obj["run_id"]
    assert hit.headers["X-Threadrun-Attempt"] == "1"
    assert body["status"] == "success" and body["run_id"] == run_obj["run_id"]
    assert body["values"] == state["values"]
    assert body["values"]["messages"][0]["content"] == "hello webhook"
    assert run_obj["kwargs"]["webhook"] == receiver.url(path)  # visible with the run
    assert {k: body[k] for k in ("thread_id", "assistant_id", "kwargs")} == {
        k: run_obj[k] for k in ("thread_id", "assistant_id", "kwargs")
    }
    wait_for(lambda: events(hooks, thread["thread_id"], run_obj["run_id"]), timeout=10)
    (event,) = events(hooks, thread["thread_id"], run_obj["run_id"])
    assert event["payload"]["outcome"] == "delivered" and event["payload"]["status_code"] == 200
    assert event["payload"]["url_host"] == "127.0.0.1" and not event["payload"]["will_retry"]


def test_a4_a_client_chosen_thread_id_is_reported_in_the_webhook(
    hooks: Cluster, receiver: Receiver
) -> None:
    """A4: the webhook of a run on a thread whose id the client chose (stored under another
    id, shared/runs/thread_ids.py) reports the client's id, never the storage id."""
    path = "/hook/client-chosen"
    chosen = str(uuid.uuid4())

    async def go(c: LangGraphClient) -> str:
        await c.threads.create(thread_id=chosen)
        created = await c.runs.create(
            chosen, "lead_agent", input=human("chosen"), config=knobs(), webhook=receiver.url(path)
        )
        await c.runs.join(chosen, created["run_id"])
        return str(created["run_id"])

    run_id = run(go, hooks.url)
    (hit,) = received(receiver, path)
    body = orjson.loads(hit.body)
    assert body["run_id"] == run_id and body["thread_id"] == chosen
    assert storage_id("alice", chosen).encode() not in hit.body


def test_a_500_is_retried_with_the_same_delivery_id(hooks: Cluster, receiver: Receiver) -> None:
    """Webhooks: retries on 5xx with backoff; the same body and X-Threadrun-Delivery, the
    attempt number counting up; both attempts recorded as audit events."""
    path = "/fail-once/retry"

    async def go(c: LangGraphClient) -> tuple[str, str]:
        thread = await c.threads.create()
        created = await c.runs.create(
            thread["thread_id"], "lead_agent", input=human("retry me"), webhook=receiver.url(path)
        )
        return thread["thread_id"], created["run_id"]

    thread_id, run_id = run(go, hooks.url)
    first, second = received(receiver, path, 2)
    assert first.body == second.body
    assert first.headers["X-Threadrun-Delivery"] == second.headers["X-Threadrun-Delivery"] == run_id
    assert (first.headers["X-Threadrun-Attempt"], second.headers["X-Threadrun-Attempt"]) == (
        "1",
        "2",
    )
    webhooks.verify(SECRET, second.headers, second.body)
    wait_for(lambda: len(events(hooks, thread_id, run_id)) == 2, timeout=10)
    attempts = [e["payload"] for e in events(hooks, thread_id, run_id)]
    assert [(a["status_code"], a["will_retry"]) for a in attempts] == [(500, True), (200, False)]


@pytest.mark.parametrize(
    "url", ["http://10.1.2.3/hook", "http://169.254.169.254/latest", "http://[::1]:8080/"]
)
def test_a_literal_private_address_is_refused_at_admission(hooks: Cluster, url: str) -> None:
    """Webhooks: an address the egress policy refuses is a 422 naming `webhook`."""

    async def go(c: LangGraphClient) -> httpx.Response:
        thread = await c.threads.create()
        try:
            await c.runs.create(thread["thread_id"], "lead_agent", input=None, webhook=url)
        except httpx.HTTPStatusError as exc:
            return exc.response
        raise AssertionError("admitted")

    response = run(go, hooks.url)
    assert response.status_code == 422
    assert "webhook" in response.text and "egress policy" in response.text


def test_a_name_resolving_to_a_private_address_is_refused_at_delivery(
    hooks: Cluster, receiver: Receiver
) -> None:
    """Webhooks: `127.2` is a host name to the URL check, and the resolver turns it into
    127.0.0.2 (loopback, not on the allow list, which has only 127.0.0.1): the attempt is
    recorded as refused, nothing is sent, and it is not retried."""
    port = receiver.server.server_address[1]
    path = "/hook/never"

    async def go(c: LangGraphClient) -> tuple[str, str]:
        thread = await c.threads.create()
        created = await c.runs.create(
            thread["thread_id"],
            "lead_agent",
            input=human("x"),
            webhook=f"http://127.2:{port}{path}",
        )
        return thread["thread_id"], created["run_id"]

    thread_id, run_id = run(go, hooks.url)
    wait_for(lambda: events(hooks, thread_id, run_id), timeout=30, what="the refused attempt")
    (attempt,) = [e["payload"] for e in events(hooks, thread_id, run_id)]
    assert attempt["outcome"] == "refused" and not attempt["will_retry"]
    assert "127.0.0.2" in attempt["error"] and "loopback" in attempt["error"]
    assert not receiver.on(path)


def test_a_run_without_a_thread_delivers(hooks: Cluster, receiver: Receiver) -> None:
    """Webhooks: a stateless run (runs.wait with no thread) delivers its final values,
    and its temporary thread is still deleted afterwards."""
    path = "/hook/stateless"

    async def go(c: LangGraphClient) -> Any:
        return await c.runs.wait(
            None, "lead_agent", input=human("no thread"), webhook=receiver.url(path)
        )

    values = run(go, hooks.url)
    (hit,) = received(receiver, path)
    webhooks.verify(SECRET, hit.headers, hit.body)
    body = orjson.loads(hit.body)
    assert body["status"] == "success" and body["on_completion"] == "delete"
    assert body["values"] == values

    async def thread_status(c: LangGraphClient) -> int:
        try:
            await c.threads.get(body["thread_id"])
        except httpx.HTTPStatusError as exc:
            return exc.response.status_code
        return 200

    wait_for(lambda: run(thread_status, hooks.url) == 404, timeout=60, what="thread deleted")


def test_a_cancelled_pending_run_delivers(hooks: Cluster, receiver: Receiver) -> None:
    """Webhooks: a pending run cancelled by the web (no worker ends it) delivers too."""
    path = "/hook/cancelled"

    async def go(c: LangGraphClient) -> str:
        thread = await c.threads.create()
        tid = thread["thread_id"]
        first = await c.runs.create(tid, "lead_agent", input=human("slow"), config=knobs(40, 50))
        queued = await c.runs.create(
            tid,
            "lead_agent",
            input=human("queued"),
            multitask_strategy="enqueue",
            webhook=receiver.url(path),
        )
        await c.runs.cancel(tid, queued["run_id"])
        await c.runs.cancel(tid, first["run_id"])
        return str(queued["run_id"])

    run_id = run(go, hooks.url)
    (hit,) = received(receiver, path)
    body = orjson.loads(hit.body)
    assert body["run_id"] == run_id and body["status"] == "interrupted"


def test_a_cron_firings_webhook_to_an_allowed_host_is_delivered(
    hooks: Cluster, receiver: Receiver
) -> None:
    """Webhooks, crons: a cron whose webhook names a host THREADRUN_WEBHOOK_ALLOW lets
    through fires and delivers. The scheduler used to check a firing's webhook against the
    default egress policy (and none of the project's `webhooks` rules), so every firing of
    such a cron failed with "127.0.0.1 is a loopback address" while its creation was 200."""
    hooks.start_scheduler("scheduler-webhooks")
    path = f"/hook/cron-{uuid.uuid4().hex[:8]}"

    async def go(c: LangGraphClient) -> str:
        cron = await c.crons.create(
            "lead_agent",
            schedule="* * * * * *",
            input=human("tick"),
            config=knobs(),
            webhook=receiver.url(path),
        )
        return str(cron["cron_id"])

    cron_id = run(go, hooks.url)
    try:
        hit = received(receiver, path)[0]
        webhooks.verify(SECRET, hit.headers, hit.body)
        assert orjson.loads(hit.body)["status"] == "success"
    finally:
        httpx.delete(f"{hooks.url}/runs/crons/{cron_id}", headers={"x-api-key": ALICE})
