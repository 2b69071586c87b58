"""Offline validation of the deployment files: docker-compose.yml against the Compose
Specification schema (vendored in `check-jsonschema`), deploy/k8s against the Kubernetes OpenAPI
schemas (`kubernetes-validate`, strict), the Prometheus rules and the adapter config against the
metric names contract, and every THREADRUN_* variable against shared/settings.py.

No Docker engine, cluster or network is needed.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import redis
import yaml

import shared.metrics
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
K8S = ROOT / "deploy" / "k8s"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
ADAPTER = ROOT / "deploy" / "prometheus" / "adapter-values.yaml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
K8S_VERSION = "1.30.0"
DEFAULTS = Settings.model_construct()
REQUIRED_ENV = {"FLOWER_BASIC_AUTH": "ops:secret", "THREADRUN_API_KEYS": "k1:alice,k2:ops:ops"}

# The metric names contract that shared/metrics.py implements: name -> label names.
METRICS: dict[str, set[str]] = {
    "threadrun_runs": {"status"},
    "threadrun_runs_stuck": set(),
    "threadrun_fenced_writes_total": {"sink"},
    "threadrun_queue_depth": {"queue"},
    "threadrun_queue_oldest_age_seconds": {"queue"},
    "threadrun_workers_online": {"queue"},
    "threadrun_stream_gaps_total": set(),
    "threadrun_connections_open": {"transport"},
    "threadrun_memory_backlog": set(),
    "threadrun_memory_updates_skipped_total": set(),
    "threadrun_tokens_total": {"kind"},
    "threadrun_run_duration_seconds": set(),
    "threadrun_runs_started_total": set(),
    "threadrun_runs_finished_total": {"status"},
    "threadrun_webhook_deliveries_total": {"outcome"},
}

# ----------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's `${VAR}`, `${VAR:-default}` and `${VAR:?error}` substitution (`$$` is a
    literal `$`). Hand-rolled: no maintained PyPI package implements Compose interpolation
    without a Docker engine; only these three forms are used in docker-compose.yml."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if name in env and (env[name] or op is None or not op.startswith(":")):
            return env[name]
        if op and op.endswith("?"):
            raise KeyError(f"${{{name}}} is required: {arg}")
        return arg or ""

    return _VAR.sub(sub, value.replace("$$", "\0")).replace("\0", "$")


def compose_raw() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


def compose() -> dict[str, Any]:
    """docker-compose.yml as Compose sees it with the required variables set, defaults elsewhere."""
    return dict(interpolate(compose_raw(), REQUIRED_ENV))


def compose_schema() -> dict[str, Any]:
    text = files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json")
    return dict(json.loads(text.read_text()))


def k8s_docs() -> Iterator[tuple[str, dict[str, Any]]]:
    """(file name, object) of every Kubernetes object under deploy/k8s."""
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path.name, doc


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in k8s_docs() if d["kind"] == kind}


def setting_env_names() -> set[str]:
    return {f"THREADRUN_{name.upper()}" for name in Settings.model_fields}


def python_sources() -> str:
    return "\n".join(
        p.read_text() for d in ("app", "workers", "shared") for p in (ROOT / d).rglob("*.py")
    )


def argv(cmd: Any) -> list[str]:
    return shlex.split(cmd) if isinstance(cmd, str) else [str(a) for a in cmd]


def option(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


# ----------------------------------------------------------------------------------------
# docker-compose.yml
# ----------------------------------------------------------------------------------------


def test_compose_file_matches_the_compose_spec_schema() -> None:
    """docker-compose.yml validates against the Compose Specification JSON schema, both as
    written and after interpolation; the schema really rejects a misspelt key."""
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    for doc in (compose_raw(), compose()):
        errors = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(doc)]
        assert errors == []
    broken = copy.deepcopy(compose())
    broken["services"]["web"]["healthcheck"]["intervall"] = "5s"
    assert not validator.is_valid(broken)
    for name in REQUIRED_ENV:  # no credentials, no start (A4; Flower's basic auth)
        with pytest.raises(KeyError, match=name):
            interpolate(compose_raw(), {k: v for k, v in REQUIRED_ENV.items() if k != name})


def test_compose_roles_health_checks_and_dependencies() -> None:
    """Every role is a service with a health check; web and workers start after the one-shot
    migration; runs workers scale with deploy.replicas; no beat (the reaper runs inside every
    runs worker, R4/L4); a stopping worker has time to hand its runs back (R7)."""
    services = {n: s for n, s in compose()["services"].items() if "profiles" not in s}
    assert set(services) == {
        "redis",
        "postgres",
        "migrate",
        "web",
        "worker",
        "memory-worker",
        "flower",
        "scheduler",
    }
    for name in ("redis", "postgres", "web", "worker", "memory-worker", "flower", "scheduler"):
        assert services[name]["healthcheck"]["test"], name
    assert services["migrate"]["restart"] == "no"
    assert argv(services["migrate"]["command"]) == ["python", "-m", "shared.db.migrate"]
    for name in ("web", "worker", "memory-worker"):
        deps = services[name]["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully", name
        assert deps["redis"]["condition"] == deps["postgres"]["condition"] == "service_healthy"

    web = argv(services["web"]["command"])
    assert web[:3] == ["gunicorn", "-c", "python:app.gunicorn_conf"]
    assert web[-1] == "app:create_app()"
    assert "/ok" in " ".join(services["web"]["healthcheck"]["test"])

    worker = argv(services["worker"]["command"])
    assert (
        option(worker, "-Q") == "runs,runs.background" and "-E" not in worker
    )  # THREADRUN_TASK_EVENTS
    assert option(worker, "-c") == str(DEFAULTS.worker_concurrency)
    assert int(services["worker"]["deploy"]["replicas"]) >= 2
    assert "container_name" not in services["worker"]  # replicas need generated names
    grace = int(services["worker"]["stop_grace_period"].rstrip("s"))
    assert grace > DEFAULTS.shutdown_grace_s + 5
    node = option(worker, "-n").split("@")[0]
    assert f"-d {node}@$HOSTNAME" in " ".join(services["worker"]["healthcheck"]["test"])

    memory = argv(services["memory-worker"]["command"])
    # webhooks: the memory worker consumes the webhooks queue too
    assert option(memory, "-Q").split(",") == ["memory", "webhooks"] and "-E" not in memory
    beats = [n for n, s in services.items() if "beat" in argv(s.get("command", []))]
    assert beats == ["scheduler"]  # the cron scheduler is the one beat
    assert "workers.cron_beat:CronScheduler" in argv(services["scheduler"]["command"])

    flower = argv(services["flower"]["command"])
    assert flower[:4] == ["celery", "-A", "workers.celery_app:celery", "flower"]
    assert services["flower"]["environment"]["FLOWER_BASIC_AUTH"] == "ops:secret"


HA = {"redis-replica", "sentinel1", "sentinel2", "sentinel3"}
HA_ENV = re.compile(r"^#\s+(THREADRUN_REDIS_SENTINELS=\S+)\s+\\$", re.MULTILINE)


def sentinel_script(service: dict[str, Any]) -> str:
    """The shell script a compose Sentinel runs (`sh -c <script>`)."""
    args = service["command"]
    assert args[:2] == ["sh", "-c"]
    return str(args[2])


def test_compose_ha_profile_has_a_replica_and_a_sentinel_majority() -> None:
    """Profile `ha`: a replica of `redis` and three Sentinels (quorum 2) monitoring `redis`
    under the master name the app asks for, each with its own config volume; the replica
    persists and never evicts like the primary; every node is known by its service name."""
    services = compose()["services"]
    assert {n for n, s in services.items() if s.get("profiles")} == HA
    assert all(services[n]["profiles"] == ["ha"] for n in HA)
    replica = argv(services["redis-replica"]["command"])
    assert replica[replica.index("--replicaof") + 1 : replica.index("--replicaof") + 3] == [
        "redis",
        "6379",
    ]
    assert option(replica, "--replica-announce-ip") == "redis-replica"
    assert option(argv(services["redis"]["command"]), "--replica-announce-ip") == "redis"
    primary = argv(services["redis"]["command"])
    for flag in ("--maxmemory-policy", "--maxmemory", "--appendonly", "--appendfsync"):
        assert option(replica, flag) == option(primary, flag), flag
    volumes = set()
    for i in (1, 2, 3):
        svc = services[f"sentinel{i}"]
        assert svc["hostname"] == f"sentinel{i}"
        (vol,) = svc["volumes"]
        assert vol.endswith(":/data")
        volumes.add(vol)
        env = svc["environment"]
        assert env["SENTINEL_MASTER"] == DEFAULTS.redis_sentinel_master
        assert int(env["SENTINEL_QUORUM"]) == 2  # a majority of three
        script = sentinel_script(svc)
        assert 'echo "port 26379"' in script and "--sentinel" in script
        assert "sentinel monitor $SENTINEL_MASTER redis 6379 $SENTINEL_QUORUM" in script
        assert svc["healthcheck"]["test"][0] == "CMD-SHELL"
    assert len(volumes) == 3
    assert {v.split(":")[0] for v in volumes} | {"redis-replica-data"} <= set(compose()["volumes"])


def test_compose_ha_settings_point_every_role_at_the_sentinels() -> None:
    """Without THREADRUN_REDIS_SENTINELS the app uses `redis` directly (Sentinel off); with
    the value the file's header documents, every role parses it to the three Sentinel
    services on 26379 and waits for them (not required: absent without the profile)."""
    raw = compose_raw()
    roles = {"migrate", "web", "worker", "memory-worker", "flower", "scheduler"}
    off = compose()["services"]
    for name in roles:
        env = off[name]["environment"]
        assert env["THREADRUN_REDIS_SENTINELS"] == ""
        assert Settings(redis_sentinels=env["THREADRUN_REDIS_SENTINELS"]).sentinel_nodes == []
    (line,) = HA_ENV.findall(COMPOSE.read_text())
    key, value = line.split("=", 1)
    on = interpolate(raw, {**REQUIRED_ENV, key: value})["services"]
    for name in roles:
        env = on[name]["environment"]
        s = Settings(
            redis_sentinels=env["THREADRUN_REDIS_SENTINELS"],
            redis_sentinel_master=env["THREADRUN_REDIS_SENTINEL_MASTER"],
        )
        assert s.sentinel_nodes == [(f"sentinel{i}", 26379) for i in (1, 2, 3)], name
        assert s.redis_sentinel_master == on["sentinel1"]["environment"]["SENTINEL_MASTER"]
        deps = on[name]["depends_on"]
        for i in (1, 2, 3):
            assert deps[f"sentinel{i}"] == {"condition": "service_healthy", "required": False}


def test_compose_redis_never_evicts_and_persists() -> None:
    """Redis holds queues, leases and streams: maxmemory-policy noeviction, appendonly on,
    its data on a volume."""
    redis = compose()["services"]["redis"]
    args = argv(redis["command"])
    assert option(args, "--maxmemory-policy") == "noeviction"
    assert option(args, "--appendonly") == "yes"
    assert any(v.endswith(":/data") for v in redis["volumes"])


def test_compose_env_is_settings_and_agrees_across_roles() -> None:
    """Every THREADRUN_* variable compose sets is a Settings field or is read by our code;
    the values parse as Settings; all roles share one database, Redis and prefix."""
    services = compose()["services"]
    known, sources = setting_env_names(), python_sources()
    envs = {n: s.get("environment", {}) for n, s in services.items() if "build" in s}
    assert set(envs) == {"migrate", "web", "worker", "memory-worker", "flower", "scheduler"}
    for name, env in envs.items():
        for var in (k for k in env if k.startswith("THREADRUN_")):
            assert var in known or var in sources, f"{name}: {var} is read by nothing"
        fields = {
            k[len("THREADRUN_") :].lower(): v
            for k, v in env.items()
            if k[10:].lower() in Settings.model_fields
        }
        s = Settings.model_validate({k: v for k, v in fields.items() if v != ""})
        assert s.redis_url == "redis://redis:6379/0"
        assert s.dsn.startswith("postgresql://") and s.dsn.endswith("@postgres:5432/threadrun")
        assert s.api_key_map  # a web on 0.0.0.0 refuses to start in open mode (A4)
        assert {"THREADRUN_MODEL_TIMEOUT_S", "THREADRUN_MODEL_MAX_RETRIES"} <= set(env), name
    shared = ("THREADRUN_REDIS_URL", "THREADRUN_DATABASE_URL", "THREADRUN_REDIS_PREFIX")
    assert len({tuple(env[k] for k in shared) for env in envs.values()}) == 1


# ----------------------------------------------------------------------------------------
# Kubernetes
# ----------------------------------------------------------------------------------------


def test_k8s_manifests_validate_strictly_offline() -> None:
    """Every object under deploy/k8s validates against the Kubernetes schemas (strict: unknown
    fields fail), and kustomization.yaml lists exactly these files; the validator rejects a
    misspelt field."""
    docs = list(k8s_docs())
    assert docs
    for name, doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        assert "namespace" not in doc["metadata"], name  # set by kustomization.yaml
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kust["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    bad = copy.deepcopy(by_kind("Deployment")["threadrun-web"])
    bad["spec"]["replica"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def _container(dep: dict[str, Any]) -> dict[str, Any]:
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    return dict(c)


def test_k8s_one_deployment_per_role_with_probes_resources_and_non_root() -> None:
    """A Deployment per role (web, runs-worker, memory-worker, flower), each with readiness
    and liveness probes, CPU/memory requests, a memory limit, a non-root security context;
    web probes GET /ok; workers probe a Celery ping of their own node name."""
    deps = by_kind("Deployment")
    assert set(deps) == {
        "threadrun-web",
        "threadrun-runs-worker",
        "threadrun-memory-worker",
        "threadrun-flower",
        "threadrun-cron-scheduler",
    }
    for name, dep in deps.items():
        pod = dep["spec"]["template"]["spec"]
        c = _container(dep)
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert c["securityContext"]["allowPrivilegeEscalation"] is False, name
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]), name
        assert "memory" in c["resources"]["limits"], name
        assert c["readinessProbe"] and c["livenessProbe"], name
        refs = {next(iter(e.values()))["name"] for e in c["envFrom"]}
        assert refs == {"threadrun-config", "threadrun-secrets"}, name
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items(), name

    web = _container(deps["threadrun-web"])
    assert web["command"][:3] == ["gunicorn", "-c", "python:app.gunicorn_conf"]
    assert web["readinessProbe"]["httpGet"]["path"] == "/ok"
    assert web["livenessProbe"]["httpGet"]["path"] == "/ok"

    for name, queue in (("threadrun-runs-worker", "runs"), ("threadrun-memory-worker", "memory")):
        c = _container(deps[name])
        cmd = c["command"]
        assert option(cmd, "-Q").split(",")[0] == queue and "-E" not in cmd
        node = option(cmd, "-n")
        assert node == f"{queue}@$(POD_NAME)"
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            script = c[probe]["exec"]["command"][-1]
            assert "inspect ping" in script and f"-d {queue}@$POD_NAME" in script, (name, probe)
        grace = deps[name]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace > DEFAULTS.shutdown_grace_s + 5  # R7: time to hand runs back
    runs = _container(deps["threadrun-runs-worker"])
    assert option(runs["command"], "-c") == "$(THREADRUN_WORKER_CONCURRENCY)"

    # Metrics: web pods on /metrics, workers on THREADRUN_WORKER_METRICS_PORT, each pod's
    # multi-process files on an emptyDir of its own at THREADRUN_METRICS_DIR.
    (cm,) = by_kind("ConfigMap").values()
    port, mdir = cm["data"]["THREADRUN_WORKER_METRICS_PORT"], cm["data"]["THREADRUN_METRICS_DIR"]
    for name in ("threadrun-web", "threadrun-runs-worker", "threadrun-memory-worker"):
        pod = deps[name]["spec"]["template"]
        c = _container(deps[name])
        (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == mdir]
        (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
        assert "emptyDir" in vol, name
        want = "8000" if name == "threadrun-web" else port
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == want, name
        assert want in {str(p["containerPort"]) for p in c["ports"]}, name


def test_k8s_services_pdbs_and_hpa_select_real_pods() -> None:
    """Services and PodDisruptionBudgets select the pods of a Deployment; the HPA scales the
    runs workers on the external metric threadrun_queue_depth{queue="runs"}, the one the
    prometheus-adapter config exposes."""
    pods = {
        n: d["spec"]["template"]["metadata"]["labels"] for n, d in by_kind("Deployment").items()
    }

    def selects(sel: dict[str, str]) -> set[str]:
        return {n for n, labels in pods.items() if sel.items() <= labels.items()}

    services = by_kind("Service")
    assert selects(services["threadrun-web"]["spec"]["selector"]) == {"threadrun-web"}
    assert selects(services["threadrun-flower"]["spec"]["selector"]) == {"threadrun-flower"}
    pdbs = by_kind("PodDisruptionBudget")
    assert {"threadrun-web", "threadrun-runs-worker"} <= set(pdbs)
    for name, pdb in pdbs.items():
        assert selects(pdb["spec"]["selector"]["matchLabels"]) == {name}

    (hpa,) = by_kind("HorizontalPodAutoscaler").values()
    assert hpa["spec"]["scaleTargetRef"]["name"] == "threadrun-runs-worker"
    assert hpa["spec"]["minReplicas"] >= 2  # the reaper and R7 hand-over want a second worker
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"]["name"] == "threadrun_queue_depth"
    assert metric["external"]["metric"]["selector"]["matchLabels"] == {"queue": "runs"}

    adapter = yaml.safe_load(ADAPTER.read_text())
    (rule,) = adapter["rules"]["external"]
    assert "threadrun_queue_depth" in rule["seriesQuery"]
    assert rule["name"]["as"] == "threadrun_queue_depth"
    assert "<<.Series>>" in rule["metricsQuery"] and "<<.LabelMatchers>>" in rule["metricsQuery"]


def test_k8s_settings_config_parses_and_keeps_the_spec_defaults() -> None:
    """ConfigMap + Secret hold only THREADRUN_* names that Settings has or our code reads
    (plus Flower's own); they parse as Settings; every tunable keeps its SPEC default except
    the deployment's paths and listen address; the migrate Job runs shared.db.migrate."""
    (cm,) = by_kind("ConfigMap").values()
    (secret,) = by_kind("Secret").values()
    data = {**cm["data"], **secret["stringData"]}
    known, sources = setting_env_names(), python_sources()
    for var in data:
        if var.startswith("FLOWER_"):
            continue
        assert var.startswith("THREADRUN_") and (var in known or var in sources), var
    for _, doc in k8s_docs():
        if doc["kind"] in ("Deployment", "Job"):
            for e in _container(doc).get("env", []):
                assert not e["name"].startswith("THREADRUN_") or e["name"] in known, e
    fields = {k[10:].lower(): v for k, v in data.items() if k[10:].lower() in Settings.model_fields}
    s = Settings.model_validate({k: v for k, v in fields.items() if v != ""})
    overrides = {"config", "data_dir", "redis_url", "database_url", "api_keys", "model_api_key"}
    overrides |= {"metrics_dir", "worker_metrics_port"}
    for name in fields:
        if name not in overrides:
            assert getattr(s, name) == getattr(DEFAULTS, name), name
    assert s.api_key_map  # the placeholder has the key:user[:role] shape
    # A provider model call's timeout and retries are set where an operator looks for them.
    assert {"THREADRUN_MODEL_TIMEOUT_S", "THREADRUN_MODEL_MAX_RETRIES"} <= set(cm["data"])
    (job,) = by_kind("Job").values()
    assert _container(job)["command"] == ["python", "-m", "shared.db.migrate"]


def test_dockerfile_runs_as_non_root_and_serves_with_the_gunicorn_config() -> None:
    """The image's final user is a numeric non-root uid; its default command is the web role."""
    lines = [ln.strip() for ln in DOCKERFILE.read_text().splitlines()]
    users = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    cmd = json.loads(next(ln for ln in reversed(lines) if ln.startswith("CMD "))[4:])
    assert cmd[:3] == ["gunicorn", "-c", "python:app.gunicorn_conf"]
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".threadrun", "tests"} <= set(ignored)


