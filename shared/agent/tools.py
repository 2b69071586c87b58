"""Tools that write, read and list artifacts in the thread's sandbox workspace (SPEC §9).

A thread's artifacts live in `<workspace root>/<thread_id>/outputs/<filename>`. The
root is `Settings().workspace_dir`, read at call time (never at import), unless the
run's `config["configurable"]["workspace_dir"]` overrides it. The override must be a
`pathlib.Path` (an os.PathLike): a JSON client can only send strings, so a remote
caller can never point the tools at another folder of the worker's disk; a string is
refused rather than ignored (fail closed, G3).

Bad input (path traversal, unknown thread, missing file) raises `ToolException`; the
tools set `handle_tool_error=True`, so the model gets the message back as an error
ToolMessage and the run carries on instead of crashing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool, ToolException

from shared import workspaces
from shared.errors import LeaseLost
from shared.settings import Settings

OUTPUTS = "outputs"
FILES_FENCE_KEY = "__threadrun_files_fence"
"""`configurable` key of a run attempt's files fence (the worker sets it): a callable whose
context manager holds the attempt's thread and run rows around a file write, raising
`LeaseLost` when the thread is gone or the attempt lost its run (L2). Absent (a graph run
outside threadrun), writes are unfenced."""
FilesFence = Callable[[], AbstractContextManager[None]]
MAX_ARTIFACT_BYTES = 10 * 1024 * 1024
MAX_READ_CHARS = 100_000

_THREAD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_FORBIDDEN_CHARS = ("/", "\\", "\x00", ":")


def workspace_root(config: RunnableConfig | None) -> Path:
    """The root of all thread workspaces for this run."""
    override = ((config or {}).get("configurable") or {}).get("workspace_dir")
    if override is None:
        return Settings().workspace_dir
    if not isinstance(override, os.PathLike):
        raise ToolException(
            "configurable.workspace_dir must be a pathlib.Path set in-process, not "
            f"{type(override).__name__}"
        )
    return Path(override)


def thread_workspace(config: RunnableConfig | None) -> Path:
    """The workspace folder of the run's thread (`configurable.thread_id`), under its
    owner's folder (`configurable.user_id`; shared/workspaces.py)."""
    thread_id = ((config or {}).get("configurable") or {}).get("thread_id")
    if not isinstance(thread_id, str) or not thread_id:
        raise ToolException("this run has no thread_id, so it has no workspace")
    if not _THREAD_ID.fullmatch(thread_id) or ".." in thread_id:
        raise ToolException(f"thread_id {thread_id!r} is not usable as a workspace name")
    user_id = ((config or {}).get("configurable") or {}).get("user_id")
    return workspaces.thread_workspace(workspace_root(config), user_id, thread_id)


def check_filename(filename: str) -> str:
    """`filename` if it names a plain file inside `outputs/`, else ToolException."""
    if not isinstance(filename, str) or not filename.strip():
        raise ToolException("filename must be a non-empty string")
    if len(filename) > 255:
        raise ToolException("filename is longer than 255 characters")
    if any(c in filename for c in _FORBIDDEN_CHARS) or os.path.isabs(filename):
        raise ToolException(
            f"filename {filename!r} must be a bare file name: no folders, separators or drive"
        )
    if filename.startswith(".") or filename != filename.strip():
        raise ToolException(f"filename {filename!r} must not start with '.' or with spaces")
    return filename


def _artifact_path(config: RunnableConfig | None, filename: str) -> tuple[Path, str]:
    name = check_filename(filename)
    outputs = thread_workspace(config) / OUTPUTS
    target = outputs / name
    if target.is_symlink():
        raise ToolException(f"artifact {name!r} is a symbolic link; refusing to follow it")
    return target, f"{OUTPUTS}/{name}"


def _write_artifact(filename: str, content: str, config: RunnableConfig) -> str:
    """Save a text file (a report, notes, code) as an artifact of this conversation.

    Args:
        filename: A bare file name such as "report.md" (no folders).
        content: The full text of the file.
    """
    target, relative = _artifact_path(config, filename)
    data = content.encode("utf-8")
    if len(data) > MAX_ARTIFACT_BYTES:
        raise ToolException(f"content is {len(data)} bytes; the limit is {MAX_ARTIFACT_BYTES}")
    fence: FilesFence | None = ((config or {}).get("configurable") or {}).get(FILES_FENCE_KEY)
    try:
        # Under the fence a thread deleted meanwhile either waits for this write (and then
        # removes the file with the thread) or is already gone (nothing is written): a
        # re-created thread of the same id never finds a deleted run's file.
        with fence() if fence is not None else contextlib.nullcontext():
            target.parent.mkdir(parents=True, exist_ok=True)
            # Write then rename: a concurrent reader sees the old file or the new one.
            tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
            try:
                tmp.write_bytes(data)
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
    except LeaseLost as exc:
        raise ToolException(f"the artifact was not written: {exc}") from exc
    return json.dumps({"path": relative, "size": len(data)})


def _read_artifact(filename: str, config: RunnableConfig) -> str:
    """Read back an artifact of this conversation.

    Args:
        filename: The artifact's file name, as list_artifacts shows it.
    """
    target, relative = _artifact_path(config, filename)
    if not target.is_file():
        raise ToolException(f"there is no artifact {relative!r}; list_artifacts shows what exists")
    text = target.read_text(encoding="utf-8", errors="replace")
    if len(text) > MAX_READ_CHARS:
        return text[:MAX_READ_CHARS] + f"\n[truncated: {len(text)} characters in all]"
    return text


def _list_artifacts(config: RunnableConfig) -> str:
    """List the artifacts of this conversation as JSON [{"path", "size"}]."""
    outputs = thread_workspace(config) / OUTPUTS
    if not outputs.is_dir():
        return "[]"
    found = [
        {"path": f"{OUTPUTS}/{p.name}", "size": p.stat().st_size}
        for p in sorted(outputs.iterdir())
        if p.is_file() and not p.is_symlink() and not p.name.startswith(".")
    ]
    return json.dumps(found)


def _make_tool(func: Callable[..., str], name: str) -> StructuredTool:
    return StructuredTool.from_function(
        func=func,
        name=name,
        parse_docstring=True,
        handle_tool_error=True,
    )


write_artifact: StructuredTool = _make_tool(_write_artifact, "write_artifact")
read_artifact: StructuredTool = _make_tool(_read_artifact, "read_artifact")
list_artifacts: StructuredTool = _make_tool(_list_artifacts, "list_artifacts")

ARTIFACT_TOOLS: tuple[BaseTool, ...] = (write_artifact, read_artifact, list_artifacts)
