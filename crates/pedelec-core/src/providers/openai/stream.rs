//! Sans-IO reading of a streamed chat completion: SSE framing, then chunk
//! accumulation (content, tool calls by index, finish reason, usage).

use serde_json::Value;

use crate::providers::AgentEvent;

/// Splits an SSE byte stream into `data:` payloads (multi-line data joined by `\n`).
#[derive(Default)]
pub struct SseDecoder {
    buffer: Vec<u8>,
    data: Vec<String>,
}

/// A payload is bounded so a server cannot grow Core's memory without end.
pub const MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;

impl SseDecoder {
    /// Feeds bytes; returns complete event payloads, or an error for an oversized event.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<String>, String> {
        self.buffer.extend_from_slice(bytes);
        let mut out = Vec::new();
        // Lines are consumed by offset and the buffer compacted once: draining
        // line by line would be quadratic in a large read.
        let mut start = 0;
        while let Some(len) = self.buffer[start..].iter().position(|&b| b == b'\n') {
            let raw = &self.buffer[start..start + len];
            start += len + 1;
            let line = String::from_utf8_lossy(raw);
            let line = line.strip_suffix('\r').unwrap_or(&line);
            if line.is_empty() {
                if !self.data.is_empty() {
                    out.push(std::mem::take(&mut self.data).join("\n"));
                }
            } else if let Some(data) = line.strip_prefix("data:") {
                self.data.push(data.strip_prefix(' ').unwrap_or(data).to_owned());
            }
            // `event:`, `id:`, `retry:` and `:` comments carry nothing for chat completions.
        }
        self.buffer.drain(..start);
        if self.buffer.len() + self.data.iter().map(String::len).sum::<usize>() > MAX_EVENT_BYTES {
            return Err(format!("a server-sent event exceeds {MAX_EVENT_BYTES} bytes"));
        }
        Ok(out)
    }

    /// The stream ended: a last event without its blank line still counts.
    pub fn finish(&mut self) -> Option<String> {
        if !self.buffer.is_empty() {
            let rest = String::from_utf8_lossy(&std::mem::take(&mut self.buffer)).into_owned();
            if let Some(data) = rest.trim_end().strip_prefix("data:") {
                self.data.push(data.trim_start().to_owned());
            }
        }
        (!self.data.is_empty()).then(|| std::mem::take(&mut self.data).join("\n"))
    }
}

/// One tool call the model asked for, arguments still as text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestedCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// The shape of most chunks of a streamed answer: text in `choices[].delta`.
/// Reading a chunk into a `serde_json::Value` tree allocated every key and
/// string of it; this borrows from the payload and skips what it does not
/// name. A field of another type fails this reading, and the chunk then
/// takes the full one.
#[derive(serde::Deserialize)]
struct TextChunk<'a> {
    #[serde(default)]
    error: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    usage: Option<serde::de::IgnoredAny>,
    #[serde(default, borrow)]
    choices: Option<Vec<TextChoice<'a>>>,
}

#[derive(serde::Deserialize)]
struct TextChoice<'a> {
    #[serde(default)]
    index: u64,
    #[serde(default, borrow)]
    delta: TextDelta<'a>,
    #[serde(default, borrow)]
    finish_reason: Option<std::borrow::Cow<'a, str>>,
}

#[derive(serde::Deserialize, Default)]
struct TextDelta<'a> {
    #[serde(default, borrow)]
    content: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<serde::de::IgnoredAny>,
}

/// Accumulates one streamed completion.
#[derive(Default)]
pub struct Completion {
    pub content: String,
    pub calls: Vec<RequestedCall>,
    /// Which entry of `calls` each stream `index` currently feeds.
    slots: Vec<(u64, usize)>,
    pub finish_reason: Option<String>,
    pub total_tokens: Option<u64>,
    pub done: bool,
}

