"""`http.disable_*`: which of threadrun's url rules each flag removes (a pure table), and
the removal itself (a rebuilt url map, so a removed route is a plain 404 before any
authentication, and /openapi.json no longer lists it).

The official server's groups mapped onto threadrun's rules: `threads` is /threads and
everything under a thread but its runs (state, history, copy, artifacts, events, messages,
token usage, the thread stream, compaction); `runs` is /runs (crons included, as the
official server files them), /threads/{id}/runs/... and the two WebSockets (they create and
join runs); `meta` is /openapi.json, /info, /metrics and /docs (threadrun has no /docs), and
/ok stays (it answers {"ok": true} without checks here anyway); `ui` is the chat page (/,
/ui and its files, and the generative UI's /ui/{graph_id}); `mcp` is /mcp and `a2a` is /a2a/...
and the agent cards under /.well-known (app/protocols/). The thread streaming protocol's
routes are under /threads, as the official server files them. /memory and /ops belong to
no official group and stay.
"""

from __future__ import annotations

from flask import Flask
from werkzeug.routing import Map, Rule

from shared.project import HttpSection

META_RULES = frozenset({"/openapi.json", "/info", "/metrics", "/docs"})
THREAD_RUNS = "/threads/<thread_id>/runs"


def _under(rule: str, prefix: str) -> bool:
    return rule == prefix or rule.startswith(prefix + "/")


def section_of(rule: str) -> str | None:
    """The official route group (`disable_<group>`) a threadrun url rule belongs to."""
    if rule in META_RULES:
        return "meta"
    if rule == "/" or _under(rule, "/ui"):
        return "ui"
    if rule.startswith("/.well-known/agent"):  # the A2A agent card at the root
        return "a2a"
    for group in ("assistants", "store", "mcp", "a2a"):
        if _under(rule, f"/{group}"):
            return group
    if (
        _under(rule, "/runs")
        or _under(rule, THREAD_RUNS)
        or rule in ("/ws", "/threads/<thread_id>/ws")
    ):
        return "runs"
    if _under(rule, "/threads"):
        return "threads"
    return None


def disabled_groups(http: HttpSection) -> frozenset[str]:
    """The groups the project's `disable_*` flags turn off."""
    flags = {
        "assistants": http.disable_assistants,
        "threads": http.disable_threads,
        "runs": http.disable_runs,
        "store": http.disable_store,
        "mcp": http.disable_mcp,
        "a2a": http.disable_a2a,
        "meta": http.disable_meta,
        "ui": http.disable_ui,
    }
    return frozenset(group for group, off in flags.items() if off)


def _unbound_copy(rule: Rule) -> Rule:
    """`rule` for a new map: `Rule.empty()` drops `websocket` and `merge_slashes`, and
    Flask's `provide_automatic_options` lives on the rule object."""
    copy = type(rule)(
        rule.rule,
        **rule.get_empty_kwargs(),
        websocket=rule.websocket,
        merge_slashes=rule.merge_slashes,
    )
    if hasattr(rule, "provide_automatic_options"):
        copy.provide_automatic_options = rule.provide_automatic_options  # type: ignore[attr-defined]
    return copy


def remove_disabled(app: Flask, groups: frozenset[str]) -> list[str]:
    """Rebuild `app.url_map` without the rules of `groups`; return the removed rules."""
    if not groups:
        return []
    old = app.url_map
    kept, removed = [], []
    for rule in old.iter_rules():
        if section_of(rule.rule) in groups:
            removed.append(rule.rule)
        else:
            kept.append(_unbound_copy(rule))
    new = Map(
        kept,
        default_subdomain=old.default_subdomain,
        strict_slashes=old.strict_slashes,
        merge_slashes=old.merge_slashes,
        redirect_defaults=old.redirect_defaults,
        converters=old.converters,
        sort_parameters=old.sort_parameters,
        sort_key=old.sort_key,
        host_matching=old.host_matching,
    )
    new.subdomain_matching = getattr(old, "subdomain_matching", False)  # type: ignore[attr-defined]
    app.url_map = new
    return removed
