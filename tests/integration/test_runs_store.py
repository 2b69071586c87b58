"""R2-R5, L1-L4 on real PostgreSQL: admission, claim, fencing, cancel, the schema."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from shared.db import make_pool
from shared.db.migrate import migrate, migrations
from shared.errors import Conflict, RunNotFound, ThreadExists, ThreadNotFound
from shared.runs import admission_store
from shared.runs.admission import AdmissionOutcome, CancelOutcome
from shared.runs.model import (
    CancelAction,
    MultitaskStrategy,
    Run,
    RunRequest,
    RunStatus,
    ThreadStatus,
)
from shared.runs.store import Admission, ClaimOutcome, RunStore
from shared.runs.thread_ids import storage_id
from shared.settings import Settings
from tests.conftest import forked_processes

OWNER = "alice"


def new_thread(store: RunStore, owner: str = OWNER) -> str:
    return store.create_thread(None, owner, {"k": "v"}, "raise").thread_id


def admit(store: RunStore, tid: str, strategy: str = "enqueue") -> Admission:
    return admit_as(store, tid, OWNER, strategy)


def admit_as(store: RunStore, tid: str, owner: str, strategy: str = "enqueue") -> Admission:
    return store.admit(
        RunRequest(thread_id=tid, assistant_id="lead_agent"),
        run_id=str(uuid.uuid4()),
        owner=owner,
        graph_id="lead_agent",
        strategy=MultitaskStrategy(strategy),
    )


def admitted(store: RunStore, tid: str, strategy: str = "enqueue") -> str:
    """The id of a run admitted on `tid` (it must be created)."""
    run = admit(store, tid, strategy).run
    assert run is not None
    return run.run_id


def claimed(store: RunStore, run_id: str, owner: str) -> Run:
    claim = store.claim(run_id, owner)
    assert claim.run is not None, claim.outcome
    return claim.run


def test_a4_threads_are_owned(store: RunStore) -> None:
    """A4: another user's thread looks exactly like a missing one."""
    tid = new_thread(store)
    assert store.get_thread(tid, OWNER).metadata == {"k": "v"}
    with pytest.raises(ThreadNotFound):
        store.get_thread(tid, "mallory")
    with pytest.raises(ThreadNotFound):
        admit_as(store, tid, "mallory")
    assert store.create_thread(tid, OWNER, {}, "do_nothing").thread_id == tid
    with pytest.raises(ThreadExists):
        store.create_thread(tid, OWNER, {}, "raise")
    # Thread ids are per owner: mallory choosing alice's id gets a thread of her own.
    theirs = store.create_thread(tid, "mallory", {}, "raise")
    assert theirs.client_id == tid and theirs.thread_id == storage_id("mallory", tid)
    assert store.get_thread(tid, OWNER).metadata == {"k": "v"}


def test_a4_client_chosen_thread_ids_are_per_owner(store: RunStore) -> None:
    """A4: a client-chosen id is stored under its owner's storage id, whoever else has it;
    the owner's own id conflicts (409 / do_nothing), resolves and searches by its public id."""
    public = str(uuid.uuid4())
    mine = store.create_thread(public, OWNER, {"who": "alice"}, "raise")
    theirs = store.create_thread(public, "mallory", {"who": "mallory"}, "raise")
    assert mine.client_id == theirs.client_id == public
    assert {mine.thread_id, theirs.thread_id} == {
        storage_id(OWNER, public),
        storage_id("mallory", public),
    }
    with pytest.raises(ThreadExists, match=public):
        store.create_thread(public, "mallory", {}, "raise")
    again = store.create_thread(public, "mallory", {"ignored": True}, "do_nothing")
    assert again.thread_id == theirs.thread_id and again.metadata == {"who": "mallory"}
    assert store.resolve_thread_id("mallory", public) == theirs.thread_id
    assert store.public_ids("mallory", [theirs.thread_id, mine.thread_id, "x"]) == {
        theirs.thread_id: public
    }
    assert store.get_thread_by_public_id(public, OWNER).metadata == {"who": "alice"}
    found = store.search_threads(
        "mallory",
        metadata={},
        status=None,
        ids=[public],
        limit=10,
        offset=0,
        sort_by="thread_id",
        sort_order="asc",
    )
    assert [t.thread_id for t in found] == [theirs.thread_id]
    # A server-made id has one id for both; choosing it again meets only that owner's own.
    made = store.create_thread(None, OWNER, {}, "raise")
    assert made.thread_id == made.client_id == store.resolve_thread_id(OWNER, made.thread_id)
    with pytest.raises(ThreadExists):
        store.create_thread(made.thread_id, OWNER, {}, "raise")
    assert store.create_thread(made.thread_id, OWNER, {}, "do_nothing").thread_id == made.thread_id
    # A missing id resolves to where it would be stored: 404 there, or created there.
    fresh = str(uuid.uuid4())
    where = store.resolve_thread_id("mallory", fresh)
    assert where == storage_id("mallory", fresh)
    with pytest.raises(ThreadNotFound):
        store.get_thread(where, "mallory")
    admission = store.admit(
        RunRequest(
            thread_id=where, assistant_id="lead_agent", create_thread=True, public_thread_id=fresh
        ),
        run_id=str(uuid.uuid4()),
        owner="mallory",
        graph_id="lead_agent",
        strategy=MultitaskStrategy.ENQUEUE,
    )
    assert admission.run is not None and admission.run.thread_id == where
    assert store.get_thread_by_public_id(fresh, "mallory").thread_id == where
    assert store.get_run_by_id(admission.run.run_id).thread_public_id == fresh  # type: ignore[union-attr]