impl Completion {
    /// Applies one SSE payload; returns the events it means right away (deltas).
    pub fn apply(&mut self, payload: &str) -> Vec<AgentEvent> {
        if payload.trim() == "[DONE]" {
            self.done = true;
            return Vec::new();
        }
        if let Some(events) = self.text_chunk(payload) {
            return events;
        }
        let chunk: Value = match serde_json::from_str(payload) {
            Ok(chunk) => chunk,
            // A lost chunk is a lost word or tool-call fragment: never a
            // silently damaged answer.
            Err(e) => return vec![AgentEvent::Failed { message: format!("a stream chunk is not JSON ({e})") }],
        };
        if let Some(message) = chunk.pointer("/error/message").and_then(Value::as_str) {
            return vec![AgentEvent::Failed { message: message.to_owned() }];
        }
        if let Some(total) = chunk.pointer("/usage/total_tokens").and_then(Value::as_u64) {
            self.total_tokens = Some(total);
        }
        let mut events = Vec::new();
        // Some servers send `choices: null` or omit it on the usage chunk.
        let choices = chunk.get("choices").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        for choice in choices.iter().filter(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0) {
            if let Some(text) = choice.pointer("/delta/content").and_then(Value::as_str)
                && !text.is_empty()
            {
                self.content.push_str(text);
                events.push(AgentEvent::Delta { text: text.to_owned() });
            }
            let calls = choice.pointer("/delta/tool_calls").and_then(Value::as_array);
            for call in calls.map(Vec::as_slice).unwrap_or_default() {
                self.tool_delta(call);
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finish_reason = Some(reason.to_owned());
            }
        }
        events
    }

    /// A chunk of text only (no error, usage or tool calls), read without
    /// building a JSON tree; `None` sends the chunk to the full reading.
    fn text_chunk(&mut self, payload: &str) -> Option<Vec<AgentEvent>> {
        let chunk: TextChunk<'_> = serde_json::from_str(payload).ok()?;
        let choices = chunk.choices.unwrap_or_default();
        if chunk.error.is_some() || chunk.usage.is_some() || choices.iter().any(|c| c.delta.tool_calls.is_some()) {
            return None;
        }
        let mut events = Vec::new();
        for choice in choices.into_iter().filter(|c| c.index == 0) {
            if let Some(text) = choice.delta.content.filter(|t| !t.is_empty()) {
                self.content.push_str(&text);
                events.push(AgentEvent::Delta { text: text.into_owned() });
            }
            if let Some(reason) = choice.finish_reason {
                self.finish_reason = Some(reason.into_owned());
            }
        }
        Some(events)
    }

    fn tool_delta(&mut self, call: &Value) {
        let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
        let id = call.get("id").and_then(Value::as_str).filter(|id| !id.is_empty());
        let slot = self.slots.iter().find(|(i, _)| *i == index).map(|(_, slot)| *slot);
        // A different id at a known index is a new call (Ollama reuses index 0).
        let slot = match slot {
            Some(slot) if id.is_none_or(|id| self.calls[slot].id.is_empty() || self.calls[slot].id == id) => slot,
            _ => {
                self.calls.push(RequestedCall::default());
                let slot = self.calls.len() - 1;
                self.slots.retain(|(i, _)| *i != index);
                self.slots.push((index, slot));
                slot
            }
        };
        let entry = &mut self.calls[slot];
        if let Some(id) = id {
            entry.id = id.to_owned();
        }
        if let Some(name) = call.pointer("/function/name").and_then(Value::as_str) {
            entry.name.push_str(name);
        }
        match call.pointer("/function/arguments") {
            Some(Value::String(fragment)) => entry.arguments.push_str(fragment),
            // A few servers send the arguments as an object, whole.
            Some(object @ Value::Object(_)) => entry.arguments = object.to_string(),
            _ => {}
        }
    }

