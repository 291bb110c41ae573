// Pedelec extension service worker.
//
// Web pages connect with chrome.runtime.connect(EXTENSION_ID), or through the
// content script relay.js where the browser has no externally_connectable. Each page port
// gets its own native port (one pedelec-native-host process), so request ids
// never need remapping, events can only reach the page that subscribed, and a
// closed page closes its host: the host sees EOF, Core sees the subscriptions
// end, and auto-end-on-disconnect does the rest. The page's origin comes only
// from port.sender.origin and is stamped into every request's callerOrigin.
// Message shapes are documented in README.md.
"use strict";

// requests.js (the request allowlist) and shown.js: Firefox loads them first
// through `background.scripts`; Chromium's service worker imports them here.
if (typeof PedelecRequests === "undefined") importScripts("requests.js");
if (typeof PedelecShown === "undefined") importScripts("shown.js");

/** The host name pedelec-native-host registers (crates/pedelec-native-host/src/registration.rs). */
const HOST_NAME = "dev.pedelec.host";
/** This extension's id, fixed by the manifest key (see README.md). */
const EXTENSION_ID = "ighbaanpnpjegfpbhfnaekbncchadgfe";
const APPROVAL_PAGE = "approve.html";
/** How long a prompt waits for the user; `approvalTimeoutMs` in storage.local overrides it (tests). */
const APPROVAL_TIMEOUT_MS = 120000;
let approvalTimeoutMs = APPROVAL_TIMEOUT_MS;
const RECONNECT_DELAYS_MS = [100, 250, 500, 1000, 2000, 4000, 8000];
/** A live subscription error that is not followed by the host exiting within this is forwarded. */
const SUBSCRIPTION_ERROR_GRACE_MS = 1500;
const MAX_REMEMBERED_SESSIONS = 1000;
/** Page request ids are 1 … 2^31-1; the worker numbers its own requests (pings) from 2^31. */
const INTERNAL_IDS = 0x80000000;

if (chrome.runtime.id !== EXTENSION_ID) {
  console.warn(`pedelec: running as ${chrome.runtime.id}, expected ${EXTENSION_ID} (manifest key changed?)`);
}

// ---- state that must survive a worker restart (chrome.storage) ----

/** sessionId -> origin: whose events a subscription may carry (a cache; Core binds sessions itself). */
let sessionOrigins = {};
/** `${origin}\n${path}` -> { origin, path, timer, tabId } of open workspace prompts. */
const grantPrompts = new Map();
/** origin -> { timer, tabId, deadline } (mirrored to storage.session without the timer) */
const approvals = new Map();
/** Every connected page. */
const pages = new Set();
/**
 * Message counts since the worker started, for diagnostics and benchmarks
 * (`cargo xtask web-bench` reads them through DevTools). Nothing else uses them.
 */
const stats = { hostMessages: 0 };
globalThis.pedelecStats = stats;

/** Set once `ready` has settled (see acceptPage). */
let loaded = false;
const ready = (async () => {
  const local = await chrome.storage.local.get(["sessionOrigins", "approvalTimeoutMs", "promptCooldownMs"]);
  approvalTimeoutMs = local.approvalTimeoutMs || APPROVAL_TIMEOUT_MS;
  sessionOrigins = local.sessionOrigins || {};
  const session = await chrome.storage.session.get(["pendingApprovals", "promptCooldowns"]);
  loadPromptState(local, session);
  // An approval tab opened before a restart stays valid until its deadline.
  for (const [origin, entry] of Object.entries(session.pendingApprovals || {})) {
    const left = entry.deadline - Date.now();
    if (left > 0) armApproval(origin, entry.tabId, entry.deadline);
  }
  await savePending();
  // What the user decided lives in Core; a worker that cannot reach it yet
  // knows of no approval, so a page prompts and the decision is stored then.
  await refreshConsent();
  loaded = true;
})();

async function saveLocal() {
  const ids = Object.keys(sessionOrigins);
  for (const id of ids.slice(0, Math.max(0, ids.length - MAX_REMEMBERED_SESSIONS))) delete sessionOrigins[id];
  await chrome.storage.local.set({ sessionOrigins });
}

/**
 * `path` with `.` and `..` folded and no trailing slash, or null when it is
 * not an absolute POSIX path. Lexical only: Core resolves symlinks and
 * checks again, so this decides only what the prompt shows and asks.
 */
function normalizePath(path) {
  if (typeof path !== "string" || !path.startsWith("/") || path.includes("\0")) return null;
  const parts = [];
  for (const part of path.split("/")) {
    if (part === "" || part === ".") continue;
    if (part === "..") parts.pop();
    else parts.push(part);
  }
  return "/" + parts.join("/");
}

function isGranted(origin, path) {
  return grantsOf(origin).some((root) => isAncestorOrSelf(root, path));
}

async function savePending() {
  const pendingApprovals = {};
  for (const [origin, e] of approvals) pendingApprovals[origin] = { tabId: e.tabId, deadline: e.deadline };
  await chrome.storage.session.set({ pendingApprovals });
}

function isApproved(origin) {
  return !!(consent[origin] && consent[origin].approved);
}

function rememberSession(sessionId, origin) {
  if (!sessionId || sessionOrigins[sessionId] === origin) return;
  sessionOrigins[sessionId] = origin;
  saveLocal().catch((e) => console.error("pedelec: saving session origins failed", e));
}

function errorFrame(requestId, code, message, details) {
  const error = { code, message };
  if (details !== undefined) error.detailsJson = JSON.stringify(details);
  return { requestId, error };
}

// ---- one connected page ----

class PageLink {
  constructor(port, origin) {
    this.port = port;
    this.origin = origin;
    this.host = null;
    this.hostEpoch = 0;
    /** Frames waiting for this origin's approval. */
    this.queue = [];
    /** `pickWorkspace` ids waiting for this origin's approval. */
    this.pickQueue = [];
    /** requestId -> { call, sessionId } of requests the host has not answered. */
    this.pending = new Map();
    /** requestId -> Subscribe frame of live subscriptions (re-sent after a host reconnect). */
    this.subs = new Map();
    /** Subscriptions re-sent on a fresh host: their snapshot reply becomes an event. */
    this.resubscribing = new Set();
    this.chunks = new Map();
    /** Acknowledgements of the host frame being relayed, for the next frame to the page. */
    this.acks = null;
    this.reconnectAttempt = 0;
    this.reconnectTimer = null;
    this.pingWaiters = [];
    /** Internal request id -> settles an owner call made through this host (ownerCall). */
    this.ownerWaiters = new Map();
    this.hostAnswered = false;
    this.refused = null;
    this.closed = false;
    this.internalId = INTERNAL_IDS;
  }

