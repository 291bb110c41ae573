// The approval page: decides a pending origin (from ?origin=) and lists the
// approved origins with a revoke button each. All state lives in the worker.
"use strict";

const requested = new URLSearchParams(location.search).get("origin");

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
  const pending = requested && state && state.pending.includes(requested);
  document.getElementById("request").hidden = !pending;
}

async function decide(approved) {
  document.getElementById("approve").disabled = true;
  document.getElementById("reject").disabled = true;
  const reply = await send({ type: "decide", origin: requested, approved });
  document.getElementById("outcome").textContent =
    reply && reply.ok ? (approved ? "Approved." : "Rejected.") : `Not applied: ${reply && reply.error}`;
}

if (requested) document.getElementById("origin").textContent = requested;
document.getElementById("approve").addEventListener("click", () => decide(true));
document.getElementById("reject").addEventListener("click", () => decide(false));
render();
