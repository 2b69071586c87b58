// threadrun ops page: polls GET /ops/api/overview (+ failures, audit) with the ops key.
// Plain JS, no build step. The page answers "is anything wrong?" first (the verdict and the
// health tiles, each with its reason in words), then what runs now, then what failed.
// Tables are keyed by id and updated in place: a refresh changes the text of the cells
// that changed and never rebuilds a row under the pointer (hover, selection and focus stay).
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

// The server's mount prefix (langgraph.json `http.mount_prefix`): the page is at <prefix>/ops.
const BASE = location.pathname.replace(/\/ops\/?$/, "");

async function api(path, opts = {}) {
  const resp = await fetch(BASE + path, { ...opts, headers: headers(!!opts.body) });
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

/** Set a node's text (and class) only when it changed, so unchanged cells are not touched. */
function setText(node, text, cls) {
  const t = text === undefined || text === null ? "" : String(text);
  if (node.textContent !== t) node.textContent = t;
  if (cls !== undefined && node.className !== cls) node.className = cls;
}

const short = (id) => (id ? String(id).slice(0, 8) : "–");
const num = (v, digits = 1) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));

function dur(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 90) return `${s}s`;
  if (s % 3600 === 0) return `${s / 3600}h`;
  if (s < 5400) return `${Math.round(s / 60)}m`;
  if (s < 172800) return `${Math.round(s / 3600)}h`;
  return `${Math.round(s / 86400)}d`;
}

// --- ids: short on screen, whole when copied ---------------------------------------------------
// The cell holds the full id, clipped to 8 characters by CSS; a click selects the whole id
// (user-select: all), and the copy button puts it on the clipboard.
function idCell(id) {
  const td = el("td", null, "id-cell");
  if (!id) {
    td.textContent = "–";
    return td;
  }
  const code = el("code", id, "id");
  code.title = id;
  const copy = el("button", "copy", "copy");
  copy.type = "button";
  copy.title = "copy the full id";
  copy.setAttribute("aria-label", `copy ${id}`);
  copy.addEventListener("click", () => copyText(id, copy));
  td.append(code, copy);
  return td;
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    const sel = getSelection();
    const range = document.createRange();
    range.selectNodeContents(button.previousSibling);
    sel.removeAllRanges();
    sel.addRange(range);
    document.execCommand("copy");
  }
  button.textContent = "copied";
  setTimeout(() => { button.textContent = "copy"; }, 1200);
}

// --- keyed tables --------------------------------------------------------------------------------
/**
 * Make `tableId`'s body show `items` in order, one row per key: a new key gets a row from
 * `create(item)` (an array of cells), every row gets `update(tr, item)`, a vanished key's row
 * is removed. Rows that stay are the same DOM nodes (moved only if the order changed).
 */
function sync(tableId, items, key, create, update) {
  const tbody = document.querySelector(`#${tableId} tbody`);
  const rows = new Map();
  for (const tr of tbody.children) if (tr.dataset.key) rows.set(tr.dataset.key, tr);
  const empty = tbody.querySelector("tr.empty");
  if (!items.length) {
    for (const tr of rows.values()) tr.remove();
    if (!empty) {
      const tr = el("tr", null, "empty");
      const td = el("td", "none", "muted");
      td.colSpan = document.querySelectorAll(`#${tableId} thead th`).length;
      tr.append(td);
      tbody.append(tr);
    }
    return;
  }
  if (empty) empty.remove();
  const keep = new Set();
  let prev = null;
  for (const item of items) {
    const k = String(key(item));
    keep.add(k);
    let tr = rows.get(k);
    if (!tr) {
      tr = el("tr");
      tr.dataset.key = k;
      for (const c of create(item)) tr.append(c instanceof Node ? c : el("td", c));
    }
    update(tr, item);
    const want = prev ? prev.nextSibling : tbody.firstChild;
    if (want !== tr) tbody.insertBefore(tr, want);
    prev = tr;
  }
  for (const [k, tr] of rows) if (!keep.has(k)) tr.remove();
}

/** Cell i of a row (the cells are created once, in a fixed order). */
const cell = (tr, i) => tr.children[i];

// --- charts ------------------------------------------------------------------------------------
function canvasCtx(id) {
  const c = document.getElementById(id);
  const ctx = c.getContext("2d");
  ctx.clearRect(0, 0, c.width, c.height);
  ctx.font = "11px system-ui, sans-serif";
  return [c, ctx];
}

