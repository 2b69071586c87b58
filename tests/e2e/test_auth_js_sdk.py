"""The project's own auth (`auth.path`) through the official JS SDK, `@langchain/langgraph-sdk`
in Node.js, against the same auth_project cluster as tests/e2e/test_project_auth.py (A1).

tests/fixtures/auth_project/js_check.mjs makes the calls with the JS `Client` as two users
(alice, bob: auth.py's bearer tokens in `defaultHeaders`), a read-only user and none:
thread create/get/search, a streamed run, bob's get/join/stream of alice's run, the store's
per-user namespace, the crashing `crons.delete` handler. The same calls made with the
Python SDK give the results the JS ones must equal. The SDK is installed with npm once, into
`.threadrun/js-sdk-e2e` (tests/e2e/node_packages.py); no node or npm fails the test by name.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from typing import Any

from langgraph_sdk import get_sync_client

from shared.tools.testing import Cluster
from tests.e2e import node_packages
from tests.e2e.test_project_auth import PROJECT, auth_cluster, client, status_of

__all__ = ["auth_cluster"]  # the module-scoped fixture, imported: this module's own cluster

JS_SDK = ["@langchain/langgraph-sdk@1.15.0"]
"""The pinned JS SDK (the version tests/e2e/test_genui.py uses)."""
SCRIPT = PROJECT / "js_check.mjs"
NODE_TIMEOUT_S = 120


def js_results(cluster: Cluster, tag: str) -> dict[str, Any]:
    """js_check.mjs's results (it exits 0 only when its own rules hold)."""
    folder = node_packages.installed("js-sdk-e2e", JS_SDK)
    shutil.copy(SCRIPT, folder / SCRIPT.name)  # node resolves the SDK from the script's folder
    done = subprocess.run(
        [node_packages.node(), SCRIPT.name, cluster.url, tag],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT_S,
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, (
        f"node js_check.mjs: rc {done.returncode}\n{done.stdout}{done.stderr}"
    )
    out = json.loads(lines[-1])
    assert out["failures"] == [], out
    return dict(out["results"])


def python_results(cluster: Cluster, tag: str) -> dict[str, Any]:
    """The script's calls, one for one, with the Python SDK (the same keys)."""
    alice, bob, reader = (client(cluster, t) for t in ("tok-alice", "tok-bob", "tok-reader"))
    nobody = get_sync_client(url=cluster.url, api_key=None)
    r: dict[str, Any] = {"unauthenticated_search": status_of(lambda: nobody.threads.search())}

    thread = alice.threads.create(metadata={"sdk_check": tag})
    tid = thread["thread_id"]
    r["thread_owner"] = thread["metadata"]["owner"]
    r["alice_get"] = alice.threads.get(tid)["thread_id"] == tid
    found = alice.threads.search(metadata={"sdk_check": tag})
    r["alice_search_lists"] = any(t["thread_id"] == tid for t in found)
    r["bob_get"] = status_of(lambda: bob.threads.get(tid))
    r["bob_update"] = status_of(lambda: bob.threads.update(tid, metadata={"x": 1}))
    r["bob_search_lists"] = any(t["thread_id"] == tid for t in bob.threads.search(limit=100))
    r["bob_search_owner_alice"] = len(bob.threads.search(metadata={"owner": "alice"}))
    r["reader_create"] = status_of(lambda: reader.threads.create())

    parts = list(alice.runs.stream(tid, "whoami", input={}, stream_mode=["values"]))
    r["stream_events"] = list(dict.fromkeys(p.event for p in parts))
    run_id = next(p.data["run_id"] for p in parts if p.event == "metadata")
    r["stream_seen"] = [p.data for p in parts if p.event == "values"][-1]["seen"]
    r["run_status"] = alice.runs.get(tid, run_id)["status"]
    r["bob_run_get"] = status_of(lambda: bob.runs.get(tid, run_id))
    r["bob_join"] = status_of(lambda: bob.runs.join(tid, run_id))
    r["bob_join_stream"] = status_of(lambda: list(bob.runs.join_stream(tid, run_id)))
    r["bob_stream_on_alices_thread"] = status_of(
        lambda: list(bob.runs.stream(tid, "whoami", input={}))
    )

    key = f"py-{tag}"
    alice.store.put_item(["notes"], key, {"text": "secret"})
    item = alice.store.get_item(["notes"], key)
    r["store_namespace"] = item["namespace"] if item else None
    r["store_value"] = item["value"] if item else None
    r["bob_store_get"] = bob.store.get_item(["notes"], key)
    r["bob_store_search"] = [i["key"] for i in bob.store.search_items(["notes"])["items"]]

    cron = alice.crons.create("whoami", schedule="0 0 1 1 *", input={}, metadata={"sdk_check": tag})
    r["cron_delete_crashing_handler"] = status_of(lambda: alice.crons.delete(cron["cron_id"]))
    r["cron_survives"] = any(c["cron_id"] == cron["cron_id"] for c in alice.crons.search(limit=100))
    r["bob_sees_cron"] = any(c["cron_id"] == cron["cron_id"] for c in bob.crons.search(limit=100))
    return r


def test_a1_the_js_sdk_gets_what_the_python_sdk_gets_from_the_project_auth(
    auth_cluster: Cluster,
) -> None:
    """A1: every call of js_check.mjs answers the JS SDK as the Python SDK's same call: 401
    without a token; alice's thread is hers (owner stamped, she gets and finds it), bob gets
    404 and does not find it; the read-only user's create is a 403; alice's streamed run
    sends metadata and values with the user the graph saw, bob's get, join, join stream and
    stream on her thread are 404s; the store item lands under ("alice", "notes") and bob
    finds nothing; the crashing crons.delete handler refuses (403) and the cron stays."""
    tag = uuid.uuid4().hex[:8]
    py = python_results(auth_cluster, tag)
    js = js_results(auth_cluster, tag)
    assert js == py
    # what tests/e2e/test_project_auth.py asserts of the Python SDK, so the pair means it
    assert (py["bob_get"], py["bob_join"], py["cron_delete_crashing_handler"]) == (404, 404, 403)
    assert py["store_namespace"] == ["alice", "notes"] and py["bob_store_get"] is None
