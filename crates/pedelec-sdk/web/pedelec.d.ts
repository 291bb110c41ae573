// Hand-written types of the Pedelec browser SDK (the wasm-bindgen build of
// pedelec-sdk, `cargo xtask web`). Names and shapes follow the seed pages.

export type PedelecSessionStatus = "idle" | "running" | "waiting_tool_result" | "ended" | "error";
export type EffortLevel = "default" | "low" | "high";
/** A public asset path such as "/results/report.json". */
export type AssetPath = string;
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

/** Rejections and onError values: a JS Error with a stable code. */
export interface PedelecError extends Error {
  name: "PedelecError";
  code: string;
  message: string;
  details?: JsonValue;
}

export interface PedelecEventContext {
  sessionId: string;
  provider: string;
  effortLevel?: EffortLevel;
  sessionCreatedAt: number;
  eventReceivedAt?: number;
  eventEmittedAt: number;
  turnId?: string;
  turnStartedAt?: number;
  turnKind?: "user" | "prepare";
  source: "core" | "sdk";
}
export type StatusEventContext = PedelecEventContext & {
  type: "status_changed" | "sdk_status_changed";
  previousStatus: PedelecSessionStatus;
};
export type ChatEventContext = PedelecEventContext & { type: "chat" };
export type ChatDeltaEventContext = PedelecEventContext & { type: "chat_delta" };
export type ActivityEventContext = PedelecEventContext & { type: "activity" };
export type PermissionEventContext = PedelecEventContext & { type: "permission_requested" };
export type ErrorEventContext = PedelecEventContext & { type: "error" | "sdk_error" };
export type EndedEventContext = PedelecEventContext & { type: "ended" | "sdk_ended" };
export type ToolCallContext = PedelecEventContext & { type: "tool_call"; toolRequestId: string; tool: string };

export interface PedelecSessionUsage {
  totalTokens?: number;
}

export interface Asset {
  name: string;
  path: AssetPath;
  size: number;
  mimeType: string;
  modifiedAt: number;
}

export type ActivityKind =
  | "command" | "file_edit" | "file_read" | "search" | "fetch" | "tool_call"
  | "plan" | "thinking" | "permission" | "note" | "other";
export type ActivityStatus = "pending" | "in_progress" | "completed" | "failed";

/**
 * The agent's own work, as it reports it (`onActivity`). Each call carries the
 * whole current state of one activity; `activityId` says which one it replaces.
 */
export interface Activity {
  activityId: string;
  kind: ActivityKind;
  title: string;
  /** null for activities without one (thinking, notes). */
  status: ActivityStatus | null;
  /** The shell command, for "command". */
  command: string;
  paths: string[];
  /** A command's output, a tool's result or error, the reasoning; at most 2 000 characters. */
  output: string;
  plan: { content: string; status: ActivityStatus | null }[];
}

/** An agent asks permission (sessions created with `permissions: "app"`). */
export interface PermissionRequest {
  permissionId: string;
  /** What it is about: kind, title, command, paths. */
  activity: Activity | null;
  options: { optionId: string; name: string; kind: "allow_once" | "allow_always" | "reject_once" | "reject_always" | "other" }[];
  /** The option Core's policy would choose (what is answered without a handler); null: it would reject. */
  policyOptionId: string | null;
  /** Core clock (ms since epoch) after which Core rejects it. */
  deadlineAt: number;
}

/** One entry of a session's transcript (`getHistory`). */
export type HistoryEntry = {
  /** Unique and increasing within the session: the paging cursor (`beforeId`). */
  id: number;
  /** The seq of the event it was recorded with, or of the last event before it. */
  seq: number;
  /** Core clock (ms since epoch) when it was recorded. */
  at: number;
  /** The operation it belongs to; null for session-level entries. */
  operationId: string | null;
} & (
  | { kind: "user_text"; text: string; attachments?: AssetPath[] }
  /** `interrupted`: cut short by `cancel()` — the text streamed until then. */
  | { kind: "assistant_message"; text: string; interrupted?: true }
  | { kind: "tool_call"; toolRequestId: string; tool: string; args: JsonValue }
  | { kind: "tool_result"; toolRequestId: string; result?: JsonValue; errorCode?: string }
  | { kind: "activity"; activity: string; summary: string; detail?: Activity }
  | { kind: "tool_failed"; tool: string; reason: string }
  | { kind: "operation_completed"; error: { code: string; message: string } | null }
  | { kind: "ended"; reason: string }
  | { kind: "resumed" }
  /** setModel changed the model (and effort level) for the turns after it. */
  | { kind: "model_changed"; model: string; effortLevel?: EffortLevel }
);

