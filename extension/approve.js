// The approval page: decides a pending origin (from ?origin=), a pending
// workspace folder of an origin (?origin=&path=), or an agent's request
// only the user may answer (?permission=), and lists the approved origins
// and the granted folders, each with a revoke button and, per folder,
// whether the site may approve its agent's commands there. The decisions
// live in Core; the worker makes the calls.
"use strict";

const params = new URLSearchParams(location.search);
const requested = params.get("origin");
const requestedPath = params.get("path");
const requestedPermission = params.get("permission");
const parentPath = requestedPath && requestedPath !== "/" ? requestedPath.replace(/\/[^/]*$/, "") || "/" : null;

async function send(message) {
  return chrome.runtime.sendMessage(message);
}

async function render() {
  const state = await send({ type: "list" });
  const list = document.getElementById("approved");
  list.replaceChildren();
  const origins = Object.keys((state && state.approved) || {}).sort();
  document.getElementById("none").hidden = origins.length > 0;
  for (const origin of origins) {
    const item = document.createElement("li");
    const label = document.createElement("code");
    label.textContent = origin;
    const revoke = document.createElement("button");
    revoke.type = "button";
    revoke.textContent = "Revoke";
    revoke.className = "revoke";
    revoke.dataset.origin = origin;
    revoke.addEventListener("click", async () => {
      revoke.disabled = true;
      await send({ type: "revoke", origin });
      await render();
    });
    item.append(label, revoke);
    list.append(item);
  }
  const grantList = document.getElementById("grants");
  grantList.replaceChildren();
  const grants = (state && state.grants) || {};
  let count = 0;
  for (const origin of Object.keys(grants).sort()) {
    for (const { path: root, mayApproveCommands } of grants[origin]) {
      count++;
      const item = document.createElement("li");
      const label = document.createElement("code");
      label.textContent = `${origin} → ${root}`;
      // Off by default: the site's agent then asks the user before any command.
      const may = document.createElement("label");
      const box = document.createElement("input");
      box.type = "checkbox";
      box.className = "may-approve";
      box.dataset.origin = origin;
      box.dataset.root = root;
      box.checked = mayApproveCommands;
      box.addEventListener("change", async () => {
        box.disabled = true;
        await send({ type: "mayApproveCommands", origin, root, may: box.checked });
        await render();
      });
      may.append(box, " the site may approve its agent's commands here");
      const revoke = document.createElement("button");
      revoke.type = "button";
      revoke.textContent = "Revoke";
      revoke.className = "revoke-grant";
      revoke.dataset.origin = origin;
      revoke.dataset.root = root;
      revoke.addEventListener("click", async () => {
        revoke.disabled = true;
        await send({ type: "revokeGrant", origin, root });
        await render();
      });
      item.append(label, revoke, may);
      grantList.append(item);
    }
  }
  document.getElementById("no-grants").hidden = count > 0;
  if (requestedPermission) {
    document.getElementById("request").hidden = true;
    await showPermission();
    return;
  }
  if (requestedPath) {
    const pendingGrant =
      state && state.pendingGrants.some((g) => g.origin === requested && g.path === requestedPath);
    document.getElementById("grant-request").hidden = !pendingGrant;
    document.getElementById("request").hidden = true;
    return;
  }
  const pending = requested && state && state.pending.includes(requested);
  document.getElementById("request").hidden = !pending;
}

let permissionShown = false;

/** Fills the permission section once, from the worker's copy of Core's request. */
async function showPermission() {
  if (permissionShown) return;
  const reply = await send({ type: "permission", id: requestedPermission });
  const waiting = reply && reply.permission;
  document.getElementById("permission-request").hidden = !waiting;
  if (!waiting) return;
  permissionShown = true;
  const request = waiting.request || {};
  const activity = request.activity || {};
  document.getElementById("permission-origin").textContent = waiting.origin;
  document.getElementById("permission-agent").textContent = waiting.provider;
  document.getElementById("permission-folder").textContent = waiting.workspacePath;
  document.getElementById("permission-title").textContent = activity.title || "";
  const command = document.getElementById("permission-command");
  command.hidden = !activity.command;
  command.textContent = activity.command || "";
  const paths = document.getElementById("permission-paths");
  paths.hidden = !(activity.paths && activity.paths.length);
  for (const path of activity.paths || []) {
    const item = document.createElement("li");
    item.textContent = path;
    paths.append(item);
  }
  const options = document.getElementById("permission-options");
  const choices = [...(request.options || []).map((o) => [o.optionId, o.name || o.optionId]), ["", "Reject"]];
  for (const [optionId, name] of choices) {
    const button = document.createElement("button");
    button.type = "button";
    button.disabled = true;
    button.className = "permission-option";
    button.dataset.option = optionId;
    button.textContent = name;
    button.addEventListener("click", () => answerPermission(optionId));
    options.append(button);
  }
}

