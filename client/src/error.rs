//! The SDK's one error type. Server errors come back typed, parsed from the contract's body;
//! transport and file errors say which URL or file, and why, in plain words.

use std::path::PathBuf;

use spillway_api::{DigestError, ErrorCode, SaveError, SaveFailure};

/// What can go wrong talking to the store or spilling.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with the contract's error body.
    #[error("{message} ({status} {})", code_name(code))]
    Api {
        /// The HTTP status the store answered.
        status: u16,
        /// The error code of the store's JSON body.
        code: ErrorCode,
        /// The server's message.
        message: String,
    },
    /// The request did not complete.
    #[error("{}", describe_http(.0))]
    Http(#[from] reqwest::Error),
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    File {
        /// The local file that failed.
        path: PathBuf,
        /// The underlying failure.
        #[source]
        source: std::io::Error,
    },
    /// Local I/O failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A malformed digest.
    #[error("invalid digest: {0} (a digest is blake3:<64 hex>, sha256:<64 hex> or 64 hex digits)")]
    InvalidDigest(#[from] DigestError),
    /// Downloaded bytes do not hash to the digest asked for.
    #[error("downloaded bytes hash to {actual}, not to {expected}")]
    DigestMismatch {
        /// The digest asked for.
        expected: String,
        /// What the bytes hash to.
        actual: String,
    },
    /// The deadline passed.
    #[error("no answer within {} s", .0.as_secs_f64())]
    Timeout(std::time::Duration),
    /// Anything else, said plainly.
    #[error("{0}")]
    Other(String),
}

fn code_name(code: &ErrorCode) -> String {
    serde_json::to_value(code).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_else(|| "error".into())
}

/// The innermost cause of an error chain: reqwest's own text ("error sending request") hides it.
fn root_cause<'a>(e: &'a (dyn std::error::Error + 'static)) -> &'a (dyn std::error::Error + 'static) {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur
}

fn io_kind(e: &reqwest::Error) -> Option<std::io::ErrorKind> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        cur = err.source();
    }
    None
}

fn describe_http(e: &reqwest::Error) -> String {
    let url = e.url().map_or_else(|| "the store".to_owned(), |u| format!("{}://{}", u.scheme(), authority(u)));
    if e.is_builder() {
        return format!(
            "the store's URL is not one: {}; give it with its scheme, like http://127.0.0.1:7745 (SPILLWAY_URL or --url)",
            root_cause(e)
        );
    }
    if io_kind(e) == Some(std::io::ErrorKind::ConnectionRefused) {
        return format!("connection refused by {url}: is the store running there?");
    }
    if e.is_timeout() {
        return format!("no answer from {url}");
    }
    if e.is_connect() {
        return format!("cannot connect to {url}: {}", root_cause(e));
    }
    format!("request to {url} failed: {}", root_cause(e))
}

fn authority(u: &reqwest::Url) -> String {
    match (u.host_str(), u.port()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_owned(),
        _ => u.as_str().to_owned(),
    }
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

    /// A file error naming its path.
    pub fn file(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::File { path: path.into(), source }
    }

    /// This error as the reason a spill failed: a kind to alert on and plain words.
    pub fn save_error(&self) -> SaveError {
        let cause = match self {
            Self::Api { status: 401, .. } => SaveFailure::Unauthorized,
            Self::Api { status: 403, .. } => SaveFailure::Forbidden,
            Self::Api { status: 413, .. } => SaveFailure::TooLarge,
            Self::Api { status: 503 | 507, .. } => SaveFailure::StoreUnavailable,
            Self::Http(e) if io_kind(e) == Some(std::io::ErrorKind::ConnectionRefused) => {
                SaveFailure::ConnectionRefused
            }
            Self::Http(e) if e.is_timeout() => SaveFailure::Timeout,
            Self::Timeout(_) => SaveFailure::Timeout,
            Self::File { .. } | Self::Io(_) => SaveFailure::LocalIo,
            _ => SaveFailure::Other,
        };
        let message = match (cause, self) {
            (SaveFailure::Unauthorized, Self::Api { message, .. }) => {
                format!("the store refused the token (401 unauthorized: {message}); check SPILLWAY_TOKEN")
            }
            (SaveFailure::Forbidden, Self::Api { message, .. }) => {
                format!("the token may not write to the store (403 forbidden: {message})")
            }
            (SaveFailure::TooLarge, Self::Api { message, .. }) => {
                format!("the output is over the store's size limit (413 too_large: {message})")
            }
            (SaveFailure::Timeout, Self::Timeout(d)) => {
                format!("the store gave no answer within {} s", d.as_secs_f64())
            }
            _ => self.to_string(),
        };
        SaveError { cause, message }
    }
}

/// Results of the SDK.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// For paging over sources that cannot fail.
impl From<std::convert::Infallible> for ClientError {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}
