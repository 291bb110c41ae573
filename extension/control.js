// The control center: every site's live sessions (Cancel, End, End all for
// a site) and its recently ended ones, a live event monitor of one session
// (or the history of an ended one), the requests only the user may answer,
// every site's consent (folder grants, typed or browsed, may approve
// commands, which agents it may use, its live-session limit, revoke), the
// agents Core detects (the default agent and models, written to
// config.toml) and the activity log. Everything it shows
// and does is an owner call to Core (core.proto: ListLiveSessions, EndSessions,
// WatchSession, GetSessionHistory, CancelTurn, ListUserPermissions,
// AnswerUserPermission, GetConsent, SetConsent, RevokeOrigin, ListAgents, SetSettings,
// ListActivity, ExportActivity, ListFolders, PickFolder)
// over a native host of this page's own, with the caller origin
// `app:pedelec-extension`; closing the page closes the host and ends its
// watch. A page of a site can make none of these calls (requests.js).
// While the page is hidden it reads nothing: the lists are read again once
// it shows.
"use strict";

/** The host name pedelec-native-host registers (crates/pedelec-native-host/src/registration.rs). */
const HOST_NAME = "dev.pedelec.host";
const OWNER_ORIGIN = "app:pedelec-extension";
/** How often the lists are read again. */
const REFRESH_MS = 1000;
/** Sessions per page of the table: 1 000 live sessions stay usable. */
const PAGE_SIZE = 50;
/** Ended sessions read for the Recent list (Core allows 1 000), shown a page at a time. */
const RECENT_LIMIT = 200;
/** Entries the monitor keeps; older ones leave (the history has them all). */
const MONITOR_MAX_ENTRIES = 2000;
/** Transcript entries read when the monitor opens. */
const HISTORY_PAGE = 200;
/** How long an agent's Check may take: a real agent starts and asks its model. */
const CHECK_TIMEOUT_MS = 120000;
/** How long a call waits for Core (starting it included). */
const CALL_TIMEOUT_MS = 15000;
/** Activity log entries per page (Core allows 1 000). */
const ACTIVITY_PAGE = 100;
/** Parts of an export at most (Core sends up to 5 000 entries a part). */
const EXPORT_MAX_PARTS = 200;

// ---- the native host ----

/**
 * One native host for this page: calls answered by request id, and
 * subscriptions (WatchSession) whose events arrive as `event` frames tagged
 * with the request id. Frames over 1 MiB arrive as chunks.
 */
class Host {
  constructor() {
    this.port = null;
    this.nextId = 1;
    /** requestId -> settle(frame) of calls waiting for their answer. */
    this.waiting = new Map();
    /** requestId -> { onEvent, onEnd } of live subscriptions. */
    this.subscriptions = new Map();
    this.chunks = new Map();
  }

  open() {
    const port = chrome.runtime.connectNative(HOST_NAME);
    port.onMessage.addListener((frame) => this.received(frame));
    port.onDisconnect.addListener(() => {
      if (this.port === port) this.port = null;
      const message = (chrome.runtime.lastError && chrome.runtime.lastError.message) || "the native host exited";
      for (const [, settle] of this.waiting) settle({ error: { code: "CORE_RUNTIME_UNAVAILABLE", message } });
      this.waiting.clear();
      for (const [, sub] of this.subscriptions) sub.onEnd({ code: "CORE_RUNTIME_UNAVAILABLE", message });
      this.subscriptions.clear();
      this.chunks.clear();
    });
    this.port = port;
  }

  received(frame) {
    if (frame.chunk) {
      const chunk = frame.chunk;
      const key = chunk.messageId || 0;
      let set = this.chunks.get(key);
      if (!set) {
        set = { count: chunk.count || 0, parts: [], got: 0 };
        this.chunks.set(key, set);
      }
      if (set.parts[chunk.index || 0] === undefined) set.got++;
      set.parts[chunk.index || 0] = chunk.data || "";
      if (set.got === set.count) {
        this.chunks.delete(key);
        this.received(JSON.parse(set.parts.join("")));
      }
      return;
    }
    const id = frame.requestId || 0;
    const sub = this.subscriptions.get(id);
    if (sub && frame.event) {
      sub.onEvent(frame.event);
      return;
    }
    const settle = this.waiting.get(id);
    if (settle) {
      this.waiting.delete(id);
      settle(frame);
      return;
    }
    if (sub && frame.error) {
      this.subscriptions.delete(id);
      sub.onEnd(frame.error);
    }
  }

  send(call, body) {
    if (!this.port) this.open();
    const id = this.nextId;
    this.nextId = this.nextId >= 0x7ffffff0 ? 1 : this.nextId + 1;
    this.port.postMessage({ requestId: id, request: { [call]: { callerOrigin: OWNER_ORIGIN, ...body } } });
    return id;
  }

  /** The owner call `call`: `{ response }` or `{ error }`, never a rejection. */
  call(call, body) {
    return new Promise((resolve) => {
      let id;
      const timer = setTimeout(() => {
        this.waiting.delete(id);
        resolve({ error: { code: "CORE_RUNTIME_UNAVAILABLE", message: "Core did not answer in time" } });
      }, CALL_TIMEOUT_MS);
      try {
        id = this.send(call, body);
      } catch (e) {
        clearTimeout(timer);
        resolve({ error: { code: "CORE_RUNTIME_UNAVAILABLE", message: String(e) } });
        return;
      }
      this.waiting.set(id, (frame) => {
        clearTimeout(timer);
        resolve(frame.error ? { error: frame.error } : { response: frame.response && frame.response[call] });
      });
    });
  }

  /**
   * Follows a session (WatchSession): `onEvent` gets the snapshot, then
   * every event; `onEnd(error)` once the watch ends. Returns a function
   * that stops it.
   */
  watch(sessionId, onEvent, onEnd) {
    let id;
    let stopped = false;
    try {
      id = this.send("watchSession", { sessionId });
    } catch (e) {
      onEnd({ code: "CORE_RUNTIME_UNAVAILABLE", message: String(e) });
      return () => {};
    }
    this.subscriptions.set(id, { onEvent, onEnd });
    this.waiting.set(id, (frame) => {
      if (frame.error) {
        this.subscriptions.delete(id);
        onEnd(frame.error);
      } else if (!stopped) {
        onEvent(frame.response.watchSession);
      }
    });
    return () => {
      stopped = true;
      this.waiting.delete(id);
      if (!this.subscriptions.delete(id) || !this.port) return;
      const unsubscribe = this.nextId;
      this.nextId++;
      this.port.postMessage({ requestId: unsubscribe, request: { unsubscribe: { sessionId, subscriptionId: id } } });
    };
  }
}

const host = new Host();

// ---- small helpers ----

const $ = (id) => document.getElementById(id);

function cell(text) {
  const td = document.createElement("td");
  td.textContent = text;
  return td;
}

function button(text, className, label, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = className;
  b.textContent = text;
  if (label) b.setAttribute("aria-label", label);
  b.addEventListener("click", onClick);
  return b;
}

const { enumWord } = PedelecShown;

function clock(ms) {
  const n = Number(ms || 0);
  return n > 0 ? new Date(n).toLocaleString() : "";
}

function say(id, text) {
  $(id).textContent = text;
}

// ---- tabs ----

const TABS = ["sessions", "requests", "sites", "agents", "activity"];

