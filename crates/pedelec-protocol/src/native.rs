//! Chrome native-messaging framing, sans-IO.
//!
//! A frame is a 4-byte little-endian length followed by that many bytes of
//! UTF-8 JSON. [`FrameDecoder`] is fed bytes as they arrive and yields whole
//! frames; it never panics and reports a truncated stream, a length over the
//! limit, invalid UTF-8 and invalid JSON as distinct errors. Frames larger
//! than the host→browser limit are split into [`pb::Chunk`] frames by
//! [`encode_native_frame`] and put back together by [`ChunkAssembler`].
//!
//! # Examples
//!
//! ```
//! use pedelec_protocol::native::{FrameDecoder, decode_native_frame, encode_native_frame};
//! use pedelec_protocol::pb;
//!
//! let frame = pb::NativeFrame { request_id: 7, ..Default::default() };
//! let bytes = encode_native_frame(&frame, 1024, 0).concat();
//! // Bytes arrive in whatever pieces the pipe delivers.
//! let mut decoder = FrameDecoder::new(1024);
//! decoder.push(&bytes[..3]);
//! assert!(decoder.next_frame().is_none());
//! decoder.push(&bytes[3..]);
//! let text = decoder.next_frame().unwrap().unwrap();
//! assert_eq!(decode_native_frame(&text).unwrap(), frame);
//! ```

use crate::error_code::ErrorCode;
use crate::json;
use crate::pb;

/// Length prefix size.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::native::{HEADER_LEN, encode_frame};
///
/// let bytes = encode_frame("{}", 1024).unwrap();
/// assert_eq!(bytes.len(), HEADER_LEN + 2);
/// ```
pub const HEADER_LEN: usize = 4;

/// A framing failure.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::native::{NativeFrameError, encode_frame};
///
/// let error = encode_frame("{}", 1).unwrap_err();
/// assert_eq!(error, NativeFrameError::TooLarge { len: 2, limit: 1 });
/// assert_eq!(error.to_string(), "frame of 2 bytes exceeds the 1-byte limit");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NativeFrameError {
    #[error("frame of {len} bytes exceeds the {limit}-byte limit")]
    TooLarge { len: usize, limit: usize },
    #[error("stream ended inside a frame: {got} of {expected} bytes")]
    Truncated { expected: usize, got: usize },
    #[error("frame is not valid UTF-8")]
    InvalidUtf8,
    #[error("frame is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("bad chunk: {0}")]
    BadChunk(String),
    #[error("bad event batch: {0}")]
    BadBatch(String),
}

impl NativeFrameError {
    /// The protocol error code for this failure.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::ErrorCode;
    /// use pedelec_protocol::native::NativeFrameError;
    ///
    /// assert_eq!(NativeFrameError::InvalidUtf8.code(), ErrorCode::NativeFrameInvalidUtf8);
    /// // A bad chunk or batch is reported as invalid JSON.
    /// assert_eq!(NativeFrameError::BadChunk("index 3 of count 2".into()).code(), ErrorCode::NativeFrameInvalidJson);
    /// ```
    pub fn code(&self) -> ErrorCode {
        match self {
            NativeFrameError::TooLarge { .. } => ErrorCode::NativeFrameTooLarge,
            NativeFrameError::Truncated { .. } => ErrorCode::NativeFrameTruncated,
            NativeFrameError::InvalidUtf8 => ErrorCode::NativeFrameInvalidUtf8,
            NativeFrameError::InvalidJson(_) | NativeFrameError::BadChunk(_) | NativeFrameError::BadBatch(_) => {
                ErrorCode::NativeFrameInvalidJson
            }
        }
    }
}

/// An error frame answering `request_id`.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::native::error_frame;
/// use pedelec_protocol::pb::native_frame::Body;
/// use pedelec_protocol::ErrorCode;
///
/// let frame = error_frame(12, ErrorCode::OriginNotAllowed, "unknown extension");
/// assert_eq!(frame.request_id, 12);
/// assert!(matches!(frame.body, Some(Body::Error(e)) if e.code == "ORIGIN_NOT_ALLOWED"));
/// ```
pub fn error_frame(request_id: u32, code: ErrorCode, message: impl Into<String>) -> pb::NativeFrame {
    pb::NativeFrame {
        request_id,
        body: Some(pb::native_frame::Body::Error(pb::Error::new(code, message))),
        ..Default::default()
    }
}

