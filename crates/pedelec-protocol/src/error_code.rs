//! The one list of error codes, with the stable strings every boundary uses.
//!
//! # Examples
//!
//! ```
//! use pedelec_protocol::{ErrorCode, pb};
//!
//! // An error from the wire names its code as text; known codes parse back.
//! let error = pb::Error::new(ErrorCode::ToolTimeout, "no result within 60 s");
//! assert_eq!(error.code, "TOOL_TIMEOUT");
//! assert_eq!(error.error_code(), Some(ErrorCode::ToolTimeout));
//! ```

use crate::pb;

macro_rules! error_codes {
    ($($(#[doc = $doc:literal])* $variant:ident = $text:literal,)*) => {
        /// A stable, machine-readable error code.
        ///
        /// # Examples
        ///
        /// ```
        /// use pedelec_protocol::ErrorCode;
        ///
        /// let code = ErrorCode::SessionBusy;
        /// assert_eq!(code.to_string(), "SESSION_BUSY");
        /// assert_eq!(ErrorCode::parse("SESSION_BUSY"), Some(code));
        /// ```
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($(#[doc = $doc])* $variant,)*
        }

        impl ErrorCode {
            /// Every code, in declaration order.
            ///
            /// # Examples
            ///
            /// ```
            /// use pedelec_protocol::ErrorCode;
            ///
            /// assert_eq!(ErrorCode::ALL.first(), Some(&ErrorCode::SessionBusy));
            /// assert!(ErrorCode::ALL.contains(&ErrorCode::Internal));
            /// ```
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The SCREAMING_SNAKE string of this code.
            ///
            /// # Examples
            ///
            /// ```
            /// use pedelec_protocol::ErrorCode;
            ///
            /// assert_eq!(ErrorCode::ThreadNotFound.as_str(), "THREAD_NOT_FOUND");
            /// // `const`, so a code's string can be a constant too.
            /// const CODE: &str = ErrorCode::Internal.as_str();
            /// assert_eq!(CODE, "INTERNAL");
            /// ```
            pub const fn as_str(self) -> &'static str {
                match self { $(ErrorCode::$variant => $text,)* }
            }

            /// Parses a code string; unknown strings are `None`.
            ///
            /// # Examples
            ///
            /// ```
            /// use pedelec_protocol::ErrorCode;
            ///
            /// assert_eq!(ErrorCode::parse("TOOL_TIMEOUT"), Some(ErrorCode::ToolTimeout));
            /// // Codes are case-sensitive, and a newer Core may send codes this build lacks.
            /// assert_eq!(ErrorCode::parse("tool_timeout"), None);
            /// assert_eq!(ErrorCode::parse("SOME_FUTURE_CODE"), None);
            /// ```
            pub fn parse(text: &str) -> Option<Self> {
                match text { $($text => Some(ErrorCode::$variant),)* _ => None }
            }
        }
    };
}

error_codes! {
    /// Another turn or preparation is active, or an upload is already running.
    SessionBusy = "SESSION_BUSY",
    /// The session is ending or has ended.
    SessionEnded = "SESSION_ENDED",
    /// A user turn failed.
    SendTextFailed = "SEND_TEXT_FAILED",
    /// The session is in the error status.
    SessionError = "SESSION_ERROR",
    /// The SDK could not deliver a tool result to Core.
    SubmitToolResultFailed = "SUBMIT_TOOL_RESULT_FAILED",
    /// The application's tool handler failed.
    ToolHandlerError = "TOOL_HANDLER_ERROR",
    /// No session with this id exists.
    ThreadNotFound = "THREAD_NOT_FOUND",
    /// The session belongs to another origin.
    ThreadAccessDenied = "THREAD_ACCESS_DENIED",
    /// The recorded workspace or its skill/tool data cannot be loaded.
    WorkspaceOpenFailed = "WORKSPACE_OPEN_FAILED",
    /// A workspace path is relative, missing, not a directory or overlaps the managed root.
    WorkspaceInvalid = "WORKSPACE_INVALID",
    /// A workspace path the caller may not open: never allowed (the home
    /// directory, a secret store, …) or not granted to its origin.
    WorkspaceNotAllowed = "WORKSPACE_NOT_ALLOWED",
    /// The tool manifest breaks a rule (name, uniqueness, description, schema).
    ToolsManifestInvalid = "TOOLS_MANIFEST_INVALID",
    /// Tool arguments do not satisfy the tool's JSON Schema.
    ToolArgsInvalid = "TOOL_ARGS_INVALID",
    /// The tool is not in the session's manifest.
    ToolNotFound = "TOOL_NOT_FOUND",
    /// The agent could not make a frontend tool call (it refused its own
    /// approval, or its MCP client failed); `details.tool` and
    /// `details.reason` say which call and why, in the agent's words.
    ToolCallFailed = "TOOL_CALL_FAILED",
    /// No result arrived within the tool's timeout.
    ToolTimeout = "TOOL_TIMEOUT",
    /// The agent stopped waiting for a frontend tool call before it was
    /// answered (its tool client went away); the call is withdrawn and a
    /// late answer is refused as `TOOL_REQUEST_NOT_FOUND`.
    ToolCallAbandoned = "TOOL_CALL_ABANDONED",
    /// The application cancelled the operation (`Cancel`): it ended early,
    /// its pending tool calls were withdrawn, the text so far is kept.
    OperationCancelled = "OPERATION_CANCELLED",
    /// `Steer`: this session's agent cannot take input during a turn; refused
    /// before anything is sent to it (use `SendText` once the turn is done).
    SteerUnsupported = "STEER_UNSUPPORTED",
    /// `Steer`: no user turn is running to add the text to (the session is
    /// idle, preparing, ending, or the turn finished first).
    TurnNotRunning = "TURN_NOT_RUNNING",
    /// `GetChanges`: no changes are recorded for that turn (an unknown turn,
    /// a preparation, a turn Core was not running for, or none yet).
    ChangesNotFound = "CHANGES_NOT_FOUND",
    /// `SendText` with an output schema: the agent's final answer is not
    /// JSON valid against it, even after Core asked once more;
    /// `details.errors` lists what is wrong, `details.answer` the answer.
    OutputInvalid = "OUTPUT_INVALID",
    /// `Fork`: this session's agent cannot continue a copy of its
    /// conversation; refused before anything is created or sent.
    ForkUnsupported = "FORK_UNSUPPORTED",
    /// The permission request is unknown or already answered.
    PermissionRequestNotFound = "PERMISSION_REQUEST_NOT_FOUND",
    /// The tool request is unknown or already answered.
    ToolRequestNotFound = "TOOL_REQUEST_NOT_FOUND",
    /// The tool token is unknown, forged, or belongs to an ended session.
    ToolTokenInvalid = "TOOL_TOKEN_INVALID",
    /// Preparation failed or the provider did not answer PEDELEC_PREPARED.
    PrepareFailed = "PREPARE_FAILED",
    /// Core restarted while the operation ran.
    CoreRestarted = "CORE_RESTARTED",
    /// Core is not running and could not be started.
    CoreRuntimeUnavailable = "CORE_RUNTIME_UNAVAILABLE",
    /// The provider failed a turn.
    ProviderError = "PROVIDER_ERROR",
    /// The provider process exited unexpectedly.
    ProviderCrashed = "PROVIDER_CRASHED",
    /// No provider with this code.
    ProviderNotFound = "PROVIDER_NOT_FOUND",
    /// The provider exists but cannot run here.
    ProviderUnavailable = "PROVIDER_UNAVAILABLE",
    /// The provider needs a model and none was given or configured.
    ModelRequired = "MODEL_REQUIRED",
    /// A turn ran past the configured turn timeout.
    ProviderTimeout = "PROVIDER_TIMEOUT",
    /// Core's settings file cannot be read or breaks a rule.
    ConfigInvalid = "CONFIG_INVALID",
    /// A request field is malformed or out of bounds.
    InvalidArgument = "INVALID_ARGUMENT",
    /// `SendText` text exceeds the limit.
    TextTooLarge = "TEXT_TOO_LARGE",
    /// The provider (or its agent) cannot take this kind of attachment (an image).
    AttachmentUnsupported = "ATTACHMENT_UNSUPPORTED",
    /// A public asset path breaks a path rule.
    AssetPathInvalid = "ASSET_PATH_INVALID",
    /// No asset at this path.
    AssetNotFound = "ASSET_NOT_FOUND",
    /// An asset exceeds 100 MiB.
    AssetTooLarge = "ASSET_TOO_LARGE",
    /// A transfer ticket is unknown, used, expired or has the wrong token.
    AssetTicketInvalid = "ASSET_TICKET_INVALID",
    /// An upload did not complete.
    AssetUploadFailed = "ASSET_UPLOAD_FAILED",
    /// A download did not complete.
    AssetDownloadFailed = "ASSET_DOWNLOAD_FAILED",
    /// Asset bytes are not valid UTF-8.
    AssetTextDecodeFailed = "ASSET_TEXT_DECODE_FAILED",
    /// Asset text is not valid JSON.
    AssetInvalidJson = "ASSET_INVALID_JSON",
    /// Ending the session failed.
    EndFailed = "END_FAILED",
    /// The handle lost its transport; use `resume_session`.
    TransportDetached = "TRANSPORT_DETACHED",
    /// `bridgeModelContext` (browser SDK): the page has no WebMCP model
    /// context (`document.modelContext`, `navigator.modelContext`), or one
    /// that cannot list its tools (`getTools`).
    ModelContextUnavailable = "MODEL_CONTEXT_UNAVAILABLE",
    /// `pickWorkspace` (browser SDK): the user closed the folder picker, or
    /// chose nothing, so no folder was granted.
    PickCancelled = "PICK_CANCELLED",
    /// The transport failed to deliver a request.
    TransportError = "TRANSPORT_ERROR",
    /// A native-messaging frame exceeds its direction's limit.
    NativeFrameTooLarge = "NATIVE_FRAME_TOO_LARGE",
    /// A native-messaging stream ended inside a frame.
    NativeFrameTruncated = "NATIVE_FRAME_TRUNCATED",
    /// A native-messaging frame is not UTF-8.
    NativeFrameInvalidUtf8 = "NATIVE_FRAME_INVALID_UTF8",
    /// A native-messaging frame is not valid JSON of a NativeFrame.
    NativeFrameInvalidJson = "NATIVE_FRAME_INVALID_JSON",
    /// The calling origin or extension is not allowed.
    OriginNotAllowed = "ORIGIN_NOT_ALLOWED",
    /// A configured limit would be exceeded (`details.limit` names it:
    /// `sessions_per_origin`, `agent_processes`, `asset_bytes_per_session`,
    /// `transcript_bytes_per_session`; `details.max` is its value).
    QuotaExceeded = "QUOTA_EXCEEDED",
    /// An unexpected failure inside Pedelec.
    Internal = "INTERNAL",
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl pb::Error {
    /// An error with no details.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::{ErrorCode, pb};
    ///
    /// let error = pb::Error::new(ErrorCode::SessionEnded, "the session has ended");
    /// assert_eq!(error.code, "SESSION_ENDED");
    /// assert!(error.details_json.is_empty());
    /// ```
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        pb::Error { code: code.as_str().to_owned(), message: message.into(), details_json: String::new() }
    }

    /// An error with JSON details.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::{ErrorCode, pb};
    ///
    /// let details = serde_json::json!({ "tool": "update_counter" });
    /// let error = pb::Error::with_details(ErrorCode::ToolNotFound, "no such tool", &details);
    /// assert_eq!(error.details_json, r#"{"tool":"update_counter"}"#);
    /// ```
    pub fn with_details(code: ErrorCode, message: impl Into<String>, details: &serde_json::Value) -> Self {
        pb::Error { code: code.as_str().to_owned(), message: message.into(), details_json: details.to_string() }
    }

    /// The parsed code, if it is one of ours.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::{ErrorCode, pb};
    ///
    /// let known = pb::Error::new(ErrorCode::SessionBusy, "busy");
    /// assert_eq!(known.error_code(), Some(ErrorCode::SessionBusy));
    /// let newer = pb::Error { code: "SOME_FUTURE_CODE".into(), ..Default::default() };
    /// assert_eq!(newer.error_code(), None);
    /// ```
    pub fn error_code(&self) -> Option<ErrorCode> {
        ErrorCode::parse(&self.code)
    }

    /// The error clipped to what may cross a process boundary: the code to
    /// [`crate::limits::MAX_ERROR_CODE_CHARS`], the message to
    /// [`crate::limits::MAX_ERROR_MESSAGE_CHARS`] and details over
    /// [`crate::limits::MAX_ERROR_DETAILS_BYTES`] replaced by a note of their
    /// size — so an error that echoes hostile input (a 100 000-character id,
    /// a long problem list) stays a few KiB, within every gRPC client's
    /// metadata limit, and says that it was clipped.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_protocol::{ErrorCode, pb};
    /// let huge = pb::Error::new(ErrorCode::InvalidArgument, "x".repeat(100_000)).bounded();
    /// assert!(huge.message.chars().count() <= pedelec_protocol::limits::MAX_ERROR_MESSAGE_CHARS);
    /// assert!(huge.message.ends_with('…'));
    ///
    /// let problems = serde_json::json!({ "problems": vec!["bad"; 10_000] });
    /// let clipped = pb::Error::with_details(ErrorCode::InvalidArgument, "bad", &problems).bounded();
    /// assert!(clipped.details_json.starts_with(r#"{"clipped":true"#));
    /// ```
    pub fn bounded(mut self) -> Self {
        fn clip(text: &mut String, chars: usize) {
            if let Some((cut, _)) = text.char_indices().nth(chars.saturating_sub(1)) {
                text.truncate(cut);
                text.push('…');
            }
        }
        clip(&mut self.code, crate::limits::MAX_ERROR_CODE_CHARS);
        clip(&mut self.message, crate::limits::MAX_ERROR_MESSAGE_CHARS);
        if self.details_json.len() > crate::limits::MAX_ERROR_DETAILS_BYTES {
            self.details_json = serde_json::json!({ "clipped": true, "bytes": self.details_json.len() }).to_string();
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_and_is_screaming_snake() {
        let mut seen = std::collections::HashSet::new();
        for &code in ErrorCode::ALL {
            let text = code.as_str();
            assert!(seen.insert(text), "duplicate code string {text}");
            assert_eq!(ErrorCode::parse(text), Some(code));
            assert!(text.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'), "{text}");
        }
        assert_eq!(ErrorCode::parse("session_busy"), None);
    }

    #[test]
    fn seed_codes_exist_with_their_exact_strings() {
        for text in [
            "SESSION_BUSY",
            "SESSION_ENDED",
            "SEND_TEXT_FAILED",
            "SESSION_ERROR",
            "SUBMIT_TOOL_RESULT_FAILED",
            "TOOL_HANDLER_ERROR",
            "THREAD_NOT_FOUND",
            "WORKSPACE_OPEN_FAILED",
            "ASSET_TEXT_DECODE_FAILED",
            "ASSET_INVALID_JSON",
            "THREAD_ACCESS_DENIED",
        ] {
            assert!(ErrorCode::parse(text).is_some(), "{text} missing");
        }
    }
}