function selectTab(name, focus) {
  for (const tab of TABS) {
    const selected = tab === name;
    const button = $(`tab-${tab}`);
    button.setAttribute("aria-selected", String(selected));
    button.tabIndex = selected ? 0 : -1;
    $(`view-${tab}`).hidden = !selected;
    if (selected && focus) button.focus();
  }
  if (location.hash !== `#${name}`) history.replaceState(null, "", `#${name}`);
  if (name === "sites") {
    siteAgents = null; // agents may have been installed or configured since
    refreshSites().catch((e) => console.error("pedelec control center:", e));
  }
  if (name === "agents") refreshAgents().catch((e) => console.error("pedelec control center:", e));
  if (name === "activity") refreshActivity().catch((e) => console.error("pedelec control center:", e));
}

const selected = () => TABS.find((tab) => !$(`view-${tab}`).hidden);

for (const [i, tab] of TABS.entries()) {
  const button = $(`tab-${tab}`);
  button.addEventListener("click", () => selectTab(tab, false));
  // Arrow keys, Home and End move between tabs (the ARIA tabs pattern).
  button.addEventListener("keydown", (e) => {
    const next = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: TABS.length - 1 }[e.key];
    if (next === undefined) return;
    e.preventDefault();
    selectTab(TABS[(next + TABS.length) % TABS.length], true);
  });
}

// ---- sessions ----

/** Every live session as Core last listed it, and the table's page. */
let sessions = [];
let page = 0;
/** The most recently ended sessions, newest ended first, and the Recent table's page. */
let recent = [];
let recentPage = 0;

async function refreshSessions() {
  // Live sessions first, then the newest ended ones (ListLiveSessionsRequest.include_ended).
  const reply = await host.call("listLiveSessions", { includeEnded: true, endedLimit: RECENT_LIMIT });
  if (reply.error) {
    say("core-state", `Core did not answer: ${reply.error.message}`);
    return;
  }
  say("core-state", "");
  const listed = ((reply.response && reply.response.sessions) || []).map(PedelecShown.liveSession);
  sessions = listed.filter((s) => s.status !== "ended");
  recent = listed.filter((s) => s.status === "ended");
  renderSessions();
  renderRecent();
  // When the page first listed Core's sessions (`cargo xtask web-bench` reads it).
  if (performance.getEntriesByName(LISTED_MARK).length === 0) performance.mark(LISTED_MARK);
}

/** The performance mark of the first listing of the sessions. */
const LISTED_MARK = "pedelec-sessions-listed";

function renderSites() {
  const counts = new Map();
  for (const s of sessions) counts.set(s.origin, (counts.get(s.origin) || 0) + 1);
  const origins = [...counts.keys()].sort();
  $("no-sessions").hidden = sessions.length > 0;
  const shownNow = JSON.stringify([...counts]);
  if (shownNow === $("sites").dataset.shown) return;
  $("sites").dataset.shown = shownNow;
  const focused = $("sites").contains(document.activeElement) ? document.activeElement.dataset.origin : null;
  $("sites").replaceChildren(
    ...origins.map((origin) => {
      const li = document.createElement("li");
      li.dataset.origin = origin;
      const name = document.createElement("code");
      name.textContent = origin;
      const n = counts.get(origin);
      li.append(name, ` ${n} session${n === 1 ? "" : "s"} `);
      const endAll = button("End all", "end-site", `End all sessions of ${origin}`, () => {
        endAll.disabled = true;
        end({ origin }).finally(() => {
          endAll.disabled = false;
        });
      });
      endAll.dataset.origin = origin;
      li.append(endAll);
      return li;
    }),
  );
  // The filter offers the sites listed now, and keeps the chosen one.
  const filter = $("site-filter");
  const chosen = filter.value;
  const options = [new Option("Every site", ""), ...origins.map((o) => new Option(o, o))];
  if (chosen && !counts.has(chosen)) options.push(new Option(`${chosen} (none live)`, chosen));
  filter.replaceChildren(...options);
  filter.value = chosen;
  if (focused) {
    const again = $("sites").querySelector(`button[data-origin="${CSS.escape(focused)}"]`);
    if (again) again.focus();
  }
}

function renderSessions() {
  renderSites();
  const chosen = $("site-filter").value;
  const listed = chosen ? sessions.filter((s) => s.origin === chosen) : sessions;
  const pages = Math.max(1, Math.ceil(listed.length / PAGE_SIZE));
  page = Math.min(page, pages - 1);
  const from = page * PAGE_SIZE;
  const rows = listed.slice(from, from + PAGE_SIZE);
  say("sessions-caption", `${listed.length} live session${listed.length === 1 ? "" : "s"}`);
  say("page-label", listed.length > 0 ? `${from + 1}–${from + rows.length} of ${listed.length}` : "");
  $("page-prev").disabled = page === 0;
  $("page-next").disabled = page >= pages - 1;
  // Rebuilt only when what it shows changed, so a button keeps the
  // keyboard's focus (and its place under the pointer) between reads.
  const shownNow = JSON.stringify([rows, watched && watched.sessionId]);
  const body = $("sessions").querySelector("tbody");
  if (shownNow === body.dataset.shown) return;
  body.dataset.shown = shownNow;
  const focused = body.contains(document.activeElement) ? document.activeElement : null;
  body.replaceChildren(...rows.map(sessionRow));
  if (focused) {
    const again = body.querySelector(`button.${focused.className}[data-session="${CSS.escape(focused.dataset.session)}"]`);
    if (again) again.focus();
  }
}

function sessionRow(s) {
  const row = document.createElement("tr");
  row.dataset.session = s.sessionId;
  if (watched && watched.sessionId === s.sessionId) row.className = "watched";
  const actions = document.createElement("td");
  const open = button("Follow", "follow", `Follow session ${s.sessionId} of ${s.origin} live`, () => follow(s));
  const cancel = button("Cancel", "cancel", `Cancel the running turn of session ${s.sessionId}`, () => {
    cancel.disabled = true;
    cancelTurn(s.sessionId).finally(() => {
      cancel.disabled = false;
    });
  });
  cancel.disabled = !(s.status === "running" || s.status === "waiting_tool_result");
  const endOne = button("End", "end", `End session ${s.sessionId} of ${s.origin}`, () => {
    endOne.disabled = true;
    end({ sessionIds: [s.sessionId] });
  });
  for (const b of [open, cancel, endOne]) b.dataset.session = s.sessionId;
  actions.append(open, cancel, endOne);
  row.append(
    cell(s.origin),
    cell(s.provider),
    cell(s.model),
    cell(s.workspacePath),
    cell(s.status),
    cell(clock(s.createdAtMs)),
    cell(s.totalTokens ? String(s.totalTokens) : ""),
    actions,
  );
  return row;
}

/** Ends sessions by id or a whole site (EndSessions); the site's consent stays. */
async function end(body) {
  const reply = await host.call("endSessions", body);
  say(
    "outcome",
    reply.error
      ? `Not ended: ${reply.error.message}`
      : `Ended ${Number(reply.response.ended || 0)} session${Number(reply.response.ended || 0) === 1 ? "" : "s"}.`,
  );
  await refreshSessions();
}

async function cancelTurn(sessionId) {
  const reply = await host.call("cancelTurn", { sessionId });
  if (reply.error) say("outcome", `Not cancelled: ${reply.error.message}`);
  else say("outcome", reply.response.operationId ? "Cancelled the running turn." : "Nothing was running.");
  await refreshSessions();
}

