"""The checker: the workload's history, the nemesis's faults and the final PostgreSQL/Redis
state against the run invariants.

Invariants (each anomaly names its run):

- `terminal`: every admitted run (a row in `runs`, or a run id a client was given) ends in
  exactly one terminal status: a terminal row status and exactly one terminal `lifecycle`
  audit event; the status an `end` frame announced is the committed one (A1, L2, R8).
- `stuck`: no run is pending/running after heal + recovery without a live owner (a worker
  process of ours holding the run's Redis lease) (L4, R4); and every client of the workload
  finished its loop: a client still busy when the workload had to end (hung on a stream, a
  status poll, a request) is one anomaly naming the client, its run and thread, what it was
  doing and its last observations (`stuck_clients`).
- `single_writer`: no two attempts' writes both in the state: a run's checkpoints, ordered by
  id (time-ordered), never go back from attempt n+1 to attempt n; the terminal lifecycle
  event was written by the run's current epoch; at most one delivery receipt per attempt and
  none from an attempt the run never reached; no message chunk on a stream carries another
  attempt than the last `metadata` before it; no answer appears twice in a thread's state
  (L2, L5, J5).
- `checkpoints`: every checkpoint seen committed (the harness's snapshots of the table, the
  clients' state reloads) is still there at the end.
- `tokens`: within one attempt a client sees each token at most once and in order, and for a
  run that succeeded it saw the whole answer in one attempt, or an explicit `gap` followed by
  a state reload holding the complete answer (B4, B5, B9); the answer in the state after the
  run is complete.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis
from psycopg.rows import dict_row

from shared.redis_keys import Keys

TERMINAL = ("success", "error", "timeout", "interrupted")
HEAD_TOKENS = 5
INVARIANTS = ("terminal", "stuck", "single_writer", "checkpoints", "tokens")


@dataclass
class Anomaly:
    invariant: str
    run_id: str
    detail: str


@dataclass
class Report:
    anomalies: list[Anomaly] = field(default_factory=list)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)
    checkpoints_checked: int = 0
    workload_end: str | None = None
    """How the workload ended when it did not finish by itself (None: it did)."""

    def add(self, invariant: str, run_id: str, detail: str) -> None:
        self.anomalies.append(Anomaly(invariant, run_id, detail))

    @property
    def failed_runs(self) -> set[str]:
        return {a.run_id for a in self.anomalies}

    def passed_failed(self) -> tuple[int, int]:
        """Runs without an anomaly, and runs (or checkpoints of no known run, hung clients
        between runs, a workload that never finished) with one."""
        bad = self.failed_runs
        return len(set(self.runs) - bad), len(bad)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a kill
    return out


def db_state(
    dsn: str,
) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]], list[dict[str, Any]]]:
    """Runs (with epoch timestamps), terminal lifecycle events per run, checkpoints."""
    with psycopg.connect(dsn, row_factory=dict_row, autocommit=True) as conn:
        runs = conn.execute(
            "SELECT run_id::text, thread_id::text, status, owner, owner_epoch, attempt,"
            " extract(epoch FROM created_at)::float8 AS created,"
            " extract(epoch FROM ended_at)::float8 AS ended FROM runs"
        ).fetchall()
        events = conn.execute(
            "SELECT run_id::text, type, (payload->>'epoch')::bigint AS epoch FROM run_events"
            " WHERE category = 'lifecycle' AND type = ANY(%s) ORDER BY run_id, seq",
            (list(TERMINAL),),
        ).fetchall()
        receipts = conn.execute(
            "SELECT run_id::text, (payload->>'attempt')::int AS attempt FROM run_events"
            " WHERE category = 'delivery' AND type = 'run.delivery'"
        ).fetchall()
        cps = conn.execute(
            "SELECT thread_id::text, checkpoint_id, metadata->>'run_id' AS run_id,"
            " (metadata->>'attempt')::int AS attempt FROM checkpoints WHERE checkpoint_ns = ''"
        ).fetchall()
    terminal: dict[str, list[str]] = defaultdict(list)
    by_run = {r["run_id"]: r for r in runs}
    for e in events:
        terminal[e["run_id"]].append(e["type"])
        row = by_run.get(e["run_id"])
        if row is not None and e["epoch"] is not None:
            row.setdefault("terminal_epochs", []).append((e["type"], e["epoch"]))
    for rc in receipts:
        row = by_run.get(rc["run_id"])
        if row is not None:
            row.setdefault("receipts", []).append(rc["attempt"])
    return by_run, terminal, cps


def describe(h: dict[str, Any]) -> str:
    """One history line, short: `ev messages/partial 1733-0 (attempt 1)`, `drop (why)`."""
    k = h.get("k")
    if k == "ev":
        return f"ev {h.get('ev')} {h.get('id')} (attempt {h.get('att')})"
    if k == "drop":
        return f"drop ({str(h.get('why'))[:80]})"
    if k in ("final", "end") and h.get("status"):
        return f"{k} {h['status']}"
    if k in ("client_error", "create_error"):
        return f"{k} ({str(h.get('error'))[:80]})"
    if k == "state":
        return f"state ({h.get('why')}) checkpoint {h.get('checkpoint')}"
    return str(k)


def stuck_clients(
    history: list[dict[str, Any]],
    runs: dict[str, dict[str, Any]],
    workload_end: str | None,
    last_n: int = 3,
) -> list[Anomaly]:
    """The `stuck` anomalies of clients that never finished their loop (a `client_start`
    without its `client_done`), from the history alone plus each run's final status.

    `workload_end` says how the workload ended when it did not finish by itself (timed out
    and killed, or its exit code); with it and no unfinished client in the history (it
    died before writing them), one anomaly names the workload."""
    started: list[str] = []
    done: set[str] = set()
    hung: dict[str, dict[str, Any]] = {}
    seen: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for h in history:
        c, k = h.get("c"), h.get("k")
        if k == "client_start" and c not in started:
            started.append(c)
        elif k == "client_done":
            done.add(c)
        elif k == "hung":
            hung[c] = h
        elif k != "client_start":
            seen[c].append(h)
    out: list[Anomaly] = []
    why = workload_end or "the workload ended without it"
    for c in started:
        if c in done:
            continue
        rec = hung.get(c, {})
        mine = seen[c]
        run_id = rec.get("run") or next((h["run"] for h in reversed(mine) if h.get("run")), None)
        tid = rec.get("thread") or next(
            (h["thread"] for h in reversed(mine) if h.get("thread")), None
        )
        status = runs.get(run_id, {}).get("status") if run_id else None
        parts = [f"client {c} never finished its loop ({why})"]
        if rec:
            busy = rec.get("t", 0.0) - rec.get("since", 0.0)
            parts.append(f"busy with '{rec.get('phase')}' for {busy:.0f} s")
        parts.append(f"run {run_id} (status {status}), thread {tid}")
        if rec.get("last"):
            parts.append(f"last event id {rec['last']}")
        last = [describe(h) for h in mine[-last_n:]]
        parts.append("last seen: " + ("; ".join(last) if last else "nothing"))
        out.append(Anomaly("stuck", run_id or f"client {c}", ", ".join(parts)))
    if workload_end and not out:
        out.append(Anomaly("stuck", "workload", f"the workload did not finish: {workload_end}"))
    return out


def check(
    history: list[dict[str, Any]],
    faults: list[dict[str, Any]],
    snapshots: Iterable[tuple[str, str]],
    dsn: str,
    redis_url: str,
    prefix: str,
    live_worker_pids: set[int],
    workload_end: str | None = None,
) -> Report:
    """Every invariant; `workload_end` says how the workload ended when it did not finish by
    itself (see `stuck_clients`)."""
    rep = Report(faults=faults, workload_end=workload_end)
    runs, terminal, cps = db_state(dsn)
    rep.runs = runs
    created = {h["run"]: h for h in history if h["k"] == "create"}

    # --- terminal ---------------------------------------------------------------------------
    for run_id in created.keys() - runs.keys():
        rep.add("terminal", run_id, "a client was given this run id; no such run in the database")
        rep.runs[run_id] = {
            "run_id": run_id,
            "status": None,
            "created": created[run_id]["t"],
            "ended": None,
        }
    ends: dict[str, set[str]] = defaultdict(set)
    for h in history:
        if h["k"] == "end" and h.get("status"):
            ends[h["run"]].add(h["status"])
    r = redis.Redis.from_url(redis_url, socket_timeout=5)
    keys = Keys(prefix)
    try:
        for run_id, row in runs.items():
            status = row["status"]
            kinds = terminal.get(run_id, [])
            if status in TERMINAL:
                if len(kinds) != 1:
                    rep.add(
                        "terminal", run_id, f"status {status} but terminal lifecycle events {kinds}"
                    )
                elif kinds[0] != status:
                    rep.add(
                        "terminal", run_id, f"status {status} but the lifecycle says {kinds[0]}"
                    )
                if ends[run_id] - {status}:
                    rep.add(
                        "terminal",
                        run_id,
                        f"an end frame said {sorted(ends[run_id])}, committed {status}",
                    )
                continue
            lease = r.get(keys.lease(run_id))
            owner_pid = int(row["owner"].split(":")[1]) if row["owner"] else None
            live = lease is not None and owner_pid in live_worker_pids
            what = "stuck" if not live else "terminal"
            rep.add(
                what, run_id, f"{status} after recovery (owner {row['owner']}, lease {lease!r})"
            )
    finally:
        r.close()
    rep.anomalies.extend(stuck_clients(history, rep.runs, workload_end))

    # --- single writer: checkpoints ---------------------------------------------------------
    per_run: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for cp in cps:
        if cp["run_id"] and cp["attempt"] is not None:
            per_run[cp["run_id"]].append((cp["checkpoint_id"], cp["attempt"]))
    for run_id, items in per_run.items():
        items.sort()
        top = 0
        for cid, att in items:
            if att < top:
                rep.add(
                    "single_writer",
                    run_id,
                    f"checkpoint {cid} of attempt {att} after attempt {top}'s",
                )
                break
            top = max(top, att)
        row = runs.get(run_id)
        if row is not None and top > row["attempt"]:
            rep.add(
                "single_writer",
                run_id,
                f"a checkpoint of attempt {top} > the run's attempt {row['attempt']}",
            )

    # --- single writer: the terminal write and the receipts (L2, J5) ------------------------
    for run_id, row in runs.items():
        # the reaper ends a run out of attempts fenced by the old epoch and takes epoch + 1
        current = row["owner_epoch"]
        stale = [
            e
            for kind, e in row.get("terminal_epochs", [])
            if e != current and not (kind == "error" and e == current - 1)
        ]
        if stale:
            rep.add(
                "single_writer",
                run_id,
                f"terminal status written by epoch {stale}, owner epoch {row['owner_epoch']}",
            )
        atts = row.get("receipts", [])
        if len(atts) != len(set(atts)) or any(a > row["attempt"] for a in atts):
            rep.add(
                "single_writer",
                run_id,
                f"delivery receipts of attempts {sorted(atts)}, the run's attempt is {row['attempt']}",
            )

    # --- checkpoints durable ----------------------------------------------------------------
    present = {(c["thread_id"], c["checkpoint_id"]) for c in cps}
    seen = set(snapshots)
    seen |= {
        (h["thread"], h["checkpoint"]) for h in history if h["k"] == "state" and h.get("checkpoint")
    }
    rep.checkpoints_checked = len(seen)
    for tid, cid in sorted(seen - present):
        owner = next(
            (h["run"] for h in history if h["k"] == "state" and h.get("checkpoint") == cid), "?"
        )
        rep.add("checkpoints", owner, f"checkpoint {cid} of thread {tid} was committed and is gone")

    # --- tokens and stream attempts ---------------------------------------------------------
    views: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for h in history:
        if h["k"] in ("ev", "gap", "end", "drop", "gave_up"):
            views[(h["c"], h["run"])].append(h)
    states = [h for h in history if h["k"] == "state"]
    for (client, run_id), items in views.items():
        meta = created.get(run_id, {})
        n = meta.get("tokens")
        want = list(range(HEAD_TOKENS, n)) if n else None
        segs: dict[Any, list[int]] = defaultdict(list)
        gapped = False
        for h in items:
            if h["k"] == "gap":
                gapped = True
            if h["k"] != "ev":
                continue
            if h.get("catt") is not None and h.get("att") is not None and h["catt"] != h["att"]:
                rep.add(
                    "single_writer",
                    run_id,
                    f"{client}: a chunk of attempt {h['catt']} after attempt {h['att']}'s metadata (event {h['id']})",
                )
            segs[h.get("att")].extend(h.get("tok") or [])
        for att, toks in segs.items():
            if any(b <= a for a, b in zip(toks, toks[1:], strict=False)):
                dup = sorted({t for t in toks if toks.count(t) > 1})[:5]
                rep.add(
                    "tokens", run_id, f"{client}: attempt {att} tokens repeated or reordered {dup}"
                )
        status = runs.get(run_id, {}).get("status")
        if status != "success" or want is None or any(h["k"] == "gave_up" for h in items):
            continue
        if any(toks == want for toks in segs.values()):
            continue
        word = meta.get("word")
        reloaded = [
            a for s in states if s["run"] == run_id and s["c"] == client and s["why"] == "gap"
            for a in s["answers"] if a["word"] == word
        ]  # fmt: skip
        if gapped and any(a["tok"] == want for a in reloaded):
            continue
        rep.add("tokens", run_id, f"{client}: {missing_tokens(segs, want, gapped)}")

    # --- answers in the state after the run -------------------------------------------------
    for s in states:
        meta = created.get(s["run"], {})
        words = [a["word"] for a in s["answers"]]
        dups = sorted({w for w in words if w and words.count(w) > 1})
        if dups:
            rep.add(
                "single_writer",
                s["run"],
                f"thread {s['thread']}: answers {dups} twice in the state",
            )
        if (
            s["why"] == "final"
            and runs.get(s["run"], {}).get("status") == "success"
            and meta.get("tokens")
        ):
            want = list(range(HEAD_TOKENS, meta["tokens"]))
            mine = [a for a in s["answers"] if a["word"] == meta["word"]]
            if not mine or mine[-1]["tok"] != want:
                rep.add(
                    "tokens",
                    s["run"],
                    f"the state after success holds {len(mine[-1]['tok']) if mine else 'no'} of {len(want)} tokens",
                )
    return rep


def missing_tokens(segs: dict[Any, list[int]], want: list[int], gapped: bool) -> str:
    """Why a successful run's answer was not seen whole: per attempt, the tokens seen; a
    resumed attempt that streamed none of the rest is the lost-tail hole (no `gap`)."""
    seen = ", ".join(
        f"attempt {att}: {len(toks)} tokens" + (f" (last t{toks[-1]:04d})" if toks else "")
        for att, toks in sorted(segs.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))
    )
    atts = sorted(a for a in segs if isinstance(a, int))
    hole = len(atts) > 1 and not segs[atts[-1]] and len(segs[atts[-2]]) < len(want)
    what = (
        "HOLE AT RESUME: the resumed attempt streamed no token (it resumed after the model"
        " step), the earlier attempt's tail never reached the stream, and no gap was sent"
        if hole
        else "incomplete"
    )
    return f"success, {len(want)} tokens wanted; saw {seen}; gap: {gapped}: {what}"


# --- the table ---------------------------------------------------------------------------------
def percentile(xs: list[float], p: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))
    return xs[k]


def affected(run: dict[str, Any], f: dict[str, Any], now: float) -> bool:
    end = run.get("ended") or now
    return bool(run.get("created")) and run["created"] <= f["heal"] and end >= f["start"]


def table(rep: Report, now: float) -> str:
    by_run: dict[str, list[Anomaly]] = defaultdict(list)
    for a in rep.anomalies:
        by_run[a.run_id].append(a)
    kinds = sorted({f["kind"] for f in rep.faults})
    rows = []
    touched: set[str] = set()
    for kind in kinds:
        fs = [f for f in rep.faults if f["kind"] == kind and f["heal"]]
        hit: set[str] = set()
        rec: list[float] = []
        for f in fs:
            mine = {rid for rid, r in rep.runs.items() if affected(r, f, now)}
            hit |= mine
            inflight = [
                r
                for rid, r in rep.runs.items()
                if rid in mine and (r.get("ended") or now) > f["heal"]
            ]
            rec.append(max([(r.get("ended") or now) - f["heal"] for r in inflight], default=0.0))
        touched |= hit
        n_anom = sum(len(by_run[rid]) for rid in hit)
        rows.append(
            [
                kind,
                str(len(fs)),
                str(len(hit)),
                str(n_anom),
                f"{percentile(rec, 50):.1f}",
                f"{max(rec, default=0):.1f}",
            ]
        )
    rest = set(rep.runs) - touched
    rows.append(
        ["(no fault)", "-", str(len(rest)), str(sum(len(by_run[r]) for r in rest)), "-", "-"]
    )
    header = ["fault", "n", "runs affected", "anomalies", "recovery p50 s", "recovery max s"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(vals: list[str]) -> str:
        return "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def summary(rep: Report, now: float) -> str:
    counts = {inv: 0 for inv in INVARIANTS}
    for a in rep.anomalies:
        counts[a.invariant] += 1
    statuses: dict[str, int] = defaultdict(int)
    for r in rep.runs.values():
        statuses[str(r.get("status"))] += 1
    lines = [table(rep, now), ""]
    lines.append("runs by status: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())))
    lines.append(f"checkpoints seen committed and checked: {rep.checkpoints_checked}")
    if rep.workload_end:
        lines.append(f"workload: {rep.workload_end}")
    lines.append(
        "invariants: "
        + ", ".join(f"{k} {'ok' if v == 0 else f'{v} anomalies'}" for k, v in counts.items())
    )
    for a in rep.anomalies[:40]:
        lines.append(f"  ANOMALY {a.invariant} run {a.run_id}: {a.detail}")
    if len(rep.anomalies) > 40:
        lines.append(f"  ... {len(rep.anomalies) - 40} more")
    passed, failed = rep.passed_failed()
    lines.append(f"{passed} passed, {failed} failed")
    return "\n".join(lines)
