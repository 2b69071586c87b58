"""Only a worker that consumes the `runs` queue builds the run runtime and the reaper."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import workers.tasks
from workers.celery_app import _on_ready


def _consumer(*queues: str) -> SimpleNamespace:
    """The shape of the Consumer that Celery's worker_ready signal sends."""
    qs = [SimpleNamespace(name=q) for q in queues]
    return SimpleNamespace(task_consumer=SimpleNamespace(queues=qs))


@pytest.mark.parametrize(
    ("queues", "starts"),
    [(("memory",), False), (("runs",), True), (("runs", "memory"), True)],
)
def test_r4_only_runs_workers_start_the_reaper(
    monkeypatch: pytest.MonkeyPatch, queues: tuple[str, ...], starts: bool
) -> None:
    """R4/L4: the reaper and run runtime start on runs workers, never on a memory worker."""
    calls: list[int] = []
    monkeypatch.setattr(workers.tasks, "start_runs_services", lambda: calls.append(1))
    _on_ready(sender=_consumer(*queues))
    assert bool(calls) is starts
