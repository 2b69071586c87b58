"""`threadrun migrate`: apply the database migrations (idempotent).

Talks to PostgreSQL directly (THREADRUN_DATABASE_URL, like the server), so it ships with the
server and reaches the client's `threadrun` command through the `threadrun.cli` entry-point
group (pyproject.toml), like `threadrun keys` (shared/tools/cli_keys.py).
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

EXIT_OK = 0


def cmd_migrate(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Apply pending migrations to THREADRUN_DATABASE_URL (idempotent)."""
    out = out or sys.stdout
    del args
    # Imported here, not at the top: `threadrun` loads this module to build its parser, and
    # every other subcommand would otherwise pay for importing the migrations and LangGraph.
    from shared.db.migrate import migrate
    from shared.settings import Settings

    done = migrate(Settings())
    out.write(f"applied {done}\n" if done else "schema up to date\n")
    return EXIT_OK


def add_migrate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`threadrun migrate`."""
    p = sub.add_parser("migrate", help="apply database migrations (THREADRUN_DATABASE_URL)")
    p.set_defaults(func=cmd_migrate)
