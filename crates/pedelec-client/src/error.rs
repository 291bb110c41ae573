//! The client's error (the SDK's too): a protocol code, a message and optional JSON details.
//!
//! # Examples
//!
//! ```
//! use pedelec_client::PedelecError;
//! use pedelec_protocol::{ErrorCode, pb};
//!
//! // Core's error as it arrives on the wire...
//! let wire = pb::Error::with_details(ErrorCode::ToolNotFound, "no such tool", &serde_json::json!({ "tool": "zoom" }));
//! // ...becomes the application's error, details parsed,
//! let error = PedelecError::from(&wire);
//! assert!(error.is(ErrorCode::ToolNotFound));
//! assert_eq!(error.details, Some(serde_json::json!({ "tool": "zoom" })));
//! // and goes back unchanged.
//! assert_eq!(error.to_pb(), wire);
//! ```

use pedelec_protocol::{ErrorCode, pb};

/// An error as the application sees it (`error.code`, `error.message`, `error.details`).
///
/// Its `Display` is `CODE: message`.
///
/// # Examples
///
/// ```
/// use pedelec_client::PedelecError;
/// use pedelec_protocol::ErrorCode;
///
/// let error = PedelecError {
///     details: Some(serde_json::json!({ "session_id": "sess-1" })),
///     ..PedelecError::new(ErrorCode::ThreadNotFound, "no session sess-1")
/// };
/// assert_eq!(error.code, "THREAD_NOT_FOUND");
/// assert_eq!(error.to_string(), "THREAD_NOT_FOUND: no session sess-1");
/// assert_eq!(error.details.unwrap()["session_id"], "sess-1");
/// ```
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct PedelecError {
    /// Stable SCREAMING_SNAKE code (see [`ErrorCode`]); Core may send codes newer than this SDK.
    pub code: String,
    /// What went wrong, for people; match on [`code`](Self::code), not on this.
    pub message: String,
    /// Structured facts about the failure (which tool, which path, …), when the code has any.
    pub details: Option<serde_json::Value>,
}

impl PedelecError {
    /// An error with a known code and no details.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_client::PedelecError;
    /// use pedelec_protocol::ErrorCode;
    ///
    /// let error = PedelecError::new(ErrorCode::SessionBusy, "a turn is running");
    /// assert_eq!(error.code, "SESSION_BUSY");
    /// assert_eq!(error.message, "a turn is running");
    /// assert_eq!(error.details, None);
    /// ```
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        PedelecError { code: code.as_str().to_owned(), message: message.into(), details: None }
    }

    /// The code, when this SDK knows it.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_client::PedelecError;
    /// use pedelec_protocol::ErrorCode;
    ///
    /// let known = PedelecError::new(ErrorCode::ToolTimeout, "no result within 60 s");
    /// assert_eq!(known.error_code(), Some(ErrorCode::ToolTimeout));
    ///
    /// // A newer Core may send a code this SDK does not know: it stays readable as text.
    /// let newer = PedelecError { code: "SOME_FUTURE_CODE".into(), ..known };
    /// assert_eq!(newer.error_code(), None);
    /// assert_eq!(newer.code, "SOME_FUTURE_CODE");
    /// ```
    pub fn error_code(&self) -> Option<ErrorCode> {
        ErrorCode::parse(&self.code)
    }

    /// Whether this error has the code `code`.
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_client::PedelecError;
    /// use pedelec_protocol::ErrorCode;
    ///
    /// let error = PedelecError::new(ErrorCode::SessionEnded, "the session has ended");
    /// assert!(error.is(ErrorCode::SessionEnded));
    /// assert!(!error.is(ErrorCode::SessionError));
    /// ```
    pub fn is(&self, code: ErrorCode) -> bool {
        self.code == code.as_str()
    }

    /// The wire form, details serialised as JSON text (empty when there are none).
    ///
    /// # Examples
    ///
    /// ```
    /// use pedelec_client::PedelecError;
    /// use pedelec_protocol::ErrorCode;
    ///
    /// let plain = PedelecError::new(ErrorCode::InvalidArgument, "empty session id").to_pb();
    /// assert_eq!(plain.code, "INVALID_ARGUMENT");
    /// assert_eq!(plain.details_json, "");
    ///
    /// let detailed = PedelecError {
    ///     details: Some(serde_json::json!({ "field": "session_id" })),
    ///     ..PedelecError::new(ErrorCode::InvalidArgument, "empty session id")
    /// };
    /// assert_eq!(detailed.to_pb().details_json, r#"{"field":"session_id"}"#);
    /// // The conversion back is lossless.
    /// assert_eq!(PedelecError::from(detailed.to_pb()), detailed);
    /// ```
    pub fn to_pb(&self) -> pb::Error {
        pb::Error {
            code: self.code.clone(),
            message: self.message.clone(),
            details_json: self.details.as_ref().map(|d| d.to_string()).unwrap_or_default(),
        }
    }
}

/// The application's view of a wire error: `details_json` parsed, and
/// dropped when it is empty or not valid JSON.
///
/// # Examples
///
/// ```
/// use pedelec_client::PedelecError;
/// use pedelec_protocol::pb;
///
/// let error = PedelecError::from(pb::Error {
///     code: "ASSET_NOT_FOUND".into(),
///     message: "no asset at notes/today.md".into(),
///     details_json: r#"{"path":"notes/today.md"}"#.into(),
/// });
/// assert_eq!(error.details, Some(serde_json::json!({ "path": "notes/today.md" })));
///
/// let garbled = PedelecError::from(pb::Error { details_json: "{not json".into(), ..Default::default() });
/// assert_eq!(garbled.details, None);
/// ```
impl From<pb::Error> for PedelecError {
    fn from(error: pb::Error) -> Self {
        let details = if error.details_json.is_empty() { None } else { serde_json::from_str(&error.details_json).ok() };
        PedelecError { code: error.code, message: error.message, details }
    }
}

/// As `From<pb::Error>`, for a borrowed error (it is cloned).
///
/// # Examples
///
/// ```
/// use pedelec_client::PedelecError;
/// use pedelec_protocol::{ErrorCode, pb};
///
/// let wire = pb::Error::new(ErrorCode::CoreRestarted, "Core restarted");
/// let error: PedelecError = (&wire).into();
/// assert_eq!(error.error_code(), Some(ErrorCode::CoreRestarted));
/// assert_eq!(error.message, wire.message);
/// ```
impl From<&pb::Error> for PedelecError {
    fn from(error: &pb::Error) -> Self {
        error.clone().into()
    }
}
