"""Where a thread's files live: `<workspace_dir>/<owner folder>/<thread_id>/`.

A workspace belongs to the (owner, thread) pair, never to a bare thread id: a thread id
that another user creates after its first owner deleted it (or that two users both try)
names a different folder, so nobody is ever served files they did not write. The owner
folder is a digest of the user id (user ids may hold any character; a digest is a safe,
fixed-length path segment). Deleting a thread removes its workspace.

Workspaces written by releases before this layout (`<workspace_dir>/<thread_id>/`) are
not adopted: a bare id cannot tell whose they are.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

OWNERLESS = "_local"
"""The owner folder of a graph run outside threadrun (no `user_id` in its config)."""


def owner_folder(user_id: str | None) -> str:
    """The path segment of `user_id`'s workspaces."""
    if not user_id:
        return OWNERLESS
    return "u-" + hashlib.sha256(user_id.encode()).hexdigest()[:32]


def owner_root(workspace_dir: Path, user_id: str | None) -> Path:
    """The folder that holds `user_id`'s thread workspaces."""
    return Path(workspace_dir) / owner_folder(user_id)


def thread_workspace(workspace_dir: Path, user_id: str | None, thread_id: str) -> Path:
    """The workspace of `user_id`'s thread `thread_id` (the caller checked the id)."""
    return owner_root(workspace_dir, user_id) / thread_id


def remove_workspace(workspace_dir: Path, user_id: str | None, thread_id: str) -> int:
    """Remove the thread's workspace; the number of files it held (0 when there was none).
    Symbolic links inside are unlinked, never followed."""
    folder = thread_workspace(workspace_dir, user_id, thread_id)
    if folder.is_symlink():
        folder.unlink()
        return 0
    if not folder.exists():
        return 0
    files = sum(len(names) for _, _, names in os.walk(folder))
    shutil.rmtree(folder)  # NotADirectoryError for a file in its place: the caller decides
    return files
