"""The project's own auth (`auth.path` in langgraph.json), driven with the official SDK.

The project (tests/fixtures/auth_project/: `auth.py`) is written from the patterns of LangGraph's custom-auth documentation:
bearer tokens checked in `@auth.authenticate`, owner-only resources by a metadata filter
that a global handler stamps on what a user creates, an admin by `permissions`, a read-only
role, a per-user store namespace, and a handler that crashes (it must refuse, never let
through). The graph reports the user it sees in `config["configurable"]`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import simple_websocket
from langgraph_sdk import get_sync_client
from langgraph_sdk.errors import APIStatusError

from shared.redis_keys import LimitKeys
from shared.tools.testing import Cluster
from tests.e2e.conftest import ClusterFactory

pytestmark = pytest.mark.e2e

PROJECT = Path(__file__).resolve().parents[1] / "fixtures" / "auth_project"
"""auth.py (the documentation's patterns), whoami.py (reports the user it sees), langgraph.json."""


OPS_KEY = "key-ops-authz"


@pytest.fixture(scope="module")
def auth_cluster(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    env = {
        "THREADRUN_CONFIG": str(PROJECT / "langgraph.json"),
        "THREADRUN_API_KEYS": f"{OPS_KEY}:operator:ops",
    }
    with private_cluster("authz", env) as c:
        c.side_by_side(c.start_web, c.start_worker)
        yield c


def client(cluster: Cluster, token: str, **headers: str) -> Any:
    return get_sync_client(
        url=cluster.url, api_key=None, headers={"Authorization": f"Bearer {token}", **headers}
    )


def status_of(call: Any) -> int:
    try:
        call()
    except (APIStatusError, httpx.HTTPStatusError) as exc:  # join: the SDK's httpx error
        return exc.response.status_code
    return 200


def test_authenticate_answers_with_the_handlers_status_and_detail(auth_cluster: Cluster) -> None:
    """No token and a bad token: the handler's 401 and its detail; a good one passes."""
    url = auth_cluster.url
    none = httpx.post(f"{url}/threads/search", json={})
    assert none.status_code == 401 and none.json()["detail"] == "Missing bearer token"
    bad = httpx.post(f"{url}/threads/search", json={}, headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and bad.json()["detail"] == "Invalid token"
    ok = httpx.post(f"{url}/threads/search", json={}, headers={"Authorization": "Bearer tok-alice"})
    assert ok.status_code == 200, ok.text


def test_owner_filter_covers_every_thread_route(auth_cluster: Cluster) -> None:
    """Alice's thread carries `metadata.owner` from the handler; Bob gets 404 on every read,
    update, delete, state, history, run list, run create and stream of it, and never
    sees it in search or count; the admin sees it."""
    alice, bob, admin = (client(auth_cluster, t) for t in ("tok-alice", "tok-bob", "tok-admin"))
    thread = alice.threads.create(metadata={"topic": "plans"})
    tid = thread["thread_id"]
    assert thread["metadata"]["owner"] == "alice"
    assert alice.threads.get(tid)["thread_id"] == tid
    for call in (
        lambda: bob.threads.get(tid),
        lambda: bob.threads.update(tid, metadata={"x": 1}),
        lambda: bob.threads.get_state(tid),
        lambda: bob.threads.get_history(tid),
        lambda: bob.threads.update_state(tid, {"seen": {}}),
        lambda: bob.runs.list(tid),
        lambda: bob.runs.create(tid, "whoami", input={}),
        lambda: bob.threads.copy(tid),
        lambda: bob.threads.delete(tid),
    ):
        assert status_of(call) == 404
    mine = {t["thread_id"] for t in bob.threads.search(limit=100)}
    assert tid not in mine
    assert bob.threads.count(metadata={"topic": "plans"}) == 0
    assert alice.threads.count(metadata={"topic": "plans"}) >= 1
    # Bob asking for Alice's metadata explicitly still gets nothing (filters combine).
    assert bob.threads.search(metadata={"owner": "alice"}) == []
    assert admin.threads.get(tid)["thread_id"] == tid
    assert alice.threads.get(tid)["metadata"]["owner"] == "alice"  # nothing Bob did landed


def test_runs_carry_the_user_and_limits_count_per_identity(auth_cluster: Cluster) -> None:
    """The graph sees the user as the official server passes it (attribute and item access,
    its own fields, permissions); configurable_headers copies x-team but never the
    credential; Bob can neither join nor stream Alice's run."""
    alice = client(auth_cluster, "tok-alice", **{"x-team": "blue"})
    bob = client(auth_cluster, "tok-bob")
    thread = alice.threads.create()
    out = alice.runs.wait(
        thread["thread_id"],
        "whoami",
        input={},
        config={"configurable": {"langgraph_auth_user_id": "mallory"}},
    )
    assert out["seen"] == {
        "identity_attr": "alice",
        "identity_item": "alice",
        "org": "acme",
        "user_id": "alice",
        "permissions": ["write"],
        "x_team": "blue",
        "has_authorization": False,
    }
    run = alice.runs.list(thread["thread_id"])[0]
    assert status_of(lambda: bob.runs.get(thread["thread_id"], run["run_id"])) == 404
    assert status_of(lambda: bob.runs.join(thread["thread_id"], run["run_id"])) == 404
    assert status_of(lambda: list(bob.runs.join_stream(thread["thread_id"], run["run_id"]))) == 404
    assert status_of(lambda: bob.runs.cancel(thread["thread_id"], run["run_id"])) == 404
    assert status_of(lambda: bob.runs.delete(thread["thread_id"], run["run_id"])) == 404
    assert (
        status_of(
            lambda: bob.runs.cancel_many(thread_id=thread["thread_id"], run_ids=[run["run_id"]])
        )
        == 404
    )
    assert status_of(lambda: bob.runs.cancel_many(status="all")) == 403  # across threads
    assert alice.runs.get(thread["thread_id"], run["run_id"])["status"] == "success"


def test_a4_a_cancelled_pending_run_leaves_its_identitys_active_set(auth_cluster: Cluster) -> None:
    """A4 under one tenant: every project user's runs are stored under the tenant, but they
    count against the user's own active set, and a pending run cancelled (ended without a
    worker) leaves that set, not the tenant's."""
    alice = client(auth_cluster, "tok-alice")
    thread = alice.threads.create()
    run = alice.runs.create(thread["thread_id"], "whoami", input={}, after_seconds=600)
    rds = redis.Redis.from_url(auth_cluster.settings.redis_url)
    try:
        key = LimitKeys(auth_cluster.settings.redis_prefix).active("alice")
        assert rds.zscore(key, run["run_id"]) is not None  # pending: counts for alice
        alice.runs.cancel(thread["thread_id"], run["run_id"])
        assert alice.runs.get(thread["thread_id"], run["run_id"])["status"] == "interrupted"
        assert rds.zscore(key, run["run_id"]) is None
    finally:
        rds.close()


def test_a_thread_a_run_creates_is_its_creators(auth_cluster: Cluster) -> None:
    """`if_not_exists=create`: the handler stamps the run's metadata, the new thread starts
    with it (as on the official server), so its creator sees it and Bob does not."""
    alice, bob = client(auth_cluster, "tok-alice"), client(auth_cluster, "tok-bob")
    tid = str(uuid.uuid4())
    alice.runs.wait(tid, "whoami", input={}, if_not_exists="create")
    assert alice.threads.get(tid)["metadata"]["owner"] == "alice"
    assert status_of(lambda: bob.threads.get(tid)) == 404
    # a stateless run works for anyone allowed create_run
    assert bob.runs.wait(None, "whoami", input={})["seen"]["identity_attr"] == "bob"


def test_handlers_awaiting_io_serve_concurrent_requests(auth_cluster: Cluster) -> None:
    """Handlers that await (the search handler sleeps) run for many requests at once in
    the gevent web process: every request gets its own, correct answer."""
    tokens = ["tok-alice", "tok-bob"] * 8
    made = {
        t: client(auth_cluster, t).threads.create(metadata={"burst": t})["thread_id"]
        for t in set(tokens)
    }

    def search(token: str) -> tuple[str, set[str]]:
        found = httpx.post(
            f"{auth_cluster.url}/threads/search",
            json={"metadata": {"burst": token}, "limit": 10},
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert found.status_code == 200, found.text
        return token, {t["thread_id"] for t in found.json()}

    with ThreadPoolExecutor(len(tokens)) as pool:
        for token, ids in pool.map(search, tokens):
            assert ids == {made[token]}


def test_read_only_role_reads_but_cannot_write(auth_cluster: Cluster) -> None:
    """The reader may search but not create threads, runs or assistants (the handler's 403)."""
    reader = client(auth_cluster, "tok-reader")
    assert isinstance(reader.threads.search(), list)
    assert status_of(lambda: reader.threads.create()) == 403
    assert status_of(lambda: reader.runs.wait(None, "whoami", input={})) == 403
    assert status_of(lambda: reader.assistants.create("whoami")) == 403


def test_assistants_are_filtered_like_threads(auth_cluster: Cluster) -> None:
    """Alice's assistant is hers: Bob gets 404 and does not find it; the admin does."""
    alice, bob, admin = (client(auth_cluster, t) for t in ("tok-alice", "tok-bob", "tok-admin"))
    made = alice.assistants.create("whoami", name="alice-helper")
    aid = made["assistant_id"]
    assert made["metadata"]["owner"] == "alice"
    assert status_of(lambda: bob.assistants.get(aid)) == 404
    assert status_of(lambda: bob.assistants.update(aid, name="taken")) == 404
    assert status_of(lambda: bob.assistants.delete(aid)) == 404
    assert aid not in {a["assistant_id"] for a in bob.assistants.search(limit=100)}
    assert admin.assistants.get(aid)["name"] == "alice-helper"
    # a run on Alice's assistant needs assistants.read on it, as on the official server
    assert status_of(lambda: bob.runs.wait(None, aid, input={})) == 404
    assert alice.runs.wait(None, aid, input={})["seen"]["identity_attr"] == "alice"


def test_store_namespace_rule_and_a_crashing_handler_refuses(auth_cluster: Cluster) -> None:
    """The store rule prefixes the user's identity: Alice's item is under ("alice", ...),
    Bob reading the same namespace gets nothing. The crashing crons.delete handler
    refuses (403), and the cron survives."""
    alice, bob = client(auth_cluster, "tok-alice"), client(auth_cluster, "tok-bob")
    alice.store.put_item(["notes"], "k1", {"text": "secret"})
    item = alice.store.get_item(["notes"], "k1")
    assert item is not None and item["namespace"] == ["alice", "notes"]
    assert bob.store.get_item(["notes"], "k1") is None
    assert bob.store.search_items(["notes"])["items"] == []
    cron = alice.crons.create("whoami", schedule="0 0 1 1 *", input={})
    assert status_of(lambda: alice.crons.delete(cron["cron_id"])) == 403
    assert any(c["cron_id"] == cron["cron_id"] for c in alice.crons.search())
    assert not any(c["cron_id"] == cron["cron_id"] for c in bob.crons.search())


def test_the_graphs_store_goes_through_the_store_handlers(auth_cluster: Cluster) -> None:
    """A graph's store write at run time is decided like the API's: the namespace rule puts
    it under ("alice", "memories"), where Alice's API read finds it and Bob's does not."""
    alice, bob = client(auth_cluster, "tok-alice"), client(auth_cluster, "tok-bob")
    alice.runs.wait(None, "whoami", input={"remember": "tea, no sugar"})
    item = alice.store.get_item(["memories"], "last")
    assert item is not None and item["namespace"] == ["alice", "memories"]
    assert item["value"] == {"text": "tea, no sugar", "by": "alice"}
    assert bob.store.get_item(["memories"], "last") is None


def test_ops_keeps_threadruns_own_credentials(auth_cluster: Cluster) -> None:
    """The ops API takes threadrun's key with the ops role, not the project's tokens."""
    url = auth_cluster.url
    assert httpx.get(f"{url}/ops/api/overview", headers={"x-api-key": OPS_KEY}).status_code == 200
    refused = httpx.get(f"{url}/ops/api/overview", headers={"Authorization": "Bearer tok-admin"})
    assert refused.status_code == 401


def ws_connect(cluster: Cluster, token: str) -> simple_websocket.Client:
    url = cluster.url.replace("http://", "ws://") + "/ws"
    return simple_websocket.Client.connect(url, headers={"Authorization": f"Bearer {token}"})


def ws_request(ws: simple_websocket.Client, frame: dict[str, Any]) -> dict[str, Any]:
    ws.send(json.dumps(frame))
    while True:
        msg = ws.receive(timeout=30)
        assert msg is not None, "no reply"
        got = json.loads(msg)
        if got["type"] not in ("event", "heartbeat", "end", "gap"):
            return dict(got)


def test_websocket_frames_go_through_the_same_decisions(auth_cluster: Cluster) -> None:
    """The upgrade is authenticated by the project's handler (401 without a token); Alice
    creates a run over the socket; Bob's join and cancel of it are refused as missing."""
    refused = httpx.get(
        auth_cluster.url + "/ws",
        headers={
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        },
    )
    assert refused.status_code == 401
    tid = client(auth_cluster, "tok-alice").threads.create()["thread_id"]
    alice = ws_connect(auth_cluster, "tok-alice")
    bob = ws_connect(auth_cluster, "tok-bob")
    try:
        created = ws_request(
            alice, {"type": "run.create", "thread_id": tid, "assistant_id": "whoami", "input": {}}
        )
        assert created["type"] == "run.created", created
        run_id = created["run"]["run_id"]
        joined = ws_request(bob, {"type": "run.join", "thread_id": tid, "run_id": run_id})
        assert joined["type"] == "error" and joined["code"] == "not_found", joined
        cancelled = ws_request(bob, {"type": "run.cancel", "thread_id": tid, "run_id": run_id})
        assert cancelled["type"] == "error" and cancelled["code"] == "not_found", cancelled
        made = ws_request(
            bob, {"type": "run.create", "thread_id": tid, "assistant_id": "whoami", "input": {}}
        )
        assert made["type"] == "error" and made["code"] == "not_found", made
    finally:
        alice.close()
        bob.close()


def test_openapi_describes_the_projects_auth(auth_cluster: Cluster) -> None:
    """`auth.openapi` replaces the document's security schemes and requirement."""
    doc = httpx.get(f"{auth_cluster.url}/openapi.json").json()
    assert doc["components"]["securitySchemes"] == {"Bearer": {"type": "http", "scheme": "bearer"}}
    assert doc["security"] == [{"Bearer": []}]