/// The request id and call of a request frame — what the native host accepts
/// from the browser and Core from a relay stream — or the error frame
/// (`INVALID_ARGUMENT`) that answers anything else.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::native::request_call;
/// use pedelec_protocol::pb::{self, native_frame::Body, native_request::Call};
///
/// let ping = |request_id| pb::NativeFrame {
///     request_id,
///     body: Some(Body::Request(pb::NativeRequest { call: Some(Call::Ping(pb::PingRequest {})) })),
///     ..Default::default()
/// };
/// let (id, call) = request_call(ping(3)).unwrap();
/// assert_eq!(id, 3);
/// assert!(matches!(call, Call::Ping(_)));
/// // Request id 0 is reserved for frames that answer no request.
/// let refused = request_call(ping(0)).unwrap_err();
/// assert!(matches!(refused.body, Some(Body::Error(e)) if e.code == "INVALID_ARGUMENT"));
/// ```
pub fn request_call(frame: pb::NativeFrame) -> Result<(u32, pb::native_request::Call), Box<pb::NativeFrame>> {
    let request_id = frame.request_id;
    let request = match frame.body {
        Some(pb::native_frame::Body::Request(request)) => request,
        _ => return Err(Box::new(error_frame(request_id, ErrorCode::InvalidArgument, "expected a request frame"))),
    };
    if request_id == 0 {
        return Err(Box::new(error_frame(0, ErrorCode::InvalidArgument, "a request needs a non-zero requestId")));
    }
    match request.call {
        Some(call) => Ok((request_id, call)),
        None => Err(Box::new(error_frame(request_id, ErrorCode::InvalidArgument, "unknown or missing request type"))),
    }
}

/// The response a request's acknowledgement stands for, when the request
/// may be acknowledged at all: those whose success carries nothing. A sender
/// sets `NativeFrame.defer_ack` only on these, and settles an acknowledged
/// one with this reply; the native host defers only these. `None`: the
/// request's success carries data and always comes as a response frame.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::native::acknowledged_reply;
/// use pedelec_protocol::pb::{self, native_request::Call, native_response::Result as Reply};
///
/// let submit = Call::SubmitToolResult(pb::SubmitToolResultRequest::default());
/// assert_eq!(acknowledged_reply(&submit), Some(Reply::SubmitToolResult(pb::SubmitToolResultResponse {})));
/// assert_eq!(acknowledged_reply(&Call::Ping(pb::PingRequest {})), None);
/// ```
pub fn acknowledged_reply(call: &pb::native_request::Call) -> Option<pb::native_response::Result> {
    use pb::native_request::Call;
    use pb::native_response::Result as Reply;
    match call {
        Call::SubmitToolResult(_) => Some(Reply::SubmitToolResult(pb::SubmitToolResultResponse {})),
        Call::AnswerPermission(_) => Some(Reply::AnswerPermission(pb::AnswerPermissionResponse {})),
        _ => None,
    }
}

/// Frames one JSON text, refusing it when over `limit`.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::native::encode_frame;
///
/// // A little-endian u32 length, then the text.
/// assert_eq!(encode_frame("{}", 1024).unwrap(), [2, 0, 0, 0, b'{', b'}']);
/// assert!(encode_frame("{}", 1).is_err());
/// ```
pub fn encode_frame(json: &str, limit: usize) -> Result<Vec<u8>, NativeFrameError> {
    if json.len() > limit {
        return Err(NativeFrameError::TooLarge { len: json.len(), limit });
    }
    let mut out = Vec::with_capacity(HEADER_LEN + json.len());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(json.as_bytes());
    Ok(out)
}

/// Frames a [`pb::NativeFrame`]; when its JSON exceeds `limit` it becomes
/// ordered chunk frames, each within `limit`. `message_id` names the chunk set.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::native::{HEADER_LEN, encode_native_frame};
/// use pedelec_protocol::pb::{self, native_frame::Body, session_event::Kind};
///
/// let chat = Kind::Chat(pb::Chat { text: "x".repeat(10_000) });
/// let event = pb::SessionEvent { session_id: "s".into(), seq: 1, kind: Some(chat), ..Default::default() };
/// let frame = pb::NativeFrame { request_id: 0, body: Some(Body::Event(event)), ..Default::default() };
/// let pieces = encode_native_frame(&frame, 4096, 1);
/// assert!(pieces.len() > 1);
/// assert!(pieces.iter().all(|piece| piece.len() <= 4096 + HEADER_LEN));
/// ```
pub fn encode_native_frame(frame: &pb::NativeFrame, limit: usize, message_id: u32) -> Vec<Vec<u8>> {
    let text = json::to_json(frame);
    if let Ok(single) = encode_frame(&text, limit) {
        return vec![single];
    }
    split_into_chunks(&text, limit, message_id)
        .iter()
        .map(|chunk| encode_frame(&json::to_json(chunk), limit).expect("chunks are sized to fit"))
        .collect()
}