async function answerPermission(optionId) {
  decided = true;
  for (const button of document.querySelectorAll(".permission-option")) button.disabled = true;
  const reply = await send({ type: "answerPermission", id: requestedPermission, optionId });
  document.getElementById("permission-outcome").textContent =
    reply && reply.ok ? (optionId ? `Answered ${optionId}.` : "Rejected.") : `Not applied: ${reply && reply.error}`;
}

async function decideGrant(root) {
  decided = true;
  for (const id of ["grant", "grant-parent", "refuse-grant"]) document.getElementById(id).disabled = true;
  const reply = await send({ type: "grant", origin: requested, path: requestedPath, root });
  document.getElementById("grant-outcome").textContent =
    reply && reply.ok ? (root ? `Granted ${root}.` : "Refused.") : `Not applied: ${reply && reply.error}`;
}

async function decide(approved) {
  decided = true;
  document.getElementById("approve").disabled = true;
  document.getElementById("reject").disabled = true;
  const reply = await send({ type: "decide", origin: requested, approved });
  document.getElementById("outcome").textContent =
    reply && reply.ok ? (approved ? "Approved." : "Rejected.") : `Not applied: ${reply && reply.error}`;
}

if (requested) document.getElementById("origin").textContent = requested;
if (requestedPath) {
  document.getElementById("grant-origin").textContent = requested;
  document.getElementById("grant-path").textContent = requestedPath;
  document.getElementById("grant-parent-path").textContent = parentPath;
  // A root or a home is never offered: it holds everything of the user (the worker refuses it too).
  document.getElementById("grant").hidden = PedelecRequests.isHomeOrRoot(requestedPath);
  document.getElementById("grant-parent").hidden =
    !parentPath || parentPath === requestedPath || PedelecRequests.isHomeOrRoot(parentPath);
  document.getElementById("grant").addEventListener("click", () => decideGrant(requestedPath));
  document.getElementById("grant-parent").addEventListener("click", () => decideGrant(parentPath));
  document.getElementById("refuse-grant").addEventListener("click", () => decideGrant(null));
}
document.getElementById("approve").addEventListener("click", () => decide(true));
document.getElementById("reject").addEventListener("click", () => decide(false));
render();

// ---- buttons that cannot be clicked by surprise (issue 38) ----
//
// A page can make this tab open at a moment it chooses, under the user's
// pointer, so a click meant for the page (a double-click) could land on
// Approve. The decision buttons start disabled (approve.html) and are
// enabled only once this tab has been visible and focused for `armMs`
// without a break; losing focus or visibility disables them and starts
// the wait again. `promptArmMs` in storage.local changes the wait (tests).
const PROMPT_BUTTONS = ["approve", "reject", "grant", "grant-parent", "refuse-grant"];
let decided = false;
let armMs = 750;
let attentiveSince = null;

function armTick() {
  const attentive = document.visibilityState === "visible" && document.hasFocus();
  if (!attentive) attentiveSince = null;
  else if (attentiveSince === null) attentiveSince = performance.now();
  const armed = !decided && attentiveSince !== null && performance.now() - attentiveSince >= armMs;
  for (const id of PROMPT_BUTTONS) document.getElementById(id).disabled = !armed;
  for (const button of document.querySelectorAll(".permission-option")) button.disabled = !armed;
}

chrome.storage.local.get("promptArmMs").then((stored) => {
  if (typeof stored.promptArmMs === "number") armMs = stored.promptArmMs;
});
for (const event of ["focus", "blur"]) window.addEventListener(event, armTick);
document.addEventListener("visibilitychange", armTick);
setInterval(armTick, 50);
armTick();
