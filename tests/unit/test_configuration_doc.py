"""docs/configuration.md lists every setting (what a deployment can tune is written down,
with its default), so a new setting cannot ship undocumented."""

from __future__ import annotations

from pathlib import Path

from shared.settings import Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_every_setting_has_a_row() -> None:
    text = DOC.read_text()
    missing = [
        f"THREADRUN_{name.upper()}"
        for name in Settings.model_fields
        if f"`THREADRUN_{name.upper()}`" not in text
    ]
    assert not missing, f"settings missing from docs/configuration.md: {missing}"