/// Splits JSON text into chunk frames whose own JSON fits in `limit`.
fn split_into_chunks(text: &str, limit: usize, message_id: u32) -> Vec<pb::NativeFrame> {
    // Room for the envelope; escaping can grow a slice, so each slice is
    // shrunk until its escaped form fits.
    let budget = limit.saturating_sub(128).max(64);
    let mut pieces = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut take = budget.min(rest.len());
        loop {
            while !rest.is_char_boundary(take) {
                take -= 1;
            }
            let escaped = serde_json::to_string(&rest[..take]).map(|s| s.len()).unwrap_or(usize::MAX);
            if escaped <= budget || take <= 1 {
                break;
            }
            take = (take * budget / escaped).clamp(1, take - 1);
        }
        pieces.push(&rest[..take]);
        rest = &rest[take..];
    }
    let count = pieces.len() as u32;
    pieces
        .into_iter()
        .enumerate()
        .map(|(index, data)| pb::NativeFrame {
            request_id: 0,
            body: Some(pb::native_frame::Body::Chunk(pb::Chunk {
                message_id,
                index: index as u32,
                count,
                data: data.to_owned(),
            })),
            ..Default::default()
        })
        .collect()
}

/// Incremental decoder of length-prefixed frames.
///
/// # Examples
///
/// ```
/// use pedelec_protocol::native::FrameDecoder;
///
/// let mut decoder = FrameDecoder::new(1024);
/// // Two frames in one read.
/// decoder.push(&[2, 0, 0, 0, b'{', b'}', 2, 0, 0, 0, b'[', b']']);
/// assert_eq!(decoder.next_frame(), Some(Ok("{}".to_string())));
/// assert_eq!(decoder.next_frame(), Some(Ok("[]".to_string())));
/// assert_eq!(decoder.next_frame(), None);
/// ```
#[derive(Debug)]
pub struct FrameDecoder {
    buffer: Vec<u8>,
    limit: usize,
    poisoned: bool,
}

impl FrameDecoder {
    /// A decoder refusing frames over `limit` bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::native::{FrameDecoder, NativeFrameError};
    ///
    /// let mut decoder = FrameDecoder::new(16);
    /// decoder.push(&[17, 0, 0, 0]);
    /// assert_eq!(decoder.next_frame(), Some(Err(NativeFrameError::TooLarge { len: 17, limit: 16 })));
    /// ```
    pub fn new(limit: usize) -> Self {
        FrameDecoder { buffer: Vec::new(), limit, poisoned: false }
    }

    /// Adds received bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::native::FrameDecoder;
    ///
    /// let mut decoder = FrameDecoder::new(1024);
    /// for byte in [2, 0, 0, 0, b'{'] {
    ///     decoder.push(&[byte]);
    /// }
    /// assert_eq!(decoder.next_frame(), None);
    /// decoder.push(b"}");
    /// assert_eq!(decoder.next_frame(), Some(Ok("{}".to_string())));
    /// ```
    pub fn push(&mut self, bytes: &[u8]) {
        if !self.poisoned {
            self.buffer.extend_from_slice(bytes);
        }
    }

    /// The next complete frame's text, `None` when more bytes are needed.
    /// After `TooLarge` the stream cannot be resynchronised and yields nothing more.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::native::{FrameDecoder, NativeFrameError};
    ///
    /// let mut decoder = FrameDecoder::new(16);
    /// decoder.push(&[2, 0, 0, 0, 0xff, 0xfe, 2, 0, 0, 0, b'{', b'}']);
    /// // Invalid UTF-8 spoils only its own frame.
    /// assert_eq!(decoder.next_frame(), Some(Err(NativeFrameError::InvalidUtf8)));
    /// assert_eq!(decoder.next_frame(), Some(Ok("{}".to_string())));
    /// ```
    pub fn next_frame(&mut self) -> Option<Result<String, NativeFrameError>> {
        if self.poisoned || self.buffer.len() < HEADER_LEN {
            return None;
        }
        let len = u32::from_le_bytes(self.buffer[..HEADER_LEN].try_into().ok()?) as usize;
        if len > self.limit {
            self.poisoned = true;
            self.buffer = Vec::new();
            return Some(Err(NativeFrameError::TooLarge { len, limit: self.limit }));
        }
        if self.buffer.len() < HEADER_LEN + len {
            return None;
        }
        let body: Vec<u8> = self.buffer.drain(..HEADER_LEN + len).skip(HEADER_LEN).collect();
        Some(String::from_utf8(body).map_err(|_| NativeFrameError::InvalidUtf8))
    }

