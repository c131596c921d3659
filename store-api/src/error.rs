//! The error body every failing call answers with: `{"error": {"code", "message"}}`.

use serde::{Deserialize, Serialize};

/// The contract's error codes. Unknown codes from a newer server parse as [`ErrorCode::Other`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// A digest that is neither `blake3:` nor `sha256:` with 64 lowercase hex digits.
    InvalidDigest,
    /// Malformed query, header or body.
    InvalidArgument,
    /// Uploaded bytes do not hash to the digest in the URL.
    DigestMismatch,
    /// Missing or unknown token.
    Unauthorized,
    /// The token lacks the scope.
    Forbidden,
    /// No such blob or stream in the caller's namespace.
    NotFound,
    /// Stream append at the wrong offset.
    OffsetMismatch,
    /// Stream append after seal or cap.
    StreamClosed,
    /// Body over the server's blob limit.
    TooLarge,
    /// Stream reached its cap.
    StreamLimitExceeded,
    /// Offset or line past the end.
    RangeNotSatisfiable,
    /// Backend down; safe to retry.
    Unavailable,
    /// Disk full.
    InsufficientStorage,
    /// The namespace's quota of stored bytes is reached (`--namespace-quota-bytes`).
    QuotaExceeded,
    /// A limit on concurrent work (open streams, heavy requests) is reached; retry after the
    /// `Retry-After` seconds.
    TooManyRequests,
    /// A server fault that is not the caller's.
    Internal,
    /// The stored bytes of an output (or of the part asked for) fail their hash, or are gone:
    /// nothing of them is served; uploading the same content again repairs it (v1.3).
    Corrupt,
    /// A code this version does not know.
    #[serde(other)]
    Other,
}

impl ErrorCode {
    /// The HTTP status the contract pairs with this code.
    pub fn status(&self) -> u16 {
        match self {
            Self::InvalidDigest | Self::InvalidArgument | Self::DigestMismatch => 400,
            Self::Unauthorized => 401,
            Self::Forbidden => 403,
            Self::NotFound => 404,
            Self::OffsetMismatch | Self::StreamClosed => 409,
            Self::TooLarge | Self::StreamLimitExceeded => 413,
            Self::RangeNotSatisfiable => 416,
            Self::TooManyRequests => 429,
            Self::Unavailable => 503,
            Self::InsufficientStorage | Self::QuotaExceeded => 507,
            Self::Internal | Self::Corrupt | Self::Other => 500,
        }
    }
}

/// The inner object of an error body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorDetail {
    /// Machine-readable code.
    pub code: ErrorCode,
    /// What went wrong, for a person.
    pub message: String,
}

/// `{"error": {"code": …, "message": …}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// What went wrong: the contract's code and a message for a person.
    pub error: ErrorDetail,
}

impl ErrorBody {
    /// Builds a body from a code and a message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { error: ErrorDetail { code, message: message.into() } }
    }
}
