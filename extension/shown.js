// How the extension's own pages show what Core answers: one place for the
// worker (the popup's list) and the control center. Loaded by the worker
// (importScripts in Chromium, `background.scripts` in Firefox) and by
// control.html.
"use strict";

globalThis.PedelecShown = (() => {
  /** `SESSION_STATUS_WAITING_TOOL_RESULT` -> `waiting_tool_result` (protobuf JSON writes enum names). */
  function enumWord(value, prefix) {
    return String(value || "")
      .replace(prefix, "")
      .toLowerCase();
  }

  /** A LiveSession (core.proto) as the popup and the control center list it. */
  function liveSession(live) {
    const summary = live.summary || {};
    const info = summary.session || {};
    return {
      sessionId: info.sessionId || "",
      origin: live.origin || "",
      provider: info.provider || "",
      model: info.model || "",
      workspacePath: live.workspacePath || "",
      status: enumWord(summary.status, "SESSION_STATUS_"),
      createdAtMs: Number(info.createdAtMs || 0),
      // For an ended session, about when it ended (its last event).
      lastActivityAtMs: Number(summary.lastActivityAtMs || 0),
      totalTokens: Number(live.totalTokens || 0),
    };
  }

  return { enumWord, liveSession };
})();
