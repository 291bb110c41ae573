// Unit tests of extension/requests.js, the worker's request allowlist, run by
// `node --test` from tests/extension_js.rs. The file is loaded as the
// worker loads it: a classic script in a fresh global, nothing exported.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createContext, runInContext } from "node:vm";

const source = readFileSync(new URL("../../../extension/requests.js", import.meta.url), "utf8");
const context = createContext({ URL });
runInContext(source, context);
const { isHomeOrRoot, siteOf, CALLS, OWNER_CALLS } = context.PedelecRequests;
// Results come from the script's own realm; deepStrictEqual compares
// prototypes, so they are brought into this one.
const buildFrame = (input, origin) => JSON.parse(JSON.stringify(context.PedelecRequests.buildFrame(input, origin)));
const ORIGIN = "https://app.example.com";

// A valid body of every call of NativeRequest (native.proto), with every
// field the page may set, as the wasm SDK's pbjson writes them (64-bit
// integers as strings, enums by name).
const VALID = {
  ping: {},
  listProviders: {},
  getSettings: {},
  createSession: {
    provider: "scripted",
    model: "m",
    effortLevel: "EFFORT_LEVEL_HIGH",
    skills: {
      guidance: "be brief",
      tools: [{ name: "t", description: "d", inputSchemaJson: '{"type":"object"}', timeoutMs: 1000 }],
    },
    workspace: { path: "/srv/project", handle: "" },
    autoEndOnDisconnect: false,
    callerOrigin: ORIGIN,
    permissionMode: "PERMISSION_MODE_APP",
  },
  subscribe: { sessionId: "sess-1", callerOrigin: ORIGIN },
  prepare: { sessionId: "sess-1", callerOrigin: ORIGIN },
  sendText: { sessionId: "sess-1", callerOrigin: ORIGIN, text: "hi", attachments: ["/a.png"], outputSchemaJson: '{"type":"object"}' },
  submitToolResult: { sessionId: "sess-1", callerOrigin: ORIGIN, toolRequestId: "tr", resultJson: "{}" },
  end: { sessionId: "sess-1", callerOrigin: ORIGIN },
  resume: { sessionId: "sess-1", callerOrigin: ORIGIN },
  createAssetUpload: { sessionId: "sess-1", callerOrigin: ORIGIN, targetPath: "/a", fileName: "a", size: "12" },
  createAssetDownload: { sessionId: "sess-1", callerOrigin: ORIGIN, path: "/a" },
  listAssets: { sessionId: "sess-1", callerOrigin: ORIGIN },
  unsubscribe: { sessionId: "sess-1", callerOrigin: ORIGIN, subscriptionId: 4 },
  getHistory: { sessionId: "sess-1", callerOrigin: ORIGIN, afterSeq: "3", beforeId: 7, limit: 10 },
  cancel: { sessionId: "sess-1", callerOrigin: ORIGIN, operationId: "op" },
  steer: { sessionId: "sess-1", callerOrigin: ORIGIN, text: "and this", operationId: "op" },
  getChanges: { sessionId: "sess-1", callerOrigin: ORIGIN, turnId: "turn-1" },
  setModel: { sessionId: "sess-1", callerOrigin: ORIGIN, model: "m-2", effortLevel: "EFFORT_LEVEL_HIGH" },
  // `readOnlyHint`: a WebMCP descriptor's annotations.readOnlyHint (the user's activity log shows it).
  setTools: {
    sessionId: "sess-1",
    callerOrigin: ORIGIN,
    tools: [{ name: "t", description: "d", inputSchemaJson: "{}", timeoutMs: 1000, readOnlyHint: true }],
  },
  fork: { sessionId: "sess-1", callerOrigin: ORIGIN, autoEndOnDisconnect: false },
  listSessions: { callerOrigin: ORIGIN, limit: 5, beforeSessionId: "sess-0" },
  answerPermission: { sessionId: "sess-1", callerOrigin: ORIGIN, permissionId: "p", optionId: "o" },
};

const frame = (call, body, extra = {}) => ({ requestId: 7, request: { [call]: body }, ...extra });
const refused = (input) => {
  const out = buildFrame(input, ORIGIN);
  assert.ok(out.error, `refused: ${JSON.stringify(input)} → ${JSON.stringify(out)}`);
  return out.error.details;
};
const clone = (v) => JSON.parse(JSON.stringify(v));

