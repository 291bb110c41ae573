//! Recorded agent transcripts (the real JSON-line and SSE formats) turned
//! into the normalised events Core reports. Each snapshot was reviewed
//! against the format notes in shared/REFERENCE.md.

use pedelec_core::providers::AgentEvent;
use pedelec_core::providers::claude::ClaudeParser;
use pedelec_core::providers::cli_turn::parse_transcript;
use pedelec_core::providers::codex::CodexParser;
use pedelec_core::providers::codex::wire::TranscriptParser;

fn transcript(name: &str) -> String {
    std::fs::read_to_string(format!("{}/tests/transcripts/{name}", env!("CARGO_MANIFEST_DIR"))).expect("transcript")
}

#[test]
fn codex_tool_turn() {
    let mut parser = CodexParser::default();
    let events = parse_transcript(&mut parser, &transcript("codex_tool_turn.jsonl"));
    assert_eq!(parser.thread_id.as_deref(), Some("0199a213-81c0-7800-8aa1-bbab2a035a53"));
    insta::assert_json_snapshot!(events);
}

#[test]
fn codex_failed_turn_falls_back_to_the_last_error() {
    let mut parser = CodexParser::default();
    let events = parse_transcript(&mut parser, &transcript("codex_failed_turn.jsonl"));
    assert!(events.contains(&AgentEvent::Failed {
        message: "stream disconnected before completion: Reconnecting... 1/5".into()
    }));
    insta::assert_json_snapshot!(events);
}

/// codex 0.171 `app-server`, recorded against the test model server: a
/// frontend tool turn (after a `tool_search`), a shell command turn and a
/// plain answer, each streamed as deltas, then whole messages.
#[test]
fn codex_app_server_turns() {
    let mut parser = TranscriptParser::default();
    let events = parse_transcript(&mut parser, &transcript("codex_app_server_turns.jsonl"));
    let deltas: String = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Delta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    let messages: String = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Message { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, messages, "the deltas add up to the messages");
    assert_eq!(events.iter().filter(|e| **e == AgentEvent::TurnDone).count(), 3);
    // The thread's running total: 870 input + 83 output tokens after three turns.
    assert_eq!(
        events.iter().rev().find(|e| matches!(e, AgentEvent::Usage { .. })),
        Some(&AgentEvent::Usage { total_tokens: 953 })
    );
    insta::assert_json_snapshot!(events);
}

/// A model request refused with HTTP 400: an `error` notification, then a `failed` turn.
#[test]
fn codex_app_server_failed_turn() {
    let mut parser = TranscriptParser::default();
    let events = parse_transcript(&mut parser, &transcript("codex_app_server_failed_turn.jsonl"));
    assert!(
        matches!(events.last(), Some(AgentEvent::Failed { message }) if message.contains("scripted failure 400")),
        "{events:?}"
    );
    insta::assert_json_snapshot!(events);
}

#[test]
fn claude_tool_turn() {
    let mut parser = ClaudeParser::new(1000);
    let events = parse_transcript(&mut parser, &transcript("claude_tool_turn.jsonl"));
    // 12 + 1500 + 13000 + 90 tokens this run, on top of the 1000 known.
    assert_eq!(parser.total, 15_602);
    insta::assert_json_snapshot!(events);
}

#[test]
fn claude_error_turn() {
    let mut parser = ClaudeParser::new(0);
    let events = parse_transcript(&mut parser, &transcript("claude_error_turn.jsonl"));
    assert!(matches!(events.last(), Some(AgentEvent::Failed { message }) if message.contains("529")));
    insta::assert_json_snapshot!(events);
}

#[test]
fn openai_tool_round() {
    let (events, completion) = pedelec_core::providers::openai::replay(transcript("openai_tool_round.sse").as_bytes());
    assert_eq!(completion.content, "Let me check.");
    assert_eq!(completion.total_tokens, Some(201));
    let calls = completion.finished_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&calls[0].arguments).unwrap()["delta"], 2);
    insta::assert_json_snapshot!(events);
}

