//! The one list of error codes, with the stable strings every boundary uses.

use crate::pb;

macro_rules! error_codes {
    ($($(#[doc = $doc:literal])* $variant:ident = $text:literal,)*) => {
        /// A stable, machine-readable error code.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($(#[doc = $doc])* $variant,)*
        }

        impl ErrorCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The SCREAMING_SNAKE string of this code.
            pub const fn as_str(self) -> &'static str {
                match self { $(ErrorCode::$variant => $text,)* }
            }

            /// Parses a code string; unknown strings are `None`.
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
    /// The application cancelled the operation (`Cancel`): it ended early,
    /// its pending tool calls were withdrawn, the text so far is kept.
    OperationCancelled = "OPERATION_CANCELLED",
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
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        pb::Error { code: code.as_str().to_owned(), message: message.into(), details_json: String::new() }
    }

    /// An error with JSON details.
    pub fn with_details(code: ErrorCode, message: impl Into<String>, details: &serde_json::Value) -> Self {
        pb::Error { code: code.as_str().to_owned(), message: message.into(), details_json: details.to_string() }
    }

    /// The parsed code, if it is one of ours.
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
    /// ```
    /// use pedelec_protocol::{ErrorCode, pb};
    /// let huge = pb::Error::new(ErrorCode::InvalidArgument, "x".repeat(100_000)).bounded();
    /// assert!(huge.message.chars().count() <= pedelec_protocol::limits::MAX_ERROR_MESSAGE_CHARS);
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
