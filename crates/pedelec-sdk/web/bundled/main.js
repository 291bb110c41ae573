// What a web developer writes after `npm install pedelec`: the package's
// default export loads the wasm (the bundler copies it next to the bundle),
// and the client talks to the extension. The browser test drives
// `window.bundled`.
import init, { Pedelec } from "pedelec";

const EXTENSION_ID = new URLSearchParams(location.search).get("ext") || "ighbaanpnpjegfpbhfnaekbncchadgfe";
const $ = (id) => document.getElementById(id);
const state = { counter: 0, statuses: [], chats: [] };

await init();
const pedelec = new Pedelec({ extensionId: EXTENSION_ID });
let session = null;

async function start() {
  session = await pedelec.createSession({
    provider: "scripted",
    skills: {
      tools: [
        {
          name: "update_counter",
          description: "Adds delta to the page's counter and returns the new value.",
          inputSchema: { type: "object", properties: { delta: { type: "number" } }, required: ["delta"] },
        },
      ],
    },
  });
  session.onStatus((status) => {
    state.statuses.push(status);
    $("status").textContent = status;
  });
  session.onChat((text) => {
    state.chats.push(text);
    const p = document.createElement("p");
    p.textContent = text;
    $("log").append(p);
  });
  session.onTool("update_counter", async ({ delta }) => {
    state.counter += delta;
    $("counter").textContent = String(state.counter);
    return { value: state.counter };
  });
  return session.sessionId;
}

/** Runs `f`; resolves to `{ ok, value }` or `{ ok: false, code, message }`. */
async function attempt(f) {
  try {
    return { ok: true, value: await f() };
  } catch (e) {
    return { ok: false, code: e?.code, message: String(e?.message ?? e) };
  }
}

window.bundled = {
  state,
  start: () => attempt(start),
  send: (text) => attempt(() => session.sendText(text)),
  end: () => attempt(() => session.end()),
};
$("status").textContent = "ready";
