"""Provider models: what a `THREADRUN_MODEL` id needs, and what a failed model call means.

Two jobs, both about failing loudly instead of leaving a run `pending`:

- `preflight(settings)` is called before anything starts (the supervisor of `make run`,
  and every worker at `worker_init`): each configured model id (the run model, and the
  summary and memory models when set) must name a provider whose LangChain package is
  importable and whose API key is set. Its messages say what to install or set; a
  process that starts anyway would take runs and fail every one of them.
- `describe_model_error(exc)` (shared/model_errors.py, on the ground floor so that the
  journal records it without reaching up into the agent) turns a provider client's exception (openai's and
  anthropic's SDKs share one shape: `status_code`, `request.url`, `APITimeoutError`,
  `APIConnectionError`) into a typed, user-readable error record: the provider, the
  endpoint host, the HTTP status, the kind, how many attempts were made, a `short`
  line for a chat UI and the whole `detail`. The retries are ours, not the client's
  (its `max_retries` is 0): shared/agent/retrying.py tries a call that failed before
  answering (408/409/429/5xx, timeouts, connection errors, a first-byte timeout) up to
  THREADRUN_MODEL_MAX_RETRIES more times, honouring `Retry-After`, and says so on the
  run's stream (`model_wait` custom events) while it waits.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from shared.errors import ConfigError
from shared.model_errors import MODEL_ERROR, describe_model_error, parse_model_id
from shared.settings import Settings

__all__ = [
    "BUILTIN",
    "MODEL_ERROR",
    "PROVIDERS",
    "ModelConfigError",
    "Provider",
    "describe_model_error",
    "parse_model_id",
]

BUILTIN = "builtin"


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
