"""Lua scripts for the atomic Redis steps; each file's header documents KEYS and ARGV."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def source(name: str) -> str:
    """The text of `shared/lua/<name>.lua`."""
    return resources.files("shared.lua").joinpath(f"{name}.lua").read_text()
