"""The same custom-auth script against threadrun and the official server: same answers?

    .venv/bin/python -m bench.authz_compare --url http://127.0.0.1:8000 \\
        [--official-url http://127.0.0.1:2024]

Both servers serve tests/fixtures/auth_project/langgraph.json (an `auth.py` of the
custom-auth documentation's patterns and a graph that reports the user it sees), e.g.
`THREADRUN_CONFIG=tests/fixtures/auth_project/langgraph.json make run` and, in a venv of
../shared/bench/official-server-freeze.txt,
`langgraph dev --no-browser --no-reload --config tests/fixtures/auth_project/langgraph.json`.
Each step is one call of the official Python SDK by one of the script's users; the table
prints what each server answered (a status, or the value the step looks at) and whether
they agree.
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Callable
from typing import Any

import httpx
from langgraph_sdk import get_sync_client
from langgraph_sdk.errors import APIStatusError

from bench.chaos import table

Step = tuple[str, Callable[[dict[str, Any]], Any]]


def _client(url: str, token: str) -> Any:
    return get_sync_client(url=url, api_key=None, headers={"Authorization": f"Bearer {token}"})


def _outcome(call: Callable[[], Any]) -> str:
    try:
        value = call()
    except (APIStatusError, httpx.HTTPStatusError) as exc:
        return str(exc.response.status_code)
    return "200" if value is None else repr(value)


def steps() -> list[Step]:
    """The script: (what, fn(world) -> the value compared)."""

    def setup(w: dict[str, Any]) -> Any:
        w["thread"] = w["alice"].threads.create(metadata={"topic": "plans"})["thread_id"]
        return w["alice"].threads.get(w["thread"])["metadata"].get("owner")

    def raw(token: str | None) -> Callable[[dict[str, Any]], Any]:
        def go(w: dict[str, Any]) -> Any:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            return httpx.post(f"{w['url']}/threads/search", json={}, headers=headers).status_code

        return go

    def assistant(w: dict[str, Any]) -> Any:
        made = w["alice"].assistants.create("whoami", name="alice-helper")
        w["assistant"] = made["assistant_id"]
        return made["metadata"].get("owner")

    def created_by_run(w: dict[str, Any]) -> Any:
        tid = str(uuid.uuid4())
        w["alice"].runs.wait(tid, "whoami", input={}, if_not_exists="create")
        return w["alice"].threads.get(tid)["metadata"].get("owner")

    def store_ns(w: dict[str, Any]) -> Any:
        w["alice"].store.put_item(["notes"], "k1", {"text": "secret"})
        return w["alice"].store.get_item(["notes"], "k1")["namespace"]

    def cron(w: dict[str, Any]) -> Any:
        w["cron"] = w["alice"].crons.create("whoami", schedule="0 0 1 1 *", input={})["cron_id"]
        return "made"

    return [
        ("no token: POST /threads/search", raw(None)),
        ("bad token: POST /threads/search", raw("nope")),
        ("alice creates a thread: metadata.owner", setup),
        ("bob reads alice's thread", lambda w: w["bob"].threads.get(w["thread"])),
        ("bob updates it", lambda w: w["bob"].threads.update(w["thread"], metadata={"x": 1})),
        ("bob reads its state", lambda w: w["bob"].threads.get_state(w["thread"])),
        ("bob lists its runs", lambda w: w["bob"].runs.list(w["thread"])),
        ("bob starts a run on it", lambda w: w["bob"].runs.create(w["thread"], "whoami")),
        ("bob copies it", lambda w: w["bob"].threads.copy(w["thread"])),
        ("bob deletes it", lambda w: w["bob"].threads.delete(w["thread"])),
        (
            "bob searches with owner=alice",
            lambda w: len(w["bob"].threads.search(metadata={"owner": "alice"})),
        ),
        ("bob counts topic=plans", lambda w: w["bob"].threads.count(metadata={"topic": "plans"})),
        (
            "admin reads it",
            lambda w: w["admin"].threads.get(w["thread"])["thread_id"] == w["thread"],
        ),
        (
            "alice's run: the user the graph sees",
            lambda w: sorted(w["alice"].runs.wait(w["thread"], "whoami", input={})["seen"].items()),
        ),
        ("a thread a run creates: metadata.owner", created_by_run),
        ("reader creates a thread", lambda w: w["reader"].threads.create()),
        ("reader searches", lambda w: type(w["reader"].threads.search()).__name__),
        ("alice creates an assistant: metadata.owner", assistant),
        ("bob reads alice's assistant", lambda w: w["bob"].assistants.get(w["assistant"])),
        ("bob runs alice's assistant", lambda w: w["bob"].runs.wait(None, w["assistant"])),
        ("store: alice's namespace", store_ns),
        ("store: bob reads the same key", lambda w: w["bob"].store.get_item(["notes"], "k1")),
        ("alice makes a cron", cron),
        ("the crashing crons.delete handler", lambda w: w["alice"].crons.delete(w["cron"])),
    ]


def run(url: str) -> list[str]:
    """Each step's outcome against `url`."""
    world: dict[str, Any] = {"url": url}
    for name, token in (("alice", "tok-alice"), ("bob", "tok-bob")):
        world[name] = _client(url, token)
    world["admin"], world["reader"] = _client(url, "tok-admin"), _client(url, "tok-reader")
    return [_outcome(lambda fn=fn: fn(world)) for _, fn in steps()]  # type: ignore[misc]


def main() -> None:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", required=True, help="threadrun")
    parser.add_argument("--official-url", help="the official server (langgraph dev)")
    args = parser.parse_args()
    ours = run(args.url)
    names = [name for name, _ in steps()]
    if not args.official_url:
        print(table(["step", "threadrun"], [[n, o[:60]] for n, o in zip(names, ours, strict=True)]))
        return
    theirs = run(args.official_url)
    rows = [
        [n, o[:60], t[:60], "yes" if o == t else "NO"]
        for n, o, t in zip(names, ours, theirs, strict=True)
    ]
    same = sum(o == t for o, t in zip(ours, theirs, strict=True))
    print(table(["step", "threadrun", "official", "same"], rows))
    print(f"{same} of {len(rows)} steps answer the same")


if __name__ == "__main__":
    main()
