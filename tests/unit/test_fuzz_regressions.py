"""What the schemathesis run over `/openapi.json` found (A3, A5), each pinned by a test."""

from __future__ import annotations

from flask import Flask
from pydantic import SecretStr

from app import create_app
from shared.settings import Settings


def test_a3_a5_a405_names_the_allowed_methods(settings: Settings) -> None:
    """A3/A5: a method a route does not take answers 405 with the JSON error body and the
    `Allow` header listing the methods it does take (RFC 9110 requires it); werkzeug's
    header used to be dropped when the error table rewrote the reply as JSON."""
    app: Flask = create_app(settings)
    client = app.test_client()
    res = client.open("/threads", method="TRACE")
    assert res.status_code == 405
    assert res.is_json and res.get_json()["error"] == "method_not_allowed"
    allowed = {m.strip() for m in res.headers["Allow"].split(",")}
    assert "POST" in allowed and "TRACE" not in allowed
    res = client.delete("/ok")
    assert res.status_code == 405 and "GET" in res.headers["Allow"]


def test_a3_every_repeated_include_value_is_validated(settings: Settings) -> None:
    """A3: GET /threads/{id} checks every `include` value, repeated or comma-separated (it
    read only the first: `include=&include=bogus` answered 200); a bad one is a 422 naming
    `include`, refused before the thread is looked up."""
    keyed = settings.model_copy(update={"api_keys": SecretStr("key-a:alice")})
    client = create_app(keyed).test_client()
    thread = "/threads/00000000-0000-4000-8000-000000000000"
    for qs in ("include=&include=bogus", "include=ttl&include=bogus", "include=ttl,bogus"):
        res = client.get(f"{thread}?{qs}", headers={"x-api-key": "key-a"})
        assert res.status_code == 422, (qs, res.get_data(as_text=True))
        assert res.get_json()["field"].startswith("include"), qs
