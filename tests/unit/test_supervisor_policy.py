"""The supervisor's restart policy as pure logic: backoff and the crash-loop rule (SPEC H1)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from shared.settings import Settings
from shared.tools import supervisor as sv
from shared.tools.restart_policy import RestartOutcome, RestartPolicy

GRAPH = """
from typing import TypedDict

from langgraph.graph import END, START, StateGraph


class State(TypedDict):
    text: str


def echo(state: State) -> State:
    return {"text": state["text"]}


builder = StateGraph(State)
builder.add_node("echo", echo)
builder.add_edge(START, "echo")
builder.add_edge("echo", END)
graph = builder.compile()
"""
"""A minimal graph module for a project file of the tests' own (the dev loop watches it)."""


def policy(max_restarts: int = 3, window_s: float = 10.0) -> RestartPolicy:
    return RestartPolicy(
        backoff_s=0.5, backoff_max_s=3.0, max_restarts=max_restarts, window_s=window_s
    )


def test_h1_backoff_doubles_up_to_the_cap() -> None:
    p = policy(max_restarts=10)
    delays = [p.on_exit(float(t)).delay_s for t in range(5)]
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_h1_crash_loop_gives_up_after_max_restarts_in_the_window() -> None:
    p = policy(max_restarts=3, window_s=10.0)
    outcomes = [p.on_exit(t).outcome for t in (0.0, 1.0, 2.0, 3.0)]
    assert outcomes == [RestartOutcome.RESTART] * 3 + [RestartOutcome.GIVE_UP]
    assert p.on_exit(4.0).exits_in_window == 5


def test_h1_exits_outside_the_window_are_forgotten_and_backoff_resets() -> None:
    p = policy(max_restarts=2, window_s=10.0)
    assert p.on_exit(0.0).delay_s == 0.5
    assert p.on_exit(5.0).delay_s == 1.0
    late = p.on_exit(14.0)  # the exit at 0 is out of the window, the one at 5 is not
    assert late.outcome is RestartOutcome.RESTART and late.exits_in_window == 2
    later = p.on_exit(100.0)
    assert later.delay_s == 0.5 and later.exits_in_window == 1


def test_h1_zero_max_restarts_never_restarts() -> None:
    assert policy(max_restarts=0).on_exit(0.0).outcome is RestartOutcome.GIVE_UP


def test_h1_policy_factory_reads_the_settings() -> None:
    settings = Settings(
        supervisor_backoff_s=0.2,
        supervisor_backoff_max_s=0.4,
        supervisor_max_restarts=2,
        supervisor_restart_window_s=7,
    )
    make = sv.policy_factory(settings)
    first, second = make(), make()
    assert first is not second and first.exits is not second.exits
    assert (first.backoff_s, first.backoff_max_s, first.max_restarts, first.window_s) == (
        0.2,
        0.4,
        2,
        7,
    )


@pytest.mark.parametrize(
    ("code", "text"), [(3, "code 3"), (-9, "signal SIGKILL (code -9)"), (-200, "code -200")]
)
def test_exit_status_names_the_signal(code: int, text: str) -> None:
    assert sv.exit_status(code) == text


def test_runs_and_memory_worker_counts_start_that_many_named_nodes() -> None:
    settings = Settings(runs_workers=3, memory_workers=2)
    specs = sv.default_specs(settings, env={})
    names = [s.name for s in specs]
    assert names[:6] == ["web", "worker", "worker2", "worker3", "memory", "memory2"]
    nodes = [s.argv[s.argv.index("-n") + 1] for s in specs if "-n" in s.argv]
    assert len(nodes) == len(set(nodes))
    assert "runs3@%h" in nodes and "memory2@%h" in nodes


def test_make_worker_spec_is_a_runs_worker_with_a_node_name_of_its_own() -> None:
    spec = sv.extra_worker_spec(Settings(runs_workers=2), "4242")
    argv = list(spec.argv)
    assert argv[argv.index("-Q") + 1] == "runs"
    assert argv[argv.index("-n") + 1] == "runs-4242@%h"


def test_dev_loop_watch_sees_an_edit_once(tmp_path: Path) -> None:
    from shared.project import activate
    from shared.tools.reload_watch import ReloadWatch, watched_roots

    pkg = tmp_path / "graphs"
    pkg.mkdir()
    graph = pkg / "g.py"
    graph.write_text(GRAPH)
    config = tmp_path / "langgraph.json"
    config.write_text('{"graphs": {"echo": "./graphs/g.py:graph"}}')
    watch = ReloadWatch(watched_roots(activate(config), config))
    assert watch.roots == [config.resolve(), pkg.resolve()]
    assert not watch.changed()
    os.utime(graph, (time.time() + 5, time.time() + 5))
    assert watch.changed() and not watch.changed()
    (pkg / "helper.py").write_text("X = 1\n")
    assert watch.changed()