  toPage(message) {
    if (this.closed) return;
    try {
      this.port.postMessage(message);
    } catch (e) {
      console.warn("pedelec: page port is gone", e);
    }
  }

  sendFrame(frame) {
    // Acknowledgements the host frame being handled carried ride on the
    // first frame this port sends (see fromHost).
    if (this.acks) {
      frame.acks = this.acks;
      this.acks = null;
    }
    this.toPage({ type: "frame", frame });
  }

  async fromPage(message) {
    if (!message || typeof message !== "object") return;
    if (message.type === "status") {
      this.toPage(await this.status());
      return;
    }
    if (message.type === "pickWorkspace") {
      this.pickWorkspace(message.id);
      return;
    }
    if (message.type !== "frame") return;
    const id = message.frame && message.frame.requestId;
    if (!Number.isInteger(id) || id <= 0 || id >= INTERNAL_IDS) return;
    // Only what requests.js rebuilds from its allowlist goes on; a refused
    // frame changes nothing (no prompt, no host, nothing stored).
    const built = PedelecRequests.buildFrame(message.frame, this.origin);
    if (built.error) {
      this.sendFrame(errorFrame(id, "INVALID_ARGUMENT", built.error.message, built.error.details));
      return;
    }
    const frame = built.frame;
    // Every request passes the gate, including send, tool result and end.
    if (this.refused) {
      this.sendFrame(this.refusal(id));
      return;
    }
    if (!isApproved(this.origin)) {
      // A site the user just rejected (or let time out) may not prompt again yet.
      if (promptCoolingDown(this.origin)) {
        this.sendFrame(this.refusal(id, "cooldown"));
        return;
      }
      this.queue.push(frame);
      this.toPage({ type: "approval", origin: this.origin, state: "pending" });
      requestApproval(this.origin);
      return;
    }
    this.forward(frame);
  }

  /**
   * `pickWorkspace()`: once the origin is approved, the user picks a
   * folder in the picker page; the answer is `{ type: "picked", id,
   * handle, name }` or `{ type: "picked", id, error }`.
   */
  pickWorkspace(id) {
    if (!Number.isInteger(id)) return;
    if (this.refused) {
      this.toPage({ type: "picked", id, error: this.refusal(0).error });
      return;
    }
    if (!isApproved(this.origin)) {
      if (promptCoolingDown(this.origin)) {
        this.toPage({ type: "picked", id, error: this.refusal(0, "cooldown").error });
        return;
      }
      this.pickQueue.push(id);
      this.toPage({ type: "approval", origin: this.origin, state: "pending" });
      requestApproval(this.origin);
      return;
    }
    openPicker(this, id).catch((e) => {
      console.error("pedelec: opening the folder picker failed", e);
      this.toPage({ type: "picked", id, ...pickCancelled("unavailable", String(e)) });
    });
  }

  /** Holds a createSession for a workspace the user has not granted, and asks. */
  awaitGrant(path, frame) {
    const key = `${this.origin}\n${path}`;
    if (!this.grantQueue) this.grantQueue = new Map();
    const queued = this.grantQueue.get(key) || [];
    queued.push(frame);
    this.grantQueue.set(key, queued);
    // The user may have granted it since this worker last read Core's copy
    // (the control center's Sites view): read it again before asking.
    refreshConsent()
      .then(() => {
        if (isGranted(this.origin, path)) {
          this.grantDecided(path, true);
          return;
        }
        this.toPage({ type: "approval", origin: this.origin, path, state: "pending" });
        return requestGrant(this.origin, path);
      })
      .catch((e) => console.error("pedelec: opening the workspace prompt failed", e));
  }

  grantDecided(path, granted) {
    const key = `${this.origin}\n${path}`;
    const queued = (this.grantQueue && this.grantQueue.get(key)) || [];
    if (this.grantQueue) this.grantQueue.delete(key);
    for (const frame of queued) {
      if (granted) this.forward(frame);
      else {
        this.sendFrame(
          errorFrame(frame.requestId, "WORKSPACE_NOT_ALLOWED", `the user did not grant ${path} to ${this.origin}`, {
            path,
            reason: "refused",
          }),
        );
      }
    }
  }

  refusal(id, reason = this.refused) {
    return errorFrame(id, "ORIGIN_NOT_ALLOWED", `origin ${this.origin} is not approved (${reason})`, {
      origin: this.origin,
      reason,
    });
  }

  async status() {
    const approved = isApproved(this.origin);
    let appConnected = false;
    if (approved) appConnected = await this.ping();
    const pending = approvals.has(this.origin) || promptQueued("origin", this.origin);
    return { type: "status", origin: this.origin, approved, pending, appConnected };
  }