/** The Recent list: ended sessions of the chosen site, a page at a time, each openable into the monitor. */
function renderRecent() {
  const chosen = $("site-filter").value;
  const listed = chosen ? recent.filter((s) => s.origin === chosen) : recent;
  const pages = Math.max(1, Math.ceil(listed.length / PAGE_SIZE));
  recentPage = Math.min(recentPage, pages - 1);
  const from = recentPage * PAGE_SIZE;
  const rows = listed.slice(from, from + PAGE_SIZE);
  $("no-recent").hidden = listed.length > 0;
  say("recent-caption", `${listed.length} recently ended session${listed.length === 1 ? "" : "s"}, newest first`);
  say("recent-page-label", listed.length > 0 ? `${from + 1}–${from + rows.length} of ${listed.length}` : "");
  $("recent-prev").disabled = recentPage === 0;
  $("recent-next").disabled = recentPage >= pages - 1;
  const shownNow = JSON.stringify([rows, watched && watched.sessionId]);
  const body = $("recent").querySelector("tbody");
  if (shownNow === body.dataset.shown) return;
  body.dataset.shown = shownNow;
  const focused = body.contains(document.activeElement) ? document.activeElement.dataset.session : null;
  body.replaceChildren(...rows.map(recentRow));
  if (focused) {
    const again = body.querySelector(`button.open-recent[data-session="${CSS.escape(focused)}"]`);
    if (again) again.focus();
  }
}

function recentRow(s) {
  const row = document.createElement("tr");
  row.dataset.session = s.sessionId;
  if (watched && watched.sessionId === s.sessionId) row.className = "watched";
  const actions = document.createElement("td");
  const open = button("Open", "open-recent", `Open the ended session ${s.sessionId} of ${s.origin}`, () => follow(s));
  open.dataset.session = s.sessionId;
  actions.append(open);
  row.append(
    cell(s.origin),
    cell(s.provider),
    cell(s.model),
    cell(s.workspacePath),
    cell(clock(s.createdAtMs)),
    cell(clock(s.lastActivityAtMs)),
    cell(s.totalTokens ? String(s.totalTokens) : ""),
    actions,
  );
  return row;
}

$("site-filter").addEventListener("change", () => {
  page = 0;
  recentPage = 0;
  renderSessions();
  renderRecent();
});
$("recent-prev").addEventListener("click", () => {
  recentPage = Math.max(0, recentPage - 1);
  renderRecent();
});
$("recent-next").addEventListener("click", () => {
  recentPage++;
  renderRecent();
});
$("page-prev").addEventListener("click", () => {
  page = Math.max(0, page - 1);
  renderSessions();
});
$("page-next").addEventListener("click", () => {
  page++;
  renderSessions();
});

// ---- the event monitor ----

/** The followed session: { sessionId, stop, lastSeq, activities: Map(activityId -> li) }. */
let watched = null;

function follow(s) {
  closeMonitor();
  const log = $("monitor-log");
  log.replaceChildren();
  $("monitor").hidden = false;
  say("monitor-session", s.sessionId);
  say("monitor-origin", s.origin);
  say("monitor-agent", [s.provider, s.model].filter(Boolean).join(" "));
  say("monitor-status", s.status);
  say("monitor-tokens", s.totalTokens ? `${s.totalTokens} tokens` : "");
  // An ended session has nothing to cancel or end: its monitor reads what it did.
  $("monitor-cancel").disabled = s.status === "ended";
  $("monitor-end").disabled = s.status === "ended";
  const current = { sessionId: s.sessionId, stop: null, lastSeq: null, activities: new Map(), streaming: "" };
  watched = current;
  for (const row of document.querySelectorAll("#sessions tbody tr, #recent tbody tr")) {
    row.className = row.dataset.session === s.sessionId ? "watched" : "";
  }
  current.stop = host.watch(
    s.sessionId,
    (event) => {
      if (watched === current) onEvent(current, event);
    },
    (error) => {
      if (watched === current) entry("watch-ended", `No longer following: ${error.message || error.code}`);
    },
  );
  $("monitor").scrollIntoView({ block: "nearest" });
}

function closeMonitor() {
  if (watched && watched.stop) watched.stop();
  watched = null;
  $("monitor").hidden = true;
  $("monitor-streaming").hidden = true;
  for (const row of document.querySelectorAll("#sessions tbody tr.watched, #recent tbody tr.watched")) row.className = "";
}

$("monitor-close").addEventListener("click", closeMonitor);
$("monitor-cancel").addEventListener("click", () => watched && cancelTurn(watched.sessionId));
$("monitor-end").addEventListener("click", () => watched && end({ sessionIds: [watched.sessionId] }));

/** Appends one entry to the monitor: `kind` names it (data-kind), `text` says it. */
function entry(kind, text, detail) {
  const log = $("monitor-log");
  const li = document.createElement("li");
  li.dataset.kind = kind;
  const head = document.createElement("span");
  head.className = "what";
  head.textContent = text;
  li.append(head);
  if (detail) {
    const pre = document.createElement("pre");
    pre.textContent = detail;
    li.append(pre);
  }
  log.append(li);
  while (log.children.length > MONITOR_MAX_ENTRIES) log.firstElementChild.remove();
  // The log scrolls within itself; the page stays where the user has it.
  log.scrollTop = log.scrollHeight;
  return li;
}

/** What an Activity (session.proto) is, in one line, and its output. */
function describeActivity(a) {
  const kind = enumWord(a.kind, "ACTIVITY_KIND_");
  const status = enumWord(a.status, "ACTIVITY_STATUS_");
  const what = a.command || (a.paths && a.paths.length ? a.paths.join(", ") : "") || a.title || "";
  let detail = a.output || "";
  if (a.plan && a.plan.length) {
    detail = a.plan.map((p) => `[${enumWord(p.status, "ACTIVITY_STATUS_") || "pending"}] ${p.content}`).join("\n");
  }
  return { text: `${kind}${status ? ` (${status})` : ""}: ${what}`, detail };
}

function showActivity(current, a) {
  const { text, detail } = describeActivity(a);
  const id = a.activityId || "";
  const replaced = id && current.activities.get(id);
  const li = entry("activity", text, detail);
  li.dataset.activity = enumWord(a.kind, "ACTIVITY_KIND_");
  if (replaced) replaced.remove();
  if (id) current.activities.set(id, li);
}

function flushStreaming(current) {
  current.streaming = "";
  $("monitor-streaming").hidden = true;
  say("monitor-streaming", "");
}

