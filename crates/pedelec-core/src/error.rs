//! Core's one error type, mapped once to the protocol's error codes.

use pedelec_protocol::{ErrorCode, pb};

/// Anything a Core request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// A failure with a protocol code, reported to the caller as is.
    #[error("{code}: {message}")]
    Coded { code: ErrorCode, message: String, details: Option<serde_json::Value> },
    #[error("session database: {0}")]
    Store(#[from] rusqlite::Error),
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
}

pub type CoreResult<T> = Result<T, CoreError>;

impl CoreError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        CoreError::Coded { code, message: message.into(), details: None }
    }

    pub fn with_details(code: ErrorCode, message: impl Into<String>, details: serde_json::Value) -> Self {
        CoreError::Coded { code, message: message.into(), details: Some(details) }
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        CoreError::Io { context: context.into(), source }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            CoreError::Coded { code, .. } => *code,
            CoreError::Store(_) | CoreError::Io { .. } => ErrorCode::Internal,
        }
    }

    pub fn to_pb(&self) -> pb::Error {
        match self {
            CoreError::Coded { code, message, details: Some(d) } => pb::Error::with_details(*code, message.clone(), d),
            CoreError::Coded { code, message, details: None } => pb::Error::new(*code, message.clone()),
            other => pb::Error::new(ErrorCode::Internal, other.to_string()),
        }
    }
}

impl From<CoreError> for tonic::Status {
    fn from(error: CoreError) -> Self {
        if matches!(error, CoreError::Store(_) | CoreError::Io { .. }) {
            tracing::error!(%error, "internal failure");
        }
        pedelec_protocol::grpc::status_from_error(&error.to_pb())
    }
}
