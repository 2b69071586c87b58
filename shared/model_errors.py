"""What a failed call to a model provider was: the run's typed `error` record of it.

On the ground floor (it imports nothing of threadrun) so that the journal, the executor
and the agent's providers (shared/agent/providers.py, which re-exports it) all describe a
provider failure the same way without importing each other.
"""

from __future__ import annotations

from typing import Any

MODEL_ERROR = "ModelCallError"
"""The `error` field of a run whose model call failed."""


def parse_model_id(model: str) -> tuple[str | None, str]:
    """(provider, model name) of an `init_chat_model` id; provider None when unknown.

    `provider:name` when the prefix is a LangChain provider, else LangChain's own
    inference from the name (`gpt-4o` -> openai, `claude-...` -> anthropic)."""
    from langchain.chat_models import base

    known: dict[str, Any] = getattr(base, "_BUILTIN_PROVIDERS", {})
    prefix, sep, rest = model.partition(":")
    if sep and prefix.replace("-", "_").lower() in known:
        return prefix.replace("-", "_").lower(), rest
    infer = getattr(base, "_attempt_infer_model_provider", None)
    provider = infer(model) if callable(infer) else None
    return (provider if isinstance(provider, str) else None), model


# --- failed model calls -----------------------------------------------------------------------
_RETRYABLE_STATUS = frozenset({408, 409, 429})
_CLIENT_MODULES = {
    "openai": "openai",
    "anthropic": "anthropic",
    "langchain_openai": "openai",  # its wrappers of openai's errors (same attributes)
    "langchain_anthropic": "anthropic",
    "httpx": None,
    "httpx2": None,
    "httpcore": None,
}
"""Modules whose exceptions are a provider call failing, and the provider they imply."""


def _client_error(exc: BaseException) -> BaseException | None:
    """The first exception of the cause chain raised by a provider client."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if type(cur).__module__.split(".", 1)[0] in _CLIENT_MODULES:
            return cur
        cur = cur.__cause__
    return None


def _status_kind(status: int) -> str:
    if status == 429:
        return "rate_limited"
    if status in (401, 403):
        return "auth"
    if status == 404:
        return "not_found"
    if status >= 500:
        return "server_error"
    return "bad_request"


def _host_of(exc: BaseException) -> str | None:
    for holder in (exc, getattr(exc, "response", None)):
        request = getattr(holder, "request", None) if holder is not None else None
        try:
            url = getattr(request, "url", None)
        except RuntimeError:  # httpx raises when an exception has no request attached
            url = None
        host = getattr(url, "host", None)
        if isinstance(host, str) and host:
            port = getattr(url, "port", None)
            return f"{host}:{port}" if isinstance(port, int) else host
    return None


def describe_model_error(
    exc: BaseException, *, max_retries: int | None = None, model: str | None = None
) -> dict[str, Any] | None:
    """The typed error record of a failed provider call, or None if `exc` is not one.

    `retries` is how many times the client retried before giving up: its `max_retries`
    for a retryable failure (the client retries those until it runs out), 0 otherwise.
    The run itself is not retried: a model failure is the run's outcome (`error`)."""
    found = _client_error(exc)
    if found is None:
        return None
    exc = found
    root = type(exc).__module__.split(".", 1)[0]
    name = type(exc).__name__
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        kind = _status_kind(status)
        retryable = status in _RETRYABLE_STATUS or status >= 500
    elif "Timeout" in name:
        kind, retryable, status = "timeout", True, None
    elif "Connection" in name or "Connect" in name:
        kind, retryable, status = "connection", True, None
    else:
        return None
    provider = _CLIENT_MODULES.get(root)
    if model is not None and (parsed := parse_model_id(model)[0]) is not None:
        provider = parsed
    host = _host_of(exc)
    retries: int | None = (max_retries if max_retries is not None else None) if retryable else 0
    what = {
        "rate_limited": "answered HTTP 429 (rate limited)",
        "auth": f"refused the API key (HTTP {status})",
        "not_found": "answered HTTP 404 (unknown model or endpoint)",
        "server_error": f"answered HTTP {status} (server error)",
        "bad_request": f"refused the request (HTTP {status})",
        "timeout": "did not answer in time (timeout)",
        "connection": "could not be reached (connection error)",
    }[kind]
    if retries is None:
        tried = "the client's retries ran out"
    elif retries:
        tried = f"retried {retries} time{'s' if retries != 1 else ''}, then gave up"
    else:
        tried = "not retried (THREADRUN_MODEL_MAX_RETRIES=0)" if retryable else "not retried"
    where = f" at {host}" if host else ""
    detail = str(exc)[:500]
    message = f"The model call failed: {provider or root}{where} {what}; {tried}. {detail}"
    return {
        "error": MODEL_ERROR,
        "message": message.strip(),
        "provider": provider or root,
        "model": model,
        "host": host,
        "status_code": status,
        "kind": kind,
        "retryable": retryable,
        "retries": retries,
        "will_retry": False,
        "exception": name,
    }
