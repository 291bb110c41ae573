// How the extension's own pages show what Core answers: one place for the
// worker (the popup's list) and the control center. Loaded by the worker
// (importScripts in Chromium, `background.scripts` in Firefox) and by
// control.html and picker.html.
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

  /** `name` inside `folder`, as Core's ListFolders paths are written. */
  function childPath(folder, name) {
    return folder.endsWith("/") ? folder + name : `${folder}/${name}`;
  }

  /**
   * One sub-folder of a ListFolders listing as a list item (the picker and
   * the control center's folder browser): a link is named, never opened (its
   * target is opened by path); any other folder is a button calling `open`.
   * `never` says what cannot happen to a folder the workspace policy refuses
   * ("picked", "granted"); `className` is the button's.
   */
  function folderItem(folder, { never, className, open }) {
    const item = document.createElement("li");
    const note = (text) => {
      const span = document.createElement("span");
      span.className = "note";
      span.textContent = text;
      return span;
    };
    if (folder.link) {
      item.className = "unavailable";
      item.append(folder.name, note("(a link: open its target by path)"));
      return item;
    }
    const button = document.createElement("button");
    button.type = "button";
    button.className = className;
    button.dataset.name = folder.name;
    button.textContent = folder.name;
    if (!folder.pickable) button.append(note(`(can never be ${never})`));
    button.setAttribute("aria-label", `Open ${folder.name}${folder.pickable ? "" : `, which can never be ${never}`}`);
    button.addEventListener("click", open);
    item.append(button);
    return item;
  }

  return { enumWord, liveSession, childPath, folderItem };
})();
