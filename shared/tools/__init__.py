"""Process tooling, the top floor of `shared/`: finding or starting Redis and PostgreSQL
(`devservices`), the single-host supervisor of `make run` (`supervisor`), the `threadrun`
command's server-side plugins (`cli_keys`, `cli_migrate`) and the test harnesses
(`testing/`). The product's packages never import it (tests/unit/test_import_floors.py)."""
