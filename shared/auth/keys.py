"""API keys hashed at rest (A4): generation, the Postgres key store, a cached resolver.

A key is `trk_<8 hex>_<43 url-safe chars>`: the first part is its public prefix (shown in
listings, usable to revoke), the rest 256 random bits. Only sha256(key) is stored; with
that much entropy a slow password hash buys nothing, and a hash lookup is one indexed read.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from cachetools import TTLCache

from shared.settings import Settings

KEY_SCHEME = "trk_"
ROLES = ("user", "ops")

INSERT_KEY_SQL = """
INSERT INTO api_keys (key_id, prefix, key_hash, user_id, role, name)
VALUES (%(key_id)s, %(prefix)s, %(key_hash)s, %(user_id)s, %(role)s, %(name)s)
RETURNING key_id, prefix, user_id, role, name, created_at, revoked_at
"""
LIST_KEYS_SQL = """
SELECT key_id, prefix, user_id, role, name, created_at, revoked_at FROM api_keys
WHERE (%(user_id)s::text IS NULL OR user_id = %(user_id)s)
ORDER BY created_at, prefix
"""
REVOKE_KEY_SQL = """
UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())
WHERE key_id = %(key_id)s OR prefix = %(prefix)s
RETURNING key_id, prefix, user_id, role, name, created_at, revoked_at
"""
LOOKUP_KEY_SQL = """
SELECT key_id, prefix, user_id, role, name, created_at, revoked_at FROM api_keys
WHERE key_hash = %(key_hash)s AND revoked_at IS NULL
"""
ANY_ACTIVE_SQL = "SELECT EXISTS (SELECT 1 FROM api_keys WHERE revoked_at IS NULL) AS any"
USER_ACTIVE_SQL = (
    "SELECT EXISTS (SELECT 1 FROM api_keys WHERE user_id = %(user_id)s AND revoked_at IS NULL)"
    " AS any"
)


class _Pool(Protocol):
    def connection(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A stored key (never the secret itself)."""

    key_id: str
    prefix: str
    user_id: str
    role: str
    name: str
    created_at: datetime
    revoked_at: datetime | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ApiKey:
        return cls(
            key_id=str(row["key_id"]),
            prefix=row["prefix"],
            user_id=row["user_id"],
            role=row["role"],
            name=row["name"],
            created_at=row["created_at"],
            revoked_at=row["revoked_at"],
        )


def new_key() -> tuple[str, str]:
    """A fresh (key, prefix)."""
    prefix = KEY_SCHEME + secrets.token_hex(4)
    return f"{prefix}_{secrets.token_urlsafe(32)}", prefix


