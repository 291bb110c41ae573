//! Fake agents for Pedelec's integration tests. Nothing here talks to a network.
//!
//! # `pedelec-fake-stream`
//!
//! `pedelec-fake-stream claude|codex`: one CLI turn printed in the real wire
//! format of `claude -p --output-format stream-json --include-partial-messages`
//! (N text deltas, the assistant message, the result) or of `codex exec
//! --json` (N `agent_message` items: codex's exec mode streams no text
//! deltas), N from `PEDELEC_FAKE_STREAM_DELTAS` (100 000 by default), as
//! fast as the pipe takes it. `cargo xtask bench` runs Core's claude and
//! codex adapters on it.
//!
//! # `pedelec-fake-acp`
//!
//! An Agent Client Protocol agent (built with the `agent-client-protocol`
//! crate, speaking ACP v1 on stdio) that behaves by the text of each prompt.
//! It answers `initialize` with `loadSession: true` (unless
//! `PEDELEC_FAKE_ACP_NO_LOAD` is set), creates sessions named `fake-<pid>-<n>`
//! (or answers `session/new` with `-32000` auth required when
//! `PEDELEC_FAKE_ACP_NEEDS_AUTH` is set),
//! and keeps every session's prompts so a later process can `session/load`
//! it (in `<log>.sessions/`, next to the log; in memory without a log).
//! `session/load` replays the history as `user_message_chunk` /
//! `agent_message_chunk` updates before it answers; an unknown id is
//! `-32002` resource not found. Every session offers two config options,
//! `model` (category `model`: `fake-small`, `fake-large`) and `thinking`
//! (category `thought_level`: `low`, `medium`, `high`); `session/set_config_option`
//! is logged and accepted.
//!
//! A prompt may carry guidance first: the command is the prompt's last
//! paragraph (after the last blank line), trimmed.
//!
//! | command | behaviour |
//! | --- | --- |
//! | anything else | a thought chunk, then `ACP echo: <text>` in three `agent_message_chunk`s |
//! | the preparation prompt (contains `Reply with exactly PEDELEC_PREPARED`) | replies `PEDELEC_PREPARED` |
//! | `tool NAME JSON` | reports a `tool_call`, asks `session/request_permission`, then (if allowed) calls NAME with JSON through the MCP server it was given in `session/new` `mcpServers` (started once per session with its command, args and env) and replies `ACP tool NAME: <result text>` (`ACP tool NAME error: <text>` for an `isError` result, `… refused: <outcome>` when permission was not granted) |
//! | `tools N NAME JSON` | N calls without permission requests; replies `ACP tools: N calls, p50 X µs, p99 Y µs` (round trip agent → MCP result) |
//! | `permission KIND [PATH]` | asks permission for a tool call of that ACP kind (`execute`, `edit`, …) at PATH; replies `ACP permission: <chosen option kind or cancelled>` |
//! | `fs PATH` | sends `fs/read_text_file` for PATH (which Pedelec does not offer); replies `ACP fs: read N bytes` or `ACP fs: error <code>` |
//! | `history` | replies `ACP history: <n> earlier prompts: <p1> \| <p2> …` for this session |
//! | `usage N` | replies `ACP usage` with `PromptResponse.usage.totalTokens = N` |
//! | `garbage` | writes a non-JSON line, a JSON array, a 2 MiB line, a non-UTF-8 line and an empty line to stdout, then replies `ACP garbage: still here` |
//! | `fail` | answers the prompt with a JSON-RPC internal error |
//! | `crash` | one message chunk, a line on stderr, then exit status 3 mid-turn |
//! | `hang` | never answers the prompt (it still logs a `session/cancel`) |
//! | `deltas N` | N `agent_message_chunk`s of a few bytes each, as fast as stdout takes them (for the benchmark of deltas through a provider process) |
//!
//! If `PEDELEC_FAKE_ACP_LOG` names a file, every step is appended to it as
//! one JSON object per line (`{"event": "start" | "initialize" |
//! "session_new" | "session_load" | "prompt" | "cancel" | "mcp_started" |
//! "tools_list" | "permission" | "set_config_option", …}`): its argv, cwd, pid, the names of the
//! environment variables it saw, and `session/new` params with every env
//! *value* replaced by its length — a tool token is never written.

pub mod log;
pub mod mcp;
pub mod model_server;

/// The p-th percentile (0.0–1.0) of sorted durations, in whole microseconds.
pub fn percentile_us(sorted: &[std::time::Duration], p: f64) -> u128 {
    if sorted.is_empty() {
        return 0;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index].as_micros()
}
