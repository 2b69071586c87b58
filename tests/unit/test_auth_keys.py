"""A4 stored API keys (real PostgreSQL): store, cached resolver, `threadrun keys`, the app.

These use the session's private database and Redis prefix (tests/conftest.py).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from shared.auth.keys import ApiKeyStore, CachedKeyResolver, hash_key
from shared.settings import Settings
from shared.tools.cli_keys import key_store
from threadrun.cli import main as cli_main

ENV_KEY = "env-secret-key-for-alice"


def _settings(base: Settings, **kw: Any) -> Settings:
    fields: dict[str, Any] = {
        "database_url": base.database_url,
        "redis_url": base.redis_url,
        "redis_prefix": base.redis_prefix,
        "data_dir": base.data_dir,
    }
    fields.update(kw)
    return Settings(**fields)


@pytest.fixture
def store(settings: Settings) -> Iterator[ApiKeyStore]:
    s = key_store(settings)
    yield s
    with psycopg.connect(settings.dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM api_keys")


def test_a4_store_keeps_only_the_hash(store: ApiKeyStore, settings: Settings) -> None:
    """A4: the table holds sha256(key) and the prefix, never the key."""
    key, secret = store.create("alice", "ops", "laptop")
    assert (key.user_id, key.role, key.name, key.revoked_at) == ("alice", "ops", "laptop", None)
    with psycopg.connect(settings.dsn) as conn:
        rows = conn.execute("SELECT * FROM api_keys").fetchall()
    assert len(rows) == 1
    assert secret.encode() not in repr(rows).encode()
    assert bytes(rows[0][2]) == hash_key(secret)
    assert store.lookup(secret) == key
    assert store.lookup(secret + "x") is None
    assert store.any_active()


def test_a4_revoke_by_prefix_or_id_within_the_cache_ttl(store: ApiKeyStore) -> None:
    """A4: a revoked key stops resolving once the cache TTL has passed."""
    key, secret = store.create("bob")
    resolver = CachedKeyResolver(store, ttl_s=0.3)
    assert resolver.lookup(secret) == key
    assert store.revoke(key.prefix) is not None
    assert resolver.lookup(secret) == key  # cached
    time.sleep(0.35)
    assert resolver.lookup(secret) is None
    other, _ = store.create("bob")
    revoked = store.revoke(other.key_id)
    assert revoked is not None and revoked.revoked_at is not None
    assert store.revoke("trk_nothere") is None
    assert not store.any_active()


def test_a4_cli_create_list_revoke(
    settings: Settings,
    store: ApiKeyStore,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A4: `threadrun keys create` prints the key once; list never shows it; revoke works."""
    monkeypatch.setenv("THREADRUN_DATABASE_URL", settings.dsn)
    assert cli_main(["keys", "create", "--user", "carol", "--role", "ops", "--name", "ci"]) == 0
    secret = capsys.readouterr().out.strip()
    found = store.lookup(secret)
    assert found is not None and (found.user_id, found.role, found.name) == ("carol", "ops", "ci")
    assert cli_main(["keys", "list", "--user", "carol"]) == 0
    listing = capsys.readouterr().out
    assert found.prefix in listing and secret not in listing
    assert cli_main(["keys", "revoke", found.prefix]) == 0
    assert store.lookup(secret) is None
    assert cli_main(["keys", "revoke", "trk_missing0"]) == 1


