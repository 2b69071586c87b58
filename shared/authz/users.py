"""The user `@auth.authenticate` returned, as handlers and graphs see it.

A handler may return a string (the identity), a dict with `identity` (and optional
`permissions`, `display_name`, `is_authenticated` and any fields of its own), an object with
an `identity` attribute (a `BaseUser`), or a `(permissions, user)` tuple: the official
server's forms. `AuthUser` offers both access styles the official server's user offers
(`user.identity` and `user["identity"]`), and is stored with the run as a plain dict, so a
graph on any worker gets the same user back (`config["configurable"]["langgraph_auth_user"]`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from shared.errors import ThreadrunError
from shared.vocab import JSONObject


class InvalidUser(ThreadrunError, ValueError):
    """`@auth.authenticate` returned something that is not a user."""


class AuthUser(Mapping[str, Any]):
    """A user with `identity`, `is_authenticated`, `display_name`, `permissions` and the
    handler's own fields (attribute and item access)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        identity = data.get("identity")
        if not isinstance(identity, str) or not identity:
            raise InvalidUser(f"a user needs a non-empty string identity, got {identity!r}")
        full = dict(data)
        full.setdefault("is_authenticated", True)
        full.setdefault("display_name", identity)
        full["permissions"] = _permissions(full.get("permissions", []))
        object.__setattr__(self, "_data", full)

    @property
    def identity(self) -> str:
        return str(self._data["identity"])

    @property
    def is_authenticated(self) -> bool:
        return bool(self._data["is_authenticated"])

    @property
    def display_name(self) -> str:
        return str(self._data["display_name"])

    @property
    def permissions(self) -> list[str]:
        return list(self._data["permissions"])

    def __getattr__(self, name: str) -> Any:
        try:
            return self._data[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def dict(self) -> JSONObject:
        """The user as a plain dict (what a run stores)."""
        return dict(self._data)

    def model_dump(self, **_: Any) -> JSONObject:
        return self.dict()

    def __repr__(self) -> str:
        return f"AuthUser(identity={self.identity!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (AuthUser, (self._data,))


def _permissions(value: Any) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise InvalidUser(f"permissions must be a list of strings, got {value!r}")
    if not all(isinstance(p, str) for p in value):
        raise InvalidUser("permissions must be a list of strings")
    return list(value)


def normalize_user(returned: Any) -> AuthUser:
    """The user for what `@auth.authenticate` returned (the official server's forms)."""
    permissions: Any = None
    if isinstance(returned, tuple):
        if len(returned) != 2:
            raise InvalidUser("a tuple answer must be (permissions, user)")
        permissions, returned = returned
    if isinstance(returned, AuthUser):
        data = returned.dict()
    elif isinstance(returned, str):
        data = {"identity": returned}
    elif isinstance(returned, Mapping):
        data = dict(returned)
    elif hasattr(returned, "identity"):
        data = _object_fields(returned)
    else:
        raise InvalidUser(
            "@auth.authenticate must return a string, a dict with 'identity', or an object"
            f" with an identity attribute; got {type(returned).__name__}"
        )
    if permissions is not None:
        data["permissions"] = permissions
    return AuthUser(data)


def _object_fields(user: Any) -> JSONObject:
    data: JSONObject = {}
    for dump in ("model_dump", "dict"):
        method = getattr(user, dump, None)
        if callable(method):
            try:
                found = method()
            except Exception:  # noqa: BLE001 - its own dump failed: its named fields still count
                found = None
            if isinstance(found, Mapping):
                data.update(found)
                break
    data["identity"] = user.identity
    for name in ("is_authenticated", "display_name", "permissions"):
        if hasattr(user, name):
            data[name] = getattr(user, name)
    return data


def stored_user(raw: Any) -> AuthUser | None:
    """A run's stored `langgraph_auth_user` as a user again (None when absent or unusable)."""
    if isinstance(raw, AuthUser):
        return raw
    if isinstance(raw, Mapping):
        try:
            return AuthUser(raw)
        except InvalidUser:
            return None
    return None


def run_subject(user_id: str | None, config: Mapping[str, Any] | None) -> str | None:
    """Whom a run's per-user limits count: the project's user it was made for (its
    `langgraph_auth_user_id`, which only the server sets), else the thread's owner."""
    configurable = (config or {}).get("configurable")
    if isinstance(configurable, Mapping):
        identity = configurable.get("langgraph_auth_user_id")
        if isinstance(identity, str) and identity:
            return identity
    return user_id
