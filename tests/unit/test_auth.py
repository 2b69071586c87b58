"""A4 credentials (key format, JWT), A3 size limits, the frame bucket and secret redaction."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from app.auth import is_loopback
from app.cors import origins, same_origin
from app.errors import limit_body
from app.limits import LimitExceeded, TokenBucket, check_metadata_size, check_run_sizes
from shared.auth.keys import hash_key, is_managed_key, new_key
from shared.auth.tokens import InvalidToken, JwtVerifier, looks_like_jwt
from shared.settings import Settings

SECRET = "unit-test-hs-secret-0123456789abcdef"


def _hs_settings(**kw: object) -> Settings:
    return Settings(
        jwt_secret=SECRET,  # type: ignore[arg-type]
        jwt_issuer="https://issuer.example",
        jwt_audience="threadrun",
        **kw,  # type: ignore[arg-type]
    )


def _claims(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "sub": "alice",
        "iss": "https://issuer.example",
        "aud": "threadrun",
        "exp": int(time.time()) + 60,
    }
    base.update(kw)
    return base


def test_a4_new_keys_are_random_prefixed_and_hashed() -> None:
    """A4: a key carries its public prefix; only a 32-byte digest is stored."""
    key, prefix = new_key()
    other, _ = new_key()
    assert key.startswith(prefix + "_") and prefix.startswith("trk_") and len(prefix) == 12
    assert key != other and len(key) > 50
    assert is_managed_key(key) and not is_managed_key("key-alice")
    assert len(hash_key(key)) == 32 and hash_key(key) != hash_key(other)
    assert key.encode() not in hash_key(key)


def test_a4_jwt_hs256_sub_and_role_claim() -> None:
    """A4: `sub` is the user; the configured role claim (string or list) maps `ops`."""
    v = JwtVerifier(_hs_settings(jwt_role_claim="roles"))
    token = jwt.encode(_claims(roles=["reader", "ops"]), SECRET, algorithm="HS256")
    assert looks_like_jwt(token)
    ident = v.verify(token)
    assert (ident.user_id, ident.role) == ("alice", "ops")
    plain = jwt.encode(_claims(roles="reader"), SECRET, algorithm="HS256")
    assert v.verify(plain).role == "user"


@pytest.mark.parametrize(
    "claims",
    [
        _claims(aud="someone-else"),
        _claims(iss="https://evil.example"),
        _claims(exp=int(time.time()) - 3600),
        {k: v for k, v in _claims().items() if k != "sub"},
        {k: v for k, v in _claims().items() if k != "exp"},
        _claims(sub=""),
    ],
    ids=["audience", "issuer", "expired", "no-sub", "no-exp", "empty-sub"],
)
def test_a4_jwt_refused(claims: dict[str, object]) -> None:
    """A4: wrong audience/issuer, expired, or missing sub/exp: refused."""
    token = jwt.encode(claims, SECRET, algorithm="HS256")
    with pytest.raises(InvalidToken):
        JwtVerifier(_hs_settings()).verify(token)


def test_a4_jwt_wrong_secret_and_alg_none_refused() -> None:
    """A4: a token signed with another secret, or unsigned, is refused."""
    v = JwtVerifier(_hs_settings())
    with pytest.raises(InvalidToken):
        v.verify(jwt.encode(_claims(), "another-secret-0123456789abcdef0", algorithm="HS256"))
    with pytest.raises(InvalidToken):
        v.verify(jwt.encode(_claims(), None, algorithm="none"))


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def test_a4_jwt_rs256_pem_and_jwks(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    """A4: RS256 against a PEM public key file and against a JWKS file (by `kid`)."""
    pem = rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    pem_file = tmp_path / "pub.pem"
    pem_file.write_bytes(pem)
    token = jwt.encode(_claims(), rsa_key, algorithm="RS256", headers={"kid": "k1"})
    v = JwtVerifier(
        Settings(
            jwt_public_key_file=pem_file,
            jwt_issuer="https://issuer.example",
            jwt_audience="threadrun",
        )
    )
    assert v.verify(token).user_id == "alice"
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.public_key()))
    jwks_file = tmp_path / "jwks.json"
    jwks_file.write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig"}]}))
    vj = JwtVerifier(
        Settings(
            jwt_public_key_file=jwks_file,
            jwt_issuer="https://issuer.example",
            jwt_audience="threadrun",
        )
    )
    assert vj.verify(token).user_id == "alice"
    other = jwt.encode(_claims(), rsa_key, algorithm="RS256", headers={"kid": "k2"})
    with pytest.raises(InvalidToken):
        vj.verify(other)


def test_a4_jwt_no_algorithm_confusion(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    """A4: with only a public key configured, an HS256 token signed with that key's PEM fails."""
    pem = rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    pem_file = tmp_path / "pub.pem"
    pem_file.write_bytes(pem)
    v = JwtVerifier(Settings(jwt_public_key_file=pem_file))
    forged = jwt.api_jws.PyJWS().encode(
        json.dumps(_claims(aud=None, iss=None)).encode(), b"x" * 32, algorithm="HS256"
    )
    with pytest.raises(InvalidToken):
        v.verify(forged)


