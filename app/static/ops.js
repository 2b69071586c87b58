// threadrun ops page: polls GET /ops/api/overview with the ops key and draws it.
// Plain JS, no build step; charts are drawn on <canvas> by the small helpers below.
"use strict";

const params = new URLSearchParams(location.search);
const keyInput = document.getElementById("key");
keyInput.value = params.get("api_key") || sessionStorage.getItem("threadrun-ops-key") || "";
keyInput.addEventListener("change", () => {
  sessionStorage.setItem("threadrun-ops-key", keyInput.value);
  refresh();
});
const HISTORY = 60; // refreshes kept for the sparklines
const history = { runs: [], memory: [], sse: [], ws: [] };
let timer = null;

function headers(json) {
  const h = { "x-api-key": keyInput.value };
  if (json) h["content-type"] = "application/json";
  return h;
}

async function api(path, opts = {}) {
  const resp = await fetch(path, { ...opts, headers: headers(!!opts.body) });
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok && resp.status !== 409) throw new Error(`${resp.status}: ${body.message || resp.statusText}`);
  return body;
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function fill(tableId, rows, cells) {
  const tbody = document.querySelector(`#${tableId} tbody`);
  tbody.replaceChildren();
  if (!rows.length) {
    const tr = el("tr");
    const td = el("td", "none", "muted");
    td.colSpan = document.querySelectorAll(`#${tableId} th`).length;
    tr.append(td);
    tbody.append(tr);
    return;
  }
  for (const row of rows) {
    const tr = el("tr");
    for (const c of cells(row)) tr.append(c instanceof Node ? c : el("td", c));
    tbody.append(tr);
  }
}

const short = (id) => (id ? String(id).slice(0, 8) : "–");
const num = (v, digits = 1) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));

// --- charts ------------------------------------------------------------------------------
function canvasCtx(id) {
  const c = document.getElementById(id);
  const ctx = c.getContext("2d");
  ctx.clearRect(0, 0, c.width, c.height);
  ctx.font = "11px system-ui, sans-serif";
  return [c, ctx];
}

function bars(id, labels, series, colors) {
  const [c, ctx] = canvasCtx(id);
  const pad = 18;
  const max = Math.max(1, ...labels.map((_, i) => series.reduce((s, v) => s + (v[i] || 0), 0)));
  const w = (c.width - pad) / labels.length;
  labels.forEach((label, i) => {
    let y = c.height - pad;
    series.forEach((values, k) => {
      const h = ((values[i] || 0) / max) * (c.height - 2 * pad);
      ctx.fillStyle = colors[k];
      ctx.fillRect(pad + i * w + 2, y - h, Math.max(1, w - 4), h);
      y -= h;
    });
    ctx.fillStyle = "#444";
    const total = series.reduce((s, v) => s + (v[i] || 0), 0);
    if (labels.length <= 12 || i % Math.ceil(labels.length / 12) === 0) {
      ctx.fillText(label, pad + i * w + 2, c.height - 4);
    }
    if (labels.length <= 12) ctx.fillText(String(total), pad + i * w + 2, y - 3);
  });
  ctx.fillStyle = "#888";
  ctx.fillText(`max ${max}`, 2, 11);
}

function lines(id, seriesList) {
  const [c, ctx] = canvasCtx(id);
  const max = Math.max(1, ...seriesList.flatMap((s) => s.values));
  seriesList.forEach((s) => {
    ctx.strokeStyle = s.color;
    ctx.setLineDash(s.dashed ? [4, 3] : []);
    ctx.beginPath();
    s.values.forEach((v, i) => {
      const x = (i / (HISTORY - 1)) * (c.width - 4) + 2;
      const y = c.height - 4 - (v / max) * (c.height - 16);
      if (i === 0) ctx.moveTo(x, y);
      else ctx.lineTo(x, y);
    });
    ctx.stroke();
  });
  ctx.setLineDash([]);
  ctx.fillStyle = "#888";
  ctx.fillText(`max ${max}`, 2, 11);
}

function push(name, value) {
  history[name].push(value);
  if (history[name].length > HISTORY) history[name].shift();
}

// --- actions -------------------------------------------------------------------------------
async function act(runId, action) {
  const out = document.getElementById("action-result");
  const body = action === "cancel" ? { action: "interrupt" } : { reason: "stuck (ops page)" };
  try {
    const res = await api(`/ops/api/runs/${runId}/${action}`, { method: "POST", body: JSON.stringify(body) });
    out.textContent = `${action} ${short(runId)}: ${res.outcome}`;
    out.className = res.ok ? "ok" : "bad";
  } catch (err) {
    out.textContent = `${action} ${short(runId)} failed: ${err.message}`;
    out.className = "bad";
  }
  refresh();
}