    /// The calls with made-up ids where the server gave none.
    pub fn finished_calls(&self) -> Vec<RequestedCall> {
        self.calls
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.name.is_empty())
            .map(|(n, c)| RequestedCall {
                id: if c.id.is_empty() { format!("call_{n}") } else { c.id.clone() },
                name: c.name.clone(),
                arguments: if c.arguments.trim().is_empty() { "{}".into() } else { c.arguments.clone() },
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_frames_split_anywhere_join_back() {
        let stream = b"data: {\"a\":1}\n\n: comment\nevent: x\ndata: line1\ndata: line2\r\n\r\ndata: [DONE]\n\n";
        for split in 0..stream.len() {
            let mut decoder = SseDecoder::default();
            let mut got = decoder.feed(&stream[..split]).unwrap();
            got.extend(decoder.feed(&stream[split..]).unwrap());
            assert_eq!(got, vec!["{\"a\":1}", "line1\nline2", "[DONE]"], "split at {split}");
        }
    }

    /// The text-only reading and the full one agree: what the first takes,
    /// and what it leaves to the second (usage, tool calls, errors, odd types).
    #[test]
    fn text_chunks_and_the_rest_read_alike() {
        let mut c = Completion::default();
        let text = |t: &str| AgentEvent::Delta { text: t.into() };
        assert_eq!(c.apply(r#"{"choices":[{"index":0,"delta":{"content":"a\"b\n"}}]}"#), [text("a\"b\n")]);
        assert_eq!(c.apply(r#"{"choices":[{"delta":{"content":"c"},"finish_reason":null}]}"#), [text("c")]);
        assert!(c.apply(r#"{"choices":[{"index":1,"delta":{"content":"other choice"}}]}"#).is_empty());
        assert!(c.apply(r#"{"choices":[{"index":0,"delta":{"content":""}}]}"#).is_empty());
        assert!(c.apply(r#"{"choices":null}"#).is_empty());
        assert_eq!(c.apply(r#"{"choices":[{"index":0,"delta":null}]}"#), []);
        let call = r#"{"choices":[{"index":0,"delta":{"content":"d","tool_calls":[{"index":0,"id":"call_1","function":{"name":"t","arguments":"{}"}}]}}]}"#;
        assert_eq!(c.apply(call), [text("d")]);
        assert_eq!(c.apply(r#"{"choices":[],"usage":{"total_tokens":42}}"#), []);
        assert_eq!(c.apply(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#), []);
        assert_eq!(c.content, "a\"b\ncd");
        assert_eq!(c.total_tokens, Some(42));
        assert_eq!(c.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(
            c.finished_calls(),
            [RequestedCall { id: "call_1".into(), name: "t".into(), arguments: "{}".into() }]
        );
        let failed = c.apply(r#"{"error":{"message":"overloaded"}}"#);
        assert_eq!(failed, [AgentEvent::Failed { message: "overloaded".into() }]);
    }

    #[test]
    fn an_endless_event_is_refused() {
        let mut decoder = SseDecoder::default();
        let big = vec![b'x'; MAX_EVENT_BYTES + 1];
        assert!(decoder.feed(&big).is_err());
    }

    #[test]
    fn fragmented_and_whole_tool_calls_accumulate() {
        let mut c = Completion::default();
        for payload in [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"update_counter","arguments":""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"del"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ta\":2}"}}]}}]}"#,
            // Ollama style: a whole second call at the same index with a new id.
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_b","function":{"name":"get_time","arguments":{}}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}"#,
            "[DONE]",
        ] {
            c.apply(payload);
        }
        assert_eq!(
            c.finished_calls(),
            vec![
                RequestedCall { id: "call_a".into(), name: "update_counter".into(), arguments: "{\"delta\":2}".into() },
                RequestedCall { id: "call_b".into(), name: "get_time".into(), arguments: "{}".into() },
            ]
        );
        assert_eq!(c.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(c.total_tokens, Some(15));
        assert!(c.done);
    }

    #[test]
    fn content_streams_as_deltas_and_errors_fail() {
        let mut c = Completion::default();
        let events = c.apply(r#"{"choices":[{"index":0,"delta":{"content":"Hel"}}]}"#);
        assert_eq!(events, vec![AgentEvent::Delta { text: "Hel".into() }]);
        c.apply(r#"{"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}],"usage":null}"#);
        assert_eq!(c.content, "Hello");
        let events = c.apply(r#"{"error":{"message":"model not loaded"}}"#);
        assert_eq!(events, vec![AgentEvent::Failed { message: "model not loaded".into() }]);
        assert!(matches!(c.apply("not json")[0], AgentEvent::Failed { .. }), "a malformed chunk fails the answer");
    }
}
