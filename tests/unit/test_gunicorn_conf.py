"""app/gunicorn_conf.py: the web server's gunicorn settings come from Settings (THREADRUN_WEB_*)."""

from __future__ import annotations

import importlib
import resource
import sys
from types import ModuleType

import pytest
from pydantic import ValidationError

WEB_ENV = (
    "THREADRUN_HOST",
    "THREADRUN_PORT",
    "THREADRUN_WEB_WORKER_CLASS",
    "THREADRUN_WEB_WORKERS",
    "THREADRUN_WEB_THREADS",
    "THREADRUN_WEB_WORKER_CONNECTIONS",
    "THREADRUN_WEB_TIMEOUT_S",
    "THREADRUN_WEB_GRACEFUL_TIMEOUT_S",
    "THREADRUN_WEB_KEEPALIVE_S",
)


def load(monkeypatch: pytest.MonkeyPatch, **env: str) -> ModuleType:
    """A fresh import of the config module under `env`."""
    for name in WEB_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    sys.modules.pop("app.gunicorn_conf", None)
    return importlib.import_module("app.gunicorn_conf")


def test_defaults_are_gevent(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server model defaults to gevent with the Settings defaults."""
    conf = load(monkeypatch)
    assert conf.wsgi_app == "app:create_app()"
    assert conf.worker_class == "app.gevent_worker.GeventWorker" and conf.workers == 2
    assert conf.worker_connections == 10000 and conf.threads == 64
    assert conf.bind == ["127.0.0.1:8000"]
    assert conf.timeout == 0 and conf.graceful_timeout == 5
    assert conf.keepalive == 75


def test_keepalive_outlasts_the_clients_idle_expiry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server keeps an idle connection longer than httpx's pool does (the SDK's client):
    the client, not the server, closes it, so a reused connection is never one the server is
    closing. THREADRUN_WEB_KEEPALIVE_S sets it; 0 is one request per connection."""
    import httpx

    expiry = httpx.Limits().keepalive_expiry
    assert expiry is not None and load(monkeypatch).keepalive > expiry
    assert load(monkeypatch, THREADRUN_WEB_KEEPALIVE_S="0").keepalive == 0


def test_gthread_stays_selectable(monkeypatch: pytest.MonkeyPatch) -> None:
    """THREADRUN_WEB_WORKER_CLASS=gthread with its threads; IPv6 hosts are bracketed."""
    conf = load(
        monkeypatch,
        THREADRUN_WEB_WORKER_CLASS="gthread",
        THREADRUN_WEB_THREADS="8",
        THREADRUN_WEB_WORKERS="3",
        THREADRUN_HOST="::1",
        THREADRUN_PORT="8123",
        THREADRUN_WEB_GRACEFUL_TIMEOUT_S="2",
    )
    assert conf.worker_class == "gthread" and conf.threads == 8 and conf.workers == 3
    assert conf.bind == ["[::1]:8123"] and conf.graceful_timeout == 2


def test_unknown_worker_class_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad value stops gunicorn at start-up with the field named, not a broken server."""
    with pytest.raises(ValidationError, match="web_worker_class"):
        load(monkeypatch, THREADRUN_WEB_WORKER_CLASS="eventlet")


def test_gevent_raises_the_open_files_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each connection is a file descriptor: the soft limit is raised towards
    worker_connections + headroom (never above the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        conf = load(monkeypatch, THREADRUN_WEB_WORKER_CONNECTIONS="600")
        new_soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert new_soft == min(600 + conf.FD_HEADROOM, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
