"""JSON encoding of graph values and stream payloads (LangChain messages, pydantic, dataclasses)."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import enum
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from pydantic import BaseModel

_OPTS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def _default(obj: Any) -> Any:
    """Turn what orjson cannot encode into plain JSON values."""
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="python")
    if hasattr(obj, "to_json") and callable(obj.to_json) and not isinstance(obj, type):
        # LangChain Serializable objects that are not pydantic models.
        try:
            return obj.to_json()
        except Exception:  # noqa: BLE001 - fall through to the generic cases
            pass
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if hasattr(obj, "_asdict"):
        return obj._asdict()
    if isinstance(obj, set | frozenset):
        return list(obj)
    if isinstance(obj, bytes | bytearray):
        return base64.b64encode(bytes(obj)).decode()
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dt.timedelta):
        return obj.total_seconds()
    if isinstance(obj, uuid.UUID):
        return str(obj)
    if isinstance(obj, Mapping):
        return dict(obj)
    if isinstance(obj, Sequence) and not isinstance(obj, str):
        return list(obj)
    return repr(obj)


def _no_big_ints(obj: Any) -> Any:
    """Integers beyond 64 bits as floats (or strings beyond a double), through dicts and lists."""
    if isinstance(obj, int) and not isinstance(obj, bool) and not -(2**63) <= obj < 2**64:
        return float(obj) if abs(obj) < 1e308 else str(obj)
    if isinstance(obj, dict):
        return {k: _no_big_ints(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_no_big_ints(v) for v in obj]
    return obj


def dumps(obj: Any) -> bytes:
    """Encode to JSON bytes, converting LangChain/pydantic objects on the way."""
    try:
        return orjson.dumps(obj, default=_default, option=_OPTS)
    except TypeError as exc:
        # jsonb keeps numbers exact: a client's 1.5e20 comes back from Postgres as the int
        # 150000000000000000000, which orjson refuses (found by tests/e2e/test_fuzz.py).
        if "64-bit" not in str(exc):
            raise
        return orjson.dumps(_no_big_ints(obj), default=_default, option=_OPTS)


def dumps_str(obj: Any) -> str:
    """Encode to a JSON string."""
    return dumps(obj).decode()


def loads(data: bytes | str) -> Any:
    """Decode JSON."""
    return orjson.loads(data)


def to_jsonable(obj: Any) -> Any:
    """Round-trip through JSON so the result holds only plain values."""
    return orjson.loads(dumps(obj))
