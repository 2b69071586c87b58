"""The ops view's library: figures from runs, leases, streams, queues and workers
(collector.py), the connection reports of web processes (connections.py), audited
actions (actions.py) and their SQL (store.py)."""
