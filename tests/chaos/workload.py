"""The chaos workload: concurrent chat clients recording every event they observe.

Run on the client host (`python -m tests.chaos.workload ...`, started by the harness inside
the client namespace). Half the clients use the official `langgraph-sdk` (SSE; it reconnects
with Last-Event-ID by itself), half speak the WebSocket protocol (docs/websocket.md). Both
are recovering clients: a dropped stream is rejoined after the last event id seen (another
web host if need be), and a `gap` is answered by reloading the thread's state once the run
has ended. Each client loops until the deadline over: a plain run, a run it cancels after a
few tokens, and a run that a second run with multitask_strategy `rollback` replaces.

Every observation is one JSON line in the history file, with `t` (wall clock): `create`
(run admitted, its id), `create_error`, `ev` (an event: id, name, attempt of the last
`metadata`, the message chunk's own attempt, the filler token numbers it carried), `gap`,
`drop` (a stream failed), `end`, `final` (the run's status), `state` (the thread's head:
checkpoint id and every AI answer's word and filler tokens), `cancel`; `client_start` and
`client_done` bracket each client's loop. A client still busy `--grace-s` seconds after the
deadline (or when the harness sends SIGTERM) is recorded as `hung` (what it was doing, on which
run and thread, since when, its last event id) and the workload exits with HUNG_EXIT: the
checker reports it as `stuck` instead of the harness waiting forever.

The built-in model answers a message with N tokens: `(turn k) You said: <word>` and fillers
`t0005` .. `t{N-1:04d}` (shared/agent/model.py); the word is unique per run, so an answer
in a state can be matched to its run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import simple_websocket
from langgraph_sdk import get_sync_client

API_KEY = "key-chaos"
HEAD_TOKENS = 5  # "(turn", "k)", "You", "said:", "<word>"
FILLER = re.compile(r"\bt(\d{4})\b")
WORD = re.compile(r"You said: (\S+)")
TERMINAL = {"success", "error", "timeout", "interrupted"}
MAX_REJOINS = 30
HUNG_EXIT = 3
"""The workload's exit code when some client was still busy at the end (see `hung`)."""


class History:
    """One JSON line per observation, flushed at once (a killed workload keeps what it saw)."""

    def __init__(self, path: Path) -> None:
        self._fh = path.open("a", buffering=1)
        self._lock = threading.Lock()

    def add(self, client: str, kind: str, **fields: Any) -> None:
        line = json.dumps({"t": time.time(), "c": client, "k": kind, **fields})
        with self._lock:
            if not self._fh.closed:  # a hung client's late line after the end is dropped
                self._fh.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._fh.close()


def fillers(text: str) -> list[int]:
    return [int(m) for m in FILLER.findall(text)]


def chunk_info(event: str, data: Any) -> tuple[list[int], Any]:
    """The filler tokens of a `messages` event and its chunk's attempt (from the run's
    metadata LangGraph attaches to every chunk)."""
    if not event.startswith("messages") or not isinstance(data, list) or len(data) != 2:
        return [], None
    chunk, meta = data
    content = chunk.get("content") if isinstance(chunk, dict) else None
    text = content if isinstance(content, str) else ""
    return fillers(text), (meta or {}).get("attempt") if isinstance(meta, dict) else None