test("every call of NativeRequest has a valid body here, and only those", () => {
  const proto = readFileSync(new URL("../../../proto/pedelec/v1/native.proto", import.meta.url), "utf8");
  const block = proto.slice(proto.indexOf("message NativeRequest"), proto.indexOf("message UnsubscribeRequest"));
  const calls = [...block.matchAll(/^\s+\w+Request (\w+) = \d+;/gm)].map((m) => m[1].replace(/_(.)/g, (_, c) => c.toUpperCase()));
  // Each call is either a page's or the owner's, never both.
  assert.deepEqual([...CALLS, ...OWNER_CALLS].sort(), calls.sort());
  assert.deepEqual(Object.keys(VALID).sort(), [...CALLS].sort());
});

test("a page cannot make an owner call, in any spelling", () => {
  // The control center's views: the agents Core detects (and the settings
  // written from them), consent (Sites) and the activity log; and the folder
  // picker (a page asks the worker instead).
  const views = ["listAgents", "setSettings", "getConsent", "setConsent", "revokeOrigin", "listActivity", "exportActivity"];
  for (const call of [...views, "listFolders", "pickFolder"]) {
    assert.ok(OWNER_CALLS.includes(call), call);
  }
  const consent = { origin: ORIGIN, approved: true, folders: [{ path: "/", mayApproveCommands: true }] };
  for (const call of OWNER_CALLS) {
    const snake = call.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
    for (const name of [call, snake]) {
      const details = refused(frame(name, { callerOrigin: "app:pedelec-extension", consent, origin: ORIGIN }));
      assert.equal(details.field, `request.${name}`, name);
    }
  }
});

test("each valid body passes, copied as it came, into a fresh object", () => {
  for (const [call, body] of Object.entries(VALID)) {
    const input = frame(call, clone(body), { deferAck: true });
    const out = buildFrame(input, ORIGIN);
    assert.ok(out.frame, `${call}: ${JSON.stringify(out.error)}`);
    assert.deepEqual(out.frame, input);
    const raw = context.PedelecRequests.buildFrame(input, ORIGIN).frame;
    assert.notEqual(raw.request[call], input.request[call], "a fresh object, not the page's");
  }
  // pbjson leaves out defaults: the empty bodies pass too.
  for (const call of Object.keys(VALID)) assert.ok(buildFrame(frame(call, {}), ORIGIN).frame, call);
  // A submitted error instead of a result.
  const error = { sessionId: "s", toolRequestId: "t", error: { code: "TOOL_HANDLER_ERROR", message: "boom", detailsJson: "{}" } };
  assert.ok(buildFrame(frame("submitToolResult", error), ORIGIN).frame);
});

test("the spelling attack and its mixed variants are refused, naming the field", () => {
  const forged = { provider: "scripted", workspace: { path: "/etc", granted_roots: ["/"] } };
  assert.deepEqual(refused(frame("create_session", forged)), { field: "request.create_session", reason: "unknown_call" });
  assert.deepEqual(refused(frame("createSession", forged)), {
    field: "request.createSession.workspace.granted_roots",
    reason: "unknown_field",
  });
  assert.deepEqual(refused(frame("createSession", { workspace: { path: "/etc", grantedRoots: ["/"] } })), {
    field: "request.createSession.workspace.grantedRoots",
    reason: "forbidden_field",
  });
  assert.deepEqual(refused(frame("createSession", { workspace: { path: "/etc", grantedRoots: [] } })).reason, "forbidden_field");
  // A picked folder's handle is a string; Core alone resolves it, for this origin only.
  assert.ok(buildFrame(frame("createSession", { workspace: { handle: "wsh-0123" } }), ORIGIN).frame);
  assert.deepEqual(refused(frame("createSession", { workspace: { handle: ["wsh-0123"] } })), {
    field: "request.createSession.workspace.handle",
    reason: "wrong_type",
  });
  assert.deepEqual(refused({ request_id: 7, request: { ping: {} }, requestId: 7 }).field, "frame.request_id");
  assert.deepEqual(refused(frame("sendText", { session_id: "s" })).field, "request.sendText.session_id");
});