    /// Call at end of stream: an unfinished frame is `Truncated`.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::native::{FrameDecoder, NativeFrameError};
    ///
    /// let mut decoder = FrameDecoder::new(16);
    /// decoder.push(&[3, 0, 0, 0, b'a']);
    /// assert_eq!(decoder.next_frame(), None);
    /// assert_eq!(decoder.finish(), Err(NativeFrameError::Truncated { expected: 7, got: 5 }));
    /// ```
    pub fn finish(&self) -> Result<(), NativeFrameError> {
        if self.poisoned || self.buffer.is_empty() {
            return Ok(());
        }
        let expected = if self.buffer.len() >= HEADER_LEN {
            u32::from_le_bytes(self.buffer[..HEADER_LEN].try_into().unwrap_or_default()) as usize + HEADER_LEN
        } else {
            HEADER_LEN
        };
        Err(NativeFrameError::Truncated { expected, got: self.buffer.len() })
    }
}

/// Parses one frame's text as a [`pb::NativeFrame`].
///
/// # Examples
///
/// ```
/// use pedelec_protocol::native::{NativeFrameError, decode_native_frame};
///
/// let frame = decode_native_frame(r#"{"requestId":5,"request":{"ping":{}}}"#).unwrap();
/// assert_eq!(frame.request_id, 5);
/// assert!(matches!(decode_native_frame("{nope"), Err(NativeFrameError::InvalidJson(_))));
/// ```
pub fn decode_native_frame(text: &str) -> Result<pb::NativeFrame, NativeFrameError> {
    json::from_json(text).map_err(|e| NativeFrameError::InvalidJson(e.to_string()))
}

/// Reassembles chunked frames. One chunk set is in flight at a time per
/// connection (the sender writes chunks of one frame consecutively).
///
/// # Examples
///
/// ```
/// use pedelec_protocol::native::{ChunkAssembler, FrameDecoder, decode_native_frame, encode_native_frame};
/// use pedelec_protocol::pb::{self, native_frame::Body, session_event::Kind};
///
/// let chat = Kind::Chat(pb::Chat { text: "long answer ".repeat(1_000) });
/// let event = pb::SessionEvent { session_id: "s".into(), seq: 1, kind: Some(chat), ..Default::default() };
/// let frame = pb::NativeFrame { request_id: 0, body: Some(Body::Event(event)), ..Default::default() };
///
/// let mut decoder = FrameDecoder::new(4096);
/// let mut assembler = ChunkAssembler::new(1024 * 1024);
/// let mut whole = None;
/// for piece in encode_native_frame(&frame, 4096, 1) {
///     decoder.push(&piece);
///     let text = decoder.next_frame().unwrap().unwrap();
///     whole = assembler.accept(decode_native_frame(&text).unwrap()).unwrap();
/// }
/// assert_eq!(whole, Some(frame));
/// ```
#[derive(Debug)]
pub struct ChunkAssembler {
    limit: usize,
    current: Option<(u32, u32, String)>,
    next_index: u32,
}

impl ChunkAssembler {
    /// An assembler refusing reassembled frames over `limit` bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::native::{ChunkAssembler, NativeFrameError};
    /// use pedelec_protocol::pb::{self, native_frame::Body};
    ///
    /// let mut assembler = ChunkAssembler::new(4);
    /// let chunk = pb::Chunk { message_id: 1, index: 0, count: 2, data: "0123456789".into() };
    /// let result = assembler.accept(pb::NativeFrame { request_id: 0, body: Some(Body::Chunk(chunk)), ..Default::default() });
    /// assert!(matches!(result, Err(NativeFrameError::TooLarge { len: 10, limit: 4 })));
    /// ```
    pub fn new(limit: usize) -> Self {
        ChunkAssembler { limit, current: None, next_index: 0 }
    }