  /** Pings Core through this page's host, answering false after 2 s. */
  ping() {
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(false), 2000);
      this.pingWaiters.push((ok) => {
        clearTimeout(timer);
        resolve(ok);
      });
      this.ensureHost();
      this.internalId = this.internalId >= 0xfffffff0 ? INTERNAL_IDS : this.internalId + 1;
      this.host.postMessage({ requestId: this.internalId, request: { ping: {} } });
    });
  }

  /**
   * An owner call of the worker's own (never the page's) through this
   * page's host, so watching for the user's requests costs no process of
   * its own: `{ response }` or `{ error }`, never a rejection.
   */
  ownerCall(call, body) {
    this.internalId = this.internalId >= 0xfffffff0 ? INTERNAL_IDS : this.internalId + 1;
    return sendOwnerCall(this.host, this.ownerWaiters, this.internalId, call, body);
  }

  forward(frame) {
    const id = frame.requestId;
    const call = Object.keys(frame.request)[0];
    const body = frame.request[call];
    // The page never chooses its origin; the browser's sender information does.
    body.callerOrigin = this.origin;
    if (call === "createSession" && body.workspace && typeof body.workspace === "object") {
      // A folder the user has not granted this origin is asked about first.
      // Core holds the grants and checks again; a request carries none.
      const path = normalizePath(body.workspace.path);
      if (body.workspace.path && path && !isGranted(this.origin, path)) {
        this.awaitGrant(path, frame);
        return;
      }
    }
    if (call === "subscribe") this.subs.set(id, frame);
    if (call === "unsubscribe") {
      this.subs.delete(body.subscriptionId);
      this.resubscribing.delete(body.subscriptionId);
    }
    this.pending.set(id, { call, sessionId: body.sessionId });
    this.ensureHost();
    this.host.postMessage(frame);
  }

  ensureHost() {
    if (this.host) return;
    const epoch = ++this.hostEpoch;
    const port = chrome.runtime.connectNative(HOST_NAME);
    port.onMessage.addListener((frame) => {
      stats.hostMessages++;
      if (epoch === this.hostEpoch) this.fromHost(frame);
    });
    port.onDisconnect.addListener(() => {
      const reason = (chrome.runtime.lastError && chrome.runtime.lastError.message) || "disconnected";
      if (epoch === this.hostEpoch) this.hostLost(reason);
    });
    this.host = port;
    this.hostAnswered = false;
  }

  fromHost(frame) {
    if (frame.chunk) {
      this.acceptChunk(frame.chunk);
      return;
    }
    // Requests sent with `deferAck` that succeeded (native.proto): only
    // this port's own pending ones, settled here and passed on with the
    // frame they came in, or alone when that frame goes nowhere.
    if (Array.isArray(frame.acks)) {
      const acks = frame.acks.filter((id) => this.pending.delete(id));
      // Cleared, not deleted: a deleted property turns the frame into a
      // dictionary-mode object, slower to serialise on the way to the page.
      frame.acks = undefined;
      this.acks = acks.length > 0 ? acks : null;
      this.relayFromHost(frame);
      if (this.acks) {
        const alone = { acks: this.acks };
        this.acks = null;
        this.toPage({ type: "frame", frame: alone });
      }
      return;
    }
    this.relayFromHost(frame);
  }

  relayFromHost(frame) {
    this.hostAnswered = true;
    const id = frame.requestId || 0;
    if (id >= INTERNAL_IDS) {
      const owned = this.ownerWaiters.get(id);
      if (owned) {
        this.ownerWaiters.delete(id);
        owned(frame);
        return;
      }
      const ok = !!frame.response;
      for (const w of this.pingWaiters.splice(0)) w(ok);
      return;
    }
    // Events go only to a port of the session's origin. A batch names its
    // session in the envelope and its events cannot name another (the SDK
    // refuses such a batch), so the gate holds without decoding `events`.
    const events = frame.event || frame.batch;
    if (events) {
      const owner = sessionOrigins[events.sessionId];
      if (!this.subs.has(id) || (owner && owner !== this.origin)) return;
      this.sendFrame(frame);
      return;
    }
    if (frame.response) {
      if (this.resubscribing.delete(id)) {
        this.reconnectAttempt = 0;
        if (frame.response.subscribe) this.sendFrame({ requestId: id, event: frame.response.subscribe });
        return;
      }
      const request = this.pending.get(id);
      this.pending.delete(id);
      const made = frame.response.createSession || frame.response.fork;
      const created = made && made.session;
      if (created) rememberSession(created.sessionId, this.origin);
      if (frame.response.subscribe && request) rememberSession(request.sessionId, this.origin);
      this.sendFrame(frame);
      return;
    }
    if (frame.error) {
      if (this.pending.delete(id)) {
        this.subs.delete(id);
        this.sendFrame(frame);
        return;
      }
      if (this.resubscribing.delete(id) || this.subs.has(id)) {
        // Core going away errors every live subscription, then the host exits and
        // we re-subscribe. Forward the error only when the host stays.
        const epoch = this.hostEpoch;
        setTimeout(() => {
          if (epoch === this.hostEpoch && this.host && this.subs.delete(id)) this.sendFrame(frame);
        }, SUBSCRIPTION_ERROR_GRACE_MS);
      }
    }
  }

  acceptChunk(chunk) {
    const key = chunk.messageId || 0;
    let set = this.chunks.get(key);
    if (!set) {
      set = { count: chunk.count || 0, parts: [] };
      this.chunks.set(key, set);
    }
    set.parts[chunk.index || 0] = chunk.data || "";
    if (set.parts.filter((p) => p !== undefined).length === set.count) {
      this.chunks.delete(key);
      try {
        this.fromHost(JSON.parse(set.parts.join("")));
      } catch (e) {
        console.error("pedelec: bad chunked frame from the host", e);
      }
    }
  }

  hostLost(reason) {
    this.host = null;
    this.chunks.clear();
    for (const w of this.pingWaiters.splice(0)) w(false);
    for (const [, owned] of this.ownerWaiters) owned({ error: { code: "CORE_RUNTIME_UNAVAILABLE", message: reason } });
    this.ownerWaiters.clear();
    for (const [id] of this.pending) {
      this.subs.delete(id);
      this.sendFrame(errorFrame(id, "CORE_RUNTIME_UNAVAILABLE", `the native host exited: ${reason}`));
    }
    this.pending.clear();
    this.resubscribing.clear();
    if (this.closed) return;
    if (this.subs.size > 0) this.scheduleReconnect(reason);
  }

  /** Reconnects with backoff and re-subscribes, so the SDK receives fresh snapshots. */
  scheduleReconnect(reason) {
    if (this.reconnectTimer) return;
    if (this.reconnectAttempt >= RECONNECT_DELAYS_MS.length) {
      for (const [id] of this.subs) {
        this.sendFrame(errorFrame(id, "CORE_RUNTIME_UNAVAILABLE", `the native host keeps exiting: ${reason}`));
      }
      this.subs.clear();
      return;
    }
    const delay = RECONNECT_DELAYS_MS[this.reconnectAttempt++];
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = null;
      if (this.closed || this.subs.size === 0) return;
      this.ensureHost();
      for (const [id, frame] of this.subs) {
        frame.request.subscribe.callerOrigin = this.origin;
        this.resubscribing.add(id);
        this.host.postMessage(frame);
      }
    }, delay);
  }

  approvalDecided(approved, reason) {
    const queued = this.queue.splice(0);
    const picks = this.pickQueue.splice(0);
    if (approved) {
      this.refused = null;
      this.toPage({ type: "approval", origin: this.origin, state: "approved" });
      for (const frame of queued) this.forward(frame);
      for (const id of picks) this.pickWorkspace(id);
      return;
    }
    for (const id of picks) this.toPage({ type: "picked", id, error: this.refusal(0, reason).error });
    // Remembered for this port, so a refused page cannot reopen the prompt in
    // a loop. A cooldown is not: it ends, and the site's own cooldown holds meanwhile.
    if (reason !== "cooldown") this.refused = reason;
    this.toPage({ type: "approval", origin: this.origin, state: reason });
    for (const frame of queued) this.sendFrame(this.refusal(frame.requestId, reason));
  }

  revoked() {
    this.refused = "revoked";
    this.toPage({ type: "approval", origin: this.origin, state: "revoked" });
    this.close();
    try {
      this.port.disconnect();
    } catch (_) {
      // Already gone.
    }
  }

  close() {
    if (this.closed) return;
    this.closed = true;
    pages.delete(this);
    // A picker opened for this page has no one to answer any more.
    for (const [pick, entry] of pickers) if (entry.page === this) settlePick(pick, null);
    clearTimeout(this.reconnectTimer);
    // The host sees EOF and exits; Core sees this page's subscriptions end.
    if (this.host) {
      this.hostEpoch++;
      this.host.disconnect();
      this.host = null;
    }
  }
}

