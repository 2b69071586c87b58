"""`threadrun keys`: create, list and revoke API keys (A4).

    threadrun keys create --user alice [--role ops] [--name laptop]   # prints the key once
    threadrun keys list [--user alice]
    threadrun keys revoke <key_id | prefix>

They ship with the server and reach the client's `threadrun` command through the
`threadrun.cli` entry-point group (pyproject.toml). The last paragraph of this docstring is
the help text of `threadrun keys`.

These commands talk to PostgreSQL directly (THREADRUN_DATABASE_URL, like the server), not
to the HTTP API: only whoever holds the database credentials manages keys. The server
caches key lookups for THREADRUN_API_KEY_CACHE_TTL_S (default 10 s), so a revoked key
stops working within that time.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import psycopg
from psycopg.rows import dict_row

from shared.auth.keys import ROLES, ApiKey, ApiKeyStore
from shared.settings import Settings

EXIT_OK, EXIT_NOT_FOUND = 0, 1


class _Connect:
    """One short-lived connection per store call (the CLI makes one or two)."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn

    @contextmanager
    def connection(self) -> Iterator[Any]:
        with psycopg.connect(self._dsn, autocommit=True, row_factory=dict_row) as conn:
            yield conn


def key_store(settings: Settings | None = None) -> ApiKeyStore:
    """The key store of the configured database."""
    return ApiKeyStore(_Connect((settings or Settings()).dsn))


def _row(key: ApiKey) -> str:
    revoked = key.revoked_at.isoformat(timespec="seconds") if key.revoked_at else "-"
    return "\t".join(
        [
            key.key_id,
            key.prefix,
            key.user_id,
            key.role,
            key.name or "-",
            key.created_at.isoformat(timespec="seconds"),
            revoked,
        ]
    )


def cmd_create(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Create a key and print it (the only time it is shown)."""
    out = out or sys.stdout
    settings = Settings()
    store = key_store(settings)
    ends_local_mode = (
        not store.any_active()
        and not settings.api_key_map
        and settings.jwt_secret is None
        and settings.jwt_public_key_file is None
    )
    key, secret = store.create(args.user, args.role, args.name)
    out.write(f"{secret}\n")
    sys.stderr.write(
        f"created key {key.prefix} (id {key.key_id}) for {key.user_id} ({key.role});"
        " store it now, it is not shown again\n"
    )
    if ends_local_mode:
        sys.stderr.write(local_mode_ended(settings.local_user, key.user_id))
    return EXIT_OK


def local_mode_ended(local_user: str, new_user: str) -> str:
    """The warning of the first key: local single-user mode is over, and where the threads
    made in it went (they belong to the local user, whom only a key of that user reaches)."""
    reach = (
        "this key reaches them"
        if new_user == local_user
        else f"create a key for that user to reach them: `threadrun keys create --user {local_user}`"
    )
    return (
        "warning: this is the first credential, so local single-user mode is over: every"
        " request now needs a key (the chat page asks for one).\n"
        f"  Threads made in local mode belong to the user {local_user!r}; {reach}.\n"
    )


def cmd_list(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """List keys (never their secrets)."""
    out = out or sys.stdout
    out.write("key_id\tprefix\tuser\trole\tname\tcreated_at\trevoked_at\n")
    for key in key_store().list(args.user):
        out.write(_row(key) + "\n")
    return EXIT_OK


def cmd_revoke(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Revoke a key by id or prefix."""
    out = out or sys.stdout
    key = key_store().revoke(args.ref)
    if key is None:
        sys.stderr.write(f"threadrun: no key {args.ref!r}\n")
        return EXIT_NOT_FOUND
    out.write(_row(key) + "\n")
    return EXIT_OK


def add_keys(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`threadrun keys`."""
    p = sub.add_parser(
        "keys",
        help="manage API keys (talks to PostgreSQL via THREADRUN_DATABASE_URL)",
        description=__doc__.split("\n\n")[-1] if __doc__ else None,
    )
    keys_sub = p.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    c = keys_sub.add_parser("create", help="create a key and print it once")
    c.add_argument("--user", required=True, help="the user id the key authenticates as")
    c.add_argument("--role", choices=ROLES, default="user", help="default %(default)s")
    c.add_argument("--name", default="", help="a label for listings")
    c.set_defaults(func=cmd_create)
    ls = keys_sub.add_parser("list", help="list keys (not their secrets)")
    ls.add_argument("--user", help="only this user's keys")
    ls.set_defaults(func=cmd_list)
    r = keys_sub.add_parser("revoke", help="revoke a key by id or prefix")
    r.add_argument("ref", help="key_id or prefix (trk_xxxxxxxx)")
    r.set_defaults(func=cmd_revoke)
