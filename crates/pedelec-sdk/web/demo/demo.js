// The Pedelec demo page: one session on the scripted provider, driven through
// the browser extension. `window.demo` exposes the same actions for the
// end-to-end test (crates/pedelec-web-e2e), which drives this page over CDP.
import init, { Pedelec } from "../pkg/pedelec_sdk.js";

const params = new URLSearchParams(location.search);
/** The id the extension's manifest key fixes (extension/README.md). */
const EXTENSION_ID = params.get("ext") || "ighbaanpnpjegfpbhfnaekbncchadgfe";

const $ = (id) => document.getElementById(id);
const state = { chats: [], deltas: "", statuses: [], errors: [], ended: 0, counter: 0, toolCalls: 0, activities: {}, permissions: [], uploaded: [] };
let session = null;

// The module's exports; `memory` is the SDK's linear memory (web-bench reads its size).
const wasm = await init();
// `?channel=relay`: through the extension's content script, as in Firefox.
const pedelec = new Pedelec({ extensionId: EXTENSION_ID, channel: params.get("channel") || "auto" });

function log(text, cls) {
  const p = document.createElement("p");
  p.textContent = text;
  if (cls) p.className = cls;
  $("log").append(p);
}

function renderStatus(status) {
  $("status").textContent = status;
  $("status").dataset.status = status;
  $("send").disabled = status !== "idle";
  $("send-typed").disabled = $("send").disabled;
  $("cancel").disabled = status !== "running" && status !== "waiting_tool_result";
  $("steer").disabled = $("cancel").disabled;
  $("end").disabled = status === "ended" || !session;
  $("resume").disabled = status !== "ended";
  $("upload").disabled = !session || status === "ended";
  $("history").disabled = !session;
  $("changes").disabled = !session;
  $("set-model").disabled = status === "ended" || !session;
  $("fork").disabled = status !== "idle" || !session;
}

const tools = [
  {
    name: "update_counter",
    description: "Adds delta to the page's counter and returns the new value.",
    inputSchema: { type: "object", properties: { delta: { type: "number" } }, required: ["delta"] },
  },
  {
    name: "echo",
    description: "Returns its arguments (used for the round-trip benchmark).",
    inputSchema: { type: "object" },
    // An inline handler; a named onTool("echo", …) would override it.
    handler: (args) => args,
  },
];

/**
 * A permission request as a list item with a button per option; resolves
 * with the option clicked (`state.autoAnswer`, when set, answers at once).
 */
function askUser(request) {
  state.permissions.push(request);
  if (state.autoAnswer !== undefined) return state.autoAnswer;
  return new Promise((resolve) => {
    const li = document.createElement("li");
    li.textContent = `${request.activity?.title ?? "?"} `;
    for (const option of request.options) {
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = option.name;
      button.addEventListener("click", () => {
        li.remove();
        resolve(option.optionId);
      });
      li.append(button);
    }
    $("permissions").append(li);
  });
}

// What the next frame paints. A long turn streams far more deltas, and a turn
// of quick tool calls changes the status far more often, than the screen
// shows; painting each is DOM work on the thread that answers the next call.
// Deltas are painted once per frame, so text streams smoothly; the status
// badge at most every STATUS_PAINT_MS, since nobody reads a badge that
// changes sixty times a second, and each repaint (style, layout, paint) is a
// millisecond the next tool call waits behind. The last status always shows.
const STATUS_PAINT_MS = 100;
const unpainted = { deltas: "", status: null };
let paintFrame = 0;
let statusTimer = 0;
let statusPaintedAt = -Infinity;
function paint() {
  paintFrame = 0;
  if (unpainted.deltas) $("live").append(unpainted.deltas);
  unpainted.deltas = "";
}
function paintSoon() {
  if (!paintFrame) paintFrame = requestAnimationFrame(paint);
}
function paintStatus() {
  statusTimer = 0;
  if (unpainted.status === null) return;
  statusPaintedAt = performance.now();
  renderStatus(unpainted.status);
  unpainted.status = null;
}
function paintStatusSoon() {
  if (statusTimer) return;
  const wait = Math.max(0, statusPaintedAt + STATUS_PAINT_MS - performance.now());
  statusTimer = setTimeout(() => requestAnimationFrame(paintStatus), wait);
}

/** The folder picked with "Pick folder": `{ handle, name }`, or null. */
let picked = null;

/** The user picks a folder in the extension; the next session opens there. */
async function pickFolder() {
  picked = await pedelec.pickWorkspace();
  $("folder").value = "";
  $("picked").textContent = `Picked: ${picked.name}`;
  return picked;
}