// ---- approval ----

function armApproval(origin, tabId, deadline) {
  const timer = setTimeout(() => {
    decide(origin, false, "timeout").catch((e) => console.error(e));
  }, Math.max(0, deadline - Date.now()));
  approvals.set(origin, { timer, tabId, deadline });
}

function requestApproval(origin) {
  if (approvals.has(origin) || promptQueued("origin", origin)) return;
  enqueuePrompt({ kind: "origin", origin });
}

async function openApproval(origin) {
  armApproval(origin, null, Date.now() + approvalTimeoutMs);
  const url = chrome.runtime.getURL(`${APPROVAL_PAGE}?origin=${encodeURIComponent(origin)}`);
  const tab = await chrome.tabs.create({ url, active: true });
  const entry = approvals.get(origin);
  if (entry) entry.tabId = tab.id;
  await savePending();
}

async function decide(origin, approved, reason) {
  const entry = approvals.get(origin);
  if (entry) {
    clearTimeout(entry.timer);
    approvals.delete(origin);
    if (entry.tabId != null) chrome.tabs.remove(entry.tabId).catch(() => {});
  }
  if (approved) {
    // Approved only once Core stored it: Core is what every request is checked against.
    const stored = await setConsent(origin, { approved: true, folders: foldersOf(origin) });
    if (!stored) reason = "unavailable";
    approved = stored;
  }
  await savePending();
  for (const page of [...pages]) if (page.origin === origin) page.approvalDecided(approved, reason);
  promptDecided(origin, approved ? "approved" : reason);
}

async function requestGrant(origin, path) {
  const key = `${origin}\n${path}`;
  if (grantPrompts.has(key) || promptQueued("grant", origin, path)) return;
  enqueuePrompt({ kind: "grant", origin, path });
}

async function openGrant(origin, path) {
  const key = `${origin}\n${path}`;
  const timer = setTimeout(() => {
    decideGrant(origin, path, null).catch((e) => console.error(e));
  }, approvalTimeoutMs);
  grantPrompts.set(key, { origin, path, timer, tabId: null });
  const query = `origin=${encodeURIComponent(origin)}&path=${encodeURIComponent(path)}`;
  const tab = await chrome.tabs.create({ url: chrome.runtime.getURL(`${APPROVAL_PAGE}?${query}`), active: true });
  const entry = grantPrompts.get(key);
  if (entry) entry.tabId = tab.id;
}

/** `root` null refuses; otherwise it is `path` or one of its parents (the user's choice). */
async function decideGrant(origin, path, root) {
  const key = `${origin}\n${path}`;
  const entry = grantPrompts.get(key);
  if (entry) {
    clearTimeout(entry.timer);
    grantPrompts.delete(key);
    if (entry.tabId != null) chrome.tabs.remove(entry.tabId).catch(() => {});
  }
  let granted = root !== null && normalizePath(root) !== null && isAncestorOrSelf(normalizePath(root), path);
  if (granted) {
    // Core's copy now: the control center may have changed it since it was last read.
    await refreshConsent();
    // Core resolves the folder and refuses one that could never be a workspace.
    const folders = foldersOf(origin).filter((f) => f.path !== normalizePath(root));
    folders.push({ path: normalizePath(root), mayApproveCommands: false });
    granted = await setConsent(origin, { approved: isApproved(origin), folders });
  }
  for (const page of [...pages]) if (page.origin === origin) page.grantDecided(path, granted);
  promptDecided(origin, granted ? "granted" : "refused");
}

function isAncestorOrSelf(root, path) {
  return path === root || path.startsWith(root === "/" ? "/" : root + "/");
}

async function revokeGrant(origin, root) {
  const folders = foldersOf(origin).filter((f) => f.path !== root);
  return setConsent(origin, { approved: isApproved(origin), folders });
}

/** Lets (or stops) `origin`'s pages approve its agent's commands in the granted folder `root`. */
async function setMayApproveCommands(origin, root, may) {
  const folders = foldersOf(origin).map((f) => (f.path === root ? { ...f, mayApproveCommands: may } : f));
  return setConsent(origin, { approved: isApproved(origin), folders });
}

async function revoke(origin) {
  // Core forgets the origin and ends every live session of it, however
  // many; connected pages still receive the ended events, then are cut off.
  const reply = await owner.call("revokeOrigin", { origin });
  delete consent[origin];
  for (const id of Object.keys(sessionOrigins)) if (sessionOrigins[id] === origin) delete sessionOrigins[id];
  await saveLocal();
  for (const page of [...pages]) if (page.origin === origin) page.revoked();
  clearPromptCooldown(origin);
  if (reply.error) throw new Error(`Core did not revoke ${origin}: ${reply.error.message}`);
}

// ---- consent: the user's decisions, held by Core (issue 38) ----
//
// Core stores which origins are approved, the folders each may open and
// where its pages may approve the agent's commands, and checks every
// request against them; `consent` is the worker's copy, only to know when
// to prompt. It changes only through owner calls the worker makes on a
// native port of its own, with the caller origin OWNER_ORIGIN: a page's
// request is rebuilt by requests.js, which has no owner call, and its
// `callerOrigin` is always its own, so a page can never make one.

const OWNER_ORIGIN = "app:pedelec-extension";
/** How long an owner call waits for Core (starting it included). */
const OWNER_CALL_TIMEOUT_MS = 15000;
/** origin -> { approved, approvedAtMs, folders: [{ path, mayApproveCommands }] } as Core last said. */
let consent = {};