function bars(id, labels, series, colors) {
  const [c, ctx] = canvasCtx(id);
  const pad = 14;
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
    ctx.fillStyle = "#555";
    const total = series.reduce((s, v) => s + (v[i] || 0), 0);
    if (labels.length <= 12 || i % Math.ceil(labels.length / 12) === 0) {
      ctx.fillText(label, pad + i * w + 2, c.height - 2);
    }
    if (labels.length <= 12) ctx.fillText(String(total), pad + i * w + 2, Math.max(10, y - 2));
  });
  ctx.fillStyle = "#888";
  ctx.fillText(`max ${max}`, c.width - 60, 10);
}

function lines(id, seriesList) {
  const [c, ctx] = canvasCtx(id);
  const max = Math.max(1, ...seriesList.flatMap((s) => s.values));
  seriesList.forEach((s) => {
    ctx.strokeStyle = s.color;
    ctx.setLineDash(s.dashed ? [4, 3] : []);
    ctx.beginPath();
    s.values.forEach((v, i) => {
      const x = (i / Math.max(1, s.values.length - 1)) * (c.width - 4) + 2;
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

// --- confirmation and actions ------------------------------------------------------------------
const dialog = document.getElementById("confirm");

/** Ask before acting; resolves true only when the user chose the action. */
function confirmAction(title, text, runId, yesLabel, noLabel) {
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-id").textContent = `run ${runId}`;
  document.getElementById("confirm-yes").textContent = yesLabel;
  document.getElementById("confirm-no").textContent = noLabel;
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
  });
}

const ACTIONS = {
  cancel: {
    title: "Cancel this run?",
    text: (r) => `${r.user_id}'s ${r.status} run stops ${r.status === "running" ? "at its next safe point, keeping its progress" : "before it starts"}. This is audited and cannot be undone.`,
    yes: "Cancel run",
    no: "Keep it running",
    body: { action: "interrupt" },
  },
  requeue: {
    title: "Requeue this stuck run?",
    text: (r) => `${r.requeue.why}. A worker will pick it up${r.status === "running" ? " and resume it from its last checkpoint (a new attempt)" : ""}. This is audited.`,
    yes: "Requeue run",
    no: "Not now",
    body: { reason: "stuck (ops page)" },
  },
};

async function act(run, action) {
  const spec = ACTIONS[action];
  if (!(await confirmAction(spec.title, spec.text(run), run.run_id, spec.yes, spec.no))) return;
  const out = document.getElementById("action-result");
  try {
    const res = await api(`/ops/api/runs/${run.run_id}/${action}`, { method: "POST", body: JSON.stringify(spec.body) });
    out.textContent = `${action} ${short(run.run_id)}: ${res.outcome}`;
    out.className = res.ok ? "ok" : "bad";
  } catch (err) {
    out.textContent = `${action} ${short(run.run_id)} failed: ${err.message}`;
    out.className = "bad";
  }
  refresh();
}

/** The actions cell: rebuilt only when the offered actions change (not every refresh). */
function updateActions(td, run) {
  const offered = ["cancel", ...(run.requeue && run.requeue.eligible ? ["requeue"] : [])];
  const sig = offered.join(",");
  td._run = run; // the buttons act on the latest figures of the run
  if (td.dataset.sig === sig) return;
  td.dataset.sig = sig;
  td.replaceChildren(
    ...offered.map((action) => {
      const b = el("button", action, action === "requeue" ? "act requeue" : "act");
      b.type = "button";
      b.addEventListener("click", () => act(td._run, action));
      return b;
    }),
  );
}

// --- drawing -------------------------------------------------------------------------------------
const STATE_MARK = { ok: "✓", warn: "!", bad: "✗" };

function drawHealth(h) {
  const verdict = document.getElementById("verdict");
  const n = h.problems.length;
  if (n) setText(verdict, `${n} problem${n > 1 ? "s" : ""}`, "verdict bad");
  else if (h.warnings.length) setText(verdict, "working, with warnings", "verdict warn");
  else setText(verdict, "all clear", "verdict ok");

  const problems = document.getElementById("problems");
  problems.hidden = !n;
  setText(problems, n ? `Something is wrong: ${h.problems.join(" · ")}` : "");

  const tiles = document.getElementById("tiles");
  for (const t of h.tiles) {
    let tile = tiles.querySelector(`[data-key="${t.key}"]`);
    if (!tile) {
      tile = el("div", null, "tile");
      tile.dataset.key = t.key;
      tile.setAttribute("role", "group");
      tile.append(el("div", null, "tile-head"), el("div", null, "tile-value"), el("div", null, "tile-reason"));
      tile.children[0].append(el("span", null, "mark"), el("span", null, "label"));
      tiles.append(tile);
    }
    tile.className = `tile ${t.state}`;
    tile.dataset.state = t.state;
    tile.setAttribute("aria-label", `${t.label}: ${t.state}`);
    setText(tile.querySelector(".mark"), STATE_MARK[t.state] || "?");
    setText(tile.querySelector(".label"), t.label);
    setText(tile.querySelector(".tile-value"), tileValue(t));
    setText(tile.querySelector(".tile-reason"), t.reason);
  }
}

function tileValue(t) {
  if (t.value === null || t.value === undefined) return "–";
  if (t.key === "failures") return `${Math.round(t.value * 1000) / 10}%`;
  if (t.key === "queue_age") return dur(t.value);
  return String(t.value);
}

function statusNote(r) {
  if (r.requeue && r.requeue.eligible) return `stuck: ${r.requeue.why.split(":")[0]}`;
  if (r.status === "pending") return r.requeue ? r.requeue.why : "";
  if (r.cancel_action) return `cancel requested (${r.cancel_action})`;
  return "";
}

function drawRuns(o) {
  const now = o.at;
  const inflight = o.runs.inflight;
  setText(document.getElementById("inflight-count"), inflight.length ? `(${inflight.length})` : "");
  sync(
    "runs",
    inflight,
    (r) => r.run_id,
    (r) => [
      idCell(r.run_id),
      idCell(r.thread_id),
      el("td"),
      el("td", null, "status-cell"),
      el("td", null, "mono owner"),
      el("td", null, "num"),
      el("td", null, "num"),
      el("td", null, "num"),
      el("td", null, "actions-col"),
    ],
    (tr, r) => {
      const stuck = r.requeue && r.requeue.eligible;
      tr.classList.toggle("stuck", !!stuck);
      setText(cell(tr, 2), r.user_id);
      const st = cell(tr, 3);
      if (!st.firstChild) st.append(el("span", null, "pill"), el("span", null, "note"));
      setText(st.children[0], r.status, `pill ${stuck ? "bad" : r.status}`);
      setText(st.children[1], statusNote(r), "note");
      setText(cell(tr, 4), r.owner || "–");
      let lease = r.lease.held ? dur(r.lease.ttl_s) : r.status === "running" ? "expired" : "–";
      if (r.orphaned) lease = `orphaned: owner gone, recovers in ${dur(r.recovers_in_s)}`;
      tr.classList.toggle("orphaned", !!r.orphaned);
      setText(cell(tr, 5), lease, r.lease_expired || r.orphaned ? "num bad" : "num");
      setText(cell(tr, 6), r.attempt);
      setText(cell(tr, 7), dur(now - Date.parse(r.created_at) / 1000));
      updateActions(cell(tr, 8), r);
    },
  );
}

async function drawFailures() {
  const res = await api("/ops/api/failures?limit=20");
  setText(document.getElementById("failures-window"), `(ended error/timeout in the last ${dur(res.window_s)})`);
  const now = Date.now() / 1000;
  sync(
    "failures",
    res.failures,
    (f) => f.run_id,
    (f) => [el("td", null, "num"), idCell(f.run_id), idCell(f.thread_id), el("td", f.user_id), el("td"), el("td", null, "error-cell")],
    (tr, f) => {
      const ended = cell(tr, 0);
      setText(ended, `${dur(now - Date.parse(f.ended_at) / 1000)} ago`);
      ended.title = f.ended_at;
      const st = cell(tr, 4);
      if (!st.firstChild) st.append(el("span"));
      setText(st.firstChild, f.status, `pill ${f.status}`);
      const err = f.error || {};
      const td = cell(tr, 5);
      if (!td.firstChild) td.append(el("span", null, "err-type"), el("span", null, "err-msg"));
      setText(td.children[0], err.error || err.code || "error");
      setText(td.children[1], err.message || JSON.stringify(err));
      td.title = err.message || "";
    },
  );
}

/** "3 success · 1 error · 0 interrupted" (timeouts only when there are some). */
function finishedText(f) {
  if (!f) return "–";
  const parts = [`${f.success} success`, `${f.error} error`, `${f.interrupted} interrupted`];
  if (f.timeout) parts.splice(2, 0, `${f.timeout} timeout`);
  return parts.map((p) => p.replace(" ", "\u00a0")).join(" · "); // wraps between counts only
}

// Each lost worker once (kept for the server's retention): when, which, how it was seen,
// the runs it held with what became of them, and what it had finished before.
function drawLosses(o) {
  const losses = o.worker_losses || [];
  const now = o.at;
  setText(document.getElementById("losses-note"), losses.length ? `(${losses.length})` : "(none kept)");
  sync(
    "losses",
    losses,
    (l) => l.worker,
    (l) => [el("td", null, "num"), el("td", null, "mono wrap"), el("td"), el("td"), el("td", null, "finished")],
    (tr, l) => {
      const when = cell(tr, 0);
      setText(when, `${dur(now - l.at)} ago`);
      when.title = new Date(l.at * 1000).toLocaleString();
      setText(cell(tr, 1), l.name ? `${l.name} (${l.worker})` : l.worker);
      cell(tr, 1).title = l.worker;
      setText(cell(tr, 2), l.how);
      const runs = cell(tr, 3);
      const key = JSON.stringify(l.runs);
      if (runs.dataset.key !== key) {
        runs.dataset.key = key;
        runs.replaceChildren(
          ...l.runs.map((r) => {
            const span = el("span", null, "loss-run");
            const code = el("code", r.run_id, "id");
            code.title = r.run_id;
            span.append(code, el("span", r.status || "gone", `pill ${r.status || ""}`));
            return span;
          }),
        );
      }
      setText(cell(tr, 4), finishedText(l.finished));
    },
  );
}

function drawRest(o) {
  sync(
    "queues",
    Object.entries(o.queues),
    ([name]) => name,
    () => [el("td"), el("td", null, "num"), el("td", null, "num"), el("td", null, "num")],
    (tr, [name, q]) => {
      const workers = o.workers_online[name] || 0;
      setText(cell(tr, 0), name);
      setText(cell(tr, 1), q.depth);
      setText(cell(tr, 2), dur(q.oldest_age_s));
      // No webhooks worker matters once a delivery waits (the health tile says the same).
      const idle = name === "webhooks" && !q.outbox_due;
      setText(cell(tr, 3), workers ? workers : "0 — none", workers ? "num" : idle ? "num warn" : "num bad");
    },
  );
  push("runs", o.queues.runs.depth);
  push("memory", o.queues.memory.depth);
  lines("chart-depth", [
    { values: history.runs, color: "#3b6ea5" },
    { values: history.memory, color: "#a5673b", dashed: true },
  ]);

  sync(
    "workers",
    o.workers,
    (w) => w.name,
    (w) => [el("td", w.name, "mono"), el("td"), el("td", null, "num"), el("td", null, "mono"), el("td", null, "finished")],
    (tr, w) => {
      setText(cell(tr, 1), w.queues.join(", "));
      setText(cell(tr, 2), w.concurrency ?? "–");
      setText(cell(tr, 3), w.active_runs.length ? w.active_runs.map(short).join(" ") : "–");
      setText(cell(tr, 4), finishedText(w.finished));
    },
  );

  // `make run`'s supervisor and its children (none: a deployment's own process manager).
  const sups = o.supervisors || [];
  document.getElementById("supervised-card").hidden = !sups.length;
  setText(document.getElementById("supervised-note"), sups.length > 1 ? `(${sups.length} hosts)` : sups.length ? `(${sups[0].host})` : "");
  const STATE = { running: "success", restarting: "pending", crash_loop: "error" };
  sync(
    "supervised",
    sups.flatMap((sup) => sup.children.map((c) => ({ ...c, host: sup.host }))),
    (c) => `${c.host}/${c.name}`,
    (c) => [el("td", c.name, "mono"), el("td"), el("td", null, "num"), el("td", null, "num"), el("td")],
    (tr, c) => {
      const st = cell(tr, 1);
      if (!st.firstChild) st.append(el("span"));
      const label = c.state === "restarting" && c.restart_in_s != null ? `restarting in ${dur(c.restart_in_s)}` : c.state.replace("_", " ");
      setText(st.firstChild, label, `pill ${STATE[c.state] || ""}`);
      setText(cell(tr, 2), c.pid ?? "–");
      setText(cell(tr, 3), c.restarts);
      setText(cell(tr, 4), c.last_exit || "–");
    },
  );

  // Each graph's load state as the runs workers found it; a graph in error fails its runs.
  sync(
    "graphs",
    o.graphs || [],
    (g) => g.graph_id,
    (g) => [el("td", g.graph_id, "mono"), el("td", null, "mono wrap"), el("td"), el("td", null, "error-cell")],
    (tr, g) => {
      setText(cell(tr, 1), g.spec);
      const st = cell(tr, 2);
      if (!st.firstChild) st.append(el("span"));
      setText(st.firstChild, g.state, `pill ${g.state === "ok" ? "success" : "error"}`);
      setText(cell(tr, 3), g.error || "–");
      cell(tr, 3).title = g.error || "";
    },
  );

  const statuses = ["pending", "running", "success", "error", "timeout", "interrupted"];
  bars("chart-status", statuses, [statuses.map((s) => o.runs.by_status[s] || 0)], ["#3b6ea5"]);
  setText(document.getElementById("fenced-status"), o.runs.fenced.status_writes_recorded);
  setText(document.getElementById("fenced-sinks"), Object.entries(o.runs.fenced.by_sink_this_host)
    .map(([k, v]) => `${k} ${v}`).join(", "));

  const c = o.connections;
  setText(document.getElementById("conn-sse"), c.open.sse);
  setText(document.getElementById("conn-ws"), c.open.ws);
  setText(document.getElementById("web-procs"), c.web_processes);
  setText(document.getElementById("gaps"), o.gaps_sent_this_host);
  push("sse", c.open.sse);
  push("ws", c.open.ws);
  lines("chart-conns", [
    { values: history.sse, color: "#3b6ea5" },
    { values: history.ws, color: "#067647", dashed: true },
  ]);

  const m = o.memory;
  setText(document.getElementById("mem-backlog"), m.backlog);
  setText(document.getElementById("mem-skipped"), m.skipped);
  setText(document.getElementById("mem-age"), dur(m.oldest_due_age_s));
  setText(document.getElementById("mem-note"), m.available ? "" : "memory stats not available in this deployment");

  const hours = o.tokens_per_hour.map((h) => new Date(h.hour * 1000).getHours() + "h");
  bars("chart-tokens", hours, [o.tokens_per_hour.map((h) => h.input), o.tokens_per_hour.map((h) => h.output)], ["#3b6ea5", "#9cc0e6"]);

  sync(
    "streams",
    o.streams.filter((s) => s.exists || s.subscribers),
    (s) => s.run_id,
    (s) => [idCell(s.run_id), el("td", null, "num"), el("td", null, "num"), el("td", null, "mono"), el("td", null, "num"), el("td", null, "num")],
    (tr, s) => {
      setText(cell(tr, 1), s.length);
      setText(cell(tr, 2), s.published);
      setText(cell(tr, 3), s.last_id || "–");
      setText(cell(tr, 4), s.subscribers);
      setText(cell(tr, 5), dur(s.expires_in_s));
    },
  );
}

async function drawAudit() {
  const res = await api("/ops/api/audit?limit=20");
  sync(
    "audit",
    res.audit,
    (a) => a.audit_id,
    (a) => [
      el("td", new Date(a.at).toLocaleTimeString()), el("td", a.actor), el("td", a.action), idCell(a.run_id),
      el("td", JSON.stringify(a.params), "mono"), el("td", a.result),
    ],
    () => {},
  );
}

async function refresh() {
  const status = document.getElementById("status");
  clearTimeout(timer);
  let every = 3;
  try {
    const o = await api("/ops/api/overview");
    every = o.refresh_s || every;
    drawHealth(o.health);
    drawRuns(o);
    drawLosses(o);
    drawRest(o);
    await Promise.all([drawFailures(), drawAudit()]);
    setText(status, `updated ${new Date().toLocaleTimeString()}`, "muted");
  } catch (err) {
    setText(status, `error: ${err.message}`, "bad");
    setText(document.getElementById("verdict"), "unknown: the ops API did not answer", "verdict bad");
  }
  if (document.getElementById("live").checked) timer = setTimeout(refresh, every * 1000);
}

document.getElementById("live").addEventListener("change", refresh);
refresh();
