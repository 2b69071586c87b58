"""Workspace artifact tools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig

from shared.agent.tools import list_artifacts, read_artifact, write_artifact
from shared.workspaces import OWNERLESS


def cfg(workspace: Any, thread_id: Any = "t-1") -> RunnableConfig:
    return RunnableConfig(configurable={"thread_id": thread_id, "workspace_dir": workspace})


def call(tool_name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_call", "id": "call_0", "name": tool_name, "args": args}


def test_write_read_list(tmp_path: Path) -> None:
    out = write_artifact.invoke({"filename": "notes.md", "content": "héllo"}, cfg(tmp_path))
    assert json.loads(out) == {"path": "outputs/notes.md", "size": 6}
    assert (tmp_path / OWNERLESS / "t-1" / "outputs" / "notes.md").read_text() == "héllo"
    assert read_artifact.invoke({"filename": "notes.md"}, cfg(tmp_path)) == "héllo"
    listed = json.loads(list_artifacts.invoke({}, cfg(tmp_path)))
    assert listed == [{"path": "outputs/notes.md", "size": 6}]
    assert list_artifacts.invoke({}, cfg(tmp_path, "t-2")) == "[]"
    assert not list(tmp_path.glob("t-1/outputs/.*"))


def test_overwrite_replaces_the_file(tmp_path: Path) -> None:
    write_artifact.invoke({"filename": "a.txt", "content": "one"}, cfg(tmp_path))
    write_artifact.invoke({"filename": "a.txt", "content": "two"}, cfg(tmp_path))
    assert read_artifact.invoke({"filename": "a.txt"}, cfg(tmp_path)) == "two"


@pytest.mark.parametrize(
    "filename",
    ["../escape.md", "/etc/passwd", "a/b.md", "a\\b.md", "..", ".", ".hidden", "", " x", "c:x"],
)
def test_path_traversal_is_refused_with_a_message(tmp_path: Path, filename: str) -> None:
    result = write_artifact.invoke(
        call("write_artifact", {"filename": filename, "content": "x"}), cfg(tmp_path / "ws")
    )
    assert isinstance(result, ToolMessage)
    assert result.status == "error"
    assert "filename" in result.text
    assert not any(tmp_path.iterdir())


def test_symlinked_artifact_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    outputs = tmp_path / "ws" / OWNERLESS / "t-1" / "outputs"
    outputs.mkdir(parents=True)
    (outputs / "link.txt").symlink_to(outside)
    for tool, args in (
        (read_artifact, {"filename": "link.txt"}),
        (write_artifact, {"filename": "link.txt", "content": "x"}),
    ):
        result = tool.invoke(call(tool.name, args), cfg(tmp_path / "ws"))
        assert result.status == "error"
    assert outside.read_text() == "secret"


@pytest.mark.parametrize("thread_id", [None, "", "../other", "a/b", ".."])
def test_a_usable_thread_id_is_required(tmp_path: Path, thread_id: Any) -> None:
    result = write_artifact.invoke(
        call("write_artifact", {"filename": "a.md", "content": "x"}), cfg(tmp_path, thread_id)
    )
    assert result.status == "error"
    assert "thread_id" in result.text


def test_a_string_workspace_override_is_refused(tmp_path: Path) -> None:
    result = write_artifact.invoke(
        call("write_artifact", {"filename": "a.md", "content": "x"}), cfg(str(tmp_path))
    )
    assert result.status == "error"
    assert "workspace_dir" in result.text
    assert not any(tmp_path.iterdir())


def test_missing_artifact_is_an_error_message(tmp_path: Path) -> None:
    result = read_artifact.invoke(call("read_artifact", {"filename": "nope.md"}), cfg(tmp_path))
    assert result.status == "error"
    assert "outputs/nope.md" in result.text


def test_default_root_is_the_settings_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THREADRUN_DATA_DIR", str(tmp_path))
    config = RunnableConfig(configurable={"thread_id": "t-9"})
    write_artifact.invoke({"filename": "r.md", "content": "ok"}, config)
    assert (tmp_path / "workspaces" / OWNERLESS / "t-9" / "outputs" / "r.md").read_text() == "ok"
