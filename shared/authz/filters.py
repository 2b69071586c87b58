"""What a handler's filter means: a condition on the resource's `metadata`.

A handler returns `{"owner": "alice"}`, `{"owner": {"$eq": "alice"}}` or
`{"tags": {"$contains": "team-a"}}` (an array field holding a value, or every value of a
list). Each is expressed as one JSONB containment document, so a filter becomes
`metadata @> %s` in the searches that already take a metadata filter, and the same test
in Python (`contains`) for a row already read: one meaning for both.
"""

from __future__ import annotations

from typing import Any

from shared.errors import ThreadrunError
from shared.vocab import JSONObject

OPERATORS = frozenset({"$eq", "$contains"})
NOTHING: JSONObject = {"__threadrun_authz_nothing__": True}
"""A condition no row meets: the narrowing of a filter that contradicts the request's own."""


class InvalidFilter(ThreadrunError, ValueError):
    """A handler returned a filter this server cannot apply (it refuses: fail closed)."""


def containment(auth_filter: JSONObject) -> JSONObject:
    """The JSONB containment document equal to `auth_filter`."""
    out: JSONObject = {}
    for key, condition in auth_filter.items():
        if not isinstance(key, str) or key.startswith("$"):
            raise InvalidFilter(f"filter key {key!r} is not a metadata field")
        if isinstance(condition, dict) and any(str(k).startswith("$") for k in condition):
            if len(condition) != 1 or next(iter(condition)) not in OPERATORS:
                raise InvalidFilter(
                    f"filter on {key!r}: {sorted(condition)} — only one of "
                    f"{sorted(OPERATORS)} per field is supported"
                )
            ((op, value),) = condition.items()
            if op == "$eq":
                out[key] = value
            else:
                out[key] = list(value) if isinstance(value, list) else [value]
        else:
            out[key] = condition
    return out


def merge(first: JSONObject, second: JSONObject) -> JSONObject | None:
    """One containment document that holds exactly when both hold; None when no document
    can satisfy both (the same field asked to be two different values)."""
    out: JSONObject = dict(first)
    for key, want in second.items():
        if key not in out:
            out[key] = want
            continue
        merged = _merge_value(out[key], want)
        if merged is _CONFLICT:
            return None
        out[key] = merged
    return out


_CONFLICT = object()


def _merge_value(a: Any, b: Any) -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        merged = merge(a, b)
        return _CONFLICT if merged is None else merged
    if isinstance(a, list) and isinstance(b, list):
        return a + [x for x in b if x not in a]
    return a if a == b else _CONFLICT


def contains(document: Any, pattern: Any) -> bool:
    """PostgreSQL's `document @> pattern` for JSON values: objects recursively, an array
    contains an array when each pattern element is contained in some element of it."""
    if isinstance(pattern, dict):
        if not isinstance(document, dict):
            return False
        return all(k in document and contains(document[k], v) for k, v in pattern.items())
    if isinstance(pattern, list):
        if not isinstance(document, list):
            return False
        return all(any(contains(d, p) for d in document) for p in pattern)
    if isinstance(document, (dict, list)):
        return False
    if isinstance(pattern, bool) or isinstance(document, bool):
        return type(pattern) is type(document) and pattern == document
    return bool(document == pattern)
