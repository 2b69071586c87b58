"""L2 for files: a run attempt writes an artifact only while it owns its run and its thread
exists, turn about with the thread's delete (the `write_artifact` tool under the worker's
files fence, `RunStore.files_fence`).

The race it closes: a thread deleted while its run was writing got the file afterwards
(the delete had removed the folder first), and a re-created thread of the same id then
served the deleted run's file.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import ToolException

from shared import workspaces
from shared.agent.tools import FILES_FENCE_KEY, write_artifact
from shared.errors import LeaseLost
from shared.runs.store import RunStore
from shared.tools.testing import wait_for
from tests.conftest import claimed_run


def tool_config(store: RunStore, tid: str, run_id: str, epoch: int, root: Path) -> dict[str, Any]:
    return {
        "configurable": {
            "thread_id": tid,
            "user_id": "alice",
            "workspace_dir": root,
            FILES_FENCE_KEY: partial(store.files_fence, run_id, epoch),
        }
    }


def write(config: dict[str, Any], name: str) -> str:
    return str(write_artifact.func(name, "secret", config))  # type: ignore[misc]


def lock_waiters(store: RunStore) -> int:
    """Backends of this database waiting for a row lock."""
    with store._pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
            " WHERE NOT l.granted AND a.datname = current_database()"
        ).fetchone()
    return int(row["n"]) if row else 0


def outputs(root: Path, tid: str) -> Path:
    return workspaces.thread_workspace(root, "alice", tid) / "outputs"


def test_l2_a_delete_waits_for_a_fenced_write_then_removes_its_file(
    store: RunStore, tmp_path: Path
) -> None:
    """L2: a delete that starts while a write holds the fence waits for it, and the file
    goes with the thread; after the delete the attempt writes nothing (ToolException)."""
    tid, run_id, epoch = claimed_run(store, "w1")
    config = tool_config(store, tid, run_id, epoch, tmp_path)
    assert json.loads(write(config, "a.md"))["path"] == "outputs/a.md"
    deleted_at: list[float] = []

    def delete() -> None:
        def purge(conn: Any, doomed: Any) -> None:
            workspaces.remove_workspace(tmp_path, "alice", tid)

        store.delete_thread(tid, "alice", purge)
        deleted_at.append(time.monotonic())

    with store.files_fence(run_id, epoch):
        deleter = threading.Thread(target=delete)
        deleter.start()
        wait_for(lambda: lock_waiters(store) > 0, 10, what="the delete waiting on the thread")
        assert not deleted_at
        outputs(tmp_path, tid).mkdir(parents=True, exist_ok=True)
        (outputs(tmp_path, tid) / "b.md").write_text("late")
        released = time.monotonic()
    deleter.join(10)
    assert deleted_at and deleted_at[0] >= released
    assert not outputs(tmp_path, tid).exists()  # both files went with the thread

    with pytest.raises(ToolException, match="the artifact was not written"):
        write(config, "c.md")
    assert not outputs(tmp_path, tid).exists()


def test_l2_a_re_created_thread_never_gets_the_deleted_runs_file(
    store: RunStore, tmp_path: Path
) -> None:
    """L2: the same thread id re-created after the delete: the deleted run's attempt is
    refused, the new thread's own run writes, and its listing holds only its own file."""
    client_id = str(uuid.uuid4())  # the client's id: the same storage id each time
    tid = store.create_thread(client_id, "alice", {}, "raise").thread_id
    _, run_id, epoch = claimed_run(store, "w2", thread_id=tid)
    stale = tool_config(store, tid, run_id, epoch, tmp_path)
    store.delete_thread(tid, "alice", lambda conn, doomed: None)
    assert store.create_thread(client_id, "alice", {}, "raise").thread_id == tid
    _, new_run, new_epoch = claimed_run(store, "w3", thread_id=tid)
    with pytest.raises(ToolException, match="the artifact was not written"):
        write(stale, "report.md")
    assert not outputs(tmp_path, tid).exists()
    write(tool_config(store, tid, new_run, new_epoch, tmp_path), "mine.md")
    assert sorted(p.name for p in outputs(tmp_path, tid).iterdir()) == ["mine.md"]


def test_l2_a_stale_epoch_is_refused(store: RunStore, tmp_path: Path) -> None:
    """L2: an attempt whose run was re-claimed (a newer epoch) writes nothing."""
    tid, run_id, epoch = claimed_run(store, "w4")
    with pytest.raises(LeaseLost), store.files_fence(run_id, epoch + 1):
        pass
    with pytest.raises(ToolException):
        write(tool_config(store, tid, run_id, epoch + 1, tmp_path), "x.md")
    assert not outputs(tmp_path, tid).exists()
