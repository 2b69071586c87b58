"""`make run` (shared/tools/supervisor.py) with Redis Sentinel: a private HA group (a primary, a
replica, three Sentinels: shared/tools/testing/redis_ha.py); the supervisor finds the master
through the Sentinels, starts no Redis of its own and hands the Sentinel settings to every
process it starts. The children are stand-ins that report their environment.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.settings import Settings
from shared.tools import devservices as ds
from shared.tools import supervisor as sv
from shared.tools.testing.redis_ha import RedisHA

pytestmark = pytest.mark.skipif(
    shutil.which("redis-server") is None, reason="needs a redis-server binary on PATH"
)

NAMES = ("web", "worker", "memory", "scheduler")
REPORT = """
import os, pathlib, sys, time
keys = ("THREADRUN_REDIS_SENTINELS", "THREADRUN_REDIS_SENTINEL_MASTER",
        "THREADRUN_REDIS_SENTINEL_PASSWORD", "THREADRUN_REDIS_URL")
out = pathlib.Path(sys.argv[1])
out.with_suffix(".tmp").write_text("\\n".join(os.environ.get(k, "-") for k in keys))
out.with_suffix(".tmp").rename(out)
if sys.argv[2] == "stay":
    time.sleep(120)
"""


@pytest.fixture
def ha(tmp_path: Path) -> Iterator[RedisHA]:
    with RedisHA(tmp_path / "ha", sentinel_password="sentinel-pw", sync_delay_s=0) as group:
        yield group


def test_probe_sentinel_names_the_master_or_why_not(ha: RedisHA) -> None:
    settings = Settings(**ha.settings_update())
    assert ds.probe_sentinel(settings) == (f"127.0.0.1:{ha.ports['node0']}", None)
    address, why = ds.probe_sentinel(settings.model_copy(update={"redis_sentinel_master": "x"}))
    assert address == "" and why is not None and "MasterNotFoundError" in why


def test_supervisor_with_sentinel_starts_no_redis_and_passes_the_settings_on(
    ha: RedisHA,
    tmp_path: Path,
    database: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for key in list(os.environ):
        if key.startswith("THREADRUN_"):
            monkeypatch.delenv(key)
    for key, value in ha.env(db=3).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("THREADRUN_DATABASE_URL", database)
    monkeypatch.setenv("THREADRUN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("THREADRUN_PORT", str(ds.free_port()))
    monkeypatch.setenv("THREADRUN_READY_TIMEOUT_S", "600")
    reports = tmp_path / "reports"
    reports.mkdir()

    def child(name: str, stay: bool) -> sv.ChildSpec:
        argv = [sys.executable, "-c", REPORT, str(reports / name), "stay" if stay else "exit"]
        return sv.ChildSpec(name, argv)

    monkeypatch.setattr(sv, "migrate_spec", lambda: child("migrate", False))
    monkeypatch.setattr(sv, "default_specs", lambda s: [child(n, True) for n in NAMES])
    monkeypatch.setattr(ds, "start_embedded", _no_embedded)

    def ready(url: str, timeout: float = 2.0) -> bool:
        if all((reports / n).exists() for n in NAMES):
            os.kill(os.getpid(), signal.SIGTERM)  # as Ctrl-C would: a clean stop
            return True
        return False

    monkeypatch.setattr(sv, "http_ok", ready)
    assert sv.main([]) == 0
    out = capsys.readouterr().out
    master = f"127.0.0.1:{ha.ports['node0']}"
    assert f"(sentinel: master 'threadrun' at {master})" in out, out
    want = [ha.sentinels, "threadrun", "sentinel-pw", ha.env(db=3)["THREADRUN_REDIS_URL"]]
    for name in ("migrate", *NAMES):
        assert (reports / name).read_text().splitlines() == want, name
    assert not (tmp_path / "data" / "run").exists() or not any(
        (tmp_path / "data" / "run").iterdir()
    )


def _no_embedded(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("an embedded server was started although Sentinel is configured")