def test_r3_reject_then_enqueue_fifo(store: RunStore) -> None:
    """R3: reject answers a busy thread; enqueue waits FIFO; only the head is dispatched."""
    tid = new_thread(store)
    first = admit(store, tid, "reject")
    assert first.run is not None
    assert first.decision.outcome is AdmissionOutcome.DISPATCH and first.dispatch == [
        first.run.run_id
    ]
    assert admit(store, tid, "reject").run is None
    second = admit(store, tid)
    third = admit(store, tid)
    assert second.run is not None and third.run is not None
    assert second.dispatch == [] and third.dispatch == []
    assert store.get_thread(tid, OWNER).status == "busy"
    # The queued runs cannot be claimed before the head.
    assert store.claim(second.run.run_id, "w1").outcome is ClaimOutcome.NOT_HEAD
    head = store.claim(first.run.run_id, "w1")
    assert head.outcome is ClaimOutcome.CLAIMED and head.run is not None
    assert head.run.user_id == OWNER
    fin = store.finish(
        first.run.run_id,
        tid,
        head.run.owner_epoch,
        status=RunStatus.SUCCESS,
        error=None,
        thread_status=ThreadStatus.IDLE,
    )
    assert fin.next_run_id == second.run.run_id
    claim2 = store.claim(fin.next_run_id, "w1")
    assert claim2.outcome is ClaimOutcome.CLAIMED and claim2.run is not None
    fin2 = store.finish(
        fin.next_run_id,
        tid,
        claim2.run.owner_epoch,
        status=RunStatus.SUCCESS,
        error=None,
        thread_status=ThreadStatus.IDLE,
    )
    assert fin2.next_run_id == third.run.run_id
    claim3 = claimed(store, fin2.next_run_id, "w1")
    store.finish(
        fin2.next_run_id,
        tid,
        claim3.owner_epoch,
        status=RunStatus.ERROR,
        error={"error": "X"},
        thread_status=ThreadStatus.ERROR,
    )
    assert store.get_thread(tid, OWNER).status == "error"


def test_l3_duplicate_claim_does_not_start_a_second_executor(store: RunStore) -> None:
    """L3: a second delivery of the same run cannot claim it."""
    tid = new_thread(store)
    run_id = admitted(store, tid)
    assert store.claim(run_id, "w1").outcome is ClaimOutcome.CLAIMED
    assert store.claim(run_id, "w2").outcome is ClaimOutcome.NOT_PENDING


def test_l2_stale_epoch_cannot_finish(store: RunStore) -> None:
    """L2/L4: after the reaper re-queues a run and another worker claims it, the old owner is fenced."""
    tid = new_thread(store)
    run_id = admitted(store, tid)
    old = claimed(store, run_id, "old")
    assert store.requeue(run_id, old.owner_epoch, "lease expired")
    new = claimed(store, run_id, "new")
    assert new.owner_epoch == old.owner_epoch + 1 and new.attempt == 2
    success, idle = RunStatus.SUCCESS, ThreadStatus.IDLE
    assert store.finish(
        run_id, tid, old.owner_epoch, status=success, error=None, thread_status=idle
    ).fenced
    assert not store.finish(
        run_id, tid, new.owner_epoch, status=success, error=None, thread_status=idle
    ).fenced
    kinds = [e["type"] for e in store.run_events(run_id)]
    assert kinds == ["created", "claimed", "requeued", "claimed", "fenced", "success"]
    # R1: a terminal status never changes again.
    assert store.finish(
        run_id, tid, new.owner_epoch, status=RunStatus.ERROR, error=None, thread_status=idle
    ).fenced
    assert store.run_status(run_id) is RunStatus.SUCCESS


