//! One error type for every handler: it picks the status and the contract's JSON body.
//! Details of server faults are logged, never sent.

use crate::db::error::DbError;
use crate::storage::backend::BlobError;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use spillway_api::paging::PageError;
use spillway_api::{DigestError, ErrorBody, ErrorCode};

/// What can go wrong while answering a request.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A digest in the path or a header that does not parse.
    #[error(transparent)]
    InvalidDigest(#[from] DigestError),
    /// Malformed query, header or body.
    #[error("{0}")]
    InvalidArgument(String),
    /// The body does not hash to the digest in the URL.
    #[error("uploaded bytes hash to {actual}, not to {expected}; nothing was stored")]
    DigestMismatch {
        /// What the URL named.
        expected: String,
        /// What the bytes hash to.
        actual: String,
    },
    /// Missing or unknown token.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// The token lacks the scope.
    #[error("this token lacks the {0} scope")]
    Forbidden(&'static str),
    /// A redacted token asked for raw bytes.
    #[error(
        "this token reads redacted text only: use the capped read API (/read, /grep), which redacts for it; \
         exact bytes need an ordinary token"
    )]
    RedactedOnly,
    /// No such blob or stream in the caller's namespace.
    #[error("{0} not found in this namespace")]
    NotFound(String),
    /// Stream append at the wrong offset.
    #[error("append offset {given} does not match the stream's current size {size}")]
    OffsetMismatch {
        /// The offset asked for.
        given: u64,
        /// The stream's size.
        size: u64,
    },
    /// Stream append after seal or cap.
    #[error("stream is {0}: it takes no more appends")]
    StreamClosed(&'static str),
    /// Body over the blob limit.
    #[error("body is over the server's blob limit of {0} bytes; nothing was stored")]
    TooLarge(u64),
    /// The stream reached its cap.
    #[error("stream reached its cap of {0} bytes; it is now capped")]
    StreamLimitExceeded(u64),
    /// Offset or line past the end; carries the size for `Content-Range`.
    #[error("{message}")]
    RangeNotSatisfiable {
        /// For a person.
        message: String,
        /// Size of the blob, for `Content-Range: bytes */size`.
        size: Option<u64>,
    },
    /// Backend down or busy; safe to retry.
    #[error("{0}")]
    Unavailable(String),
    /// Disk full.
    #[error("storage is full; nothing was stored")]
    InsufficientStorage,
    /// The namespace's quota of stored bytes would be passed.
    #[error("this namespace's quota of {quota} bytes is reached ({used} in use); nothing was stored")]
    QuotaExceeded {
        /// The quota.
        quota: u64,
        /// Bytes the namespace holds.
        used: u64,
    },
    /// A concurrency limit is reached; retry after `retry_after` seconds.
    #[error("{message}")]
    TooManyRequests {
        /// For a person.
        message: String,
        /// Seconds, for `Retry-After`.
        retry_after: u64,
    },
    /// A fault of the server's.
    #[error("internal error: {0}")]
    Internal(String),
    /// The stored bytes of this blob fail their hash or are gone (api.md v1.3, Integrity).
    #[error("the stored bytes of {0} fail their hash (damaged or missing storage), so none of them are served; uploading the same content again repairs it")]
    Corrupt(String),
}

impl ApiError {
    /// A server fault from any error; the cause is logged when the response is built.
    pub fn internal(err: impl std::fmt::Display) -> Self {
        Self::Internal(err.to_string())
    }

    fn code(&self) -> ErrorCode {
        match self {
            Self::InvalidDigest(_) => ErrorCode::InvalidDigest,
            Self::InvalidArgument(_) => ErrorCode::InvalidArgument,
            Self::DigestMismatch { .. } => ErrorCode::DigestMismatch,
            Self::Unauthorized(_) => ErrorCode::Unauthorized,
            Self::Forbidden(_) | Self::RedactedOnly => ErrorCode::Forbidden,
            Self::NotFound(_) => ErrorCode::NotFound,
            Self::OffsetMismatch { .. } => ErrorCode::OffsetMismatch,
            Self::StreamClosed(_) => ErrorCode::StreamClosed,
            Self::TooLarge(_) => ErrorCode::TooLarge,
            Self::StreamLimitExceeded(_) => ErrorCode::StreamLimitExceeded,
            Self::RangeNotSatisfiable { .. } => ErrorCode::RangeNotSatisfiable,
            Self::Unavailable(_) => ErrorCode::Unavailable,
            Self::InsufficientStorage => ErrorCode::InsufficientStorage,
            Self::QuotaExceeded { .. } => ErrorCode::QuotaExceeded,
            Self::TooManyRequests { .. } => ErrorCode::TooManyRequests,
            Self::Internal(_) => ErrorCode::Internal,
            Self::Corrupt(_) => ErrorCode::Corrupt,
        }
    }
}

