//! The client's error (the SDK's too): a protocol code, a message and optional JSON details.

use pedelec_protocol::{ErrorCode, pb};

/// An error as the application sees it (`error.code`, `error.message`, `error.details`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct PedelecError {
    /// Stable SCREAMING_SNAKE code (see [`ErrorCode`]); Core may send codes newer than this SDK.
    pub code: String,
    pub message: String,
    pub details: Option<serde_json::Value>,
}

impl PedelecError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        PedelecError { code: code.as_str().to_owned(), message: message.into(), details: None }
    }

    /// The code, when this SDK knows it.
    pub fn error_code(&self) -> Option<ErrorCode> {
        ErrorCode::parse(&self.code)
    }

    pub fn is(&self, code: ErrorCode) -> bool {
        self.code == code.as_str()
    }

    pub fn to_pb(&self) -> pb::Error {
        pb::Error {
            code: self.code.clone(),
            message: self.message.clone(),
            details_json: self.details.as_ref().map(|d| d.to_string()).unwrap_or_default(),
        }
    }
}

impl From<pb::Error> for PedelecError {
    fn from(error: pb::Error) -> Self {
        let details = if error.details_json.is_empty() { None } else { serde_json::from_str(&error.details_json).ok() };
        PedelecError { code: error.code, message: error.message, details }
    }
}

impl From<&pb::Error> for PedelecError {
    fn from(error: &pb::Error) -> Self {
        error.clone().into()
    }
}