function onEvent(current, event) {
  if (event.snapshot) {
    const first = current.lastSeq === null;
    current.lastSeq = Number(event.seq || event.snapshot.lastSeq || 0);
    say("monitor-status", enumWord(event.snapshot.status, "SESSION_STATUS_"));
    if (first) readHistory(current, current.lastSeq, event.snapshot);
    else entry("resync", "Re-synchronised: some events were skipped (the transcript has them).");
    return;
  }
  current.lastSeq = Number(event.seq || current.lastSeq);
  if (event.chatDelta) {
    current.streaming += event.chatDelta.text || "";
    $("monitor-streaming").hidden = false;
    say("monitor-streaming", current.streaming);
  } else if (event.chat) {
    flushStreaming(current);
    entry("chat", "Agent:", event.chat.text || "");
  } else if (event.statusChanged) {
    const status = enumWord(event.statusChanged.status, "SESSION_STATUS_");
    say("monitor-status", status);
    entry("status", `Status: ${status}`);
  } else if (event.operationStarted) {
    entry("operation-started", `The site started a ${enumWord(event.operationStarted.kind, "OPERATION_KIND_")} turn`);
  } else if (event.operationCompleted) {
    flushStreaming(current);
    const error = event.operationCompleted.error;
    entry("operation-completed", error ? `Turn ended: ${error.code} ${error.message || ""}` : "Turn completed");
  } else if (event.toolCall) {
    entry("tool-call", `Frontend tool call ${event.toolCall.tool}`, event.toolCall.argsJson || "");
  } else if (event.toolCallSettled) {
    const code = event.toolCallSettled.code;
    entry("tool-settled", code ? `Tool call settled: ${code}` : "Tool call answered by the site");
  } else if (event.activityUpdated) {
    showActivity(current, event.activityUpdated.activity || {});
  } else if (event.permissionRequested) {
    showPermission(event.permissionRequested);
  } else if (event.permissionSettled) {
    const p = event.permissionSettled;
    entry("permission-settled", `Permission ${p.reason || "settled"}: ${p.optionId || "rejected"}`);
  } else if (event.usageUpdated) {
    const total = event.usageUpdated.usage && event.usageUpdated.usage.totalTokens;
    if (total !== undefined) say("monitor-tokens", `${total} tokens`);
  } else if (event.error) {
    entry("error", `Error ${event.error.error && event.error.error.code}: ${event.error.error && event.error.error.message}`);
  } else if (event.ended) {
    flushStreaming(current);
    say("monitor-status", "ended");
    entry("ended", `The session ended (${event.ended.reason || "ended"})`);
  }
}

function showPermission(request) {
  const { text } = describeActivity(request.activity || {});
  const options = (request.options || []).map((o) => o.name || o.optionId).join(", ");
  const who = request.userOnly ? "only you may answer (Requests)" : "the site answers";
  entry("permission", `Permission asked, ${who}: ${text}`, options ? `Options: ${options}` : "");
}

/**
 * What the session did before the watch began: its transcript up to
 * `lastSeq`, then what the snapshot says is in progress, before the live
 * events that arrived meanwhile.
 */
async function readHistory(current, lastSeq, snapshot) {
  const reply = await host.call("getSessionHistory", { sessionId: current.sessionId, limit: HISTORY_PAGE });
  if (watched !== current) return;
  if (reply.error) {
    entry("error", `The transcript could not be read: ${reply.error.message}`);
    return;
  }
  const entries = (reply.response && reply.response.entries) || [];
  // Later entries arrive as live events.
  const log = $("monitor-log");
  const live = [...log.children];
  log.replaceChildren();
  if (reply.response.hasMore) entry("history", "Older entries are in the transcript.");
  for (const e of entries) if (Number(e.seq || 0) <= lastSeq) historyEntry(e);
  showSnapshot(current, snapshot);
  log.append(...live);
}

function historyEntry(e) {
  if (e.userText) entry("user-text", "The site sent:", e.userText.text || "");
  else if (e.assistantMessage) {
    entry("chat", e.assistantMessage.interrupted ? "Agent (interrupted):" : "Agent:", e.assistantMessage.text || "");
  } else if (e.toolCall) entry("tool-call", `Frontend tool call ${e.toolCall.tool}`, e.toolCall.argsJson || "");
  else if (e.toolResult) {
    const r = e.toolResult;
    entry("tool-result", r.errorCode ? `Tool result: ${r.errorCode}` : "Tool result", r.resultJson || "");
  } else if (e.activity) {
    if (e.activity.activity) {
      const { text, detail } = describeActivity(e.activity.activity);
      entry("activity", text, detail).dataset.activity = enumWord(e.activity.activity.kind, "ACTIVITY_KIND_");
    } else entry("activity", `${e.activity.kind}: ${e.activity.summary}`);
  } else if (e.toolFailed) entry("error", `Tool ${e.toolFailed.tool} failed: ${e.toolFailed.reason}`);
  else if (e.operationCompleted) {
    const error = e.operationCompleted.error;
    entry("operation-completed", error ? `Turn ended: ${error.code}` : "Turn completed");
  } else if (e.ended) entry("ended", `The session ended (${e.ended.reason || "ended"})`);
  else if (e.resumed) entry("resumed", "The session was resumed");
}

/** What is in progress at the watch's start: activities, tool calls, permission requests. */
function showSnapshot(current, snapshot) {
  // An activity a live update already showed is newer than the snapshot's.
  for (const a of snapshot.activities || []) if (!current.activities.has(a.activityId)) showActivity(current, a);
  for (const t of snapshot.pendingTools || []) entry("tool-call", `Frontend tool call ${t.tool} (waiting)`, t.argsJson || "");
  for (const p of snapshot.pendingPermissions || []) showPermission(p);
}

// ---- requests only the user answers ----

/** permissionId -> UserPermission shown now. */
let requests = new Map();

async function refreshRequests() {
  const reply = await host.call("listUserPermissions", {});
  if (reply.error) return;
  const listed = (reply.response && reply.response.permissions) || [];
  say("requests-count", listed.length > 0 ? `(${listed.length})` : "");
  const now = new Map(listed.filter((p) => p.request).map((p) => [p.request.permissionId, p]));
  const same = now.size === requests.size && [...now.keys()].every((id) => requests.has(id));
  requests = now;
  $("no-requests").hidden = now.size > 0;
  // Rebuilt only when the set changed, so focus stays on a button meanwhile.
  if (!same) $("requests").replaceChildren(...[...now.values()].map(requestItem));
}

function requestItem(p) {
  const request = p.request;
  const a = request.activity || {};
  const li = document.createElement("li");
  li.dataset.permission = request.permissionId;
  const facts = document.createElement("dl");
  const fact = (name, value, className) => {
    const dt = document.createElement("dt");
    dt.textContent = name;
    const dd = document.createElement("dd");
    dd.className = className;
    dd.textContent = value;
    facts.append(dt, dd);
  };
  fact("Site", p.origin, "request-origin");
  fact("Agent", p.provider, "request-agent");
  fact("Folder", p.workspacePath, "request-folder");
  fact(a.command ? "Command" : "What", a.command || (a.paths || []).join(", ") || a.title || "", "request-command");
  fact("Answer by", clock(request.deadlineAtMs), "request-deadline");
  li.append(facts);
  const answer = (optionId) => async () => {
    for (const b of li.querySelectorAll("button")) b.disabled = true;
    const reply = await host.call("answerUserPermission", {
      sessionId: p.sessionId,
      permissionId: request.permissionId,
      optionId,
    });
    say("requests-outcome", reply.error ? `Not answered: ${reply.error.message}` : "Answered.");
    await refreshRequests();
  };
  const options = document.createElement("p");
  options.className = "actions";
  for (const o of request.options || []) {
    const b = button(o.name || o.optionId, "permission-option", `${o.name || o.optionId}: ${a.command || a.title || ""}`, answer(o.optionId));
    b.dataset.option = o.optionId;
    options.append(b);
  }
  const reject = button("Reject", "permission-option", `Reject: ${a.command || a.title || ""}`, answer(""));
  reject.dataset.option = "";
  options.append(reject);
  li.append(options);
  return li;
}

// ---- sites: consent ----

