"""Typed settings: one class, every tunable of the SPEC with its default, env prefix THREADRUN_."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.redaction import redact
from shared.vocab import MultitaskStrategy

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    """All runtime configuration. Read from `THREADRUN_*` environment variables."""

    model_config = SettingsConfigDict(env_prefix="THREADRUN_", extra="ignore")

    # --- where things are -------------------------------------------------------
    config: Path = Field(
        default=PROJECT_ROOT / "langgraph.json",
        description="Path of the langgraph.json-compatible graphs file.",
    )
    install_dependencies: bool = Field(
        default=True,
        description="`make run` pip-installs the `dependencies` of langgraph.json that the"
        " venv lacks (off: a missing one is a start-up error naming it).",
    )
    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: Path = Field(default=PROJECT_ROOT / ".threadrun")
    redis_url: str = "redis://127.0.0.1:6379/0"
    database_url: SecretStr = SecretStr("postgresql://postgres@127.0.0.1:5432/threadrun")
    redis_sentinels: str = Field(
        default="",
        description=(
            "Comma-separated host:port of Redis Sentinels; empty = talk to THREADRUN_REDIS_URL"
            " directly. With sentinels, the URL still gives the data node's password and db."
        ),
    )
    redis_sentinel_master: str = Field(
        default="threadrun", description="The Sentinel master (service) name."
    )
    redis_sentinel_password: SecretStr = Field(
        default=SecretStr(""), description="Password of the Sentinels (empty: no auth)."
    )
    redis_retries: int = Field(
        default=8,
        ge=0,
        description=(
            "Command retries after a Redis connection error (0: none), with jittered"
            " exponential back-off: the defaults wait ~5.5 s in all, enough to ride through"
            " a Sentinel failover (shared/redis_clients.py)."
        ),
    )
    redis_retry_base_s: float = Field(
        default=0.1, gt=0, description="First back-off step of a Redis retry (doubles after)."
    )
    redis_retry_cap_s: float = Field(
        default=1.0, gt=0, description="Longest single wait between two Redis retries."
    )
    redis_sentinel_timeout_s: float = Field(
        default=2.0, gt=0, description="Socket timeouts of the connections to the Sentinels."
    )
    redis_prefix: str = Field(
        default="threadrun:",
        description="Prefix of every Redis key we write, Celery's included (isolation).",
    )

    # --- identity (A4) ----------------------------------------------------------
    api_keys: SecretStr = Field(
        default=SecretStr(""),
        description=(
            "Comma-separated key:user_id[:role] entries (role `user` or `ops`, default"
            " `user`); empty = local single-user mode."
        ),
    )
    local_user: str = "local"

    # --- hardening: keys, JWT, limits, origins (A3, A4) ---------------------------------
    api_key_cache_ttl_s: float = Field(
        default=10.0,
        ge=0,
        description="Key lookups are cached this long: a revoked key stops working within it.",
    )
    jwt_issuer: str | None = Field(default=None, description="Required `iss` of bearer JWTs.")
    jwt_audience: str | None = Field(default=None, description="Required `aud` of bearer JWTs.")
    jwt_secret: SecretStr | None = Field(
        default=None, description="HS256/384/512 secret for bearer JWTs."
    )
    jwt_public_key_file: Path | None = Field(
        default=None, description="PEM public key or JWKS JSON file for RS/ES/EdDSA JWTs."
    )
    jwt_algorithms: str = Field(
        default="HS256,RS256,ES256,EdDSA", description="Comma-separated accepted JWT algorithms."
    )
    jwt_role_claim: str = Field(
        default="role", description="JWT claim holding the role; `ops` grants the ops role."
    )
    jwt_leeway_s: float = Field(default=30.0, ge=0, description="Clock skew allowed on exp/nbf.")
    runs_per_minute: int = Field(
        default=60, ge=1, description="Runs a user may create per minute (429 above)."
    )
    max_active_runs: int = Field(
        default=16, ge=1, description="Pending+running runs per user (429 above)."
    )
    limit_local_user: bool = Field(
        default=False,
        description="Apply runs_per_minute, max_active_runs and max_connections_per_user to"
        " the one user of local single-user mode too (off: local mode does not throttle).",
    )
    max_input_bytes: int = Field(
        default=262144, ge=256, description="JSON size of a run's input/command (422 above)."
    )
    max_stream_modes: int = Field(
        default=16, ge=1, description="Entries of a run's stream_mode list (422 above)."
    )
    max_metadata_bytes: int = Field(
        default=16384, ge=64, description="JSON size of thread/run metadata (422 above)."
    )
    thread_values_max_bytes: int = Field(
        default=262144,
        ge=0,
        description="Largest head `values` (encoded JSON) kept as a copy for thread objects;"
        " larger ones are read from the checkpoint.",
    )
    thread_search_scan_threads: int = Field(
        default=1000,
        ge=1,
        description="Newest threads of a user whose messages a thread search `query` reads"
        " (titles are matched over all of them).",
    )
    ws_max_frame_bytes: int = Field(
        default=262144, ge=1024, description="Largest WebSocket frame (close 1009 above)."
    )
    ws_frames_per_second: float = Field(
        default=20.0, gt=0, description="Sustained client frames per second per socket."
    )
    ws_frame_burst: int = Field(default=40, ge=1, description="Frame burst per socket.")
    history_max_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="Largest page of thread history (JSON bytes): a page ends early, with"
        " X-Threadrun-Next-Before naming where the next one starts (at least one state).",
    )
    max_heavy_reads_per_user: int = Field(
        default=4,
        ge=1,
        description="State and history reads a user may have in flight at once (429 above).",
    )
    heavy_reads_per_minute: int = Field(
        default=600, ge=1, description="State and history reads a user may make per minute."
    )
    request_body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="How long a client may take to send a request body (408 after; a slow"
        " sender must not hold a web process's connection for minutes).",
    )
    run_timeout_s: float = Field(
        default=3600.0,
        gt=0,
        description="Longest a run may execute, across its attempts, before the worker ends"
        " it `timeout` (its checkpoints so far are kept).",
    )
    worker_user_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Share of a worker's concurrency one user's runs may hold while other"
        " users' runs wait (their further runs are put back for fair_share_retry_s).",
    )
    worker_background_share: float = Field(
        default=0.75,
        gt=0,
        le=1,
        description="Share of a worker's slots background runs (cron firings) may hold; the"
        " rest are kept for runs a caller asked for (shared/runs/priority.py).",
    )
    background_yield_slots: int = Field(
        default=2,
        ge=0,
        description="While runs a caller asked for are running anywhere, a worker starts"
        " background runs (cron firings) only while fewer than this many of them run on it"
        " (workers/background_share.py); 0: they never yield.",
    )
    dispatch_position_step: int = Field(
        default=4,
        ge=1,
        description="Fair dispatch: every this many of a user's pending or running runs lower"
        " the queue priority of the user's next run one step (shared/runs/priority.py).",
    )
    fair_share_retry_s: float = Field(
        default=0.5,
        gt=0,
        description="How long a run put back for fairness waits before it is offered again.",
    )
    max_connections_per_user: int = Field(
        default=32,
        ge=1,
        description="Open SSE streams, WebSockets and /wait or /join requests per user (429 above).",
    )
    limit_slot_ttl_s: float = Field(
        default=60.0,
        ge=5,
        description=(
            "A connection slot or run reservation left by a dead process is freed after this"
            " (live connections renew theirs)."
        ),
    )
    active_runs_retry_after_s: int = Field(
        default=5, ge=1, description="Retry-After of a 429 for too many active runs."
    )
    allowed_hosts: str = Field(
        default="",
        description=(
            "Comma-separated host names this server answers to (`*` = any); empty = loopback"
            " names in local single-user mode, any name once credentials are configured."
        ),
    )
    cors_origins: str = Field(
        default="",
        description="Comma-separated allowed browser origins for CORS (`*` = any); empty = none.",
    )
    ws_origins: str = Field(
        default="",
        description="Comma-separated allowed WebSocket Origins; empty = same origin only.",
    )

    # --- the model (§9) -----------------------------------------------------------
    model: str = Field(
        default="builtin",
        description="'builtin' (deterministic) or a LangChain model id, e.g. 'openai:gpt-4o-mini'.",
    )
    model_base_url: str | None = Field(
        default=None,
        description="The provider endpoint, e.g. an OpenAI-compatible server's http://host/v1.",
    )
    model_api_key: SecretStr | None = Field(
        default=None, description="The provider's key; unset = its own env var (OPENAI_API_KEY)."
    )
    model_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="Per-request timeout of a provider model call (each retry gets its own).",
    )
    model_max_retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description="Retries of a provider call that failed before answering (429/5xx/timeouts,"
        " connection errors), made by threadrun with the backoff below; the client's own are off.",
    )
    model_first_byte_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="An attempt that sent nothing (no first streamed chunk) in this long is"
        " abandoned and retried: a hanging provider ends the run instead of holding it.",
    )
    model_retry_backoff_s: float = Field(
        default=0.5,
        ge=0,
        description="Wait before the first retry of a model call, doubled for each next one.",
    )
    model_retry_backoff_max_s: float = Field(
        default=8.0,
        ge=0,
        description="Longest wait between model-call attempts (a Retry-After is cut to it).",
    )
    model_wait_heartbeat_s: float = Field(
        default=2.0,
        gt=0,
        description="While a model call has not answered yet, a `model_wait` custom event"
        " with the seconds waited is sent this often.",
    )
    builtin_tokens: int = Field(
        default=24, ge=1, description="Tokens per reply of the built-in model."
    )
    builtin_token_delay_ms: float = Field(
        default=0.0, ge=0, description="Delay per built-in token."
    )

    # --- runs (R) -----------------------------------------------------------------
    default_multitask_strategy: MultitaskStrategy = MultitaskStrategy.ENQUEUE
    max_attempts: int = Field(default=3, ge=1)
    worker_concurrency: int = Field(
        default=32, ge=1, description="Concurrent runs per worker process."
    )
    shutdown_grace_s: float = Field(default=5.0, ge=0)
    runs_workers: int = Field(
        default=1, ge=1, description="`make run`: how many `runs` worker processes to start."
    )
    background_workers: int = Field(
        default=1,
        ge=0,
        description="`make run`: worker processes of their own for background runs (cron"
        " firings, the `runs.background` queue) at `background_nice`; 0: the runs"
        " workers serve them.",
    )
    background_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="`make run`: the OS priority (nice) of its background workers and its"
        " cron scheduler, so cron firings take only the CPU callers' runs leave.",
    )
    process_nice: int = Field(
        default=0,
        ge=0,
        le=19,
        description="A worker or scheduler process raises its nice value to this at start"
        " (0: as started).",
    )
    memory_workers: int = Field(
        default=1, ge=1, description="`make run`: how many `memory` worker processes to start."
    )
    supervisor_backoff_s: float = Field(
        default=0.5, gt=0, description="`make run`: wait before the first restart of a child."
    )
    supervisor_backoff_max_s: float = Field(
        default=10.0, gt=0, description="`make run`: longest wait between restarts of a child."
    )
    supervisor_max_restarts: int = Field(
        default=5,
        ge=0,
        description="`make run`: more exits than this of one child within "
        "`supervisor_restart_window_s` is a crash loop: that child stays down, the rest serve "
        "(0: no restarts, a dying child stops everything).",
    )
    supervisor_restart_window_s: float = Field(
        default=60.0, gt=0, description="`make run`: the window of the crash-loop rule."
    )
    reload: bool = Field(
        default=False,
        description="`make run` restarts web and workers when the served graphs' files change "
        "(the dev loop; `make dev`).",
    )
    run_after_seconds_max: float = Field(
        default=30 * 86_400,
        gt=0,
        description="The longest delay `after_seconds` may ask for (a run pending longer is "
        "more likely a client's mistake than a plan).",
    )
    wait_keepalive_s: float = Field(
        default=5.0,
        gt=0,
        description="/wait, /join and cancel?wait=1 send a newline this often while the run "
        "lasts, events or not (the official server's interval), so proxies keep the connection.",
    )
    cancel_settle_s: float = Field(
        default=2.0,
        ge=0,
        description="A cancel without wait answers once the run's owner has stopped it, or "
        "after this long with the run still running (0: at once).",
    )
    interrupt_settle_s: float = Field(
        default=5.0,
        ge=0,
        description="The thread streaming protocol's `input.respond` (and a `run.start` "
        "resuming) may arrive while the run that asked is still being finished: it waits up "
        "to this long for the thread to settle before checking the interrupt it names.",
    )
    max_body_bytes: int = Field(default=1 << 20, ge=1024)

    # --- leases (L) -----------------------------------------------------------------
    lease_ttl_s: float = Field(default=15.0, gt=0)
    lease_renew_s: float = Field(default=5.0, gt=0)
    cancel_poll_s: float = Field(
        default=0.5, gt=0, description="How often an idle run checks for cancel."
    )

    # --- reaper (R4, L4) ----------------------------------------------------------
    reaper_interval_s: float = Field(default=2.0, gt=0)
    dispatch_stale_s: float = Field(
        default=10.0,
        gt=0,
        description="A pending head run not claimed after this is re-dispatched.",
    )
    temporary_thread_grace_s: float = Field(
        default=30.0,
        ge=0,
        description="A temporary thread (on_completion=delete) whose runs all ended this "
        "long ago and still exists is deleted by the recovery pass.",
    )
    analyze_interval_s: float = Field(
        default=60.0,
        ge=0,
        description="How often the reaper's leader checks the tables' planner statistics and "
        "ANALYZEs those autovacuum left without (shared/db/statistics.py); 0: never.",
    )
    analyze_threshold: float = Field(
        default=0.2,
        gt=0,
        description="A table changed by more than this fraction of its rows since its last "
        "analyze is analyzed (autovacuum's default is 0.1: this only catches what it missed).",
    )

    # --- crons: the scheduler process (workers/cron_beat.py) ------------------------
    cron_tick_s: float = Field(
        default=5.0,
        gt=0,
        description="How often the scheduler looks for due crons: a firing lags its tick "
        "by at most this plus the firing itself.",
    )
    cron_batch_size: int = Field(
        default=100,
        ge=1,
        description="Crons fired per transaction (locked with SKIP LOCKED, so two schedulers "
        "take different batches); a tick fires batches until none is due.",
    )
    cron_max_per_user: int = Field(
        default=100, ge=1, description="Crons one user may have at once (429 beyond)."
    )
    max_threads_per_user: int = Field(
        default=10_000,
        ge=1,
        description="Threads one user may have at once (429 `max_threads_per_user` beyond;"
        " off under the project's auth.path, whose users share one owner).",
    )
    max_assistants_per_user: int = Field(
        default=1_000,
        ge=1,
        description="Assistants one user may have at once (429 beyond; off under auth.path).",
    )
    max_store_items_per_user: int = Field(
        default=10_000,
        ge=1,
        description="Store items one user's namespaces may hold (429 beyond; off under auth.path).",
    )
    max_store_item_bytes: int = Field(
        default=262_144,
        ge=256,
        description="JSON size of one store item's value, from the API or a graph (413 above).",
    )
    cron_min_interval_s: float = Field(
        default=60.0,
        gt=0,
        description="The shortest gap between two ticks a schedule may have (a sixth field, "
        "seconds, is accepted only down to this; tests lower it).",
    )
    cron_firing_retention_s: float = Field(
        default=7 * 86_400,
        gt=0,
        description="The record of each firing (cron_firings, the audit) is kept this long.",
    )

    # --- thread expiry (P6: shared/retention/) ---------------------------------------
    thread_sweep_interval_minutes: float = Field(
        default=5.0,
        gt=0,
        description="How often the scheduler sweeps expired threads, unless langgraph.json's "
        "checkpointer.ttl.sweep_interval_minutes says (the official server's default).",
    )
    thread_sweep_limit: int = Field(
        default=1000,
        ge=1,
        description="Expired threads one sweep takes at most, unless "
        "checkpointer.ttl.sweep_limit says; the rest go at the next sweep.",
    )
    thread_sweep_lock_timeout_s: float = Field(
        default=2.0,
        gt=0,
        description="How long the sweep waits for a thread's cron rows before leaving the "
        "thread to the next sweep (the thread row itself is never waited for).",
    )
    audit_retention_days: float = Field(
        default=90.0,
        gt=0,
        description="The audit records of thread deletions and expiries (ops_audit, actions "
        "thread.*) outlive their threads this long, then the sweep prunes them.",
    )

    # --- stream bridge (B) --------------------------------------------------------
    stream_maxlen: int = Field(default=1024, ge=1)
    stream_ttl_after_end_s: int = Field(
        default=300,
        ge=1,
        description="An ended run's stream (and its `/wait` answer) is kept this long: "
        "long enough for a client to reconnect; later readers get a gap and reload durable "
        "state (B5). Redis holds bytes per run x runs/s x (run time + this): docs/operations.md.",
    )
    publish_coalesce_turns: int = Field(
        default=3,
        ge=0,
        le=100,
        description="Event-loop turns a worker's publisher lets pass before it sends the "
        "pending events: what the runs emit meanwhile goes in the same call (fewer Redis round "
        "trips per run under load; a turn is immediate when nothing else is runnable).",
    )
    stream_compress: bool = Field(
        default=True,
        description="Store event data compressed, with per-run dictionaries "
        "(shared/bridge/codec.py); clients receive the same bytes either way.",
    )
    stream_compress_min_bytes: int = Field(
        default=128, ge=1, description="Event data shorter than this is stored as it is."
    )
    stream_dictionaries_max: int = Field(
        default=8,
        ge=0,
        description="Compression dictionaries one run attempt may store in its meta hash.",
    )
    stream_heartbeat_s: float = Field(default=5.0, gt=0)
    stream_hub_linger_s: float = Field(
        default=60.0,
        ge=0,
        description="A web process's subscription hub keeps its Redis connection this long "
        "after its last follower left, so the next stream starts without a reconnect.",
    )
    thread_stream_poll_s: float = Field(
        default=30.0,
        gt=0,
        description="A thread stream between runs re-reads the runs table this often "
        "(a new run wakes it at once through Redis; this covers a lost notice and a "
        "deleted thread).",
    )

    # --- A2A (app/protocols/a2a/) ------------------------------------------------------
    a2a_default_assistant: str | None = Field(
        default=None,
        max_length=256,
        description="The assistant (id or graph) /.well-known/agent-card.json describes "
        "without ?assistant_id=; unset: the system assistant of the project's first graph.",
    )
    a2a_task_scan_runs: int = Field(
        default=100,
        ge=1,
        le=10_000,
        description="Newest runs of a context (thread) read to find a task's latest run "
        "(a task resumed after input-required runs again on the same thread).",
    )

    # --- generative UI (langgraph.json `ui`, shared/genui/) ---------------------------
    genui_dir: Path | None = Field(
        default=None,
        description="Where esbuild is installed and the `ui` bundles are cached;"
        " unset = data_dir/genui.",
    )
    genui_esbuild_version: str = Field(
        default="0.28.2",
        pattern=r"^\d+\.\d+\.\d+$",
        description="The esbuild the web installs from the npm registry to bundle `ui`.",
    )
    genui_build_timeout_s: float = Field(
        default=180.0,
        gt=0,
        description="Longest wait for the npm install of esbuild or one bundle's build.",
    )

    # --- MCP at /mcp (app/protocols/mcp/) ------------------------------------------------
    mcp_session_ttl_s: float = Field(
        default=3600.0,
        gt=0,
        description="An MCP session (`Mcp-Session-Id`, kept in Redis) ends this long after its "
        "last request; the client then gets 404 and initializes again.",
    )
    mcp_max_tools: int = Field(
        default=1000,
        ge=1,
        description="Assistants considered for MCP tools per caller (the newest beyond it are "
        "not listed).",
    )
    mcp_tools_page_size: int = Field(
        default=100, ge=1, description="Tools per `tools/list` page (`nextCursor` for more)."
    )

    # --- operations: ops view, metrics, logs, Flower ----------------------------------
    log_format: Literal["text", "json"] = Field(
        default="text", description="`json`: one JSON object per log line (shared/logs.py)."
    )
    metrics_dir: Path | None = Field(
        default=None,
        description="PROMETHEUS_MULTIPROC_DIR of this host; unset = data_dir/prometheus/<host>.",
    )
    worker_metrics_port: int = Field(
        default=0, ge=0, description="Celery workers serve /metrics on this port (0 = off)."
    )
    task_events: bool = Field(
        default=False,
        description="Celery task events (worker + sent) always; off, Flower turns the workers'"
        " on while it runs (its enable_events), so only Flower's watchers pay for them.",
    )
    flower_port: int = Field(default=5555, ge=1)
    flower_basic_auth: SecretStr = Field(
        default=SecretStr(""), description="Flower's user:password[,user:password]; empty = none."
    )
    ops_inspect_timeout_s: float = Field(
        default=0.5, gt=0, description="How long the ops view waits for workers to answer."
    )
    ops_inspect_cache_s: float = Field(
        default=2.0, ge=0, description="Worker answers are reused this long per web process."
    )
    ops_report_s: float = Field(
        default=5.0, gt=0, description="Web processes report open connections this often."
    )
    ops_presence_s: float = Field(
        default=2.0,
        gt=0,
        description="Each worker records itself in Redis this often; the ops view counts it "
        "online for 3 periods after a write even when it is too busy to answer the broadcast "
        "(shared/ops/presence.py).",
    )
    ops_runs_limit: int = Field(default=200, ge=1, description="Runs listed by the ops view.")
    ops_token_hours: int = Field(default=24, ge=1, description="Hours of the token chart.")
    ops_refresh_s: float = Field(default=3.0, gt=0, description="Ops page refresh period.")
    ops_lock_timeout_s: float = Field(
        default=2.0, gt=0, description="Ops cancel/requeue wait at most this for a locked run."
    )
    ops_failure_window_s: float = Field(
        default=3600.0,
        gt=0,
        description="The ops health strip's failure rate and failure list cover runs that "
        "ended this recently.",
    )
    ops_failure_rate_bad: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="The ops failure-rate tile turns red at this share of ended runs failing.",
    )
    ops_failure_bad_min: int = Field(
        default=3,
        ge=1,
        description="...and at least this many failed runs (fewer is a warning): one "
        "failure among two runs is not an outage.",
    )
    ops_queue_age_bad_s: float = Field(
        default=60.0,
        gt=0,
        description="The ops queue tile turns red when a dispatched run has waited this long.",
    )
    ops_cron_late_s: float = Field(
        default=60.0,
        gt=0,
        description="The ops crons tile turns red when an enabled cron is overdue by this "
        "much (its scheduler is not firing).",
    )
    ops_worker_history_s: float = Field(
        default=7 * 86_400.0,
        gt=0,
        description="The ops view keeps each lost worker's event (when, which worker, the "
        "runs it held) and each worker's finished-run counts this long.",
    )
    ops_worker_losses_max: int = Field(
        default=500,
        ge=1,
        description="...and at most this many worker-loss events (the oldest go first).",
    )
    metrics_require_ops: bool = Field(
        default=False, description="GET /metrics needs an ops key (off: scrapers need none)."
    )

    # --- journal and event store (J) --------------------------------------------------
    journal_enabled: bool = Field(default=True, description="Record the audit journal (J1).")
    journal_flush_size: int = Field(
        default=20, ge=1, description="Buffered audit events per write."
    )
    journal_snapshot_interval_s: float = Field(
        default=5.0, gt=0, description="Progress snapshot cadence."
    )
    event_payload_max_bytes: int = Field(
        default=65536, ge=256, description="Larger payloads are truncated."
    )
    event_page_size: int = Field(default=100, ge=1)
    event_page_size_max: int = Field(default=500, ge=1)
    delivery_receipt_attempts: int = Field(default=3, ge=1)
    delivery_receipt_backoff_s: float = Field(default=0.1, ge=0)

    # --- summary and durable context (C1-C3) ---------------------------------------------
    summary_enabled: bool = Field(default=True, description="Summarize long threads (C1).")
    summary_trigger_tokens: int = Field(
        default=4000, ge=1, description="Summarize when a thread's messages exceed this budget."
    )
    summary_keep_messages: int = Field(
        default=6, ge=0, description="Preserved tail: newest messages kept verbatim (C1)."
    )
    summary_model: str | None = Field(
        default=None, description="Model for summaries; unset = the run's model (C1)."
    )

    # --- long-term memory (M1-M6) ----------------------------------------------------------
    memory_enabled: bool = Field(default=True, description="Inject and write memory (M2, M4).")
    memory_backend: str = Field(
        default="postgres",
        description="'postgres' or 'package.module:Factory' taking Settings (M1).",
    )
    memory_read_policy: Literal["fail_open", "fail_closed"] = Field(
        default="fail_open",
        description="M3: the Postgres backend's failure_policy.read (a failed read: no memory,"
        " or the run fails); a third-party backend sets its own.",
    )
    memory_injection_timeout_s: float = Field(
        default=5.0, gt=0, description="Bound on the memory read at injection (M2)."
    )
    memory_max_facts: int = Field(default=20, ge=1, description="Facts injected per thread (M2).")
    memory_known_facts: int = Field(
        default=50,
        ge=0,
        description="The user's newest facts shown to extraction, which may supersede them (M4).",
    )
    memory_max_messages: int = Field(
        default=40, ge=1, description="Messages kept per debounced update (M4)."
    )
    memory_debounce_s: float = Field(
        default=30.0, ge=0, description="Debounce window per agent/user/thread (M4)."
    )
    memory_max_wait_s: float = Field(
        default=300.0,
        ge=0,
        description="A bucket is extracted at most this long after its first update.",
    )
    memory_backlog_limit: int = Field(
        default=1000, ge=1, description="Backlog past which ordinary updates are skipped (M5)."
    )
    memory_drain_interval_s: float = Field(
        default=1.0, gt=0, description="How often the memory worker looks for due updates."
    )
    memory_drain_batch: int = Field(default=100, ge=1, description="Due updates per drain pass.")
    memory_claim_ttl_s: float = Field(
        default=120.0, gt=0, description="A claimed update not acked by then is re-dispatched."
    )
    memory_max_attempts: int = Field(
        default=5, ge=1, description="Extraction attempts before an update is dropped."
    )
    memory_model: str | None = Field(
        default=None, description="Model for memory extraction; unset = `model` (M4)."
    )
    memory_db_pool_max: int = Field(
        default=4, ge=1, description="Memory store connections per process."
    )
    memory_list_max: int = Field(
        default=500, ge=1, description="Largest page of GET /memory/facts (M6)."
    )
    store_db_pool_max: int = Field(
        default=4, ge=1, description="Connections of a worker process's store (graphs' store)."
    )

    # --- webhooks (shared/webhooks/) ------------------------------------------
    webhook_secret: SecretStr | None = Field(
        default=None,
        description=(
            "HMAC-SHA256 key of X-Threadrun-Signature; unset: one is generated once and kept"
            " in the database (`python -m shared.webhooks secret` prints it)."
        ),
    )
    webhook_allow: str = Field(
        default="",
        description=(
            "Comma-separated CIDRs and host names a webhook may reach although they are"
            " loopback, private, link-local or metadata addresses (egress policy)."
        ),
    )
    webhook_url_max: int = Field(default=2048, ge=16, description="Longest webhook URL (422).")
    webhook_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="One attempt's longest wait: for the answer's first byte, each read.",
    )
    webhook_connect_timeout_s: float = Field(
        default=3.0, gt=0, description="One attempt's connect to the receiver."
    )
    webhook_host_concurrency: int = Field(
        default=2,
        ge=1,
        description="Attempts in flight to one receiver host, across the webhooks workers;"
        " more are parked until a slot frees (a slow receiver cannot hold every thread).",
    )
    webhook_user_concurrency: int = Field(
        default=4,
        ge=1,
        description="Attempts in flight of one user's runs, across the webhooks workers.",
    )
    webhook_max_attempts: int = Field(
        default=6, ge=1, description="Attempts of one delivery before it is `failed`."
    )
    webhook_backoff_base_s: float = Field(
        default=2.0, gt=0, description="Backoff before attempt 2 (doubles each attempt, jittered)."
    )
    webhook_backoff_cap_s: float = Field(
        default=300.0, gt=0, description="Longest backoff between two attempts."
    )
    webhook_retry_after_cap_s: float = Field(
        default=900.0, ge=0, description="A receiver's Retry-After is honoured up to this."
    )
    webhook_response_max_bytes: int = Field(
        default=65536, ge=0, description="Most of a receiver's answer read (the rest dropped)."
    )
    webhook_stale_s: float = Field(
        default=30.0,
        gt=0,
        description=(
            "The reaper re-sends a due delivery whose task was not seen for this long (a"
            " worker died between the run's end and the dispatch, a lost message)."
        ),
    )
    webhook_worker: Literal["memory", "dedicated"] = Field(
        default="dedicated",
        description=(
            "Which process of `make run` consumes the `webhooks` queue: the memory worker"
            " (`-Q memory,webhooks`) or a dedicated `webhooks` worker."
        ),
    )
    webhook_concurrency: int = Field(
        default=8, ge=1, description="Threads of a dedicated webhooks worker."
    )

    # --- database -----------------------------------------------------------------
    checkpoint_savers: int = Field(
        default=8,
        ge=1,
        description="Checkpoint savers per worker process (each serialises its own writes).",
    )
    fence_idle_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description=(
            "L2: a fenced write holds its run row (FOR SHARE) until commit; if its client goes"
            " silent this long inside the transaction (a frozen owner), PostgreSQL ends the"
            " session and the row is free for the reaper."
        ),
    )
    reaper_lock_timeout_s: float = Field(
        default=2.0,
        gt=0,
        description="The reaper skips a run whose row stays locked this long (next pass retries).",
    )
    checkpoint_mode: Literal["full", "delta"] = Field(
        default="full",
        description=(
            "S4: 'full' (plain channels) or 'delta' (messages as a DeltaChannel). Fixed per"
            " deployment; see shared/state/modes.py for the full -> delta migration."
        ),
    )
    held_writes_linger_s: float = Field(
        default=0.2,
        ge=0,
        description=(
            "A task's pending writes wait at most this long for the step's checkpoint, to"
            " commit in its transaction (shared/state/held_writes.py); 0 writes them at once."
        ),
    )
    checkpoint_snapshot_every: int = Field(
        default=10, ge=1, description="S4: delta mode writes a full snapshot every K updates."
    )
    db_pool_min: int = Field(default=1, ge=0)
    db_pool_max: int = Field(default=20, ge=1)

    # --- web server (gunicorn, app/gunicorn_conf.py) ---------------------------------
    web_worker_class: Literal["gevent", "gthread"] = Field(
        default="gevent",
        description="gunicorn worker: gevent (one greenlet per connection) or gthread.",
    )
    gc_threshold0: int = Field(
        default=10_000,
        ge=0,
        description="Web and worker processes freeze their start-up heap and run a young "
        "garbage collection every this many allocations (shared/gc_tuning.py); 0 = "
        "Python's defaults.",
    )
    web_workers: int = Field(default=2, ge=1, description="gunicorn worker processes.")
    web_threads: int = Field(default=64, ge=1, description="Threads per gthread worker.")
    web_worker_connections: int = Field(
        default=10000, ge=1, description="Concurrent connections per gevent worker."
    )
    web_timeout_s: int = Field(
        default=0, ge=0, description="gunicorn worker timeout (0 = never restart a busy worker)."
    )
    web_graceful_timeout_s: int = Field(
        default=5, ge=0, description="Open requests and streams get this long at shutdown."
    )
    web_keepalive_s: int = Field(
        default=75,
        ge=0,
        description="An idle keep-alive connection stays open this long (0 = one request "
        "per connection). Longer than the clients' own idle expiry (httpx 5 s, undici 4 s, "
        "aiohttp 15 s) and a load balancer's (60 s is common), so the client or the proxy "
        "closes first: a server closing a connection the client is reusing resets its "
        "request (gunicorn's own default, 2 s, did that to the SDK's).",
    )
    web_redis_connections: int = Field(
        default=200, ge=2, description="Redis connections per web process (requests wait)."
    )
    web_redis_wait_s: float = Field(
        default=10.0, gt=0, description="Longest wait for a free Redis connection in the web."
    )

    @field_validator("redis_sentinels")
    @classmethod
    def _sentinels_are_host_ports(cls, v: str) -> str:
        for node in filter(None, (p.strip() for p in v.split(","))):
            host, _, port = node.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(
                    f"redis_sentinels must be comma-separated host:port entries, not {node!r}"
                )
        return v

    @property
    def sentinel_nodes(self) -> list[tuple[str, int]]:
        """The configured Sentinels as (host, port); empty when Sentinel is off."""
        out = []
        for node in filter(None, (p.strip() for p in self.redis_sentinels.split(","))):
            host, _, port = node.rpartition(":")
            out.append((host.strip("[]"), int(port)))
        return out

    @field_validator("redis_prefix")
    @classmethod
    def _prefix_ends_with_colon(cls, v: str) -> str:
        if not v:
            raise ValueError("redis_prefix must not be empty")
        return v if v.endswith(":") else v + ":"

    def __repr_args__(self) -> Any:
        """repr() without the password a Redis URL may carry (`redis://:pw@host`, `?password=`)."""
        for name, value in super().__repr_args__():
            if name == "redis_url" and isinstance(value, str):
                value = redact(value)
            yield name, value

    @property
    def dsn(self) -> str:
        """The database URL (secret; never log it)."""
        return self.database_url.get_secret_value()

    @cached_property
    def api_key_map(self) -> dict[str, tuple[str, str]]:
        """key -> (user_id, role), parsed from `api_keys`."""
        out: dict[str, tuple[str, str]] = {}
        raw = self.api_keys.get_secret_value()
        for entry in filter(None, (p.strip() for p in raw.split(","))):
            parts = entry.split(":")
            key, user = parts[0], parts[1] if len(parts) > 1 else ""
            role = parts[2] if len(parts) == 3 else "user"
            if not key or not user or len(parts) > 3 or role not in ("user", "ops"):
                raise ValueError(
                    "THREADRUN_API_KEYS must be comma-separated key:user_id[:role] entries"
                    " with role `user` or `ops`"
                )
            out[key] = (user, role)
        return out

    @property
    def workspace_dir(self) -> Path:
        """Root of the per-thread sandbox workspaces."""
        return self.data_dir / "workspaces"


def get_settings() -> Settings:
    """A fresh Settings from the environment (callers keep their own instance)."""
    return Settings()
