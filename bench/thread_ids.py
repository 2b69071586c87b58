"""What per-owner thread ids cost a request (A4, shared/runs/thread_ids.py).

Through the Flask app in process (no network), on a private database (shared.tools.testing.Sandbox)
dropped at the end: the lookup of a client's id (`RunStore.resolve_thread_id`, one indexed
query on (owner, public_id)), then the same reads on a thread the server named (one id for
both: nothing to rewrite) and on one whose id the client chose (its storage id rewritten into
the client's id in the answer). Then the stream relay on its own (no IO): one Redis read's
SSE chunk of a client-chosen thread (token `messages` events, each naming the thread in its
metadata, a `values` and a `checkpoints` event) through the translation the web applies
(`SseTranslator`: only the events that hold an id are parsed), as an older worker wrote it
(the storage id in every event's metadata) and as the worker writes it now (the public id
written at the source, `PublicIds.at_source`: passed through), and a chunk with no storage
id in it (a server-made thread: passed through). Also the worker's cost of writing the
public id into one token event. Prints p50 / p95 in milliseconds.

    python -m bench.thread_ids [--runs 20] [--repeat 200] [--tokens 20]
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

from pydantic import SecretStr

from bench.chaos import table
from bench.thread_search import _timed
from shared import serde
from shared.runs.thread_ids import PublicIds, SseTranslator, run_event_data, storage_id
from shared.settings import Settings
from shared.tools.testing import Sandbox

KEY = "key-bench"


def main(argv: list[str] | None = None) -> None:
    """Make the two threads, then time the lookups and reads."""
    parser = argparse.ArgumentParser(prog="python -m bench.thread_ids")
    parser.add_argument("--runs", type=int, default=20, help="run rows on each thread")
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=20, help="messages events per chunk")
    parser.add_argument("--relay-only", action="store_true", help="only the stream relay rows")
    args = parser.parse_args(argv)
    relay = relay_rows(args.tokens, args.repeat * 10)
    if args.relay_only:
        print(f"stream relay: {args.repeat * 10} chunks per row\n" + table(HEAD, relay))
        return

    from app import create_app
    from app.services import current_services
    from shared.runs.model import MultitaskStrategy, RunRequest

    base = Settings().model_copy(update={"api_keys": SecretStr(f"{KEY}:bench")})
    with Sandbox(base, "tids", uses_redis=False) as settings:
        app = create_app(settings)
        client = app.test_client()
        headers = {"x-api-key": KEY}
        with app.app_context():
            store = current_services().store
            made = client.post("/threads", json={}, headers=headers).get_json()["thread_id"]
            chosen = str(uuid.uuid4())
            client.post("/threads", json={"thread_id": chosen}, headers=headers)
            for public in (made, chosen):
                storage = store.resolve_thread_id("bench", public)
                for _ in range(args.runs):
                    admission = store.admit(
                        RunRequest(thread_id=storage, assistant_id="lead_agent"),
                        run_id=str(uuid.uuid4()),
                        owner="bench",
                        graph_id="lead_agent",
                        strategy=MultitaskStrategy.ENQUEUE,
                    )
                    assert admission.run is not None

            def get(path: str) -> None:
                res = client.get(path, headers=headers)
                assert res.status_code == 200, res.get_data(as_text=True)

            rows = []
            for what, public in (("server-made id", made), ("client-chosen id", chosen)):
                p50, p95 = _timed(lambda p=public: store.resolve_thread_id("bench", p), args.repeat)
                rows.append([f"resolve_thread_id, {what}", f"{p50:.3f}", f"{p95:.3f}"])
                for name, path in (
                    ("GET /threads/{id}", f"/threads/{public}"),
                    (f"GET /threads/{{id}}/runs ({args.runs})", f"/threads/{public}/runs"),
                ):
                    p50, p95 = _timed(lambda path=path: get(path), args.repeat)
                    rows.append([f"{name}, {what}", f"{p50:.3f}", f"{p95:.3f}"])
    print(f"thread ids: {args.repeat} calls per row\n" + table(HEAD, rows + relay))


HEAD = ["operation", "p50 ms", "p95 ms"]


def events(storage: str, tokens: int) -> list[tuple[str, Any]]:
    """One Redis read's events of a run on the thread stored under `storage`, as the graph
    streams them (the token chunks share one metadata dict, as LangGraph's do)."""
    meta = {
        "thread_id": storage,
        "run_id": str(uuid.uuid4()),
        "graph_id": "lead_agent",
        "assistant_id": str(uuid.uuid4()),
        "langgraph_step": 1,
        "langgraph_node": "agent",
        "langgraph_triggers": ["branch:to:agent"],
        "langgraph_checkpoint_ns": f"agent:{uuid.uuid4()}",
        "ls_provider": "openai",
        "ls_model_name": "bench",
    }
    out: list[tuple[str, Any]] = [
        ("messages", ({"type": "AIMessageChunk", "content": f"tok{n} ", "id": "m1"}, meta))
        for n in range(tokens)
    ]
    out.append(("values", {"messages": [{"type": "human", "content": "hi " * 50}]}))
    config = {"configurable": {"thread_id": storage, "checkpoint_id": str(uuid.uuid4())}}
    out.append(("checkpoints", {"config": config, "values": {}, "metadata": meta}))
    return out


def sse_chunk(pairs: list[tuple[str, Any]]) -> bytes:
    """The SSE chunk the web writes for one read of these events."""
    return b"".join(
        f"id: 1-{n}\nevent: {name}\ndata: {serde.dumps_str(data)}\n\n".encode()
        for n, (name, data) in enumerate(pairs)
    )


def relay_rows(tokens: int, repeat: int) -> list[list[str]]:
    """The relay's cost per chunk: as an older worker wrote it (storage ids), as the worker
    writes it now (public ids at the source), and a server-made thread's; then what writing
    the public id costs the worker per token event."""
    public = str(uuid.uuid4())
    storage = storage_id("bench", public)
    ids = PublicIds({storage: public})
    source = PublicIds.at_source(storage, public)
    assert source is not None
    pairs = events(storage, tokens)
    old = sse_chunk(pairs)
    new = sse_chunk([(name, source.event_data(name, data)) for name, data in pairs])
    assert sse_chunk(pairs) == old  # the graph's objects are not changed
    assert SseTranslator(ids, run_event_data).feed(old) == new  # the same answer either way
    rows = []
    for what, chunk in (
        (f"client-chosen id, older worker ({tokens} tokens)", old),
        (f"client-chosen id, written at the source ({tokens} tokens)", new),
        (f"no storage id ({tokens} tokens)", sse_chunk(events(str(uuid.uuid4()), tokens))),
    ):
        sse = SseTranslator(ids, run_event_data)
        p50, p95 = _timed(lambda c=chunk, t=sse: t.feed(c), repeat)
        rows.append([f"SSE chunk relay, {what}", f"{p50:.4f}", f"{p95:.4f}"])
    token = events(storage, 1)[0]
    for what, write in (
        ("worker: serialize a token event", lambda: serde.dumps(token[1])),
        (
            "worker: public id + serialize a token event",
            lambda: serde.dumps(source.event_data(*token)),
        ),
    ):
        p50, p95 = _timed(write, repeat)
        rows.append([what, f"{p50:.4f}", f"{p95:.4f}"])
    return rows


if __name__ == "__main__":
    main()
