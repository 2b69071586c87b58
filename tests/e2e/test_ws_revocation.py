"""A4: a revoked key stops working on a WebSocket opened before the revocation.

Before the fix HTTP answered 401 once the key cache expired, but `run.create` on a socket
opened earlier still worked. Now the socket re-checks its credential at least once per
cache TTL and on every `run.create`, and closes with 4401 after an `error` frame.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator

import httpx
import pytest
import simple_websocket

from shared.auth.keys import ApiKeyStore
from shared.db import make_pool
from shared.tools.testing import Cluster, wait_for
from tests.e2e.conftest import ClusterFactory, human

pytestmark = pytest.mark.e2e

TTL_S = 1.0


@pytest.fixture(scope="module")
def stored(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    """A web process that authenticates stored keys, cached for one second."""
    with private_cluster("revoke", {"THREADRUN_API_KEY_CACHE_TTL_S": str(TTL_S)}) as c:
        c.start_web()
        yield c


def frames_until_closed(ws: simple_websocket.Client, within: float) -> list[dict[str, object]]:
    """Every frame the server sends until it closes the socket (fails after `within` s)."""
    got: list[dict[str, object]] = []
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            raw = ws.receive(timeout=0.5)
        except simple_websocket.ConnectionClosed:
            return got
        if raw is not None:
            got.append(json.loads(raw))
    raise AssertionError(f"the socket is still open after {within} s: {got}")


@pytest.mark.parametrize("trigger", ["run.create", "idle"])
def test_a4_a_revoked_key_closes_its_open_socket(stored: Cluster, trigger: str) -> None:
    """Revoked while the socket is open: the next `run.create` is refused, or an idle socket
    is closed within about one cache TTL; either way an `unauthorized` error, then 4401."""
    pool = make_pool(stored.settings, name="test-keys", max_size=1)
    try:
        keys = ApiKeyStore(pool)
        record, secret = keys.create("carol")
        url = stored.url.replace("http://", "ws://") + "/ws"
        ws = simple_websocket.Client.connect(url, headers={"x-api-key": secret})
        try:
            ws.send(json.dumps({"type": "ping"}))
            assert json.loads(ws.receive(timeout=10))["type"] == "pong"
            keys.revoke(str(record.key_id))
            wait_for(
                lambda: (
                    httpx.get(
                        f"{stored.url}/threads/search", headers={"x-api-key": secret}
                    ).status_code
                    in (401, 405)
                ),
                timeout=10,
            )
            if trigger == "run.create":
                frame = {"type": "run.create", "assistant_id": "lead_agent", "input": human("hi")}
                ws.send(json.dumps(frame))
            got = frames_until_closed(ws, within=10 * TTL_S)
            assert [f.get("code") for f in got if f.get("type") == "error"] == ["unauthorized"], got
            assert not any(f.get("type") == "run.created" for f in got), got
            assert ws.close_reason == 4401
        finally:
            with contextlib.suppress(simple_websocket.ConnectionClosed):
                ws.close()
    finally:
        pool.close()