/**
 * Changes one origin's consent as a whole (SetConsent replaces it): read
 * Core's copy now, so a change made elsewhere meanwhile (the approval page)
 * is kept, apply `change`, and store it. Core checks every folder as
 * SetConsent always does and refuses one that could never be a workspace.
 */
async function changeConsent(origin, change, done, onStored = () => {}) {
  const read = await host.call("getConsent", { origin });
  if (read.error) {
    say("sites-outcome", `Not changed: ${read.error.message}`);
    return false;
  }
  const stored = ((read.response && read.response.origins) || [])[0] || { origin };
  // SetConsent replaces the whole consent: what this change leaves alone is sent back as Core has it.
  const consent = change({
    origin,
    approved: Boolean(stored.approved),
    folders: (stored.folders || []).map((f) => ({ path: f.path, mayApproveCommands: Boolean(f.mayApproveCommands) })),
    providers: stored.providers || [],
    maxLiveSessions: Number(stored.maxLiveSessions || 0),
  });
  const set = await host.call("setConsent", { consent });
  if (!set.error) onStored();
  await Promise.all([refreshSites(), consentChanged()]);
  // Said last, once the view shows Core's copy: the caller re-arms its
  // control in the same turn, so what is said is what can be done next.
  say("sites-outcome", set.error ? `Not changed: ${set.error.message}` : done);
  return !set.error;
}

/**
 * Tells the extension's worker to read consent from Core again: it keeps a
 * copy to decide when a page must be asked about (background.js).
 */
function consentChanged() {
  return chrome.runtime.sendMessage({ type: "consentChanged" }).catch(() => {});
}

/** Reads of consent started, and the latest one shown: an older answer arriving late is dropped. */
let sitesAsked = 0;
let sitesShown = 0;

/** The agents a site may be limited to (ListAgents: code and name), read once per visit of the view. */
let siteAgents = null;

async function readSiteAgents() {
  const reply = await host.call("listAgents", {});
  if (reply.error) return null;
  return ((reply.response && reply.response.agents) || [])
    .map((a) => a.provider || {})
    .filter((p) => p.code)
    .map((p) => ({ code: p.code, name: p.name || p.code, available: Boolean(p.available) }));
}

async function refreshSites() {
  const ticket = ++sitesAsked;
  const [reply, agents] = await Promise.all([host.call("getConsent", {}), siteAgents ? siteAgents : readSiteAgents()]);
  if (agents) siteAgents = agents;
  if (ticket < sitesShown) return;
  sitesShown = ticket;
  if (reply.error) {
    say("sites-outcome", `Core did not answer: ${reply.error.message}`);
    return;
  }
  const origins = ((reply.response && reply.response.origins) || []).slice().sort((a, b) => (a.origin < b.origin ? -1 : 1));
  $("no-consents").hidden = origins.length > 0;
  const list = $("consents");
  const shownNow = JSON.stringify([origins, siteAgents]);
  if (shownNow === list.dataset.shown) return;
  list.dataset.shown = shownNow;
  // Rebuilt only when Core's copy changed; what the user typed and where
  // the keyboard's focus was are kept.
  const typed = new Map([...list.querySelectorAll("input.folder-path")].map((i) => [i.dataset.origin, i.value]));
  const focused = list.contains(document.activeElement) ? document.activeElement : null;
  const focusKey = focused && [focused.className, focused.dataset.origin, focused.dataset.path || focused.dataset.code || ""];
  list.replaceChildren(...origins.map((c, i) => consentItem(c, i, typed.get(c.origin) || "")));
  if (focusKey) {
    const [className, origin, path] = focusKey;
    const again = [...list.querySelectorAll(`.${className.split(" ")[0]}`)].find(
      (e) => e.dataset.origin === origin && (e.dataset.path || e.dataset.code || "") === path,
    );
    if (again) again.focus();
  }
}

function consentItem(c, index, typed) {
  const origin = c.origin;
  const li = document.createElement("li");
  li.dataset.origin = origin;
  const title = document.createElement("h3");
  const name = document.createElement("code");
  name.textContent = origin;
  const standing = document.createElement("span");
  standing.className = "standing";
  standing.textContent = c.approved ? ` approved ${clock(c.approvedAtMs)}` : " not approved";
  title.append(name, standing);
  li.append(title);

  const folders = c.folders || [];
  const table = document.createElement("table");
  table.className = "folders";
  const caption = document.createElement("caption");
  caption.textContent = folders.length > 0 ? `Folders ${origin} may open` : `No folder is granted to ${origin}.`;
  table.append(caption);
  const body = document.createElement("tbody");
  for (const f of folders) {
    const row = document.createElement("tr");
    row.dataset.path = f.path;
    const path = document.createElement("td");
    const code = document.createElement("code");
    code.textContent = f.path;
    path.append(code);
    const may = document.createElement("td");
    const label = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.className = "may-approve";
    box.checked = Boolean(f.mayApproveCommands);
    box.dataset.origin = origin;
    box.dataset.path = f.path;
    box.setAttribute("aria-label", `${origin} may approve commands in ${f.path}`);
    box.addEventListener("change", () => {
      box.disabled = true;
      const want = box.checked;
      changeConsent(
        origin,
        (consent) => ({
          ...consent,
          folders: consent.folders.map((g) => (g.path === f.path ? { ...g, mayApproveCommands: want } : g)),
        }),
        want ? `${origin} may approve commands in ${f.path}.` : `Only you approve commands in ${f.path}.`,
      ).finally(() => {
        box.disabled = false;
      });
    });
    label.append(box, " may approve commands");
    may.append(label);
    const actions = document.createElement("td");
    const remove = button("Remove", "remove-folder", `Remove the folder ${f.path} from ${origin}`, () => {
      remove.disabled = true;
      changeConsent(
        origin,
        (consent) => ({ ...consent, folders: consent.folders.filter((g) => g.path !== f.path) }),
        `${f.path} is no longer granted to ${origin}.`,
      ).finally(() => {
        remove.disabled = false;
      });
    });
    remove.dataset.origin = origin;
    remove.dataset.path = f.path;
    actions.append(remove);
    row.append(path, may, actions);
    body.append(row);
  }
  table.append(body);
  li.append(table);

  const form = document.createElement("form");
  form.className = "add-folder";
  const inputId = `folder-path-${index}`;
  const label = document.createElement("label");
  label.htmlFor = inputId;
  label.textContent = `Add a folder to ${origin} (absolute path)`;
  const input = document.createElement("input");
  input.type = "text";
  input.id = inputId;
  input.className = "folder-path";
  input.dataset.origin = origin;
  input.value = typed;
  input.spellcheck = false;
  input.autocomplete = "off";
  const add = document.createElement("button");
  add.type = "submit";
  add.className = "add-folder-button";
  add.dataset.origin = origin;
  add.textContent = "Add folder";
  form.append(label, input, add);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const path = input.value.trim();
    if (!path) {
      say("sites-outcome", "Type the folder's absolute path first.");
      input.focus();
      return;
    }
    add.disabled = true;
    changeConsent(
      origin,
      (consent) =>
        consent.folders.some((g) => g.path === path)
          ? consent
          : { ...consent, folders: [...consent.folders, { path, mayApproveCommands: false }] },
      `${path} is granted to ${origin}.`,
      // Emptied before the view is read again, which keeps what was typed.
      () => {
        const typed = $("consents").querySelector(`input.folder-path[data-origin="${CSS.escape(origin)}"]`);
        if (typed) typed.value = "";
      },
    ).finally(() => {
      add.disabled = false;
    });
  });
  const browse = button("Add folder…", "pick-folder", `Add folder… to ${origin}: browse your folders`, () =>
    openBrowser(origin, browse),
  );
  browse.dataset.origin = origin;
  form.append(browse);
  li.append(form);
  li.append(limitsForm(c, index));

  const actions = document.createElement("p");
  actions.className = "actions";
  const revoke = button("Revoke", "revoke-site", `Revoke ${origin}: forget its approval and folders, and end its sessions`, async () => {
    revoke.disabled = true;
    const reply = await host.call("revokeOrigin", { origin });
    if (reply.error) {
      say("sites-outcome", `Not revoked: ${reply.error.message}`);
      revoke.disabled = false;
      return;
    }
    const n = Number((reply.response && reply.response.sessionsEnded) || 0);
    say("sites-outcome", `${origin} is revoked; ${n} session${n === 1 ? "" : "s"} ended.`);
    await Promise.all([refreshSites(), refreshSessions(), consentChanged()]);
  });
  revoke.dataset.origin = origin;
  actions.append(revoke);
  li.append(actions);
  return li;
}

