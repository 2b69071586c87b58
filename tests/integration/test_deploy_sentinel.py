"""docker-compose.yml's Sentinel (profile `ha`) for real, without Docker: its start script
and its health check run against a private redis-server, with the container's fixed names
and port swapped for local ones. The generated config must give a Sentinel that knows the
master (with the Sentinel password), and a restart must keep the config it rewrote."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from shared.tools.devservices import free_port, parent_death_signal
from shared.tools.testing.redis_ha import redis_server
from tests.unit.test_deploy import compose, sentinel_script

pytestmark = pytest.mark.skipif(
    shutil.which("redis-server") is None, reason="needs a redis-server binary on PATH"
)


@contextlib.contextmanager
def started(argv: list[str], env: dict[str, str] | None = None) -> Iterator[int]:
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=parent_death_signal(signal.SIGKILL),
    )
    try:
        yield proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def master_of(port: int, password: str) -> object:
    with contextlib.suppress(redis.RedisError):
        client = redis.Redis(port=port, password=password, socket_timeout=1)
        with contextlib.closing(client):
            return client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "threadrun")
    return None


def test_compose_sentinel_script_monitors_the_primary_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    svc = compose()["services"]["sentinel1"]
    node_port, sentinel_port = free_port(), free_port()
    conf = tmp_path / "sentinel.conf"
    script = (
        sentinel_script(svc)
        .replace("/data/sentinel.conf", str(conf))
        .replace('echo "port 26379"', f'echo "port {sentinel_port}"; echo "bind 127.0.0.1"')
        .replace("$(hostname)", "127.0.0.1")
        .replace(" redis 6379 ", f" 127.0.0.1 {node_port} ")
        .replace("exec redis-server", f"exec {redis_server()}")
    )
    env = {**os.environ, **{k: str(v) for k, v in svc["environment"].items()}}
    env["SENTINEL_PASSWORD"] = "sentinel-pw"
    node = [redis_server(), "--port", str(node_port), "--bind", "127.0.0.1", "--save", "",
            "--dir", str(tmp_path)]  # fmt: skip
    check = svc["healthcheck"]["test"][1].replace("-p 26379", f"-p {sentinel_port}")
    with started(node):
        for attempt in (1, 2):
            with started(["sh", "-c", script], env):
                end = time.monotonic() + 30
                while master_of(sentinel_port, "sentinel-pw") is None and time.monotonic() < end:
                    time.sleep(0.1)
                assert master_of(sentinel_port, "sentinel-pw") == [
                    b"127.0.0.1",
                    str(node_port).encode(),
                ]
                assert subprocess.run(["sh", "-c", check], env=env).returncode == 0, attempt
                assert master_of(sentinel_port, "") is None  # the Sentinel wants its password
            text = conf.read_text()
            assert "sentinel myid" in text  # rewritten by the Sentinel, kept on restart
