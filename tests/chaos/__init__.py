"""Jepsen-style chaos tests: hosts as network namespaces, a seeded nemesis, a history checker.

- net.py: namespaces on a bridge, partitions (blackhole routes) and delay (netem)
- cluster.py: Redis primary/replica, Sentinels, PostgreSQL, web and worker hosts
- workload.py: SSE (langgraph-sdk) and WebSocket chat clients recording a history
- nemesis.py: the seeded fault schedule, applied and healed
- checker.py: the invariants over the history and the final database/Redis state
- harness.py: one run end to end (`python -m tests.chaos`, `make chaos`)
- test_chaos.py: a short fixed-seed run for `make test`
"""
