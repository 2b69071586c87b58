"""shared/gc_tuning.py: the collector settings a ready web or worker process takes."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from shared import gc_tuning
from shared.settings import Settings


@pytest.fixture
def restored() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_settle_freezes_the_start_up_heap_and_raises_gen0(restored: None) -> None:
    gc_tuning.settle(10_000)
    assert gc.get_threshold() == (10_000, gc_tuning.GEN1_THRESHOLD, gc_tuning.GEN2_THRESHOLD)
    assert gc.get_freeze_count() > 0


def test_settle_zero_leaves_the_collector_alone(restored: None) -> None:
    before = gc.get_threshold()
    gc_tuning.settle(0)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_the_default_threshold_is_documented() -> None:
    assert Settings.model_fields["gc_threshold0"].default == 10_000