def hash_key(key: str) -> bytes:
    """What is stored for `key`."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def is_managed_key(key: str) -> bool:
    """Whether `key` has the shape of a key this store issues."""
    return key.startswith(KEY_SCHEME) and len(key) < 128


class ApiKeyStore:
    """API keys in Postgres (table `api_keys`, migration 0003)."""

    def __init__(self, pool: _Pool) -> None:
        self._pool = pool

    def create(self, user_id: str, role: str = "user", name: str = "") -> tuple[ApiKey, str]:
        """Store a new key; return it with the secret (shown once, never stored)."""
        if not user_id or role not in ROLES:
            raise ValueError(f"user_id must be non-empty and role one of {ROLES}")
        key, prefix = new_key()
        params = {
            "key_id": uuid.uuid4(),
            "prefix": prefix,
            "key_hash": hash_key(key),
            "user_id": user_id,
            "role": role,
            "name": name,
        }
        with self._pool.connection() as conn:
            row = conn.execute(INSERT_KEY_SQL, params).fetchone()
        return ApiKey.from_row(row), key

    def list(self, user_id: str | None = None) -> list[ApiKey]:
        """Every key (revoked ones too), oldest first."""
        with self._pool.connection() as conn:
            rows = conn.execute(LIST_KEYS_SQL, {"user_id": user_id}).fetchall()
        return [ApiKey.from_row(r) for r in rows]

    def revoke(self, ref: str) -> ApiKey | None:
        """Revoke the key with this id or prefix; None if there is none."""
        try:
            key_id: uuid.UUID | None = uuid.UUID(ref)
        except ValueError:
            key_id = None
        with self._pool.connection() as conn:
            row = conn.execute(REVOKE_KEY_SQL, {"key_id": key_id, "prefix": ref}).fetchone()
        return ApiKey.from_row(row) if row else None

    def lookup(self, key: str) -> ApiKey | None:
        """The active key `key`, or None."""
        with self._pool.connection() as conn:
            row = conn.execute(LOOKUP_KEY_SQL, {"key_hash": hash_key(key)}).fetchone()
        return ApiKey.from_row(row) if row else None

    def any_active(self) -> bool:
        """Whether any key is active (then the local open mode is off)."""
        with self._pool.connection() as conn:
            row = conn.execute(ANY_ACTIVE_SQL).fetchone()
        return bool(row["any"])

    def user_active(self, user_id: str) -> bool:
        """Whether `user_id` has an active stored key."""
        with self._pool.connection() as conn:
            row = conn.execute(USER_ACTIVE_SQL, {"user_id": user_id}).fetchone()
        return bool(row["any"])


class CachedKeyResolver:
    """Key lookups cached for `ttl_s` (hits and misses): one DB read per key per TTL.

    A revoked key therefore keeps working for at most `ttl_s` in each web process.
    """

    def __init__(self, store: ApiKeyStore, ttl_s: float, maxsize: int = 10_000) -> None:
        self.store = store
        self._ttl = ttl_s
        self._lock = threading.Lock()
        self._keys: TTLCache[bytes, ApiKey | None] = TTLCache(maxsize, ttl_s or 1e-9)
        self._any: TTLCache[str, bool] = TTLCache(1, ttl_s or 1e-9)

    def lookup(self, key: str) -> ApiKey | None:
        """The active key, or None."""
        digest = hash_key(key)
        with self._lock:
            if digest in self._keys:
                return self._keys[digest]
        found = self.store.lookup(key)
        with self._lock:
            self._keys[digest] = found
        return found

    def any_active(self) -> bool:
        """Whether any key is active (cached)."""
        with self._lock:
            if "any" in self._any:
                return self._any["any"]
        found = self.store.any_active()
        with self._lock:
            self._any["any"] = found
        return found


def no_credentials(settings: Settings, keys: ApiKeyStore | CachedKeyResolver) -> bool:
    """No credential source at all: no env key, no JWT secret or public key, no active
    stored key. With a loopback bind that is local single-user mode (app/auth.py); the cron
    scheduler asks the same question to know whether a firing's owner is its one user."""
    return (
        not settings.api_key_map
        and settings.jwt_secret is None
        and settings.jwt_public_key_file is None
        and not keys.any_active()
    )


class OwnerCredentials:
    """Whether a user can still call the API: what a cron's firing asks of its owner, so
    that revoking a user's keys also stops the runs its crons would start (A4).

    Decidable only for threadrun's own keys: an owner is credentialed by an env key naming
    it or an active stored key (cached `ttl_s`, as key lookups are). Under a JWT secret or
    the project's `auth.path` any owner may come back with a valid token nobody can revoke
    here, and in local single-user mode its one user is always there: every owner is.
    """

    def __init__(
        self, settings: Settings, store: ApiKeyStore, ttl_s: float, *, project_auth: bool
    ) -> None:
        self._settings = settings
        self._store = store
        self._keys = CachedKeyResolver(store, ttl_s)
        self._open = (
            project_auth
            or settings.jwt_secret is not None
            or (settings.jwt_public_key_file is not None)
        )
        self._env_users = {user for user, _role in settings.api_key_map.values()}
        self._known: TTLCache[str, bool] = TTLCache(maxsize=10_000, ttl=ttl_s)
        self._lock = threading.Lock()

    def valid(self, user_id: str) -> bool:
        """Whether `user_id` has a credential (see the class)."""
        if self._open or user_id in self._env_users:
            return True
        if no_credentials(self._settings, self._keys):
            return True  # local single-user mode
        with self._lock:
            known = self._known.get(user_id)
        if known is None:
            known = self._store.user_active(user_id)
            with self._lock:
                self._known[user_id] = known
        return known
