// The toolbar popup: the current site's standing (approved or not, its
// folder grants) and its live sessions, each with Stop, and Stop all for
// the site. What it shows and stops comes from Core through the worker's
// owner calls; the popup itself holds nothing.
"use strict";

/** How often the open popup reads the site's sessions again. */
const REFRESH_MS = 1000;

async function send(message) {
  return chrome.runtime.sendMessage(message);
}

/** The site the popup is about: the active tab's origin (the tests name one with ?site=). */
async function currentSite() {
  const named = new URLSearchParams(location.search).get("site");
  if (named) return named;
  const [tab] = await chrome.tabs.query({ active: true, currentWindow: true });
  try {
    const origin = tab && tab.url ? new URL(tab.url).origin : null;
    return origin && /^https?:/.test(origin) ? origin : null;
  } catch (_) {
    return null;
  }
}

function running(startedAtMs) {
  const seconds = Math.max(0, Math.floor((Date.now() - Number(startedAtMs || 0)) / 1000));
  if (seconds < 60) return `${seconds} s`;
  const minutes = Math.floor(seconds / 60);
  return minutes < 60 ? `${minutes} min` : `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

function cell(text) {
  const td = document.createElement("td");
  td.textContent = text;
  return td;
}

/** Sends a stop `message` (`stopSessions` or `stopSite`) and says how it went. */
async function stop(message) {
  const reply = await send(message);
  document.getElementById("outcome").textContent =
    reply && reply.ok ? `Stopped ${reply.ended} session${reply.ended === 1 ? "" : "s"}.` : `Not stopped: ${reply && reply.error}`;
  await render();
}

let site = null;

async function render() {
  const known = site !== null;
  document.getElementById("site-none").hidden = known;
  if (!known) {
    document.getElementById("sessions").hidden = true;
    document.getElementById("no-sessions").hidden = false;
    return;
  }
  const state = await send({ type: "siteState", origin: site });
  if (!state || !state.ok) {
    document.getElementById("outcome").textContent = `Core did not answer: ${state && state.error}`;
    return;
  }
  document.getElementById("site-origin").textContent = site;
  const approval = document.getElementById("site-approval");
  approval.textContent = state.approved ? "is approved" : "is not approved";
  approval.className = state.approved ? "approved" : "not-approved";
  const folders = document.getElementById("site-folders");
  folders.replaceChildren(
    ...state.folders.map((f) => {
      const li = document.createElement("li");
      li.textContent = `${f.path}${f.mayApproveCommands ? " (may approve commands)" : ""}`;
      return li;
    }),
  );
  const body = document.querySelector("#sessions tbody");
  body.replaceChildren();
  for (const s of state.sessions) {
    const row = document.createElement("tr");
    row.dataset.session = s.sessionId;
    const stopButton = document.createElement("button");
    stopButton.type = "button";
    stopButton.className = "stop";
    stopButton.dataset.session = s.sessionId;
    stopButton.textContent = "Stop";
    stopButton.addEventListener("click", () => {
      stopButton.disabled = true;
      stop({ type: "stopSessions", sessionIds: [s.sessionId] }).catch((e) => console.error(e));
    });
    const action = document.createElement("td");
    action.append(stopButton);
    row.append(cell(s.provider), cell(s.workspacePath), cell(s.status), cell(running(s.createdAtMs)), action);
    body.append(row);
  }
  document.getElementById("sessions").hidden = state.sessions.length === 0;
  document.getElementById("no-sessions").hidden = state.sessions.length > 0;
  const stopSite = document.getElementById("stop-site");
  stopSite.hidden = state.sessions.length === 0;
  stopSite.onclick = () => {
    stopSite.disabled = true;
    stop({ type: "stopSite", origin: site })
      .catch((e) => console.error(e))
      .finally(() => {
        stopSite.disabled = false;
      });
  };
}

(async () => {
  site = await currentSite();
  await render();
  setInterval(() => render().catch((e) => console.error(e)), REFRESH_MS);
})().catch((e) => console.error("pedelec popup:", e));
