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


def dumps(obj: Any) -> bytes:
    """Encode to JSON bytes, converting LangChain/pydantic objects on the way."""
    return orjson.dumps(obj, default=_default, option=_OPTS)


def dumps_str(obj: Any) -> str:
    """Encode to a JSON string."""
    return dumps(obj).decode()


def loads(data: bytes | str) -> Any:
    """Decode JSON."""
    return orjson.loads(data)


def to_jsonable(obj: Any) -> Any:
    """Round-trip through JSON so the result holds only plain values."""
    return orjson.loads(dumps(obj))
