/*
 * threadrun chat page (plain JS, no build step).
 *
 * Transport: the WebSocket protocol of SPEC A2 (`/ws?api_key=`; frames run.create, run.join,
 * run.cancel, ping; server frames event, gap, heartbeat, end, error). If the socket cannot
 * open at all (or `?transport=sse`), runs are created over HTTP and followed with SSE read
 * through fetch + ReadableStream, with `Last-Event-ID` on every rejoin.
 *
 * Recovery (SPEC B4, B5, B9):
 *   - the page keeps the id of the last event it applied;
 *   - a dropped socket -> "reconnecting…", exponential back-off, then run.join with
 *     last_event_id: the server replays exactly the events after it (B4);
 *   - a `gap` (events after our cursor were trimmed, B5) -> drop the transient UI state
 *     (partial assistant text, the optimistic user message), reload GET /threads/{id}/state,
 *     re-render the transcript from it, show "view incomplete — reloaded", then rejoin after
 *     latest_available_event_id;
 *   - 3 consecutive gaps -> "error"; the run keeps going on the server, the page stays usable
 *     and reloads the transcript when the run ends (it waits on GET …/join);
 *   - after `end`, the transcript is rendered once more from GET /threads/{id}/state, so what
 *     the page shows is the durable state.
 *
 * Generative UI (docs/genui.md): the thread's UI messages (`values.ui`, live `custom` events
 * of `push_ui_message` / `delete_ui_message`) are rendered as LoadExternalComponent does:
 * POST /ui/{graph} for the tags, inserted in a shadow root, then the bundle's `render`. The
 * page's CSP runs no inline handler, so the tags are read as XML (inert) and their script's
 * `load` listener is attached here instead of the `onload` attribute. React is loaded on
 * demand, for the first UI message only.
 *
 * Debug query parameters: `?tokens=60&delay=20` send config.configurable {tokens,
 * token_delay_ms} (knobs of the built-in model), `?transport=sse` forces SSE,
 * `?api_key=` sets (and remembers) the key. `window.threadrunTest` is a small hook for
 * the browser tests (tests/e2e/test_browser.py).
 */
"use strict";

