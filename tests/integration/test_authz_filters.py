"""A handler's filter has one meaning in SQL and in Python (shared/authz/filters.py).

Searches apply a filter as `metadata @> containment(filter)` in PostgreSQL; a resource
already read is checked with `contains` in Python. The property: for any metadata and
filter, both answer the same, and `merge` holds exactly when both of its parts hold.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg_pool import ConnectionPool

from shared.authz.filters import containment, contains, merge

KEYS = st.sampled_from(["owner", "org", "tags", "team"])
SCALARS = st.one_of(
    st.sampled_from(["alice", "bob", "acme", ""]),
    st.integers(-2, 2),
    st.booleans(),
    st.none(),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=2)),
    max_leaves=6,
)
METADATA = st.dictionaries(KEYS, VALUES, max_size=4)
CONDITION = st.one_of(
    VALUES,
    st.builds(lambda v: {"$eq": v}, VALUES),
    st.builds(lambda v: {"$contains": v}, st.one_of(SCALARS, st.lists(SCALARS, max_size=2))),
)
FILTERS = st.dictionaries(KEYS, CONDITION, max_size=3).filter(
    lambda f: not any(isinstance(v, dict) and not v for v in f.values())
)


def pg_contains(pool: ConnectionPool, doc: Any, pattern: Any) -> bool:
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT %s::jsonb @> %s::jsonb AS ok", (json.dumps(doc), json.dumps(pattern))
        ).fetchone()
    assert row is not None
    return bool(row[0] if not isinstance(row, dict) else row["ok"])


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(metadata=METADATA, auth_filter=FILTERS)
def test_python_and_postgres_agree(pool: ConnectionPool, metadata: Any, auth_filter: Any) -> None:
    """`contains` is PostgreSQL's `@>` for every filter a handler can return."""
    try:
        pattern = containment(auth_filter)
    except ValueError:
        return  # a dict value with `$` keys mixed in: refused, never applied
    assert contains(metadata, pattern) == pg_contains(pool, metadata, pattern)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(metadata=METADATA, first=FILTERS, second=FILTERS)
def test_merge_holds_when_both_hold(
    pool: ConnectionPool, metadata: Any, first: Any, second: Any
) -> None:
    """A search narrowed by the handler's filter finds exactly what both conditions find;
    a contradiction (None) finds nothing."""
    try:
        a, b = containment(first), containment(second)
    except ValueError:
        return
    merged = merge(a, b)
    both = contains(metadata, a) and contains(metadata, b)
    if merged is None:
        assert not both
    else:
        assert pg_contains(pool, metadata, merged) == both
