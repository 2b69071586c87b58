"""RunLiveness: idle followers of one run share their "has it ended?" checks (B6, B7)."""

from __future__ import annotations

import time

from shared.bridge.subscriber import RunLiveness


def test_b7_followers_of_one_run_share_one_probe_per_interval() -> None:
    """B7: within the TTL every follower gets the first probe's answer; after it, a new probe."""
    calls: list[str] = []

    def probe() -> bool:
        calls.append("terminal")
        return False

    live = RunLiveness(ttl_s=0.2)
    answers = [live.ask("terminal", "run:a", probe) for _ in range(1000)]
    assert answers == [False] * 1000 and len(calls) == 1
    time.sleep(0.25)
    assert live.ask("terminal", "run:a", probe) is False and len(calls) == 2


def test_b7_answers_are_per_question_and_per_stream() -> None:
    """B7: `exists` and `terminal` of one stream, and the same question of two streams, are
    separate answers."""
    live = RunLiveness(ttl_s=60)
    assert live.ask("exists", "run:a", lambda: True) is True
    assert live.ask("terminal", "run:a", lambda: False) is False
    assert live.ask("terminal", "run:b", lambda: True) is True
    assert live.ask("exists", "run:a", lambda: False) is True  # cached