(() => {
  const KEY_STORE = "threadrun.api_key";
  const MAX_CONSECUTIVE_GAPS = 3;
  const SEARCH_MAX_CHARS = 200; // POST /threads/search `query` accepts at most this
  const SEARCH_DEBOUNCE_MS = 200;
  const SILENT_SOCKET_MS = 15000; // 3 heartbeat intervals without any frame: the socket is dead
  const BACKOFF_BASE_MS = 250;
  const BACKOFF_MAX_MS = 8000;
  const STREAM_MODES = ["messages-tuple", "updates", "values", "custom"];
  const TERMINAL = new Set(["success", "error", "timeout", "interrupted"]);
  const INFLIGHT = new Set(["pending", "running"]);
  const INCOMPLETE_DETAIL =
    "Some live events were missed (the stream had moved on); the transcript was reloaded from the saved state.";
  const LABELS = {
    idle: "ready",
    streaming: "streaming",
    reconnecting: "reconnecting…",
    incomplete: "view incomplete — reloaded",
    cancelled: "cancelled",
    error: "error",
    done: "done",
    waiting: "waiting for you",
  };

  // ---------------------------------------------------------------- configuration -------
  const params = new URLSearchParams(location.search);
  let apiKey = localStorage.getItem(KEY_STORE) || "";
  if (params.has("api_key")) {
    apiKey = params.get("api_key") || "";
    localStorage.setItem(KEY_STORE, apiKey);
    params.delete("api_key"); // keep the key out of the address bar and history
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + (rest ? `?${rest}` : "") + location.hash);
  }
  const configurable = {};
  if (params.get("tokens")) configurable.tokens = Number(params.get("tokens"));
  if (params.get("delay")) configurable.token_delay_ms = Number(params.get("delay"));
  let transport = params.get("transport") === "sse" ? "sse" : "ws";
  const debug = params.get("debug") === "1"; // the developer footer

  // ---------------------------------------------------------------- page state ----------
  const S = {
    threads: [],
    found: { query: "", threads: [] }, // POST /threads/search `query` answers for the search box
    opened: null, // the open thread's object, when it is not among the newest (found by search)
    threadId: null,
    durable: [], // messages as the server knows them (state, `values`, `updates`)
    next: [], // the thread state's `next`: the nodes a run with no input would run
    live: new Map(), // message id -> {text, toolCalls}: assistant text still streaming
    optimistic: null, // the user's message before the server echoes it
    artifacts: [], // from values.artifacts, if the graph has the channel
    ui: [], // generative UI messages: values.ui, then live `custom` ui / remove-ui events
    run: null, // the run this page follows (see newRun)
    status: "idle",
    detail: "",
    notice: null, // {kind, title, detail, more, retry, resume}: an error shown in the transcript
    modelWait: null, // the latest `model_wait` custom event while the model has not answered, + `at`
    limits: null, // GET /info `limits` (max_input_bytes, ws_max_frame_bytes, …)
    oversize: null, // why the composer's text cannot be sent
    preview: null, // the artifact open in the preview panel
    threadUi: { renaming: null, draft: "", confirming: null },
    cutoff: [], // {id, text, toolCalls}: what a failed run had streamed, kept, marked "cut off"
    readOnly: null, // the graph id of an open chat whose graph this server does not serve
    servedGraphs: null, // the graph ids this server serves (the system assistants'), once known
  };
  // What the browser test reads (window.threadrunTest).
  const T = {
    eventIds: [],
    duplicates: [],
    chunks: [], // {eventId, messageId, content} of every AIMessageChunk applied
    statuses: [],
    joins: 0,
    opens: 0,
    gaps: 0,
    holdRejoinMs: 0,
    skipSizeCheck: false,
    liveRenders: 0,
    searches: [], // the texts the server's thread search answered
    modelWaits: [], // {state, attempt, of, cause} of every model_wait event applied
  };

  const $ = (id) => document.getElementById(id);
  const el = {};

  // ---------------------------------------------------------------- HTTP ----------------
  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  function authHeaders() {
    return apiKey ? { "x-api-key": apiKey } : {};
  }

  // The server's mount prefix (langgraph.json `http.mount_prefix`): the page is at <prefix>/ui.
  const BASE = location.pathname.replace(/\/ui\/?$/, "");

  async function api(method, path, body) {
    const init = { method, headers: { ...authHeaders() } };
    if (body !== undefined) {
      init.headers["content-type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const resp = await fetch(BASE + path, init);
    const text = await resp.text();
    let data = null;
    try {
      data = text.trim() ? JSON.parse(text) : null;
    } catch (_e) {
      data = null;
    }
    if (!resp.ok) {
      const message = (data && (data.message || data.detail)) || `${resp.status} ${resp.statusText}`;
      if (resp.status === 401) showBanner("The server wants an API key: enter it at the top right.");
      throw new ApiError(resp.status, (data && data.error) || "http_error", message);
    }
    return data;
  }

  // ---------------------------------------------------------------- helpers -------------
  function textOf(content) {
    if (typeof content === "string") return content;
    if (Array.isArray(content)) {
      return content
        .map((b) => (typeof b === "string" ? b : b && b.type === "text" ? b.text || "" : ""))
        .join("");
    }
    return content == null ? "" : String(content);
  }

  function msgType(m) {
    const t = m.type || m.role || "";
    if (t === "human" || t === "user") return "human";
    if (t === "ai" || t === "assistant" || t === "AIMessageChunk") return "ai";
    if (t === "tool") return "tool";
    return t;
  }

  function isShown(m) {
    const t = msgType(m);
    if (t !== "human" && t !== "ai" && t !== "tool") return false; // system, remove, …
    const extra = m.additional_kwargs || {};
    return !(extra.hidden || extra.lc_hidden);
  }

  /** Redis Stream ids "ms-seq": -1, 0, 1 like a comparator. */
  function compareIds(a, b) {
    const [am, as] = String(a).split("-").map(Number);
    const [bm, bs] = String(b).split("-").map(Number);
    return am !== bm ? Math.sign(am - bm) : Math.sign((as || 0) - (bs || 0));
  }

  function sleep(ms) {
    return new Promise((resolve) => setTimeout(resolve, ms));
  }

  function shortId(id) {
    return id ? id.slice(0, 8) : "";
  }

  function ago(iso) {
    const t = Date.parse(iso);
    if (!t) return "";
    const s = Math.max(0, (Date.now() - t) / 1000);
    if (s < 60) return "just now";
    if (s < 3600) return `${Math.floor(s / 60)} min ago`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
    return new Date(t).toLocaleDateString();
  }

  function node(tag, cls, text) {
    const n = document.createElement(tag);
    if (cls) n.className = cls;
    if (text !== undefined) n.textContent = text;
    return n;
  }

  // ---------------------------------------------------------------- status --------------
  function setStatus(state, detail = "") {
    S.status = state;
    S.detail = detail;
    if (T.statuses[T.statuses.length - 1] !== state) T.statuses.push(state);
    el.status.dataset.state = state;
    el.status.textContent = LABELS[state] || state;
    el.detail.textContent = detail;
    el.detail.hidden = !detail;
    updateControls();
  }

  function showBanner(text) {
    el.banner.textContent = text;
    el.banner.hidden = !text;
  }

  function updateControls() {
    const r = S.run;
    const busy = Boolean(r && !r.ended && !r.abandoned);
    const readOnly = Boolean(S.threadId && S.readOnly);
    el.send.disabled = busy || Boolean(S.oversize) || readOnly;
    el.input.disabled = readOnly;
    el.input.placeholder = readOnly ? "This chat is read-only" : "Message threadrun…";
    el.stop.hidden = !busy;
    el.stop.disabled = Boolean(r && r.stopping) || !(r && r.runId);
    el.stop.textContent = r && r.stopping ? "Stopping…" : "Stop";
    if (!debug) return;
    const parts = [`transport: ${transport === "ws" ? "WebSocket" : "SSE"}`];
    if (S.threadId) parts.push(`thread ${S.threadId}`);
    if (r && r.runId) parts.push(`run ${r.runId}`);
    if (r && r.lastEventId) parts.push(`last event ${r.lastEventId}`);
    if (r && r.attempt > 1) parts.push(`attempt ${r.attempt}`);
    if (Object.keys(configurable).length) parts.push(`debug ${JSON.stringify(configurable)}`);
    el.footer.textContent = parts.join(" · ");
  }

  // ---------------------------------------------------------------- size limits ---------
  // GET /info names the server's limits; a message above them is refused here, naming the
  // limit, instead of being sent and refused (or the socket closed) by the server.
  /** A run request; `text` null: no input, the run continues from the thread's checkpoint. */
  function requestBody(text, assistantId = null, resumeValue = undefined) {
    const body = {
      assistant_id: assistantId || el.assistant.value || "lead_agent",
      stream_mode: STREAM_MODES,
      on_disconnect: "continue",
    };
    if (text !== null) body.input = { messages: [{ role: "user", content: text }] };
    if (resumeValue !== undefined) body.command = { resume: resumeValue };
    if (Object.keys(configurable).length) body.config = { configurable: { ...configurable } };
    return body;
  }

  function byteLength(s) {
    return new TextEncoder().encode(s).length;
  }

  /** Why this text cannot be sent (null when it can). */
  function sizeProblem(text) {
    if (T.skipSizeCheck) return null;
    const lim = S.limits || {};
    const body = requestBody(text);
    const inputBytes = byteLength(JSON.stringify(body.input));
    if (lim.max_input_bytes && inputBytes > lim.max_input_bytes) {
      return (
        `This message is ${humanSize(inputBytes)}; the server accepts at most ` +
        `${humanSize(lim.max_input_bytes)} per message (max_input_bytes).`
      );
    }
    if (transport === "ws" && lim.ws_max_frame_bytes) {
      const frame = { type: "run.create", thread_id: "0".repeat(36), request_id: "r000000", ...body };
      const frameBytes = byteLength(JSON.stringify(frame));
      if (frameBytes > lim.ws_max_frame_bytes) {
        return (
          `This message is ${humanSize(inputBytes)}; the server accepts at most ` +
          `${humanSize(lim.ws_max_frame_bytes)} per WebSocket frame (ws_max_frame_bytes).`
        );
      }
    }
    return null;
  }

  const HINT = "Enter to send · Shift+Enter for a new line";

  function checkComposer() {
    const problem = el.input.value ? sizeProblem(el.input.value) : null;
    S.oversize = problem;
    el.hint.textContent = problem || HINT;
    el.hint.classList.toggle("over", Boolean(problem));
    el.composer.classList.toggle("over", Boolean(problem));
    updateControls();
    // Grow with the text, up to the CSS max-height.
    el.input.style.height = "auto";
    el.input.style.height = `${Math.min(el.input.scrollHeight, 220)}px`;
  }

  // ---------------------------------------------------------------- transcript ----------
  //
  // Rendering is keyed: each message keeps its <li> while it is unchanged (a durable message
  // by object identity, a streaming one by its length), so a token batch re-renders only the
  // message it extends, and an expanded tool result stays expanded while the run streams.
  let renderQueued = false;
  const rendered = new Map(); // key -> {sig, li}

  function scheduleRender() {
    if (renderQueued) return;
    renderQueued = true;
    const flush = () => {
      if (renderQueued) render();
    };
    requestAnimationFrame(flush);
    setTimeout(flush, 60); // also when the tab is hidden (no animation frames)
  }

  // Markdown: a maintained parser (marked) and sanitizer (DOMPurify), vendored under
  // /ui/static/vendor/. Nothing the model writes reaches the DOM unsanitized; without the
  // libraries (a blocked file) the text is shown as plain text.
  const PURIFY = {
    FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "iframe"],
    FORBID_ATTR: ["style"],
    RETURN_DOM_FRAGMENT: true,
  };
  let mdReady = false;

  function setupMarkdown() {
    if (mdReady || !window.marked || !window.DOMPurify) return mdReady;
    window.DOMPurify.addHook("afterSanitizeAttributes", (n) => {
      if (n.tagName === "A" && n.getAttribute("href")) {
        n.setAttribute("target", "_blank");
        n.setAttribute("rel", "noopener noreferrer");
      }
    });
    mdReady = true;
    return mdReady;
  }

  function markdown(text) {
    const box = node("div", "body md");
    if (!text) return box;
    if (!setupMarkdown()) {
      box.append(node("p", "plain", text));
      return box;
    }
    const html = window.marked.parse(text, { gfm: true, breaks: false, async: false });
    box.append(window.DOMPurify.sanitize(html, PURIFY));
    for (const pre of box.querySelectorAll("pre")) {
      const code = pre.querySelector("code");
      const lang = code && /language-([\w+#.-]+)/.exec(code.className);
      const wrap = node("div", "code");
      const head = node("div", "code-head");
      head.append(node("span", "code-lang", lang ? lang[1] : "text"));
      const copy = node("button", "copy-code", "Copy");
      copy.type = "button";
      head.append(copy);
      pre.replaceWith(wrap);
      wrap.append(head, pre);
    }
    return box;
  }

  function prettyValue(v) {
    if (typeof v === "string") return v;
    try {
      return JSON.stringify(v, null, 2);
    } catch (_e) {
      return String(v);
    }
  }

  function humanSize(n) {
    if (!Number.isFinite(n)) return "";
    if (n < 1024) return `${n} bytes`;
    if (n < 1024 * 1024) return `${(n / 1024).toFixed(n < 10240 ? 1 : 0).replace(/\.0$/, "")} KB`;
    return `${(n / 1048576).toFixed(1).replace(/\.0$/, "")} MB`;
  }

  function toolHint(args) {
    const hint = args.filename || args.path || args.query || args.url || "";
    return typeof hint === "string" ? hint : "";
  }

  /** A tool call as a card: its name, a one-line hint, and its arguments one per row. */
  function toolCallCard(tc) {
    const args = tc.args && typeof tc.args === "object" ? tc.args : {};
    const card = node("div", "tool-card tool-call");
    const head = node("div", "tc-head");
    head.append(node("span", "tc-icon", "⚙"), node("span", "tc-name", tc.name || "tool"));
    const hint = toolHint(args);
    if (hint) head.append(node("span", "tc-summary", hint));
    card.append(head);
    const keys = Object.keys(args);
    if (keys.length) {
      const dl = node("dl", "tc-args");
      for (const k of keys) {
        const text = prettyValue(args[k]);
        const long = text.length > 160 || text.includes("\n");
        const dd = node("dd");
        if (long) {
          const det = node("details");
          det.append(node("summary", "muted", `${humanSize(new TextEncoder().encode(text).length)} · show`));
          det.append(node("pre", "long", text));
          dd.append(det);
        } else {
          dd.append(node("pre", "", text));
        }
        dl.append(node("dt", "", k), dd);
      }
      card.append(dl);
    }
    return card;
  }

  function artifactOf(m) {
    if (msgType(m) !== "tool" || m.status === "error") return null;
    try {
      const info = JSON.parse(textOf(m.content));
      if (info && typeof info.path === "string") return info;
    } catch (_e) {
      /* not an artifact result */
    }
    return null;
  }

  function artifactCard(path, size) {
    const card = node("div", "artifact-card");
    card.dataset.path = path;
    const ext = (/\.(\w{1,4})$/.exec(path) || [])[1] || "file";
    card.append(node("span", "a-icon", ext.toUpperCase()), node("span", "a-name", path));
    if (Number.isFinite(size)) card.append(node("span", "a-size", humanSize(size)));
    const actions = node("span", "a-actions");
    const open = node("button", "small-btn primary-soft open-artifact", "Open");
    open.type = "button";
    const dl = node("button", "small-btn ghost download-artifact", "Download");
    dl.type = "button";
    actions.append(open, dl);
    card.append(actions);
    return card;
  }

  /** A tool result: a card whose full result is collapsed; an artifact gets Open/Download. */
  function toolResultCard(m) {
    const text = textOf(m.content);
    const failed = m.status === "error";
    const card = node("div", `tool-card ${failed ? "tool-failed" : "tool-ok"}`);
    const det = node("details");
    const sum = node("summary");
    const art = artifactOf(m);
    let summary = failed ? "failed" : "returned";
    if (art) summary = `saved ${art.path}`;
    else if (text.length <= 80 && !text.includes("\n")) summary = `${summary}: ${text}`;
    sum.append(
      node("span", "tc-icon", failed ? "!" : "✓"),
      node("span", "tc-name", m.name || "tool"),
      node("span", "tc-summary", summary)
    );
    det.append(sum);
    let pretty = text;
    try {
      pretty = JSON.stringify(JSON.parse(text), null, 2);
    } catch (_e) {
      /* plain text */
    }
    const body = node("div", "tc-result");
    body.append(node("pre", "", pretty));
    det.append(body);
    card.append(det);
    if (art) card.append(artifactCard(art.path, art.size));
    return card;
  }

  function isStopped(m) {
    const rm = m.response_metadata || {};
    const ak = m.additional_kwargs || {};
    return Boolean(rm.stopped || ak.stopped || rm.status === "stopped" || ak.status === "stopped");
  }

  function messageNode(m, { live = false, optimistic = false } = {}) {
    const type = msgType(m);
    const text = live ? m.text : textOf(m.content);
    const li = node("li", `msg msg-${type}`);
    li._raw = text; // what the test hook compares with the durable state
    if (live) li.classList.add("live");
    if (optimistic) li.classList.add("optimistic");
    li.dataset.id = m.id || "";
    li.dataset.type = type;
    if (live) li.dataset.live = "1";
    const role = node("div", "role", type === "human" ? "You" : type === "ai" ? "Assistant" : `tool · ${m.name || "?"}`);
    li.append(role);
    if (type === "human") {
      li.append(node("div", "body", text));
    } else if (type === "ai") {
      li.append(markdown(text));
      if (!live && isStopped(m)) {
        li.classList.add("stopped");
        const badge = node("span", "badge", "stopped");
        badge.title = "You stopped this answer; it is kept as far as it was written.";
        role.append(badge);
      }
      const calls = (live ? m.toolCalls : m.tool_calls) || [];
      if (calls.length) {
        const box = node("div", "tool-calls");
        for (const tc of calls) box.append(toolCallCard(tc));
        li.append(box);
      }
    } else {
      if (m.status === "error") li.classList.add("tool-error");
      li.append(toolResultCard(m));
    }
    return li;
  }

  // ---------------------------------------------------------------- interrupts (H3) -----
  /** The thread's pending interrupts, from its state (so a reload or a second tab shows
   *  the same card): each task's `interrupts` [{id, value}]. */
  function pendingInterrupts(state) {
    const out = [];
    for (const t of (state && state.tasks) || []) {
      for (const i of t.interrupts || []) out.push(i);
    }
    return out;
  }

  /** Which answer an interrupt wants: LangChain's HumanInTheLoopMiddleware (`hitl`),
   *  agent-chat-ui's inbox HumanInterrupt list (`inbox`), or a plain question (`plain`). */
  function interruptKind(value) {
    if (value && typeof value === "object" && Array.isArray(value.action_requests)) return "hitl";
    const first = Array.isArray(value) ? value[0] : value;
    if (first && typeof first === "object" && first.action_request) return "inbox";
    return "plain";
  }

  /** The tool calls a review card edits: [{name, args, description, allowed}]. */
  function reviewActions(value, kind) {
    if (kind === "hitl") {
      const configs = value.review_configs || [];
      return value.action_requests.map((a, i) => {
        const cfg = configs.find((c) => c.action_name === a.name) || configs[i] || {};
        return {
          name: a.name,
          args: a.args || {},
          description: a.description || "",
          allowed: cfg.allowed_decisions || ["approve", "edit", "reject"],
        };
      });
    }
    const list = Array.isArray(value) ? value : [value];
    return list.map((h) => {
      const cfg = h.config || {};
      const allowed = [];
      if (cfg.allow_accept !== false) allowed.push("approve");
      if (cfg.allow_edit) allowed.push("edit");
      if (cfg.allow_respond || cfg.allow_ignore) allowed.push("reject");
      return { name: h.action_request.action, args: h.action_request.args || {}, description: h.description || "", allowed };
    });
  }

  /** The resume value of a decision, in the shape the interrupt's kind expects. */
  function resumeFor(kind, decision, actions, edited, message) {
    if (kind === "hitl") {
      return {
        decisions: actions.map((a, i) => {
          if (decision === "approve") return { type: "approve" };
          if (decision === "edit") return { type: "edit", edited_action: { name: a.name, args: edited[i] } };
          return { type: "reject", message: message || "Rejected by the user." };
        }),
      };
    }
    return actions.map((a, i) => {
      if (decision === "approve") return { type: "accept", args: null };
      if (decision === "edit") return { type: "edit", args: { action: a.name, args: edited[i] } };
      return message ? { type: "response", args: message } : { type: "ignore", args: null };
    });
  }

  let interruptCache = null; // {sig, li}: a re-render keeps what is typed in the card

  function interruptCard(intr) {
    const sig = `${intr.id}|${JSON.stringify(intr.value)}`;
    if (interruptCache && interruptCache.sig === sig) return interruptCache.li;
    const value = intr.value;
    const kind = interruptKind(value);
    const li = node("li", "notice interrupt-card");
    li.dataset.kind = "interrupt";
    li.dataset.interruptKind = kind;
    li.append(node("span", "n-icon", "?"));
    const box = node("div", "n-text");
    box.append(node("div", "n-title", "Waiting for you"));
    const row = node("div", "i-actions");
    const button = (label, cls, fn) => {
      const b = node("button", cls, label);
      b.type = "button";
      b.addEventListener("click", fn);
      row.append(b);
      return b;
    };
    if (kind === "plain") {
      const q = typeof value === "string" ? value : (value && (value.question || value.message)) || "";
      box.append(node("div", "i-question", q || "The assistant asks for an answer."));
      if (typeof value !== "string" && value !== null && value !== undefined) {
        box.append(node("pre", "i-value", JSON.stringify(value, null, 2)));
      }
      const answer = node("textarea", "i-answer");
      answer.rows = 2;
      answer.setAttribute("aria-label", "your answer");
      box.append(answer);
      button("Answer", "i-answer-btn", () => {
        const text = answer.value.trim();
        if (text) resumeWith(text, text);
      });
    } else {
      const actions = reviewActions(value, kind);
      const fields = [];
      actions.forEach((a) => {
        const fs = node("fieldset", "i-tool");
        fs.append(node("legend", "", `Run tool ${a.name}?`));
        if (a.description) fs.append(node("div", "i-question", a.description));
        const inputs = {};
        for (const [k, v] of Object.entries(a.args)) {
          const lab = node("label", "i-arg");
          lab.append(node("span", "", k));
          // A multi-line or long value (a file's content, a JSON object) gets a textarea:
          // an <input> drops newlines, so "Edit and run" would change what was not edited.
          const text = typeof v === "string" ? v : JSON.stringify(v, null, 2);
          const multi = text.includes("\n") || text.length > 80;
          const inp = node(multi ? "textarea" : "input");
          if (multi) inp.rows = Math.min(8, text.split("\n").length + 1);
          inp.name = k;
          inp.value = text;
          inp.dataset.json = typeof v === "string" ? "" : "1";
          lab.append(inp);
          fs.append(lab);
          inputs[k] = inp;
        }
        fields.push(inputs);
        box.append(fs);
      });
      const message = node("input", "i-reason");
      message.placeholder = "reason (sent with Reject)";
      message.setAttribute("aria-label", "reason for rejecting");
      box.append(message);
      const edited = () =>
        fields.map((inputs) => {
          const out = {};
          for (const [k, inp] of Object.entries(inputs)) {
            if (!inp.dataset.json) out[k] = inp.value;
            else {
              try {
                out[k] = JSON.parse(inp.value);
              } catch {
                out[k] = inp.value;
              }
            }
          }
          return out;
        });
      const allowed = new Set(actions.flatMap((a) => a.allowed));
      const decide = (d, label) => resumeWith(resumeFor(kind, d, actions, edited(), message.value.trim()), label);
      if (allowed.has("approve")) button("Approve", "i-approve", () => decide("approve", "Approved"));
      if (allowed.has("edit")) button("Edit and run", "i-edit", () => decide("edit", "Approved with edits"));
      if (allowed.has("reject")) button("Reject", "i-reject", () => decide("reject", "Rejected"));
    }
    box.append(row);
    li.append(box);
    interruptCache = { sig, li };
    return li;
  }

  /** Answer the pending interrupt: a run with `command: {resume}` and no input. */
  function resumeWith(resumeValue, label) {
    if (S.run && !S.run.ended && !S.run.abandoned) return;
    S.interrupts = [];
    interruptCache = null;
    send(label, { resume: true, resumeValue, assistantId: S.interruptAssistant || null });
  }

  function pendingKind() {
    const p = (S.interrupts || [])[0];
    return p ? interruptKind(p.value) : null;
  }

  // ------------------------------------------------------------ waiting on the model -----
  // The run's `model_wait` custom events (shared/agent/retrying.py, docs/chat.md): while the
  // model has not answered, one line under the transcript says how long the page has been
  // waiting (a live counter from the event's `waited_s`) and which attempt it is.
  let waitTimer = null;

  function applyModelWait(ev) {
    if (ev.state === "answering" || ev.state === "failed") {
      clearModelWait();
      return;
    }
    S.modelWait = { ...ev, at: Date.now() };
    T.modelWaits.push({ state: ev.state, attempt: ev.attempt, of: ev.of, cause: ev.cause });
    if (!waitTimer) waitTimer = setInterval(tickModelWait, 1000);
  }

  function clearModelWait() {
    S.modelWait = null;
    if (waitTimer) clearInterval(waitTimer);
    waitTimer = null;
    const line = document.getElementById("model-wait");
    if (line) line.remove();
  }

  function modelWaitText(w) {
    const secs = Math.max(0, Math.floor(Number(w.waited_s || 0) + (Date.now() - w.at) / 1000));
    const waiting = `waiting for the model (${secs} s)`;
    if (w.attempt > 1 || w.state === "retrying") {
      return `retrying (${w.attempt} of ${w.of}): ${w.cause || "the last attempt failed"} · ${waiting}`;
    }
    return waiting;
  }

  function modelWaitNode() {
    if (!S.modelWait || !S.run || S.run.ended) return null;
    let li = document.getElementById("model-wait");
    if (!li) {
      li = node("li", "model-wait");
      li.id = "model-wait";
      li.setAttribute("role", "status");
      li.append(node("span", "mw-dot"), node("span", "mw-text"));
    }
    const retrying = S.modelWait.attempt > 1 || S.modelWait.state === "retrying";
    li.dataset.state = retrying ? "retrying" : "waiting";
    li.querySelector(".mw-text").textContent = modelWaitText(S.modelWait);
    return li;
  }

  function tickModelWait() {
    if (!S.modelWait || !S.run || S.run.ended) {
      clearModelWait();
      return;
    }
    modelWaitNode();
  }

  function noticeNode(n) {
    const li = node("li", "notice");
    li.dataset.kind = n.kind || "error";
    li.append(node("span", "n-icon", "!"));
    const box = node("div", "n-text");
    box.append(node("div", "n-title", n.title));
    if (n.detail) box.append(node("div", "n-detail", n.detail));
    if (n.more && n.more !== n.detail) {
      const more = node("details", "n-more");
      more.append(node("summary", "", "Details"), node("div", "n-more-text", n.more));
      box.append(more);
    }
    li.append(box);
    if (n.retry) {
      const b = node("button", "n-retry", "Retry");
      b.type = "button";
      b.id = "retry";
      li.append(b);
    }
    return li;
  }

  function place(parent, nodes) {
    let i = 0;
    for (const n of nodes) {
      if (parent.children[i] !== n) parent.insertBefore(n, parent.children[i] || null);
      i += 1;
    }
    while (parent.children.length > nodes.length) parent.lastElementChild.remove();
  }

  function keep(key, sig, make) {
    const old = rendered.get(key);
    if (old && old.sig === sig) return old.li;
    const li = make();
    if (old) {
      // Keep what the reader expanded.
      const was = old.li.querySelectorAll("details");
      li.querySelectorAll("details").forEach((d, i) => {
        if (was[i] && was[i].open) d.open = true;
      });
    }
    rendered.set(key, { sig, li });
    return li;
  }

  // Pinned to the bottom: the reader is at the end of the conversation (or just opened it),
  // so whatever changes its height (a message, Markdown, the Files bar or a banner in the
  // dock shrinking the scroller) keeps the end of the last answer in view. Scrolling up
  // unpins; scrolling back to the end pins again.
  let pinned = true;
  const PIN_SLACK_PX = 120;

  function nearBottom() {
    const sc = el.scroller;
    return sc.scrollHeight - sc.scrollTop - sc.clientHeight < PIN_SLACK_PX;
  }

  function toBottom() {
    el.scroller.scrollTop = el.scroller.scrollHeight;
  }

  function watchPin() {
    el.scroller.addEventListener("scroll", () => {
      pinned = nearBottom();
    }, { passive: true });
    if (typeof ResizeObserver === "function") {
      const ro = new ResizeObserver(() => {
        if (pinned) toBottom();
      });
      ro.observe(el.scroller); // the dock grew (Files bar, banner): the scroller shrank
      ro.observe(el.transcript); // late height changes (fonts, code blocks, UI components)
      ro.observe(el.notices);
    }
  }

  function render() {
    renderQueued = false;
    const atBottom = pinned || nearBottom();
    const nodes = [];
    const keys = new Set();
    const known = new Set();
    const ui = uiPlacement();
    S.durable.forEach((m, i) => {
      if (m.id) known.add(m.id);
      if (!isShown(m)) return;
      const key = m.id ? `m:${m.id}` : `i:${i}`;
      keys.add(key);
      nodes.push(keep(key, m, () => messageNode(m, { optimistic: Boolean(m._optimistic) })));
      nodes.push(...ui.after(m.id));
    });
    if (S.optimistic) {
      const o = S.optimistic;
      keys.add("optimistic");
      nodes.push(keep("optimistic", o, () => messageNode(o, { optimistic: true })));
    }
    for (const [id, part] of S.live) {
      if (known.has(id)) continue;
      const key = `live:${id}`;
      keys.add(key);
      const sig = `${part.text.length}|${part.toolCalls.length}|${part.afterGap}`;
      nodes.push(
        keep(key, sig, () => {
          const shown = part.afterGap ? { ...part, text: part.text.trimStart() } : part;
          const li = messageNode({ id, type: "ai", ...shown }, { live: true });
          T.liveRenders += 1; // a streaming message re-rendered (Markdown and all)
          if (part.afterGap) li.classList.add("after-gap"); // its beginning was missed
          return li;
        })
      );
    }
    for (const c of S.cutoff) {
      if (known.has(c.id)) continue;
      const key = `cut:${c.id}`;
      keys.add(key);
      nodes.push(keep(key, `${c.text.length}|${c.toolCalls.length}`, () => cutoffNode(c)));
    }
    const waitLine = modelWaitNode();
    if (waitLine) nodes.push(waitLine);
    nodes.push(...ui.rest());
    ui.dropOthers();
    for (const k of rendered.keys()) if (!keys.has(k)) rendered.delete(k);
    place(el.transcript, nodes);
    const cards = S.notice ? [noticeNode(S.notice)] : [];
    const pending = S.run && !S.run.ended ? null : (S.interrupts || [])[0];
    if (pending) cards.push(interruptCard(pending));
    place(el.notices, cards);
    el.welcome.hidden = nodes.length > 0 || cards.length > 0;
    renderReadOnly();
    renderArtifacts();
    updateControls();
    // After the Files bar and the banner took their place in the dock: the true bottom.
    if (atBottom) {
      toBottom();
      pinned = true;
    }
  }

  /** A failed run's partial answer: kept as far as it was streamed, marked "cut off". */
  function cutoffNode(c) {
    const li = messageNode({ id: c.id, type: "ai", text: c.text, toolCalls: c.toolCalls }, { live: true });
    li.classList.remove("live");
    delete li.dataset.live;
    li.classList.add("cutoff");
    const badge = node("span", "badge", "cut off");
    badge.title = "The answer failed while it was being written; this is as far as it came.";
    li.querySelector(".role").append(badge);
    return li;
  }

  /** The banner of a chat whose graph is not served here: read-only. */
  function renderReadOnly() {
    const g = S.threadId ? S.readOnly : null;
    const sig = g || "";
    if (el.readOnly.dataset.sig === sig) return;
    el.readOnly.dataset.sig = sig;
    if (!g) {
      el.readOnly.hidden = true;
      el.readOnly.replaceChildren();
      return;
    }
    el.readOnly.replaceChildren(
      "This chat used the graph ",
      node("code", "", g),
      ", which this server does not serve. It is shown read-only."
    );
    el.readOnly.hidden = false;
  }

  function renderArtifacts() {
    const items = [];
    const seen = new Set();
    const add = (path) => {
      if (!path || seen.has(path)) return;
      seen.add(path);
      items.push(path);
    };
    for (const a of S.artifacts) add(typeof a === "string" ? a : a && (a.path || a.filename));
    for (const m of S.durable) {
      const art = artifactOf(m);
      if (art) add(art.path);
    }
    const sig = items.join("\n");
    if (el.artifactList.dataset.sig === sig) return;
    el.artifactList.dataset.sig = sig;
    el.artifactList.replaceChildren(
      ...items.map((p) => {
        const li = node("li");
        const b = node("button", "open-artifact", p.split("/").pop());
        b.type = "button";
        b.dataset.path = p;
        b.title = `open ${p}`;
        li.append(b);
        return li;
      })
    );
    el.artifacts.hidden = items.length === 0;
  }

  // --- artifacts: preview and download (GET /threads/{id}/artifacts/outputs/{name}) -----
  const TEXT_EXT = /\.(md|markdown|txt|json|csv|py|html|log|ya?ml|toml)$/i;

  async function fetchArtifact(threadId, path) {
    const name = path.split("/").pop();
    const resp = await fetch(`${BASE}/threads/${threadId}/artifacts/outputs/${encodeURIComponent(name)}`, {
      headers: authHeaders(),
    });
    if (!resp.ok) {
      let msg = `${resp.status} ${resp.statusText}`;
      try {
        msg = (await resp.json()).message || msg;
      } catch (_e) {
        /* keep the status */
      }
      throw new Error(msg);
    }
    return { name, blob: await resp.blob() };
  }

  async function openArtifact(path) {
    const threadId = S.threadId;
    S.preview = { path, loading: true };
    el.previewName.textContent = path;
    el.previewBody.replaceChildren(node("p", "muted", "Loading…"));
    el.preview.hidden = false;
    try {
      const { name, blob } = await fetchArtifact(threadId, path);
      if (!S.preview || S.preview.path !== path) return;
      S.preview = { path, name, blob };
      if (!TEXT_EXT.test(name) || blob.size > 2 * 1024 * 1024) {
        el.previewBody.replaceChildren(node("p", "muted", `${humanSize(blob.size)} · no preview for this kind of file; use Download.`));
        return;
      }
      let text = await blob.text();
      if (/\.(md|markdown)$/i.test(name)) {
        el.previewBody.replaceChildren(markdown(text));
      } else {
        if (/\.json$/i.test(name)) {
          try {
            text = JSON.stringify(JSON.parse(text), null, 2);
          } catch (_e) {
            /* show as is */
          }
        }
        el.previewBody.replaceChildren(node("pre", "plain", text));
      }
    } catch (e) {
      el.previewBody.replaceChildren(node("p", "banner", `Could not open ${path}: ${e.message}`));
    }
  }

  function saveBlob(name, blob) {
    const url = URL.createObjectURL(blob);
    const a = node("a");
    a.href = url;
    a.download = name;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  async function downloadArtifact(path) {
    try {
      if (S.preview && S.preview.path === path && S.preview.blob) {
        saveBlob(S.preview.name, S.preview.blob);
        return;
      }
      const { name, blob } = await fetchArtifact(S.threadId, path);
      saveBlob(name, blob);
    } catch (e) {
      showBanner(`Could not download ${path}: ${e.message}`);
    }
  }

  function closePreview() {
    S.preview = null;
    el.preview.hidden = true;
  }

  function setDurable(values) {
    if (!values || typeof values !== "object") return;
    if (Array.isArray(values.messages)) {
      S.durable = values.messages.slice();
      S.optimistic = null;
      for (const m of S.durable) if (m.id) S.live.delete(m.id);
    }
    if (Array.isArray(values.artifacts)) S.artifacts = values.artifacts.slice();
    if (Array.isArray(values.ui)) S.ui = values.ui.filter((u) => u && u.type === "ui");
  }

  function materializeOptimistic() {
    if (S.optimistic) {
      S.durable.push({ ...S.optimistic, _optimistic: true });
      S.optimistic = null;
    }
  }

  function upsertDurable(m) {
    if (!m || typeof m !== "object") return;
    if (m.type === "remove") {
      if (m.id === "__remove_all__") S.durable = [];
      else S.durable = S.durable.filter((x) => x.id !== m.id);
      return;
    }
    materializeOptimistic();
    const i = m.id ? S.durable.findIndex((x) => x.id === m.id) : -1;
    if (i >= 0) S.durable[i] = m;
    else S.durable.push(m);
    if (m.id) S.live.delete(m.id);
  }

  async function reloadState(threadId) {
    const state = await api("GET", `/threads/${threadId}/state`);
    if (S.threadId !== threadId) return;
    S.next = state && Array.isArray(state.next) ? state.next : [];
    S.interrupts = pendingInterrupts(state);
    S.durable = [];
    S.artifacts = [];
    S.ui = [];
    S.live.clear();
    S.optimistic = null;
    setDurable(state && state.values);
    render();
  }

  // ---------------------------------------------------------------- generative UI -------
  // The contract of @langchain/langgraph-sdk/react-ui: a bundle built for `ui.<graph>` is an
  // IIFE defining window.__LGUI_<graph>.render(component, shadowRootId), which takes React
  // from globalThis[Symbol.for("LGUI_REQUIRE")] and hands the component and the element to
  // draw into to window[Symbol.for("LGUI_EXT_STORE")].respond(shadowRootId, comp, el).
  const REACT_FILES = ["vendor/react.production.min.js", "vendor/react-dom.production.min.js"];
  const uiHosts = new Map(); // ui message id -> host {li, ns, name, props, sig, shadowId, root, comp}
  const uiByShadow = new Map(); // shadowRootId -> host
  const uiTags = new Map(); // `${graph}\n${name}` -> Promise of the tags (one POST per pair)
  const graphOf = new Map(); // assistant id -> graph id (loadAssistants)
  let reactReady = null;
  let shadowSeq = 0;

  /** ui_message_reducer of langgraph.graph.ui, for one live event. */
  function applyUiEvent(ev) {
    if (!ev || typeof ev !== "object" || !ev.id) return;
    if (ev.type === "remove-ui") {
      S.ui = S.ui.filter((u) => u.id !== ev.id);
    } else if (ev.type === "ui") {
      const i = S.ui.findIndex((u) => u.id === ev.id);
      if (i < 0) S.ui.push(ev);
      else if (ev.metadata && ev.metadata.merge) S.ui[i] = { ...ev, props: { ...S.ui[i].props, ...ev.props } };
      else S.ui[i] = ev;
    }
  }

  function uiNamespace() {
    const t = knownThread(S.threadId);
    const fromThread = t && t.metadata && t.metadata.graph_id;
    return fromThread || graphOf.get(el.assistant.value) || el.assistant.value || "";
  }

  /** Where each UI message goes: after the shown message it names, else at the end. */
  function uiPlacement() {
    const ns = uiNamespace();
    const shown = new Set(S.durable.filter(isShown).map((m) => m.id).filter(Boolean));
    const byMsg = new Map();
    const rest = [];
    const used = new Set();
    for (const u of S.ui) {
      const mid = u.metadata && u.metadata.message_id;
      if (mid && shown.has(mid)) byMsg.set(mid, [...(byMsg.get(mid) || []), u]);
      else rest.push(u);
    }
    const nodesOf = (list) =>
      list.map((u) => {
        used.add(u.id);
        return uiNode(u, ns);
      });
    return {
      after: (id) => (id && byMsg.has(id) ? nodesOf(byMsg.get(id)) : []),
      rest: () => nodesOf(rest),
      dropOthers() {
        for (const [id, h] of uiHosts) if (!used.has(id)) dropHost(id, h);
      },
    };
  }

  function dropHost(id, h) {
    uiHosts.delete(id);
    uiByShadow.delete(h.shadowId);
    if (h.root) setTimeout(() => h.root.unmount(), 0); // not inside a React render
  }

  function uiNode(u, ns) {
    const sig = JSON.stringify([u.name, u.props || {}]);
    const old = uiHosts.get(u.id);
    if (old && old.ns === ns && old.name === u.name) {
      if (old.sig !== sig) {
        Object.assign(old, { props: u.props || {}, sig });
        drawHost(old); // new props, same component instance (a `merge` update)
      }
      return old.li;
    }
    if (old) dropHost(u.id, old);
    const li = node("li", "genui");
    li.dataset.uiId = u.id;
    li.dataset.uiName = u.name;
    const holder = node("div", "genui-host");
    holder.id = `genui-${(shadowSeq += 1)}`;
    li.append(holder);
    const h = { li, ns, name: u.name, props: u.props || {}, sig, shadowId: holder.id, root: null, comp: null };
    uiHosts.set(u.id, h);
    uiByShadow.set(h.shadowId, h);
    loadComponent(h, holder);
    return li;
  }

  function loadScript(src) {
    return new Promise((resolve, reject) => {
      const s = document.createElement("script");
      s.src = src;
      s.onload = resolve;
      s.onerror = () => reject(new Error(`could not load ${src}`));
      document.head.append(s);
    });
  }

  /** React, ReactDOM and the react-ui globals the bundles expect (once per page). */
  function ensureReact() {
    reactReady =
      reactReady ||
      (async () => {
        for (const f of REACT_FILES) await loadScript(`${BASE}/ui/static/${f}`);
        const { React, ReactDOM } = window;
        const jsx = (type, props, key) => React.createElement(type, key === undefined ? props : { ...props, key });
        const runtime = { jsx, jsxs: jsx, jsxDEV: jsx, Fragment: React.Fragment };
        const reactUi = {
          useStreamContext() {
            throw new Error("useStreamContext is not available on threadrun's chat page");
          },
        };
        window[Symbol.for("LGUI_EXT_STORE")] = {
          respond(shadowId, comp, target) {
            const h = uiByShadow.get(shadowId);
            if (!h) return;
            h.comp = comp;
            h.root = ReactDOM.createRoot(target);
            drawHost(h);
          },
        };
        window[Symbol.for("LGUI_REQUIRE")] = (name) => {
          if (name === "react") return React;
          if (name === "react-dom" || name === "react-dom/client") return ReactDOM;
          if (name === "react/jsx-runtime" || name === "react/jsx-dev-runtime") return runtime;
          if (name === "@langchain/langgraph-sdk/react-ui") return reactUi;
          const extra = window[Symbol.for("LGUI_REQUIRE_EXTRA")];
          if (extra && typeof extra === "object" && name in extra) return extra[name];
          throw new Error(`Unknown module...: ${name}`);
        };
      })();
    return reactReady;
  }

  function drawHost(h) {
    if (!h.root) return;
    if (typeof h.comp !== "function" && !(h.comp && typeof h.comp === "object")) {
      uiNote(h, `The UI of ${h.ns} has no component “${h.name}”.`);
      return;
    }
    h.root.render(window.React.createElement(h.comp, h.props));
  }

  function uiNote(h, text) {
    h.li.classList.add("genui-error");
    const note = h.li.querySelector(".genui-note") || h.li.appendChild(node("div", "genui-note"));
    note.textContent = text;
  }

  function componentTags(ns, name) {
    const key = `${ns}\n${name}`;
    if (!uiTags.has(key)) {
      const p = (async () => {
        const resp = await fetch(`${BASE}/ui/${encodeURIComponent(ns)}`, {
          method: "POST",
          headers: { ...authHeaders(), Accept: "text/html", "Content-Type": "application/json" },
          body: JSON.stringify({ name }),
        });
        if (!resp.ok) throw new Error(resp.status === 404 ? `no UI for ${ns}` : `${resp.status} ${resp.statusText}`);
        return resp.text();
      })();
      p.catch(() => uiTags.delete(key)); // a later message tries again
      uiTags.set(key, p);
    }
    return uiTags.get(key);
  }

  async function loadComponent(h, holder) {
    try {
      await ensureReact();
      const html = await componentTags(h.ns, h.name);
      const shadow = holder.attachShadow({ mode: "open" });
      // Read as XML (the tags are well-formed): nothing runs and no HTML event handler is
      // compiled, which the page's CSP would refuse (and report) for the tags' inline
      // `onload`; the `load` listener below stands in for it.
      const doc = new DOMParser().parseFromString(`<tags>${html}</tags>`, "application/xml");
      if (doc.querySelector("parsererror")) throw new Error("the server's tags are not well-formed");
      for (const l of doc.querySelectorAll("link[rel=stylesheet][href]")) {
        const link = document.createElement("link");
        link.rel = "stylesheet";
        link.href = l.getAttribute("href");
        shadow.append(link);
      }
      const bundle = `__LGUI_${h.ns.replace(/[^a-zA-Z0-9]/g, "_")}`;
      for (const s of doc.querySelectorAll("script[src]")) {
        const script = document.createElement("script");
        script.src = s.getAttribute("src");
        script.addEventListener("load", () => {
          if (uiByShadow.get(h.shadowId) !== h || !document.getElementById(h.shadowId)) return;
          try {
            window[bundle].render(h.name, h.shadowId);
          } catch (e) {
            uiNote(h, `The component “${h.name}” failed: ${e.message}`);
          }
        });
        script.addEventListener("error", () => uiNote(h, `Could not load the UI of ${h.ns}.`));
        shadow.append(script);
      }
    } catch (e) {
      uiNote(h, `Could not load the component “${h.name}”: ${e.message}`);
    }
  }

  // ---------------------------------------------------------------- threads -------------
  async function loadThreads() {
    try {
      // By activity (the newest run), not `updated_at`: renaming a chat (a metadata PATCH)
      // must not move it to the top.
      S.threads = await api("POST", "/threads/search", {
        limit: 100,
        sort_by: "activity",
        sort_order: "desc",
      });
      showBanner("");
    } catch (e) {
      if (e.status !== 401) showBanner(`Could not list threads: ${e.message}`);
      S.threads = [];
    }
    renderThreads();
  }

  function firstLine(text) {
    const line = String(text || "").trim().split("\n")[0].trim();
    return line.length > 60 ? `${line.slice(0, 57).trimEnd()}…` : line;
  }

  /** metadata.title, else the first user message (threads made by the SDK or CLI too). */
  function threadTitle(t) {
    const title = t.metadata && t.metadata.title;
    if (typeof title === "string" && title.trim()) return title.trim();
    let msgs = t.values && Array.isArray(t.values.messages) ? t.values.messages : [];
    if (!msgs.length && t.thread_id === S.threadId) {
      msgs = S.optimistic ? [...S.durable, S.optimistic] : S.durable; // not saved yet
    }
    const first = msgs.find((m) => msgType(m) === "human" && isShown(m));
    const line = first ? firstLine(textOf(first.content)) : "";
    return line || "New chat";
  }

  function threadItem(t) {
    const ui = S.threadUi;
    const li = node("li");
    li.dataset.threadId = t.thread_id;
    li.tabIndex = 0;
    if (t.thread_id === S.threadId) li.classList.add("active");
    if (ui.renaming === t.thread_id) {
      const input = node("input", "t-rename");
      input.value = ui.draft;
      input.setAttribute("aria-label", "new title");
      input.maxLength = 200;
      li.append(input);
      return li;
    }
    li.append(node("span", "t-title", threadTitle(t)));
    const meta = node("span", "t-meta");
    if (t.status === "busy") meta.append(node("span", "t-busy", "answering…"));
    else if (t.interrupts && Object.keys(t.interrupts).length) meta.append(node("span", "t-waiting", "waiting for you"));
    else if (t.status === "interrupted") meta.append(node("span", "", "stopped"));
    else if (t.status && t.status !== "idle") meta.append(node("span", "", t.status));
    meta.append(node("span", "", ago(t.updated_at)));
    li.append(meta);
    const actions = node("span", "t-actions");
    meta.append(actions);
    const rename = node("button", "t-rename-btn", "Rename");
    rename.type = "button";
    rename.title = "rename";
    const del = node("button", "t-delete", "Delete");
    del.type = "button";
    del.title = "delete";
    actions.append(rename, del);
    if (ui.confirming === t.thread_id) {
      const box = node("div", "t-confirm");
      box.append(node("span", "", "Delete this chat?"));
      const yes = node("button", "t-confirm-yes", "Delete");
      yes.type = "button";
      const no = node("button", "t-confirm-no", "Cancel");
      no.type = "button";
      box.append(yes, no);
      li.append(box);
    }
    return li;
  }

  /** A listed thread: among the newest, or found by the server's title search. */
  function knownThread(threadId) {
    return (
      S.threads.find((x) => x.thread_id === threadId) ||
      S.found.threads.find((x) => x.thread_id === threadId) ||
      (S.opened && S.opened.thread_id === threadId ? S.opened : undefined)
    );
  }

  function searchText() {
    return el.search.value.trim().slice(0, SEARCH_MAX_CHARS);
  }

  /** The threads the search box shows: those of the newest 100 whose title (also one taken
   *  from the first message) contains the text, and those the server finds by
   *  `metadata.title` or a message's text (POST /threads/search `query`). */
  function matchingThreads(q) {
    const low = q.toLowerCase();
    const out = new Map();
    for (const t of S.threads) if (threadTitle(t).toLowerCase().includes(low)) out.set(t.thread_id, t);
    if (S.found.query === q) {
      for (const t of S.found.threads) if (!out.has(t.thread_id)) out.set(t.thread_id, t);
    }
    // Both lists come by activity; one not among the newest 100 is older than all of them.
    return [...out.values()];
  }

  let searchTimer = null;
  let searchSeq = 0;
  /** Ask the server for the threads whose title or messages contain the text (debounced). */
  function searchThreads() {
    clearTimeout(searchTimer);
    const q = searchText();
    if (!q) {
      S.found = { query: "", threads: [] };
      return;
    }
    searchTimer = setTimeout(async () => {
      const seq = (searchSeq += 1);
      try {
        const found = await api("POST", "/threads/search", {
          query: q,
          limit: 100,
          sort_by: "activity",
          sort_order: "desc",
        });
        if (seq !== searchSeq || searchText() !== q) return;
        S.found = { query: q, threads: found || [] };
        T.searches.push(q);
        renderThreads();
      } catch (e) {
        if (seq === searchSeq) showBanner(`Could not search the chats: ${e.message}`);
      }
    }, SEARCH_DEBOUNCE_MS);
  }

  function renderThreads() {
    const q = searchText();
    const visible = q ? matchingThreads(q) : S.threads;
    el.threadList.replaceChildren(...visible.map(threadItem));
    el.threadEmpty.textContent = q ? "No chat matches." : "No chats yet.";
    el.threadEmpty.hidden = visible.length > 0;
    const current = S.threadId ? knownThread(S.threadId) : null;
    el.title.textContent = current ? threadTitle(current) : "New chat";
    document.title = current ? `${threadTitle(current)} · threadrun` : "threadrun · chat";
    const input = el.threadList.querySelector("input.t-rename");
    if (input && document.activeElement !== input) {
      input.focus();
      input.setSelectionRange(input.value.length, input.value.length);
    }
  }

  function startRename(threadId) {
    const t = knownThread(threadId);
    if (!t) return;
    S.threadUi = { renaming: threadId, draft: threadTitle(t), confirming: null };
    renderThreads();
  }

  async function commitRename() {
    const { renaming, draft } = S.threadUi;
    S.threadUi = { renaming: null, draft: "", confirming: null };
    const t = knownThread(renaming);
    const title = draft.trim().slice(0, 200);
    if (!t || !title || title === threadTitle(t)) {
      renderThreads();
      return;
    }
    t.metadata = { ...(t.metadata || {}), title };
    renderThreads();
    try {
      await api("PATCH", `/threads/${renaming}`, { metadata: { title } });
    } catch (e) {
      showBanner(`Could not rename the chat: ${e.message}`);
      loadThreads();
    }
  }

  async function deleteThread(threadId) {
    S.threadUi = { renaming: null, draft: "", confirming: null };
    try {
      await api("DELETE", `/threads/${threadId}`);
    } catch (e) {
      if (e.status !== 404) {
        showBanner(`Could not delete the chat: ${e.message}`);
        renderThreads();
        return;
      }
    }
    S.threads = S.threads.filter((t) => t.thread_id !== threadId);
    S.found.threads = S.found.threads.filter((t) => t.thread_id !== threadId);
    if (S.threadId === threadId) clearThread();
    renderThreads();
  }

  /** No thread selected: the welcome screen and a composer that creates one on send. */
  function clearThread() {
    stopFollowing();
    S.threadId = null;
    S.durable = [];
    S.live.clear();
    S.optimistic = null;
    S.artifacts = [];
    S.ui = [];
    S.notice = null;
    S.next = [];
    S.interrupts = [];
    S.cutoff = [];
    S.readOnly = null;
    closePreview();
    history.replaceState(null, "", `${location.pathname}${location.search}`);
    setStatus("idle");
    renderThreads();
    render();
  }

  function newThread() {
    // A chat exists once its first message is sent (send() creates the thread), so an
    // abandoned "New chat" leaves no empty thread behind.
    clearThread();
    closeDrawer();
    el.input.focus();
  }

  function onThreadListClick(ev) {
    const li = ev.target.closest("li[data-thread-id]");
    if (!li) return;
    const tid = li.dataset.threadId;
    const b = ev.target.closest("button");
    if (b && b.classList.contains("t-rename-btn")) startRename(tid);
    else if (b && b.classList.contains("t-delete")) {
      S.threadUi = { renaming: null, draft: "", confirming: tid };
      renderThreads();
    } else if (b && b.classList.contains("t-confirm-yes")) deleteThread(tid);
    else if (b && b.classList.contains("t-confirm-no")) {
      S.threadUi.confirming = null;
      renderThreads();
    } else if (!ev.target.closest("input")) {
      closeDrawer();
      selectThread(tid);
    }
  }

  async function selectThread(threadId) {
    if (threadId === S.threadId && S.run && isCurrent(S.run)) return; // already following it
    if (S.run && S.run.threadId !== threadId) stopFollowing();
    S.opened = knownThread(threadId) || null;
    S.threadId = threadId;
    history.replaceState(null, "", `${location.pathname}${location.search}#thread=${threadId}`);
    S.durable = [];
    S.live.clear();
    S.optimistic = null;
    S.artifacts = [];
    S.ui = [];
    S.notice = null;
    S.next = [];
    S.interrupts = [];
    S.cutoff = [];
    S.readOnly = null;
    pinned = true; // a chat opens at its end
    closePreview();
    renderThreads();
    render();
    setStatus("idle");
    try {
      await reloadState(threadId);
      if (await openedReadOnly(threadId)) return;
      // A run still going on this thread (another tab, a page reload): follow it.
      const runs = await api("GET", `/threads/${threadId}/runs?limit=10`);
      const inflight = (runs || []).filter((r) => INFLIGHT.has(r.status));
      if (inflight.length && S.threadId === threadId && !S.run) {
        const r = inflight.find((x) => x.status === "running") || inflight[inflight.length - 1];
        S.run = newRun(r.run_id, threadId);
        join(null); // from the start of what is retained: rebuilds the partial message
      } else if (S.threadId === threadId && !S.run) {
        // The last run failed and nothing answered the last message: say so, with a retry.
        const last = (runs || []).slice().sort((a, b) => (a.created_at < b.created_at ? 1 : -1))[0];
        const shown = S.durable.filter(isShown);
        const tail = shown[shown.length - 1];
        if (last && last.status === "error" && tail && (msgType(tail) === "human" || S.next.length)) {
          // Replay the failed run's retained stream (its end comes at once): what it had
          // streamed before failing is shown again, cut off, above the same error card
          // (finish); with the stream gone, the card alone, from the run's stored error.
          const err = last.error && typeof last.error === "object" ? last.error : {};
          const r = newRun(last.run_id, threadId);
          r.text = lastUserText();
          r.assistantId = last.assistant_id;
          r.error = errorText(last.error) || null;
          r.errorShort = err.short || null;
          r.errorDetail = err.detail || null;
          S.run = r;
          join(null);
        }
      }
      if (S.threadId === threadId && !S.run && (S.interrupts || []).length) {
        // The resume continues the graph that paused: the latest run's assistant.
        const latest = (runs || []).slice().sort((a, b) => (a.created_at < b.created_at ? 1 : -1))[0];
        S.interruptAssistant = latest ? latest.assistant_id : null;
        setStatus("waiting", "The assistant is waiting for your answer in the card below.");
      }
    } catch (e) {
      if (S.threadId === threadId) setStatus("error", `Could not load the thread: ${e.message}`);
    }
  }

  /** A chat whose graph this server does not serve (its `graph_id` metadata names another):
   *  read-only, with a banner naming the graph, its messages from the thread object's
   *  `values` (the server's stored copy of its last state). */
  async function openedReadOnly(threadId) {
    const served = await servedGraphs;
    if (!served || S.threadId !== threadId) return false;
    let t = knownThread(threadId);
    if (!t || !t.metadata || !("graph_id" in t.metadata)) {
      t = await api("GET", `/threads/${threadId}`);
      if (S.threadId !== threadId) return false;
    }
    const g = t && t.metadata ? t.metadata.graph_id : null;
    if (typeof g !== "string" || served.has(g)) return false;
    S.readOnly = g;
    if (!S.durable.length && t.values) setDurable(t.values);
    S.interrupts = [];
    render();
    setStatus("idle");
    return true;
  }

  // ---------------------------------------------------------------- drawer (phones) -----
  function openDrawer() {
    document.body.classList.add("drawer-open");
    el.backdrop.hidden = false;
    el.menu.setAttribute("aria-expanded", "true");
  }

  function closeDrawer() {
    document.body.classList.remove("drawer-open");
    el.backdrop.hidden = true;
    el.menu.setAttribute("aria-expanded", "false");
  }

  // ---------------------------------------------------------------- runs ----------------
  function newRun(runId, threadId) {
    return {
      runId,
      threadId,
      lastEventId: null,
      gaps: 0, // consecutive gaps (reset by any event)
      incomplete: false, // a gap happened: the live view misses events until the final render
      ended: false,
      abandoned: false, // gave up after MAX_CONSECUTIVE_GAPS
      stopping: false,
      reconnectAttempt: 0,
      holdUntil: 0,
      attempt: 1,
      error: null,
      reconnectTimer: null,
      pollAt: 0,
    };
  }

  function isCurrent(run) {
    return S.run === run && !run.ended && !run.abandoned;
  }

  function errorText(err) {
    if (!err) return "";
    if (typeof err === "string") return err;
    if (typeof err === "object") {
      const parts = [err.error || err.type || err.code, err.message || err.detail].filter(Boolean);
      return parts.join(": ") || JSON.stringify(err);
    }
    return String(err);
  }

  /** A failed run's notice. Its Retry re-runs the thread from its checkpoint, with no new
   *  input (`resume`), when the failed message is the thread's last user message and the
   *  state still has a node to run (LangGraph re-runs the node that failed: the model call,
   *  or a tool after it); otherwise the message never reached the thread and Retry sends it
   *  again. Either way the thread holds it once. */
  function modelErrorNotice(detail, retryText, assistantId, more = null) {
    const saved = Boolean(retryText) && lastUserText() === retryText;
    return {
      kind: "model",
      title: "The assistant could not answer",
      detail: detail || "The run ended with an error.",
      more: more || null, // the whole story (provider, host, attempts), behind "Details"
      retry: retryText || null,
      resume: Boolean(retryText) && saved && S.next.length > 0,
      assistantId: assistantId || null, // the failed run's: a resume continues its graph
    };
  }

  function lastUserText() {
    for (let i = S.durable.length - 1; i >= 0; i -= 1) {
      if (msgType(S.durable[i]) === "human" && isShown(S.durable[i])) return textOf(S.durable[i].content);
    }
    return "";
  }

  /** Send `text` as the next message; with `resume`, start a run with no input instead (the
   *  thread's checkpoint continues; `text` is the message it answers, nothing is added). */
  async function send(text, { resume = false, assistantId = null, resumeValue = undefined } = {}) {
    if (S.run && !S.run.ended && !S.run.abandoned) return;
    if (S.threadId && S.readOnly) return; // no graph here to answer it
    const problem = resume ? null : sizeProblem(text);
    if (problem) {
      el.input.value = el.input.value || text;
      checkComposer();
      return;
    }
    S.notice = null;
    S.cutoff = [];
    S.optimistic = resume ? null : { id: "optimistic", type: "human", content: text };
    S.live.clear();
    showBanner("");
    render();
    if (!S.threadId) {
      // First message of a new chat: the thread is created now.
      try {
        const t = await api("POST", "/threads", { metadata: { source: "web-ui" } });
        S.threads.unshift(t);
        S.threadId = t.thread_id;
        history.replaceState(null, "", `${location.pathname}${location.search}#thread=${t.thread_id}`);
        renderThreads();
      } catch (e) {
        S.optimistic = null;
        el.input.value = el.input.value || text;
        S.notice = { kind: "send", title: "Message not sent", detail: `Could not create the chat: ${e.message}`, retry: text };
        render();
        checkComposer();
        return;
      }
    }
    const threadId = S.threadId;
    const firstMessage = !resume && !S.durable.some((m) => msgType(m) === "human");
    const body = requestBody(resume ? null : text, resume ? assistantId : null, resumeValue);
    S.run = newRun(null, threadId);
    S.run.text = text;
    S.run.assistantId = body.assistant_id;
    setStatus("streaming");
    try {
      if (transport === "ws") await wsCreate(S.run, body);
      else await sseCreate(S.run, body);
    } catch (e) {
      const run = S.run;
      if (!run || run.runId !== null) return;
      S.run = null;
      if (!e.code && S.threadId === threadId) {
        // The connection closed before run.created: the run may exist. Reload the thread,
        // which follows an inflight run if there is one.
        await selectThread(threadId);
        if (S.run) return;
      }
      S.optimistic = null;
      if (!resume) el.input.value = el.input.value || text;
      checkComposer();
      const refused = e.code === "limit_exceeded" || (e.status >= 400 && e.status < 500);
      S.notice = {
        kind: "send",
        title: refused ? "The server refused this message" : "Message not sent",
        detail: e.message,
        retry: refused && /bytes/.test(e.message) ? null : text,
        resume,
        assistantId: resume ? assistantId : null,
      };
      render();
      setStatus("idle");
      return;
    }
    if (firstMessage && S.run && S.run.runId) {
      // The chat is titled by its first message once the server accepted it.
      const title = firstLine(text);
      const t = S.threads.find((x) => x.thread_id === threadId);
      if (t && !(t.metadata && t.metadata.title)) t.metadata = { ...(t.metadata || {}), title };
      renderThreads();
      api("PATCH", `/threads/${threadId}`, { metadata: { title } })
        .then(loadThreads)
        .catch(() => {});
    }
  }

  function retry() {
    const n = S.notice;
    if (!n || !n.retry || (S.run && !S.run.ended && !S.run.abandoned)) return;
    if (el.input.value === n.retry) el.input.value = "";
    send(n.retry, { resume: Boolean(n.resume), assistantId: n.assistantId || null });
  }

  function stop() {
    const r = S.run;
    if (!r || !r.runId || r.ended || r.stopping) return;
    r.stopping = true;
    updateControls();
    const viaSocket = transport === "ws" && sock && sock.readyState === WebSocket.OPEN;
    if (viaSocket) {
      sockSend({ type: "run.cancel", thread_id: r.threadId, run_id: r.runId, action: "interrupt" });
    } else {
      api("POST", `/threads/${r.threadId}/runs/${r.runId}/cancel?action=interrupt`).catch((e) => {
        r.stopping = false;
        setStatus("error", `Could not stop the run: ${e.message}`);
      });
    }
  }

  function onEvent(run, id, event, data) {
    if (!isCurrent(run)) return;
    if (id) {
      if (run.lastEventId && compareIds(id, run.lastEventId) <= 0) {
        T.duplicates.push(id); // never applied twice (B4 says it never happens)
        return;
      }
      run.lastEventId = id;
      T.eventIds.push(id);
    }
    run.gaps = 0;
    const base = String(event).split("|")[0];
    if (base === "messages") {
      const [msg] = Array.isArray(data) ? data : [data];
      if (msg && msg.type === "AIMessageChunk") {
        const content = textOf(msg.content);
        if (S.modelWait && (content || (msg.tool_calls || []).length)) clearModelWait();
        T.chunks.push({ eventId: id, messageId: msg.id, content });
        if (!S.durable.some((m) => m.id === msg.id)) {
          const part = S.live.get(msg.id) || { text: "", toolCalls: [], afterGap: run.incomplete };
          part.text += content;
          for (const tc of msg.tool_calls || []) {
            if (tc.name && !part.toolCalls.some((x) => x.id === tc.id)) part.toolCalls.push(tc);
          }
          S.live.set(msg.id, part);
        }
      } else if (msg && msg.type && msg.type !== "AIMessageChunk") {
        upsertDurable(msg); // a whole message, e.g. a tool result
      }
    } else if (base === "values") {
      setDurable(data);
    } else if (base === "updates") {
      // {node: update} where an update may also be a list (several writes of one node).
      const updates = Object.values(data || {}).flatMap((u) => (Array.isArray(u) ? u : [u]));
      for (const update of updates) {
        const list = update && update.messages;
        if (Array.isArray(list)) list.forEach(upsertDurable);
        else if (list && typeof list === "object") upsertDurable(list);
        if (update && Array.isArray(update.artifacts)) {
          for (const a of update.artifacts) if (!S.artifacts.includes(a)) S.artifacts.push(a);
        }
      }
    } else if (base === "custom" && data && data.kind === "model_wait") {
      applyModelWait(data);
    } else if (base === "custom") {
      applyUiEvent(data);
    } else if (base === "metadata") {
      if (data && data.attempt) run.attempt = data.attempt;
    } else if (base === "error") {
      run.error = errorText(data) || "the run failed";
      run.errorShort = (data && typeof data === "object" && data.short) || null;
      run.errorDetail = (data && typeof data === "object" && data.detail) || null;
    }
    scheduleRender();
  }

  async function onEnd(run, id, status) {
    if (!isCurrent(run)) return;
    if (id) run.lastEventId = id;
    run.ended = true;
    closeSse(run);
    await finish(run, status);
  }

  /** The final render from durable state, then the terminal label. */
  async function finish(run, status) {
    run.ended = true;
    clearModelWait();
    // What streamed before a failure: the durable state has none of it (the node failed),
    // so it is kept here, marked "cut off", as a stopped answer is (that one the server saves).
    const streamed = [...S.live].filter(([, p]) => p.text.trim() || p.toolCalls.length);
    try {
      await reloadState(run.threadId);
    } catch (e) {
      if (S.run === run) setStatus("error", `The run ended (${status}) but its state did not load: ${e.message}`);
      return;
    }
    if (S.run !== run) return;
    S.run = null;
    if ((S.interrupts || []).length) S.interruptAssistant = run.assistantId || null;
    if ((S.interrupts || []).length) setStatus("waiting", "The assistant is waiting for your answer in the card below.");
    else if (status === "success") setStatus("done");
    else if (status === "interrupted") {
      setStatus("cancelled", "The run was stopped. The transcript shows what it had saved before that.");
    }
    else {
      // A model or tool failure: in the transcript, with a retry of the last user input.
      const saved = new Set(S.durable.map((m) => m.id));
      S.cutoff = streamed
        .filter(([id]) => !saved.has(id))
        .map(([id, p]) => ({ id, text: p.text, toolCalls: p.toolCalls.slice() }));
      setStatus("idle"); // the status pill is about the page's connection; this is not
      S.notice = modelErrorNotice(
        run.errorShort || run.error || `The run ended with status ${status}.`,
        run.text || lastUserText(),
        run.assistantId,
        run.errorDetail
      );
      render();
    }
    loadThreads();
  }

  async function onGap(run, gap) {
    if (!isCurrent(run)) return;
    run.gaps += 1;
    run.incomplete = true;
    T.gaps += 1;
    closeSse(run);
    // B9: drop transient UI state, reload durable state, re-render, then rejoin.
    S.live.clear();
    S.optimistic = null;
    try {
      await reloadState(run.threadId);
    } catch (e) {
      setStatus("error", `Events were missed and the state did not reload: ${e.message}`);
      return;
    }
    if (!isCurrent(run)) return;
    setStatus("incomplete", INCOMPLETE_DETAIL);
    if (run.gaps >= MAX_CONSECUTIVE_GAPS) {
      abandon(run);
      return;
    }
    if (!gap.latest_available_event_id) {
      // Nothing retained: the stream expired (the run ended long ago) or is not there yet.
      let info = null;
      try {
        info = await api("GET", `/threads/${run.threadId}/runs/${run.runId}`);
      } catch (_e) {
        info = null;
      }
      if (!isCurrent(run)) return;
      if (info && TERMINAL.has(info.status)) {
        await finish(run, info.status);
        return;
      }
    }
    run.lastEventId = gap.latest_available_event_id || null;
    updateControls();
    if (T.holdRejoinMs) await sleep(T.holdRejoinMs);
    if (isCurrent(run)) join(run.lastEventId);
  }

  function abandon(run) {
    run.abandoned = true;
    closeSse(run);
    setStatus(
      "error",
      `The live view lost events ${MAX_CONSECUTIVE_GAPS} times in a row (stream_replay_gap). ` +
        "The run keeps going on the server; the transcript reloads when it ends."
    );
    // Wait for the end without the live stream, then show the durable result.
    fetch(`${BASE}/threads/${run.threadId}/runs/${run.runId}/join`, { headers: authHeaders() })
      .then((r) => r.text())
      .then(() => api("GET", `/threads/${run.threadId}/runs/${run.runId}`))
      .then(async (info) => {
        if (S.run !== run || S.threadId !== run.threadId) return;
        await reloadState(run.threadId);
        S.run = null;
        setStatus(
          "error",
          `The live view was lost (${MAX_CONSECUTIVE_GAPS} consecutive gaps); the run ended with status ` +
            `${info.status} and the transcript was reloaded from the saved state.`
        );
        loadThreads();
      })
      .catch(() => {});
  }

  function stopFollowing() {
    const r = S.run;
    S.run = null;
    if (r) {
      r.ended = true;
      closeSse(r);
    }
    if (sock) closeSocket(true); // a socket cannot leave a run: close it, open another later
  }

  function join(cursor) {
    const run = S.run;
    if (!run || !isCurrent(run)) return;
    T.joins += 1;
    setStatus(run.incomplete ? "incomplete" : "streaming", run.incomplete ? INCOMPLETE_DETAIL : "");
    if (transport === "ws") wsJoin(run, cursor);
    else sseFollow(run, cursor);
  }

  function scheduleReconnect(run) {
    if (!isCurrent(run) || run.reconnectTimer) return;
    setStatus("reconnecting", "The connection dropped; resuming from the last event received.");
    run.reconnectAttempt += 1;
    const backoff = Math.min(BACKOFF_MAX_MS, BACKOFF_BASE_MS * 2 ** (run.reconnectAttempt - 1));
    const delay = Math.max(backoff + Math.random() * 100, run.holdUntil - Date.now());
    run.reconnectTimer = setTimeout(() => {
      run.reconnectTimer = null;
      if (!isCurrent(run)) return;
      if (transport === "ws") {
        openSocket()
          .then(() => join(run.lastEventId))
          .catch(() => scheduleReconnect(run));
      } else {
        join(run.lastEventId);
      }
    }, delay);
  }

  /** While following: the server should heartbeat; if it is silent for long, poll the run. */
  function pollIfQuiet(run) {
    if (!isCurrent(run) || !run.runId || Date.now() < run.pollAt) return;
    run.pollAt = Date.now() + 15000;
    api("GET", `/threads/${run.threadId}/runs/${run.runId}`)
      .then((info) => {
        if (isCurrent(run) && TERMINAL.has(info.status) && Date.now() - lastEventAt > 10000) {
          finish(run, info.status);
        }
      })
      .catch(() => {});
  }

  // ---------------------------------------------------------------- WebSocket -----------
  let sock = null;
  let sockOpening = null;
  let everOpened = false;
  let openFailures = 0;
  let lastFrameAt = 0;
  let lastEventAt = 0;
  let requestSeq = 0;
  const pending = new Map(); // request_id -> {resolve, reject, run, kind, cursor}

  function wsUrl() {
    const proto = location.protocol === "https:" ? "wss" : "ws";
    const q = apiKey ? `?api_key=${encodeURIComponent(apiKey)}` : "";
    return `${proto}://${location.host}${BASE}/ws${q}`;
  }

  function openSocket() {
    if (sock && sock.readyState === WebSocket.OPEN) return Promise.resolve(sock);
    if (sockOpening) return sockOpening;
    sockOpening = new Promise((resolve, reject) => {
      let opened = false;
      const s = new WebSocket(wsUrl());
      s._intentional = false;
      s.onopen = () => {
        opened = true;
        everOpened = true;
        openFailures = 0;
        sock = s;
        sockOpening = null;
        lastFrameAt = Date.now();
        T.opens += 1;
        resolve(s);
      };
      s.onmessage = (ev) => {
        lastFrameAt = Date.now();
        let frame;
        try {
          frame = JSON.parse(ev.data);
        } catch (_e) {
          return;
        }
        if (frame.type === "error" && frame.limit === "ws_max_frame_bytes") {
          s._closeError = frame.message; // the close that follows is this one
          return;
        }
        onFrame(frame);
      };
      s.onclose = (ev) => {
        if (ev && ev.code === 1009 && !s._closeError) {
          s._closeError = `the message is larger than the server accepts (${ev.reason || "close 1009"})`;
        }
        if (!opened) {
          sockOpening = null;
          openFailures += 1;
          if (!everOpened && openFailures >= 2) {
            transport = "sse"; // the socket never opened on this page: fall back to SSE
            updateControls();
          }
          reject(new Error("the WebSocket did not open"));
          return;
        }
        if (sock === s) sock = null;
        rejectPending(s);
        const run = S.run;
        if (!s._intentional && run && isCurrent(run) && run.runId) scheduleReconnect(run);
      };
    });
    return sockOpening;
  }

  function rejectPending(s) {
    // A socket the server closed for a frame above ws_max_frame_bytes said why (an `error`
    // frame, then close 1009): the pending request fails with that reason, not a bare
    // "the connection closed".
    const why = s && s._closeError;
    for (const [rid, p] of pending) {
      if (p.sock === s) {
        pending.delete(rid);
        p.reject(why ? new ApiError(0, "limit_exceeded", why) : new Error("the connection closed"));
      }
    }
  }

  function closeSocket(intentional) {
    const s = sock;
    sock = null;
    if (!s) return;
    s._intentional = true; // its onclose does nothing more: we handle what follows here
    try {
      s.close(intentional ? 1000 : 4000, intentional ? "leaving" : "dropped");
    } catch (_e) {
      /* already closed */
    }
    rejectPending(s);
  }

  /** The live connection is dead (or the test says so): reconnect without waiting for onclose. */
  function dropConnection() {
    const run = S.run;
    closeSocket(false);
    if (run && isCurrent(run) && run.runId) scheduleReconnect(run);
  }

  function sockSend(frame) {
    if (!sock || sock.readyState !== WebSocket.OPEN) return false;
    sock.send(JSON.stringify(frame));
    return true;
  }

  function request(frame, meta) {
    const request_id = `r${++requestSeq}`;
    return new Promise((resolve, reject) => {
      pending.set(request_id, { resolve, reject, sock, ...meta });
      if (!sockSend({ ...frame, request_id })) {
        pending.delete(request_id);
        reject(new Error("the connection is not open"));
      }
    });
  }

  async function wsCreate(run, body) {
    try {
      await openSocket();
    } catch (_e) {
      try {
        await openSocket(); // one more try before falling back
      } catch (e) {
        if (transport === "sse") return sseCreate(run, body);
        throw e;
      }
    }
    const created = await request(
      { type: "run.create", thread_id: run.threadId, ...body },
      { kind: "create", run }
    );
    if (S.run !== run) return;
    run.runId = created.run.run_id;
    lastEventAt = Date.now();
    updateControls();
    loadThreads(); // the thread is busy now
  }

  function wsJoin(run, cursor, retry = 0) {
    if (!isCurrent(run)) return;
    const frame = { type: "run.join", thread_id: run.threadId, run_id: run.runId, last_event_id: cursor };
    if (!sock || sock.readyState !== WebSocket.OPEN) {
      openSocket()
        .then(() => wsJoin(run, cursor, retry))
        .catch(() => scheduleReconnect(run));
      return;
    }
    request(frame, { kind: "join", run }).catch((e) => {
      if (!isCurrent(run)) return;
      if (e.code === "already_subscribed" && retry < 20) {
        // The previous subscription (ended by a gap) is still winding down on the server.
        setTimeout(() => wsJoin(run, run.lastEventId, retry + 1), 100);
      } else if (e.code) {
        setStatus("error", `Could not follow the run: ${e.message}`);
      } /* else: the socket closed; onclose reconnects */
    });
    // run.join has no acknowledgement: the first frame of the run settles it (settleJoin).
  }

  function settleJoin(run) {
    for (const [rid, p] of pending) {
      if (p.kind === "join" && p.run === run) {
        pending.delete(rid);
        p.resolve();
      }
    }
  }

  function onFrame(f) {
    const run = S.run;
    switch (f.type) {
      case "run.created": {
        const p = pending.get(f.request_id);
        if (p) {
          pending.delete(f.request_id);
          p.resolve(f);
        }
        return;
      }
      case "event":
      case "gap":
      case "end":
      case "heartbeat": {
        if (!run || f.run_id !== run.runId) return;
        settleJoin(run);
        if (run.reconnectAttempt && f.type !== "heartbeat") run.reconnectAttempt = 0;
        if (f.type === "event") {
          lastEventAt = Date.now();
          onEvent(run, f.id, f.event, f.data);
        } else if (f.type === "gap") {
          onGap(run, f);
        } else if (f.type === "end") {
          onEnd(run, f.id, f.status);
        } else if (Date.now() - lastEventAt > 15000) {
          pollIfQuiet(run);
        }
        return;
      }
      case "error": {
        const p = f.request_id != null ? pending.get(f.request_id) : null;
        const err = new ApiError(0, f.code, f.message);
        if (p) {
          pending.delete(f.request_id);
          p.reject(err);
        } else if (run && f.run_id && f.run_id === run.runId && isCurrent(run)) {
          setStatus("error", `${f.code}: ${f.message}`);
        }
        return;
      }
      case "run.cancel.accepted":
      case "pong":
      default:
        return;
    }
  }

  setInterval(() => {
    const run = S.run;
    if (transport !== "ws" || !run || !isCurrent(run) || !run.runId) return;
    if (sock && sock.readyState === WebSocket.OPEN && Date.now() - lastFrameAt > SILENT_SOCKET_MS) {
      dropConnection(); // silent for three heartbeat intervals: treat it as dropped
    }
  }, 1000);

  // ---------------------------------------------------------------- SSE fallback --------
  async function sseCreate(run, body) {
    const created = await api("POST", `/threads/${run.threadId}/runs`, body);
    if (S.run !== run) return;
    run.runId = created.run_id;
    updateControls();
    loadThreads(); // the thread is busy now
    sseFollow(run, null);
  }

  function closeSse(run) {
    if (run && run.sse) {
      run.sse._intentional = true;
      run.sse.abort();
      run.sse = null;
    }
  }

  async function sseFollow(run, cursor) {
    if (!isCurrent(run)) return;
    closeSse(run);
    const ctl = new AbortController();
    run.sse = ctl;
    let finished = false;
    try {
      const resp = await fetch(`${BASE}/threads/${run.threadId}/runs/${run.runId}/stream`, {
        headers: { ...authHeaders(), accept: "text/event-stream", "Last-Event-ID": cursor || "-1" },
        signal: ctl.signal,
      });
      if (!resp.ok) {
        const text = await resp.text();
        let msg = `${resp.status}`;
        try {
          msg = JSON.parse(text).message || msg;
        } catch (_e) {
          /* keep the status */
        }
        if (resp.status >= 400 && resp.status < 500) {
          setStatus("error", `Could not follow the run: ${msg}`);
          return;
        }
        throw new Error(msg);
      }
      T.opens += 1;
      lastFrameAt = Date.now();
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      let ev = { id: null, event: "message", data: [] };
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl).replace(/\r$/, "");
          buf = buf.slice(nl + 1);
          if (line === "") {
            if (ev.data.length) {
              const data = JSON.parse(ev.data.join("\n"));
              run.reconnectAttempt = 0;
              if (ev.event === "end") {
                finished = true;
                await onEnd(run, ev.id, data && data.status);
                return;
              }
              if (ev.event === "gap") {
                finished = true;
                onGap(run, data);
                return;
              }
              lastEventAt = Date.now();
              onEvent(run, ev.id, ev.event, data);
            }
            ev = { id: null, event: "message", data: [] };
          } else if (line.startsWith(":")) {
            lastFrameAt = Date.now(); // heartbeat comment
          } else {
            const i = line.indexOf(":");
            const field = i < 0 ? line : line.slice(0, i);
            const val = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
            if (field === "id") ev.id = val;
            else if (field === "event") ev.event = val;
            else if (field === "data") ev.data.push(val);
          }
        }
      }
    } catch (e) {
      if (ctl._intentional) return;
    } finally {
      if (run.sse === ctl) run.sse = null;
    }
    if (!finished && !ctl._intentional && isCurrent(run)) scheduleReconnect(run);
  }

  // ---------------------------------------------------------------- test hook -----------
  function transcript() {
    if (renderQueued) render();
    return Array.from(el.transcript.querySelectorAll("li.msg")).map((li) => ({
      id: li.dataset.id,
      type: li.dataset.type,
      content: li._raw,
      live: li.dataset.live === "1",
      toolCalls: Array.from(li.querySelectorAll(".tool-call .tc-name")).map((x) => x.textContent),
    }));
  }

  window.threadrunTest = {
    /** Drop the live connection as a network failure would; `holdMs` delays the reconnect. */
    dropSocket({ holdMs = 0 } = {}) {
      const run = S.run;
      if (run) run.holdUntil = Date.now() + holdMs;
      if (transport === "ws") {
        if (!sock) return false;
        dropConnection();
        return true;
      }
      if (run && run.sse) {
        run.sse.abort(); // not intentional: sseFollow schedules the reconnect
        return true;
      }
      return false;
    },
    /** Wait this long before every rejoin after a gap (to provoke consecutive gaps). */
    holdRejoins(ms) {
      T.holdRejoinMs = ms;
    },
    /** The first thread list has loaded and the initial thread (if any) is selected. */
    ready: () => booted,
    lastEventId: () => (S.run ? S.run.lastEventId : null),
    runId: () => (S.run ? S.run.runId : null),
    threadId: () => S.threadId,
    following: () => Boolean(S.run && isCurrent(S.run)),
    transport: () => transport,
    status: () => ({ state: S.status, label: el.status.textContent, detail: S.detail }),
    transcript,
    /** The error shown in the transcript, if any. */
    notice: () => (S.notice ? { ...S.notice } : null),
    modelWait: () => {
      const line = document.getElementById("model-wait");
      return line ? line.textContent : null;
    },
    modelWaits: () => T.modelWaits.slice(),
    searches: () => T.searches.slice(),
    /** The graph of the open read-only chat (not served here), else null. */
    readOnly: () => (S.threadId ? S.readOnly : null),
    /** How far the conversation is from its true bottom, in pixels. */
    fromBottom: () => el.scroller.scrollHeight - el.scroller.scrollTop - el.scroller.clientHeight,
    /** Replace the model knobs sent as config.configurable (e.g. to make a retry succeed). */
    setConfigurable(obj) {
      for (const k of Object.keys(configurable)) delete configurable[k];
      Object.assign(configurable, obj || {});
    },
    /** Send even above the server's limits (to see how the server refuses it). */
    skipSizeCheck(on) {
      T.skipSizeCheck = Boolean(on);
    },
    limits: () => S.limits,
    /** The generative UI shown: id, component and its rendered text, per UI message. */
    genui: () =>
      Array.from(el.transcript.querySelectorAll("li.genui")).map((li) => {
        const root = li.querySelector(".genui-host").shadowRoot;
        const note = li.querySelector(".genui-note");
        return {
          id: li.dataset.uiId,
          name: li.dataset.uiName,
          text: root ? root.textContent : "",
          error: note ? note.textContent : null,
        };
      }),
    /** Raw concatenation of the AIMessageChunk contents applied, per message id. */
    streamed() {
      const out = {};
      for (const c of T.chunks) out[c.messageId] = (out[c.messageId] || "") + c.content;
      return out;
    },
    stats: () => ({
      eventIds: T.eventIds.slice(),
      duplicates: T.duplicates.slice(),
      statuses: T.statuses.slice(),
      joins: T.joins,
      opens: T.opens,
      gaps: T.gaps,
      chunks: T.chunks.length,
      liveRenders: T.liveRenders,
    }),
  };

  // ---------------------------------------------------------------- boot ----------------
  let servedGraphs = Promise.resolve(null); // resolves to the Set of served graph ids, or null

  async function loadAssistants() {
    try {
      const items = await api("POST", "/assistants/search", { limit: 100 });
      if (!items || !items.length) return null;
      const graphs = new Set(items.map((a) => a.graph_id));
      S.servedGraphs = graphs;
      const current = el.assistant.value;
      // Each option is one assistant (a graph's system one, or one of the user's, run
      // with its own config); the current choice may still be a graph name.
      el.assistant.replaceChildren(
        ...items.map((a) => {
          const o = node("option", "", a.name || a.graph_id);
          o.value = a.assistant_id;
          graphOf.set(a.assistant_id, a.graph_id);
          return o;
        })
      );
      const chosen = items.find(
        (a) =>
          a.assistant_id === current ||
          (a.graph_id === current && a.metadata && a.metadata.created_by === "system")
      );
      if (chosen) el.assistant.value = chosen.assistant_id;
      return graphs;
    } catch (_e) {
      return null; /* keep the default; no chat is taken for read-only */
    }
  }

  let booted = false;

  function boot() {
    Object.assign(el, {
      status: $("run-status"),
      detail: $("status-detail"),
      banner: $("banner"),
      transcript: $("transcript"),
      artifacts: $("artifacts"),
      artifactList: $("artifact-list"),
      threadList: $("thread-list"),
      threadEmpty: $("thread-empty"),
      title: $("thread-title"),
      input: $("input"),
      send: $("send"),
      stop: $("stop"),
      assistant: $("assistant"),
      footer: $("footer"),
      apiKey: $("api-key"),
      scroller: $("scroller"),
      welcome: $("welcome"),
      notices: $("notices"),
      hint: $("composer-hint"),
      composer: $("composer"),
      search: $("thread-search"),
      menu: $("menu"),
      backdrop: $("backdrop"),
      preview: $("preview"),
      previewName: $("preview-name"),
      previewBody: $("preview-body"),
      readOnly: $("readonly"),
    });
    el.apiKey.value = apiKey;
    $("key-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      apiKey = el.apiKey.value.trim();
      localStorage.setItem(KEY_STORE, apiKey);
      showBanner("");
      closeSocket(true);
      servedGraphs = loadAssistants();
      loadThreads();
    });
    $("new-thread").addEventListener("click", newThread);
    $("composer").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const text = el.input.value.trim();
      if (!text) return;
      if (sizeProblem(text)) {
        checkComposer(); // refused before sending, naming the limit
        return;
      }
      if (el.send.disabled) return;
      const pk = pendingKind();
      if (pk && pk !== "plain") {
        S.notice = { kind: "hint", title: "A tool call waits for your review", detail: "Use Approve, Edit or Reject on the card below; the message stays in the box." };
        render();
        return;
      }
      el.input.value = "";
      checkComposer();
      if (pk === "plain") resumeWith(text, text);
      else send(text);
    });
    let checkQueued = false;
    el.input.addEventListener("input", () => {
      if (checkQueued) return;
      checkQueued = true;
      requestAnimationFrame(() => {
        checkQueued = false;
        checkComposer();
      });
    });
    el.footer.hidden = !debug;
    el.search.addEventListener("input", () => {
      renderThreads();
      searchThreads();
    });
    el.threadList.addEventListener("click", onThreadListClick);
    el.threadList.addEventListener("keydown", (ev) => {
      const input = ev.target.closest("input.t-rename");
      if (input) {
        if (ev.key === "Enter") {
          ev.preventDefault();
          commitRename();
        } else if (ev.key === "Escape") {
          S.threadUi = { renaming: null, draft: "", confirming: null };
          renderThreads();
        }
        return;
      }
      const li = ev.target.closest("li[data-thread-id]");
      if (li && ev.target === li && ev.key === "Enter") selectThread(li.dataset.threadId);
    });
    el.threadList.addEventListener("input", (ev) => {
      if (ev.target.matches("input.t-rename")) S.threadUi.draft = ev.target.value;
    });
    el.threadList.addEventListener("focusout", (ev) => {
      if (ev.target.matches("input.t-rename") && S.threadUi.renaming) commitRename();
    });
    el.menu.addEventListener("click", () =>
      document.body.classList.contains("drawer-open") ? closeDrawer() : openDrawer()
    );
    el.backdrop.addEventListener("click", closeDrawer);
    $("close-drawer").addEventListener("click", closeDrawer);
    document.addEventListener("keydown", (ev) => {
      if (ev.key !== "Escape") return;
      if (!el.preview.hidden) closePreview();
      else closeDrawer();
    });
    // Delegated clicks in the conversation: Retry, code Copy, artifact Open/Download.
    const onConversationClick = (ev) => {
      const b = ev.target.closest("button");
      if (!b) return;
      if (b.id === "retry") {
        retry();
      } else if (b.classList.contains("copy-code")) {
        const code = b.closest(".code").querySelector("pre").textContent;
        if (navigator.clipboard) {
          navigator.clipboard.writeText(code).then(() => {
            b.textContent = "Copied";
            setTimeout(() => (b.textContent = "Copy"), 1500);
          }, () => {});
        }
      } else {
        const holder = b.closest("[data-path]");
        const path = b.dataset.path || (holder && holder.dataset.path);
        if (!path) return;
        if (b.classList.contains("open-artifact")) openArtifact(path);
        else if (b.classList.contains("download-artifact")) downloadArtifact(path);
      }
    };
    el.scroller.addEventListener("click", onConversationClick);
    el.artifacts.addEventListener("click", onConversationClick);
    $("preview-close").addEventListener("click", closePreview);
    $("preview-download").addEventListener("click", () => S.preview && downloadArtifact(S.preview.path));

    el.input.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
        ev.preventDefault();
        $("composer").requestSubmit();
      }
    });
    el.stop.addEventListener("click", stop);
    window.addEventListener("online", () => {
      // Back online: do not sit out the rest of a long back-off.
      const run = S.run;
      if (run && isCurrent(run) && run.reconnectTimer) {
        clearTimeout(run.reconnectTimer);
        run.reconnectTimer = null;
        run.reconnectAttempt = 0;
        run.holdUntil = 0;
        scheduleReconnect(run);
      }
    });
    watchPin();
    setStatus("idle");
    render();
    servedGraphs = loadAssistants();
    api("GET", "/info")
      .then((info) => {
        S.limits = (info && info.limits) || null;
        checkComposer();
      })
      .catch(() => {});
    loadThreads()
      .then(() => {
        if (S.threadId) return null; // the user already picked or created one
        // A reload keeps the chat it had open (`#thread=`); otherwise the page opens a
        // new chat: the first message must not land in the newest old thread.
        const m = /thread=([0-9a-f-]{36})/i.exec(location.hash);
        if (m) return selectThread(m[1]);
        return null;
      })
      .finally(() => {
        booted = true;
      });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
  else boot();
})();
