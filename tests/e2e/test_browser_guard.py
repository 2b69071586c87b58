"""A4: DNS rebinding and cross-site "simple" requests, against a keyless
loopback instance (local single-user mode: whoever reaches it acts as the local user).

Before the fix a page of `rebind.attacker.example` (resolving to 127.0.0.1) could create
threads, read the ops overview and open a WebSocket, and `POST /threads` with
`Content-Type: text/plain` (no preflight) returned 200.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from shared.tools.testing import Cluster
from tests.e2e.conftest import ClusterFactory

pytestmark = pytest.mark.e2e

REBIND = "rebind.attacker.example"


@pytest.fixture(scope="module")
def keyless(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    """A web process with no credentials at all, bound to 127.0.0.1 (local mode)."""
    with private_cluster("keyless", {"THREADRUN_API_KEYS": ""}) as c:
        c.start_web()
        yield c


def port(c: Cluster) -> int:
    return int(urlsplit(c.url).port or 80)


def upgrade(**extra: str) -> dict[str, str]:
    return {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
        **extra,
    }


def test_a4_a_rebound_host_is_refused_everywhere(keyless: Cluster) -> None:
    """A Host that is not a loopback name gets 400 naming the setting, on the API, the ops
    API and the WebSocket upgrade; loopback names are served."""
    foreign = f"{REBIND}:{port(keyless)}"
    attack = {"Host": foreign, "Origin": f"http://{foreign}"}
    calls = [
        ("POST", "/threads", {**attack, "Content-Type": "application/json"}),
        ("GET", "/ops/api/overview", attack),
        ("GET", "/ws", upgrade(**attack)),
    ]
    for method, path, headers in calls:
        r = httpx.request(
            method,
            f"{keyless.url}{path}",
            headers=headers,
            content=b"{}" if method == "POST" else None,
            timeout=30,
        )
        assert r.status_code == 400, (path, r.status_code, r.text)
        assert "THREADRUN_ALLOWED_HOSTS" in r.json()["message"], r.text
    for name in ("127.0.0.1", "localhost"):
        r = httpx.post(
            f"{keyless.url}/threads", json={}, headers={"Host": f"{name}:{port(keyless)}"}
        )
        assert r.status_code == 200, (name, r.text)


def test_a4_a_cross_site_request_changes_nothing(keyless: Cluster) -> None:
    """A text/plain body is 415 naming Content-Type; a JSON request from a foreign browser
    origin is 403; the server's own origin and clients without Origin are served; a
    WebSocket from an origin whose host is not allowed is refused."""
    r = httpx.post(f"{keyless.url}/threads", content=b"{}", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415 and r.json()["field"] == "Content-Type", r.text
    r = httpx.post(f"{keyless.url}/threads", json={}, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and "origin" in r.json()["message"], r.text
    assert (
        httpx.post(f"{keyless.url}/threads", json={}, headers={"Origin": keyless.url}).status_code
        == 200
    )
    assert httpx.post(f"{keyless.url}/threads", json={}).status_code == 200
    reads = httpx.get(f"{keyless.url}/ok", headers={"Origin": "http://evil.example"})
    assert reads.status_code == 200  # reads change nothing (and CORS keeps their bodies)
    r = httpx.get(
        f"{keyless.url}/ws", headers=upgrade(Origin=f"http://{REBIND}:{port(keyless)}"), timeout=30
    )
    assert r.status_code == 403, r.text
    assert (
        httpx.get(f"{keyless.url}/ws", headers=upgrade(Origin=keyless.url), timeout=30).status_code
        == 101
    )
