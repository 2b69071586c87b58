"""The `run.delivery` receipt (SPEC J5 step 2): what a run attempt presented, verified on disk.

The receipt is the terminal fact of an attempt: `{run_id, attempt, produced_output,
presented_paths, coverage: [{path, exists, size, sha256}], written_at}`, stored as a
`delivery` / `run.delivery` event. The store keeps at most one per (run_id, attempt), so
a write retried after a lost commit acknowledgement finds the first one and reports
ALREADY_WRITTEN instead of adding a second. If the attempt produced output and no
receipt can be written after bounded retries, the caller turns a success into `error`
(`settle_delivery`): the run must not claim a delivery nobody can prove.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shared.errors import LeaseLost
from shared.journal.base import Category, EventStore, RunEvent
from shared.vocab import RunStatus

log = logging.getLogger(__name__)

DELIVERY_TYPE = "run.delivery"
DEFAULT_ATTEMPTS = 3
DEFAULT_BACKOFF_S = 0.1
_CHUNK = 1 << 20


class DeliveryOutcome(enum.Enum):
    """What writing the receipt did."""

    WRITTEN = "written"
    ALREADY_WRITTEN = "already_written"  # this (run_id, attempt) has its receipt already
    FAILED = "failed"  # every try failed


def check_receipt(event: RunEvent) -> RunEvent:
    """`event` if it has a receipt's shape (a delivery/run.delivery event with an integer
    payload attempt), else ValueError; both stores check this before they write one."""
    if event.category != Category.DELIVERY or event.type != DELIVERY_TYPE:
        raise ValueError("a receipt is a delivery/run.delivery event")
    if not isinstance(event.payload.get("attempt"), int):
        raise ValueError("a receipt's payload needs an integer attempt")
    return event


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def coverage(presented_paths: Sequence[str], thread_workspace: Path) -> list[dict[str, Any]]:
    """Check each presented path inside the thread's workspace: {path, exists, size, sha256}.

    A path that resolves outside the workspace (`..`, a symlink out, an absolute path
    elsewhere) or is not a regular file counts as missing.
    """
    root = thread_workspace.resolve()
    out: list[dict[str, Any]] = []
    for path in presented_paths:
        entry: dict[str, Any] = {"path": path, "exists": False, "size": None, "sha256": None}
        try:
            target = (root / path).resolve()
            if target.is_relative_to(root) and target.is_file():
                entry.update(exists=True, size=target.stat().st_size, sha256=file_sha256(target))
        except OSError as exc:
            log.warning("coverage check of %s failed: %s", path, exc)
        out.append(entry)
    return out


def build_receipt(
    run_id: str,
    attempt: int,
    produced_output: bool,
    presented_paths: Sequence[str],
    thread_workspace: Path,
    written_at: datetime | None = None,
) -> dict[str, Any]:
    """The receipt payload (J5)."""
    paths = list(dict.fromkeys(presented_paths))
    return {
        "run_id": str(run_id),
        "attempt": int(attempt),
        "produced_output": bool(produced_output),
        "presented_paths": paths,
        "coverage": coverage(paths, thread_workspace),
        "written_at": (written_at or datetime.now(UTC)).isoformat(),
    }


def write_delivery_receipt(
    store: EventStore,
    run_id: str,
    thread_id: str,
    attempt: int,
    produced_output: bool,
    presented_paths: Sequence[str],
    workspace_root: Path,
    *,
    attempts: int = DEFAULT_ATTEMPTS,
    backoff_s: float = DEFAULT_BACKOFF_S,
    sleep: Callable[[float], None] = time.sleep,
    epoch: int | None = None,
) -> DeliveryOutcome:
    """Write the attempt's receipt once, with up to `attempts` tries and doubling back-off.

    `workspace_root` is the root of all thread workspaces (`Settings.workspace_dir`, or a
    run's `configurable.workspace_dir`); presented paths are relative to
    `<workspace_root>/<thread_id>`, as the artifact tools report them. Blocking (file
    hashing, the store): call it through `asyncio.to_thread` from the event loop.
    With `epoch`, the write is fenced (L2): LeaseLost is raised at once, never retried.
    """
    payload = build_receipt(
        run_id, attempt, produced_output, presented_paths, Path(workspace_root) / str(thread_id)
    )
    event = RunEvent(str(run_id), str(thread_id), Category.DELIVERY, DELIVERY_TYPE, payload)
    ids = {"run_id": str(run_id), "thread_id": str(thread_id)}
    for i in range(max(1, attempts)):
        if i:
            sleep(backoff_s * 2 ** (i - 1))
        try:
            written = store.append_receipt(event, epoch=epoch)
        except LeaseLost:
            raise
        except Exception as exc:  # noqa: BLE001 - retried, then reported as FAILED
            log.warning("delivery receipt try %d failed: %s", i + 1, exc, extra=ids)
            continue
        return DeliveryOutcome.WRITTEN if written is not None else DeliveryOutcome.ALREADY_WRITTEN
    log.error("delivery receipt could not be written after %d tries", attempts, extra=ids)
    return DeliveryOutcome.FAILED


def settle_delivery(
    status: str,
    error: dict[str, Any] | None,
    produced_output: bool,
    outcome: DeliveryOutcome,
) -> tuple[str, dict[str, Any] | None]:
    """The terminal status after the receipt: a success that produced output needs one (J5)."""
    if status == RunStatus.SUCCESS and produced_output and outcome is DeliveryOutcome.FAILED:
        return RunStatus.ERROR, {
            "error": "DeliveryReceiptFailed",
            "message": "the run produced output but its delivery receipt could not be written",
        }
    return status, error