def test_l5_max_attempts_ends_in_error(store: RunStore) -> None:
    """L5: after max_attempts the reaper ends the run `error` with the reason."""
    tid = new_thread(store)
    run_id = admitted(store, tid)
    run = claimed(store, run_id, "w")
    for _ in range(2):
        assert store.requeue(run_id, run.owner_epoch, "lease expired")
        run = claimed(store, run_id, "w")
    assert run.attempt == 3
    expired = store.fail_expired(run_id, run.owner_epoch, "reaper", "lease expired")
    assert expired is not None and expired.epoch == run.owner_epoch + 1
    assert expired.user_id == OWNER  # whose active-run slot the reaper frees
    # The dead owner is fenced from now on; a second reaper pass changes nothing.
    assert store.fail_expired(run_id, run.owner_epoch, "reaper", "lease expired") is None
    ended = store.get_run(tid, run_id, OWNER)
    assert ended.status is RunStatus.ERROR
    assert ended.error is not None and "lease expired" in ended.error["message"]


def test_r3_one_running_run_per_thread_is_enforced_by_the_database(
    store: RunStore, pool: ConnectionPool
) -> None:
    """R3: even a buggy writer cannot make two runs of a thread `running`."""
    tid = new_thread(store)
    a = admitted(store, tid)
    b = admitted(store, tid)
    store.claim(a, "w")
    with pool.connection() as conn, pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute("UPDATE runs SET status = 'running' WHERE run_id = %s", (b,))


def test_r5_cancel_pending_and_running(store: RunStore) -> None:
    """R5: a pending run is interrupted at once and the next one dispatched; a running one is flagged."""
    tid = new_thread(store)
    a = admitted(store, tid)
    b = admitted(store, tid)
    c = admitted(store, tid)
    interrupt = CancelAction.INTERRUPT
    assert store.request_cancel(tid, b, OWNER, interrupt) == (CancelOutcome.CANCELLED, None)
    run_a = claimed(store, a, "w")
    assert store.request_cancel(tid, a, OWNER, interrupt) == (CancelOutcome.REQUESTED, None)
    assert store.request_cancel(tid, a, OWNER, interrupt) == (
        CancelOutcome.ALREADY_REQUESTED,
        None,
    )
    fin = store.finish(
        a,
        tid,
        run_a.owner_epoch,
        status=RunStatus.INTERRUPTED,
        error=None,
        thread_status=ThreadStatus.IDLE,
    )
    assert fin.next_run_id == c
    assert store.request_cancel(tid, a, OWNER, interrupt) == (CancelOutcome.ALREADY_DONE, None)
    with pytest.raises(RunNotFound):
        store.request_cancel(tid, a, "mallory", interrupt)
    with pytest.raises(Conflict):
        store.delete_run(tid, c, OWNER)


def test_r3_interrupt_strategy_cancels_inflight(store: RunStore) -> None:
    """R3: interrupt cancels the running run (flag) and pending ones (at once); the new run waits."""
    tid = new_thread(store)
    a = admitted(store, tid)
    store.claim(a, "w")
    b = admitted(store, tid)
    adm = admit(store, tid, "interrupt")
    assert adm.cancel_running == [a] and adm.dispatch == []
    assert store.run_status(b) is RunStatus.INTERRUPTED


def test_r3_interrupt_of_pending_only_dispatches_now(store: RunStore) -> None:
    """R3: interrupt on a thread whose inflight runs are all pending ends them at once, so
    the new run is the head and is dispatched right away."""
    tid = new_thread(store)
    b = admitted(store, tid)  # the dispatched head, not claimed yet: pending
    c = admitted(store, tid)  # queued behind b
    adm = admit(store, tid, "interrupt")
    assert adm.run is not None and adm.decision.dispatch_now
    assert adm.cancel_running == [] and adm.dispatch == [adm.run.run_id]
    assert store.run_status(b) is RunStatus.INTERRUPTED
    assert store.run_status(c) is RunStatus.INTERRUPTED
    assert store.claim(adm.run.run_id, "w").outcome is ClaimOutcome.CLAIMED


