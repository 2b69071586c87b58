"""The `threadrun` command's defaults and errors (A1): where it connects, which assistant
`chat` uses, and what it says when no server answers."""

from __future__ import annotations

import pytest

from threadrun.cli import main, pick_assistant
from threadrun.client import ThreadrunClientError, default_url


def test_a1_the_url_follows_threadrun_url_then_host_and_port() -> None:
    assert default_url({"THREADRUN_URL": "http://x:1", "THREADRUN_PORT": "9"}) == "http://x:1"
    assert default_url({"THREADRUN_PORT": "8913"}) == "http://127.0.0.1:8913"
    assert (
        default_url({"THREADRUN_HOST": "0.0.0.0", "THREADRUN_PORT": "80"}) == "http://127.0.0.1:80"
    )
    assert default_url({"THREADRUN_HOST": "::1"}) == "http://[::1]:8000"
    assert default_url({}) == "http://127.0.0.1:8000"


def test_a1_chat_uses_the_only_assistant_else_lead_agent() -> None:
    one = [{"assistant_id": "a-1", "graph_id": "research"}]
    assert pick_assistant(one) == "a-1"
    two = [*one, {"assistant_id": "a-2", "graph_id": "lead_agent"}]
    assert pick_assistant(two) == "lead_agent"
    assert pick_assistant([]) == "lead_agent"
    with pytest.raises(ThreadrunClientError, match="--assistant"):
        pick_assistant([*one, {"assistant_id": "a-3", "graph_id": "support"}])


def test_a1_no_server_is_a_sentence_with_the_url(capsys: pytest.CaptureFixture[str]) -> None:
    """A dead port: exit 1 and one line naming the URL and what to try (was a bare
    `ConnectError: [Errno 111]`)."""
    url = "http://127.0.0.1:9"
    assert main(["chat", "--url", url, "--message", "hi"]) == 1
    err = capsys.readouterr().err
    assert url in err and "make run" in err and "Traceback" not in err
    assert main(["status", "--url", url]) == 1
    err = capsys.readouterr().err
    assert url in err and "make run" in err
