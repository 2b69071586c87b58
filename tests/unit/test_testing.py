"""shared.tools.testing, the tooling of tests and benchmarks: sandbox names, SSE reading, polling."""

from __future__ import annotations

import itertools

import pytest

from shared.settings import Settings
from shared.tools.testing import (
    UNLIMITED_USERS,
    Sandbox,
    WaitTimeout,
    cluster_env,
    iter_sse,
    server_dsn,
    wait_for,
)
from threadrun.client import WireGap

GAP_BODY = (
    '{"code":"stream_replay_gap","run_id":"r","requested_event_id":"1-0",'
    '"earliest_available_event_id":null,"latest_available_event_id":null,'
    '"recovery":"reload_durable_state"}'
)
WIRE = (
    'id: 1-0\nevent: metadata\ndata: {"attempt":1}\n\n'
    ": heartbeat\n\n"
    'id: 1-1\nevent: messages\ndata: ["a",\ndata: 1]\n\n'
    f"event: gap\ndata: {GAP_BODY}\n\n"
)


def test_server_dsn_swaps_only_the_database() -> None:
    """The server, user and options of the URL stay; only the database changes."""
    dsn = server_dsn(
        "postgresql://postgres@127.0.0.1:5432/threadrun?sslmode=disable", "threadrun_bench_x"
    )
    parts = dict(p.split("=", 1) for p in dsn.split())
    assert parts["dbname"] == "threadrun_bench_x"
    assert parts["host"] == "127.0.0.1" and parts["port"] == "5432" and parts["user"] == "postgres"
    assert parts["sslmode"] == "disable"


def test_sandbox_names_say_who_made_them() -> None:
    """threadrun_<kind>_<tag> and tr<kind>:<tag>: (leftovers can be traced and removed)."""
    box = Sandbox(Settings(), "chaos", tag="abc")
    assert (box.db_name, box.prefix) == ("threadrun_chaos_abc", "trchaos:abc:")


def test_iter_sse_reads_events_gaps_and_heartbeats_with_their_text() -> None:
    """B5/B6 on the wire: events keep their id and decoded data, a gap its whole body as sent
    (including `recovery`), heartbeats come only when asked for."""
    got = list(iter_sse(WIRE.split("\n"), heartbeats=True))
    assert [(e.id, e.event, e.heartbeat) for e in got] == [
        ("1-0", "metadata", False),
        ("", "", True),
        ("1-1", "messages", False),
        ("", "gap", False),
    ]
    assert got[0].data == {"attempt": 1} and got[0].text == '{"attempt":1}'
    assert got[2].data == ["a", 1] and got[2].text == '["a",\n1]'
    assert isinstance(got[3].item, WireGap) and got[3].text == GAP_BODY
    assert got[3].data["recovery"] == "reload_durable_state"
    assert [e.event for e in iter_sse(WIRE.split("\n"))] == ["metadata", "messages", "gap"]


def test_wait_for_returns_the_first_truthy_value() -> None:
    """Polls until the predicate holds; errors named in retry_on count as "not yet"."""
    calls = itertools.count()

    def flaky() -> int | None:
        n = next(calls)
        if n == 0:
            raise ConnectionError("coming back")
        return n if n >= 2 else None

    assert wait_for(flaky, 5, 0.001, retry_on=(ConnectionError,)) == 2


def test_wait_for_timeout_names_what_and_why() -> None:
    """On timeout: what was awaited, the last retried error and the detail (e.g. logs)."""

    def down() -> bool:
        raise ConnectionError("refused")

    with pytest.raises(WaitTimeout) as info:
        wait_for(down, 0.05, 0.01, what="the server", retry_on=(OSError,), detail=lambda: "logs")
    message = str(info.value)
    assert "waiting for the server" in message and "refused" in message and "logs" in message
    with pytest.raises(ValueError):
        wait_for(lambda: int("x"), 1, retry_on=(ConnectionError,))


def test_cluster_env_points_children_at_the_settings() -> None:
    """A child gets the settings' database and prefix, lifted user limits, `extra` last."""
    s = Settings(redis_prefix="trx:1:")
    env = cluster_env(s, {"THREADRUN_MAX_ACTIVE_RUNS": "2"}, without=["PATH"])
    assert env["THREADRUN_REDIS_PREFIX"] == "trx:1:" and env["THREADRUN_DATABASE_URL"] == s.dsn
    assert env["THREADRUN_MAX_ACTIVE_RUNS"] == "2"
    assert env["THREADRUN_RUNS_PER_MINUTE"] == UNLIMITED_USERS["THREADRUN_RUNS_PER_MINUTE"]
    assert "PATH" not in env and "THREADRUN_CONFIG" not in env
