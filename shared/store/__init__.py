"""The LangGraph store (cross-thread memory) of a deployment, scoped per user.

`namespaces` (the user prefix, pure), `scoped` (`UserScopedStore`, a `BaseStore` over
another one), `config` (the config file's `store` section), `postgres` (tables, and the
web's and workers' views on `PostgresStore` / `AsyncPostgresStore`).
"""

from shared.store.config import StoreConfig, StoreConfigError
from shared.store.namespaces import (
    ForeignNamespace,
    check_namespace,
    scope,
    unscope,
    user_label,
)
from shared.store.postgres import UserStores, WorkerStore, setup, web_stores
from shared.store.scoped import UserScopedStore

__all__ = [
    "ForeignNamespace",
    "StoreConfig",
    "StoreConfigError",
    "UserScopedStore",
    "UserStores",
    "WorkerStore",
    "check_namespace",
    "scope",
    "setup",
    "unscope",
    "user_label",
    "web_stores",
]
