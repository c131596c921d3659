//! What handlers take from a request beyond axum's extractors: the query with the contract's
//! errors, digests from the path, upload options, JSON object bodies.

use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use spillway_api::{AnyDigest, Labels};

use crate::error::ApiError;

/// `Query` whose failures are the contract's `400 invalid_argument`.
#[derive(Debug)]
pub(crate) struct Q<T>(pub T);

/// Refuses a query whose parameters do not decode to UTF-8 (serde would replace the bad bytes
/// silently, so a label value or a pattern would not be what the caller sent).
fn check_query_utf8(query: &str) -> Result<(), ApiError> {
    // Only escapes can make invalid UTF-8 (`+` is a space, plain ASCII).
    for part in query.split(['&', '=']).filter(|p| p.contains('%')) {
        if percent_encoding::percent_decode_str(part).decode_utf8().is_err() {
            return Err(ApiError::InvalidArgument(format!("query parameter {part:?} is not valid UTF-8")));
        }
    }
    Ok(())
}

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Q<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        check_query_utf8(parts.uri.query().unwrap_or_default())?;
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| Q(v))
            .map_err(|e| ApiError::InvalidArgument(query_error(&e.body_text())))
    }
}

/// The contract's words for a query that does not decode, naming the parameter, instead of the
/// framework's ("Failed to deserialize query string: limit: invalid digit found in string").
fn query_error(framework: &str) -> String {
    let detail = framework.split_once(": ").map_or(framework, |(_, d)| d);
    if let Some(field) = detail.strip_prefix("missing field `").and_then(|f| f.split('`').next()) {
        return format!("query parameter {field} is required");
    }
    match detail.split_once(": ") {
        Some((field, why)) if why.contains("digit") || why.contains("number") || why.contains("integer") => {
            format!("query parameter {field} must be a non-negative integer")
        }
        Some((field, why)) if why.contains("bool") => format!("query parameter {field} must be true or false"),
        Some((field, _)) => format!("query parameter {field} has an invalid value"),
        None => "the query string is malformed".to_owned(),
    }
}

/// An optional JSON object body: empty (or `null`) means the defaults; anything but an object
/// (an array, which serde would take field by field, a string) is `400 invalid_argument`.
pub(crate) fn json_object_body<T: DeserializeOwned + Default>(body: &[u8], what: &str) -> Result<T, ApiError> {
    let text = body.trim_ascii();
    if text.is_empty() || text == b"null" {
        return Ok(T::default());
    }
    if !text.starts_with(b"{") {
        return Err(ApiError::InvalidArgument(what.to_owned()));
    }
    serde_json::from_slice(text).map_err(|e| ApiError::InvalidArgument(format!("{what}: {e}")))
}

/// Parses a digest from the URL: `400 invalid_digest` for anything not canonical.
pub(crate) fn parse_digest(raw: &str) -> Result<AnyDigest, ApiError> {
    Ok(raw.parse::<AnyDigest>()?)
}

/// Options of an upload or a new stream: `ttl`, `label.*` and, for streams, `max_bytes`.
#[derive(Debug, Default)]
pub(crate) struct RefOptions {
    /// Seconds, if given.
    pub ttl: Option<u64>,
    /// Labels from `label.*` parameters, checked.
    pub labels: Labels,
    /// Stream cap, if given.
    pub max_bytes: Option<u64>,
}

fn parse_u64(name: &str, v: &str) -> Result<u64, ApiError> {
    v.parse().map_err(|_| ApiError::InvalidArgument(format!("{name} must be a non-negative integer, got {v:?}")))
}

impl RefOptions {
    /// Parses the query pairs. Parameters it does not know are ignored, as S3 and HTTP APIs at
    /// large do; the ones it knows are checked strictly.
    pub(crate) fn parse(pairs: Vec<(String, String)>, allow_max_bytes: bool) -> Result<Self, ApiError> {
        let mut out = Self::default();
        for (k, v) in pairs {
            if let Some(key) = k.strip_prefix("label.") {
                out.labels.insert(key, v).map_err(|e| ApiError::InvalidArgument(e.to_string()))?;
            } else if k == "ttl" {
                let ttl = parse_u64("ttl", &v)?;
                if ttl == 0 {
                    return Err(ApiError::InvalidArgument("ttl must be at least 1 second".into()));
                }
                out.ttl = Some(ttl);
            } else if k == "max_bytes" && allow_max_bytes {
                out.max_bytes = Some(parse_u64("max_bytes", &v)?);
            }
        }
        Ok(out)
    }

    /// The TTL in milliseconds after checking it against the server's maximum.
    pub(crate) fn ttl_ms(&self, config: &crate::config::Config) -> Result<i64, ApiError> {
        let max = config.max_ttl.as_secs();
        let ttl = self.ttl.unwrap_or(config.default_ttl.as_secs());
        if ttl > max {
            return Err(ApiError::InvalidArgument(format!("ttl {ttl} is over the server's maximum of {max} seconds")));
        }
        Ok((ttl as i64).saturating_mul(1000))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn query_errors_name_the_parameter_in_our_words() {
        let said = super::query_error;
        assert_eq!(
            said("Failed to deserialize query string: limit: invalid digit found in string"),
            "query parameter limit must be a non-negative integer"
        );
        assert_eq!(
            said("Failed to deserialize query string: missing field `pattern`"),
            "query parameter pattern is required"
        );
        assert_eq!(
            said("Failed to deserialize query string: fixed: provided string was not `true` or `false`"),
            "query parameter fixed has an invalid value"
        );
        assert!(!said("Failed to deserialize query string: whatever").contains("deserialize"));
    }
}
