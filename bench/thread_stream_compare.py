"""The same thread streaming protocol script against threadrun and the official server: the
same event sequences?

    .venv/bin/python -m bench.thread_stream_compare --official-url http://127.0.0.1:2024 \\
        [--url http://127.0.0.1:8000]

Both servers serve tests/fixtures/protocol_project/langgraph.json (two graphs of plain
LangGraph: a fake model streaming its answer, the same as a subgraph, and an `interrupt()`); the official one with
`langgraph dev --no-browser --no-reload --config tests/fixtures/protocol_project/langgraph.json`
in a venv of ../shared/bench/official-server-freeze.txt. Without `--url` the script starts
threadrun itself (a web process and a runs worker on a private sandbox). Each scenario
starts a run with `run.start`, reads `POST /threads/{id}/stream/events` to the root's
terminal lifecycle, and prints each event as its method, namespace depth and kind (ids,
seqs and timestamps aside), side by side, with the channels the official server fills:
`values`, `messages`, `lifecycle`, `input`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench.chaos import table
from bench.scale import sandboxed
from shared.settings import Settings
from shared.tools.testing import Cluster, cluster_env

PROJECT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "protocol_project"
CHANNELS = ["values", "messages", "lifecycle", "input"]
HUMAN = {"messages": [{"role": "user", "content": "hi"}]}


def command(c: httpx.Client, tid: str, method: str, params: Any, cid: int = 1) -> Any:
    r = c.post(f"/threads/{tid}/commands", json={"id": cid, "method": method, "params": params})
    return r.raise_for_status().json()


def read(c: httpx.Client, tid: str, until: tuple[str, ...], since: int | None = None) -> list[Any]:
    """The stream's events to the root's lifecycle in `until` (at most 10 s)."""
    body: dict[str, Any] = {"channels": CHANNELS, **({"since": since} if since else {})}
    out: list[Any] = []
    t0 = time.monotonic()
    with c.stream("POST", f"/threads/{tid}/stream/events", json=body, timeout=12) as s:
        for line in s.iter_lines():
            if time.monotonic() - t0 > 10:
                break
            if line.startswith("data: "):
                data = json.loads(line[6:])
                out.append(data)
                params = data.get("params") or {}
                root = data.get("method") == "lifecycle" and not params.get("namespace")
                if root and params["data"]["event"] in until:
                    break
    return out


def kind(event: dict[str, Any]) -> str:
    """An event without its ids: method, namespace depth, what it is."""
    method, params = event.get("method"), event.get("params") or {}
    data = params.get("data")
    if method == "messages":
        what = data["event"] + (f"/{data['delta']['type']}" if "delta" in data else "")
    elif method == "lifecycle":
        what = data["event"]
    elif method == "values":
        what = ",".join(sorted(data)) if isinstance(data, dict) else type(data).__name__
    elif method == "input.requested":
        what = json.dumps(data.get("payload"))
    else:
        what = str(data)[:40]
    return f"{method}[{len(params.get('namespace') or [])}] {what}"


def script(url: str) -> dict[str, list[str]]:
    """The scenarios' event kinds on one server."""
    out: dict[str, list[str]] = {}
    with httpx.Client(base_url=url, timeout=20) as c:
        tid = str(uuid.uuid4())
        command(c, tid, "run.start", {"assistant_id": "chat", "input": HUMAN})
        out["chat"] = [kind(e) for e in read(c, tid, ("completed", "failed"))]
        tid = str(uuid.uuid4())
        command(c, tid, "run.start", {"assistant_id": "nested", "input": HUMAN})
        out["nested"] = [kind(e) for e in read(c, tid, ("completed", "failed"))]
        tid = str(uuid.uuid4())
        command(c, tid, "run.start", {"assistant_id": "approval", "input": HUMAN})
        got = read(c, tid, ("interrupted", "completed", "failed"))
        out["approval"] = [kind(e) for e in got]
        asked = [e for e in got if e.get("method") == "input.requested"]
        respond = {"namespace": [], "interrupt_id": asked[0]["params"]["data"]["interrupt_id"]}
        command(c, tid, "input.respond", {**respond, "response": "yes"}, cid=2)
        resumed = read(c, tid, ("completed", "failed"), since=got[-1]["seq"])
        out["approval, resumed"] = [kind(e) for e in resumed]
    return out


def threadrun_script() -> dict[str, list[str]]:
    """The script on a threadrun started here (a web process, a runs worker, a sandbox)."""
    workdir = Path(tempfile.mkdtemp(prefix="threadrun-protocol-compare-"))
    with sandboxed(Settings()) as (_, settings):
        extra = {
            "THREADRUN_DATA_DIR": str(workdir / "data"),
            "THREADRUN_API_KEYS": "",
            "THREADRUN_CONFIG": str(PROJECT / "langgraph.json"),
        }
        cluster = Cluster(settings, cluster_env(settings, extra), workdir)
        try:
            url = cluster.start_web()
            cluster.start_worker("compare", 2, timeout=90)
            return script(url)
        finally:
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--official-url", required=True, help="the official server (langgraph dev)")
    parser.add_argument("--url", help="a threadrun serving the same project (default: start one)")
    args = parser.parse_args()
    ours = script(args.url) if args.url else threadrun_script()
    theirs = script(args.official_url)
    for name in ours:
        rows = [
            [a or "", b or "", "yes" if a == b else "NO"]
            for a, b in itertools.zip_longest(ours[name], theirs[name])
        ]
        same = sum(1 for r in rows if r[2] == "yes")
        print(f"\n{name}: {same}/{len(rows)} the same")
        print(table(["threadrun", "official", "same"], rows))


if __name__ == "__main__":
    main()
