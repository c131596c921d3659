//! The SDK's one error type. Server errors come back typed, parsed from the contract's body.

use spillway_api::{DigestError, ErrorCode};

/// What can go wrong talking to the store or spilling.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with the contract's error body.
    #[error("{message} ({status} {code:?})")]
    Api {
        /// HTTP status.
        status: u16,
        /// Contract code.
        code: ErrorCode,
        /// The server's message.
        message: String,
    },
    /// The request did not complete.
    #[error("request to the store failed: {0}")]
    Http(#[from] reqwest::Error),
    /// Local I/O failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A malformed digest.
    #[error(transparent)]
    InvalidDigest(#[from] DigestError),
    /// Downloaded bytes do not hash to the digest asked for.
    #[error("downloaded bytes hash to {actual}, not to {expected}")]
    DigestMismatch {
        /// Asked for.
        expected: String,
        /// Got.
        actual: String,
    },
    /// The deadline passed.
    #[error("timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// Anything else, said plainly.
    #[error("{0}")]
    Other(String),
}

impl ClientError {
    /// True for the server's `404 not_found`.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Api { code: ErrorCode::NotFound, .. })
    }

    /// The contract code, when the server answered with one.
    pub fn code(&self) -> Option<&ErrorCode> {
        match self {
            Self::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// Results of the SDK.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;
