"""Artifacts over HTTP (SPEC §9, A4, G3): the owner lists and downloads what the agent wrote;
another user gets exactly the answer for a missing thread; traversal, hidden files and
symbolic links are refused."""

from __future__ import annotations

import os

import httpx
import psycopg
import pytest

from shared.tools.testing import Cluster
from shared.workspaces import thread_workspace
from tests.e2e.conftest import ALICE, BOB

pytestmark = pytest.mark.e2e


def client(c: Cluster, key: str) -> httpx.Client:
    return httpx.Client(base_url=c.url, headers={"x-api-key": key}, timeout=60)


def test_a4_g3_artifacts_are_served_to_the_owner_only(cluster: Cluster) -> None:
    """A4, G3: list and download an artifact the run wrote; Bob's answers equal a missing
    thread's; bad names are a 400 naming `name`; a symlink planted in outputs/ is not served."""
    with client(cluster, ALICE) as alice, client(cluster, BOB) as bob:
        tid = alice.post("/threads", json={}).json()["thread_id"]
        body = {
            "assistant_id": "lead_agent",
            "input": {"messages": [{"role": "user", "content": "please write a report"}]},
            "config": {"configurable": {"tokens": 8}},
        }
        assert alice.post(f"/threads/{tid}/runs/wait", json=body).status_code == 200
        listed = alice.get(f"/threads/{tid}/artifacts").json()
        assert [a["path"] for a in listed] == ["outputs/report.md"]
        on_disk = (
            thread_workspace(cluster.settings.workspace_dir, "alice", tid) / "outputs" / "report.md"
        )
        got = alice.get(f"/threads/{tid}/artifacts/outputs/report.md")
        assert got.status_code == 200 and got.content == on_disk.read_bytes()
        assert got.headers["content-disposition"].startswith("attachment")
        assert listed[0]["size"] == on_disk.stat().st_size

        missing = "00000000-0000-4000-8000-000000000000"
        for path in ("artifacts", "artifacts/outputs/report.md"):
            theirs = bob.get(f"/threads/{tid}/{path}")
            absent = bob.get(f"/threads/{missing}/{path}")
            assert theirs.status_code == absent.status_code == 404
            assert theirs.json()["error"] == absent.json()["error"] == "not_found"
        assert alice.get(f"/threads/{tid}/artifacts/outputs/nope.md").status_code == 404

        for bad in (".env", "%2e%2e", "..."):
            res = alice.get(f"/threads/{tid}/artifacts/outputs/{bad}")
            assert res.status_code == 400 and res.json()["field"] == "name", (bad, res.text)
        assert alice.get(f"/threads/{tid}/artifacts/outputs/..%2f..%2fsecret").status_code in (
            400,
            404,
        )

        os.symlink("/etc/hostname", on_disk.parent / "link.md")
        assert alice.get(f"/threads/{tid}/artifacts/outputs/link.md").status_code == 404
        assert [a["path"] for a in alice.get(f"/threads/{tid}/artifacts").json()] == [
            "outputs/report.md"
        ]


def test_a4_a_deleted_threads_files_go_and_its_id_serves_nobody_else(
    cluster: Cluster,
) -> None:
    """A4: deleting a thread removes its workspace and the audit trail says
    so; another user re-creating the id gets an empty workspace of their own, never the
    first owner's files (before the fix: the report stayed on disk and Bob downloaded it)."""
    with client(cluster, ALICE) as alice, client(cluster, BOB) as bob:
        tid = alice.post("/threads", json={}).json()["thread_id"]
        body = {
            "assistant_id": "lead_agent",
            "input": {"messages": [{"role": "user", "content": "please write a report"}]},
            "config": {"configurable": {"tokens": 8}},
        }
        assert alice.post(f"/threads/{tid}/runs/wait", json=body).status_code == 200
        folder = thread_workspace(cluster.settings.workspace_dir, "alice", tid)
        assert (folder / "outputs" / "report.md").is_file()
        assert alice.delete(f"/threads/{tid}").status_code == 204
        assert not folder.exists()

        assert bob.post("/threads", json={"thread_id": tid}).status_code == 200
        assert bob.get(f"/threads/{tid}/artifacts").json() == []
        assert bob.get(f"/threads/{tid}/artifacts/outputs/report.md").status_code == 404
    with psycopg.connect(cluster.settings.dsn) as conn:
        rows = conn.execute(
            "SELECT actor, result, detail FROM ops_audit"
            " WHERE action = 'thread.delete' AND params->>'thread_id' = %s",
            (tid,),
        ).fetchall()
    assert rows == [("alice", "deleted", {"workspace_files_removed": 1})]


def test_a4_deleting_an_assistant_with_its_threads_removes_their_files(cluster: Cluster) -> None:
    """A4: `DELETE /assistants/{id}?delete_threads=true` removes each thread the way
    `DELETE /threads/{id}` does: files on disk too, and the thread.delete audit record; the
    same thread id made again lists no artifact of the old one."""
    with client(cluster, ALICE) as alice:
        aid = alice.post("/assistants", json={"graph_id": "lead_agent"}).json()["assistant_id"]
        tid = alice.post("/threads", json={}).json()["thread_id"]
        body = {
            "assistant_id": aid,
            "input": {"messages": [{"role": "user", "content": "please write a report"}]},
            "config": {"configurable": {"tokens": 8}},
        }
        assert alice.post(f"/threads/{tid}/runs/wait", json=body).status_code == 200
        workspace = thread_workspace(cluster.settings.workspace_dir, "alice", tid)
        assert (workspace / "outputs" / "report.md").exists()
        deleted = alice.delete(f"/assistants/{aid}", params={"delete_threads": "true"})
        assert deleted.status_code == 204, deleted.text
        assert alice.get(f"/threads/{tid}").status_code == 404
        assert not (workspace / "outputs" / "report.md").exists()
        again = alice.post("/threads", json={"thread_id": tid})
        assert again.status_code == 200, again.text
        assert alice.get(f"/threads/{tid}/artifacts").json() == []
        with psycopg.connect(cluster.settings.database_url.get_secret_value()) as conn:
            audited = conn.execute(
                "SELECT count(*) FROM ops_audit WHERE action = 'thread.delete'"
                " AND params->>'thread_id' = %s",
                (tid,),
            ).fetchone()
        assert audited is not None and audited[0] == 1
