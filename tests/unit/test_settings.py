"""Settings: SPEC defaults and the API key format."""

from __future__ import annotations

import pytest

from shared.settings import Settings


def test_spec_defaults() -> None:
    """The defaults the SPEC gives (L1, B3, B6, R7, L5), but for the stream's expiry after
    the end (B3): 5 minutes, sized for reconnects rather than an hour; later readers get
    a gap and reload durable state (B5), and Redis holds a fifth of the bytes at a
    given runs/s (docs/operations.md)."""
    s = Settings(_env_file=None)  # type: ignore[call-arg]
    assert s.lease_ttl_s == 15 and s.lease_renew_s == 5
    assert s.stream_maxlen == 1024 and s.stream_ttl_after_end_s == 300
    assert s.stream_heartbeat_s == 5
    assert s.shutdown_grace_s == 5 and s.max_attempts == 3
    assert s.default_multitask_strategy == "enqueue"
    assert (s.host, s.port) == ("127.0.0.1", 8000)


def test_a4_api_keys_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """A4: THREADRUN_API_KEYS is key:user_id[:role] entries; the role defaults to user."""
    monkeypatch.setenv("THREADRUN_API_KEYS", "k1:alice, k2:bob, k3:carol:ops")
    assert Settings().api_key_map == {
        "k1": ("alice", "user"),
        "k2": ("bob", "user"),
        "k3": ("carol", "ops"),
    }


def test_a4_bad_api_keys_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    """A malformed key list is an error, not an open server."""
    for bad in ("justakey", "k:alice:root", "k:alice:ops:x", ":alice"):
        monkeypatch.setenv("THREADRUN_API_KEYS", bad)
        with pytest.raises(ValueError):
            _ = Settings().api_key_map


def test_secrets_are_redacted() -> None:
    """The database URL and keys never show in repr."""
    s = Settings(database_url="postgresql://u:hunter2@h/db", api_keys="sekrit:alice")  # type: ignore[arg-type]
    assert "hunter2" not in repr(s) and "sekrit" not in repr(s)


def test_prefix_gets_a_colon() -> None:
    """Key prefixes end with a colon."""
    assert Settings(redis_prefix="abc").redis_prefix == "abc:"