async function start(options = {}) {
  // A folder of the user's instead of a managed workspace: the extension asks
  // the user to grant it to this origin, and Core checks it (SECURITY.md).
  // Or one picked in the extension's folder picker: only its opaque handle
  // and name are known here, never where it is.
  const folder = $("folder").value.trim();
  const workspace = folder ? { path: folder } : picked ? { handle: picked.handle } : null;
  session = await pedelec.createSession({
    provider: "scripted",
    permissions: "app",
    skills: { guidance: "You are the Pedelec demo agent.", tools },
    ...(workspace ? { workspace } : {}),
    ...options,
  });
  listen(session);
  // The page's answers to the agent; a fork of the session keeps them.
  session.onPermission((request) => askUser(request));
  session.onTool("update_counter", async (args) => {
    state.toolCalls += 1;
    state.counter += args.delta;
    $("counter").textContent = String(state.counter);
    return { value: state.counter };
  });
  unpainted.status = null;
  renderStatus(session.getStatus());
  renderApproval();
  return session.sessionId;
}

/** Shows what `s` says: its chat, status, errors, activities and end. */
function listen(s) {
  s.onChatDelta((delta) => {
    state.deltas += delta;
    unpainted.deltas += delta;
    paintSoon();
  });
  s.onChat((text) => {
    state.chats.push(text);
    unpainted.deltas = "";
    $("live").textContent = "";
    log(text);
  });
  s.onStatus((status, ctx) => {
    state.statuses.push(`${ctx.source}:${status}`);
    unpainted.status = status;
    paintStatusSoon();
  });
  s.onError((error, ctx) => {
    state.errors.push(`${ctx.source}:${error.code}`);
    log(`${error.code}: ${error.message}`, "error");
  });
  s.onActivity((activity) => {
    // Each update is the whole activity: replace it by id.
    state.activities[activity.activityId] = activity;
    renderActivities();
  });
  s.onEnded(() => {
    state.ended += 1;
  });
}

/**
 * Forks the session and drives the fork from here on; the original goes on
 * in Core (*List sessions* shows both). The fork answers the agent with the
 * same tool and permission handlers.
 */
async function fork() {
  const parent = session;
  const other = await parent.fork();
  session = other;
  listen(other);
  log(`forked ${parent.sessionId}: this page now drives ${other.sessionId}`, "note");
  unpainted.status = null;
  renderStatus(other.getStatus());
  return other.sessionId;
}

function renderActivities() {
  $("activities").replaceChildren(
    ...Object.values(state.activities).map((a) => {
      const li = document.createElement("li");
      const plan = a.plan.length ? ` [${a.plan.map((e) => `${e.status === "completed" ? "x" : " "} ${e.content}`).join("; ")}]` : "";
      li.textContent = `${a.kind} ${a.title}${plan} — ${a.status ?? ""}`;
      li.dataset.status = a.status ?? "";
      return li;
    }),
  );
}

async function send(text, attachments = []) {
  log(attachments.length ? `${text} [${attachments.join(", ")}]` : text, "you");
  await session.sendText(text, { attachments });
}

/** Sends `text` as a typed turn and shows the value it resolves with. */
async function sendTyped(text, outputSchema) {
  log(`${text} (typed)`, "you");
  const value = await session.sendText(text, { outputSchema });
  log(`value: ${JSON.stringify(value)}`, "note");
  return value;
}

/** Sends `text` without waiting; resolves to how the turn ended (for the test). */
function sendInBackground(text) {
  log(text, "you");
  return attempt(() => session.sendText(text));
}

async function refreshAssets() {
  const list = await session.listAssets();
  $("assets").replaceChildren(
    ...list.map((a) => {
      const li = document.createElement("li");
      li.textContent = `${a.path} (${a.size} bytes)`;
      return li;
    }),
  );
  return list;
}

/** One history entry as a line of the list. */
function describe(entry) {
  switch (entry.kind) {
    case "user_text": return `you: ${entry.text}`;
    case "assistant_message": return `agent: ${entry.text}${entry.interrupted ? " (cancelled)" : ""}`;
    case "tool_call": return `tool call ${entry.tool} ${JSON.stringify(entry.args)}`;
    case "tool_result": return `tool result ${entry.errorCode ?? JSON.stringify(entry.result)}`;
    case "activity": return `${entry.activity}: ${entry.summary}`;
    case "tool_failed": return `tool ${entry.tool} failed: ${entry.reason}`;
    case "operation_completed": return entry.error ? `failed: ${entry.error.code}` : "succeeded";
    case "ended": return `ended (${entry.reason})`;
    default: return entry.kind;
  }
}

