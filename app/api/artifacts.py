"""A thread's artifacts over HTTP (SPEC §9, A4, G3): list them and download one, for the
thread's owner only. Another user's thread answers 404 exactly like a missing one.

Artifacts are what the agent's tools wrote to `<workspace_dir>/<owner>/<thread_id>/outputs/<name>`
(shared/agent/tools.py); web and workers must share that folder (one machine, or a shared
volume in a deployment: docs/operations.md). A name must be a bare file name, checked by
the same rule the tools write with, so `..`, separators and hidden files are refused with
a 400, and a symbolic link or anything that resolves outside `outputs/` is never served.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from flask import Blueprint, Response, send_file
from langchain_core.tools import ToolException

from app.api.threads import owned_thread
from app.http import returns
from app.responses import json_response
from app.services import current_services
from shared import workspaces
from shared.agent.tools import OUTPUTS, check_filename
from shared.errors import ArtifactNotFound, ValidationFailed
from shared.runs.model import Thread

bp = Blueprint("artifacts", __name__)


def _outputs(thread: Thread) -> Path:
    root = current_services().settings.workspace_dir
    return workspaces.thread_workspace(root, thread.owner, thread.thread_id) / OUTPUTS


def _listed(path: Path) -> bool:
    return path.is_file() and not path.is_symlink() and not path.name.startswith(".")


@bp.get("/threads/<thread_id>/artifacts")
def list_artifacts(thread_id: str) -> Response:
    """The thread's artifacts: [{path, size, modified_at}], by name."""
    outputs = _outputs(owned_thread(thread_id))
    items = []
    if outputs.is_dir():
        for p in sorted(outputs.iterdir()):
            if _listed(p):
                st = p.stat()
                items.append(
                    {
                        "path": f"{OUTPUTS}/{p.name}",
                        "size": st.st_size,
                        "modified_at": datetime.fromtimestamp(st.st_mtime, UTC).isoformat(),
                    }
                )
    return json_response(items)


@bp.get("/threads/<thread_id>/artifacts/outputs/<name>")
@returns("*/*")  # the artifact's own bytes, whatever their type
def download(thread_id: str, name: str) -> Response:
    """One artifact's bytes (as an attachment, never rendered inline)."""
    outputs = _outputs(owned_thread(thread_id))
    try:
        check_filename(name)
    except ToolException as exc:
        raise ValidationFailed(str(exc), field="name", status=400) from exc
    target = outputs / name
    root = outputs.resolve()
    if not _listed(target) or target.resolve().parent != root:
        raise ArtifactNotFound(f"artifact {OUTPUTS}/{name} not found")
    return send_file(target, as_attachment=True, download_name=name, max_age=0)
