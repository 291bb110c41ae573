// Calls every method pedelec.d.ts declares, as an application would, so
// `tsc --noEmit` proves the declarations hang together and read as meant
// (cargo xtask web-typecheck). The browser test checks the other half:
// every method declared here exists on the real wasm objects.
import init, {
  Pedelec,
  type Activity,
  type Asset,
  type HistoryEntry,
  type PedelecError,
  type PedelecSession,
  type PedelecSessionStatus,
  type PermissionRequest,
  type PickedWorkspace,
  type SessionSummary,
  type ToolDefinition,
} from "pedelec";

type ToolName = "update_counter" | "read_page";

export async function everyMethod(file: File): Promise<void> {
  await init();
  const pedelec = new Pedelec({ extensionId: "ighbaanpnpjegfpbhfnaekbncchadgfe" });
  const relayed: Pedelec = new Pedelec({ extensionId: "ighbaanpnpjegfpbhfnaekbncchadgfe", channel: "relay" });
  void relayed;
  const tools: ToolDefinition<ToolName>[] = [
    { name: "update_counter", description: "Adds delta to the counter", inputSchema: { type: "object" } },
    { name: "read_page", description: "Reads the page", timeoutMs: 5000, handler: () => "the page" },
  ];
  // A WebMCP tool descriptor, as registered with document.modelContext.
  const webmcp: ToolDefinition = {
    name: "page_title",
    description: "The page's title",
    inputSchema: { type: "object" },
    annotations: { readOnlyHint: true },
    execute: async () => ({ title: "t" }),
  };
  void webmcp;
  const swap = async (s: PedelecSession<ToolName>) => s.setTools(tools);
  void swap;
  // @ts-expect-error a tool needs a description (Core refuses one without it)
  const undescribed: ToolDefinition = { name: "nameless" };
  void undescribed;

  const session: PedelecSession<ToolName> = await pedelec.createSession<ToolName>({
    provider: "scripted",
    model: "scripted-1",
    effortLevel: "low",
    skills: { guidance: "Be brief.", tools },
    workspace: { path: "/home/me/project" },
    autoEndOnDisconnect: false,
    permissions: "app",
  });
  const again: PedelecSession<ToolName> = await pedelec.resumeSession<ToolName>(session.sessionId);
  const sessions: SessionSummary[] = await pedelec.listSessions();
  const providers = await pedelec.listProviders();
  const settings = await pedelec.getSettings();
  const approval = await pedelec.getApprovalStatus();
  const availability = await pedelec.checkAvailability();
  const picked: PickedWorkspace = await pedelec.pickWorkspace();
  const inPicked = await pedelec.createSession({ workspace: { handle: picked.handle } });
  console.log(picked.name, inPicked.sessionId);
  console.log(sessions.length, providers[0]?.available, settings.defaultProvider, approval.approved, availability.reason);

  const fields: [string, string, number, number | undefined] = [
    session.provider,
    session.effortLevel ?? "default",
    session.sessionCreatedAt,
    session.usage.totalTokens,
  ];
  console.log(fields);

  const offs: Array<() => void> = [
    session.onChat((text, ctx) => console.log(text, ctx.type, ctx.turnId)),
    session.onChatDelta((text, ctx) => console.log(text, ctx.type)),
    session.onActivity((activity: Activity, ctx) => console.log(activity.kind, activity.status, ctx.type)),
    session.onPermission(async (request: PermissionRequest) => request.policyOptionId),
    session.onTool((tool: ToolName, args, ctx) => ({ tool, args, id: ctx.toolRequestId })),
    session.onTool<{ delta: number }, { value: number }>("update_counter", ({ delta }) => ({ value: delta })),
    session.onError((error: PedelecError, ctx) => console.log(error.code, error.details, ctx.type)),
    session.onStatus((status: PedelecSessionStatus, ctx) => console.log(status, ctx.previousStatus)),
    session.onEnded((ctx) => console.log(ctx.type)),
  ];

  await session.prepare();
  const path = await session.uploadAsset(file, "/inputs/data.csv");
  await session.sendText("Summarise it.", { attachments: [path] });
  const assets: Asset[] = await session.listAssets();
  const text: string = await session.readAsset("/out/summary.txt", "text");
  const json = await session.readAsset<{ rows: number }>("/out/summary.json", "json");
  const bytes: File = await session.readAsset("/out/chart.png", "file");
  console.log(assets.length, text, json.rows, bytes.size);
  const page = await session.getHistory({ afterSeq: 0, limit: 50 });
  const kinds = page.entries.map((entry: HistoryEntry) => (entry.kind === "assistant_message" ? entry.text : entry.kind));
  console.log(kinds, page.hasMore, session.getStatus());
  await session.steer("Keep the old name as an alias.");
  const changes = await session.getChanges({ turnId: "turn-1" });
  for (const f of changes.files) console.log(f.kind, f.path, f.diff, f.binary, f.secret, f.diffTruncated, f.size);
  console.log(changes.complete, changes.inProgress, (await session.getChanges()).turnId);
  const switched = await session.setModel("scripted-text-only", { effortLevel: "high" });
  console.log(switched.model, switched.effortLevel);
  const typed = await session.sendText<{ title: string }>("Name the page.", {
    outputSchema: { type: "object", properties: { title: { type: "string" } }, required: ["title"] },
  });
  console.log(typed.title);
  const other: PedelecSession<ToolName> = await session.fork();
  await other.sendText("Try the other way.");
  const changed = page.entries.find((e: HistoryEntry) => e.kind === "model_changed");
  if (changed?.kind === "model_changed") console.log(changed.model);
  await session.cancel();
  await session.end();
  await again.resume();
  for (const off of offs) off();
  again.free();
  session.free();
  pedelec.free();
}
