"""The `threadrun` command line: `threadrun chat` (more subcommands plug in the same way).

    threadrun chat --message "hello"            # one message, tokens on stdout
    threadrun chat --thread <id>                # interactive: one message per stdin line

Markers go to stderr so stdout carries only the assistant's text: `[reconnecting…]` (the
connection dropped and is being resumed), `[view incomplete — reloaded]` (a replay gap:
the durable state was reloaded, B9; the full reply is printed again at the end),
`[cancelled]` (the run ended `interrupted`), `[error] …`.

Exit status: 0 success; 1 the run failed or the server refused; 2 usage; 3 the live
stream was lost (the run keeps going on the server); 130 interrupted by Ctrl-C.

Defaults: THREADRUN_URL (else http://THREADRUN_HOST:THREADRUN_PORT, as `make run` serves;
else http://127.0.0.1:8000), THREADRUN_API_KEY, THREADRUN_TRANSPORT (else ws); `chat` uses
the only assistant the server has, else lead_agent.

Subcommands that need the server's code (`threadrun keys`, `threadrun migrate`: they talk to
PostgreSQL directly) are not part of this package. The server distribution registers them in
the `threadrun.cli` entry-point group (`name = "module:add"`, where `add(sub)` adds one
subparser and sets `func`), and `build_parser` adds whatever is installed. So a client-only
install imports no server module, and the server's environment still has one `threadrun`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, TextIO

from threadrun.cli_ops import OPS_SUBCOMMANDS, AddParser, server_options
from threadrun.client import (
    Reconnecting,
    RecoveryPolicy,
    RunEnded,
    RunStream,
    StateReloaded,
    StreamDisconnectedError,
    StreamEvent,
    StreamReplayGapError,
    ThreadrunClient,
    ThreadrunClientError,
    message_delta,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_STREAM_LOST, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

Command = Callable[[argparse.Namespace], int]


def common_options() -> argparse.ArgumentParser:
    """Connection options of the chat subcommands (use as a parent parser)."""
    p = argparse.ArgumentParser(add_help=False, parents=[server_options()])
    p.add_argument(
        "--transport",
        choices=("ws", "sse"),
        default=os.environ.get("THREADRUN_TRANSPORT", "ws"),
        help="run stream transport (env THREADRUN_TRANSPORT; default %(default)s)",
    )
    p.add_argument(
        "--max-retries",
        type=int,
        default=RecoveryPolicy().max_retries,
        help="reconnect attempts before giving up (default %(default)s)",
    )
    p.add_argument(
        "--max-gaps",
        type=int,
        default=RecoveryPolicy().max_consecutive_gaps,
        help="consecutive replay gaps before giving up (default %(default)s)",
    )
    return p


def make_client(args: argparse.Namespace) -> ThreadrunClient:
    """A client from the common options."""
    policy = RecoveryPolicy(max_retries=args.max_retries, max_consecutive_gaps=args.max_gaps)
    return ThreadrunClient(args.url, args.api_key, transport=args.transport, policy=policy)


# --- chat ------------------------------------------------------------------------------------------
def add_chat(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`threadrun chat`."""
    p = sub.add_parser(
        "chat",
        parents=[common_options()],
        help="chat with an assistant (one --message, or one message per stdin line)",
        description="Send messages to an assistant and print its reply as it streams.",
    )
    p.add_argument("--thread", help="continue this thread (default: create one)")
    p.add_argument(
        "--assistant",
        help="assistant id or graph name (default: the only assistant, else lead_agent)",
    )
    p.add_argument("--message", "-m", help="send this one message and exit")
    p.add_argument(
        "--config",
        type=_json_object,
        help='run config as JSON, e.g. \'{"configurable": {"tokens": 8}}\'',
    )
    p.set_defaults(func=cmd_chat)


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


@dataclass
class ChatPrinter:
    """Renders one run's items: tokens to `out`, markers to `err`."""

    out: TextIO
    err: TextIO
    incomplete: bool = False
    printed: bool = False
    status: str | None = None
    message_id: str | None = None

    def marker(self, text: str) -> None:
        if self.printed:
            self.out.write("\n")
            self.out.flush()
            self.printed = False
        self.err.write(f"{text}\n")
        self.err.flush()

    def item(self, item: Any) -> None:
        if isinstance(item, StreamEvent):
            delta = message_delta(item)
            if delta is not None:
                if self.printed and delta[0] != self.message_id:
                    self.out.write("\n")  # a new assistant message (e.g. after a tool call)
                self.message_id = delta[0]
                self.out.write(delta[1])
                self.out.flush()
                self.printed = True
            elif item.event == "error":
                data = item.data if isinstance(item.data, dict) else {}
                self.marker(f"[error] {data.get('error', 'error')}: {data.get('message', '')}")
        elif isinstance(item, Reconnecting):
            self.marker("[reconnecting…]")
        elif isinstance(item, StateReloaded):
            self.incomplete = True
            self.marker("[view incomplete — reloaded]")
        elif isinstance(item, RunEnded):
            self.status = item.status
            if item.status == "interrupted":
                self.marker("[cancelled]")
            elif item.status != "success":
                self.marker(f"[run {item.status}]")

    def finish(self, stream: RunStream) -> None:
        """After a gap, print the whole final reply from the durable state."""
        if self.incomplete and self.status == "success":
            reply = last_ai_text(stream.values)
            if reply:
                if self.printed:
                    self.out.write("\n")
                self.out.write(reply)
                self.printed = True
        if self.printed:
            self.out.write("\n")
            self.printed = False
        self.out.flush()