/** A native host for the worker's own calls, opened when one is made and closed once all are answered. */
class OwnerLink {
  constructor() {
    this.port = null;
    this.nextId = 1;
    this.waiting = new Map();
  }

  /** `{ response }` or `{ error }`, never a rejection. */
  call(call, body) {
    if (!this.port) this.open();
    const id = this.nextId;
    this.nextId = this.nextId >= 0x7ffffff0 ? 1 : this.nextId + 1;
    // The user's decisions are rare: a host per batch of them, gone once answered.
    const settled = () => {
      if (this.waiting.size === 0) queueMicrotask(() => this.close());
    };
    return sendOwnerCall(this.port, this.waiting, id, call, body, settled);
  }

  open() {
    const port = chrome.runtime.connectNative(HOST_NAME);
    port.onMessage.addListener((frame) => {
      const done = this.waiting.get(frame.requestId);
      if (!done) return;
      this.waiting.delete(frame.requestId);
      done(frame);
    });
    port.onDisconnect.addListener(() => {
      if (this.port === port) this.port = null;
      const message = (chrome.runtime.lastError && chrome.runtime.lastError.message) || "the native host exited";
      for (const [, done] of this.waiting) done({ error: { code: "CORE_RUNTIME_UNAVAILABLE", message } });
      this.waiting.clear();
    });
    this.port = port;
  }

  close() {
    if (this.port && this.waiting.size === 0) {
      this.port.disconnect();
      this.port = null;
    }
  }
}

/**
 * Sends the owner call `call` as request `id` on the native `port`, its
 * settlement kept in `waiters` (request id -> settle(frame), removed by
 * whoever receives the reply); `{ response }` or `{ error }`, never a
 * rejection, within OWNER_CALL_TIMEOUT_MS. `settled` runs after either.
 */
function sendOwnerCall(port, waiters, id, call, body, settled = () => {}) {
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      waiters.delete(id);
      resolve({ error: { code: "CORE_RUNTIME_UNAVAILABLE", message: "Core did not answer in time" } });
      settled();
    }, OWNER_CALL_TIMEOUT_MS);
    waiters.set(id, (frame) => {
      clearTimeout(timer);
      resolve(frame.error ? { error: frame.error } : { response: frame.response && frame.response[call] });
      settled();
    });
    try {
      port.postMessage({ requestId: id, request: { [call]: { callerOrigin: OWNER_ORIGIN, ...body } } });
    } catch (e) {
      const settle = waiters.get(id);
      waiters.delete(id);
      if (settle) settle({ error: { code: "CORE_RUNTIME_UNAVAILABLE", message: String(e) } });
    }
  });
}

const owner = new OwnerLink();

function foldersOf(origin) {
  return ((consent[origin] && consent[origin].folders) || []).map((f) => ({
    path: f.path,
    mayApproveCommands: !!f.mayApproveCommands,
  }));
}

function grantsOf(origin) {
  return foldersOf(origin).map((f) => f.path);
}

function remember(stored) {
  if (!stored || !stored.origin) return;
  if (!stored.approved && (!stored.folders || stored.folders.length === 0)) delete consent[stored.origin];
  else consent[stored.origin] = stored;
}

/** Reads every origin's consent from Core (kept as it was when Core cannot answer). */
async function refreshConsent() {
  const reply = await owner.call("getConsent", {});
  if (reply.error) {
    console.warn("pedelec: could not read consent from Core", reply.error);
    return false;
  }
  consent = {};
  for (const stored of (reply.response && reply.response.origins) || []) remember(stored);
  return true;
}

/**
 * Stores one origin's whole consent in Core; true once Core has it.
 * SetConsent replaces it as a whole, so the agents and session limit the
 * user chose in the control center are sent back as Core last gave them.
 */
async function setConsent(origin, { approved, folders }) {
  const known = consent[origin] || {};
  const limits = {};
  if (Array.isArray(known.providers) && known.providers.length > 0) limits.providers = known.providers;
  if (known.maxLiveSessions) limits.maxLiveSessions = known.maxLiveSessions;
  const reply = await owner.call("setConsent", { consent: { origin, approved, folders, ...limits } });
  if (reply.error) {
    console.warn(`pedelec: Core refused the consent for ${origin}`, reply.error);
    return false;
  }
  remember(reply.response && reply.response.consent);
  return true;
}

// ---- prompts a page cannot force (issue 38) ----
//
// One approval tab at a time, whatever asks: origin approvals and folder
// grants wait in one queue, so a page (or many subdomains of one site) can
// neither stack tabs nor put one over another. After a rejection or a
// timeout the origin's whole site (PedelecRequests.siteOf) may not prompt
// for `promptCooldownMs` (storage.local, tests shorten it; default 10 min):
// its requests are refused with ORIGIN_NOT_ALLOWED, reason "cooldown".
// Approving an origin of the site, or revoking one on the extension's page,
// ends it early. Cooldowns live in storage.session, so a worker restart
// does not lift them.

const PROMPT_COOLDOWN_MS = 10 * 60 * 1000;
let promptCooldownMs = PROMPT_COOLDOWN_MS;
/** site -> when its last prompt was rejected or timed out (ms since epoch). */
let promptCooldowns = {};
/** Prompts waiting for the open one to close: { kind: "origin" | "grant" | "permission", origin, path?, id? }. */
const promptQueue = [];

function loadPromptState(local, session) {
  promptCooldownMs = typeof local.promptCooldownMs === "number" ? local.promptCooldownMs : PROMPT_COOLDOWN_MS;
  promptCooldowns = session.promptCooldowns || {};
}

function promptCoolingDown(origin) {
  const at = promptCooldowns[PedelecRequests.siteOf(origin)];
  return at !== undefined && Date.now() - at < promptCooldownMs;
}

function promptQueued(kind, origin, path) {
  return promptQueue.some((p) => p.kind === kind && p.origin === origin && p.path === path);
}

function enqueuePrompt(prompt) {
  promptQueue.push(prompt);
  openNextPrompt().catch((e) => console.error("pedelec: opening a prompt failed", e));
}