    /// Feeds one frame: non-chunk frames pass through; a chunk yields the
    /// reassembled frame once its last piece arrives.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::native::{ChunkAssembler, NativeFrameError};
    /// use pedelec_protocol::pb::{self, native_frame::Body};
    ///
    /// let mut assembler = ChunkAssembler::new(1024);
    /// let ping = pb::NativeFrame { request_id: 1, ..Default::default() };
    /// // Frames that are not chunks pass straight through.
    /// assert_eq!(assembler.accept(ping.clone()), Ok(Some(ping)));
    /// // A chunk set must begin with its first piece.
    /// let second = pb::Chunk { message_id: 9, index: 1, count: 2, data: "}".into() };
    /// let refused = assembler.accept(pb::NativeFrame { request_id: 0, body: Some(Body::Chunk(second)), ..Default::default() });
    /// assert!(matches!(refused, Err(NativeFrameError::BadChunk(_))));
    /// ```
    pub fn accept(&mut self, frame: pb::NativeFrame) -> Result<Option<pb::NativeFrame>, NativeFrameError> {
        let chunk = match frame.body {
            Some(pb::native_frame::Body::Chunk(chunk)) => chunk,
            _ => return Ok(Some(frame)),
        };
        if chunk.count == 0 || chunk.index >= chunk.count {
            return Err(self.fail(format!("index {} of count {}", chunk.index, chunk.count)));
        }
        match &mut self.current {
            None if chunk.index == 0 => self.current = Some((chunk.message_id, chunk.count, chunk.data)),
            Some((id, count, text))
                if *id == chunk.message_id && *count == chunk.count && chunk.index == self.next_index =>
            {
                text.push_str(&chunk.data);
            }
            _ => {
                return Err(self.fail(format!("unexpected chunk {} of message {}", chunk.index, chunk.message_id)));
            }
        }
        let (_, count, text) = self.current.as_ref().expect("set above");
        if text.len() > self.limit {
            let len = text.len();
            self.reset();
            return Err(NativeFrameError::TooLarge { len, limit: self.limit });
        }
        self.next_index = chunk.index + 1;
        if self.next_index < *count {
            return Ok(None);
        }
        let (_, _, text) = self.current.take().expect("set above");
        self.next_index = 0;
        decode_native_frame(&text).map(Some)
    }

    fn fail(&mut self, why: String) -> NativeFrameError {
        self.reset();
        NativeFrameError::BadChunk(why)
    }