test("another origin, an unknown call, two calls, unknown fields and wrong types are refused", () => {
  assert.deepEqual(refused(frame("end", { sessionId: "s", callerOrigin: "https://evil.example" })), {
    field: "request.end.callerOrigin",
    reason: "forbidden_field",
  });
  assert.equal(refused(frame("listSessions", { callerOrigin: "" })).reason, "forbidden_field");
  assert.equal(refused(frame("approveOrigin", {})).reason, "unknown_call");
  assert.equal(refused(frame("__proto__", {})).reason, "unknown_call");
  assert.equal(refused({ requestId: 7, request: { ping: {}, end: {} } }).reason, "one_call");
  assert.equal(refused({ requestId: 7, request: {} }).reason, "one_call");
  assert.equal(refused({ requestId: 7 }).reason, "one_call");
  assert.equal(refused({ requestId: 7, request: { ping: {} }, acks: [1] }).field, "frame.acks");
  assert.equal(refused({ requestId: 7, request: { ping: {} }, deferAck: "yes" }).field, "deferAck");
  assert.equal(refused({ requestId: 2 ** 31, request: { ping: {} } }).field, "requestId");
  assert.deepEqual(refused(frame("setTools", { tools: [{ name: "t", readOnlyHint: "yes" }] })), {
    field: "request.setTools.tools[0].readOnlyHint",
    reason: "wrong_type",
  });
  assert.equal(refused(frame("ping", null)).reason, "wrong_type");
  assert.equal(refused(frame("ping", [])).reason, "wrong_type");
  assert.equal(refused(frame("ping", { extra: 1 })).field, "request.ping.extra");

  // Every field of every valid body, mutated to a wrong type, and one unknown field added.
  const wrong = (v) => (typeof v === "string" ? [v] : typeof v === "object" ? "x" : "5x");
  const mutate = (body, path, check) => {
    for (const [key, value] of Object.entries(body)) {
      if (key === "callerOrigin") continue;
      const changed = clone(body);
      changed[key] = wrong(value);
      check(changed, `${path}.${key}`, changed);
      if (value && typeof value === "object" && !Array.isArray(value)) {
        mutate(value, `${path}.${key}`, (inner, field) => {
          const outer = clone(body);
          outer[key] = inner;
          check(outer, field);
        });
      }
    }
    const extra = clone(body);
    extra.notAField = "x";
    check(extra, `${path}.notAField`);
  };
  for (const [call, body] of Object.entries(VALID)) {
    mutate(body, `request.${call}`, (changed, field) => {
      const details = refused(frame(call, changed));
      assert.equal(details.field.replace(/\[\d+\]/g, ""), field, JSON.stringify(changed));
    });
  }

  // Range and shape checks of the numeric and enum types.
  assert.ok(refused(frame("unsubscribe", { subscriptionId: -1 })));
  assert.ok(refused(frame("unsubscribe", { subscriptionId: 2 ** 32 })));
  assert.ok(refused(frame("unsubscribe", { subscriptionId: 1.5 })));
  assert.ok(refused(frame("getHistory", { afterSeq: "18446744073709551616" })));
  assert.ok(refused(frame("getHistory", { afterSeq: "-1" })));
  assert.ok(buildFrame(frame("getHistory", { afterSeq: "18446744073709551615" }), ORIGIN).frame);
  assert.ok(refused(frame("createSession", { effortLevel: 3 })));
  assert.ok(refused(frame("createSession", { effortLevel: "EFFORT_LEVEL_MAX" })));
  assert.ok(refused(frame("createSession", { skills: { tools: [{ name: "t", timeout_ms: 5 }] } })));
  assert.ok(refused(frame("submitToolResult", { resultJson: "{}", error: { code: "X" } })));
  assert.ok(refused(frame("sendText", { attachments: ["/a", 5] })));
});

test("roots and homes are never a grant", () => {
  for (const p of ["/", "/root", "/home", "/home/bob", "/home/bob/", "/Users/ann", "C:\\", "C:\\Users\\ann", "c:/Users/ann/"]) {
    assert.equal(isHomeOrRoot(p), true, p);
  }
  for (const p of ["/home/bob/project", "/srv", "/Users/ann/code", "D:\\work", "/rootless", "/homes/x"]) {
    assert.equal(isHomeOrRoot(p), false, p);
  }
});

test("a site groups subdomains by registrable domain", () => {
  assert.equal(siteOf("https://a.b.example.com"), "example.com");
  assert.equal(siteOf("https://example.com:8443"), "example.com");
  assert.equal(siteOf("https://x.shop.co.uk"), "shop.co.uk");
  assert.equal(siteOf("https://co.uk"), "co.uk");
  assert.equal(siteOf("http://127.0.0.1:9000"), "127.0.0.1");
  assert.equal(siteOf("http://localhost:3000"), "localhost");
  assert.notEqual(siteOf("https://evil.com"), siteOf("https://example.com"));
});
