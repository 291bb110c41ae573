// `pedelec.bridgeModelContext(session)`: the tools a page registered with
// WebMCP (`document.modelContext`, or the older `navigator.modelContext`)
// become the session's frontend tools, and follow the page's `toolchange`.
//
// It reads the model context as the WebMCP community-group draft has an
// agent read it: `getTools()` lists the registered tools (interface objects:
// their properties are read one by one, never spread or stringified), and
// `executeTool(tool, input)` runs one; a tool object that carries its own
// `execute` (a registration dictionary) is run directly where no
// `executeTool` exists. Tool names and schemas come from the page: Core
// checks them as it checks any tool list (TOOLS_MANIFEST_INVALID).

/** The page's model context: the one given, else document's, else navigator's. */
function findModelContext(given) {
  if (given) return given;
  if (typeof document !== "undefined" && document.modelContext) return document.modelContext;
  if (typeof navigator !== "undefined" && navigator.modelContext) return navigator.modelContext;
  return null;
}

/** An error shaped as the SDK's own (`PedelecError`). */
function failure(code, message) {
  const error = new Error(message);
  error.name = "PedelecError";
  error.code = code;
  return error;
}

function unavailable(message) {
  return failure("MODEL_CONTEXT_UNAVAILABLE", message);
}

/** One registered tool as a tool definition whose `execute` runs it in the page. */
function definition(context, tool) {
  const schema = tool.inputSchema ?? null;
  const annotations = tool.annotations ?? null;
  const run =
    typeof context.executeTool === "function"
      ? (input) => context.executeTool(tool, input)
      : (input) => tool.execute(input);
  return {
    name: tool.name,
    description: tool.description ?? "",
    inputSchema: schema && typeof schema === "object" ? schema : { type: "object" },
    annotations: annotations && typeof annotations === "object" ? { readOnlyHint: !!annotations.readOnlyHint } : undefined,
    execute: run,
  };
}

export async function bridgeModelContext(session, options) {
  if (!session || typeof session.setTools !== "function" || typeof session.onStatus !== "function") {
    throw failure("INVALID_ARGUMENT", "bridgeModelContext needs a PedelecSession");
  }
  const context = findModelContext(options && options.modelContext);
  if (!context) throw unavailable("this page has no document.modelContext (WebMCP)");
  if (typeof context.getTools !== "function") {
    throw unavailable("this page's modelContext cannot list its tools (no getTools)");
  }
  let stopped = false;
  // A change while a turn runs waits for the turn's end: Core changes tools
  // between turns only (SESSION_BUSY otherwise).
  let dirty = false;
  const busy = () => session.getStatus() === "running" || session.getStatus() === "waiting_tool_result";
  const run = async () => {
    if (stopped) return;
    if (busy()) {
      dirty = true;
      return;
    }
    dirty = false;
    const tools = await context.getTools();
    await session.setTools(Array.from(tools ?? [], (tool) => definition(context, tool)));
  };
  // One sync at a time, in order: the last change always wins.
  let chain = Promise.resolve();
  const sync = () => {
    chain = chain.then(run, run);
    return chain;
  };
  const onChange = () => {
    sync().catch((error) => bridge.onerror && bridge.onerror(error));
  };
  const offStatus = session.onStatus((status) => {
    if (dirty && status === "idle") onChange();
  });
  if (typeof context.addEventListener === "function") context.addEventListener("toolchange", onChange);
  const bridge = {
    /** Called with an error a later sync met (the first one rejects this call). */
    onerror: null,
    /** Lists the page's tools again now. */
    refresh: () => sync(),
    /** Resolves once the syncs started so far are done (failed ones included). */
    whenSynced: () => chain.then(
      () => undefined,
      () => undefined,
    ),
    /** Stops following the page's tools (the session keeps its current ones). */
    stop() {
      stopped = true;
      offStatus();
      if (typeof context.removeEventListener === "function") context.removeEventListener("toolchange", onChange);
    },
  };
  try {
    await sync();
  } catch (error) {
    bridge.stop();
    throw error;
  }
  return bridge;
}