def test_a4_the_first_key_says_that_local_mode_ends(
    settings: Settings,
    store: ApiKeyStore,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A4: creating the first credential ends local single-user mode: `keys create` says so
    and how to reach the local user's threads; a second key says nothing more."""
    monkeypatch.setenv("THREADRUN_DATABASE_URL", settings.dsn)
    monkeypatch.delenv("THREADRUN_API_KEYS", raising=False)
    assert cli_main(["keys", "create", "--user", "dana"]) == 0
    err = capsys.readouterr().err
    assert "local single-user mode is over" in err
    assert "threadrun keys create --user local" in err
    assert cli_main(["keys", "create", "--user", "local"]) == 0
    assert "local single-user mode" not in capsys.readouterr().err


@pytest.fixture
def app(settings: Settings) -> Flask:
    return create_app(_settings(settings, api_keys=f"{ENV_KEY}:alice", api_key_cache_ttl_s=0.2))


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def test_a4_env_and_stored_keys_authenticate(client: FlaskClient, store: ApiKeyStore) -> None:
    """A4: env keys keep working; stored keys work until revoked (+ TTL); others get 401."""
    assert client.post("/threads/count", headers={"x-api-key": ENV_KEY}).status_code == 200
    # A user of its own: other tests of the session's database leave threads of theirs.
    key, secret = store.create(f"dave-{uuid.uuid4().hex[:8]}")
    r = client.post("/threads", headers={"Authorization": f"Bearer {secret}"}, json={})
    assert r.status_code == 200
    assert client.post("/threads/count", headers={"x-api-key": secret}).get_json() == 1
    store.revoke(key.key_id)
    time.sleep(0.25)
    r = client.post("/threads/count", headers={"x-api-key": secret})
    assert r.status_code == 401 and r.get_json()["error"] == "unauthorized"
    assert client.post("/threads/count").status_code == 401


def test_g4_no_secret_in_logs_on_auth_failure(
    settings: Settings, store: ApiKeyStore, caplog: pytest.LogCaptureFixture
) -> None:
    """G4: failed key, stored key and JWT attempts log no key, token or password."""
    secret_jwt = "jwt-signing-secret-0123456789abcdef"
    app = create_app(_settings(settings, api_keys=f"{ENV_KEY}:alice", jwt_secret=secret_jwt))
    client = app.test_client()
    _, stored = store.create("erin")
    store.revoke(stored.split("_")[0] + "_" + stored.split("_")[1])
    import jwt as pyjwt

    bad_jwt = pyjwt.encode({"sub": "x", "exp": 1}, secret_jwt, algorithm="HS256")
    presented = ["wrong-key-zzz", stored, bad_jwt, ENV_KEY + "x"]
    caplog.set_level(logging.DEBUG)
    for cred in presented:
        assert client.get("/threads/x", headers={"x-api-key": cred}).status_code == 401
        r = client.get("/threads/x", headers={"Authorization": f"Bearer {cred}"})
        assert r.status_code == 401
        assert cred not in r.get_data(as_text=True)
    logged = "\n".join(f"{rec.getMessage()} {rec.__dict__}" for rec in caplog.records)
    assert "authentication failed" in logged
    password = settings.dsn
    for secret in [*presented, ENV_KEY, secret_jwt, password]:
        assert secret not in logged


def test_a4_open_mode_refused_on_public_bind(settings: Settings) -> None:
    """A4: no keys + a non-loopback THREADRUN_HOST: the app refuses to start."""
    with pytest.raises(RuntimeError, match="THREADRUN_HOST=0.0.0.0"):
        create_app(_settings(settings, host="0.0.0.0"))
    # With a key configured the same bind is fine, and loopback without keys is fine.
    assert create_app(_settings(settings, host="0.0.0.0", api_keys="k:u")) is not None
    assert create_app(_settings(settings, host="127.0.0.1")) is not None


def test_a4_public_server_never_falls_into_open_mode(
    settings: Settings, store: ApiKeyStore
) -> None:
    """A4: a server on a public address that started with a stored key answers 401 after its
    last key is revoked, instead of turning into the open single-user mode."""
    for left in store.list():  # this test is about the very last key
        store.revoke(left.key_id)
    key, secret = store.create("olga")
    app = create_app(_settings(settings, host="0.0.0.0", api_key_cache_ttl_s=0.1))
    client = app.test_client()
    assert client.post("/threads/count", headers={"x-api-key": secret}).status_code == 200
    assert store.revoke(key.key_id) is not None
    time.sleep(0.15)
    assert client.post("/threads/count").status_code == 401
    assert client.post("/threads/count", headers={"x-api-key": secret}).status_code == 401


def test_a4_stored_key_turns_open_mode_off(settings: Settings, store: ApiKeyStore) -> None:
    """A4: with no env keys, the first stored key ends local single-user mode (within TTL)."""
    app = create_app(_settings(settings, api_key_cache_ttl_s=0.1))
    client = app.test_client()
    assert client.post("/threads/count").status_code == 200  # local mode
    _, secret = store.create("frank")
    time.sleep(0.15)
    assert client.post("/threads/count").status_code == 401
    assert client.post("/threads/count", headers={"x-api-key": secret}).status_code == 200


def test_a4_bearer_jwt_over_http(settings: Settings) -> None:
    """A4: a valid bearer JWT authenticates as its `sub`; the role claim grants ops (403 without)."""
    import jwt as pyjwt

    secret = "jwt-http-secret-0123456789abcdef0123"
    app = create_app(
        _settings(settings, jwt_secret=secret, jwt_issuer="iss-t", jwt_audience="aud-t")
    )
    client = app.test_client()

    def bearer(**claims: Any) -> dict[str, str]:
        body = {"iss": "iss-t", "aud": "aud-t", "exp": int(time.time()) + 60, **claims}
        return {"Authorization": f"Bearer {pyjwt.encode(body, secret, algorithm='HS256')}"}

    r = client.post("/threads", json={}, headers=bearer(sub="gina"))
    assert r.status_code == 200
    tid = r.get_json()["thread_id"]
    assert client.get(f"/threads/{tid}", headers=bearer(sub="gina")).status_code == 200
    assert client.get(f"/threads/{tid}", headers=bearer(sub="hank")).status_code == 404
    assert client.post("/threads/count", headers=bearer(sub="gina", aud="x")).status_code == 401
    assert client.post("/threads/count").status_code == 401  # JWT configured: no open mode
    ops_path = next(
        r.rule
        for r in app.url_map.iter_rules()
        if r.rule.startswith("/ops/api/") and not r.arguments and "GET" in (r.methods or ())
    )
    assert client.get(ops_path, headers=bearer(sub="gina")).status_code == 403
    assert client.get(ops_path, headers=bearer(sub="ivy", role="ops")).status_code == 200


def test_a4_migration_0003_schema(settings: Settings) -> None:
    """A4: migration 0003 declares the key table: hash and prefix unique, role checked."""
    with psycopg.connect(settings.dsn) as conn:
        cols = dict(
            conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns"
                " WHERE table_name = 'api_keys'"
            ).fetchall()
        )
        uniques = {
            r[0]
            for r in conn.execute(
                "SELECT indexdef FROM pg_indexes WHERE tablename = 'api_keys'"
            ).fetchall()
        }
    assert cols == {
        "key_id": "uuid",
        "prefix": "text",
        "key_hash": "bytea",
        "user_id": "text",
        "role": "text",
        "name": "text",
        "created_at": "timestamp with time zone",
        "revoked_at": "timestamp with time zone",
    }
    assert any("UNIQUE" in d and "(key_hash)" in d for d in uniques)
    assert any("UNIQUE" in d and "(prefix)" in d for d in uniques)
    with pytest.raises(psycopg.errors.CheckViolation), psycopg.connect(settings.dsn) as conn:
        conn.execute(
            "INSERT INTO api_keys (key_id, prefix, key_hash, user_id, role)"
            " VALUES (gen_random_uuid(), 'p', 'h', 'u', 'root')"
        )
