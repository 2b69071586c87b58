"""`store.ttl` of langgraph.json on LangGraph's PostgresStore (real PostgreSQL): items
expire after `default_ttl`, a read refreshes them under `refresh_on_read`, a per-item `ttl`
on put wins, expired items are never read back, and the sweep deletes their rows. Time is
moved by setting rows' `expires_at` (PostgresStore keeps TTLs in whole minutes)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.db import DictPool, make_pool
from shared.settings import Settings
from shared.store import StoreConfig, web_stores
from shared.store.config import whole_minutes
from shared.store.scoped import UserScopedStore


@pytest.fixture(scope="module")
def pool(settings: Settings) -> Iterator[DictPool]:
    p = make_pool(settings, name="test-store-ttl", max_size=2)
    yield p
    p.close()


def config(tmp_path: Path, refresh_on_read: bool, default_ttl: float = 10) -> StoreConfig:
    path = tmp_path / f"langgraph-{refresh_on_read}-{default_ttl}.json"
    ttl = {"refresh_on_read": refresh_on_read, "default_ttl": default_ttl}
    path.write_text(json.dumps({"graphs": {"g": "./g.py:graph"}, "store": {"ttl": ttl}}))
    return StoreConfig.from_file(path)


def left_s(pool: DictPool, user: str, key: str) -> float | None:
    """Seconds until the item expires (None: it never does)."""
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM expires_at - now()) AS s FROM store"
            " WHERE prefix LIKE %s AND key = %s",
            (f"%{user}%", key),
        ).fetchone()
    assert row is not None, key
    return None if row["s"] is None else float(row["s"])


def expire_in(pool: DictPool, user: str, key: str, seconds: float) -> None:
    with pool.connection() as conn:
        conn.execute(
            "UPDATE store SET expires_at = now() + make_interval(secs => %s)"
            " WHERE prefix LIKE %s AND key = %s",
            (seconds, f"%{user}%", key),
        )


def scoped(pool: DictPool, cfg: StoreConfig) -> tuple[str, UserScopedStore]:
    user = f"u-{uuid.uuid4().hex[:8]}"
    return user, web_stores(pool, cfg).for_user(user)


def test_default_ttl_and_refresh_on_read(pool: DictPool, tmp_path: Path) -> None:
    """An item gets the default TTL; a read moves its expiry back to the full TTL under
    refresh_on_read (and not without it, nor with refresh_ttl=False); an expired item is
    never read back, even before a sweep."""
    user, store = scoped(pool, config(tmp_path, True))
    store.put(("ttl",), "read", {"v": 1})
    assert 590 < (left_s(pool, user, "read") or 0) <= 600
    expire_in(pool, user, "read", 30)
    assert store.get(("ttl",), "read", refresh_ttl=False) is not None
    assert (left_s(pool, user, "read") or 0) <= 30
    assert store.get(("ttl",), "read") is not None
    assert (left_s(pool, user, "read") or 0) > 590  # refreshed
    expire_in(pool, user, "read", -1)
    assert store.get(("ttl",), "read") is None

    user2, plain = scoped(pool, config(tmp_path, False))
    plain.put(("ttl",), "kept", {"v": 2})
    expire_in(pool, user2, "kept", 30)
    assert plain.get(("ttl",), "kept") is not None
    assert (left_s(pool, user2, "kept") or 0) <= 30  # not refreshed


def test_a_per_item_ttl_wins_and_the_sweep_deletes_rows(pool: DictPool, tmp_path: Path) -> None:
    """`put(..., ttl=)` overrides the default (None: never expires); the sweep removes the
    expired rows themselves, not only hides them."""
    cfg = config(tmp_path, True)
    user, store = scoped(pool, cfg)
    store.put(("ttl",), "forever", {"v": 1}, ttl=None)
    store.put(("ttl",), "short", {"v": 2}, ttl=2)
    assert left_s(pool, user, "forever") is None
    assert 110 < (left_s(pool, user, "short") or 0) <= 120
    expire_in(pool, user, "short", -1)
    assert store.get(("ttl",), "short") is None
    assert web_stores(pool, cfg).open_store().sweep_ttl() >= 1
    with pool.connection() as conn:
        keys = {
            r["key"]
            for r in conn.execute(
                "SELECT key FROM store WHERE prefix LIKE %s", (f"%{user}%",)
            ).fetchall()
        }
    assert keys == {"forever"}


def test_fractional_minutes_are_rounded_up() -> None:
    """PostgresStore keeps whole minutes: 0.5 would be 0, and the first refresh would expire
    the item at once; so a fraction is rounded up (never below a minute)."""
    assert [whole_minutes(m) for m in (0.01, 0.5, 1, 1.2, 60)] == [1, 1, 1, 2, 60]
