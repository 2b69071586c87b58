"""The `webhooks` section of langgraph.json: which URLs a run's webhook may name, and the
static headers every delivery carries, with the LangGraph Agent Server's meaning.

- `url.require_https`: an `http://` webhook is refused (422 naming `webhook`).
- `url.allowed_domains`: exact host names, or `*.example.com` (subdomains only, never the
  apex); when set, any other host is refused.
- `url.allowed_ports`: when set, the URL's port (or its scheme's default) must be listed.
- `url.max_url_length`: a longer URL is refused (the smaller of it and
  `THREADRUN_WEBHOOK_URL_MAX` applies).
- `url.disable_loopback`: the official server's switch for relative URLs (calls back into
  itself). threadrun takes absolute URLs only and refuses loopback addresses through its
  egress policy (`THREADRUN_WEBHOOK_ALLOW`), so both values are accepted and change nothing.
- `headers`: added to every delivery (threadrun's own delivery and signature headers win
  over a header of the same name). A value may hold `${{ env.NAME }}` templates, resolved
  once at start from the process environment; `NAME` must start with `env_prefix`
  (default `LG_WEBHOOK_`), so a project cannot leak other variables into requests. A name
  outside the prefix or a variable that is not set stops the start.

These rules come on top of the egress policy (shared/webhooks/policy.py), never instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from shared.project import ProjectConfigError, WebhooksSection, load_project
from shared.webhooks.policy import WebhookUrl

DEFAULT_ENV_PREFIX = "LG_WEBHOOK_"
_TEMPLATE = re.compile(r"\$\{\{\s*env\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


@dataclass(frozen=True)
class WebhookRules:
    """The project's URL rules and static headers (none: everything the egress policy
    allows, no extra headers)."""

    require_https: bool = False
    allowed_domains: tuple[str, ...] = ()
    allowed_ports: tuple[int, ...] | None = None
    max_url_length: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_section(
        cls,
        section: WebhooksSection | None,
        where: str,
        environ: Mapping[str, str] | None = None,
    ) -> WebhookRules:
        """The rules of a `webhooks` section (`where`: the file, for start-up errors)."""
        if section is None:
            return cls()
        url = section.url
        domains = tuple(d.lower().rstrip(".") for d in (url.allowed_domains or ())) if url else ()
        for domain in domains:
            bare = domain.removeprefix("*.")
            if not bare or "*" in bare:
                raise ProjectConfigError(
                    f"{where}: webhooks.url.allowed_domains: {domain!r} is not a host name or"
                    " '*.domain'"
                )
        ports = tuple(url.allowed_ports) if url and url.allowed_ports is not None else None
        if ports is not None and not all(1 <= p <= 65535 for p in ports):
            raise ProjectConfigError(f"{where}: webhooks.url.allowed_ports: ports are 1-65535")
        prefix = section.env_prefix or DEFAULT_ENV_PREFIX
        env = os.environ if environ is None else environ
        headers = {
            name: _resolved(value, prefix, env, f"{where}: webhooks.headers.{name}")
            for name, value in (section.headers or {}).items()
        }
        return cls(
            require_https=bool(url and url.require_https),
            allowed_domains=domains,
            allowed_ports=ports,
            max_url_length=url.max_url_length if url else None,
            headers=headers,
        )

    def refusal(self, url: WebhookUrl) -> str | None:
        """Why the project's rules refuse `url` (None: they allow it)."""
        if self.max_url_length is not None and len(url.url) > self.max_url_length:
            return f"at most {self.max_url_length} characters (webhooks.url.max_url_length)"
        if self.require_https and url.scheme != "https":
            return "must be https:// (webhooks.url.require_https)"
        if self.allowed_domains and not any(
            _host_matches(url.host, d) for d in self.allowed_domains
        ):
            return f"host {url.host} is not in webhooks.url.allowed_domains"
        if self.allowed_ports is not None and url.port not in self.allowed_ports:
            return f"port {url.port} is not in webhooks.url.allowed_ports"
        return None


def project_rules(config: Path) -> WebhookRules:
    """The rules of the project file at `config`."""
    project = load_project(config)
    return WebhookRules.from_section(project.config.webhooks, str(project.path))


def _host_matches(host: str, pattern: str) -> bool:
    host = host.lower()
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and host != pattern[2:]
    return host == pattern


def _resolved(value: str, prefix: str, env: Mapping[str, str], where: str) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if not name.startswith(prefix):
            raise ProjectConfigError(
                f"{where}: ${{{{ env.{name} }}}} does not start with the env_prefix {prefix!r}"
            )
        if name not in env:
            raise ProjectConfigError(f"{where}: the environment variable {name} is not set")
        return env[name]

    return _TEMPLATE.sub(one, value)