    fn reset(&mut self) {
        self.current = None;
        self.next_index = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ping_frame(id: u32) -> pb::NativeFrame {
        pb::NativeFrame {
            request_id: id,
            body: Some(pb::native_frame::Body::Request(pb::NativeRequest {
                call: Some(pb::native_request::Call::Ping(pb::PingRequest {})),
            })),
            ..Default::default()
        }
    }

    fn chat_frame(text: String) -> pb::NativeFrame {
        pb::NativeFrame {
            request_id: 0,
            body: Some(pb::native_frame::Body::Event(pb::SessionEvent {
                session_id: "s".into(),
                seq: 1,
                kind: Some(pb::session_event::Kind::Chat(pb::Chat { text })),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    #[test]
    fn frame_is_little_endian_length_then_json() {
        let bytes = encode_frame("{}", 10).unwrap();
        assert_eq!(bytes, vec![2, 0, 0, 0, b'{', b'}']);
        assert_eq!(encode_frame("{}", 1), Err(NativeFrameError::TooLarge { len: 2, limit: 1 }));
    }

    #[test]
    fn decoder_waits_for_whole_frames_across_pushes() {
        let bytes = encode_native_frame(&ping_frame(7), 1024, 0).concat();
        let mut decoder = FrameDecoder::new(1024);
        for b in &bytes[..bytes.len() - 1] {
            decoder.push(&[*b]);
            assert!(decoder.next_frame().is_none());
        }
        decoder.push(&bytes[bytes.len() - 1..]);
        let text = decoder.next_frame().unwrap().unwrap();
        assert_eq!(decode_native_frame(&text).unwrap(), ping_frame(7));
        assert!(decoder.finish().is_ok());
    }

    #[test]
    fn each_failure_is_distinct() {
        let mut d = FrameDecoder::new(16);
        d.push(&[3, 0, 0, 0, b'a']);
        assert!(d.next_frame().is_none());
        assert_eq!(d.finish(), Err(NativeFrameError::Truncated { expected: 7, got: 5 }));

        let mut d = FrameDecoder::new(16);
        d.push(&[2, 0]);
        assert_eq!(d.finish(), Err(NativeFrameError::Truncated { expected: 4, got: 2 }));

        let mut d = FrameDecoder::new(16);
        d.push(&[17, 0, 0, 0]);
        assert_eq!(d.next_frame(), Some(Err(NativeFrameError::TooLarge { len: 17, limit: 16 })));
        d.push(&[1, 0, 0, 0, b'x']);
        assert_eq!(d.next_frame(), None, "a poisoned stream yields nothing more");

        let mut d = FrameDecoder::new(16);
        d.push(&[2, 0, 0, 0, 0xff, 0xfe, 2, 0, 0, 0, b'{', b'}']);
        assert_eq!(d.next_frame(), Some(Err(NativeFrameError::InvalidUtf8)));
        assert_eq!(d.next_frame(), Some(Ok("{}".into())), "the next frame still decodes");

        assert!(matches!(decode_native_frame("{nope"), Err(NativeFrameError::InvalidJson(_))));
        assert!(matches!(decode_native_frame(r#"{"requestId":"x"}"#), Err(NativeFrameError::InvalidJson(_))));
        let codes = [
            NativeFrameError::TooLarge { len: 0, limit: 0 }.code(),
            NativeFrameError::Truncated { expected: 0, got: 0 }.code(),
            NativeFrameError::InvalidUtf8.code(),
            NativeFrameError::InvalidJson(String::new()).code(),
        ];
        assert_eq!(codes.iter().collect::<std::collections::HashSet<_>>().len(), 4);
    }

    #[test]
    fn a_large_frame_travels_as_chunks_within_the_limit() {
        let frame = chat_frame("x\"\u{1}é".repeat(100_000));
        let limit = 64 * 1024;
        let frames = encode_native_frame(&frame, limit, 9);
        assert!(frames.len() > 1);
        let mut decoder = FrameDecoder::new(limit);
        let mut assembler = ChunkAssembler::new(usize::MAX);
        let mut out = None;
        for bytes in &frames {
            assert!(bytes.len() <= limit + HEADER_LEN);
            decoder.push(bytes);
            let text = decoder.next_frame().unwrap().unwrap();
            if let Some(done) = assembler.accept(decode_native_frame(&text).unwrap()).unwrap() {
                out = Some(done);
            }
        }
        assert_eq!(out, Some(frame));
    }

    #[test]
    fn out_of_order_chunks_are_refused() {
        let frames = split_into_chunks(&json::to_json(&chat_frame("y".repeat(3000))), 1000, 1);
        let mut assembler = ChunkAssembler::new(usize::MAX);
        assert!(matches!(assembler.accept(frames[1].clone()), Err(NativeFrameError::BadChunk(_))));
        assert_eq!(assembler.accept(frames[0].clone()), Ok(None));
        assert!(matches!(assembler.accept(frames[2].clone()), Err(NativeFrameError::BadChunk(_))));
    }

    #[test]
    fn reassembly_is_bounded() {
        let frames = split_into_chunks(&json::to_json(&chat_frame("y".repeat(3000))), 1000, 1);
        let mut assembler = ChunkAssembler::new(1500);
        let results: Vec<_> = frames.into_iter().map(|f| assembler.accept(f)).collect();
        assert!(results.iter().any(|r| matches!(r, Err(NativeFrameError::TooLarge { .. }))));
    }

    proptest! {
        #[test]
        fn decoder_never_panics_on_arbitrary_bytes(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..16)) {
            let mut d = FrameDecoder::new(256);
            for c in &chunks {
                d.push(c);
                while let Some(result) = d.next_frame() {
                    if let Ok(text) = result {
                        let _ = decode_native_frame(&text);
                    }
                }
            }
            let _ = d.finish();
        }

        #[test]
        fn chunking_round_trips_any_text(text in any::<String>(), limit in 200usize..600) {
            let frame = chat_frame(text);
            let mut assembler = ChunkAssembler::new(usize::MAX);
            let mut decoder = FrameDecoder::new(limit);
            let mut out = None;
            for bytes in encode_native_frame(&frame, limit, 3) {
                decoder.push(&bytes);
                let text = decoder.next_frame().unwrap().unwrap();
                if let Some(f) = assembler.accept(decode_native_frame(&text).unwrap()).unwrap() {
                    out = Some(f);
                }
            }
            prop_assert_eq!(out, Some(frame));
        }
    }
}
