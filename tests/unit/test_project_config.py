"""The project file (shared/project.py): every langgraph.json key honoured, build-only, or
refused at start-up naming the key and the file; `env`; the header rules."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from shared.authz.users import AuthUser, InvalidUser, normalize_user, run_subject
from shared.project import (
    BUILD_ONLY_KEYS,
    HeaderRules,
    ProjectConfigError,
    WebhooksSection,
    activate,
    parse_project,
)
from shared.webhooks.policy import parse_url
from shared.webhooks.project_rules import WebhookRules

GRAPHS = {"agent": "./agent.py:graph"}


def write(folder: Path, config: dict[str, Any]) -> Path:
    path = folder / "langgraph.json"
    path.write_text(json.dumps(config))
    return path


def test_build_only_keys_are_accepted(tmp_path: Path) -> None:
    config: dict[str, Any] = {"graphs": GRAPHS, "dependencies": ["."]}
    config.update({k: ["x"] if k == "dockerfile_lines" else "x" for k in BUILD_ONLY_KEYS})
    config["source"] = {"kind": "uv"}
    config["keep_pkg_tools"] = True
    project = parse_project(write(tmp_path, config))
    assert project.graph_specs() == GRAPHS


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"htp": {}}, "unknown key 'htp'"),
        ({"http": {"dsiable_runs": True}}, "unknown key 'http.dsiable_runs'"),
        ({"http": {"mount_prefix": "api/"}}, "http.mount_prefix"),
        ({"checkpointer": {"ttl": {"strategy": "archive"}}}, "checkpointer.ttl.strategy"),
        ({"checkpointer": {"path": "./saver.py:saver"}}, "'checkpointer.path' is set"),
        ({"encryption": {"path": "./enc.py:enc"}}, "'encryption' is set"),
        ({"auth": {"cache": {"ttl_seconds": 0}}}, "auth.cache.ttl_seconds"),
        ({"env": 3}, "env"),
    ],
)
def test_bad_or_unsupported_keys_name_the_key_and_file(
    tmp_path: Path, extra: dict[str, Any], message: str
) -> None:
    path = write(tmp_path, {"graphs": GRAPHS, **extra})
    with pytest.raises(ProjectConfigError, match=message) as info:
        parse_project(path)
    assert str(path) in str(info.value)


def test_graph_objects_with_descriptions(tmp_path: Path) -> None:
    graphs = {"a": {"path": "./a.py:g", "description": "the a graph"}, "b": "./b.py:g"}
    project = parse_project(write(tmp_path, {"graphs": graphs}))
    assert project.graph_specs() == {"a": "./a.py:g", "b": "./b.py:g"}
    assert project.graph_descriptions() == {"a": "the a graph"}


def test_env_file_and_mapping_and_the_process_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".env").write_text("TR_TEST_FROM_FILE=file\nTR_TEST_SET=file\n")
    monkeypatch.setenv("TR_TEST_SET", "process")
    monkeypatch.delenv("TR_TEST_FROM_FILE", raising=False)
    activate(write(tmp_path, {"graphs": GRAPHS, "env": ".env"}))
    assert os.environ["TR_TEST_FROM_FILE"] == "file"
    assert os.environ["TR_TEST_SET"] == "process"
    monkeypatch.delenv("TR_TEST_FROM_FILE")
    other = tmp_path / "other"
    other.mkdir()
    activate(write(other, {"graphs": GRAPHS, "env": {"TR_TEST_FROM_FILE": "mapping"}}))
    assert os.environ["TR_TEST_FROM_FILE"] == "mapping"
    with pytest.raises(ProjectConfigError, match="does not exist"):
        activate(write(tmp_path / "other", {"graphs": GRAPHS, "env": "missing.env"}))


def test_configurable_header_rules() -> None:
    rules = HeaderRules(includes=["x-*", "user-agent"], excludes=["x-secret-*"])
    headers = [
        ("X-Team", "blue"),
        ("x-secret-token", "s"),
        ("User-Agent", "sdk"),
        ("Authorization", "Bearer t"),
        ("x-api-key", "k"),
        ("Accept", "*/*"),
    ]
    assert rules.pick(headers) == {"x-team": "blue", "user-agent": "sdk"}
    assert HeaderRules(includes=["*"]).pick(headers) == {
        "x-team": "blue",
        "x-secret-token": "s",
        "user-agent": "sdk",
        "accept": "*/*",
    }
    assert HeaderRules().pick(headers) == {}


class Principal:
    identity = "carol"
    permissions = ["read"]

    def dict(self) -> dict[str, Any]:
        return {"team": "t1"}


@pytest.mark.parametrize(
    ("returned", "identity", "permissions", "extra"),
    [
        ("alice", "alice", [], {}),
        ({"identity": "bob", "permissions": ["write"], "org": "o"}, "bob", ["write"], {"org": "o"}),
        ((["admin"], {"identity": "root"}), "root", ["admin"], {}),
        (Principal(), "carol", ["read"], {"team": "t1"}),
    ],
)
def test_every_user_form_the_official_server_takes(
    returned: Any, identity: str, permissions: list[str], extra: dict[str, Any]
) -> None:
    user = normalize_user(returned)
    assert user.identity == user["identity"] == identity
    assert user.permissions == permissions
    assert user.is_authenticated and user.display_name == identity
    for key, value in extra.items():
        assert user[key] == value and getattr(user, key) == value
    assert AuthUser(user.dict()) == user  # what a run stores comes back the same


@pytest.mark.parametrize("returned", [None, 3, {"name": "x"}, {"identity": ""}, ("a",)])
def test_what_is_not_a_user(returned: Any) -> None:
    with pytest.raises(InvalidUser):
        normalize_user(returned)


def test_run_subject_is_the_server_set_identity() -> None:
    assert run_subject("tenant", {"configurable": {"langgraph_auth_user_id": "alice"}}) == "alice"
    assert run_subject("bob", {"configurable": {}}) == "bob"
    assert run_subject("bob", None) == "bob"


def test_webhook_rules_of_the_project() -> None:
    """`webhooks.url` refuses what the official server refuses; `headers` templates read
    only variables under `env_prefix`, resolved once."""
    section = WebhooksSection.model_validate(
        {
            "env_prefix": "HOOK_",
            "url": {
                "require_https": True,
                "allowed_domains": ["hooks.example.com", "*.corp.example"],
                "allowed_ports": [443, 8443],
                "max_url_length": 60,
            },
            "headers": {"X-Token": "Bearer ${{ env.HOOK_TOKEN }}", "X-Static": "s"},
        }
    )
    rules = WebhookRules.from_section(section, "lg.json", {"HOOK_TOKEN": "t0k"})
    assert rules.headers == {"X-Token": "Bearer t0k", "X-Static": "s"}
    ok = ["https://hooks.example.com/x", "https://a.corp.example:8443/y"]
    assert [rules.refusal(parse_url(u)) for u in ok] == [None, None]
    refused = {
        "http://hooks.example.com/x": "require_https",
        "https://corp.example/x": "allowed_domains",  # the apex is not a subdomain
        "https://evil.example/x": "allowed_domains",
        "https://hooks.example.com:444/x": "allowed_ports",
        "https://hooks.example.com/" + "a" * 60: "max_url_length",
    }
    for url, why in refused.items():
        assert why in (rules.refusal(parse_url(url)) or ""), url
    with pytest.raises(ProjectConfigError, match="env_prefix"):
        WebhookRules.from_section(
            WebhooksSection.model_validate({"headers": {"X": "${{ env.SECRET_KEY }}"}}), "f", {}
        )
    with pytest.raises(ProjectConfigError, match="is not set"):
        WebhookRules.from_section(
            WebhooksSection.model_validate({"headers": {"X": "${{ env.LG_WEBHOOK_T }}"}}), "f", {}
        )
    with pytest.raises(ProjectConfigError, match="allowed_domains"):
        WebhookRules.from_section(
            WebhooksSection.model_validate({"url": {"allowed_domains": ["a.*.com"]}}), "f", {}
        )