def last_ai_text(values: Any) -> str:
    """The text of the last AI message in thread values."""
    messages = values.get("messages") if isinstance(values, dict) else None
    for msg in reversed(messages or []):
        if isinstance(msg, dict) and msg.get("type") in ("ai", "AIMessageChunk"):
            content = msg.get("content")
            if isinstance(content, list):
                content = "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
            return str(content or "")
    return ""


def chat_once(
    client: ThreadrunClient,
    thread_id: str,
    assistant: str,
    text: str,
    config: dict[str, Any] | None,
    out: TextIO,
    err: TextIO,
) -> int:
    """Send one message and render the reply; Ctrl-C cancels the run (R5) and shows the end."""
    printer = ChatPrinter(out, err)
    stream = client.stream_run(
        thread_id,
        assistant,
        input={"messages": [{"role": "user", "content": text}]},
        config=config,
    )
    try:
        try:
            for item in stream:
                printer.item(item)
        except KeyboardInterrupt:
            if stream.run_id is None:
                raise
            printer.marker("[cancelling…]")
            stream.close()
            client.cancel(thread_id, stream.run_id, action="interrupt")
            rest = client.join_run(thread_id, stream.run_id, stream.last_event_id)
            for item in rest:
                printer.item(item)
            stream = rest
        printer.finish(stream)
    except (StreamReplayGapError, StreamDisconnectedError) as exc:
        printer.marker(f"[stream lost] {exc}")
        return EXIT_STREAM_LOST
    finally:
        stream.close()
    if printer.status in ("success", "interrupted"):
        return EXIT_OK
    return EXIT_FAILED


def cmd_chat(args: argparse.Namespace) -> int:
    """One message (--message) or an interactive loop over stdin lines."""
    with make_client(args) as client:
        assistant = args.assistant or pick_assistant(client.search_assistants())
        thread_id = args.thread or client.create_thread()["thread_id"]
        sys.stderr.write(f"thread {thread_id}\n")
        messages: Iterable[str]
        if args.message is not None:
            messages = [args.message]
        else:
            messages = _prompt_lines(sys.stdin, sys.stderr)
        code = EXIT_OK
        for text in messages:
            code = chat_once(
                client, thread_id, assistant, text, args.config, sys.stdout, sys.stderr
            )
            if code == EXIT_STREAM_LOST or (args.message is not None and code != EXIT_OK):
                break
        return code


DEFAULT_ASSISTANT = "lead_agent"


def pick_assistant(assistants: list[dict[str, Any]]) -> str:
    """The assistant `chat` uses without --assistant: the only one there is, else the
    `lead_agent` graph's; with several and no lead_agent, a usage error naming them."""
    if len(assistants) == 1:
        return str(assistants[0]["assistant_id"])
    if not assistants or any(a.get("graph_id") == DEFAULT_ASSISTANT for a in assistants):
        return DEFAULT_ASSISTANT
    names = ", ".join(sorted({str(a.get("graph_id")) for a in assistants}))
    raise ThreadrunClientError(
        f"this server has several assistants ({names}) and no {DEFAULT_ASSISTANT}: pass"
        " --assistant <id or graph name>"
    )


def _prompt_lines(stdin: TextIO, err: TextIO) -> Iterable[str]:
    interactive = stdin.isatty()
    while True:
        if interactive:
            err.write("> ")
            err.flush()
        line = stdin.readline()
        if not line:
            return
        text = line.strip()
        if text in ("/quit", "/exit"):
            return
        if text:
            yield text


# --- entry point ------------------------------------------------------------------------------------
SUBCOMMANDS: list[AddParser] = [
    add_chat,
    *OPS_SUBCOMMANDS,  # status, runs, workers, queues (threadrun/cli_ops.py)
]
"""Each adds one subparser and sets `func` (a `Command`); append to add `status`, `runs`, …"""

PLUGIN_GROUP = "threadrun.cli"
"""The entry-point group of subcommands other distributions add (the server's keys, migrate)."""


def installed_subcommands(err: TextIO | None = None) -> list[AddParser]:
    """The subcommands registered in `PLUGIN_GROUP`, by name; one that fails to load is
    skipped with a line on `err`, so a broken server install cannot break `threadrun chat`."""
    found: list[AddParser] = []
    for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        try:
            found.append(ep.load())
        except Exception as exc:  # noqa: BLE001 - whatever importing the plugin raised
            (err or sys.stderr).write(
                f"threadrun: skipping the {ep.name!r} command ({type(exc).__name__}: {exc})\n"
            )
    return found


def build_parser() -> argparse.ArgumentParser:
    """The `threadrun` parser with the built-in and every installed subcommand."""
    parser = argparse.ArgumentParser(
        prog="threadrun", description="threadrun: a client of the threadrun runtime"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in [*SUBCOMMANDS, *installed_subcommands()]:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (`threadrun`)."""
    args = build_parser().parse_args(argv)
    func: Command = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return EXIT_INTERRUPTED
    except ThreadrunClientError as exc:
        sys.stderr.write(f"threadrun: {exc}\n")
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