def test_a4_no_jwt_verifier_without_keys() -> None:
    """A4: bearer JWTs are off unless a secret or public key is configured."""
    assert JwtVerifier.from_settings(Settings()) is None


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("127.0.0.2", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.1.2.3", False),
        ("example.com", False),
    ],
)
def test_a4_loopback_detection(host: str, loopback: bool) -> None:
    """A4: only loopback binds may run the open single-user mode."""
    assert is_loopback(host) is loopback


def test_a3_run_sizes_name_the_limit_and_field() -> None:
    """A3: input, stream_mode length and metadata sizes are 422 naming limit and field."""
    s = Settings(max_input_bytes=256, max_stream_modes=2, max_metadata_bytes=64)
    check_run_sizes({"input": {"m": "x" * 100}, "stream_mode": ["values"]}, s)
    cases = [
        ({"input": {"m": "x" * 300}}, "max_input_bytes", "input"),
        ({"command": {"resume": "x" * 300}}, "max_input_bytes", "command"),
        ({"stream_mode": ["values"] * 3}, "max_stream_modes", "stream_mode"),
        ({"metadata": {"k": "v" * 100}}, "max_metadata_bytes", "metadata"),
        ({"config": {"metadata": {"k": "v" * 100}}}, "max_metadata_bytes", "config.metadata"),
        ({"context": {"k": "v" * 100}}, "max_metadata_bytes", "context"),
    ]
    for data, limit, field in cases:
        with pytest.raises(LimitExceeded) as err:
            check_run_sizes(data, s)
        assert (err.value.limit, err.value.field, err.value.status) == (limit, field, 422)
        assert limit_body(err.value)["limit"] == limit
    with pytest.raises(LimitExceeded):
        check_metadata_size({"k": "v" * 100}, s)


def test_g3_token_bucket_refills_at_the_rate() -> None:
    """WebSocket frames per second: a burst, then one token per 1/rate seconds."""
    now = [0.0]
    bucket = TokenBucket(rate=4, burst=2, clock=lambda: now[0])
    assert bucket.take() and bucket.take() and not bucket.take()
    assert bucket.wait_s() == pytest.approx(0.25)
    now[0] += 0.25
    assert bucket.take() and not bucket.take()
    now[0] += 10
    assert bucket.take() and bucket.take() and not bucket.take()


def test_a4_origin_lists() -> None:
    """CORS/WebSocket allow-lists parse; same-origin compares host and port."""
    assert origins(" https://a.example/ ,http://b.example:8080,") == [
        "https://a.example",
        "http://b.example:8080",
    ]
    assert same_origin("http://127.0.0.1:8000", "127.0.0.1:8000")
    assert not same_origin("http://127.0.0.1:8001", "127.0.0.1:8000")
    assert not same_origin("null", "127.0.0.1:8000")


def test_g4_settings_repr_redacts_secrets() -> None:
    """Secrets never appear in the settings' repr, str or JSON dump."""
    secrets_ = ["pg-pass-123", "key-secret-456", "sk-model-789", "jwt-secret-abc", "redis-pw-0"]
    s = Settings(
        database_url=f"postgresql://u:{secrets_[0]}@db/threadrun",  # type: ignore[arg-type]
        api_keys=f"{secrets_[1]}:alice",  # type: ignore[arg-type]
        model_api_key=secrets_[2],  # type: ignore[arg-type]
        jwt_secret=secrets_[3],  # type: ignore[arg-type]
        redis_url=f"redis://:{secrets_[4]}@cache:6379/0",
    )
    for text in (repr(s), str(s)):
        for secret in secrets_:
            assert secret not in text
    assert "redis://:***@cache:6379/0" in repr(s)
    for secret in secrets_[:4]:
        assert secret not in s.model_dump_json()
    assert s.redis_url.startswith(f"redis://:{secrets_[4]}@")  # the value itself is intact
    assert s.api_key_map == {secrets_[1]: ("alice", "user")}


def test_a3_nul_characters_are_refused_naming_the_field() -> None:
    """A3: PostgreSQL cannot store NUL: a string or key holding one is a 422 naming the field."""
    from app.http import nul_field, validate
    from app.schemas import RunCreate
    from shared.errors import ValidationFailed

    assert nul_field({"a": {"b": ["x", "y\x00"]}}) == "a.b.1"
    assert nul_field({"k\x00": 1}) == "k\\u0000"
    assert nul_field({"a": "fine", "b": ["\\u0000 as text"]}) is None
    body = {"assistant_id": "lead_agent", "input": {"messages": [{"content": "a\x00b"}]}}
    with pytest.raises(ValidationFailed) as err:
        validate(RunCreate, body)
    assert err.value.field == "input.messages.0.content" and err.value.status == 422


def test_a3_non_string_stream_mode_is_a_422() -> None:
    """A3: a stream_mode entry that is an object is refused naming the field (was a 500)."""
    from app.http import validate
    from app.schemas import RunCreate
    from shared.errors import ValidationFailed

    with pytest.raises(ValidationFailed) as err:
        validate(RunCreate, {"assistant_id": "a", "stream_mode": [{"k": 1}]})
    assert err.value.field == "stream_mode"
