//! `pedelec-fake-stream FORMAT`: one turn of a CLI agent printed in its real
//! wire format, as fast as a pipe takes it, for the benchmark of deltas
//! through a provider process. `claude` prints `claude -p --output-format
//! stream-json --include-partial-messages` (N text deltas, then the assistant
//! message and the result); `codex` prints `codex exec --json` (N
//! `agent_message` items: codex's exec mode streams no text deltas, so each is
//! a whole message). N is `PEDELEC_FAKE_STREAM_DELTAS` (default 100 000). The
//! adapter's own arguments after FORMAT are ignored, but for `--version`: the
//! fake names a codex older than `app-server`, so Core drives it through
//! `exec --json`. `claude` lives as Core keeps the real CLI (`--input-format
//! stream-json`): one turn per user message on stdin, until stdin closes;
//! `codex` prints its one turn and exits, ignoring the prompt.

use std::io::{BufWriter, Write};

const COUNT_ENV: &str = "PEDELEC_FAKE_STREAM_DELTAS";
const SESSION: &str = "0199a213-81c0-7800-8aa1-bbab2a035a53";

fn main() -> std::io::Result<()> {
    let format = std::env::args().nth(1).unwrap_or_default();
    if std::env::args().nth(2).as_deref() == Some("--version") {
        println!("{format}-cli 0.1.0-fake");
        return Ok(());
    }
    let n: usize = std::env::var(COUNT_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let mut out = BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    match format.as_str() {
        "claude" => {
            // A turn per user message; control requests (an interrupt) have
            // nothing to stop here: the turn is printed whole at once.
            for line in std::io::stdin().lines() {
                if line?.contains(r#""type":"user""#) {
                    claude(&mut out, n)?;
                    out.flush()?;
                }
            }
        }
        "codex" => {
            // Drained on the side, so the adapter's prompt writer never waits
            // on a full pipe; the process exits without waiting for the end of it.
            std::thread::spawn(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink()));
            codex(&mut out, n)?
        }
        other => {
            eprintln!("pedelec-fake-stream: unknown format {other:?} (claude or codex)");
            std::process::exit(2);
        }
    }
    out.flush()
}

/// The text of delta `i`: short, like a model's tokens, and never in need of
/// JSON escaping.
fn piece(i: usize) -> String {
    format!("w{} ", i % 10)
}

fn claude(out: &mut impl Write, n: usize) -> std::io::Result<()> {
    writeln!(
        out,
        r#"{{"type":"system","subtype":"init","cwd":"/","session_id":"{SESSION}","tools":[],"mcp_servers":[],"model":"claude-sonnet-4-5","permissionMode":"default","apiKeySource":"none","uuid":"u0"}}"#
    )?;
    writeln!(
        out,
        r#"{{"type":"stream_event","event":{{"type":"message_start","message":{{"id":"msg_1","content":[]}}}},"session_id":"{SESSION}","parent_tool_use_id":null,"uuid":"u1"}}"#
    )?;
    let mut all = String::with_capacity(n * 4);
    for i in 0..n {
        let text = piece(i);
        writeln!(
            out,
            r#"{{"type":"stream_event","event":{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{text}"}}}},"session_id":"{SESSION}","parent_tool_use_id":null,"uuid":"d{i}"}}"#
        )?;
        all.push_str(&text);
    }
    writeln!(
        out,
        r#"{{"type":"assistant","message":{{"id":"msg_1","model":"claude-sonnet-4-5","content":[{{"type":"text","text":"{all}"}}],"stop_reason":"end_turn","usage":{{"input_tokens":10,"output_tokens":{n}}}}},"parent_tool_use_id":null,"session_id":"{SESSION}","uuid":"u2"}}"#
    )?;
    writeln!(
        out,
        r#"{{"type":"result","subtype":"success","is_error":false,"duration_ms":1,"num_turns":1,"result":"done","session_id":"{SESSION}","usage":{{"input_tokens":10,"output_tokens":{n}}},"uuid":"u3"}}"#
    )
}

fn codex(out: &mut impl Write, n: usize) -> std::io::Result<()> {
    writeln!(out, r#"{{"type":"thread.started","thread_id":"{SESSION}"}}"#)?;
    writeln!(out, r#"{{"type":"turn.started"}}"#)?;
    for i in 0..n {
        let text = piece(i);
        writeln!(
            out,
            r#"{{"type":"item.completed","item":{{"id":"item_{i}","type":"agent_message","text":"{text}"}}}}"#
        )?;
    }
    writeln!(
        out,
        r#"{{"type":"turn.completed","usage":{{"input_tokens":10,"cached_input_tokens":0,"output_tokens":{n}}}}}"#
    )
}