# ----------------------------------------------------------------------------------------
# Prometheus rules
# ----------------------------------------------------------------------------------------


def test_metric_contract_is_the_one_shared_metrics_declares() -> None:
    """The metric names and labels the alert rules and the HPA are checked against are the
    contract in shared/metrics.py's docstring."""
    line = re.compile(r"^\s+(threadrun_\w+)(?:\{(\w+)\})?\s+(?:gauge|counter|histogram)", re.M)
    declared = {
        m.group(1): {m.group(2)} if m.group(2) else set()
        for m in line.finditer(shared.metrics.__doc__ or "")
    }
    assert declared == METRICS


_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
_SELECTOR = re.compile(r"(threadrun_[a-z_]+)(\{([^}]*)\})?")


def _balanced(expr: str) -> bool:
    pairs, stack = {")": "(", "]": "[", "}": "{"}, []
    for ch in expr:
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            return False
    return not stack


def test_alert_rules_cover_the_issue_and_use_only_contract_metrics() -> None:
    """deploy/prometheus/alerts.yml (promtool is not available: a structure check): the rule
    groups hold alerts for worker offline, runs stuck, queue age, fenced writes and gap rate;
    every rule has a valid `for`, a severity and a summary; every expression is balanced and
    uses only metrics and labels of the threadrun_ metrics contract."""
    doc = yaml.safe_load(ALERTS.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert all(set(g) <= {"name", "rules", "interval", "labels"} for g in doc["groups"])
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    used: set[str] = set()
    for r in rules:
        assert set(r) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}
        assert _DURATION.match(r["for"]), r["alert"]
        assert r["labels"]["severity"] in ("warning", "critical")
        assert r["annotations"]["summary"] and r["annotations"]["description"]
        expr = r["expr"]
        assert _balanced(expr), expr
        for m in _SELECTOR.finditer(expr):
            metric, labels = m.group(1), m.group(3) or ""
            assert metric in METRICS, metric
            for matcher in filter(None, (p.strip() for p in labels.split(","))):
                label = re.split(r"=~|!~|!=|=", matcher)[0].strip()
                assert label in METRICS[metric], (metric, label)
            used.add(metric)
        for by in re.findall(r"by \(([^)]*)\)", expr):
            assert all(lbl.strip() in set().union(*METRICS.values()) for lbl in by.split(","))
    assert {
        "threadrun_workers_online",
        "threadrun_runs_stuck",
        "threadrun_queue_oldest_age_seconds",
        "threadrun_fenced_writes_total",
        "threadrun_stream_gaps_total",
    } <= used
    counters = [m for m in used if m.endswith("_total")]
    for r in rules:
        for metric in counters:
            if metric in r["expr"]:
                assert re.search(rf"(rate|increase)\({metric}", r["expr"]), r["alert"]