/** One file a turn changed (`getChanges`). */
export interface FileChange {
  /** Relative to the workspace, `/`-separated. */
  path: string;
  kind: "created" | "modified" | "deleted";
  /** A unified diff; empty when `binary`, `secret`, or too large to keep. */
  diff: string;
  binary: boolean;
  /** Its name looks like it holds secrets (`.env`, keys): listed without content. */
  secret: boolean;
  /** The diff stops early (64 KiB per file, 1 MiB per answer) or was not made. */
  diffTruncated: boolean;
  /** Bytes after the turn (0 when deleted). */
  size: number;
}

/** What one turn changed in the workspace (`getChanges`). */
export interface TurnChanges {
  turnId: string;
  operationId: string;
  files: FileChange[];
  /** False when a bound was reached and some files were not compared. */
  complete: boolean;
  /** The turn still runs: its changes so far. */
  inProgress: boolean;
}

export interface HistoryPage {
  /** Oldest first. */
  entries: HistoryEntry[];
  /** Older entries match too: ask again with `beforeId: entries[0].id`. */
  hasMore: boolean;
}

export interface HistoryOptions {
  /** Only entries with seq > afterSeq (what a re-synchronised view missed); default from the start. */
  afterSeq?: number;
  /** Only entries with id < beforeId (page back); default up to the newest. */
  beforeId?: number;
  /** Entries per page: default 100, at most 1000. */
  limit?: number;
}

/** One of this origin's sessions (`listSessions`). */
export interface SessionSummary {
  sessionId: string;
  provider: string;
  model: string;
  status: PedelecSessionStatus;
  /** Core clock (ms since epoch). */
  createdAt: number;
  /** Core clock (ms since epoch) of the session's newest event. */
  lastActivityAt: number;
}

export type ToolSpecificHandler<TArgs = unknown, TResult = unknown> = (
  args: TArgs,
  ctx: ToolCallContext,
) => TResult | Promise<TResult>;

export interface ToolDefinition<TName extends string = string> {
  name: TName;
  /** Required (Core refuses an empty one with TOOLS_MANIFEST_INVALID): the agent reads it to decide when to call. */
  description: string;
  /** JSON Schema of the arguments; defaults to `{ "type": "object" }`. */
  inputSchema?: JsonValue;
  /** Enforced by Core (default 60 s). */
  timeoutMs?: number;
  /** Inline handler; a named onTool(name, handler) overrides it. */
  handler?: ToolSpecificHandler;
  /**
   * A WebMCP tool descriptor's handler (`{ name, description, inputSchema, execute }`,
   * as registered with `document.modelContext`): used when `handler` is absent.
   */
  execute?: ToolSpecificHandler;
  /**
   * WebMCP annotations. `readOnlyHint: true` reaches Core as the tool's
   * `readOnlyHint` and tags its calls "read-only" in the user's activity log
   * (a hint, never enforced); other hints are accepted and ignored.
   */
  annotations?: { readOnlyHint?: boolean; [hint: string]: unknown };
}

/** The folder the user picked (`pickWorkspace()`). */
export interface PickedWorkspace {
  /** Opaque: pass it as `createSession({ workspace: { handle } })`. */
  handle: string;
  /** The folder's base name (e.g. "my-project"). */
  name: string;
}

export interface CreateSessionOptions<TName extends string = string> {
  provider?: string;
  model?: string;
  effortLevel?: EffortLevel;
  skills?: { guidance?: string; tools?: readonly ToolDefinition<TName>[] };
  /** Same as `skills.tools`. */
  tools?: readonly ToolDefinition<TName>[];
  /**
   * Where the agent works. `path`: an absolute folder inside one the user
   * granted this origin (else the user is asked). `handle`: a folder the user
   * picked for this origin (`pickWorkspace()`); never both. Omitted: a
   * folder Core manages.
   */
  workspace?: { path?: string; handle?: string };
  /** Core ends the session when its last subscriber leaves (default true). */
  autoEndOnDisconnect?: boolean;
  /** Who answers the agent's permission requests: Core's policy (default) or the page (`onPermission`). */
  permissions?: "policy" | "app";
}

export interface ProviderInfo {
  name: string;
  code: string;
  available: boolean;
  reason?: string;
}

export interface Settings {
  defaultProvider: string;
  defaultModels: Record<string, string>;
}

export interface ApprovalStatus {
  /** The extension answered on this page. */
  installed: boolean;
  /** This origin is approved. */
  approved: boolean;
  /** The origin the browser reports for this page. */
  origin: string;
  /** The native host and Core answered (checked only for approved origins). */
  appConnected: boolean;
  /** An approval prompt for this origin is open. */
  pending: boolean;
}

export interface Availability {
  available: boolean;
  reason?: "extension_not_installed" | "origin_not_approved" | "app_not_connected";
}

export declare class PedelecSession<TToolName extends string = string> {
  private constructor();
  readonly sessionId: string;
  readonly provider: string;
  readonly effortLevel?: EffortLevel;
  readonly sessionCreatedAt: number;
  readonly usage: PedelecSessionUsage;