/**
 * A site's own limits (OriginConsent.providers, max_live_sessions): a
 * checkbox per agent Core has (none ticked: every agent) and a number of
 * live sessions (empty: the default), saved together with SetConsent.
 */
function limitsForm(c, index) {
  const origin = c.origin;
  const chosen = new Set(c.providers || []);
  const form = document.createElement("form");
  form.className = "site-limits";
  form.dataset.origin = origin;
  const outer = document.createElement("fieldset");
  const legend = document.createElement("legend");
  legend.textContent = `What ${origin} may use`;
  outer.append(legend);

  const agents = document.createElement("fieldset");
  agents.className = "site-agents";
  const agentsLegend = document.createElement("legend");
  agentsLegend.textContent = "Agents (none ticked: every agent)";
  agents.append(agentsLegend);
  // Stored codes Core no longer has stay listed, so saving does not drop them unseen.
  const offered = [...(siteAgents || [])];
  for (const code of chosen) if (!offered.some((a) => a.code === code)) offered.push({ code, name: `${code} (not configured)` });
  for (const agent of offered) {
    const label = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.className = "site-agent";
    box.dataset.origin = origin;
    box.dataset.code = agent.code;
    box.checked = chosen.has(agent.code);
    label.append(box, ` ${agent.name} `);
    const code = document.createElement("code");
    code.textContent = agent.code;
    label.append(code);
    agents.append(label);
  }
  if (offered.length === 0) agents.append("Core did not list its agents.");
  const now = document.createElement("p");
  now.className = "site-agents-now";
  now.textContent = chosen.size === 0 ? "Every agent." : `Only: ${[...chosen].sort().join(", ")}.`;
  agents.append(now);
  outer.append(agents);

  const limit = document.createElement("p");
  const inputId = `site-max-${index}`;
  const label = document.createElement("label");
  label.htmlFor = inputId;
  label.textContent = `Live sessions of ${origin} at most (empty: the default)`;
  const input = document.createElement("input");
  input.type = "number";
  input.id = inputId;
  input.className = "site-max";
  input.dataset.origin = origin;
  input.min = "1";
  input.max = "1000";
  input.step = "1";
  input.value = c.maxLiveSessions ? String(c.maxLiveSessions) : "";
  input.placeholder = "default";
  limit.append(label, " ", input);
  outer.append(limit);

  const save = document.createElement("button");
  save.type = "submit";
  save.className = "save-limits";
  save.dataset.origin = origin;
  save.textContent = "Save agents and limit";
  save.setAttribute("aria-label", `Save agents and limit of ${origin}`);
  outer.append(save);
  form.append(outer);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const typed = input.value.trim();
    const max = typed === "" ? 0 : Number(typed);
    if (!Number.isInteger(max) || max < 0 || max > 1000) {
      say("sites-outcome", "The session limit is a whole number from 1 to 1000, or empty for the default.");
      input.focus();
      return;
    }
    const providers = [...form.querySelectorAll("input.site-agent")].filter((b) => b.checked).map((b) => b.dataset.code);
    save.disabled = true;
    const agentsSaid = providers.length === 0 ? "every agent" : providers.join(", ");
    const limitSaid = max === 0 ? "the default session limit" : `at most ${max} live session${max === 1 ? "" : "s"}`;
    changeConsent(
      origin,
      (consent) => ({ ...consent, providers, maxLiveSessions: max }),
      `${origin} may use ${agentsSaid}, with ${limitSaid}.`,
    ).finally(() => {
      save.disabled = false;
    });
  });
  return form;
}

// ---- sites: adding a folder by browsing (ListFolders, PickFolder) ----

/**
 * The in-page folder browser, as the picker a page's pickWorkspace() opens:
 * Core lists the folders and marks which may be granted; the pick is
 * PickFolder for the site, which Core checks again. `origin` null: closed.
 */
const folderBrowser = { origin: null, listing: null, asked: 0, opener: null };

function openBrowser(origin, opener) {
  folderBrowser.origin = origin;
  folderBrowser.opener = opener;
  say("browser-origin", origin);
  $("folder-browser").hidden = false;
  $("folder-browser").scrollIntoView({ block: "nearest" });
  browse("", true).catch((e) => say("browser-status", String(e)));
}

function closeBrowser() {
  const opener = folderBrowser.opener;
  folderBrowser.origin = null;
  folderBrowser.listing = null;
  folderBrowser.opener = null;
  $("folder-browser").hidden = true;
  // Back where the user was, or to the same site's button if the list was rebuilt.
  const origin = opener && opener.dataset.origin;
  const again = opener && opener.isConnected ? opener : origin && [...document.querySelectorAll("button.pick-folder")].find((b) => b.dataset.origin === origin);
  if (again) again.focus();
}

async function browse(path, focusFirst = false) {
  const mine = ++folderBrowser.asked;
  say("browser-status", "Reading…");
  const reply = await host.call("listFolders", { path, includeHidden: $("browser-hidden").checked });
  if (mine !== folderBrowser.asked || folderBrowser.origin === null) return;
  if (reply.error) {
    say("browser-status", `Cannot open ${path || "your home folder"}: ${reply.error.message}`);
    return;
  }
  const listing = reply.response || {};
  folderBrowser.listing = listing;
  $("browser-path").value = listing.path || "";
  $("browser-up").disabled = !listing.parent;
  $("browser-home").disabled = !listing.home;
  $("browser-pick").disabled = !listing.pickable;
  $("browser-pick").dataset.path = listing.path || "";
  $("browser-truncated").hidden = !listing.truncated;
  const folders = listing.folders || [];
  $("browser-folders").replaceChildren(
    ...folders.map((folder) =>
      PedelecShown.folderItem(folder, {
        never: "granted",
        className: "browse-folder",
        open: () => browse(PedelecShown.childPath(listing.path, folder.name), true),
      }),
    ),
  );
  const where = listing.pickable ? "" : " This folder itself can never be granted.";
  say("browser-status", `${listing.path}: ${folders.length} folder${folders.length === 1 ? "" : "s"}.${where}`);
  if (focusFirst) ($("browser-folders").querySelector("button") || $("browser-path")).focus();
}

