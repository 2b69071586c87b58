"""`python -m shared.webhooks secret`: print the secret deliveries are signed with."""

from __future__ import annotations

import sys

from shared.db import make_pool
from shared.settings import Settings
from shared.webhooks.store import WebhookStore


def main(argv: list[str]) -> int:
    """Print THREADRUN_WEBHOOK_SECRET, or the deployment's generated one."""
    if argv != ["secret"]:
        print("usage: python -m shared.webhooks secret", file=sys.stderr)
        return 2
    settings = Settings()
    if settings.webhook_secret is not None and settings.webhook_secret.get_secret_value():
        print(settings.webhook_secret.get_secret_value())
        return 0
    pool = make_pool(settings, name="webhook-secret", max_size=1)
    try:
        print(WebhookStore(pool).deployment_secret().decode())
    finally:
        pool.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
