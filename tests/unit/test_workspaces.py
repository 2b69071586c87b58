"""a workspace belongs to the (owner, thread) pair, never to a bare id."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from shared.workspaces import (
    OWNERLESS,
    owner_folder,
    owner_root,
    remove_workspace,
    thread_workspace,
)

TID = "6f1d0c2e-8a4b-4c1d-9e2f-0a1b2c3d4e5f"


@given(st.text(min_size=1), st.text(min_size=1))
def test_two_users_never_share_a_folder_and_it_is_one_safe_segment(a: str, b: str) -> None:
    """Any user id (slashes, dots, NULs, …) becomes one fixed-length path segment; two users
    get two folders."""
    fa = owner_folder(a)
    assert "/" not in fa and "\x00" not in fa and fa not in (".", "..") and len(fa) == 34
    assert (fa == owner_folder(b)) == (a == b)
    assert owner_root(Path("/r"), a).parent == Path("/r")


def test_a_run_outside_threadrun_has_a_folder_of_its_own() -> None:
    assert owner_folder(None) == owner_folder("") == OWNERLESS


def test_remove_counts_files_unlinks_links_and_skips_missing(tmp_path: Path) -> None:
    folder = thread_workspace(tmp_path, "alice", TID)
    (folder / "outputs").mkdir(parents=True)
    (folder / "outputs" / "a.md").write_text("a")
    (folder / "b.txt").write_text("b")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("k")
    (folder / "outputs" / "link").symlink_to(outside)
    assert remove_workspace(tmp_path, "alice", TID) == 2  # the link is neither followed nor counted
    assert not folder.exists() and (outside / "keep").exists()
    assert remove_workspace(tmp_path, "alice", TID) == 0
    bob = thread_workspace(tmp_path, "bob", TID)
    bob.parent.mkdir(parents=True)
    bob.symlink_to(outside)
    assert remove_workspace(tmp_path, "bob", TID) == 0
    assert not bob.is_symlink() and (outside / "keep").exists()
