"""A5: the `/openapi.json` document is valid OpenAPI 3.1 and every `$ref` in it resolves
(a dangling ref made schemathesis skip the parameters that named it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from flask import Flask
from schemathesis.core.result import Err, Ok
from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR

from app import create_app
from shared.settings import Settings


@pytest.fixture(scope="module")
def document(settings: Settings) -> dict[str, Any]:
    app: Flask = create_app(settings)
    answer = app.test_client().get("/openapi.json")
    assert answer.status_code == 200
    doc: dict[str, Any] = answer.get_json()
    return doc


def _refs(node: Any, where: str = "#") -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield where, value
            else:
                yield from _refs(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _refs(value, f"{where}/{i}")


def _resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), f"{ref} is not a local JSON pointer"
    node: Any = doc
    for raw in ref[2:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list):
            node = node[int(part)]
        else:
            assert isinstance(node, dict) and part in node, ref
            node = node[part]
    return node


def test_a5_every_ref_of_the_openapi_document_resolves(document: dict[str, Any]) -> None:
    """A5: walk the whole document; every `$ref` is a local pointer to a schema that is
    there (no `#/$defs/...` left over from a model's own schema)."""
    found = list(_refs(document))
    assert len(found) > 20  # the walk saw the document's refs
    dangling = []
    for where, ref in found:
        try:
            _resolve(document, ref)
        except (AssertionError, IndexError, ValueError):
            dangling.append((where, ref))
    assert not dangling, dangling
    assert not [ref for _, ref in found if ref.startswith("#/$defs/")]


def test_a5_query_parameters_name_their_enums_as_components(document: dict[str, Any]) -> None:
    """A5: a query parameter typed by an enum (a run's status, a cancel's action) refers to
    its component, which exists."""
    schemas = document["components"]["schemas"]
    refs = {
        ref
        for methods in document["paths"].values()
        for op in methods.values()
        for param in op.get("parameters", [])
        if param["in"] == "query"
        for _, ref in _refs(param["schema"])
    }
    assert refs  # some query parameter names a component
    assert all(ref.startswith("#/components/schemas/") for ref in refs), refs
    assert {ref.rsplit("/", 1)[1] for ref in refs} <= set(schemas)


def test_a5_the_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    """A5: the document validates against the OpenAPI 3.1 meta-schema (schemathesis' own),
    and schemathesis loads every operation without an unresolvable reference."""
    OPENAPI_31_VALIDATOR.validate(document)
    schema = schemathesis.openapi.from_dict(document)
    schema.validate()
    results = list(schema.get_all_operations())
    errors = [str(result.err()) for result in results if isinstance(result, Err)]
    assert not errors, errors
    operations = [result.ok() for result in results if isinstance(result, Ok)]
    assert len(operations) > 20
