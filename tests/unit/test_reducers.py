"""S2: the ThreadState reducers, one invariant at a time (examples, then properties)."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from functools import reduce
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, RemoveMessage

from shared.errors import Conflict, ValidationFailed
from shared.state.reducers import (
    REMOVE_ALL_MESSAGES,
    TERMINAL_STATUSES,
    InvalidStateUpdate,
    SandboxConflict,
    add_messages,
    keep_last,
    merge_artifacts,
    merge_background_tasks,
    merge_delegations,
    merge_promoted,
    merge_sandbox,
    merge_todos,
    merge_uploaded_files,
    merge_viewed_images,
)

# --- strategies -------------------------------------------------------------------------

PATHS = ["outputs/a.md", "outputs/b.md", "outputs/c.csv", "uploads/d.png", "e"]
paths = st.sampled_from(PATHS) | st.text(min_size=1, max_size=3)
path_lists = st.lists(paths, max_size=8)

todo = st.fixed_dictionaries(
    {
        "content": st.text(max_size=5),
        "status": st.sampled_from(["pending", "in_progress", "completed"]),
    }
)
todo_lists = st.lists(todo, max_size=4)

STATUSES = ["pending", "running", "completed", "failed", "cancelled"]
record = st.fixed_dictionaries(
    {"status": st.sampled_from(STATUSES), "version": st.integers(0, 3)},
    optional={"result": st.sampled_from(["ok", "partial"]), "subagent": st.just("research")},
)
ledgers = st.dictionaries(st.sampled_from(["d1", "d2", "d3"]), record, max_size=3)
ledger_reducers = pytest.mark.parametrize(
    "merge", [merge_delegations, merge_background_tasks], ids=["delegations", "background_tasks"]
)

file_record = st.fixed_dictionaries(
    {"path": st.sampled_from(PATHS)}, optional={"size": st.integers(0, 3)}
)
file_lists = st.lists(file_record, max_size=5)
keyed_reducers = pytest.mark.parametrize(
    "merge", [merge_uploaded_files, merge_viewed_images], ids=["uploaded_files", "viewed_images"]
)

hashes = st.sampled_from(["h1", "h2"])
promoted = st.fixed_dictionaries(
    {"catalog_hash": hashes, "items": st.lists(st.sampled_from(["ls", "grep", "web", "sql"]))}
)
sandbox_ids = st.sampled_from(["sb-1", "sb-2", "sb-3"])


def fold(merge: Callable[[Any, Any], Any], start: Any, writes: Sequence[Any]) -> Any:
    """What LangGraph does with the writes of one channel: one reducer call per write."""
    return reduce(merge, writes, start)


# --- scalars ----------------------------------------------------------------------------


@given(st.none() | st.text(max_size=3), st.none() | st.text(max_size=3))
def test_s2_scalars_last_write_wins_and_none_is_no_change(old: str | None, new: str | None) -> None:
    """title/goal/summary_text/...: a value replaces, None keeps, "" is a value."""
    out = keep_last(old, new)
    assert out == (old if new is None else new)
    assert keep_last(out, new) == out


# --- sandbox ----------------------------------------------------------------------------


@given(st.none() | sandbox_ids.map(lambda s: {"sandbox_id": s}), sandbox_ids)
def test_s2_sandbox_same_id_is_idempotent_other_id_raises(
    existing: dict[str, str] | None, new_id: str
) -> None:
    """The same sandbox_id again is a no-op; a different one raises SandboxConflict."""
    new = {"sandbox_id": new_id}
    if existing is not None and existing["sandbox_id"] != new_id:
        with pytest.raises(SandboxConflict) as info:
            merge_sandbox(existing, new)  # type: ignore[arg-type]
        assert info.value.existing_id == existing["sandbox_id"]
        assert info.value.new_id == new_id
        return
    once = merge_sandbox(existing, new)  # type: ignore[arg-type]
    assert once == new
    assert merge_sandbox(once, new) == once  # type: ignore[arg-type]
    assert merge_sandbox(once, None) == once


@given(st.none() | sandbox_ids, sandbox_ids, sandbox_ids)
def test_s2_sandbox_concurrent_writes_merge_the_same_in_any_order(
    start: str | None, a: str, b: str
) -> None:
    """Two lazy tools in one step: both orders give one value, or both orders raise."""
    init = None if start is None else {"sandbox_id": start}
    outcomes = []
    for writes in ([a, b], [b, a]):
        try:
            outcomes.append(fold(merge_sandbox, init, [{"sandbox_id": w} for w in writes]))
        except SandboxConflict:
            outcomes.append("conflict")
    assert outcomes[0] == outcomes[1]
    assert (outcomes[0] == "conflict") == (len({a, b} | ({start} if start else set())) > 1)


def test_s2_sandbox_conflict_is_a_clear_conflict_error() -> None:
    with pytest.raises(SandboxConflict) as info:
        merge_sandbox({"sandbox_id": "sb-1"}, {"sandbox_id": "sb-2"})
    err = info.value
    assert isinstance(err, Conflict)
    assert err.code == "sandbox_conflict"
    assert "'sb-1'" in str(err) and "'sb-2'" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert (again.existing_id, again.new_id, str(again)) == ("sb-1", "sb-2", str(err))


@pytest.mark.parametrize("bad", [{}, {"sandbox_id": ""}, {"sandbox_id": 7}, {"id": "x"}, "sb-1"])
def test_s2_malformed_sandbox_is_refused(bad: Any) -> None:
    with pytest.raises(InvalidStateUpdate) as info:
        merge_sandbox({"sandbox_id": "sb-1"}, bad)
    assert info.value.field == "sandbox"
    assert isinstance(info.value, ValidationFailed) and info.value.status == 422


# --- artifacts --------------------------------------------------------------------------


def test_s2_artifacts_keep_order_and_drop_duplicates() -> None:
    start = ["outputs/a.md", "outputs/b.md"]
    out = merge_artifacts(start, ["outputs/c.csv", "outputs/a.md", "outputs/c.csv"])
    assert out == ["outputs/a.md", "outputs/b.md", "outputs/c.csv"]
    assert start == ["outputs/a.md", "outputs/b.md"]  # pure: the input is not touched
    assert merge_artifacts(out, []) == out
    assert merge_artifacts(out, None) == out


@given(path_lists, path_lists)
def test_s2_artifacts_merge_is_a_duplicate_free_order_keeping_union(
    existing: list[str], new: list[str]
) -> None:
    out = merge_artifacts(existing, new)
    assert len(out) == len(set(out))
    assert set(out) == set(existing) | set(new)
    kept = list(dict.fromkeys(existing))
    assert out[: len(kept)] == kept
    # New paths come in the order they were written.
    assert out[len(kept) :] == [p for p in dict.fromkeys(new) if p not in set(existing)]


@given(path_lists, path_lists, path_lists)
def test_s2_artifacts_idempotent_associative_and_order_insensitive_as_a_set(
    start: list[str], a: list[str], b: list[str]
) -> None:
    ab = fold(merge_artifacts, start, [a, b])
    ba = fold(merge_artifacts, start, [b, a])
    assert set(ab) == set(ba)
    assert len(ab) == len(ba) == len(set(ab))
    assert merge_artifacts(ab, b) == ab
    assert merge_artifacts(merge_artifacts(start, a), b) == merge_artifacts(
        start, merge_artifacts(a, b)
    )


@pytest.mark.parametrize("bad", ["outputs/a.md", [""], [None], [1], {"outputs/a.md": 1}])
def test_s2_malformed_artifacts_are_refused(bad: Any) -> None:
    with pytest.raises(InvalidStateUpdate) as info:
        merge_artifacts([], bad)
    assert info.value.field == "artifacts"


# --- todos ------------------------------------------------------------------------------


@given(todo_lists, st.none() | todo_lists)
def test_s2_todos_empty_list_clears_none_keeps_a_list_replaces(
    existing: list[Any], new: list[Any] | None
) -> None:
    out = merge_todos(existing, new)
    assert out == (existing if new is None else new)
    assert merge_todos(out, new) == out
    assert merge_todos(out, []) == []


def test_s2_todos_explicit_clear() -> None:
    todos: list[Any] = [{"content": "draft", "status": "in_progress"}]
    assert merge_todos(todos, []) == []
    assert merge_todos(todos, None) == todos


@pytest.mark.parametrize("bad", ["x", {"content": "x"}, ["x"], [1]])
def test_s2_malformed_todos_are_refused(bad: Any) -> None:
    with pytest.raises(InvalidStateUpdate):
        merge_todos([], bad)


# --- promoted ---------------------------------------------------------------------------


def test_s2_promoted_replaced_wholesale_when_the_catalog_hash_changes() -> None:
    old: Any = {"catalog_hash": "h1", "items": ["ls", "grep"]}
    same = merge_promoted(old, {"catalog_hash": "h1", "items": ["web", "ls"]})
    assert same == {"catalog_hash": "h1", "items": ["ls", "grep", "web"]}
    changed = merge_promoted(same, {"catalog_hash": "h2", "items": ["sql"]})
    assert changed == {"catalog_hash": "h2", "items": ["sql"]}
    assert merge_promoted(changed, None) == changed
    assert merge_promoted(None, {"catalog_hash": "h1", "items": []}) == old | {"items": []}


@given(st.none() | promoted, promoted)
def test_s2_promoted_hash_change_replaces_same_hash_unions(
    existing: dict[str, Any] | None, new: dict[str, Any]
) -> None:
    out = merge_promoted(existing, new)  # type: ignore[arg-type]
    assert out is not None
    assert out["catalog_hash"] == new["catalog_hash"]
    assert len(out["items"]) == len(set(out["items"]))
    if existing is None or existing["catalog_hash"] != new["catalog_hash"]:
        assert out["items"] == list(dict.fromkeys(new["items"]))
    else:
        assert set(out["items"]) == set(existing["items"]) | set(new["items"])
    assert merge_promoted(out, new) == out  # type: ignore[arg-type]


@given(promoted, st.lists(st.sampled_from(["ls", "web", "x"])), st.lists(st.just("sql")))
def test_s2_promoted_same_hash_concurrent_writes_agree_as_a_set(
    start: dict[str, Any], a: list[str], b: list[str]
) -> None:
    h = start["catalog_hash"]
    wa, wb = {"catalog_hash": h, "items": a}, {"catalog_hash": h, "items": b}
    ab = fold(merge_promoted, start, [wa, wb])
    ba = fold(merge_promoted, start, [wb, wa])
    assert ab["catalog_hash"] == ba["catalog_hash"] == h
    assert set(ab["items"]) == set(ba["items"])


@pytest.mark.parametrize(
    "bad",
    [{"items": []}, {"catalog_hash": "", "items": []}, {"catalog_hash": "h", "items": "ls"}, []],
)
def test_s2_malformed_promoted_is_refused(bad: Any) -> None:
    with pytest.raises(InvalidStateUpdate):
        merge_promoted(None, bad)


# --- delegations and background tasks ---------------------------------------------------


@ledger_reducers
def test_s2_terminal_delegation_is_never_reverted(merge: Any) -> None:
    done = {"d1": {"status": "completed", "version": 2, "result": "ok"}}
    assert merge(done, {"d1": {"status": "running", "version": 1}}) == done  # older
    assert merge(done, {"d1": {"status": "running", "version": 9}}) == done  # stale writer
    newer = {"d1": {"status": "failed", "version": 3, "error": "late"}}
    assert merge(done, newer) == newer  # a newer terminal record replaces it
    assert merge(done, {"d1": {"status": "cancelled", "version": 1}}) == done  # older terminal


@ledger_reducers
def test_s2_delegation_records_advance_by_version_and_ids_are_kept(merge: Any) -> None:
    start = {"d1": {"status": "pending", "version": 0}}
    running = merge(start, {"d1": {"status": "running", "version": 1}, "d2": {"status": "pending"}})
    assert running == {"d1": {"status": "running", "version": 1}, "d2": {"status": "pending"}}
    assert merge(running, {"d1": {"status": "pending", "version": 0}}) == running
    assert merge(running, None) == running
    assert merge(running, {}) == running
    assert start == {"d1": {"status": "pending", "version": 0}}  # pure


@ledger_reducers
@given(start=ledgers, new=ledgers)
def test_s2_ledger_merge_never_reverts_terminal_never_goes_back_in_version(
    merge: Any, start: dict[str, Any], new: dict[str, Any]
) -> None:
    out = merge(start, new)
    assert set(out) == set(start) | set(new)
    for key, rec in out.items():
        assert rec in (start.get(key), new.get(key))  # a merge never invents a record
        old = start.get(key)
        if old is None:
            continue
        if old["status"] in TERMINAL_STATUSES:
            assert rec["status"] in TERMINAL_STATUSES
        if (rec["status"] in TERMINAL_STATUSES) == (old["status"] in TERMINAL_STATUSES):
            assert rec["version"] >= old["version"]


@ledger_reducers
@given(start=ledgers, a=ledgers, b=ledgers)
def test_s2_ledger_concurrent_writes_merge_the_same_in_any_order(
    merge: Any, start: dict[str, Any], a: dict[str, Any], b: dict[str, Any]
) -> None:
    """Terminal-wins is a join: order-insensitive, associative and idempotent."""
    ab = fold(merge, start, [a, b])
    assert ab == fold(merge, start, [b, a])
    assert merge(merge(start, a), b) == merge(start, merge(a, b))
    assert merge(ab, a) == ab
    assert merge(ab, ab) == ab


@ledger_reducers
@pytest.mark.parametrize(
    "bad",
    [
        {"d1": {"status": "done"}},
        {"d1": {"version": 1}},
        {"d1": {"status": "running", "version": -1}},
        {"d1": {"status": "running", "version": True}},
        {"d1": {"status": "running", "version": "2"}},
        {"d1": "completed"},
        {"": {"status": "running"}},
        [{"status": "running"}],
    ],
)
def test_s2_malformed_ledger_updates_are_refused(merge: Any, bad: Any) -> None:
    with pytest.raises(InvalidStateUpdate) as info:
        merge({"d1": {"status": "pending"}}, bad)
    assert info.value.field in ("delegations", "background_tasks")
    assert pickle.loads(pickle.dumps(info.value)).field == info.value.field


# --- uploaded_files and viewed_images ---------------------------------------------------


@keyed_reducers
def test_s2_keyed_lists_dedupe_by_path_keep_order_and_clear_on_empty(merge: Any) -> None:
    start = [{"path": "uploads/a.pdf", "size": 1}, {"path": "uploads/b.png"}]
    out = merge(start, [{"path": "uploads/c.txt"}, {"path": "uploads/a.pdf", "size": 2}])
    assert out == [
        {"path": "uploads/a.pdf", "size": 2},
        {"path": "uploads/b.png"},
        {"path": "uploads/c.txt"},
    ]
    assert merge(out, None) == out
    assert merge(out, []) == []
    with pytest.raises(InvalidStateUpdate):
        merge(out, [{"size": 1}])


@keyed_reducers
@given(start=file_lists.map(lambda fs: list({f["path"]: f for f in fs}.values())), new=file_lists)
def test_s2_keyed_lists_merge_properties(
    merge: Any, start: list[dict[str, Any]], new: list[dict[str, Any]]
) -> None:
    out = merge(start, new)
    if not new:
        assert out == []
        return
    out_paths = [r["path"] for r in out]
    assert len(out_paths) == len(set(out_paths))
    assert out_paths[: len(start)] == [r["path"] for r in start]
    assert set(out_paths) == {r["path"] for r in start} | {r["path"] for r in new}
    last = {r["path"]: r for r in new}
    assert all(r == last[r["path"]] for r in out if r["path"] in last)
    assert merge(out, new) == out


# --- messages: LangGraph's add_messages, reused -----------------------------------------


def test_s2_messages_append_replace_remove_and_remove_all() -> None:
    h1, a1 = HumanMessage("hi", id="h1"), AIMessage("hello", id="a1")
    msgs = add_messages([h1], [a1])
    assert [m.id for m in msgs] == ["h1", "a1"]
    msgs = add_messages(msgs, [AIMessage("hello again", id="a1")])
    assert [(m.id, m.text) for m in msgs] == [("h1", "hi"), ("a1", "hello again")]
    msgs = add_messages(msgs, [RemoveMessage(id="h1")])
    assert [m.id for m in msgs] == ["a1"]
    with pytest.raises(ValueError, match="doesn't exist"):
        add_messages(msgs, [RemoveMessage(id="h1")])
    kept = HumanMessage("summary tail", id="t1")
    assert add_messages(msgs, [RemoveMessage(id=REMOVE_ALL_MESSAGES), kept]) == [kept]


IDS = [f"m{i}" for i in range(5)]


@given(st.data())
def test_s2_messages_never_resurrect_a_removed_id(data: st.DataObject) -> None:
    """Against a model: after any sequence of appends, replaces, removes and remove-alls,
    exactly the ids whose last operation was a write are present, with their last content."""
    state: list[AnyMessage] = []
    alive: dict[str, str] = {}
    for step in range(data.draw(st.integers(1, 8), label="steps")):
        update: list[AnyMessage] = []
        if data.draw(st.integers(0, 5), label="remove all?") == 0:
            update.append(RemoveMessage(id=REMOVE_ALL_MESSAGES))
            alive.clear()
            # After REMOVE_ALL the rest of the update is taken as it is, not merged by id.
            fresh = data.draw(st.lists(st.sampled_from(IDS), unique=True, max_size=3))
            for i, mid in enumerate(fresh):
                update.append(HumanMessage(f"s{step}.{i}", id=mid))
                alive[mid] = f"s{step}.{i}"
        else:
            for i in range(data.draw(st.integers(0, 4), label="ops")):
                if alive and data.draw(st.booleans(), label="remove?"):
                    mid = data.draw(st.sampled_from(sorted(alive)), label="remove id")
                    update.append(RemoveMessage(id=mid))
                    del alive[mid]
                else:
                    mid = data.draw(st.sampled_from(IDS), label="write id")
                    update.append(AIMessage(f"s{step}.{i}", id=mid))
                    alive[mid] = f"s{step}.{i}"
        state = add_messages(state, update)  # type: ignore[assignment]
        assert [m.id for m in state if m.id not in alive] == []
        assert len(state) == len({m.id for m in state}) == len(alive)
        assert {m.id: m.text for m in state} == alive


@given(st.lists(st.tuples(st.sampled_from(IDS), st.text(max_size=3)), max_size=6))
def test_s2_messages_rewriting_the_same_ids_is_idempotent(writes: list[tuple[str, str]]) -> None:
    update = [AIMessage(text, id=mid) for mid, text in writes]
    once = add_messages([HumanMessage("q", id="q")], update)
    assert add_messages(once, update) == once
