// The folder picker (issue 42): opened by the worker for a page's
// `pedelec.pickWorkspace()` (?pick=<id>). The user browses folders Core
// lists (the worker makes the ListFolders owner call) and picks one; the
// worker asks Core to grant it to the site (PickFolder) and answers the
// page with an opaque handle and the folder's name. This page decides
// nothing about what may be picked: Core marks each folder and checks the
// pick again. Every control is a labelled button, input or checkbox,
// reachable by keyboard.
"use strict";

const pick = new URLSearchParams(location.search).get("pick") || "";
const $ = (id) => document.getElementById(id);
/** The folder listed now (Core's answer). */
let current = null;
/** Bumped per listing asked for: only the latest one asked is shown. */
let asked = 0;

function send(message) {
  return chrome.runtime.sendMessage({ pick, ...message });
}

function say(text) {
  $("status").textContent = text;
}

/** A folder's path in `folder` (listed by Core, so absolute and resolved). */
async function list(path, focusFirst = false) {
  const mine = ++asked;
  say("Reading…");
  const reply = await send({ type: "listFolders", path, includeHidden: $("hidden").checked });
  if (mine !== asked) return;
  if (!reply || !reply.ok) {
    say(`Cannot open ${path || "your home folder"}: ${(reply && reply.error && reply.error.message) || "Core did not answer"}`);
    return;
  }
  current = reply.listing;
  const listing = current;
  $("path").value = listing.path || "";
  $("up").disabled = !listing.parent;
  $("home").disabled = !listing.home;
  $("pick").disabled = !listing.pickable;
  $("pick").dataset.path = listing.path || "";
  $("truncated").hidden = !listing.truncated;
  const folders = listing.folders || [];
  const items = folders.map((folder) =>
    PedelecShown.folderItem(folder, {
      never: "picked",
      className: "folder",
      open: () => list(PedelecShown.childPath(listing.path, folder.name), true),
    }),
  );
  $("folders").replaceChildren(...items);
  const where = listing.pickable ? "" : " This folder itself can never be picked.";
  say(`${listing.path}: ${folders.length} folder${folders.length === 1 ? "" : "s"}.${where}`);
  if (focusFirst) (document.querySelector("#folders button") || $("path")).focus();
}

$("go").addEventListener("submit", (event) => {
  event.preventDefault();
  list($("path").value.trim());
});
$("up").addEventListener("click", () => current && current.parent && list(current.parent));
$("home").addEventListener("click", () => list(""));
$("hidden").addEventListener("change", () => current && list(current.path));
$("pick").addEventListener("click", async () => {
  const path = $("pick").dataset.path;
  if (!path) return;
  $("pick").disabled = true;
  say(`Granting ${path}…`);
  const reply = await send({ type: "pick", path });
  if (!reply || !reply.ok) {
    $("pick").disabled = false;
    say(`Cannot pick ${path}: ${(reply && reply.error && reply.error.message) || "Core did not answer"}`);
    return;
  }
  say(`Picked ${reply.name}. This tab closes now.`);
});
$("cancel").addEventListener("click", () => send({ type: "cancel" }));

(async () => {
  const info = await send({ type: "pickInfo" });
  if (!info || !info.ok) {
    say("This picker is no longer open: the site stopped waiting.");
    for (const id of ["pick", "go-button", "up", "home"]) $(id).disabled = true;
    return;
  }
  document.title = `Pedelec — pick a folder for ${info.origin}`;
  await list("");
  // Named once the first listing is in: the picker is ready.
  $("origin").textContent = info.origin;
  $("path").focus();
})();
