"""Regressions for defects an adversarial review found (A3 hostile input, G4 secrets and
the host's shared resources), the parts that need no server (parsers of user text, redaction, the gunicorn settings).

The timing tests compare a crafted input with a plain one of the same size as a ratio, never
against an absolute time, so that a slow or busy machine does not fail them.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import HumanMessage
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from redis.connection import parse_url as parse_redis_url

from shared.agent.middleware.summarization import summary_prompt
from shared.agent.model import BuiltinChatModel, builtin_summary, said_sentences
from shared.journal.payload import drop_nul
from shared.memory.extraction import ExtractionFailed, parse_facts, unfence
from shared.settings import Settings
from shared.tools.devservices import redact

# --- linear parsers of user text ------------------------------------------------------

CRAFTED_BYTES = 120 * 1024
MAX_RATIO = 5.0
_OLD_SAID = re.compile(r'The user said "(.*?)"\.')
_OLD_NUL = re.compile(r"(\\+)u0000")
_OLD_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


def _best_of(fn: Callable[[], object], rounds: int = 3) -> float:
    """The fastest of a few timings (the least disturbed by other processes)."""
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _ratio(crafted: Callable[[], object], plain: Callable[[], object]) -> float:
    plain()  # warm up (imports, caches)
    return _best_of(crafted) / max(_best_of(plain), 1e-4)


def _message(body: str) -> str:
    """A user message whose second line is a `Previous summary:` line."""
    return "hello\nPrevious summary: " + body


def _summarize(text: str) -> str:
    """The worker's summary path: the summary prompt of one message through the built-in model."""
    return BuiltinChatModel(tokens=1).invoke(summary_prompt(None, [HumanMessage(text)])).text