/** Loads the whole history, page by page (newest page first), and lists it. */
async function loadHistory() {
  const entries = [];
  let beforeId;
  for (;;) {
    const page = await session.getHistory({ beforeId, limit: 100 });
    entries.unshift(...page.entries);
    if (!page.hasMore) break;
    beforeId = page.entries[0].id;
  }
  $("entries").replaceChildren(
    ...entries.map((e) => {
      const li = document.createElement("li");
      li.textContent = `#${e.seq} ${describe(e)}`;
      return li;
    }),
  );
  return entries;
}

/** The last turn's changes, a file each with its diff. */
async function showChanges() {
  const changes = await session.getChanges();
  $("change-list").replaceChildren(
    ...changes.files.map((f) => {
      const li = document.createElement("li");
      const note = f.secret ? " (secret: content not shown)" : f.binary ? " (binary)" : "";
      li.textContent = `${f.kind} ${f.path}${note}`;
      if (f.diff) {
        const pre = document.createElement("pre");
        pre.textContent = f.diff;
        li.append(pre);
      }
      return li;
    }),
  );
  return changes;
}

/** Lists this origin's sessions. */
async function listSessions() {
  const sessions = await pedelec.listSessions();
  $("session-list").replaceChildren(
    ...sessions.map((s) => {
      const li = document.createElement("li");
      li.textContent = `${s.sessionId} ${s.provider} ${s.status}`;
      return li;
    }),
  );
  return sessions;
}

async function upload(file, targetPath) {
  const path = await session.uploadAsset(file, targetPath);
  if (!state.uploaded.includes(path)) state.uploaded.push(path);
  await refreshAssets();
  return path;
}

/** Runs an action and reports `{ ok, value }` or `{ ok: false, code, message }` (for the test). */
async function attempt(action) {
  try {
    return { ok: true, value: await action() };
  } catch (e) {
    return { ok: false, code: e.code, message: e.message, details: e.details };
  }
}

$("start").addEventListener("click", () => attempt(start));
$("pick-folder").addEventListener("click", () =>
  attempt(pickFolder).then((r) => r.ok || log(`${r.code}: ${r.message}`, "error")),
);
$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("text").value;
  $("text").value = "";
  // With the box ticked, the uploaded files go with the text as attachments.
  const attachments = $("attach").checked ? state.uploaded : [];
  attempt(() => send(text, attachments));
});
// The text as a typed turn: the answer must match the schema in the box.
$("send-typed").addEventListener("click", () => {
  const text = $("text").value;
  $("text").value = "";
  attempt(() => sendTyped(text, JSON.parse($("schema").value))).then((r) => r.ok || log(`${r.code}: ${r.message}`, "error"));
});
$("cancel").addEventListener("click", () => attempt(() => session.cancel()));
// The box's text joins the running turn (try "/wait-steer 10000" first).
$("steer").addEventListener("click", () => {
  const text = $("text").value;
  $("text").value = "";
  log(`${text} (steered)`, "you");
  attempt(() => session.steer(text)).then((r) => r.ok || log(`${r.code}: ${r.message}`, "error"));
});
$("sessions").addEventListener("click", () => attempt(listSessions));
$("end").addEventListener("click", () => attempt(() => session.end()));
$("resume").addEventListener("click", () => attempt(() => session.resume()));
$("history").addEventListener("click", () => attempt(loadHistory));
$("changes").addEventListener("click", () => attempt(showChanges));
$("set-model").addEventListener("click", () =>
  attempt(async () => {
    const info = await session.setModel($("model").value);
    log(`model for the next turns: ${info.model}`, "note");
    return info;
  }).then((r) => r.ok || log(`${r.code}: ${r.message}`, "error")),
);
$("fork").addEventListener("click", () =>
  attempt(fork).then((r) => r.ok || log(`${r.code}: ${r.message}`, "error")),
);
$("upload").addEventListener("click", () => {
  const file = $("file").files[0];
  if (file) attempt(() => upload(file));
});

async function renderApproval() {
  const s = await pedelec.getApprovalStatus();
  $("approval").textContent = s.installed
    ? s.approved
      ? `approved: ${s.origin}`
      : `not approved yet: ${s.origin}`
    : "extension not installed";
}
renderApproval();

window.demo = {
  pedelec,
  state,
  attempt,
  pickFolder,
  start,
  send,
  sendTyped,
  sendInBackground,
  upload,
  refreshAssets,
  loadHistory,
  showChanges,
  listSessions,
  fork,
  session: () => session,
  wasmMemoryBytes: () => wasm.memory.buffer.byteLength,
};
