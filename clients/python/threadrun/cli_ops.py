"""Ops subcommands of `threadrun`: status, runs, workers, queues (the server's HTTP ops API).

    threadrun status                          # runs by status, stuck, queues, workers, memory
    threadrun runs list [--status S] [--limit N]
    threadrun runs show <run_id>
    threadrun runs cancel <run_id> [--action interrupt|rollback]
    threadrun runs requeue <run_id> [--reason TEXT]
    threadrun runs failures [--hours H] [--limit N]
    threadrun workers
    threadrun queues

They call the server's ops API (`/ops/api/...`) with an ops-role key (THREADRUN_URL,
THREADRUN_API_KEY), so actions are audited under that key's user. `--json` prints the
server's document instead of the table. A <run_id> may be any unique prefix of the id
(e.g. the 8 characters the ops page shows): it is resolved through the server
(`/ops/api/runs?prefix=`), and an ambiguous one is refused with its candidates listed.
Exit status: 0 done; 1 refused (e.g. a requeue of a run whose lease is held) or failed. `threadrun migrate` comes with the server (it talks to
PostgreSQL directly): see threadrun/cli.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any, TextIO
from urllib.parse import quote

import httpx

from threadrun.client import ServerUnreachableError, ThreadrunClientError, default_url

EXIT_OK, EXIT_FAILED = 0, 1
TIMEOUT_S = 30.0

AddParser = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


class OpsError(ThreadrunClientError):
    """The server refused or failed a request."""


def server_options(api_key_help: str = "API key") -> argparse.ArgumentParser:
    """--url and --api-key, shared by every subcommand that talks to a server (a parent
    parser; the chat options of threadrun/cli.py build on it)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--url",
        default=default_url(),
        help="server base URL (env THREADRUN_URL, else THREADRUN_HOST/THREADRUN_PORT;"
        " default %(default)s)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("THREADRUN_API_KEY"),
        help=f"{api_key_help} (env THREADRUN_API_KEY)",
    )
    return p


def _options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, parents=[server_options("an ops-role API key")])
    p.add_argument("--json", action="store_true", help="print the server's JSON document")
    return p


def _call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    headers = {"x-api-key": args.api_key} if args.api_key else {}
    try:
        res = httpx.request(
            method, args.url.rstrip("/") + path, json=body, headers=headers, timeout=TIMEOUT_S
        )
    except httpx.HTTPError as exc:
        raise OpsError(
            str(ServerUnreachableError(args.url, f"{type(exc).__name__}: {exc}"))
        ) from exc
    try:
        doc = res.json()
    except ValueError:
        doc = {"message": res.text[:500]}
    if res.status_code >= 400 and res.status_code != 409:
        raise OpsError(f"{res.status_code}: {doc.get('message') or doc}")
    return res.status_code, doc


