"""`http.logging_headers`: which request headers may appear in the web process's logs.

threadrun's own log lines never carry request headers (app/auth.py logs a refused request's
path only); the one place they can appear is gunicorn's access log, off by default and
turned on by the operator (`GUNICORN_CMD_ARGS="--access-logfile -"`), whose default format
prints User-Agent and Referer and whose `%({name}i)s` / `%({http_name}e)s` atoms print any.
`HeaderRulesLogger` (app/gunicorn_conf.py's `logger_class`) replaces each header the rules
do not allow with "-": `excludes` first, then `includes` (all headers when it is unset),
`*` wildcards, case-insensitive, as the official server reads the section. Credentials
(Authorization, x-api-key, Cookie) are never logged, whatever the rules say.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from gunicorn.glogging import Logger

from shared.project import HeaderRules, load_project

NEVER_LOGGED = frozenset({"authorization", "x-api-key", "cookie", "proxy-authorization"})
HEADER_ATOMS = {"a": "user-agent", "f": "referer"}


def header_allowed(name: str, rules: HeaderRules | None) -> bool:
    """Whether a request header may be logged under `rules` (None: every header)."""
    low = name.lower()
    if low in NEVER_LOGGED:
        return False
    if rules is None:
        return True
    if any(fnmatch.fnmatchcase(low, p.lower()) for p in rules.excludes or ()):
        return False
    if rules.includes is None:
        return True
    return any(fnmatch.fnmatchcase(low, p.lower()) for p in rules.includes)


def filter_atoms(atoms: dict[str, Any], rules: HeaderRules | None) -> dict[str, Any]:
    """gunicorn's access-log atoms with every header the rules refuse replaced by "-"."""
    out = dict(atoms)
    for atom, header in HEADER_ATOMS.items():
        if atom in out and not header_allowed(header, rules):
            out[atom] = "-"
    for key in atoms:
        if key.startswith("{") and key.endswith("}i"):
            header = key[1:-2]
        elif key.startswith("{http_") and key.endswith("}e"):
            header = key[6:-2].replace("_", "-")
        else:
            continue
        if not header_allowed(header, rules):
            out[key] = "-"
    return out


class HeaderRulesLogger(Logger):  # type: ignore[misc]
    """gunicorn's logger, its access log honouring `http.logging_headers` (read once, when
    gunicorn builds it)."""

    def __init__(self, cfg: Any) -> None:
        from shared.settings import Settings

        super().__init__(cfg)
        self.header_rules = load_project(Settings().config).http.logging_headers

    def atoms(self, resp: Any, req: Any, environ: Any, request_time: Any) -> dict[str, Any]:
        atoms: dict[str, Any] = super().atoms(resp, req, environ, request_time)
        return filter_atoms(atoms, self.header_rules)