/** Opens the first queued prompt someone still waits for, when no prompt is open. */
async function openNextPrompt() {
  while (approvals.size === 0 && grantPrompts.size === 0 && !permissionPrompt && promptQueue.length > 0) {
    const { kind, origin, path, id } = promptQueue.shift();
    if (kind === "permission") {
      // Still waiting in Core (it may have timed out or been cancelled meanwhile).
      if (userPermissions.has(id)) await openPermission(id);
      continue;
    }
    const waiting = [...pages].filter((p) =>
      kind === "origin"
        ? p.origin === origin && (p.queue.length > 0 || p.pickQueue.length > 0)
        : p.origin === origin && p.grantQueue && p.grantQueue.has(`${origin}\n${path}`),
    );
    if (waiting.length === 0) continue;
    if (kind === "origin" && promptCoolingDown(origin)) {
      // Queued before another origin of its site was rejected.
      for (const page of waiting) page.approvalDecided(false, "cooldown");
      continue;
    }
    // Each opener registers its prompt before its first await, so the loop
    // condition holds off a second tab at once.
    if (kind === "origin") await openApproval(origin);
    else await openGrant(origin, path);
  }
}

/** A prompt closed: start or clear the site's cooldown, then open the next one. */
function promptDecided(origin, outcome) {
  if (outcome === "rejected" || outcome === "timeout") {
    promptCooldowns[PedelecRequests.siteOf(origin)] = Date.now();
    chrome.storage.session.set({ promptCooldowns }).catch((e) => console.error(e));
  } else if (outcome === "approved") {
    clearPromptCooldown(origin);
  }
  openNextPrompt().catch((e) => console.error("pedelec: opening a prompt failed", e));
}

// ---- the agent's requests only the user may answer (issue 38) ----
//
// In permission mode `app` a page answers its agent's requests that stay in
// its workspace; a command, a fetch or a path outside goes to the user
// (Core marks it `user_only` and refuses the page's answer) unless the user
// let that site approve commands in that folder. While pages are connected
// the worker asks Core for such requests every USER_PERMISSION_POLL_MS and
// shows each in a prompt naming the site, the agent, the folder and the
// exact command or paths. Core rejects one nobody answers by its deadline;
// the prompt then closes by itself.

const USER_PERMISSION_POLL_MS = 1000;
/** permissionId -> UserPermission (Core's), of the requests waiting for the user. */
const userPermissions = new Map();
/** Ids already queued or shown, so each prompts once. */
const promptedPermissions = new Set();
/** { id, tabId } of the open permission prompt. */
let permissionPrompt = null;
let permissionPoll = null;
/** Whether a poll is waiting for Core. */
let polling = false;

function watchUserPermissions() {
  if (permissionPoll || pages.size === 0) return;
  permissionPoll = setInterval(() => {
    if (pages.size === 0) {
      clearInterval(permissionPoll);
      permissionPoll = null;
      // No page left to read through; the popup reads Core itself when opened.
      chrome.action.setBadgeText({ text: "" }).catch(() => {});
      return;
    }
    // One poll at a time: a slow Core must not pile calls up behind it.
    if (polling) return;
    polling = true;
    pollUserPermissions()
      .then(pollRunning)
      .catch((e) => console.error("pedelec: reading the user's requests failed", e))
      .finally(() => {
        polling = false;
      });
  }, USER_PERMISSION_POLL_MS);
}

async function pollUserPermissions() {
  // Through a host a page already has; with none, the user's prompt waits
  // for the next page (Core rejects what nobody answers by its deadline).
  const via = [...pages].find((p) => p.host && !p.closed);
  if (!via) return;
  const reply = await via.ownerCall("listUserPermissions", {});
  if (reply.error) return;
  const listed = (reply.response && reply.response.permissions) || [];
  const now = new Set();
  for (const waiting of listed) {
    const id = waiting.request && waiting.request.permissionId;
    if (!id) continue;
    now.add(id);
    userPermissions.set(id, waiting);
    if (!promptedPermissions.has(id)) {
      promptedPermissions.add(id);
      notifyUser(id, waiting);
      enqueuePrompt({ kind: "permission", origin: waiting.origin, id });
    }
  }
  // Settled (by the user, its deadline, a cancel, the turn's end): its prompt and notification go.
  for (const id of [...userPermissions.keys()]) {
    if (now.has(id)) continue;
    userPermissions.delete(id);
    promptedPermissions.delete(id);
    clearNotice(id);
    if (permissionPrompt && permissionPrompt.id === id) closePermissionPrompt();
  }
}

// ---- notifications: a request only the user may answer ----

const NOTICE_PREFIX = "pedelec-permission-";

/**
 * A system notification for a request routed to the user (besides its tab
 * and the control center's Requests): which site, which agent, what it
 * wants to do. Clicking it opens the control center's Requests.
 */
function notifyUser(id, waiting) {
  const api = globalThis.chrome && chrome.notifications;
  if (!api || typeof api.create !== "function") return;
  const activity = (waiting.request && waiting.request.activity) || {};
  const what = activity.command || (activity.paths || []).join(", ") || activity.title || "an action";
  const agent = waiting.provider ? `${waiting.provider} wants: ` : "";
  const options = {
    type: "basic",
    iconUrl: chrome.runtime.getURL("icon-48.png"),
    title: `${waiting.origin || "A site"}'s agent asks you`,
    message: `${agent}${what}`.slice(0, 300),
  };
  Promise.resolve(api.create(`${NOTICE_PREFIX}${id}`, options)).catch((e) => console.error("pedelec: a notification failed", e));
}

function clearNotice(id) {
  const api = globalThis.chrome && chrome.notifications;
  if (api && typeof api.clear === "function") Promise.resolve(api.clear(`${NOTICE_PREFIX}${id}`)).catch(() => {});
}

if (globalThis.chrome && chrome.notifications && chrome.notifications.onClicked) {
  chrome.notifications.onClicked.addListener((noticeId) => {
    if (!noticeId.startsWith(NOTICE_PREFIX)) return;
    chrome.tabs.create({ url: chrome.runtime.getURL(`${CONTROL_PAGE}#requests`), active: true }).catch(() => {});
    clearNotice(noticeId.slice(NOTICE_PREFIX.length));
  });
}

/** Updates the badge through a host a page already has (as the requests' poll does). */
async function pollRunning() {
  const via = [...pages].find((p) => p.host && !p.closed);
  if (!via) return;
  const sessions = await liveSessions(null, (call, body) => via.ownerCall(call, body));
  if (sessions) showRunning(sessions);
}

async function openPermission(id) {
  permissionPrompt = { id, tabId: null };
  const url = chrome.runtime.getURL(`${APPROVAL_PAGE}?permission=${encodeURIComponent(id)}`);
  const tab = await chrome.tabs.create({ url, active: true });
  if (permissionPrompt && permissionPrompt.id === id) permissionPrompt.tabId = tab.id;
  else chrome.tabs.remove(tab.id).catch(() => {});
}

