"""Bearer JWTs (A4) verified with PyJWT: issuer, audience, an HS secret or public keys.

`sub` is the user id; the configured role claim (a string or a list) containing `ops`
grants the ops role. The verification key is chosen by the token's `alg` family so an
HS token is never checked against a public key (algorithm confusion).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

from shared.errors import ThreadrunError
from shared.settings import Settings

HMAC_ALGORITHMS = frozenset({"HS256", "HS384", "HS512"})


class InvalidToken(ThreadrunError):
    """The bearer token is not acceptable (the message never contains the token)."""


@dataclass(frozen=True, slots=True)
class TokenIdentity:
    """Who a valid token names."""

    user_id: str
    role: str


def looks_like_jwt(token: str) -> bool:
    """Three dot-separated parts (a JWS compact serialization)."""
    return token.count(".") == 2 and len(token) < 16384


class JwtVerifier:
    """Verifies bearer tokens against the configured issuer, audience and keys."""

    def __init__(self, settings: Settings) -> None:
        self.issuer = settings.jwt_issuer
        self.audience = settings.jwt_audience
        self.role_claim = settings.jwt_role_claim
        self.leeway = settings.jwt_leeway_s
        algs = {a.strip() for a in settings.jwt_algorithms.split(",") if a.strip()}
        self.secret = settings.jwt_secret.get_secret_value() if settings.jwt_secret else None
        self.hmac_algs = sorted(algs & HMAC_ALGORITHMS) if self.secret else []
        self.public_algs: list[str] = []
        self._pem: str | None = None
        self._jwks: jwt.PyJWKSet | None = None
        if settings.jwt_public_key_file is not None:
            self.public_algs = sorted(algs - HMAC_ALGORITHMS)
            self._load_public(settings.jwt_public_key_file)
        if not self.hmac_algs and not self.public_algs:
            raise ValueError("JWT verification needs THREADRUN_JWT_SECRET or a public key file")

    @classmethod
    def from_settings(cls, settings: Settings) -> JwtVerifier | None:
        """A verifier if a JWT secret or public key is configured."""
        if settings.jwt_secret is None and settings.jwt_public_key_file is None:
            return None
        return cls(settings)

    def _load_public(self, path: Path) -> None:
        text = path.read_text()
        if text.lstrip().startswith("{"):
            self._jwks = jwt.PyJWKSet.from_dict(json.loads(text))
        else:
            self._pem = text

    def _key_for(self, header: dict[str, Any]) -> tuple[Any, list[str]]:
        alg = header.get("alg")
        if alg in HMAC_ALGORITHMS:
            if alg not in self.hmac_algs:
                raise InvalidToken(f"algorithm {alg} is not accepted")
            return self.secret, [alg]
        if not isinstance(alg, str) or alg not in self.public_algs:
            raise InvalidToken(f"algorithm {str(alg)[:16]} is not accepted")
        if self._jwks is not None:
            kid = header.get("kid")
            for key in self._jwks.keys:
                if kid is None or key.key_id == kid:
                    return key.key, [alg]
            raise InvalidToken("no key with the token's kid")
        return self._pem, [alg]

    def verify(self, token: str) -> TokenIdentity:
        """The identity of a valid token, else InvalidToken."""
        try:
            header = jwt.get_unverified_header(token)
            key, algs = self._key_for(header)
            claims = jwt.decode(
                token,
                key,
                algorithms=algs,
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={"require": ["exp", "sub"]},
            )
        except jwt.PyJWTError as exc:
            raise InvalidToken(f"invalid bearer token: {type(exc).__name__}") from None
        sub = claims.get("sub")
        if not isinstance(sub, str) or not sub:
            raise InvalidToken("invalid bearer token: sub must be a non-empty string")
        role_value = claims.get(self.role_claim)
        roles = role_value if isinstance(role_value, list) else [role_value]
        return TokenIdentity(sub, "ops" if "ops" in roles else "user")
