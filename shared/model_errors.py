"""What a failed call to a model provider was: the run's typed `error` record of it.

On the ground floor (it imports only shared/errors.py) so that the journal, the executor
and the agent's providers (shared/agent/providers.py, which re-exports it) all describe a
provider failure the same way without importing each other. The retry loop of a provider
model (shared/agent/retrying.py) raises the two errors defined here, and
`describe_model_error` reads what they carry: how many attempts were made, and a
first-byte timeout that is ours, not the client's.
"""

from __future__ import annotations

from typing import Any

from shared.errors import UpstreamFailed

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
class FirstByteTimeout(UpstreamFailed):
    """A provider call sent nothing within THREADRUN_MODEL_FIRST_BYTE_TIMEOUT_S (it hangs)."""

    def __init__(self, timeout_s: float, host: str | None = None) -> None:
        super().__init__(f"the model sent nothing within {timeout_s:g} s (first-byte timeout)")
        self.timeout_s = timeout_s
        self.host = host


class ModelCallFailed(UpstreamFailed):
    """A provider model call given up on after `attempts` of at most `of` attempts; the
    failure of the last attempt is its `__cause__`. `mid_stream`: it failed after the
    answer had begun (never retried: what was streamed cannot be taken back)."""

    def __init__(self, cause: str, *, attempts: int, of: int, mid_stream: bool = False) -> None:
        super().__init__(f"the model call failed after {attempts} of {of} attempts: {cause}")
        self.cause = cause
        self.attempts = attempts
        self.of = of
        self.mid_stream = mid_stream


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


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and its `__cause__`s, outermost first."""
    out: list[BaseException] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        out.append(cur)
        cur = cur.__cause__
    return out


def _client_error(exc: BaseException) -> BaseException | None:
    """The first exception of the cause chain raised by a provider client (or our own
    first-byte timeout, which stands for one)."""
    for cur in _chain(exc):
        if isinstance(cur, FirstByteTimeout):
            return cur
        if type(cur).__module__.split(".", 1)[0] in _CLIENT_MODULES:
            return cur
    return None


def _gave_up(exc: BaseException) -> ModelCallFailed | None:
    return next((c for c in _chain(exc) if isinstance(c, ModelCallFailed)), None)


def _kind_of(exc: BaseException) -> tuple[str, bool, int | None] | None:
    """(kind, retryable, HTTP status) of a provider client's exception; None: not one."""
    name = type(exc).__name__
    status = getattr(exc, "status_code", None)
    if isinstance(exc, FirstByteTimeout):
        return "timeout", True, None
    if isinstance(status, int):
        return _status_kind(status), status in _RETRYABLE_STATUS or status >= 500, status
    if "Timeout" in name:
        return "timeout", True, None
    if "Connection" in name or "Connect" in name:
        return "connection", True, None
    return None


def is_model_failure(exc: BaseException) -> bool:
    """Whether `exc` is a provider call failing (an HTTP error, timeout, connection error)."""
    found = _client_error(exc)
    return found is not None and _kind_of(found) is not None


def is_retryable(exc: BaseException) -> bool:
    """Whether a failed provider call is worth another attempt: 408/409/429/5xx, a timeout
    (the client's or our first-byte one) or a connection error; never anything else."""
    found = _client_error(exc)
    kind = _kind_of(found) if found is not None else None
    return kind is not None and kind[1]


def short_cause(exc: BaseException) -> str:
    """A few words saying why a provider call failed ("HTTP 500", "timeout", ...), for a
    progress line; the exception's type for anything that is not a provider failure."""
    found = _client_error(exc)
    kind = _kind_of(found) if found is not None else None
    if found is None or kind is None:
        return type(exc).__name__
    if isinstance(found, FirstByteTimeout):
        return f"no answer within {found.timeout_s:g} s"
    name, _retryable, status = kind
    if status is not None:
        return f"HTTP {status}"
    return {"timeout": "timeout", "connection": "connection error"}.get(name, name)


def retry_after_s(exc: BaseException) -> float | None:
    """The wait a failed provider call's answer asked for (`retry-after-ms`, else a
    numeric `retry-after`), in seconds; None when it asked for none."""
    found = _client_error(exc)
    headers = getattr(getattr(found, "response", None), "headers", None)
    if headers is None:
        return None
    for header, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            value = float(headers.get(header) or "")
        except (TypeError, ValueError):
            continue
        if value >= 0:
            return value * scale
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

    `retries` is how many times the call was retried before giving up: what the retry
    loop (shared/agent/retrying.py) says it did when `exc` is its `ModelCallFailed`, else
    `max_retries` for a retryable failure and 0 otherwise. `attempts` is retries + 1.
    `short` is one line for a chat UI ("The model failed: HTTP 500, after 3 attempts");
    `detail` (= `message`) says everything. The run itself is not retried: a model failure
    is the run's outcome (`error`)."""
    found = _client_error(exc)
    kinds = _kind_of(found) if found is not None else None
    if found is None or kinds is None:
        return None
    gave_up = _gave_up(exc)
    kind, retryable, status = kinds
    root = type(found).__module__.split(".", 1)[0]
    provider = _CLIENT_MODULES.get(root)
    if isinstance(found, FirstByteTimeout):
        provider = None
    if model is not None and (parsed := parse_model_id(model)[0]) is not None:
        provider = parsed
    host = found.host if isinstance(found, FirstByteTimeout) else _host_of(found)
    retries: int | None
    if gave_up is not None:
        retries = gave_up.attempts - 1
    else:
        retries = (max_retries if max_retries is not None else None) if retryable else 0
    what = {
        "rate_limited": "answered HTTP 429 (rate limited)",
        "auth": f"refused the API key (HTTP {status})",
        "not_found": "answered HTTP 404 (unknown model or endpoint)",
        "server_error": f"answered HTTP {status} (server error)",
        "bad_request": f"refused the request (HTTP {status})",
        "timeout": "did not answer in time (timeout)",
        "connection": "could not be reached (connection error)",
    }[kind]
    if isinstance(found, FirstByteTimeout):
        what = f"sent nothing within {found.timeout_s:g} s (first-byte timeout)"
    if gave_up is not None and gave_up.mid_stream:
        tried = "it failed mid-answer, which is not retried"
    elif retries is None:
        tried = "the retries ran out"
    elif retries:
        tried = f"retried {retries} time{'s' if retries != 1 else ''}, then gave up"
    else:
        tried = "not retried (THREADRUN_MODEL_MAX_RETRIES=0)" if retryable else "not retried"
    where = f" at {host}" if host else ""
    detail = "" if isinstance(found, FirstByteTimeout) else str(found)[:500]  # said already
    who = provider or root
    message = f"The model call failed: {who}{where} {what}; {tried}. {detail}".strip()
    attempts = retries + 1 if retries is not None else None
    short = f"The model failed: {short_cause(found)}"
    if attempts is not None and attempts > 1:
        short += f", after {attempts} attempts"
    return {
        "error": MODEL_ERROR,
        "message": message,
        "short": short,
        "detail": message,
        "provider": who,
        "model": model,
        "host": host,
        "status_code": status,
        "kind": kind,
        "retryable": retryable,
        "retries": retries,
        "attempts": attempts,
        "will_retry": False,
        "exception": type(found).__name__,
    }