function closePermissionPrompt() {
  const open = permissionPrompt;
  permissionPrompt = null;
  if (open && open.tabId != null) chrome.tabs.remove(open.tabId).catch(() => {});
  openNextPrompt().catch((e) => console.error("pedelec: opening a prompt failed", e));
}

async function answerUserPermission(id, optionId) {
  const waiting = userPermissions.get(id);
  if (!waiting) return { ok: false, error: "this request is no longer waiting" };
  const reply = await owner.call("answerUserPermission", {
    sessionId: waiting.sessionId,
    permissionId: id,
    optionId: typeof optionId === "string" ? optionId : "",
  });
  userPermissions.delete(id);
  if (permissionPrompt && permissionPrompt.id === id) closePermissionPrompt();
  return reply.error ? { ok: false, error: reply.error.message } : { ok: true };
}

function clearPromptCooldown(origin) {
  delete promptCooldowns[PedelecRequests.siteOf(origin)];
  chrome.storage.session.set({ promptCooldowns }).catch((e) => console.error(e));
}

// ---- wiring ----

chrome.storage.onChanged.addListener((changes, area) => {
  if (area === "local" && changes.approvalTimeoutMs) {
    approvalTimeoutMs = changes.approvalTimeoutMs.newValue || APPROVAL_TIMEOUT_MS;
  }
  if (area === "local" && changes.promptCooldownMs) {
    const value = changes.promptCooldownMs.newValue;
    promptCooldownMs = typeof value === "number" ? value : PROMPT_COOLDOWN_MS;
  }
});

chrome.runtime.onConnectExternal.addListener((port) => acceptPage(port, port.sender && port.sender.origin));

// A page through this extension's content script (relay.js): Firefox has no
// externally_connectable. The origin is the browser's, for the frame the
// script runs in — never anything the page said.
chrome.runtime.onConnect.addListener((port) => {
  const sender = port.sender || {};
  if (port.name !== "pedelec-page" || sender.id !== chrome.runtime.id || !sender.tab) {
    port.disconnect();
    return;
  }
  let origin = sender.origin;
  if (!origin && sender.url) {
    try {
      origin = new URL(sender.url).origin;
    } catch (_) {
      origin = null;
    }
  }
  acceptPage(port, origin);
});

function acceptPage(port, origin) {
  if (!origin || origin === "null") {
    port.disconnect();
    return;
  }
  const page = new PageLink(port, origin);
  pages.add(page);
  watchUserPermissions();
  // `ready.then` keeps the page's messages in order until the stored state
  // is loaded; after that they are handled at once, without a microtask
  // per message (nothing can be queued behind `ready` by then).
  port.onMessage.addListener((message) => {
    if (loaded) {
      page.fromPage(message).catch((e) => console.error("pedelec:", e));
      return;
    }
    ready.then(() => page.fromPage(message)).catch((e) => console.error("pedelec:", e));
  });
  port.onDisconnect.addListener(() => page.close());
}

// ---- the folder picker (issue 42) ----
//
// `pedelec.pickWorkspace()` in a page: the worker opens picker.html in a
// tab, where the user browses the folders Core lists (ListFolders, an
// owner call the worker makes for it) and picks one. Core grants it to the
// page's origin and mints an opaque handle (PickFolder); the page gets the
// handle and the folder's name, never a path. Closing the tab, Cancel, or
// PICK_TIMEOUT_MS without a pick answers PICK_CANCELLED. One picker per
// origin at a time: another call meanwhile is PICK_CANCELLED, reason
// "already_open", and brings the open one to the front.

const PICKER_PAGE = "picker.html";
const PICK_TIMEOUT_MS = 10 * 60 * 1000;
/** pick id (random) -> { page, id, origin, tabId, timer } of open pickers. */
const pickers = new Map();

function pickCancelled(reason, message) {
  return { error: { code: "PICK_CANCELLED", message, detailsJson: JSON.stringify({ reason }) } };
}

async function openPicker(page, id) {
  for (const entry of pickers.values()) {
    if (entry.origin !== page.origin) continue;
    if (entry.tabId != null) chrome.tabs.update(entry.tabId, { active: true }).catch(() => {});
    page.toPage({ type: "picked", id, ...pickCancelled("already_open", "a folder picker is already open for this site") });
    return;
  }
  const pick = crypto.randomUUID();
  const timer = setTimeout(() => settlePick(pick, pickCancelled("timeout", "no folder was picked in time")), PICK_TIMEOUT_MS);
  const entry = { page, id, origin: page.origin, tabId: null, timer };
  pickers.set(pick, entry);
  const tab = await chrome.tabs.create({ url: chrome.runtime.getURL(`${PICKER_PAGE}?pick=${pick}`), active: true });
  if (pickers.get(pick) === entry) entry.tabId = tab.id;
  else chrome.tabs.remove(tab.id).catch(() => {});
}

/** Answers the page that asked (`answer` null: nobody to answer) and closes the picker. */
function settlePick(pick, answer) {
  const entry = pickers.get(pick);
  if (!entry) return false;
  pickers.delete(pick);
  clearTimeout(entry.timer);
  if (entry.tabId != null) chrome.tabs.remove(entry.tabId).catch(() => {});
  if (answer) entry.page.toPage({ type: "picked", id: entry.id, ...answer });
  return true;
}

chrome.tabs.onRemoved.addListener((tabId) => {
  for (const [pick, entry] of pickers) {
    if (entry.tabId !== tabId) continue;
    entry.tabId = null;
    settlePick(pick, pickCancelled("closed", "the folder picker was closed"));
  }
});

