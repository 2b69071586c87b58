"""Webhooks: a run's end POSTed, signed, to the URL its client gave.

policy.py   the egress policy (SSRF) and the URL check, pure
signing.py  X-Threadrun-Signature: HMAC-SHA256 over `<ts>.<delivery id>.<body>`
retry.py    attempt outcomes and the backoff schedule, pure
sender.py   one attempt: resolve, check, POST to the checked address
store.py    the outbox (`webhook_deliveries`): insert at admission, claim, record, sweep

One delivery attempt from claim to record (the Celery task calls it) is one floor up, in
shared/runs/webhook_delivery.py: its body is the run's, and runs admit the deliveries
stored here, so the parts below know nothing of runs.
"""
