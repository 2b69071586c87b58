"""Passwords out of connection strings before they are printed or logged (G4).

Parsed with the same parsers the drivers use (`urllib.parse` as redis-py's `parse_url` and
libpq's URI form read them, `psycopg.conninfo` for libpq's key=value form), not with a
regex: the regex that was here found `user:password@` only, and missed `?password=` in a
URL and `password=` in a conninfo string.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

MASK = "***"
SECRET_PARAMS = frozenset({"password", "sslpassword"})
"""Parameters that carry a secret (libpq's `password`/`sslpassword`, redis-py's `password`)."""
UNPARSEABLE = "<connection string hidden: not parseable>"


def redact(dsn: str) -> str:
    """`dsn` (a URL or a libpq key=value string) with every password replaced by `***`."""
    scheme = urlsplit(dsn).scheme
    if scheme and dsn.startswith(f"{scheme}://"):  # a URL (libpq: only its own schemes)
        return _redact_url(dsn)
    if "=" not in dsn:
        return dsn  # not a conninfo string either (a bare host, a path): nothing to hide
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return UNPARSEABLE  # it may still hold a password that we failed to find
    if not SECRET_PARAMS & params.keys():
        return dsn
    masked = {k: MASK if k in SECRET_PARAMS else v for k, v in params.items()}
    return make_conninfo("", **masked)


def _redact_url(url: str) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}:{MASK}@{hostport}"
    query = parts.query
    pairs = parse_qsl(query, keep_blank_values=True)
    if any(k in SECRET_PARAMS for k, _ in pairs):
        query = urlencode([(k, MASK if k in SECRET_PARAMS else v) for k, v in pairs], safe="*")
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))
