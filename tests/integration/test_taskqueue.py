"""The Celery queue topology on Redis: each queue bound only to its own exchange."""

from __future__ import annotations

import redis

from shared.runs.taskqueue import drop_stale_bindings, make_celery
from shared.settings import Settings


def test_r4_stale_bindings_of_an_older_release_are_dropped(
    settings: Settings, rclient: redis.Redis
) -> None:
    """R4: a Redis that kept an older release's binding of `memory` to the `runs` exchange
    (every run task copied onto the memory queue) is cleaned at worker start; the current
    bindings stay."""
    app = make_celery(settings)
    with app.connection_for_write() as conn:
        for queue in app.amqp.queues.values():
            queue(conn.default_channel).declare()
    key = f"{settings.redis_prefix}celery:_kombu.binding.runs"
    stale = b"runs\x06\x16\x06\x16memory"
    rclient.sadd(key, stale)
    assert rclient.smembers(key) == {b"runs\x06\x16\x06\x16runs", stale}
    assert drop_stale_bindings(rclient, settings) == 1
    assert rclient.smembers(key) == {b"runs\x06\x16\x06\x16runs"}
    mem = f"{settings.redis_prefix}celery:_kombu.binding.memory"
    assert rclient.smembers(mem) == {b"memory\x06\x16\x06\x16memory"}
    assert drop_stale_bindings(rclient, settings) == 0