def test_r3_rollback_strategy_flags_runs_with_progress(store: RunStore) -> None:
    """R3, R5: rollback flags the running run for rollback, ends a never-started pending run at
    once, and keeps a requeued run (one that already ran) pending with the rollback request,
    so the attempt that claims it restores the pre-run state instead of running."""
    tid = new_thread(store)
    a = admitted(store, tid)
    run_a = claimed(store, a, "w")
    b = admitted(store, tid)
    adm = admit(store, tid, "rollback")
    assert (
        adm.cancel_running == [a]
        and adm.cancel_action is CancelAction.ROLLBACK
        and adm.dispatch == []
    )
    assert store.run_status(b) is RunStatus.INTERRUPTED
    flagged = store.get_run_by_id(a)
    assert flagged is not None and flagged.cancel_action is CancelAction.ROLLBACK
    # A requeued run (its worker died) is pending with progress: it keeps a rollback request.
    tid2 = new_thread(store)
    c = admitted(store, tid2)
    run_c = claimed(store, c, "w")
    assert store.requeue(c, run_c.owner_epoch, "worker died")
    assert store.request_cancel(tid2, c, OWNER, CancelAction.ROLLBACK) == (
        CancelOutcome.REQUESTED,
        None,
    )
    run = store.get_run_by_id(c)
    assert run is not None and (run.status, run.cancel_action) == ("pending", "rollback")
    again = store.claim(c, "w2").run
    assert again is not None and again.cancel_action is CancelAction.ROLLBACK
    store.finish(
        a,
        tid,
        run_a.owner_epoch,
        status=RunStatus.INTERRUPTED,
        error=None,
        thread_status=ThreadStatus.IDLE,
    )


def _admit_in_child(args: tuple[str, str, str, Any]) -> str:
    dsn, tid, strategy, barrier = args
    settings = Settings(database_url=dsn)  # type: ignore[arg-type]
    pool = make_pool(settings, name="child", max_size=1)
    try:
        barrier.wait(timeout=30)
        adm = admit(RunStore(pool), tid, strategy)
        return adm.decision.outcome.value
    finally:
        pool.close()


@pytest.mark.parametrize("strategy", ["reject", "enqueue"])
def test_r2_concurrent_admissions_from_processes(
    store: RunStore, settings: Settings, strategy: str
) -> None:
    """R2: 8 processes admit on one thread at once: under reject exactly one becomes inflight."""
    tid = new_thread(store)
    n = 8
    ctx = forked_processes()
    with ctx.Manager() as manager:
        barrier = manager.Barrier(n)
        with ctx.Pool(n) as procs:
            outcomes = procs.map(_admit_in_child, [(settings.dsn, tid, strategy, barrier)] * n)
    runs = store.list_runs(tid, OWNER, limit=100, offset=0, status=None)
    if strategy == "reject":
        assert sorted(outcomes).count("dispatch") == 1 and outcomes.count("rejected") == n - 1
        assert len(runs) == 1
    else:
        assert outcomes.count("dispatch") == 1 and outcomes.count("queued") == n - 1
        assert len(runs) == n


def test_migrations_are_contiguous_and_idempotent(settings: Settings, pool: ConnectionPool) -> None:
    """The migrated schema has every table; running migrate again applies nothing."""
    assert [m.version for m in migrations()] == list(range(1, len(migrations()) + 1))
    assert migrate(settings) == []
    with pool.connection() as conn:
        tables = {
            r["tablename"]
            for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        }
        versions = [
            r["version"]
            for r in conn.execute("SELECT version FROM threadrun_schema_version ORDER BY 1")
        ]
    assert {"threads", "runs", "run_events", "checkpoints", "checkpoint_writes"} <= tables
    assert versions == [m.version for m in migrations()]


def _delayed(store: RunStore, tid: str, after_s: float) -> Admission:
    return store.admit(
        RunRequest(thread_id=tid, assistant_id="lead_agent", after_seconds=after_s),
        run_id=str(uuid.uuid4()),
        owner=OWNER,
        graph_id="lead_agent",
        strategy=MultitaskStrategy.ENQUEUE,
    )