impl From<DbError> for ApiError {
    fn from(err: DbError) -> Self {
        match &err {
            DbError::Full(cause) => {
                tracing::error!(cause = %cause, "metadata database full");
                Self::InsufficientStorage
            }
            DbError::Unavailable(cause) => {
                tracing::error!(cause = %cause, "database unavailable");
                Self::Unavailable("the metadata database is unavailable; retry".into())
            }
            DbError::Bytes(cause) if matches!(cause.downcast_ref(), Some(BlobError::Full(_))) => {
                tracing::error!(cause = %cause, "blob storage full");
                Self::InsufficientStorage
            }
            DbError::Bytes(cause) => {
                tracing::error!(cause = ?cause, "blob storage failed inside a transaction");
                Self::Unavailable("blob storage is unavailable; retry".into())
            }
            DbError::Conflict => Self::Unavailable("a concurrent change came first; retry".into()),
            DbError::Corrupt { .. } => Self::internal(err),
            DbError::Statement(cause) => Self::internal(cause),
        }
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(err: sqlx::Error) -> Self {
        DbError::from(err).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = self.code();
        let status = StatusCode::from_u16(code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let message = match &self {
            Self::Internal(cause) => {
                tracing::error!(cause = %cause, "internal error");
                "internal server error".to_string()
            }
            other => other.to_string(),
        };
        let mut resp = (status, Json(ErrorBody::new(code, message))).into_response();
        if let Self::RangeNotSatisfiable { size: Some(size), .. } = self {
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                resp.headers_mut().insert(header::CONTENT_RANGE, v);
            }
        }
        if matches!(self, Self::InsufficientStorage) {
            resp.extensions_mut().insert(StorageFull);
        }
        if let Self::TooManyRequests { retry_after, .. } = self {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
        }
        resp
    }
}

/// Marks an answer given because storage is full (not a quota): the edge then releases the
/// space reserve.
#[derive(Debug, Clone, Copy)]
pub struct StorageFull;

/// Handlers' result type.
pub type ApiResult<T> = Result<T, ApiError>;

impl<E: Into<ApiError>> From<PageError<E>> for ApiError {
    fn from(e: PageError<E>) -> Self {
        match e {
            PageError::InvalidArgument(m) => Self::InvalidArgument(m),
            PageError::RangeNotSatisfiable { message, size } => Self::RangeNotSatisfiable { message, size: Some(size) },
            PageError::Source(inner) => inner.into(),
            // The data moved under the read (a stream sealed meanwhile): asking again sees
            // the new state.
            PageError::Changed(why) => {
                tracing::warn!(cause = %why, "read raced a change");
                Self::Unavailable("the data changed while it was read; retry".into())
            }
        }
    }
}

/// For sources that cannot fail.
impl From<std::convert::Infallible> for ApiError {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}

/// Storage failures as the contract answers them; the cause goes to the log.
impl From<BlobError> for ApiError {
    fn from(e: BlobError) -> Self {
        match e {
            BlobError::TooLarge(max) => ApiError::TooLarge(max),
            BlobError::Body(m) => ApiError::InvalidArgument(m),
            BlobError::Full(cause) => {
                tracing::error!(cause = %cause, "blob storage full");
                ApiError::InsufficientStorage
            }
            BlobError::NotFound => {
                tracing::error!("blob bytes missing from storage");
                ApiError::Unavailable("the blob's bytes are being replaced; retry".into())
            }
            BlobError::Corrupt(digest) => {
                tracing::error!(%digest, "stored bytes fail their hash or are gone");
                ApiError::Corrupt(digest.to_string())
            }
            BlobError::Storage(cause) => {
                tracing::error!(cause = %cause, "blob storage failed");
                ApiError::Unavailable("blob storage is unavailable; retry".into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::response::IntoResponse;

    use super::*;

    #[test]
    fn storage_errors_map_to_the_contract() {
        let full = ApiError::from(BlobError::from(std::io::Error::from(std::io::ErrorKind::StorageFull)));
        assert_eq!(full.into_response().status(), 507);
        let quota = ApiError::from(BlobError::from(std::io::Error::from(std::io::ErrorKind::QuotaExceeded)));
        assert_eq!(quota.into_response().status(), 507);
        // A full disk seen through object_store's layers is found by the kind of its cause.
        let wrapped = object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(std::io::Error::new(std::io::ErrorKind::StorageFull, "write failed")),
        };
        let full = BlobError::from(wrapped);
        assert!(matches!(full, BlobError::Full(_)), "{full:?}");
        assert!(std::error::Error::source(&full).is_some(), "the cause is kept");
        assert_eq!(ApiError::from(full).into_response().status(), 507);
        let down = ApiError::from(BlobError::storage("connection refused"));
        assert_eq!(down.into_response().status(), 503);
        assert_eq!(ApiError::from(BlobError::TooLarge(10)).into_response().status(), 413);
    }
}
