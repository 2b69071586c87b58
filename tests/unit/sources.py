"""Parsing the project's own sources in tests that read code as data (floors, boundaries,
error roots, the Lua home, ...).

`parse` keeps the garbage collector off while the AST is built:
CPython 3.11 counts the recursion depth of AST construction against the thread's, and a
finalizer that runs mid-parse (garbage the earlier e2e tests of the same pytest process
leave: sockets, clients, event loops) moves that count, which fails the parse with
`SystemError: AST constructor recursion depth mismatch` (fixed in later CPython releases).
"""

from __future__ import annotations

import ast
import gc
from pathlib import Path


def parse(path: Path, filename: str | None = None) -> ast.Module:
    """The AST of the file at `path` (`filename` names it in syntax errors)."""
    source = path.read_text()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename or str(path))
    finally:
        if was_enabled:
            gc.enable()
