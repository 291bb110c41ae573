// A small WebMCP polyfill for the browser tests, after the community-group
// draft (webmachinelearning/webmcp): `document.modelContext` is an
// EventTarget with `registerTool(tool, { signal })` and `unregisterTool(name)`
// for pages, `getTools()` and `executeTool(tool, input)` for agents, and a
// `toolchange` event whenever the set of tools changes. Installed only where
// the browser has no model context of its own.
(() => {
  if (document.modelContext) return;

  /** A registered tool as agents see it: read-only properties, no `execute`. */
  class Tool {
    constructor(registered) {
      const { name, title, description, inputSchema, annotations } = registered;
      Object.defineProperties(this, {
        name: { value: name, enumerable: true },
        title: { value: title ?? null, enumerable: true },
        description: { value: description, enumerable: true },
        inputSchema: { value: inputSchema ?? null, enumerable: true },
        annotations: { value: annotations ?? null, enumerable: true },
        origin: { value: location.origin, enumerable: true },
      });
    }
  }

  class ModelContext extends EventTarget {
    #tools = new Map();
    ontoolchange = null;

    #changed() {
      const event = new Event("toolchange");
      this.dispatchEvent(event);
      if (typeof this.ontoolchange === "function") this.ontoolchange(event);
    }

    registerTool(tool, options = {}) {
      if (!tool || typeof tool.name !== "string" || !tool.name) throw new TypeError("a tool needs a name");
      if (typeof tool.description !== "string") throw new TypeError("a tool needs a description");
      if (typeof tool.execute !== "function") throw new TypeError("a tool needs an execute callback");
      if (this.#tools.has(tool.name)) throw new DOMException(`${tool.name} is registered`, "InvalidStateError");
      if (options.signal?.aborted) return;
      this.#tools.set(tool.name, tool);
      options.signal?.addEventListener("abort", () => this.unregisterTool(tool.name), { once: true });
      this.#changed();
    }

    unregisterTool(name) {
      if (this.#tools.delete(name)) this.#changed();
    }

    async getTools() {
      return Array.from(this.#tools.values(), (tool) => new Tool(tool));
    }

    async executeTool(tool, input) {
      const registered = this.#tools.get(tool?.name);
      if (!registered) throw new DOMException(`no tool ${tool?.name}`, "NotFoundError");
      const client = { requestUserInteraction: async (callback) => callback() };
      return registered.execute(input ?? {}, client);
    }
  }

  Object.defineProperty(document, "modelContext", { value: new ModelContext(), configurable: true });
})();