$("browser-go").addEventListener("submit", (e) => {
  e.preventDefault();
  browse($("browser-path").value.trim()).catch((e) => say("browser-status", String(e)));
});
$("browser-up").addEventListener("click", () => folderBrowser.listing && folderBrowser.listing.parent && browse(folderBrowser.listing.parent));
$("browser-home").addEventListener("click", () => browse(""));
$("browser-hidden").addEventListener("change", () => folderBrowser.listing && browse(folderBrowser.listing.path));
$("browser-cancel").addEventListener("click", closeBrowser);
$("folder-browser").addEventListener("keydown", (e) => {
  if (e.key === "Escape") closeBrowser();
});
$("browser-pick").addEventListener("click", async () => {
  const path = $("browser-pick").dataset.path;
  const origin = folderBrowser.origin;
  if (!path || !origin) return;
  $("browser-pick").disabled = true;
  say("browser-status", `Granting ${path}…`);
  const reply = await host.call("pickFolder", { origin, path });
  if (reply.error) {
    $("browser-pick").disabled = false;
    say("browser-status", `Cannot grant ${path}: ${reply.error.message}`);
    return;
  }
  const granted = (reply.response && reply.response.grant && reply.response.grant.path) || path;
  closeBrowser();
  await Promise.all([refreshSites(), consentChanged()]);
  say("sites-outcome", `${granted} is granted to ${origin}.`);
});

// ---- agents ----

async function refreshAgents() {
  const reply = await host.call("listAgents", {});
  if (reply.error) {
    say("agents-outcome", `Core did not answer: ${reply.error.message}`);
    return;
  }
  say("agents-outcome", "");
  const listed = (reply.response && reply.response.agents) || [];
  const fallback = (reply.response && reply.response.defaultProvider) || "";
  const chosen = listed.find((a) => a.provider && a.provider.code === fallback);
  const model = chosen && chosen.defaultModel ? `, model ${chosen.defaultModel}` : "";
  say("default-agent", chosen ? `The default is ${chosen.provider.name} (${fallback})${model}.` : `The default is ${fallback}.`);
  $("agents").querySelector("tbody").replaceChildren(...listed.map((a) => agentRow(a, fallback)));
}

/** What the agent's warm process (kept started for the next session) is doing. */
function warmWords(warm) {
  const state = enumWord(warm && warm.state, "WARM_STATE_");
  const mib = warm && Number(warm.rssBytes || 0) > 0 ? `, ${Math.round(Number(warm.rssBytes) / 1048576)} MiB` : "";
  switch (state) {
    case "idle": return "kept warm; none running yet";
    case "starting": return "starting";
    case "ready": return `ready (pid ${warm.pid}${mib})`;
    case "reaped": return `ended: ${warm.reason || "idle"}`;
    case "failed": return `not kept: ${warm.reason || ""}`;
    default: return "off";
  }
}

function agentRow(agent, fallback) {
  const p = agent.provider || {};
  const row = document.createElement("tr");
  row.dataset.code = p.code || "";
  row.dataset.available = String(Boolean(p.available));
  const name = cell(p.name || p.code || "");
  if (p.code === fallback) {
    const mark = document.createElement("strong");
    mark.className = "default-mark";
    mark.textContent = " (default)";
    name.append(mark);
  }
  // The default model, edited in place and written to Core's config.toml.
  const modelCell = document.createElement("td");
  const modelInput = document.createElement("input");
  modelInput.className = "agent-model";
  modelInput.value = agent.defaultModel || "";
  modelInput.placeholder = "the agent's own";
  modelInput.setAttribute("aria-label", `Default model for ${p.name || p.code}`);
  const saveModel = button("Save", "save-model", `Save the default model for ${p.name || p.code}`, () =>
    saveSettings({ models: { [p.code]: modelInput.value.trim() } }, `${p.name || p.code}'s default model saved`),
  );
  modelCell.append(modelInput, " ", saveModel);
  if (p.code !== fallback) {
    const makeDefault = button("Make default", "make-default", `Make ${p.name || p.code} the default agent`, () =>
      saveSettings({ defaultProvider: p.code }, `${p.name || p.code} is now the default agent`),
    );
    name.append(" ", makeDefault);
  }
  const why = document.createElement("td");
  why.className = "why";
  if (!p.available) why.append(p.reason || "unavailable");
  if (agent.installCommand) {
    const install = document.createElement("code");
    install.className = "install";
    install.textContent = agent.installCommand;
    why.append(document.createElement("br"), "Install: ", install);
  }
  const check = document.createElement("td");
  const run = button("Check", "check-agent", `Check ${p.name || p.code}: run one turn with it`, async () => {
    run.disabled = true;
    result.textContent = "Checking…";
    const outcome = await checkAgent(p.code);
    checked.set(p.code, outcome);
    result.textContent = outcome;
    say("agents-outcome", `${p.name || p.code}: ${outcome}`);
    run.disabled = false;
  });
  run.dataset.code = p.code || "";
  const result = document.createElement("span");
  result.className = "check-result";
  result.setAttribute("aria-live", "polite");
  result.textContent = checked.get(p.code) || "";
  check.append(run, " ", result);
  const warmCell = cell(warmWords(agent.warm));
  warmCell.className = "warm";
  warmCell.dataset.state = enumWord(agent.warm && agent.warm.state, "WARM_STATE_") || "off";
  row.append(name, cell(p.code || ""), cell(p.available ? "available" : "unavailable"), cell(agent.version || ""), modelCell, warmCell, why, check);
  return row;
}

/**
 * Writes a settings change into Core's config.toml (Core.SetSettings: the
 * file's other lines and comments stay; Core checks it as at start) and shows
 * the agents as they now stand.
 */
async function saveSettings(change, done) {
  const reply = await host.call("setSettings", change);
  if (reply.error) {
    say("agents-outcome", `Not saved: ${reply.error.code} ${reply.error.message}`);
    return;
  }
  await refreshAgents();
  say("agents-outcome", `${done}.`);
}

/** Provider code -> what its last Check said. */
const checked = new Map();

/**
 * The one-turn probe: a throwaway session of the extension's own (a managed
 * workspace Core makes) with this agent, prepared — Core's preparation turn,
 * which the agent answers — watched to its completion, then ended. What it
 * says: "works (N ms)", or the error Core reported.
 */
async function checkAgent(code) {
  const started = performance.now();
  const made = await host.call("createSession", { provider: code, autoEndOnDisconnect: false });
  const sessionId = made.response && made.response.session && made.response.session.sessionId;
  if (made.error || !sessionId) return `fails: ${made.error ? `${made.error.code} ${made.error.message}` : "no session"}`;
  // Outcomes by operation id: the completion may arrive before Prepare's answer.
  const outcomes = new Map();
  let wanted = null;
  let settle;
  const settled = new Promise((resolve) => (settle = resolve));
  const outcome = (id, error) => {
    outcomes.set(id, error || null);
    if (id === wanted) settle(error || null);
  };
  const stop = host.watch(
    sessionId,
    (event) => {
      if (event.snapshot) for (const o of event.snapshot.recentOutcomes || []) outcome(o.operationId, o.error);
      if (event.operationCompleted) outcome(event.operationId, event.operationCompleted.error);
    },
    (error) => settle(error || { code: "CORE_RUNTIME_UNAVAILABLE", message: "the watch ended" }),
  );
  try {
    const prepared = await host.call("prepare", { sessionId });
    if (prepared.error) return `fails: ${prepared.error.code} ${prepared.error.message}`;
    if (prepared.response.alreadyDone) return `works (${Math.round(performance.now() - started)} ms)`;
    wanted = prepared.response.operationId;
    if (outcomes.has(wanted)) settle(outcomes.get(wanted));
    let timer;
    const timeout = new Promise((resolve) => {
      timer = setTimeout(() => resolve({ code: "TIMEOUT", message: `no answer within ${CHECK_TIMEOUT_MS / 1000} s` }), CHECK_TIMEOUT_MS);
    });
    const error = await Promise.race([settled, timeout]);
    clearTimeout(timer);
    return error ? `fails: ${error.code} ${error.message || ""}`.trim() : `works (${Math.round(performance.now() - started)} ms)`;
  } finally {
    stop();
    await host.call("end", { sessionId });
  }
}

