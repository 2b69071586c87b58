"""gunicorn settings of the web process, read from `Settings` (THREADRUN_* variables).

    gunicorn -c python:app.gunicorn_conf 'app:create_app()'

The single source of the web server's settings for `make run` (shared/tools/supervisor.py), the e2e
clusters, the benchmarks and the deployment manifests; a `--bind` on the command line wins.

Server model: `gevent` by default, `gthread` selectable (`THREADRUN_WEB_WORKER_CLASS`). A
streaming connection (SSE or WebSocket) lives as long as the run it follows, and mostly waits.
Under gthread each one holds an OS thread, so a process serves at most `web_threads` of them
(64: the 65th waits in gunicorn's queue). Under gevent each is a greenlet: `python -m
bench.streams` held 5,000 idle connections (half WebSocket, half SSE) plus 100 streaming
WebSockets in one process at ~45 KB each (the README, "Web server model"). The monkey-patching (gunicorn's gevent worker runs `patch_all()` before it
loads the app) turns the subscription hub's thread, simple-websocket's reader threads and
psycopg_pool's workers into greenlets; redis-py waits on patched sockets and psycopg (>= 3.2)
sees the patched `select` and waits with it instead of its C wait (psycopg/waiting.py).
"""

from __future__ import annotations

import resource

from shared.settings import Settings

_settings = Settings()

wsgi_app = "app:create_app()"
bind = [
    f"[{_settings.host}]:{_settings.port}"
    if ":" in _settings.host
    else f"{_settings.host}:{_settings.port}"
]
# gevent: gunicorn's own, whose idle kept-alive connections are closed soon after a stop
# begins instead of holding it for the whole grace (app/gevent_worker.py).
worker_class = {"gevent": "app.gevent_worker.GeventWorker", "gthread": "gthread"}[
    _settings.web_worker_class
]
workers = _settings.web_workers
threads = _settings.web_threads  # gthread only
worker_connections = _settings.web_worker_connections  # gevent only
timeout = _settings.web_timeout_s
graceful_timeout = _settings.web_graceful_timeout_s
# gunicorn's default keep-alive (2 s) is shorter than the clients' pools keep an idle
# connection (httpx: 5 s), so a client reused one as the server closed it: `Connection reset
# by peer` on a request the server never read. Longer than the clients' expiry, it is they
# who close.
keepalive = _settings.web_keepalive_s
# gunicorn >= 25 opens a control socket (`gunicornc`) at ~/.gunicorn/gunicorn.ctl by default:
# one path for every instance of the user on the host, so one instance's socket answered for
# another's. We use no runtime control (signals do it), so none is opened.
control_socket_disable = True
# The access log (off unless GUNICORN_CMD_ARGS turns it on) prints only the request headers
# the project's `http.logging_headers` allows, never credentials (app/access_log.py).
logger_class = "app.access_log.HeaderRulesLogger"

FD_HEADROOM = 1024
"""File descriptors beyond the connections: Redis and PostgreSQL pools, logs, the hub."""


def _raise_nofile_limit(wanted: int) -> None:
    """Raise the soft RLIMIT_NOFILE towards `wanted` (never above the hard limit).

    Each connection is a file descriptor; the common soft default (1,024) would refuse
    connections long before `worker_connections`. Workers inherit the master's limit.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


if _settings.web_worker_class == "gevent":
    _raise_nofile_limit(worker_connections + FD_HEADROOM)


def post_worker_init(worker: object) -> None:
    """The app is loaded: freeze its start-up heap, fewer young collections
    (shared/gc_tuning.py, THREADRUN_GC_THRESHOLD0)."""
    from shared import gc_tuning

    gc_tuning.settle(_settings.gc_threshold0)


def worker_exit(server: object, worker: object) -> None:
    """Run the project app's lifespan shutdown; close the worker's PostgreSQL pools before
    the interpreter does: under gevent a pool closed by its finalizer prints a `greenlet is
    being finalized` traceback (Ctrl-C on `make run` printed one per pool)."""
    from app import project_http
    from shared.db import close_pools

    project_http.close(getattr(worker, "wsgi", None))  # the custom app's lifespan shutdown
    close_pools()
    _forget_logging_handlers()


def _forget_logging_handlers() -> None:
    """Flush the log handlers and drop logging's weak references to them. Each reference's
    callback (`logging._removeHandlerRef`) would otherwise run when its handler is collected
    during interpreter teardown, take logging's lock, and call gevent's `get_ident` after
    gevent's module globals are gone: `TypeError: 'NoneType' object is not callable`, once
    per handler at every stop (SPEC H1). A dropped weak reference never calls back."""
    import logging

    logging.shutdown()
    refs = getattr(logging, "_handlerList", None)  # private, present since Python 2.x
    if isinstance(refs, list):
        refs.clear()