def _table(rows: list[list[Any]], header: list[str], out: TextIO) -> None:
    cells = [[str("-" if v is None else v) for v in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for row in cells:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")


def _dump(doc: Any, out: TextIO) -> None:
    out.write(json.dumps(doc, indent=2, default=str) + "\n")


def _age(ts: str | None) -> str:
    if not ts:
        return "-"
    from datetime import datetime

    return f"{time.time() - datetime.fromisoformat(ts).timestamp():.0f}s"


PREFIX_CANDIDATES = 10
"""Candidates asked for when resolving a prefix (and listed when it is ambiguous)."""


def resolve_run_id(args: argparse.Namespace, text: str) -> str:
    """The full run id for `text`: a whole id as it is, else the one run whose id starts
    with it. No match, or more than one, is an OpsError naming the candidates."""
    try:
        return str(uuid.UUID(text))
    except ValueError:
        pass
    path = f"/ops/api/runs?prefix={quote(text, safe='')}&limit={PREFIX_CANDIDATES}"
    _, doc = _call(args, "GET", path)
    found = doc.get("runs") or []
    if not found:
        raise OpsError(f"no run id starts with {text!r}")
    if len(found) == 1:
        return str(found[0]["run_id"])
    more = "at least " if len(found) >= PREFIX_CANDIDATES else ""
    lines = "\n".join(
        f"  {r['run_id']}  {r['status']:<11}  {r.get('user_id') or '-'}" for r in found
    )
    raise OpsError(
        f"run id prefix {text!r} is ambiguous: {more}{len(found)} runs match; "
        f"give more characters:\n{lines}"
    )


# --- commands -------------------------------------------------------------------------------
def cmd_status(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """One screen: runs, queues, workers, connections, memory."""
    out = out or sys.stdout
    _, o = _call(args, "GET", "/ops/api/overview")
    if args.json:
        _dump(o, out)
        return EXIT_OK
    health = o.get("health") or {}
    if health:
        out.write("health    " + ("OK" if health["ok"] else "PROBLEMS") + "\n")
        for line in health["problems"]:
            out.write(f"  ! {line}\n")
        for line in health["warnings"]:
            out.write(f"  ~ {line}\n")
    by = o["runs"]["by_status"]
    out.write("runs      " + "  ".join(f"{k} {v}" for k, v in sorted(by.items())) + "\n")
    fenced = o["runs"]["fenced"]
    out.write(
        f"stuck     {o['runs']['stuck']}   fenced status writes "
        f"{fenced['status_writes_recorded']}\n"
    )
    for name, q in o["queues"].items():
        age = q["oldest_age_s"]
        out.write(
            f"queue     {name}: depth {q['depth']}, oldest "
            f"{'-' if age is None else f'{age:.1f}s'}, workers {o['workers_online'].get(name, 0)}\n"
        )
    c = o["connections"]
    out.write(
        f"clients   sse {c['open']['sse']}  ws {c['open']['ws']}  (web processes "
        f"{c['web_processes']})\n"
    )
    m = o["memory"]
    out.write(f"memory    backlog {m['backlog']}  skipped {m['skipped']}\n")
    return EXIT_OK


def cmd_runs_list(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Inflight runs (or runs of --status) with their leases."""
    out = out or sys.stdout
    query = f"?limit={args.limit}" + (f"&status={args.status}" if args.status else "")
    _, doc = _call(args, "GET", "/ops/api/runs" + query)
    if args.json:
        _dump(doc, out)
        return EXIT_OK
    rows = [
        [
            r["run_id"],
            r["user_id"],
            r["status"] + (" (lease expired)" if r["lease_expired"] else ""),
            r["owner"],
            r["owner_epoch"],
            r["lease"]["ttl_s"],
            r["attempt"],
            _age(r["created_at"]),
        ]
        for r in doc["runs"]
    ]
    header = ["run_id", "user", "status", "owner", "epoch", "lease_s", "attempt", "age"]
    _table(rows, header, out)
    return EXIT_OK


def cmd_runs_show(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """One run with its lease, stream and audit (JSON)."""
    out = out or sys.stdout
    run_id = resolve_run_id(args, args.run_id)
    _, doc = _call(args, "GET", f"/ops/api/runs/{run_id}")
    _dump(doc, out)
    return EXIT_OK


def cmd_runs_failures(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Runs that ended error/timeout recently, with their error."""
    out = out or sys.stdout
    query = f"?limit={args.limit}" + (f"&hours={args.hours}" if args.hours else "")
    _, doc = _call(args, "GET", "/ops/api/failures" + query)
    if args.json:
        _dump(doc, out)
        return EXIT_OK
    rows = []
    for r in doc["failures"]:
        err = r.get("error") or {}
        text = f"{err.get('error') or '?'}: {err.get('message') or ''}".replace("\n", " ")
        rows.append([r["run_id"], r["status"], r["user_id"], _age(r["ended_at"]), text[:100]])
    _table(rows, ["run_id", "status", "user", "ended", "error"], out)
    return EXIT_OK


def _action(args: argparse.Namespace, out: TextIO, what: str, body: dict[str, Any]) -> int:
    run_id = resolve_run_id(args, args.run_id)
    status, doc = _call(args, "POST", f"/ops/api/runs/{run_id}/{what}", body)
    if args.json:
        _dump(doc, out)
    else:
        out.write(f"{what} {run_id}: {doc.get('outcome')}\n")
    return EXIT_OK if status < 400 and doc.get("ok") else EXIT_FAILED


def cmd_runs_cancel(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Cancel a run (audited)."""
    out = out or sys.stdout
    return _action(args, out, "cancel", {"action": args.action})


def cmd_runs_requeue(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Requeue a stuck run (audited); refused unless its lease expired or it was never sent."""
    out = out or sys.stdout
    return _action(args, out, "requeue", {"reason": args.reason})


def cmd_workers(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Workers answering, their queues and active runs."""
    out = out or sys.stdout
    _, doc = _call(args, "GET", "/ops/api/workers")
    if args.json:
        _dump(doc, out)
        return EXIT_OK
    rows = [
        [w["name"], w["pid"], ",".join(w["queues"]), len(w["active_runs"])] for w in doc["workers"]
    ]
    _table(rows, ["worker", "pid", "queues", "active_runs"], out)
    return EXIT_OK


def cmd_queues(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Depth and oldest message age of the runs and memory queues."""
    out = out or sys.stdout
    _, doc = _call(args, "GET", "/ops/api/queues")
    if args.json:
        _dump(doc, out)
        return EXIT_OK
    rows = [[name, q["depth"], q["oldest_age_s"]] for name, q in doc.items()]
    _table(rows, ["queue", "depth", "oldest_age_s"], out)
    return EXIT_OK


def _guard(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except OpsError as exc:
            sys.stderr.write(f"threadrun: {exc}\n")
            return EXIT_FAILED

    return run


# --- parsers --------------------------------------------------------------------------------
def add_status(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`threadrun status`."""
    p = sub.add_parser("status", parents=[_options()], help="ops summary of the deployment")
    p.set_defaults(func=_guard(cmd_status))


def add_runs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`threadrun runs list|show|cancel|requeue`."""
    p = sub.add_parser("runs", help="list, show, cancel or requeue runs; recent failures (ops)")
    runs = p.add_subparsers(dest="runs_command", required=True, metavar="ACTION")
    ls = runs.add_parser("list", parents=[_options()], help="inflight runs, or --status")
    ls.add_argument(
        "--status", choices=("pending", "running", "success", "error", "timeout", "interrupted")
    )
    ls.add_argument("--limit", type=int, default=100)
    ls.set_defaults(func=_guard(cmd_runs_list))
    id_help = "the run id or any unique prefix of it"
    show = runs.add_parser("show", parents=[_options()], help="one run, its lease and audit")
    show.add_argument("run_id", help=id_help)
    show.set_defaults(func=_guard(cmd_runs_show))
    cancel = runs.add_parser("cancel", parents=[_options()], help="cancel a run (audited)")
    cancel.add_argument("run_id", help=id_help)
    cancel.add_argument("--action", choices=("interrupt", "rollback"), default="interrupt")
    cancel.set_defaults(func=_guard(cmd_runs_cancel))
    requeue = runs.add_parser("requeue", parents=[_options()], help="requeue a stuck run")
    requeue.add_argument("run_id", help=id_help)
    requeue.add_argument("--reason", default="stuck (cli)")
    requeue.set_defaults(func=_guard(cmd_runs_requeue))
    fails = runs.add_parser(
        "failures", parents=[_options()], help="runs that ended error/timeout, with the error"
    )
    fails.add_argument("--hours", type=float, help="how far back (default: the server's window)")
    fails.add_argument("--limit", type=int, default=50)
    fails.set_defaults(func=_guard(cmd_runs_failures))


def add_workers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`threadrun workers`."""
    p = sub.add_parser("workers", parents=[_options()], help="Celery workers online")
    p.set_defaults(func=_guard(cmd_workers))


def add_queues(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`threadrun queues`."""
    p = sub.add_parser("queues", parents=[_options()], help="queue depths and oldest ages")
    p.set_defaults(func=_guard(cmd_queues))


OPS_SUBCOMMANDS: list[AddParser] = [add_status, add_runs, add_workers, add_queues]
"""Registered by threadrun/cli.py."""
