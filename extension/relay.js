// Content script: lets a page reach the extension where the browser has no
// `externally_connectable` (Firefox), or where the page asks for it
// (`new Pedelec({ channel: "relay" })`). It relays window messages of the
// page's own origin to a runtime port and back; the background worker gates
// that port by the origin the browser gives for this frame, exactly as it
// gates an external one. It decides nothing itself.
(() => {
  const FROM_PAGE = "pedelec:page";
  const TO_PAGE = "pedelec:extension";
  /** Page port id -> runtime port. */
  const ports = new Map();
  const toPage = (port, type, message) =>
    window.postMessage({ channel: TO_PAGE, port, type, message }, location.origin);

  window.addEventListener("message", (event) => {
    if (event.source !== window || event.origin !== location.origin) return;
    const data = event.data;
    if (!data || data.channel !== FROM_PAGE || !Number.isInteger(data.port)) return;
    const id = data.port;
    switch (data.type) {
      case "connect": {
        if (ports.has(id)) return;
        const port = chrome.runtime.connect({ name: "pedelec-page" });
        ports.set(id, port);
        port.onMessage.addListener((message) => toPage(id, "message", message));
        port.onDisconnect.addListener(() => {
          ports.delete(id);
          toPage(id, "disconnect");
        });
        toPage(id, "connected");
        return;
      }
      case "message": {
        const port = ports.get(id);
        if (port) port.postMessage(data.message);
        return;
      }
      case "disconnect": {
        const port = ports.get(id);
        ports.delete(id);
        if (port) port.disconnect();
        return;
      }
    }
  });
})();