$("agents-detect").addEventListener("click", () => {
  $("agents-detect").disabled = true;
  refreshAgents().finally(() => {
    $("agents-detect").disabled = false;
  });
});

// ---- activity log ----

/** The cursor of the next older page (empty: none), for the site shown. */
let activityCursor = "";
/** Sites the filter offers: every one seen in the log, live or with consent. */
const activitySites = new Set();

/** The newest page of the chosen site's log, replacing what is shown. */
async function refreshActivity() {
  await Promise.all([activityOrigins(), activityPage(false)]);
}

/** Fills the site filter from the sessions and consent Core knows, keeping the choice. */
async function activityOrigins() {
  for (const live of sessions) if (live.origin) activitySites.add(live.origin);
  const reply = await host.call("getConsent", {});
  for (const consent of (reply.response && reply.response.origins) || []) if (consent.origin) activitySites.add(consent.origin);
  fillActivitySites();
}

function fillActivitySites() {
  const filter = $("activity-site");
  const known = new Set([...filter.options].map((o) => o.value));
  for (const origin of [...activitySites].sort()) {
    if (known.has(origin)) continue;
    const option = document.createElement("option");
    option.value = origin;
    option.textContent = origin;
    filter.append(option);
  }
}

/** Reads a page: the newest (`older` false) or the next older one, appended. */
async function activityPage(older) {
  const origin = $("activity-site").value;
  const body = { origin, limit: ACTIVITY_PAGE };
  if (older) body.cursor = activityCursor;
  $("activity-older").disabled = true;
  const reply = await host.call("listActivity", body);
  if (reply.error) {
    say("activity-outcome", `Core did not answer: ${reply.error.message}`);
    $("activity-older").disabled = !activityCursor;
    return;
  }
  if ($("activity-site").value !== origin) return; // the filter changed meanwhile
  const entries = (reply.response && reply.response.entries) || [];
  const rows = entries.map(activityRow);
  const tbody = $("activity").querySelector("tbody");
  if (older) tbody.append(...rows);
  else tbody.replaceChildren(...rows);
  activityCursor = (reply.response && reply.response.hasMore && reply.response.nextCursor) || "";
  $("activity-older").disabled = !activityCursor;
  $("no-activity").hidden = tbody.rows.length > 0;
  const shown = tbody.rows.length;
  say("activity-caption", `Newest first: ${shown} entr${shown === 1 ? "y" : "ies"} shown${activityCursor ? ", older ones follow" : ""}.`);
  say("activity-outcome", "");
  let added = false;
  for (const entry of entries) {
    if (entry.origin && !activitySites.has(entry.origin)) {
      activitySites.add(entry.origin);
      added = true;
    }
  }
  if (added) fillActivitySites();
}

function activityRow(entry) {
  const row = document.createElement("tr");
  const kind = enumWord(entry.kind, "ACTIVITY_LOG_KIND_");
  row.dataset.kind = kind;
  row.dataset.sessionId = entry.sessionId || "";
  const session = cell("");
  const code = document.createElement("code");
  code.textContent = entry.sessionId || "";
  session.append(code);
  const details = cell(entry.summary || "");
  if (entry.readOnly) {
    const tag = document.createElement("span");
    tag.className = "tag read-only";
    tag.textContent = "read-only";
    tag.title = "The site marked this tool read-only (annotations.readOnlyHint): a hint, not enforced";
    details.append(tag);
  }
  row.append(cell(clock(entry.atMs)), cell(entry.origin || ""), session, cell(kind.replace(/_/g, " ")), details);
  return row;
}

/** Every entry of the chosen site (all sites: every entry), saved as a .jsonl file. */
async function exportActivity() {
  const origin = $("activity-site").value;
  const parts = [];
  let cursor = "";
  let count = 0;
  for (let part = 0; part < EXPORT_MAX_PARTS; part++) {
    const reply = await host.call("exportActivity", cursor ? { origin, cursor } : { origin });
    if (reply.error) {
      say("activity-outcome", `Not exported: ${reply.error.message}`);
      return;
    }
    const response = reply.response || {};
    parts.push(response.jsonl || "");
    count += Number(response.entries || 0);
    say("activity-outcome", `Exporting… ${count} entries`);
    if (!response.hasMore || !response.nextCursor) break;
    cursor = response.nextCursor;
  }
  const blob = new Blob(parts, { type: "application/jsonl" });
  const link = document.createElement("a");
  const site = origin ? origin.replace(/[^A-Za-z0-9.-]+/g, "_") : "every-site";
  link.href = URL.createObjectURL(blob);
  link.download = `pedelec-activity-${site}-${new Date().toISOString().slice(0, 10)}.jsonl`;
  link.hidden = true;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 60000);
  say("activity-outcome", `Exported ${count} entr${count === 1 ? "y" : "ies"} as ${link.download}.`);
}

$("activity-site").addEventListener("change", () => {
  activityCursor = "";
  activityPage(false).catch((e) => console.error("pedelec control center:", e));
});
$("activity-newest").addEventListener("click", () => {
  activityCursor = "";
  activityPage(false).catch((e) => console.error("pedelec control center:", e));
});
$("activity-older").addEventListener("click", () => {
  activityPage(true).catch((e) => console.error("pedelec control center:", e));
});
$("activity-export").addEventListener("click", () => {
  $("activity-export").disabled = true;
  exportActivity()
    .catch((e) => say("activity-outcome", `Not exported: ${e}`))
    .finally(() => {
      $("activity-export").disabled = false;
    });
});

// ---- start ----

async function refresh() {
  const reads = [refreshSessions(), refreshRequests()];
  // Consent changes elsewhere too (the approval page); the agents only when asked.
  if (selected() === "sites") reads.push(refreshSites());
  await Promise.all(reads);
}

/** Resolves at once while the page shows, else once it shows again. */
function pageShows() {
  if (document.visibilityState !== "hidden") return Promise.resolve();
  return new Promise((resolve) => {
    const visible = () => {
      if (document.visibilityState === "hidden") return;
      document.removeEventListener("visibilitychange", visible);
      resolve();
    };
    document.addEventListener("visibilitychange", visible);
  });
}

(async () => {
  selectTab(TABS.includes(location.hash.slice(1)) ? location.hash.slice(1) : "sessions", false);
  await refresh();
  // One round at a time: a slow Core must not pile calls up behind it.
  // Nothing is read while the page is hidden (a background tab, a
  // minimised window); it reads at once when it shows again.
  for (;;) {
    await new Promise((r) => setTimeout(r, REFRESH_MS));
    await pageShows();
    await refresh().catch((e) => console.error("pedelec control center:", e));
  }
})().catch((e) => console.error("pedelec control center:", e));