/// What codex 0.171 prints when it refuses a call of our own tool itself
/// (recorded from the matrix's `codex_refused_frontend_tool_reaches_on_error`):
/// the app must hear of it, and a failure Core produced must not be reported twice.
#[test]
fn codex_refused_frontend_tool_is_a_tool_failure() {
    use pedelec_core::providers::cli_turn::LineParser;
    let mut parser = CodexParser::default();
    let refused = r#"{"type":"item.completed","item":{"id":"item_1","type":"mcp_tool_call","server":"pedelec","tool":"explode","arguments":{},"result":null,"error":{"message":"MCP tool call requires approval, but approval policy is never"},"status":"failed"}}"#;
    assert!(parser.line(refused).contains(&AgentEvent::ToolFailed {
        tool: "explode".into(),
        reason: "MCP tool call requires approval, but approval policy is never".into()
    }));
    let theirs = refused.replace(r#""server":"pedelec""#, r#""server":"github""#);
    assert!(!parser.line(&theirs).iter().any(|e| matches!(e, AgentEvent::ToolFailed { .. })));
    assert!(pedelec_core::providers::failed_on_agent_side("requires approval"));
    assert!(!pedelec_core::providers::failed_on_agent_side("TOOL_HANDLER_ERROR: the fuse blew"));
}

/// claude 2.1 refusing an `ask`-ruled tool in `-p` mode: a failed tool_result for a tool_use of ours.
#[test]
fn claude_refused_frontend_tool_is_a_tool_failure() {
    use pedelec_core::providers::cli_turn::LineParser;
    let mut parser = ClaudeParser::new(0);
    parser.line(r#"{"type":"assistant","message":{"content":[{"type":"tool_use","id":"toolu_1","name":"mcp__pedelec__explode","input":{}}]},"parent_tool_use_id":null,"session_id":"s"}"#);
    let events = parser.line(r#"{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"toolu_1","is_error":true,"content":"Claude requested permissions to use mcp__pedelec__explode, but you haven't granted it yet."}]},"session_id":"s"}"#);
    assert!(events.iter().any(|e| matches!(e, AgentEvent::ToolFailed { tool, .. } if tool == "explode")), "{events:?}");
}

/// Stream events of every shape: only a top-level text delta is chat, and
/// one with a field of an unexpected type is not.
#[test]
fn claude_stream_events_of_every_shape() {
    let mut parser = ClaudeParser::new(0);
    let transcript = [
        r#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a\"b\n"}},"session_id":"s1","parent_tool_use_id":null}"#,
        // A subagent's stream is not chat.
        r#"{"type":"stream_event","event":{"type":"content_block_delta","delta":{"type":"text_delta","text":"sub"}},"session_id":"s1","parent_tool_use_id":"toolu_1"}"#,
        r#"{"type":"stream_event","event":{"type":"content_block_delta","delta":{"type":"input_json_delta","partial_json":"{"}},"session_id":"s1"}"#,
        r#"{"type":"stream_event","event":{"type":"content_block_delta","delta":null},"session_id":"s1"}"#,
        r#"{"type":"stream_event","event":{"type":"content_block_delta","delta":{"type":"text_delta","text":7}},"session_id":"s1"}"#,
        r#"{"type":"stream_event","event":{"type":"message_stop"},"session_id":"s2"}"#,
        r#"{"type":"stream_event","event":"odd","session_id":"s2"}"#,
        r#"{"type":"stream_event","event":{"type":"content_block_delta","delta":{"type":"text_delta","text":"c"}}}"#,
    ]
    .join("\n");
    let events = parse_transcript(&mut parser, &transcript);
    assert_eq!(
        events,
        [
            AgentEvent::SessionId { id: "s1".into() },
            AgentEvent::Delta { text: "a\"b\n".into() },
            AgentEvent::SessionId { id: "s2".into() },
            AgentEvent::Delta { text: "c".into() },
        ]
    );
}

/// Agent message items of every shape: only a completed one is a chat
/// message, its text read whatever else the item carries, and one whose
/// text is not a string is an empty message, as before the borrowed reading.
#[test]
fn codex_agent_messages_of_every_shape() {
    let mut parser = CodexParser::default();
    let transcript = [
        r#"{"type":"item.completed","item":{"id":"item_0","type":"agent_message","text":"a\"b\n\u00e9"}}"#,
        // Fields in another order, and more of them.
        r#"{"item":{"text":"second","status":"completed","type":"agent_message","id":"item_1"},"type":"item.completed"}"#,
        r#"{"type":"item.started","item":{"id":"item_2","type":"agent_message","text":"not yet"}}"#,
        r#"{"type":"item.completed","item":{"id":"item_3","type":"agent_message"}}"#,
        r#"{"type":"item.completed","item":{"id":"item_4","type":"agent_message","text":7}}"#,
        r#"{"type":"item.completed","item":{"id":"item_5","type":"reasoning","text":"hm"}}"#,
        r#"{"type":"item.completed","item":"odd"}"#,
        r#"{"type":"item.completed","item":{"id":"item_6","type":"agent_message","text":"last"}}"#,
    ]
    .join("\n");
    let events = parse_transcript(&mut parser, &transcript);
    let messages: Vec<&AgentEvent> = events.iter().filter(|e| matches!(e, AgentEvent::Message { .. })).collect();
    assert_eq!(
        messages,
        [
            &AgentEvent::Message { text: "a\"b\né".into() },
            &AgentEvent::Message { text: "second".into() },
            &AgentEvent::Message { text: String::new() },
            &AgentEvent::Message { text: String::new() },
            &AgentEvent::Message { text: "last".into() },
        ]
    );
    assert!(events.iter().any(|e| matches!(e, AgentEvent::Activity(a) if a.output == "hm")), "{events:?}");
}