  prepare(): Promise<void>;
  /**
   * `attachments`: this session's asset paths sent with the text — images as
   * image content where the provider takes them (else ATTACHMENT_UNSUPPORTED),
   * other files as links or paths.
   */
  sendText(text: string, options?: { attachments?: AssetPath[] }): Promise<void>;
  /**
   * A typed turn: the agent's final answer must be JSON valid against
   * `outputSchema` (a JSON Schema object). Core asks the agent for JSON, checks
   * the answer and asks once more on a mismatch; resolves with the value, or
   * rejects with `OUTPUT_INVALID` (`details.errors` says why, `details.answer`
   * is what the agent said) or `INVALID_ARGUMENT` for a schema that does not
   * compile.
   */
  sendText<TOutput = unknown>(
    text: string,
    options: { attachments?: AssetPath[]; outputSchema: Record<string, unknown> },
  ): Promise<TOutput>;
  uploadAsset(file: File, targetPath?: AssetPath): Promise<AssetPath>;
  listAssets(): Promise<Asset[]>;
  /** The transcript, page by page: the newest `limit` matching entries, oldest first. */
  getHistory(options?: HistoryOptions): Promise<HistoryPage>;
  readAsset(path: AssetPath, type: "text"): Promise<string>;
  readAsset<T = JsonValue>(path: AssetPath, type: "json"): Promise<T>;
  readAsset(path: AssetPath, type: "file"): Promise<File>;

  onChat(handler: (text: string, ctx: ChatEventContext) => void): () => void;
  onChatDelta(handler: (text: string, ctx: ChatDeltaEventContext) => void): () => void;
  /** Agent-side work: tool calls, commands, file edits, plans; a handle attaching mid-turn hears the turn's so far. */
  onActivity(handler: (activity: Activity, ctx: ActivityEventContext) => void): () => void;
  /**
   * Answers the agent's permission requests: return the chosen `optionId`, or
   * null to reject (a Promise is awaited). Without a handler the policy's option
   * is answered; without an answer by the deadline Core rejects.
   */
  onPermission(
    handler: (request: PermissionRequest, ctx: PermissionEventContext) => string | null | undefined | Promise<string | null | undefined>,
  ): () => void;
  onTool(handler: (tool: TToolName, args: unknown, ctx: ToolCallContext) => unknown | Promise<unknown>): () => void;
  onTool<TArgs = unknown, TResult = unknown>(
    toolName: TToolName,
    handler: ToolSpecificHandler<TArgs, TResult>,
  ): () => void;
  onError(handler: (error: PedelecError, ctx: ErrorEventContext) => void): () => void;
  onStatus(handler: (status: PedelecSessionStatus, ctx: StatusEventContext) => void): () => void;
  onEnded(handler: (ctx: EndedEventContext) => void): () => void;
  getStatus(): PedelecSessionStatus;
  /**
   * Stops the running operation: its awaited `sendText`/`prepare` rejects with
   * `OPERATION_CANCELLED`, pending tool calls are withdrawn, the status returns
   * to `idle` (resolved once it has), the text so far stays in the transcript,
   * and the next turn continues the same agent thread. Works from a second tab
   * of the same origin; a no-op when nothing runs.
   */
  cancel(): Promise<void>;
  /**
   * Adds `text` to the turn that is running, where the agent can take input
   * mid-turn (codex at once; claude at its next tool round or right after
   * its answer; the built-in `scripted` provider); resolves once the
   * agent took it. The running `sendText` still resolves once, at the turn's
   * end, and the text is the user's in the history. Rejects without sending
   * anything: `STEER_UNSUPPORTED` (this agent cannot be steered),
   * `TURN_NOT_RUNNING` (no turn runs, or it ended first), `INVALID_ARGUMENT`
   * (empty text), `TEXT_TOO_LARGE`.
   */
  steer(text: string): Promise<void>;
  /**
   * Replaces the session's frontend tools between turns (tool definitions or
   * WebMCP descriptors, as `createSession({ tools })` takes them); the agent sees
   * the new list from its next turn. Rejects with `TOOLS_MANIFEST_INVALID`
   * (nothing changed) or `SESSION_BUSY` while a turn runs.
   */
  setTools(tools: readonly ToolDefinition<TToolName>[]): Promise<void>;
  /**
   * Changes the model (and `effortLevel`, if given) from the next turn; the agent
   * continues the same conversation. Rejects with `INVALID_ARGUMENT` for an empty
   * or malformed name, `SESSION_ENDED` once the session ended.
   */
  setModel(model: string, options?: { effortLevel?: EffortLevel }): Promise<{ model: string; effortLevel?: EffortLevel }>;
  /**
   * A new session that continues a copy of this one's conversation, with its
   * own `sessionId`; both go on independently. It has this session's provider,
   * model, effort level, tools and permission mode, and works in the same
   * folder (or a copy of a managed workspace). The new session answers the
   * agent with this session's tool and permission handlers (those given to
   * `createSession` and `onTool`/`onPermission`); listeners such as `onChat` are
   * registered on it anew. Fork between turns. Rejects with `SESSION_BUSY`
   * while a turn runs, `SESSION_ENDED` once ended, and `FORK_UNSUPPORTED` for
   * an agent that cannot fork (codex-acp, gemini); nothing is created then.
   */
  fork(): Promise<PedelecSession<TToolName>>;
  /**
   * The files a turn created, modified or deleted in the workspace, each with a
   * unified diff where one can be shown. Without `turnId`: the running turn
   * (its changes so far, `inProgress`), else the last finished one. Computed by
   * Core for every agent from a snapshot taken at the turn's start; rejects with
   * `CHANGES_NOT_FOUND` when none are recorded for that turn.
   */
  getChanges(options?: { turnId?: string }): Promise<TurnChanges>;
  resume(): Promise<void>;
  end(): Promise<void>;
  free(): void;
}