class Client(threading.Thread):
    """One chat user: its own threads, one run at a time."""

    def __init__(
        self, name: str, transport: str, urls: list[str], hist: History, args: Any, seed: int
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.cname, self.transport, self.urls, self.hist = name, transport, urls, hist
        self.rng = random.Random(seed)
        self.deadline = time.time() + args.duration
        self.args = args
        self.n = 0
        self.attempt: dict[str, Any] = {}
        # what the client is doing now (for a `hung` record); plain attribute writes
        self.phase = "starting"
        self.phase_since = time.time()
        self.cur_run: str | None = None
        self.cur_thread: str | None = None
        self.last_event: str | None = None

    def doing(self, phase: str, run_id: str | None = None, tid: str | None = None) -> None:
        self.phase, self.phase_since = phase, time.time()
        self.cur_run = run_id
        if tid is not None:
            self.cur_thread = tid

    def hung(self) -> dict[str, Any]:
        """The `hung` record's fields: what this client was doing when the workload ended."""
        return {"phase": self.phase, "since": self.phase_since, "run": self.cur_run,
                "thread": self.cur_thread, "last": self.last_event}  # fmt: skip

    # --- plumbing --------------------------------------------------------------------------
    def url(self) -> str:
        return self.rng.choice(self.urls)

    def http(self, url: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=url or self.url(), headers={"x-api-key": API_KEY}, timeout=15)

    def retry(self, what: str, fn: Any, tries: int = 40) -> Any:
        """`fn(http_client)` on some web host until it works (services may be down)."""
        last: Exception | None = None
        for _ in range(tries):
            try:
                with self.http() as h:
                    return fn(h)
            except (httpx.HTTPError, RuntimeError) as exc:
                last = exc
                time.sleep(0.5)
        raise RuntimeError(f"{what}: {last!r}")

    def record(self, run_id: str, ev_id: str | None, event: str, data: Any) -> None:
        if event == "metadata" and isinstance(data, dict):
            self.attempt[run_id] = data.get("attempt")
        toks, chunk_att = chunk_info(event, data)
        self.last_event = ev_id
        self.hist.add(self.cname, "ev", run=run_id, id=ev_id, ev=event, att=self.attempt.get(run_id),
                      catt=chunk_att, tok=toks)  # fmt: skip

    # --- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        self.hist.add(self.cname, "client_start", transport=self.transport)
        try:
            self.main_loop()
        finally:
            self.hist.add(self.cname, "client_done", runs=self.n)

    def main_loop(self) -> None:
        try:
            self.doing("create a thread")
            tid = self.retry(
                "create a thread",
                lambda h: h.post("/threads", json={}).raise_for_status().json()["thread_id"],
            )
            while time.time() < self.deadline:
                self.n += 1
                roll = self.rng.random()
                self.doing("create a run", tid=tid)
                try:
                    if roll < self.args.cancel_share:
                        self.one_run(tid, cancel_after=self.rng.randrange(3, 15))
                    elif roll < self.args.cancel_share + self.args.rollback_share:
                        self.rollback_pair(tid)
                    else:
                        self.one_run(tid)
                except Exception as exc:  # noqa: BLE001 - recorded, the client goes on
                    self.hist.add(self.cname, "client_error", thread=tid, error=repr(exc)[:300])
                    time.sleep(1)
                if self.rng.random() < 0.2:
                    self.doing("create a thread")
                    tid = self.retry(
                        "create a thread",
                        lambda h: (
                            h.post("/threads", json={}).raise_for_status().json()["thread_id"]
                        ),
                    )
        except Exception as exc:  # noqa: BLE001
            self.hist.add(self.cname, "client_error", error=repr(exc)[:300])

    def body(self, word: str, **extra: Any) -> dict[str, Any]:
        tokens = self.rng.randrange(self.args.min_tokens, self.args.max_tokens)
        return {
            "assistant_id": "lead_agent",
            "input": {"messages": [{"role": "user", "content": word}]},
            "stream_mode": ["messages-tuple"],
            "config": {"configurable": {"tokens": tokens, "token_delay_ms": self.args.delay_ms}},
            **extra,
        }

    def rollback_pair(self, tid: str) -> None:
        """A background run, then (while it streams) a run with multitask_strategy rollback."""
        word = f"q{self.cname}x{self.n}a"
        body = self.body(word)
        try:
            res = self.retry(
                "create the rolled-back run",
                lambda h: h.post(f"/threads/{tid}/runs", json=body).raise_for_status().json(),
            )
            self.hist.add(self.cname, "create", run=res["run_id"], thread=tid, word=word,
                          tokens=body["config"]["configurable"]["tokens"], mode="background")  # fmt: skip
            self.doing("wait before the rollback run", res["run_id"])
        except RuntimeError as exc:
            self.hist.add(self.cname, "create_error", thread=tid, word=word, error=str(exc)[:300])
            return
        time.sleep(self.rng.uniform(0.3, 2.0))
        self.one_run(tid, strategy="rollback")

    def one_run(
        self, tid: str, *, cancel_after: int | None = None, strategy: str = "enqueue"
    ) -> None:
        word = f"q{self.cname}x{self.n}"
        body = self.body(word, multitask_strategy=strategy)
        tokens = body["config"]["configurable"]["tokens"]
        if self.transport == "sse":
            run_id = self.sse_run(tid, word, body, tokens, cancel_after)
        else:
            run_id = self.ws_run(tid, word, body, tokens, cancel_after)
        if run_id is not None:
            self.finish(tid, run_id)

    def finish(self, tid: str, run_id: str) -> None:
        """The run's committed status, then the thread's head (answers and checkpoint id)."""
        self.doing("poll the run's status", run_id)
        end = time.time() + self.args.settle_s
        status = None
        while time.time() < end:
            with contextlib.suppress(Exception):
                with self.http() as h:
                    status = (
                        h.get(f"/threads/{tid}/runs/{run_id}").raise_for_status().json()["status"]
                    )
                if status in TERMINAL:
                    break
            time.sleep(0.5)
        self.hist.add(self.cname, "final", run=run_id, thread=tid, status=status)
        self.reload(tid, run_id, "final")

    def reload(self, tid: str, run_id: str, why: str) -> None:
        self.doing(f"reload the state ({why})", run_id)
        with contextlib.suppress(Exception):
            with self.http() as h:
                st = h.get(f"/threads/{tid}/state").raise_for_status().json()
            answers = []
            for m in (st.get("values") or {}).get("messages") or []:
                if m.get("type") == "ai" and isinstance(m.get("content"), str):
                    w = WORD.search(m["content"])
                    answers.append(
                        {"word": w.group(1) if w else None, "tok": fillers(m["content"])}
                    )
            cp = (st.get("checkpoint") or {}).get("checkpoint_id")
            self.hist.add(
                self.cname, "state", run=run_id, thread=tid, why=why, checkpoint=cp, answers=answers
            )

    # --- SSE (langgraph-sdk) -----------------------------------------------------------------
    def sse_run(
        self, tid: str, word: str, body: dict[str, Any], tokens: int, cancel_after: int | None
    ) -> str | None:
        run_id: str | None = None
        last_id: str | None = None
        seen = 0
        url = self.url()
        client = get_sync_client(url=url, api_key=API_KEY, timeout=httpx.Timeout(15, read=30))
        try:
            stream: Iterator[Any] = client.runs.stream(
                tid, body["assistant_id"], input=body["input"], stream_mode=body["stream_mode"],
                config=body["config"], multitask_strategy=body["multitask_strategy"],
            )  # fmt: skip
            rejoins = 0
            while True:
                try:
                    for part in stream:
                        if part.event == "metadata" and run_id is None:
                            run_id = part.data["run_id"]
                            self.hist.add(
                                self.cname,
                                "create",
                                run=run_id,
                                thread=tid,
                                word=word,
                                tokens=tokens,
                                mode="sse",
                            )
                            self.doing("stream (sse)", run_id)
                        if run_id is None:
                            continue
                        last_id = part.id or last_id
                        if part.event == "gap":
                            self.hist.add(self.cname, "gap", run=run_id, data=part.data)
                            self.after_gap(tid, run_id)
                            return run_id
                        if part.event == "end":
                            self.hist.add(self.cname, "end", run=run_id, id=part.id)
                            return run_id
                        self.record(run_id, part.id, part.event, part.data)
                        if part.event.startswith("messages"):
                            seen += 1
                            if cancel_after is not None and seen == cancel_after:
                                self.cancel(tid, run_id)
                    if run_id is None:
                        raise RuntimeError("the stream ended before its metadata")
                    if self.status(tid, run_id) in TERMINAL:
                        self.hist.add(self.cname, "end", run=run_id, id=None, implicit=True)
                        return run_id
                    self.hist.add(
                        self.cname, "drop", run=run_id, why="closed without end", last=last_id
                    )
                except Exception as exc:  # noqa: BLE001 - a drop: rejoin below
                    if run_id is None:
                        self.hist.add(
                            self.cname, "create_error", thread=tid, word=word, error=repr(exc)[:300]
                        )
                        return None
                    self.hist.add(self.cname, "drop", run=run_id, why=repr(exc)[:200], last=last_id)
                rejoins += 1
                if rejoins > MAX_REJOINS:
                    self.hist.add(self.cname, "gave_up", run=run_id)
                    return run_id
                self.doing(f"rejoin the stream (sse, {rejoins})", run_id)
                time.sleep(min(2.0, 0.2 * rejoins))
                client.http.client.close()
                client = get_sync_client(
                    url=self.url(), api_key=API_KEY, timeout=httpx.Timeout(15, read=30)
                )
                stream = client.runs.join_stream(
                    tid, run_id, last_event_id=last_id, stream_mode=body["stream_mode"]
                )
        finally:
            client.http.client.close()

    def status(self, tid: str, run_id: str) -> str | None:
        with contextlib.suppress(Exception), self.http() as h:
            return str(h.get(f"/threads/{tid}/runs/{run_id}").raise_for_status().json()["status"])
        return None

    def cancel(self, tid: str, run_id: str) -> None:
        def go(h: httpx.Client) -> int:
            return h.post(
                f"/threads/{tid}/runs/{run_id}/cancel", params={"action": "interrupt"}
            ).status_code

        with contextlib.suppress(RuntimeError):
            code = self.retry("cancel", go, tries=10)
            self.hist.add(self.cname, "cancel", run=run_id, code=code)

    def after_gap(self, tid: str, run_id: str) -> None:
        """B9: reload the durable state once the run has ended (then the state is final)."""
        self.doing("wait for the end after a gap", run_id)
        end = time.time() + self.args.settle_s
        while time.time() < end:
            with contextlib.suppress(Exception), self.http() as h:
                if (
                    h.get(f"/threads/{tid}/runs/{run_id}").raise_for_status().json()["status"]
                    in TERMINAL
                ):
                    break
            time.sleep(0.5)
        self.reload(tid, run_id, "gap")

    # --- WebSocket ---------------------------------------------------------------------------
    def ws_connect(self) -> simple_websocket.Client:
        url = self.url().replace("http://", "ws://") + "/ws"
        return simple_websocket.Client.connect(url, headers={"x-api-key": API_KEY})

    def ws_run(
        self, tid: str, word: str, body: dict[str, Any], tokens: int, cancel_after: int | None
    ) -> str | None:
        run_id: str | None = None
        last_id: str | None = None
        seen = 0
        rejoins = 0
        frame: dict[str, Any] = {"type": "run.create", "thread_id": tid, **body}
        while True:
            ws = None
            try:
                ws = self.ws_connect()
                ws.send(json.dumps(frame))
                while True:
                    msg = ws.receive(timeout=30)
                    if msg is None:
                        raise TimeoutError("no frame for 30 s")
                    f = json.loads(msg)
                    kind = f.get("type")
                    if kind == "run.created":
                        run_id = f["run"]["run_id"]
                        self.hist.add(
                            self.cname,
                            "create",
                            run=run_id,
                            thread=tid,
                            word=word,
                            tokens=tokens,
                            mode="ws",
                        )
                        self.doing("stream (ws)", run_id)
                    elif kind == "error" and run_id is None:
                        self.hist.add(
                            self.cname, "create_error", thread=tid, word=word, error=str(f)[:300]
                        )
                        return None
                    elif kind == "error":
                        raise RuntimeError(f"error frame {f}")
                    elif kind == "event" and f.get("run_id") == run_id:
                        last_id = f["id"]
                        self.record(run_id, f["id"], f["event"], f["data"])
                        if f["event"].startswith("messages"):
                            seen += 1
                            if cancel_after is not None and seen == cancel_after:
                                ws.send(
                                    json.dumps(
                                        {
                                            "type": "run.cancel",
                                            "thread_id": tid,
                                            "run_id": run_id,
                                            "action": "interrupt",
                                        }
                                    )
                                )
                                self.hist.add(self.cname, "cancel", run=run_id, code="ws")
                    elif kind == "gap" and run_id is not None:
                        self.hist.add(self.cname, "gap", run=run_id, data=f)
                        self.after_gap(tid, run_id)
                        return run_id
                    elif kind == "end" and run_id is not None:
                        self.hist.add(
                            self.cname, "end", run=run_id, id=f.get("id"), status=f.get("status")
                        )
                        return run_id
            except Exception as exc:  # noqa: BLE001 - a drop: rejoin
                if run_id is None:
                    # run.create may or may not have been admitted; the checker reads the DB
                    self.hist.add(
                        self.cname, "create_error", thread=tid, word=word, error=repr(exc)[:300]
                    )
                    return None
                self.hist.add(self.cname, "drop", run=run_id, why=repr(exc)[:200], last=last_id)
            finally:
                if ws is not None:
                    with contextlib.suppress(Exception):
                        ws.close()
            rejoins += 1
            if rejoins > MAX_REJOINS:
                self.hist.add(self.cname, "gave_up", run=run_id)
                return run_id
            self.doing(f"rejoin the stream (ws, {rejoins})", run_id)
            time.sleep(min(2.0, 0.2 * rejoins))
            frame = {
                "type": "run.join",
                "thread_id": tid,
                "run_id": run_id,
                "stream_mode": ["messages-tuple"],
            }
            if last_id is not None:
                frame["last_event_id"] = last_id


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.workload")
    p.add_argument("--urls", required=True, help="comma-separated web base URLs")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--duration", type=float, default=60)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--sse-clients", type=int, default=3)
    p.add_argument("--ws-clients", type=int, default=3)
    p.add_argument("--min-tokens", type=int, default=30)
    p.add_argument("--max-tokens", type=int, default=70)
    p.add_argument("--delay-ms", type=float, default=50)
    p.add_argument("--cancel-share", type=float, default=0.15)
    p.add_argument("--rollback-share", type=float, default=0.15)
    p.add_argument("--settle-s", type=float, default=60)
    p.add_argument("--grace-s", type=float, default=150,
                   help="seconds after the deadline before busy clients count as hung")  # fmt: skip
    args = p.parse_args(argv)
    hist = History(args.out)
    urls = args.urls.split(",")
    clients = [
        Client(f"s{i}", "sse", urls, hist, args, args.seed * 1000 + i)
        for i in range(args.sse_clients)
    ]
    clients += [
        Client(f"w{i}", "ws", urls, hist, args, args.seed * 1000 + 500 + i)
        for i in range(args.ws_clients)
    ]
    ended = threading.Event()

    def on_term(signum: int, frame: Any) -> None:
        ended.set()

    # the harness's SIGTERM: record the busy clients, then exit (Event.wait wakes up)
    signal.signal(signal.SIGTERM, on_term)
    for c in clients:
        c.start()
    limit = time.time() + args.duration + args.grace_s
    for c in clients:
        while c.is_alive() and not ended.is_set() and time.time() < limit:
            ended.wait(min(1.0, max(0.0, limit - time.time())))
    busy = [c for c in clients if c.is_alive()]
    for c in busy:
        hist.add(c.cname, "hung", **c.hung())
    hist.add("workload", "done", hung=[c.cname for c in busy])
    hist.close()
    if busy:
        print(f"workload: {len(busy)} clients still busy: {[c.cname for c in busy]}",
              file=sys.stderr, flush=True)  # fmt: skip
        os._exit(HUNG_EXIT)  # the busy threads may sit in a blocking read: do not wait for them
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
