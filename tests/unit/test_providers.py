"""provider models fail loudly at start and a failed call is a typed error.

`preflight` (shared/agent/providers.py) is what `make run`'s supervisor and every worker
check before starting; `describe_model_error` is the run's `error` record of a failed
provider call. The exceptions here are the real openai client's, built as it builds them.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import httpx2
import openai
import pytest
from pydantic import SecretStr

from shared.agent.providers import (
    MODEL_ERROR,
    describe_model_error,
    parse_model_id,
    preflight,
)
from shared.settings import Settings

URL = "http://llm.example:8443/v1/chat/completions"


@pytest.fixture(autouse=True)
def _no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "THREADRUN_MODEL_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def _without(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a)
    )


def test_builtin_needs_nothing() -> None:
    assert preflight(Settings()) == []


def test_parse_model_id_prefix_and_inference() -> None:
    assert parse_model_id("openai:gpt-4o-mini") == ("openai", "gpt-4o-mini")
    assert parse_model_id("gpt-4o") == ("openai", "gpt-4o")
    assert parse_model_id("claude-sonnet-4-5")[0] == "anthropic"
    assert parse_model_id("mystery-model")[0] is None


def test_missing_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """the message names the package and `make install EXTRAS=...`."""
    _without(monkeypatch, "langchain_openai")
    [problem] = preflight(Settings(model="openai:gpt-4o-mini"))
    assert problem.startswith("THREADRUN_MODEL=openai:gpt-4o-mini needs the langchain-openai")
    assert "make install EXTRAS=openai" in problem


def test_missing_key_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    [problem] = preflight(Settings(model="openai:gpt-4o-mini"))
    assert "set OPENAI_API_KEY or THREADRUN_MODEL_API_KEY" in problem
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert preflight(Settings(model="openai:gpt-4o-mini")) == []
    monkeypatch.delenv("OPENAI_API_KEY")
    keyed = Settings(model="openai:gpt-4o-mini", model_api_key=SecretStr("sk-x"))
    assert preflight(keyed) == []


def test_summary_and_memory_models_are_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """the memory and summary models are part of the deployment's models."""
    _without(monkeypatch, "langchain_anthropic")
    s = Settings(summary_model="anthropic:claude-haiku-4-5", memory_model="mystery-model")
    problems = preflight(s)
    assert problems[0].startswith("THREADRUN_SUMMARY_MODEL=anthropic:claude-haiku-4-5 needs")
    assert "make install EXTRAS=anthropic" in problems[0]
    assert problems[1].startswith("THREADRUN_MEMORY_MODEL=mystery-model: cannot tell")
    off = s.model_copy(update={"summary_enabled": False, "memory_enabled": False})
    assert preflight(off) == []


def _status_error(status: int, **kw: Any) -> openai.APIStatusError:
    request = httpx2.Request("POST", URL)
    response = httpx2.Response(status, request=request, json={"error": {"message": "boom"}})
    cls = {
        429: openai.RateLimitError,
        500: openai.InternalServerError,
        401: openai.AuthenticationError,
    }
    return cls[status]("boom", response=response, body=None)


def test_server_error_is_typed_with_host_status_and_retries() -> None:
    """provider, endpoint host, HTTP status and whether it was retried."""
    err = describe_model_error(_status_error(500), max_retries=2, model="openai:gpt-4o-mini")
    assert err is not None
    assert err["error"] == MODEL_ERROR and err["provider"] == "openai"
    assert (err["host"], err["status_code"], err["kind"]) == (
        "llm.example:8443",
        500,
        "server_error",
    )
    assert (err["retryable"], err["retries"], err["will_retry"]) == (True, 2, False)
    assert "llm.example:8443 answered HTTP 500" in err["message"]
    assert "retried 2 times" in err["message"]


def test_client_errors_are_not_retried_and_wrapped_errors_are_found() -> None:
    """An auth failure is not retried; langchain-openai's wrapper is traced to its cause."""
    err = describe_model_error(_status_error(401), max_retries=2)
    assert err is not None and (err["kind"], err["retries"]) == ("auth", 0)
    assert "not retried" in err["message"]
    try:
        try:
            raise openai.APITimeoutError(request=httpx2.Request("POST", URL))
        except openai.APITimeoutError as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as outer:
        timed_out = describe_model_error(outer, max_retries=0)
    assert timed_out is not None and timed_out["kind"] == "timeout"
    assert "not retried (THREADRUN_MODEL_MAX_RETRIES=0)" in timed_out["message"]


def test_other_errors_are_not_model_errors() -> None:
    assert describe_model_error(ValueError("tokens must be an integer")) is None


def test_make_run_stops_before_starting_anything(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make run` (the supervisor) prints what to set and exits 1 before it looks for
    services or starts a child."""
    from shared.tools import supervisor

    def never(*_: object) -> None:
        raise AssertionError("services were resolved")

    monkeypatch.setattr(supervisor, "resolve_services", never)
    monkeypatch.setenv("THREADRUN_MODEL", "openai:gpt-4o-mini")
    assert supervisor.main([]) == 1
    out = capsys.readouterr().out
    assert "error: THREADRUN_MODEL=openai:gpt-4o-mini needs an API key" in out


def test_a_worker_and_the_web_refuse_to_start_by_themselves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker or web process started on its own (compose, k8s) refuses too."""
    from app import create_app
    from shared.agent.providers import ModelConfigError
    from workers import celery_app

    monkeypatch.setenv("THREADRUN_MODEL", "openai:gpt-4o-mini")
    with pytest.raises(SystemExit, match="needs an API key"):
        celery_app._on_init()
    with pytest.raises(ModelConfigError, match="set OPENAI_API_KEY"):
        create_app(Settings(model="openai:gpt-4o-mini"))