/** What `bridgeModelContext` reads of a WebMCP model context (the draft's agent-side calls). */
export interface ModelContextLike {
  getTools(): Promise<Iterable<{
    readonly name: string;
    readonly description?: string | null;
    readonly inputSchema?: object | null;
    readonly annotations?: { readOnlyHint?: boolean } | null;
    execute?(input: JsonValue): unknown;
  }>>;
  executeTool?(tool: unknown, input: JsonValue): Promise<unknown>;
  addEventListener?(type: "toolchange", listener: () => void): void;
  removeEventListener?(type: "toolchange", listener: () => void): void;
}

/** A running `bridgeModelContext`. */
export interface ModelContextBridge {
  /** Lists the page's tools again and hands them to the session. */
  refresh(): Promise<void>;
  /** Resolves once the syncs started so far (after `toolchange` events) are done. */
  whenSynced(): Promise<void>;
  /** Stops following the page's tools; the session keeps its current ones. */
  stop(): void;
  /** Called with an error a later sync met (a tool list Core refused, …). */
  onerror: ((error: PedelecError) => void) | null;
}

export declare class Pedelec {
  /**
   * `channel`: how the page reaches the extension. `"auto"` (the default)
   * uses `chrome.runtime.connect(extensionId)` where the browser offers it and
   * the extension's content-script relay elsewhere (Firefox); `"relay"`
   * always uses the relay.
   */
  constructor(options: { extensionId: string; channel?: "auto" | "relay" });
  createSession<TName extends string = string>(options?: CreateSessionOptions<TName>): Promise<PedelecSession<TName>>;
  resumeSession<TName extends string = string>(sessionId: string): Promise<PedelecSession<TName>>;
  /** This origin's sessions, newest created first (never another origin's). */
  listSessions(): Promise<SessionSummary[]>;
  listProviders(): Promise<ProviderInfo[]>;
  getSettings(): Promise<Settings>;
  getApprovalStatus(): Promise<ApprovalStatus>;
  checkAvailability(): Promise<Availability>;
  /**
   * Lets the user pick a folder for this page in the extension's folder
   * picker (asking first to approve the origin if it is not yet). The user
   * browses their own folders, listed by Pedelec Core, never by the page;
   * the folder picked is granted to this origin, and the page gets an opaque
   * `handle` for `createSession({ workspace: { handle } })` (good for this
   * origin only, as long as the user keeps the grant) and the folder's
   * `name` — never its path. Rejects with `PICK_CANCELLED` when the user
   * closes the picker or cancels (`details.reason`: "cancelled", "closed",
   * "timeout" after 10 minutes, or "already_open" when a picker is already
   * open for this origin), `ORIGIN_NOT_ALLOWED` when the user refuses the
   * origin.
   */
  pickWorkspace(): Promise<PickedWorkspace>;
  /**
   * Mirrors the tools the page registered with WebMCP (`document.modelContext`,
   * else the older `navigator.modelContext`, or `options.modelContext`) into
   * `session` with `setTools`, each run in the page when the agent calls it,
   * and follows the page's `toolchange` events (a change during a turn is
   * applied when the turn ends). `annotations.readOnlyHint` goes along.
   * Rejects with `MODEL_CONTEXT_UNAVAILABLE` when the page has no model
   * context that can list its tools, or as `setTools` does.
   */
  bridgeModelContext(session: PedelecSession<string>, options?: { modelContext?: ModelContextLike }): Promise<ModelContextBridge>;
  free(): void;
}

/** Loads the wasm module; call once before constructing `Pedelec`. */
export default function init(module_or_path?: RequestInfo | URL | Response | BufferSource | WebAssembly.Module): Promise<unknown>;
