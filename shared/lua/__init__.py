"""Lua scripts for the atomic Redis steps, one `.lua` file each, loaded only here.

Each file's header documents KEYS, ARGV, the return value and the invariant it keeps.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import overload

import redis
import redis.asyncio as aredis
from redis.commands.core import AsyncScript, Script


@cache
def source(name: str) -> str:
    """The text of `shared/lua/<name>.lua`."""
    return resources.files("shared.lua").joinpath(f"{name}.lua").read_text()


@overload
def register(client: aredis.Redis, name: str) -> AsyncScript: ...
@overload
def register(client: redis.Redis, name: str) -> Script: ...
def register(client: redis.Redis | aredis.Redis, name: str) -> Script | AsyncScript:
    """`shared/lua/<name>.lua` as a redis-py script (EVALSHA, loaded again on NOSCRIPT)."""
    return client.register_script(source(name))
