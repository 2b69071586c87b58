"""A1 on real PostgreSQL: assistants, their versions, system assistants, ownership, the schema."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from shared.agent.graphs import GraphNotFound, GraphRegistry, assistant_id_for
from shared.assistants.manager import AssistantManager, AssistantSpec, system_content
from shared.assistants.model import Assistant, AssistantPatch, OnConflict
from shared.assistants.store import AssistantFilter, AssistantStore
from shared.db import make_pool
from shared.errors import AssistantExists, AssistantNotFound, AssistantReadOnly, ValidationFailed
from shared.settings import PROJECT_ROOT, Settings

ALICE, BOB = "alice", "bob"
GRAPHS = ["lead_agent"]


@pytest.fixture(scope="module")
def pool(settings: Settings) -> Iterator[ConnectionPool]:
    p = make_pool(settings, name="test-assistants", max_size=10)
    yield p
    p.close()


@pytest.fixture
def store(pool: ConnectionPool) -> AssistantStore:
    return AssistantStore(pool)


@pytest.fixture(scope="module")
def manager(pool: ConnectionPool) -> AssistantManager:
    registry = GraphRegistry.from_config(PROJECT_ROOT / "langgraph.json")
    m = AssistantManager(AssistantStore(pool), registry)
    m.ensure_system()
    return m


def tag() -> str:
    return uuid.uuid4().hex[:8]


def together(n: int, fn: Callable[[int], Any]) -> list[Any]:
    """Run fn(0..n-1) in n threads released at once; return results (or raised errors)."""
    barrier = threading.Barrier(n)
    out: list[Any] = [None] * n

    def go(i: int) -> None:
        barrier.wait()
        try:
            out[i] = fn(i)
        except Exception as exc:  # noqa: BLE001 - the test inspects what each thread got
            out[i] = exc

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_migrated_schema_is_the_declared_one(pool: ConnectionPool) -> None:
    """The two tables have exactly the declared columns and primary keys."""
    declared = {
        "assistants": {
            "assistant_id", "public_id", "graph_id", "owner", "name", "description", "metadata",
            "config", "context", "version", "created_at", "updated_at",
        },
        "assistant_versions": {
            "assistant_id", "version", "graph_id", "config", "context", "metadata", "name",
            "description", "created_at",
        },
    }  # fmt: skip
    with pool.connection() as conn:
        for table, columns in declared.items():
            got = {
                r["column_name"]
                for r in conn.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = %s",
                    (table,),
                )
            }
            assert got == columns, table
        pks = {
            r["table"]: r["cols"]
            for r in conn.execute(
                """SELECT c.conrelid::regclass::text AS table,
                          array_agg(a.attname ORDER BY a.attname) AS cols
                   FROM pg_constraint c JOIN pg_attribute a
                     ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey)
                   WHERE c.contype = 'p'
                     AND c.conrelid::regclass::text IN ('assistants', 'assistant_versions')
                   GROUP BY 1"""
            )
        }
    assert pks == {
        "assistants": ["assistant_id"],
        "assistant_versions": ["assistant_id", "version"],
    }


def test_system_assistants_are_stable_and_idempotent(manager: AssistantManager) -> None:
    """Each graph keeps one system assistant with its uuid5 id; a second start adds nothing;
    every user reads it, by id or by graph name."""
    assert manager.ensure_system() == []
    sid = assistant_id_for("lead_agent")
    for user in (ALICE, BOB):
        a = manager.get(user, sid)
        assert a.system and a.graph_id == "lead_agent" and a.version == 1
        assert a.metadata == {"created_by": "system"} and a.name == "lead_agent"
        assert manager.get(user, "lead_agent") == a
    versions = manager.versions(ALICE, "lead_agent", metadata={}, limit=10, offset=0)
    assert [v.version for v in versions] == [1]


class CountingStore(AssistantStore):
    """An AssistantStore that counts its single-assistant reads."""

    reads = 0

    def get(self, assistant_id: str, owner: str, graphs: Sequence[str]) -> Assistant:
        self.reads += 1
        return super().get(assistant_id, owner, graphs)


def test_a_system_assistant_is_read_once_a_user_one_every_time(pool: ConnectionPool) -> None:
    """R2's admission path: a run on a graph name reads its system assistant once per
    process (those rows never change); a user's assistant is read on every run, so a patch
    is seen by the next one."""
    store = CountingStore(pool)
    manager = AssistantManager(store, GraphRegistry.from_config(PROJECT_ROOT / "langgraph.json"))
    manager.ensure_system()
    first = manager.resolve(ALICE, "lead_agent")
    assert manager.resolve(BOB, "lead_agent") is first
    assert manager.resolve(ALICE, assistant_id_for("lead_agent")) is first
    assert store.reads == 1
    own = manager.create(ALICE, AssistantSpec(graph_id="lead_agent", name="mine"))
    before = store.reads
    manager.patch(ALICE, own.assistant_id, AssistantPatch(name="renamed"))
    assert manager.resolve(ALICE, own.assistant_id).name == "renamed"
    assert store.reads == before + 1
    with pytest.raises(AssistantNotFound):  # still another user's, cache or not
        manager.resolve(BOB, own.assistant_id)


def test_system_upserts_racing_from_many_processes_make_one_row(store: AssistantStore) -> None:
    """Web processes starting at once: every upsert succeeds, exactly one row and version."""
    graph = f"g-{tag()}"
    contents = {assistant_id_for(graph): system_content(graph)}
    created = together(8, lambda _: store.ensure_system(contents))
    assert not [c for c in created if isinstance(c, Exception)]
    assert sum(len(c) for c in created) == 1
    a = store.get(assistant_id_for(graph), ALICE, [graph])
    assert a.system and a.version == 1
    versions = store.versions(a.assistant_id, BOB, [graph], metadata={}, limit=10, offset=0)
    assert len(versions) == 1


def test_a_system_assistant_of_a_graph_not_served_is_hidden(store: AssistantStore) -> None:
    """A graph dropped from the config: its system assistant reads as missing."""
    graph = f"gone-{tag()}"
    store.ensure_system({assistant_id_for(graph): system_content(graph)})
    with pytest.raises(AssistantNotFound):
        store.get(assistant_id_for(graph), ALICE, GRAPHS)
    assert store.get(assistant_id_for(graph), ALICE, [graph]).graph_id == graph


def test_create_patch_versions_set_latest(manager: AssistantManager) -> None:
    """Every patch is a new version; set_latest moves back; the next patch is max + 1."""
    name = f"writer-{tag()}"
    a = manager.create(
        ALICE,
        AssistantSpec(
            graph_id="lead_agent",
            name=name,
            metadata={"team": "a"},
            config={"configurable": {"tokens": 3}},
        ),
    )
    assert (a.version, a.owner, a.context) == (1, ALICE, {"tokens": 3})
    b = manager.patch(
        ALICE, a.assistant_id, AssistantPatch(metadata={"v": 2}, context={"tokens": 5})
    )
    assert b.version == 2 and b.metadata == {"team": "a", "v": 2}
    assert b.config == {"configurable": {"tokens": 5}} and b.created_at == a.created_at
    assert b.updated_at >= a.updated_at
    versions = manager.versions(ALICE, a.assistant_id, metadata={}, limit=10, offset=0)
    assert [v.version for v in versions] == [2, 1]
    assert [v.config for v in versions] == [b.config, a.config]
    only = manager.versions(ALICE, a.assistant_id, metadata={"v": 2}, limit=10, offset=0)
    assert [v.version for v in only] == [2]
    back = manager.set_latest(ALICE, a.assistant_id, 1)
    assert (back.version, back.config, back.context, back.metadata) == (
        1,
        a.config,
        a.context,
        a.metadata,
    )
    assert manager.get(ALICE, a.assistant_id) == back
    c = manager.patch(ALICE, a.assistant_id, AssistantPatch(name="again"))
    assert c.version == 3 and c.config == a.config and c.name == "again"
    with pytest.raises(AssistantNotFound):
        manager.set_latest(ALICE, a.assistant_id, 9)


def test_concurrent_updates_get_distinct_versions(manager: AssistantManager) -> None:
    """Eight patches at once: versions 2..9, each once; the current one is the last."""
    a = manager.create(ALICE, AssistantSpec(graph_id="lead_agent", name=f"c-{tag()}"))
    done = together(
        8, lambda i: manager.patch(ALICE, a.assistant_id, AssistantPatch(metadata={"i": i}))
    )
    assert not [d for d in done if isinstance(d, Exception)], done
    assert sorted(d.version for d in done) == list(range(2, 10))
    versions = manager.versions(ALICE, a.assistant_id, metadata={}, limit=20, offset=0)
    assert [v.version for v in versions] == list(range(9, 0, -1))
    assert manager.get(ALICE, a.assistant_id).version == 9


def test_ownership(manager: AssistantManager) -> None:
    """Another user's assistant is a 404 for every verb; a system one is read-only (403);
    an id another user has makes the caller's own assistant (A4: ids are per owner, no
    409 that tells it exists), one's own id conflicts, a system one's id is never taken."""
    a = manager.create(ALICE, AssistantSpec(graph_id="lead_agent", name=f"o-{tag()}"))
    aid = a.assistant_id
    for verb in (
        lambda: manager.get(BOB, aid),
        lambda: manager.resolve(BOB, aid),
        lambda: manager.patch(BOB, aid, AssistantPatch(name="x")),
        lambda: manager.set_latest(BOB, aid, 1),
        lambda: manager.delete(BOB, aid),
        lambda: manager.versions(BOB, aid, metadata={}, limit=1, offset=0),
        lambda: manager.compiled(BOB, aid),
    ):
        with pytest.raises(AssistantNotFound):
            verb()
    for verb in (
        lambda: manager.patch(ALICE, "lead_agent", AssistantPatch(name="x")),
        lambda: manager.set_latest(BOB, "lead_agent", 1),
        lambda: manager.delete(BOB, assistant_id_for("lead_agent")),
    ):
        with pytest.raises(AssistantReadOnly):
            verb()
    bobs = manager.create(BOB, AssistantSpec(graph_id="lead_agent", assistant_id=aid, name="b"))
    assert bobs.assistant_id == aid and bobs.owner == BOB and bobs.storage_id != a.storage_id
    assert manager.get(BOB, aid) == bobs and manager.get(ALICE, aid) == a
    for owner in (ALICE, BOB):
        with pytest.raises(AssistantExists):
            manager.create(owner, AssistantSpec(graph_id="lead_agent", assistant_id=aid))
    with pytest.raises(AssistantExists):  # the same id for everyone: not an oracle
        manager.create(
            BOB, AssistantSpec(graph_id="lead_agent", assistant_id=assistant_id_for("lead_agent"))
        )
    manager.delete(BOB, aid)
    assert manager.get(ALICE, aid) == a
    again = manager.create(
        ALICE,
        AssistantSpec(graph_id="lead_agent", assistant_id=aid, if_exists=OnConflict.DO_NOTHING),
    )
    assert again == a
    with pytest.raises(AssistantExists):
        manager.create(ALICE, AssistantSpec(graph_id="lead_agent", assistant_id=aid))
    assert manager.get(ALICE, aid) == a


def test_unknown_graphs_and_ids(manager: AssistantManager) -> None:
    """A graph the config lacks is a 404; an id that is no UUID nor graph name cannot exist."""
    with pytest.raises(GraphNotFound):
        manager.create(ALICE, AssistantSpec(graph_id="nope"))
    a = manager.create(ALICE, AssistantSpec(graph_id="lead_agent"))
    assert a.name == "Untitled"
    with pytest.raises(GraphNotFound):
        manager.patch(ALICE, a.assistant_id, AssistantPatch(graph_id="nope"))
    with pytest.raises(AssistantNotFound):
        manager.get(ALICE, "not-an-id")
    with pytest.raises(ValidationFailed):
        manager.create(
            ALICE,
            AssistantSpec(
                graph_id="lead_agent", config={"configurable": {"a": 1}}, context={"b": 1}
            ),
        )


def test_search_count_sort_and_delete(manager: AssistantManager, pool: ConnectionPool) -> None:
    """Filters by graph, name substring (wildcards literal) and metadata; sorts; a user's
    search shows their own and system assistants only; delete takes the versions along."""
    t = tag()
    made = [
        manager.create(
            ALICE,
            AssistantSpec(graph_id="lead_agent", name=f"{t}-{n}", metadata={"t": t, "n": n}),
        )
        for n in ("b_%", "a", "c")
    ]
    manager.create(BOB, AssistantSpec(graph_id="lead_agent", name=f"{t}-bob", metadata={"t": t}))
    mine = AssistantFilter(metadata={"t": t})

    def names(**kw: Any) -> list[str]:
        where = kw.pop("where", mine)
        found = manager.search(ALICE, where, limit=kw.pop("limit", 10), offset=0, **kw)
        return [a.name for a in found]

    assert names(sort_by="name", sort_order="asc") == [f"{t}-a", f"{t}-b_%", f"{t}-c"]
    assert names(sort_by="created_at", sort_order="desc") == [f"{t}-c", f"{t}-a", f"{t}-b_%"]
    assert names(where=AssistantFilter(name=f"{t}-B_%"), sort_by="name", sort_order="asc") == [
        f"{t}-b_%"
    ]
    assert names(
        where=AssistantFilter(name="_%", metadata={"t": t}), sort_by="name", sort_order="asc"
    ) == [f"{t}-b_%"]
    assert manager.count(ALICE, mine) == 3 and manager.count(BOB, mine) == 1
    system = manager.search(
        BOB,
        AssistantFilter(metadata={"created_by": "system"}),
        limit=10,
        offset=0,
        sort_by="created_at",
        sort_order="asc",
    )
    assert [a.assistant_id for a in system] == [assistant_id_for("lead_agent")]
    assert manager.count(ALICE, AssistantFilter(graph_id="lead_agent")) >= 4
    gone = made[0].assistant_id
    manager.patch(ALICE, gone, AssistantPatch(name="v2"))
    assert manager.delete(ALICE, gone) == gone
    with pytest.raises(AssistantNotFound):
        manager.get(ALICE, gone)
    with pool.connection() as conn:
        left = conn.execute(
            "SELECT count(*) AS n FROM assistant_versions WHERE assistant_id = %s", (gone,)
        ).fetchone()
    assert left is not None and left["n"] == 0


def test_resolve_merges_nothing_for_a_plain_system_run(manager: AssistantManager) -> None:
    """The system assistant has no config: a run on it is admitted as before, id aside."""
    from shared.runs.model import RunRequest

    request = RunRequest(thread_id="t", assistant_id="lead_agent", config={"tags": ["x"]})
    applied = request.on_assistant(manager.resolve(ALICE, "lead_agent"))
    assert applied.config == {"tags": ["x"]} and applied.context is None
    assert applied.assistant_id == assistant_id_for("lead_agent")


def test_compiled_graph_is_the_registry_graph(manager: AssistantManager) -> None:
    """The graph endpoints get the assistant's compiled graph from the registry."""
    assistant, graph = manager.compiled(BOB, "lead_agent")
    assert assistant.graph_id == "lead_agent" and graph.name == "lead_agent"
