"""One home for Redis: key names and TTLs in `shared/redis_keys.py`, Lua in `shared/lua/`.

Every Lua script is a `.lua` file whose header states KEYS, ARGV, the return value and
the invariant it keeps, registered through `shared.lua.register` only; no module outside
`shared/redis_keys.py` builds a key from the prefix. New code that inlines a script or a
key name fails here, which is how the rule is kept. The key strings themselves are pinned:
deployed Redis data and kombu's `global_keyprefix` depend on them.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from shared import lua
from shared.redis_keys import Keys, LimitKeys, MemoryKeys
from tests.unit.sources import parse

ROOT = Path(__file__).resolve().parents[2]
LUA_DIR = ROOT / "shared" / "lua"
LOADER = "shared/lua/__init__.py"
KEYS_MODULE = "shared/redis_keys.py"
LUA_BODY = re.compile(r"redis\.p?call\s*\(")
"""What every Lua body has and no Python string needs."""
SCRIPT_CALLS = {"register_script", "eval", "evalsha", "eval_ro", "evalsha_ro"}
"""redis-py methods that take a script (the loader's `register_script` is the one use)."""


def _modules(*tops: str) -> Iterator[tuple[str, ast.Module]]:
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), parse(path)


def _strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def _last_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def test_no_lua_body_in_python_source() -> None:
    """A Lua script lives in a `.lua` file under shared/lua/, never in a Python string."""
    found = [
        f"{rel}:{line}"
        for rel, tree in _modules("app", "workers", "shared", "bench", "tests")
        for line, text in _strings(tree)
        if LUA_BODY.search(text)
    ]
    assert found == [], f"Lua bodies in Python strings (move them to shared/lua/): {found}"


def test_scripts_are_registered_only_by_the_loader() -> None:
    """`register_script` and EVAL are called only in shared/lua/__init__.py."""
    found = [
        f"{rel}:{node.lineno} {node.func.attr}"
        for rel, tree in _modules("app", "workers", "shared", "bench", "tests")
        if rel != LOADER
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in SCRIPT_CALLS
    ]
    assert found == [], f"script calls outside the loader (use shared.lua.register): {found}"


def test_no_key_built_from_the_prefix_outside_redis_keys() -> None:
    """No f-string `{...prefix}name:...` (a Redis key) outside shared/redis_keys.py."""
    found = []
    for rel, tree in _modules("app", "workers", "shared"):
        if rel == KEYS_MODULE:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.JoinedStr) or len(node.values) < 2:
                continue
            head, rest = node.values[0], node.values[1]
            if (
                isinstance(head, ast.FormattedValue)
                and _last_name(head.value).endswith("prefix")
                and isinstance(rest, ast.Constant)
                and ":" in str(rest.value)
            ):
                found.append(f"{rel}:{node.lineno}")
    assert found == [], f"Redis keys built outside shared/redis_keys.py: {found}"


def test_every_lua_file_documents_its_contract_and_is_used() -> None:
    """Each header states KEYS, ARGV, Returns and Invariant; each script is loaded somewhere."""
    py = "\n".join(
        p.read_text() for top in ("app", "workers", "shared") for p in (ROOT / top).rglob("*.py")
    )
    for path in sorted(LUA_DIR.glob("*.lua")):
        header = "\n".join(line for line in path.read_text().splitlines() if line.startswith("--"))
        for word in ("KEYS[1]", "ARGV[1]", "Returns", "Invariant:"):
            assert word in header, f"{path.name}: header does not state {word}"
        assert f'"{path.stem}"' in py, f"{path.name} is never loaded"


def test_loaded_script_names_exist() -> None:
    """Every `lua.register(client, "name")` / `lua.source("name")` names a shipped file."""
    for rel, tree in _modules("app", "workers", "shared"):
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"register", "source"}
                and _last_name(node.func.value) == "lua"
            ):
                name = node.args[-1]
                assert isinstance(name, ast.Constant), f"{rel}:{node.lineno}: name a file"
                assert lua.source(str(name.value)), f"{rel}:{node.lineno}"


def test_key_strings_are_unchanged() -> None:
    """The exact key names deployed data (and kombu's global_keyprefix) depend on."""
    k = Keys("p:")
    assert k.stream("r1") == "p:run:{r1}:stream"
    assert k.stream_meta("r1") == "p:run:{r1}:meta"
    assert k.lease("r1") == "p:run:{r1}:lease"
    assert k.cancel("r1") == "p:run:{r1}:cancel"
    assert k.reaper_leader() == "p:reaper:leader"
    assert k.worker("w1") == "p:worker:w1"
    assert k.ops_web("proc") == "p:ops:web:proc"
    assert k.ops_web_index() == "p:ops:web"
    assert k.celery_prefix() == "p:celery:"
    assert k.celery_queue("runs") == "p:celery:runs"
    assert k.kombu_bindings("binding", "runs") == "p:celery:_kombu.binding.runs"
    m = MemoryKeys("p:")
    assert (m.due, m.urgent, m.first, m.leases, m.claims, m.stats) == (
        "p:{memory}:due",
        "p:{memory}:urgent",
        "p:{memory}:first",
        "p:{memory}:leases",
        "p:{memory}:claims",
        "p:{memory}:stats",
    )
    assert m.updates("b") == "p:{memory}:updates:b"
    assert m.batch("t") == "p:{memory}:batch:t"
    tag = "bb82030dbc2bcaba32a9"  # sha256("u1")[:20]
    lim = LimitKeys("p:")
    assert lim.rate("u1") == f"p:limit:{{{tag}}}:runs-rate"
    assert lim.active("u1") == f"p:limit:{{{tag}}}:runs-active"
    assert lim.reserved("u1") == f"p:limit:{{{tag}}}:runs-reserved"
    assert lim.connections("u1") == f"p:limit:{{{tag}}}:connections"
