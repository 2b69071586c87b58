"""The named SQL of threads and runs: `queries.sql` beside this module, parsed once.

The statements live in one .sql file so that they read, diff and review as SQL, apart from
the Python that decides when to run them. The store's modules bind each one by name at
import (`FINISH_SQL = query("finish")`), so a name the file lacks, or defines twice, fails
the import of the store (QueryFileError), not the first request that needs it.

The format: a `-- name: <query>` line starts a section. The section's leading and trailing
`--` lines (the query's description, the file's headings) are not sent; the rest is the
statement, with no trailing semicolon, since one may be embedded in another
(`shared.journal.with_event`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from importlib import resources
from types import MappingProxyType

from shared.errors import ConfigError

QUERY_FILE = "queries.sql"

_HEADER = re.compile(r"^-- name: ([a-z][a-z0-9_]*)$")
_HEADER_LIKE = re.compile(r"^--\s*name\b", re.IGNORECASE)
"""A line meant as a header: one that is not exactly `_HEADER` is an error, not a comment."""


class QueryFileError(ConfigError):
    """`queries.sql` does not fit the code: a malformed or duplicate header, an empty
    section, a trailing `;`, or no query of a name the code asks for (`query`)."""


def parse(text: str, source: str = QUERY_FILE) -> dict[str, str]:
    """The named statements of a query file's `text`; QueryFileError if it is malformed."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None  # None: before the first header (comments only)
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header is not None:
            name = header.group(1)
            if name in sections:
                raise QueryFileError(f"{source}:{number}: query {name!r} is defined twice")
            current = sections[name] = []
        elif _HEADER_LIKE.match(line):
            raise QueryFileError(f"{source}:{number}: malformed header {line!r}")
        elif current is not None:
            current.append(line)
        elif line.strip() and not _is_comment(line):
            raise QueryFileError(f"{source}:{number}: SQL before the first `-- name:` header")
    return {name: _statement(name, lines, source) for name, lines in sections.items()}


def _is_comment(line: str) -> bool:
    return line.lstrip().startswith("--")


def _statement(name: str, lines: list[str], source: str) -> str:
    """A section's statement: its lines less the leading and trailing comments and blanks."""
    start, end = 0, len(lines)
    while start < end and (not lines[start].strip() or _is_comment(lines[start])):
        start += 1
    while end > start and (not lines[end - 1].strip() or _is_comment(lines[end - 1])):
        end -= 1
    sql = "\n".join(lines[start:end])
    if not sql:
        raise QueryFileError(f"{source}: query {name!r} has no statement")
    if sql.rstrip().endswith(";"):
        raise QueryFileError(f"{source}: query {name!r} ends with ';' (it may be embedded)")
    return sql


@functools.cache
def queries() -> Mapping[str, str]:
    """Every statement of `queries.sql` by name, read and parsed on the first call."""
    text = resources.files("shared.runs").joinpath(QUERY_FILE).read_text("utf-8")
    return MappingProxyType(parse(text))


def query(name: str) -> str:
    """The statement named `name`; QueryFileError if the file has none."""
    try:
        return queries()[name]
    except KeyError:
        raise QueryFileError(f"{QUERY_FILE} has no query named {name!r}") from None
