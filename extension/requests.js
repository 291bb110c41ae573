// What a page may ask the native host, rebuilt field by field.
//
// The native host decodes protobuf JSON, which accepts two spellings of
// every field (`createSession` and `create_session`, `grantedRoots` and
// `granted_roots`) and ignores fields it does not know. A worker that looks
// at one spelling and forwards the page's object lets a page pass the other
// spelling straight through it (issue 38: `create_session` with forged
// `granted_roots` skipped the folder grant). So the worker never forwards a
// page's object: `buildFrame` copies only the calls and fields listed here,
// in the lowerCamelCase JSON names of proto/pedelec/v1/*.proto, each checked
// against its proto type, into a fresh object. Anything else refuses the
// whole frame, naming the field. Loaded by the worker (importScripts in
// Chromium, `background.scripts` in Firefox) and by approve.html (for
// `isHomeOrRoot`); pure, so Node runs it in its tests.
"use strict";

globalThis.PedelecRequests = (() => {
  const UINT32_MAX = 0xffffffff;
  const UINT64_MAX = 18446744073709551615n;
  /** Page request ids are 1 … 2^31-1; the worker numbers its own from 2^31. */
  const PAGE_ID_LIMIT = 0x80000000;

  // Field types. `forbidden` is a field the worker sets itself: a page that
  // sends it is refused rather than silently overwritten, so a forged value
  // never looks accepted.
  const STRING = { type: "string" };
  const BOOL = { type: "bool" };
  const UINT32 = { type: "uint32" };
  const UINT64 = { type: "uint64" };
  const FORBIDDEN = { type: "forbidden" };
  const ORIGIN = { type: "origin" };
  const repeated = (of) => ({ type: "repeated", of });
  const message = (fields, oneofs = []) => ({ type: "message", fields, oneofs });
  const enumOf = (...names) => ({ type: "enum", names: new Set(names) });

  // session.proto
  const EFFORT_LEVEL = enumOf(
    "EFFORT_LEVEL_UNSPECIFIED",
    "EFFORT_LEVEL_DEFAULT",
    "EFFORT_LEVEL_LOW",
    "EFFORT_LEVEL_HIGH",
  );
  const PERMISSION_MODE = enumOf("PERMISSION_MODE_POLICY", "PERMISSION_MODE_APP");
  const ERROR = message({ code: STRING, message: STRING, detailsJson: STRING });
  const TOOL_DEFINITION = message({
    name: STRING,
    description: STRING,
    inputSchemaJson: STRING,
    timeoutMs: UINT32,
    readOnlyHint: BOOL,
  });
  const SKILLS = message({ guidance: STRING, tools: repeated(TOOL_DEFINITION) });
  // `grantedRoots` once carried grants; now reserved: grants live in Core.
  // `handle`: the opaque workspace handle of a folder the user picked for
  // this origin (pickWorkspace); Core resolves it for this origin only.
  const WORKSPACE_SPEC = message({ path: STRING, handle: STRING, grantedRoots: FORBIDDEN });

  // `callerOrigin` in every request: the worker writes the browser's origin
  // of the port into it. The wasm SDK states its own origin there, which is
  // harmless; any other value is a page trying to act for another origin.
  const session = (fields = {}, oneofs = []) => message({ sessionId: STRING, callerOrigin: ORIGIN, ...fields }, oneofs);

  /** Every call of NativeRequest (native.proto) a page may make, with its request message. */
  const CALLS = {
    ping: message({}),
    listProviders: message({}),
    getSettings: message({}),
    createSession: message({
      provider: STRING,
      model: STRING,
      effortLevel: EFFORT_LEVEL,
      skills: SKILLS,
      workspace: WORKSPACE_SPEC,
      autoEndOnDisconnect: BOOL,
      callerOrigin: ORIGIN,
      permissionMode: PERMISSION_MODE,
    }),
    subscribe: session(),
    prepare: session(),
    sendText: session({ text: STRING, attachments: repeated(STRING), outputSchemaJson: STRING }),
    // `outcome` is a oneof: a result or an error, not both.
    submitToolResult: session({ toolRequestId: STRING, resultJson: STRING, error: ERROR }, [["resultJson", "error"]]),
    end: session(),
    resume: session(),
    createAssetUpload: session({ targetPath: STRING, fileName: STRING, size: UINT64 }),
    createAssetDownload: session({ path: STRING }),
    listAssets: session(),
    unsubscribe: session({ subscriptionId: UINT32 }),
    getHistory: session({ afterSeq: UINT64, beforeId: UINT64, limit: UINT32 }),
    cancel: session({ operationId: STRING }),
    steer: session({ text: STRING, operationId: STRING }),
    getChanges: session({ turnId: STRING }),
    setModel: session({ model: STRING, effortLevel: EFFORT_LEVEL }),
    setTools: session({ tools: repeated(TOOL_DEFINITION) }),
    fork: session({ autoEndOnDisconnect: BOOL }),
    listSessions: message({ callerOrigin: ORIGIN, limit: UINT32, beforeSessionId: STRING }),
    answerPermission: session({ permissionId: STRING, optionId: STRING }),
  };

  /**
   * The owner calls of NativeRequest: the user's decisions (consent), the
   * agent's requests only the user may answer, every site's sessions
   * (list, end, watch, read, cancel), the agents Core detects, the
   * activity log (list, export), and the folder picker (list folders,
   * pick one: a page asks the worker with `pickWorkspace`). Only the extension's own pages make
   * them (the worker for the approval page and the popup, the control
   * center on a host of its own); a page that names one is refused like
   * any unknown call.
   */
  const OWNER_CALLS = Object.freeze([
    "getConsent",
    "setConsent",
    "revokeOrigin",
    "listUserPermissions",
    "answerUserPermission",
    "listLiveSessions",
    "endSessions",
    "watchSession",
    "getSessionHistory",
    "cancelTurn",
    "listAgents",
    "setSettings",
    "listActivity",
    "exportActivity",
    "listFolders",
    "pickFolder",
  ]);

  class Refusal extends Error {
    constructor(field, reason, message) {
      super(`${field}: ${message}`);
      this.field = field;
      this.reason = reason;
    }
  }

  const isPlainObject = (value) => typeof value === "object" && value !== null && !Array.isArray(value);
  const own = (object, key) => Object.prototype.hasOwnProperty.call(object, key);
  const camel = (name) => name.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());

  function unknownField(path, key, known) {
    const hint = own(known, camel(key)) && camel(key) !== key ? ` (fields are spelled lowerCamelCase: ${camel(key)})` : "";
    return new Refusal(`${path}.${key}`, "unknown_field", `not a field a page may send${hint}`);
  }

  function build(spec, value, path, origin) {
    switch (spec.type) {
      case "string":
        if (typeof value !== "string") throw new Refusal(path, "wrong_type", "must be a string");
        return value;
      case "bool":
        if (typeof value !== "boolean") throw new Refusal(path, "wrong_type", "must be a boolean");
        return value;
      case "uint32":
        if (!Number.isInteger(value) || value < 0 || value > UINT32_MAX) {
          throw new Refusal(path, "wrong_type", "must be an integer from 0 to 4294967295");
        }
        return value;
      case "uint64":
        // Protobuf JSON writes 64-bit integers as decimal strings (pbjson,
        // the SDK's serialiser, does); a safe JS integer is accepted too.
        if (Number.isSafeInteger(value) && value >= 0) return value;
        if (typeof value === "string" && /^(0|[1-9][0-9]{0,19})$/.test(value) && BigInt(value) <= UINT64_MAX) {
          return value;
        }
        throw new Refusal(path, "wrong_type", "must be an unsigned 64-bit integer (a number or a decimal string)");
      case "enum":
        if (typeof value !== "string" || !spec.names.has(value)) {
          throw new Refusal(path, "wrong_type", `must be one of ${[...spec.names].join(", ")}`);
        }
        return value;
      case "origin":
        if (value !== origin) {
          throw new Refusal(path, "forbidden_field", "is set by the extension from the browser; a page may not name another origin");
        }
        return value;
      case "forbidden":
        throw new Refusal(path, "forbidden_field", "is set by the extension; a page may not send it");
      case "repeated":
        if (!Array.isArray(value)) throw new Refusal(path, "wrong_type", "must be an array");
        return value.map((item, i) => build(spec.of, item, `${path}[${i}]`, origin));
      case "message": {
        if (!isPlainObject(value)) throw new Refusal(path, "wrong_type", "must be an object");
        const out = {};
        for (const key of Object.keys(value)) {
          if (!own(spec.fields, key)) throw unknownField(path, key, spec.fields);
          out[key] = build(spec.fields[key], value[key], `${path}.${key}`, origin);
        }
        for (const members of spec.oneofs) {
          const set = members.filter((m) => own(out, m));
          if (set.length > 1) throw new Refusal(`${path}.${set[1]}`, "wrong_type", `only one of ${members.join(", ")}`);
        }
        return out;
      }
      default:
        throw new Error(`requests.js: no such type ${spec.type}`);
    }
  }

  /**
   * A fresh NativeFrame for the host from a page's `frame`, holding only
   * allowlisted calls and fields: `{ frame }`, or `{ error: { message,
   * details: { field, reason } } }` naming the first offending field.
   * `origin` is the browser's origin of the page's port. The caller has
   * already checked `frame.requestId` (an error needs an id to answer).
   */
  function buildFrame(input, origin) {
    try {
      if (!isPlainObject(input)) throw new Refusal("frame", "wrong_type", "must be an object");
      const frame = {};
      for (const key of Object.keys(input)) {
        if (key === "requestId") {
          const id = input.requestId;
          if (!Number.isInteger(id) || id <= 0 || id >= PAGE_ID_LIMIT) {
            throw new Refusal("requestId", "wrong_type", "must be an integer from 1 to 2147483647");
          }
          frame.requestId = id;
        } else if (key === "deferAck") {
          frame.deferAck = build(BOOL, input.deferAck, "deferAck", origin);
        } else if (key === "request") {
          const request = input.request;
          if (!isPlainObject(request)) throw new Refusal("request", "wrong_type", "must be an object");
          const calls = Object.keys(request);
          if (calls.length !== 1) throw new Refusal("request", "one_call", "a frame carries exactly one call");
          const call = calls[0];
          if (!own(CALLS, call)) {
            const hint = own(CALLS, camel(call)) && camel(call) !== call ? ` (calls are spelled lowerCamelCase: ${camel(call)})` : "";
            throw new Refusal(`request.${call}`, "unknown_call", `not a call a page may make${hint}`);
          }
          frame.request = { [call]: build(CALLS[call], request[call], `request.${call}`, origin) };
        } else {
          throw unknownField("frame", key, { requestId: 1, deferAck: 1, request: 1 });
        }
      }
      if (!frame.request) throw new Refusal("request", "one_call", "a frame carries exactly one call");
      return { frame };
    } catch (e) {
      if (!(e instanceof Refusal)) throw e;
      return { error: { message: e.message, details: { field: e.field, reason: e.reason } } };
    }
  }

  /**
   * Whether `path` is a filesystem root, a home directory or the directory
   * of homes: never a folder to offer or accept as a grant, because it holds
   * everything of a user (Core refuses it anyway; the prompt should not ask).
   */
  function isHomeOrRoot(path) {
    if (typeof path !== "string") return false;
    const posix = path.replace(/\/+$/, "") || "/";
    if (/^\/$|^\/root$|^\/(home|Users)(\/[^/]+)?$/.test(posix)) return true;
    const windows = path.replace(/[\\/]+$/, "");
    return /^[A-Za-z]:$/.test(windows) || /^[A-Za-z]:[\\/]Users([\\/][^\\/]+)?$/i.test(windows);
  }

  /**
   * The site an origin belongs to, for "one prompt per site" and the
   * cooldown: subdomains of one registrable domain are one site, so a
   * rejected page cannot come back from a fresh subdomain. The rule,
   * without the Public Suffix List: the host's last two labels, or its last
   * three when the last is a two-letter country code and the one before it
   * has at most three letters (a suffix like co.uk, com.au, or.jp). An IP
   * address or a single-label host (localhost) is its own site. Scheme and
   * port are ignored, as browsers' "site" does for the port: every
   * 127.0.0.1 server is one site.
   */
  function siteOf(origin) {
    let host;
    try {
      host = new URL(origin).hostname.toLowerCase();
    } catch (_) {
      return String(origin);
    }
    if (host.startsWith("[") || /^[0-9.]+$/.test(host)) return host;
    const labels = host.replace(/\.$/, "").split(".");
    if (labels.length <= 2) return labels.join(".");
    const [second, last] = labels.slice(-2);
    const keep = last.length === 2 && second.length <= 3 ? 3 : 2;
    return labels.slice(-keep).join(".");
  }

  return Object.freeze({ buildFrame, isHomeOrRoot, siteOf, CALLS: Object.freeze(Object.keys(CALLS)), OWNER_CALLS });
})();