def test_a3_crafted_summary_input_costs_like_a_plain_one() -> None:
    """A3: 120 KB of repeated `The user said "` after a `Previous summary:` line
    made the summary parser quadratic (~5-11 s of worker CPU); it must cost about what a plain
    message of the same size costs."""
    unit = 'The user said "'
    crafted = _message(unit * (CRAFTED_BYTES // len(unit)))
    plain = _message(("lorem ipsum dolor sit amet " * (CRAFTED_BYTES // 27))[: len(crafted) - 25])
    assert abs(len(crafted) - len(plain)) < 64
    ratio = _ratio(lambda: _summarize(crafted), lambda: _summarize(plain))
    assert ratio < MAX_RATIO, f"crafted/plain = {ratio:.1f}"


_SAID_PIECES = st.sampled_from(['The user said "', '".', '"', ".", "\n", "x", " ", "The user", "é"])


@settings(max_examples=400, deadline=None)
@given(st.lists(_SAID_PIECES, max_size=40).map("".join))
def test_a3_said_scan_equals_the_old_regex(text: str) -> None:
    """A3: the linear scan finds exactly what `r'The user said "(.*?)"\\.'` found
    (on bounded inputs, where the regex's cost does not matter)."""
    assert said_sentences(text) == _OLD_SAID.findall(text)


def test_a3_summary_of_normal_input_is_unchanged() -> None:
    """A3: a previous summary's sentences are carried over as before."""
    previous = 'The user said "hello there". The user said "a "quoted" word".'
    messages = summary_prompt(previous, [HumanMessage("next one")])
    assert builtin_summary(messages) == (
        'The user said "hello there". The user said "a "quoted" word". The user said "next one".'
    )


def test_a3_nul_escape_scan_is_linear() -> None:
    """A3: `(\\\\+)u0000` over a long run of backslashes (a user message's JSON)
    backtracked quadratically; the scan costs about what plain text of the same size costs."""
    crafted = "\\" * CRAFTED_BYTES + "x u0000"
    plain = "y" * CRAFTED_BYTES + "x u0000"
    ratio = _ratio(lambda: drop_nul(crafted), lambda: drop_nul(plain))
    assert ratio < MAX_RATIO, f"crafted/plain = {ratio:.1f}"


_NUL_PIECES = st.sampled_from(["\\", "\\\\", "u0000", "u000", "u", "0", "x", '"'])


@settings(max_examples=400, deadline=None)
@given(st.lists(_NUL_PIECES, max_size=30).map("".join))
def test_a3_nul_scan_equals_the_old_regex(text: str) -> None:
    """A3: `drop_nul` replaces exactly the escapes the old regex replaced."""

    def old(m: re.Match[str]) -> str:
        slashes = m.group(1)
        return m.group(0) if len(slashes) % 2 == 0 else slashes[:-1] + "\\ufffd"

    assert drop_nul(text) == _OLD_NUL.sub(old, text)


def test_a3_extraction_fence_strip_is_linear() -> None:
    """A3: `\\s*```$` over a long whitespace run in a model's answer (which can
    echo user text) backtracked quadratically."""
    crafted = "x" + " " * CRAFTED_BYTES + "x"
    plain = "x" + "y" * CRAFTED_BYTES + "x"

    def parse(text: str) -> Callable[[], object]:
        def go() -> None:
            with contextlib.suppress(ExtractionFailed):  # not JSON: only the time matters
                parse_facts(text)

        return go

    ratio = _ratio(parse(crafted), parse(plain))
    assert ratio < MAX_RATIO, f"crafted/plain = {ratio:.1f}"


_FENCE_PIECES = st.sampled_from(["```", "json", " ", "\n", "`", "{}", "x", "\u00a0"])


@settings(max_examples=400, deadline=None)
@given(st.lists(_FENCE_PIECES, max_size=20).map("".join))
def test_a3_unfence_equals_the_old_regex(text: str) -> None:
    """A3: the fence strip removes exactly what the old regex removed."""

    stripped = text.strip()
    assert unfence(stripped) == _OLD_FENCE.sub("", stripped)


# --- redaction through the drivers' own parsers --------------------------------------

_SECRET = st.text(
    alphabet=st.characters(codec="ascii", exclude_characters="\x00"), min_size=1, max_size=12
).map(lambda s: "Zq9" + s)
"""Passwords with a prefix no host, user or database name below contains."""
_NAMES = st.text(alphabet="abcdefghij", min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(secret=_SECRET, user=_NAMES, db=_NAMES, in_query=st.booleans())
def test_g4_postgres_urls_lose_their_password(
    secret: str, user: str, db: str, in_query: bool
) -> None:
    """G4: a password in a PostgreSQL URL, in its userinfo or as `?password=`,
    is gone after redact(); everything else libpq reads from it is unchanged."""
    q = quote(secret, safe="")
    url = (
        f"postgresql://{user}@db.example:5432/{db}?password={q}&sslmode=disable"
        if in_query
        else f"postgresql://{user}:{q}@db.example:5432/{db}?sslmode=disable"
    )
    out = redact(url)
    assert "Zq9" not in out
    before, after = conninfo_to_dict(url), conninfo_to_dict(out)
    assert before.pop("password") == secret
    assert after.pop("password") == "***"
    assert before == after


@settings(max_examples=200, deadline=None)
@given(secret=_SECRET, user=_NAMES, db=_NAMES)
def test_g4_libpq_conninfo_loses_its_password(secret: str, user: str, db: str) -> None:
    """G4: `password=` in a libpq key=value string is gone after redact()."""
    dsn = make_conninfo(host="db.example", user=user, dbname=db, password=secret)
    out = redact(dsn)
    assert "Zq9" not in out
    before, after = conninfo_to_dict(dsn), conninfo_to_dict(out)
    assert before.pop("password") == secret
    assert after.pop("password") == "***"
    assert before == after


@settings(max_examples=200, deadline=None)
@given(secret=_SECRET, in_query=st.booleans(), user=st.sampled_from(["", "app"]))
def test_g4_redis_urls_lose_their_password(secret: str, in_query: bool, user: str) -> None:
    """G4: redis-py reads a password from the userinfo or `?password=`; neither
    survives redact(), and the rest of what redis-py reads is unchanged."""
    q = quote(secret, safe="")
    url = (
        f"redis://{user + '@' if user else ''}cache.example:6379/3?password={q}"
        if in_query
        else f"redis://{user}:{q}@cache.example:6379/3"
    )
    out = redact(url)
    assert "Zq9" not in out
    before, after = parse_redis_url(url), parse_redis_url(out)
    assert before.pop("password") == secret
    assert after.pop("password") == "***"
    assert before == after


def test_g4_what_has_no_password_is_unchanged() -> None:
    """G4: URLs and conninfo strings without a password come back as they were."""
    for text in (
        "postgresql://u@h:5/db?sslmode=require",
        "redis://127.0.0.1:6379/15",
        "host=h dbname=d user=u",
        "postgresql://u@h:5/db?passfile=/x",
    ):
        assert redact(text) == text


def test_g4_settings_repr_hides_a_query_password() -> None:
    """G4: the settings' repr hides a Redis `?password=` too."""
    s = Settings(redis_url="redis://cache:6379/0?password=Zq9hidden")
    assert "Zq9hidden" not in repr(s) and "Zq9hidden" not in str(s)


# --- no shared gunicorn control socket -----------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_g4_gunicorn_opens_no_control_socket_in_home(tmp_path: Path) -> None:
    """G4: every gunicorn instance on a host shared `~/.gunicorn/gunicorn.ctl`,
    so one instance's control socket answered for another. A real gunicorn started with our
    settings (and a stdlib demo app) must not create it."""
    port = _free_port()
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "THREADRUN_WEB_WORKER_CLASS": "gthread",
        "THREADRUN_WEB_WORKERS": "1",
    }
    argv = [sys.executable, "-m", "gunicorn", "-c", "python:app.gunicorn_conf"]
    argv += ["--bind", f"127.0.0.1:{port}", "wsgiref.simple_server:demo_app"]
    proc = subprocess.Popen(argv, env=env, cwd=Path(__file__).parents[2])
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, "gunicorn exited"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1) as reply:
                    assert reply.status == 200
                break
            except OSError:
                assert time.monotonic() < deadline, "gunicorn did not answer"
                time.sleep(0.1)
        time.sleep(1.0)  # the control socket, if any, is up by now
        assert not (tmp_path / ".gunicorn").exists()
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_g4_the_config_disables_the_control_socket() -> None:
    """G4: the setting gunicorn (>= 25) reads is set in app/gunicorn_conf.py."""
    import gunicorn.config

    import app.gunicorn_conf as conf

    assert "control_socket_disable" in gunicorn.config.Config().settings
    assert conf.control_socket_disable is True


# --- LangGraph's reserved config keys ------------------------------------------------


def test_a3_every_langgraph_config_key_but_thread_id_is_reserved() -> None:
    """A3: the refused keys cover every `CONFIG_KEY_*` of the installed
    LangGraph (thread_id excepted: the server's value replaces a client's)."""
    from langgraph._internal import _constants

    from shared.runs.reserved import is_reserved, without_reserved

    names = {getattr(_constants, n) for n in dir(_constants) if n.startswith("CONFIG_KEY_")} - {
        "thread_id"
    }
    assert names and all(is_reserved(k) for k in names)
    assert not is_reserved("thread_id") and not is_reserved("tokens")
    assert without_reserved({"__pregel_checkpointer": 1, "tokens": 3}) == {"tokens": 3}