chrome.runtime.onMessage.addListener((message, sender, sendResponse) => {
  if (sender.id !== chrome.runtime.id || !sender.url || !sender.url.startsWith(chrome.runtime.getURL(PICKER_PAGE))) {
    return false;
  }
  const pick = message && typeof message.pick === "string" ? message.pick : "";
  ready
    .then(async () => {
      const entry = pickers.get(pick);
      if (!entry) return { ok: false, error: { code: "PICK_CANCELLED", message: "this picker is no longer open" } };
      switch (message.type) {
        case "pickInfo":
          return { ok: true, origin: entry.origin };
        case "listFolders": {
          const path = typeof message.path === "string" ? message.path : "";
          const reply = await owner.call("listFolders", { path, includeHidden: message.includeHidden === true });
          return reply.error ? { ok: false, error: reply.error } : { ok: true, listing: reply.response || {} };
        }
        case "pick": {
          if (typeof message.path !== "string" || message.path === "") return { ok: false, error: { message: "no folder named" } };
          const reply = await owner.call("pickFolder", { origin: entry.origin, path: message.path });
          if (reply.error) return { ok: false, error: reply.error };
          const picked = reply.response || {};
          await refreshConsent();
          // The tab closes a moment later, once this answer reached it.
          setTimeout(() => settlePick(pick, { handle: picked.handle, name: picked.name }), 0);
          return { ok: true, name: picked.name };
        }
        case "cancel":
          setTimeout(() => settlePick(pick, pickCancelled("cancelled", "the user closed the folder picker")), 0);
          return { ok: true };
        default:
          return { ok: false, error: { message: "unknown message" } };
      }
    })
    .then(sendResponse, (e) => sendResponse({ ok: false, error: { message: String(e) } }));
  return true;
});

// ---- the toolbar: badge and popup ----

const POPUP_PAGE = "popup.html";
const CONTROL_PAGE = "control.html";


/** The sessions Core has live, of `origin` or of every origin; null when Core cannot answer. */
async function liveSessions(origin, call = (c, b) => owner.call(c, b)) {
  const reply = await call("listLiveSessions", origin ? { origin } : {});
  if (reply.error) return null;
  return ((reply.response && reply.response.sessions) || []).map(PedelecShown.liveSession);
}

/** The toolbar badge: how many sessions are running a turn now. */
function showRunning(sessions) {
  const busy = sessions.filter((s) => s.status === "running" || s.status === "waiting_tool_result").length;
  chrome.action.setBadgeText({ text: busy > 0 ? String(busy) : "" }).catch(() => {});
}

async function siteState(origin) {
  const [known, sessions] = await Promise.all([refreshConsent(), liveSessions(origin)]);
  if (!known || sessions === null) return { ok: false, error: "Core did not answer" };
  return { ok: true, approved: isApproved(origin), folders: foldersOf(origin), sessions };
}

async function stopSessions(body) {
  const reply = await owner.call("endSessions", body);
  if (reply.error) return { ok: false, error: reply.error.message };
  const sessions = await liveSessions(null);
  if (sessions) showRunning(sessions);
  return { ok: true, ended: Number((reply.response && reply.response.ended) || 0) };
}

chrome.runtime.onMessage.addListener((message, sender, sendResponse) => {
  if (sender.id !== chrome.runtime.id || !sender.url || !sender.url.startsWith(chrome.runtime.getURL(POPUP_PAGE))) {
    return false;
  }
  const origin = message && typeof message.origin === "string" ? message.origin : "";
  ready
    .then(async () => {
      switch (message && message.type) {
        case "siteState":
          return siteState(origin);
        case "stopSessions": {
          const ids = Array.isArray(message.sessionIds) ? message.sessionIds.filter((id) => typeof id === "string") : [];
          return ids.length > 0 ? stopSessions({ sessionIds: ids }) : { ok: false, error: "no session named" };
        }
        case "stopSite":
          return origin ? stopSessions({ origin }) : { ok: false, error: "no site named" };
        default:
          return { ok: false, error: "unknown message" };
      }
    })
    .then(sendResponse, (e) => sendResponse({ ok: false, error: String(e) }));
  return true;
});

// The control center changed consent (its Sites view makes the owner calls
// itself): read Core's copy again. The message carries nothing to trust.
chrome.runtime.onMessage.addListener((message, sender, sendResponse) => {
  if (sender.id !== chrome.runtime.id || !sender.url || !sender.url.startsWith(chrome.runtime.getURL(CONTROL_PAGE))) {
    return false;
  }
  if (!message || message.type !== "consentChanged") return false;
  ready
    .then(() => refreshConsent())
    .then((ok) => sendResponse({ ok }), (e) => sendResponse({ ok: false, error: String(e) }));
  return true;
});

chrome.runtime.onMessage.addListener((message, sender, sendResponse) => {
  // Only the extension's own approval page may decide or revoke.
  if (sender.id !== chrome.runtime.id || !sender.url || !sender.url.startsWith(chrome.runtime.getURL(APPROVAL_PAGE))) {
    return false;
  }
  ready
    .then(async () => {
      switch (message && message.type) {
        case "list":
          await refreshConsent();
          return {
            approved: Object.fromEntries(
              Object.entries(consent)
                .filter(([, c]) => c.approved)
                .map(([origin, c]) => [origin, { approvedAt: Number(c.approvedAtMs || 0) }]),
            ),
            pending: [...approvals.keys()],
            grants: Object.fromEntries(Object.keys(consent).map((origin) => [origin, foldersOf(origin)])),
            pendingGrants: [...grantPrompts.values()].map(({ origin, path }) => ({ origin, path })),
          };
        case "grant":
          if (!grantPrompts.has(`${message.origin}\n${message.path}`)) {
            return { ok: false, error: "no pending workspace request for this origin and path" };
          }
          // Never a filesystem root or a home: the page hides such a button,
          // and a message that names one anyway is refused here.
          if (typeof message.root === "string" && PedelecRequests.isHomeOrRoot(normalizePath(message.root) || message.root)) {
            return { ok: false, error: `${message.root} is a filesystem root or a home directory` };
          }
          await decideGrant(message.origin, message.path, typeof message.root === "string" ? message.root : null);
          return { ok: true };
        case "revokeGrant":
          return (await revokeGrant(message.origin, message.root)) ? { ok: true } : { ok: false, error: "Core refused" };
        case "mayApproveCommands":
          return (await setMayApproveCommands(message.origin, message.root, message.may === true))
            ? { ok: true }
            : { ok: false, error: "Core refused" };
        case "permission":
          return { ok: true, permission: userPermissions.get(message.id) || null };
        case "answerPermission":
          return answerUserPermission(message.id, message.optionId);
        case "decide":
          if (!approvals.has(message.origin)) return { ok: false, error: "no pending request for this origin" };
          await decide(message.origin, message.approved === true, message.approved === true ? "approved" : "rejected");
          return { ok: true };
        case "revoke":
          await revoke(message.origin);
          return { ok: true };
        default:
          return { ok: false, error: "unknown message" };
      }
    })
    .then(sendResponse, (e) => sendResponse({ ok: false, error: String(e) }));
  return true;
});