function actions(run) {
  const td = el("td");
  const cancel = el("button", "cancel");
  cancel.addEventListener("click", () => act(run.run_id, "cancel"));
  td.append(cancel);
  if (run.lease_expired || (run.status === "pending" && !run.dispatched_at)) {
    const requeue = el("button", "requeue");
    requeue.addEventListener("click", () => act(run.run_id, "requeue"));
    td.append(requeue);
  }
  return td;
}

// --- drawing the overview ---------------------------------------------------------------------
function draw(o) {
  const statuses = ["pending", "running", "success", "error", "timeout", "interrupted"];
  bars("chart-status", statuses, [statuses.map((s) => o.runs.by_status[s] || 0)], ["#3b6ea5"]);
  document.getElementById("stuck").textContent = o.runs.stuck;
  document.getElementById("stuck").className = o.runs.stuck ? "bad" : "";
  document.getElementById("fenced-status").textContent = o.runs.fenced.status_writes_recorded;
  document.getElementById("fenced-sinks").textContent = Object.entries(o.runs.fenced.by_sink_this_host)
    .map(([k, v]) => `${k} ${v}`).join(", ");

  fill("queues", Object.entries(o.queues), ([name, q]) => [name, q.depth, num(q.oldest_age_s), o.workers_online[name] || 0]);
  push("runs", o.queues.runs.depth);
  push("memory", o.queues.memory.depth);
  lines("chart-depth", [
    { values: history.runs, color: "#3b6ea5" },
    { values: history.memory, color: "#a5673b", dashed: true },
  ]);

  const c = o.connections;
  document.getElementById("conn-sse").textContent = c.open.sse;
  document.getElementById("conn-ws").textContent = c.open.ws;
  document.getElementById("web-procs").textContent = c.web_processes;
  document.getElementById("gaps").textContent = o.gaps_sent_this_host;
  push("sse", c.open.sse);
  push("ws", c.open.ws);
  lines("chart-conns", [
    { values: history.sse, color: "#3b6ea5" },
    { values: history.ws, color: "#067647", dashed: true },
  ]);

  const m = o.memory;
  document.getElementById("mem-backlog").textContent = m.backlog;
  document.getElementById("mem-skipped").textContent = m.skipped;
  document.getElementById("mem-age").textContent = num(m.oldest_due_age_s);
  document.getElementById("mem-note").textContent = m.available ? "" : "memory stats not available in this deployment";

  const hours = o.tokens_per_hour.map((h) => new Date(h.hour * 1000).getHours() + "h");
  bars("chart-tokens", hours, [o.tokens_per_hour.map((h) => h.input), o.tokens_per_hour.map((h) => h.output)], ["#3b6ea5", "#9cc0e6"]);

  const now = o.at;
  fill("runs", o.runs.inflight, (r) => [
    el("td", short(r.run_id), "mono"),
    el("td", short(r.thread_id), "mono"),
    r.user_id,
    el("td", r.status, r.lease_expired ? "bad" : ""),
    el("td", r.owner || "–", "mono"),
    r.owner_epoch,
    r.lease.held ? `epoch ${r.lease.epoch}` : (r.status === "running" ? el("td", "expired", "bad") : "–"),
    num(r.lease.ttl_s),
    r.attempt,
    num(now - Date.parse(r.created_at) / 1000, 0),
    actions(r),
  ]);
  fill("workers", o.workers, (w) => [
    el("td", w.name, "mono"), w.pid, w.queues.join(", "), w.concurrency ?? "–",
    el("td", w.active_runs.map(short).join(" ") || "–", "mono"),
  ]);
  fill("streams", o.streams.filter((s) => s.exists || s.subscribers), (s) => [
    el("td", short(s.run_id), "mono"), s.length, s.published, el("td", s.last_id || "–", "mono"),
    s.subscribers, s.expires_in_s ?? "–",
  ]);
}

async function drawAudit() {
  const res = await api("/ops/api/audit?limit=20");
  fill("audit", res.audit, (a) => [
    new Date(a.at).toLocaleTimeString(), a.actor, a.action, el("td", short(a.run_id), "mono"),
    el("td", JSON.stringify(a.params), "mono"), a.result,
  ]);
}

async function refresh() {
  const status = document.getElementById("status");
  clearTimeout(timer);
  let every = 3;
  try {
    const o = await api("/ops/api/overview");
    every = o.refresh_s || every;
    draw(o);
    await drawAudit();
    status.textContent = `updated ${new Date().toLocaleTimeString()}`;
    status.className = "muted";
  } catch (err) {
    status.textContent = `error: ${err.message}`;
    status.className = "bad";
  }
  if (document.getElementById("live").checked) timer = setTimeout(refresh, every * 1000);
}

document.getElementById("live").addEventListener("change", refresh);
refresh();
