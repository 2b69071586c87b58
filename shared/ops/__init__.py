"""The ops view's library: figures from runs, leases, streams, queues and workers
(collector.py), the connection reports of web processes (connections.py), audited
actions (actions.py) and their SQL (store.py), and what is kept about worker processes:
their losses and finished runs (worker_history.py)."""
