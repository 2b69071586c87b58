"""docs/guarantees.md stays true to the code.

Every requirement id cited in app/, workers/, shared/, tests/ or bench/ has an entry there;
every entry names at least one test (or says there is none yet); every `file::test` it names
exists. The same scan keeps tracker issue numbers out of the code: a comment says what it
means, not where it was asked for.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from tests.unit.sources import parse

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "guarantees.md"
SCANNED = ("app", "workers", "shared", "tests", "bench")
SUFFIXES = {".py", ".lua", ".sql", ".js", ".html", ".css", ".md"}

REQUIREMENT_ID = re.compile(r"\b[ABCGJLMRS][0-9]{1,2}\b")
"""A family letter of the specification (runs, leases, bridge, API, ...) and a number."""
REQUIREMENT_RANGE = re.compile(r"\b([ABCGJLMRS])([0-9]{1,2})-\1([0-9]{1,2})\b")
"""`R2-R5` cites R2, R3, R4 and R5."""
NOT_REQUIREMENTS: set[str] = set()
"""Tokens of the id's shape that are not requirement ids (none so far)."""
ISSUE_NUMBER = re.compile(r"\b(?:issues?|tickets?)\s*#?\s*[0-9]+\b", re.IGNORECASE)

DOC_ENTRY = re.compile(r"^- \*\*([A-Z][0-9]{1,2})\*\*", re.MULTILINE)
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
NO_TEST = "No test yet"


def _sources() -> list[Path]:
    """The text files the scan reads, in a stable order."""
    return [
        path
        for top in SCANNED
        for path in sorted((ROOT / top).rglob("*"))
        if path.suffix in SUFFIXES and path.is_file() and "__pycache__" not in path.parts
    ]


def _cited_ids(text: str) -> set[str]:
    """The requirement ids a text cites, ranges expanded."""
    ids = set(REQUIREMENT_ID.findall(text))
    for letter, low, high in REQUIREMENT_RANGE.findall(text):
        ids.update(f"{letter}{n}" for n in range(int(low), int(high) + 1))
    return ids - NOT_REQUIREMENTS


def _entries() -> dict[str, str]:
    """The doc's entries: requirement id -> its text (the guarantee line and its tests)."""
    text = DOC.read_text()
    starts = list(DOC_ENTRY.finditer(text))
    out: dict[str, str] = {}
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        body = text[match.start() : end].split("\n## ")[0]
        assert match.group(1) not in out, f"{match.group(1)} is listed twice"
        out[match.group(1)] = body
    return out


@cache
def _functions(rel: str) -> frozenset[str]:
    """Names of the functions and methods defined in one test file."""
    tree = parse(ROOT / rel, rel)
    return frozenset(
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    )


def test_every_cited_requirement_id_is_documented() -> None:
    """An id in a docstring, comment or test name has an entry in docs/guarantees.md."""
    documented = set(_entries())
    missing: dict[str, str] = {}
    for path in _sources():
        for rid in sorted(_cited_ids(path.read_text()) - documented):
            missing.setdefault(rid, path.relative_to(ROOT).as_posix())
    assert not missing, f"ids cited but not in docs/guarantees.md (id: first file): {missing}"


def test_every_entry_names_a_test_or_says_none() -> None:
    """An entry lists the tests that prove it, or says honestly that none does yet."""
    bare = [
        rid for rid, body in _entries().items() if not TEST_REF.search(body) and NO_TEST not in body
    ]
    assert not bare, f"entries with neither a test nor {NO_TEST!r}: {bare}"


def test_every_test_the_doc_names_exists() -> None:
    """Each `file::test` in docs/guarantees.md is a test function defined in that file."""
    refs = TEST_REF.findall(DOC.read_text())
    assert refs
    stale = [
        f"{rel}::{name}"
        for rel, name in refs
        if not name.startswith("test_") or not (ROOT / rel).is_file() or name not in _functions(rel)
    ]
    assert not stale, f"docs/guarantees.md names tests that do not exist: {stale}"


def test_no_issue_numbers_in_code() -> None:
    """Comments and docstrings say what they mean, not which tracker issue asked for it."""
    found = [
        f"{path.relative_to(ROOT).as_posix()}:{lineno}: {line.strip()}"
        for path in _sources()
        if path != Path(__file__).resolve()  # its own examples below
        for lineno, line in enumerate(path.read_text().splitlines(), 1)
        if ISSUE_NUMBER.search(line)
    ]
    assert not found, "issue numbers in code:\n" + "\n".join(found)


def test_the_scan_sees_ids_and_ranges() -> None:
    """The id scan finds single ids and expands ranges, and ignores look-alikes."""
    assert _cited_ids("claims (L1-L3) and R5; Q3 sales, H1, R100") == {"L1", "L2", "L3", "R5"}
    assert ISSUE_NUMBER.search("the ops view (issue 8)") and ISSUE_NUMBER.search("Issue #12")
    assert not ISSUE_NUMBER.search("the issuer of a token") and not ISSUE_NUMBER.search("#fff")