def test_r4_a_delayed_run_is_not_dispatched_or_claimed_before_it_is_due(
    store: RunStore, pool: ConnectionPool
) -> None:
    """R4: a delayed run is pending with its due time; nothing dispatches or claims it
    early (a duplicate message is refused as not-the-head), and the reaper's query returns
    it once due, exactly once per stale interval."""
    tid = new_thread(store)
    adm = _delayed(store, tid, 3600)
    run = adm.run
    assert run is not None and adm.dispatch == [] and run.status is RunStatus.PENDING
    assert run.due_at is not None and run.dispatched_at is None
    assert store.claim(run.run_id, "w1").outcome is ClaimOutcome.NOT_HEAD
    assert run.run_id not in store.stale_pending_heads(0.0)
    with pool.connection() as conn:  # the due time passes
        conn.execute(
            "UPDATE runs SET due_at = now() - interval '1 second' WHERE run_id = %s", (run.run_id,)
        )
    assert run.run_id in store.stale_pending_heads(60.0)
    assert run.run_id not in store.stale_pending_heads(60.0)  # dispatched: not again
    assert claimed(store, run.run_id, "w1").attempt == 1


def test_r4_a_delayed_run_behind_a_finishing_run_keeps_the_thread_busy(
    store: RunStore,
) -> None:
    """R4: when the run before it ends, a not-yet-due delayed run is not dispatched and the
    thread stays busy (the reaper dispatches it when due); a cancel ends it at once."""
    tid = new_thread(store)
    first = admitted(store, tid)
    delayed = _delayed(store, tid, 3600).run
    assert delayed is not None
    run = claimed(store, first, "w1")
    fin = store.finish(
        first,
        tid,
        run.owner_epoch,
        status=RunStatus.SUCCESS,
        error=None,
        thread_status=ThreadStatus.IDLE,
    )
    assert not fin.fenced and fin.next_run_id is None
    assert store.get_thread(tid, OWNER).status is ThreadStatus.BUSY
    outcome, nxt = store.request_cancel(tid, delayed.run_id, OWNER, CancelAction.INTERRUPT)
    assert outcome is CancelOutcome.CANCELLED and nxt is None
    assert store.get_run(tid, delayed.run_id, OWNER).status is RunStatus.INTERRUPTED
    assert store.get_thread(tid, OWNER).status is ThreadStatus.IDLE


def test_a4_ended_among_reads_every_member_in_one_query(store: RunStore) -> None:
    """A4: the active-run limit's prune asks once which members have ended:
    terminal runs, runs that are gone and ids that are no run at all; pending and running
    runs are not among them."""
    tid = new_thread(store)
    done = admitted(store, tid)
    run = claimed(store, done, "w")
    store.finish(
        done,
        tid,
        run.owner_epoch,
        status=RunStatus.SUCCESS,
        error=None,
        thread_status=ThreadStatus.IDLE,
    )
    running = admitted(store, tid)
    claimed(store, running, "w")
    pending = admitted(store, tid)
    gone, junk = str(uuid.uuid4()), "not-a-run"
    assert store.ended_among([done, running, pending, gone, junk]) == {done, gone, junk}
    assert store.ended_among([]) == set()


def test_r3_r5_interrupt_of_a_run_claimed_meanwhile_asks_its_owner(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R3/R5: an admission with `interrupt` read the thread's head as pending, and a worker
    claimed it before the admission wrote (a claim takes no thread lock). The head is then
    running: its owner is asked to stop (one outcome), instead of the run being journaled
    `interrupted` while it ran on to `success` with the cancel lost (found by a chaos run)."""
    tid = new_thread(store)
    head = admitted(store, tid)
    real_decide = admission_store.decide

    def decide_after_a_claim(*args: Any, **kwargs: Any) -> Any:
        decision = real_decide(*args, **kwargs)
        claimed(store, head, "w")  # another connection: commits while the admission waits
        return decision

    monkeypatch.setattr(admission_store, "decide", decide_after_a_claim)
    adm = admit(store, tid, "interrupt")
    monkeypatch.undo()
    assert adm.run is not None
    assert adm.cancel_running == [head] and adm.ended == ()
    run = store.get_run(tid, head, OWNER)
    assert run.status is RunStatus.RUNNING and run.cancel_action is CancelAction.INTERRUPT
    kinds = [e["type"] for e in store.run_events(head) if e["category"] == "lifecycle"]
    assert kinds == ["created", "claimed", "cancel_requested"]
    # The new run waits for the head: its claim is refused until the head has ended.
    assert store.claim(adm.run.run_id, "w2").outcome is ClaimOutcome.NOT_HEAD