# ----------------------------------------------------------------------------------------
# Kubernetes with Redis Sentinel (deploy/redis-sentinel, an overlay of deploy/k8s)
# ----------------------------------------------------------------------------------------

SENTINEL_K8S = ROOT / "deploy" / "redis-sentinel"


def sentinel_example() -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> object of every file of the example but its kustomization."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(SENTINEL_K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                key = (doc["kind"], doc["metadata"]["name"])
                out[key if path.name != "settings.yaml" else ("patch:" + key[0], key[1])] = doc
    return out


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_k8s_sentinel_example_points_the_app_at_its_own_sentinels() -> None:
    """The overlay adds a Redis StatefulSet (2 nodes, noeviction, appendonly) and a Sentinel
    StatefulSet (3, quorum a majority), validating strictly; it patches the base's settings
    so that THREADRUN_REDIS_SENTINELS names exactly those Sentinel pods by their headless
    service, with the master name, data password and Sentinel password they use."""
    kust = yaml.safe_load((SENTINEL_K8S / "kustomization.yaml").read_text())
    files_ = {p.name for p in SENTINEL_K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert kust["resources"][0] == "../k8s" and kust["namespace"] == "threadrun"
    assert set(kust["resources"][1:]) | {p["path"] for p in kust["patches"]} == files_
    docs = sentinel_example()
    for key, doc in docs.items():
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        assert "namespace" not in doc["metadata"], key
    # the patches target objects of the base
    for kind, name in docs:
        if kind.startswith("patch:"):
            assert name in by_kind(kind[len("patch:") :]), name
    (cm,) = by_kind("ConfigMap").values()
    (secret,) = by_kind("Secret").values()
    data = {
        **cm["data"],
        **secret["stringData"],
        **docs[("patch:ConfigMap", "threadrun-config")]["data"],
        **docs[("patch:Secret", "threadrun-secrets")]["stringData"],
    }
    s = Settings.model_validate(
        {k[10:].lower(): v for k, v in data.items() if k[10:].lower() in Settings.model_fields}
    )
    redis_sts = docs[("StatefulSet", "threadrun-redis")]
    sent_sts = docs[("StatefulSet", "threadrun-sentinel")]
    sent_svc = docs[("Service", sent_sts["spec"]["serviceName"])]
    redis_svc = docs[("Service", redis_sts["spec"]["serviceName"])]
    sent = _container(sent_sts)
    redis_c = _container(redis_sts)
    (port,) = [p["containerPort"] for p in sent["ports"]]
    assert {p["port"] for p in sent_svc["spec"]["ports"]} == {port}
    n = sent_sts["spec"]["replicas"]
    assert n == 3 and int(_env(sent)["QUORUM"]) == n // 2 + 1
    assert s.sentinel_nodes == [
        (f"{sent_sts['metadata']['name']}-{i}.{sent_svc['metadata']['name']}", port)
        for i in range(n)
    ]
    assert s.redis_sentinel_master == _env(sent)["MASTER"] == _env(redis_c)["MASTER"]
    auth = docs[("Secret", "threadrun-redis")]["stringData"]
    assert redis.connection.parse_url(s.redis_url)["password"] == auth["REDIS_PASSWORD"]
    assert s.redis_sentinel_password.get_secret_value() == auth["SENTINEL_PASSWORD"]
    for svc, sts in ((sent_svc, sent_sts), (redis_svc, redis_sts)):
        assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert svc["spec"]["selector"].items() <= labels.items()
        assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
        pdb = docs[("PodDisruptionBudget", sts["metadata"]["name"])]
        assert pdb["spec"]["maxUnavailable"] == 1
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        c = _container(sts)
        assert sts["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["readinessProbe"] and c["livenessProbe"] and "memory" in c["resources"]["limits"]
        for e in c["env"]:
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            assert ref is None or ref["key"] in auth, e
        script = c["command"][-1]
        check = subprocess.run(["sh", "-n", "-c", script], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
    assert redis_sts["spec"]["replicas"] >= 2 and redis_sts["spec"]["volumeClaimTemplates"]
    script = redis_c["command"][-1]
    assert "--maxmemory-policy noeviction" in script and "--appendonly yes" in script
    assert "--replica-announce-ip" in script and "--masterauth" in script
    assert "sentinel monitor $MASTER $master 6379 $QUORUM" in sent["command"][-1]


def test_k8s_sentinel_example_builds_with_kustomize() -> None:
    """`kubectl kustomize deploy/redis-sentinel` (offline) renders the base and the example
    into one valid set: every object in the namespace, the settings patched."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    res = subprocess.run(
        ["kubectl", "kustomize", str(SENTINEL_K8S)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    docs = [d for d in yaml.safe_load_all(res.stdout) if d]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("StatefulSet", "threadrun-redis"), ("StatefulSet", "threadrun-sentinel")} <= kinds
    assert ("Deployment", "threadrun-web") in kinds
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "threadrun", doc["metadata"]["name"]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert cm["data"]["THREADRUN_REDIS_SENTINELS"].count(":26379") == 3
    assert cm["data"]["THREADRUN_REDIS_PREFIX"] == "threadrun:"  # the base's data is kept
