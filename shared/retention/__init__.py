"""Thread expiry (SPEC P6): `checkpointer.ttl` of langgraph.json and the `ttl` a client
gives a thread.

- `policy.py`: what the project and the settings say (the default TTL, the sweep's interval
  and batch), pure;
- `removal.py`: removing a thread with everything that is its own, the one path of
  `DELETE /threads/{id}`, `/threads/prune` and the sweep;
- `sweeper.py`: the sweep the scheduler runs (workers/cron_beat.py), one at a time across
  schedulers (a PostgreSQL advisory lock), a thread per short transaction.
"""
