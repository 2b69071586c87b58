"""Provider models: what a `THREADRUN_MODEL` id needs, and what a failed model call means.

Two jobs, both about failing loudly instead of leaving a run `pending`:

- `preflight(settings)` is called before anything starts (the supervisor of `make run`,
  and every worker at `worker_init`): each configured model id (the run model, and the
  summary and memory models when set) must name a provider whose LangChain package is
  importable and whose API key is set. Its messages say what to install or set; a
  process that starts anyway would take runs and fail every one of them.
- `describe_model_error(exc)` turns a provider client's exception (openai's and
  anthropic's SDKs share one shape: `status_code`, `request.url`, `APITimeoutError`,
  `APIConnectionError`) into a typed, user-readable error record: the provider, the
  endpoint host, the HTTP status, the kind, and whether the client retried it. The
  client's own bounded retries with backoff (`max_retries`, THREADRUN_MODEL_MAX_RETRIES)
  are the retry policy: they already honour `Retry-After` and cover 408/409/429/5xx,
  timeouts and connection errors, so a second retry layer here would multiply them.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any

from shared.errors import ConfigError
from shared.settings import Settings

BUILTIN = "builtin"
MODEL_ERROR = "ModelCallError"
"""The `error` field of a run whose model call failed."""


@dataclass(frozen=True, slots=True)
class Provider:
    """What a LangChain provider needs: its module, the pip package and extra, its key."""

    module: str
    package: str
    extra: str | None = None  # the threadrun-server extra that installs `package`
    key_envs: tuple[str, ...] = ()  # any one of these (or THREADRUN_MODEL_API_KEY) will do


PROVIDERS: dict[str, Provider] = {
    "openai": Provider("langchain_openai", "langchain-openai", "openai", ("OPENAI_API_KEY",)),
    "anthropic": Provider(
        "langchain_anthropic", "langchain-anthropic", "anthropic", ("ANTHROPIC_API_KEY",)
    ),
    "azure_openai": Provider(
        "langchain_openai", "langchain-openai", "openai", ("AZURE_OPENAI_API_KEY",)
    ),
}
"""The providers threadrun documents and tests (README "Use a real model"); any other
`init_chat_model` provider works too, checked for its package only."""


class ModelConfigError(ConfigError, RuntimeError):
    """A configured model cannot work: its package or its API key is missing (still a
    RuntimeError, which make_model raised before)."""


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


def provider_info(provider: str) -> Provider | None:
    """The provider's requirements: ours when documented, else LangChain's module name."""
    if provider in PROVIDERS:
        return PROVIDERS[provider]
    from langchain.chat_models import base

    entry = getattr(base, "_BUILTIN_PROVIDERS", {}).get(provider)
    if entry is None:
        return None
    module = str(entry[0]).split(".", 1)[0]
    return Provider(module, module.replace("_", "-"))


def install_hint(info: Provider) -> str:
    """The one command that installs a provider's package."""
    if info.extra:
        return (
            f"run `make install EXTRAS={info.extra}`"
            f" (or `pip install -e '.[{info.extra}]'` in the checkout)"
        )
    return f"run `.venv/bin/pip install {info.package}`"


def _configured(settings: Settings) -> list[tuple[str, str]]:
    """(setting name, model id) of every model this deployment calls."""
    out = [("THREADRUN_MODEL", settings.model)]
    if settings.summary_enabled and settings.summary_model:
        out.append(("THREADRUN_SUMMARY_MODEL", settings.summary_model))
    if settings.memory_enabled and settings.memory_model:
        out.append(("THREADRUN_MEMORY_MODEL", settings.memory_model))
    return out


def check_model(setting: str, model: str, settings: Settings) -> str | None:
    """What is wrong with one configured model id (None: nothing we can see)."""
    if model == BUILTIN:
        return None
    provider, _name = parse_model_id(model)
    if provider is None:
        return (
            f"{setting}={model}: cannot tell its provider; write it as provider:model, "
            "e.g. openai:gpt-4o-mini or anthropic:claude-sonnet-4-5"
        )
    info = provider_info(provider)
    if info is None:
        return f"{setting}={model}: LangChain does not know the provider {provider!r}"
    if importlib.util.find_spec(info.module) is None:
        return f"{setting}={model} needs the {info.package} package: {install_hint(info)}"
    has_key = settings.model_api_key is not None and settings.model_api_key.get_secret_value()
    if info.key_envs and not has_key and not any(os.environ.get(k) for k in info.key_envs):
        keys = " or ".join(info.key_envs)
        return f"{setting}={model} needs an API key: set {keys} or THREADRUN_MODEL_API_KEY"
    return None


def preflight(settings: Settings) -> list[str]:
    """Every problem of the configured models, one readable line each (empty: all fine)."""
    problems = [check_model(name, model, settings) for name, model in _configured(settings)]
    return [p for p in problems if p is not None]


def require_models(settings: Settings) -> None:
    """Raise ModelConfigError listing every problem of the configured models."""
    problems = preflight(settings)
    if problems:
        raise ModelConfigError("; ".join(problems))


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
