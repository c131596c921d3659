//! `StoreClient`: the typed HTTP client of the v1 contract, used by the SDK and the CLI.

use bytes::Bytes;
use futures::Stream;
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::de::DeserializeOwned;
use spillway_api::{
    AnyDigest, AppendResponse, BlobRecord, Digest, ErrorBody, ErrorCode, GrepResponse, PinRequest, ReadPage, RefList,
    SealRequest, SearchResponse, StreamCreated, StreamInfo,
};

use crate::error::{ClientError, Result};

/// Options of an upload or a new stream.
#[derive(Debug, Clone, Default)]
pub struct UploadOptions {
    /// Reference lifetime in seconds (server default when `None`).
    pub ttl: Option<u64>,
    /// `label.<key>=<value>` pairs.
    pub labels: Vec<(String, String)>,
    /// Streams only: the cap.
    pub max_bytes: Option<u64>,
}

impl UploadOptions {
    /// Adds a label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.push((key.into(), value.into()));
        self
    }

    fn query(&self) -> Vec<(String, String)> {
        // A label given twice (a tool's default `tool=exec`, then the caller's own `tool=…`)
        // is the last value given: the store refuses a key twice.
        let labels: std::collections::BTreeMap<&str, &str> =
            self.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut q: Vec<(String, String)> =
            labels.iter().map(|(k, v)| (format!("label.{k}"), (*v).to_owned())).collect();
        if let Some(t) = self.ttl {
            q.push(("ttl".into(), t.to_string()));
        }
        if let Some(m) = self.max_bytes {
            q.push(("max_bytes".into(), m.to_string()));
        }
        q
    }
}

/// What to read: a byte page or a line page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadRequest {
    /// `offset`, `limit` (server defaults when `None`).
    Bytes {
        /// Byte offset where the page starts.
        offset: u64,
        /// Bytes in the page (at most 100,000); the server's cap when `None`.
        limit: Option<u64>,
    },
    /// `line`, `lines`.
    Lines {
        /// 1-based start.
        line: u64,
        /// How many lines (the server's default when `None`).
        lines: Option<u64>,
    },
    /// `tail_lines`: the last `lines` lines (1 to 1,000,000), as a line page; when they do not
    /// fit 100,000 bytes, the last ones that do.
    Tail {
        /// How many lines from the end.
        lines: u64,
    },
}

impl ReadRequest {
    fn query(&self) -> Vec<(&'static str, String)> {
        match *self {
            Self::Bytes { offset, limit } => {
                let mut q = vec![("offset", offset.to_string())];
                q.extend(limit.map(|l| ("limit", l.to_string())));
                q
            }
            Self::Lines { line, lines } => {
                let mut q = vec![("line", line.to_string())];
                q.extend(lines.map(|l| ("lines", l.to_string())));
                q
            }
            Self::Tail { lines } => vec![("tail_lines", lines.to_string())],
        }
    }
}

/// A grep request.
#[derive(Debug, Clone, Default)]
pub struct GrepRequest {
    /// Rust regex syntax (or a literal with `fixed`).
    pub pattern: String,
    /// Case-insensitive.
    pub ignore_case: bool,
    /// The pattern is a literal string, not a regex.
    pub fixed: bool,
    /// 1-based line to start at.
    pub from_line: Option<u64>,
    /// Stop after this many matching lines.
    pub max_matches: Option<usize>,
    /// Context lines before each match.
    pub before: Option<u32>,
    /// Context lines after each match.
    pub after: Option<u32>,
}

impl GrepRequest {
    fn query(&self) -> Vec<(&'static str, String)> {
        let mut q = vec![("pattern", self.pattern.clone())];
        if self.ignore_case {
            q.push(("ignore_case", "true".into()));
        }
        if self.fixed {
            q.push(("fixed", "true".into()));
        }
        q.extend(self.from_line.map(|n| ("from_line", n.to_string())));
        q.extend(self.max_matches.map(|n| ("max_matches", n.to_string())));
        q.extend(self.before.map(|n| ("before", n.to_string())));
        q.extend(self.after.map(|n| ("after", n.to_string())));
        q
    }
}

/// A search across this namespace's outputs (`GET /v1/search`).
#[derive(Debug, Clone, Default)]
pub struct SearchRequest {
    /// Rust regex syntax (or a literal with `fixed`).
    pub pattern: String,
    /// Only outputs with all these labels.
    pub labels: Vec<(String, String)>,
    /// Case-insensitive.
    pub ignore_case: bool,
    /// The pattern is a literal string, not a regex.
    pub fixed: bool,
    /// Only outputs referenced since then: Unix seconds, RFC 3339, or `90m`, `24h`, `7d` back.
    pub since: Option<String>,
    /// Only outputs referenced until then.
    pub until: Option<String>,
    /// Context lines before each match.
    pub before: Option<u32>,
    /// Context lines after each match.
    pub after: Option<u32>,
    /// Most matches in one answer (the server's default, 100, when `None`).
    pub max_matches: Option<usize>,
    /// The `next_cursor` of the previous answer.
    pub cursor: Option<String>,
}

impl SearchRequest {
    fn query(&self) -> Vec<(String, String)> {
        let mut q = vec![("pattern".to_owned(), self.pattern.clone())];
        q.extend(self.labels.iter().map(|(k, v)| (format!("label.{k}"), v.clone())));
        if self.ignore_case {
            q.push(("ignore_case".into(), "true".into()));
        }
        if self.fixed {
            q.push(("fixed".into(), "true".into()));
        }
        let opt = |k: &str, v: Option<String>| v.map(|v| (k.to_owned(), v));
        q.extend(opt("since", self.since.clone()));
        q.extend(opt("until", self.until.clone()));
        q.extend(opt("before", self.before.map(|n| n.to_string())));
        q.extend(opt("after", self.after.map(|n| n.to_string())));
        q.extend(opt("max_matches", self.max_matches.map(|n| n.to_string())));
        q.extend(opt("cursor", self.cursor.clone()));
        q
    }
}

/// A client of one store, with one token.
#[derive(Debug, Clone)]
pub struct StoreClient {
    base: String,
    token: String,
    /// Reads, greps and searches ask for the redacted text (`redact=true`).
    redact: bool,
    http: reqwest::Client,
    /// Most time a page, grep, search or stat waits for its whole answer.
    read_timeout: std::time::Duration,
}

/// How long a read waits for its answer unless `SPILLWAY_READ_TIMEOUT` (seconds) says: a page or
/// a grep answers in milliseconds and a search step in about a second, so a store that says
/// nothing for this long is stuck, and the caller hears so instead of waiting on.
pub const DEFAULT_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

fn read_timeout() -> std::time::Duration {
    std::env::var("SPILLWAY_READ_TIMEOUT")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(DEFAULT_READ_TIMEOUT, std::time::Duration::from_secs_f64)
}

async fn decode<T: DeserializeOwned>(resp: Response) -> Result<T> {
    let resp = check(resp).await?;
    Ok(resp.json().await?)
}

/// Turns a non-success answer into [`ClientError::Api`].
pub(crate) async fn check(resp: Response) -> Result<Response> {
    if resp.status().is_success() || resp.status() == StatusCode::NOT_MODIFIED {
        return Ok(resp);
    }
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    Err(match serde_json::from_str::<ErrorBody>(&text) {
        Ok(b) => ClientError::Api { status, code: b.error.code, message: b.error.message },
        Err(_) => ClientError::Api {
            status,
            // No body to read the code from (a HEAD, a proxy's page): the code the contract
            // pairs with the status, where only one is. A page of some other service says
            // nothing of what the store has (its 404 is no `not_found`), but a busy or down
            // answer is one still.
            code: match status {
                401 if text.is_empty() => ErrorCode::Unauthorized,
                403 if text.is_empty() => ErrorCode::Forbidden,
                404 if text.is_empty() => ErrorCode::NotFound,
                416 if text.is_empty() => ErrorCode::RangeNotSatisfiable,
                429 => ErrorCode::TooManyRequests,
                503 => ErrorCode::Unavailable,
                _ => ErrorCode::Other,
            },
            // A body that is not the contract's error: a proxy's page, or another service
            // answering at this URL.
            message: if text.is_empty() {
                format!("HTTP {status}")
            } else {
                let page: String = text.chars().take(200).collect();
                format!("HTTP {status}, not a Spillway answer (is this a Spillway store? check SPILLWAY_URL): {page}")
            },
        },
    })
}

impl StoreClient {
    /// A client of the store at `base` (e.g. `http://127.0.0.1:7745`).
    pub fn new(base: impl Into<String>, token: impl Into<String>) -> Self {
        let http = reqwest::Client::builder().tcp_nodelay(true).build().unwrap_or_default();
        Self {
            base: base.into().trim_end_matches('/').to_owned(),
            token: token.into(),
            redact: false,
            http,
            read_timeout: read_timeout(),
        }
    }

    /// The same client, whose reads, greps and searches ask for the text with secrets replaced
    /// by marks (`redact=true`) when `redact` is true: what a model is shown.
    pub fn redacting(mut self, redact: bool) -> Self {
        self.redact = redact;
        self
    }

    /// Whether reads ask for redaction.
    pub fn redacts(&self) -> bool {
        self.redact
    }

    /// The `redact=true` of a read, when this client asks for it.
    fn redact_query(&self) -> &'static [(&'static str, &'static str)] {
        if self.redact {
            &[("redact", "true")]
        } else {
            &[]
        }
    }

    /// The store's base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The token this client sends (for handing to a child process, never for logs).
    pub fn token(&self) -> &str {
        &self.token
    }

    fn req(&self, method: Method, path: &str) -> RequestBuilder {
        let req = self.http.request(method, format!("{}{path}", self.base));
        // No token at all sends no header, and the store answers that none was sent.
        if self.token.is_empty() {
            req
        } else {
            req.bearer_auth(&self.token)
        }
    }

    /// Whether this token may write here, and the largest upload the store takes: the answer
    /// to an empty request that needs the `write` scope (no stream is created: `max_bytes=0`
    /// is refused after the token is checked).
    pub async fn check_access(&self) -> Result<Option<u64>> {
        let resp = self.req(Method::POST, "/v1/streams").query(&[("max_bytes", "0")]).send().await?;
        let limit = resp.headers().get("x-spillway-max-blob-bytes").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        match check(resp).await {
            Err(ClientError::Api { status: 400, .. }) | Ok(_) => Ok(limit),
            Err(e) => Err(e),
        }
    }

    /// Uploads bytes whose digest the client computes (`PUT`); the server verifies it. A
    /// `503 unavailable` (the contract's "retry": e.g. a deletion of the same content raced the
    /// upload) is retried twice, after ~100 and ~200 ms; a PUT of the same bytes is idempotent.
    pub async fn put(&self, data: Bytes, opts: &UploadOptions) -> Result<BlobRecord> {
        let digest = Digest::of(&data);
        let path = format!("/v1/blobs/{digest}");
        retry_unavailable(|| async {
            let resp = self.req(Method::PUT, &path).query(&opts.query()).body(data.clone()).send().await?;
            decode(resp).await
        })
        .await
    }

    /// Uploads a body of unknown length and digest (`POST`), streamed.
    pub async fn put_stream<S>(&self, body: S, opts: &UploadOptions) -> Result<BlobRecord>
    where
        S: Stream<Item = std::io::Result<Bytes>> + Send + Sync + 'static,
    {
        let resp = self
            .req(Method::POST, "/v1/blobs")
            .query(&opts.query())
            .body(reqwest::Body::wrap_stream(body))
            .send()
            .await?;
        decode(resp).await
    }

    /// Size of a blob visible in this namespace, or `None`.
    pub async fn head(&self, digest: impl Into<AnyDigest>) -> Result<Option<u64>> {
        let digest = digest.into();
        let resp = self.req(Method::HEAD, &format!("/v1/blobs/{digest}")).send().await?;
        if resp.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let resp = check(resp).await?;
        let len = resp.headers().get(reqwest::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
        Ok(len.or(Some(0)))
    }

    /// Starts a download of the whole blob; the caller streams the body.
    pub async fn get(&self, digest: impl Into<AnyDigest>) -> Result<Response> {
        let digest = digest.into();
        check(self.req(Method::GET, &format!("/v1/blobs/{digest}")).send().await?).await
    }

    /// A raw request with extra headers (Range, If-None-Match), for SRE tools and tests.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.req(method, path)
    }

    /// A capped page of a blob.
    pub async fn read(&self, digest: impl Into<AnyDigest>, r: ReadRequest) -> Result<ReadPage> {
        let digest = digest.into();
        let req =
            self.req(Method::GET, &format!("/v1/blobs/{digest}/read")).query(&r.query()).timeout(self.read_timeout);
        decode(req.query(self.redact_query()).send().await?).await
    }

    /// Matching lines of a blob. A store busy with other scans (`429`) is asked again a few
    /// times, as it says to.
    pub async fn grep(&self, digest: impl Into<AnyDigest>, g: &GrepRequest) -> Result<GrepResponse> {
        let path = format!("/v1/blobs/{}/grep", digest.into());
        retry_busy(|| async {
            let req = self.req(Method::GET, &path).query(&g.query()).query(self.redact_query());
            decode(req.timeout(self.read_timeout).send().await?).await
        })
        .await
    }

    /// Matching lines of a stream so far (of its blob, once sealed).
    pub async fn grep_stream(&self, id: &str, g: &GrepRequest) -> Result<GrepResponse> {
        let path = format!("/v1/streams/{id}/grep");
        retry_busy(|| async {
            decode(self.req(Method::GET, &path).query(&g.query()).query(self.redact_query()).send().await?).await
        })
        .await
    }

    /// Pins a blob in this namespace (admin).
    pub async fn pin(&self, digest: impl Into<AnyDigest>, reason: Option<&str>) -> Result<BlobRecord> {
        self.pin_until(digest, reason, None).await
    }

    /// Keeps a blob in this namespace forever, or until `until` (Unix seconds) (admin).
    pub async fn pin_until(
        &self,
        digest: impl Into<AnyDigest>,
        reason: Option<&str>,
        until: Option<u64>,
    ) -> Result<BlobRecord> {
        let digest = digest.into();
        let body = PinRequest { reason: reason.map(str::to_owned), until };
        decode(self.req(Method::POST, &format!("/v1/blobs/{digest}/pin")).json(&body).send().await?).await
    }

    /// The blob record of a blob visible in this namespace, from `HEAD` (`deduplicated` is
    /// true: the namespace holds it).
    pub async fn stat(&self, digest: impl Into<AnyDigest>) -> Result<BlobRecord> {
        let digest = digest.into();
        let req = self.req(Method::HEAD, &format!("/v1/blobs/{digest}")).timeout(self.read_timeout);
        let resp = check(req.send().await?).await?;
        let h = resp.headers();
        let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let number = |name: &str| text(name).and_then(|v| v.parse::<u64>().ok());
        let missing = |what: &str| ClientError::Other(format!("the store's HEAD answer has no {what}"));
        let etag = text("etag").ok_or_else(|| missing("ETag"))?;
        Ok(BlobRecord {
            digest: etag.trim_matches('"').parse()?,
            sha256: text("x-spillway-sha256").ok_or_else(|| missing("X-Spillway-Sha256"))?,
            size: number("content-length").ok_or_else(|| missing("Content-Length"))?,
            lines: number("x-spillway-lines").ok_or_else(|| missing("X-Spillway-Lines"))?,
            deduplicated: true,
            expires_at: text("x-spillway-expires-at"),
        })
    }

    /// Removes this namespace's pins (admin).
    pub async fn unpin(&self, digest: impl Into<AnyDigest>) -> Result<()> {
        let digest = digest.into();
        check(self.req(Method::DELETE, &format!("/v1/blobs/{digest}/pin")).send().await?).await?;
        Ok(())
    }

    /// Removes this namespace's references (admin).
    pub async fn delete(&self, digest: impl Into<AnyDigest>) -> Result<()> {
        let digest = digest.into();
        check(self.req(Method::DELETE, &format!("/v1/blobs/{digest}")).send().await?).await?;
        Ok(())
    }

    /// This namespace's references, newest first.
    pub async fn list_refs(
        &self,
        labels: &[(&str, &str)],
        limit: Option<u32>,
        cursor: Option<&str>,
    ) -> Result<RefList> {
        let mut q: Vec<(String, String)> =
            labels.iter().map(|(k, v)| (format!("label.{k}"), (*v).to_owned())).collect();
        q.extend(limit.map(|l| ("limit".to_owned(), l.to_string())));
        q.extend(cursor.map(|c| ("cursor".to_owned(), c.to_owned())));
        decode(self.req(Method::GET, "/v1/refs").query(&q).send().await?).await
    }

    /// One answer of a search across this namespace's outputs; follow `next_cursor` (in
    /// `SearchRequest::cursor`) for the rest. A store busy with other scans (`429`) is asked
    /// again a few times.
    pub async fn search(&self, s: &SearchRequest) -> Result<SearchResponse> {
        retry_busy(|| async {
            let req = self.req(Method::GET, "/v1/search").query(&s.query()).query(self.redact_query());
            decode(req.timeout(self.read_timeout).send().await?).await
        })
        .await
    }

    /// Opens a stream for a background task's output.
    pub async fn create_stream(&self, opts: &UploadOptions) -> Result<StreamCreated> {
        decode(self.req(Method::POST, "/v1/streams").query(&opts.query()).send().await?).await
    }

    /// Appends at `offset` (which must be the stream's size); safe to retry.
    pub async fn append(&self, id: &str, offset: u64, data: Bytes) -> Result<AppendResponse> {
        let resp = self
            .req(Method::POST, &format!("/v1/streams/{id}/append"))
            .query(&[("offset", offset)])
            .body(data)
            .send()
            .await?;
        decode(resp).await
    }

    /// A stream's state.
    pub async fn stream_info(&self, id: &str) -> Result<StreamInfo> {
        decode(self.req(Method::GET, &format!("/v1/streams/{id}")).send().await?).await
    }

    /// Raw bytes of a stream from `offset` (at most `limit`, 4 MiB by default), and the
    /// stream's size when they were read (`GET /v1/streams/{id}/bytes`).
    pub async fn stream_bytes(&self, id: &str, offset: u64, limit: Option<u64>) -> Result<(Bytes, u64)> {
        let mut q = vec![("offset", offset)];
        q.extend(limit.map(|l| ("limit", l)));
        let resp = check(self.req(Method::GET, &format!("/v1/streams/{id}/bytes")).query(&q).send().await?).await?;
        let size = resp.headers().get("x-spillway-stream-size").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let data = resp.bytes().await?;
        Ok((data, size.unwrap_or(offset)))
    }

    /// A capped page of a stream; `wait_ms` long-polls for new data.
    pub async fn read_stream(&self, id: &str, r: ReadRequest, wait_ms: Option<u64>) -> Result<ReadPage> {
        let mut q = r.query();
        q.extend(wait_ms.map(|w| ("wait_ms", w.to_string())));
        q.extend(self.redact_query().iter().map(|&(k, v)| (k, v.to_owned())));
        decode(self.req(Method::GET, &format!("/v1/streams/{id}/read")).query(&q).send().await?).await
    }

    /// Turns a stream into a blob.
    pub async fn seal(&self, id: &str) -> Result<BlobRecord> {
        decode(self.req(Method::POST, &format!("/v1/streams/{id}/seal")).send().await?).await
    }

    /// Turns a stream into a blob, recording how its task ended.
    pub async fn seal_with(&self, id: &str, how: &SealRequest) -> Result<BlobRecord> {
        decode(self.req(Method::POST, &format!("/v1/streams/{id}/seal")).json(how).send().await?).await
    }
}

/// Runs `op`, and again after ~100 and ~200 ms (with jitter) while it answers `503
/// unavailable`, the contract's "retry".
async fn retry_unavailable<T, F, Fut>(op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    use backon::Retryable;
    let backoff = backon::ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(100))
        .with_max_times(2)
        .with_jitter();
    op.retry(backoff).when(|e| matches!(e, ClientError::Api { status: 503, .. })).await
}

/// Runs `op`, and again after ~250 ms, ~500 ms, ~1 s and ~2 s (with jitter) while it answers
/// `429 too_many_requests`: the store runs so many scans at once and asks to come back.
pub(crate) async fn retry_busy<T, F, Fut>(op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    use backon::Retryable;
    let backoff = backon::ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(250))
        .with_max_times(4)
        .with_jitter();
    op.retry(backoff).when(|e| matches!(e, ClientError::Api { status: 429, .. })).await
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn api(status: u16, code: spillway_api::ErrorCode) -> ClientError {
        ClientError::Api { status, code, message: String::new() }
    }

    /// Calls `retry_unavailable` with an operation that fails with `errors` in turn, then
    /// succeeds; returns the outcome and how many calls were made.
    async fn run(errors: Vec<ClientError>) -> (Result<u32>, u32) {
        let calls = AtomicU32::new(0);
        let errors = std::sync::Mutex::new(errors.into_iter());
        let out = retry_unavailable(|| async {
            let n = calls.fetch_add(1, Ordering::Relaxed) + 1;
            match errors.lock().unwrap().next() {
                Some(e) => Err(e),
                None => Ok(n),
            }
        })
        .await;
        (out, calls.load(Ordering::Relaxed))
    }

    #[tokio::test(start_paused = true)]
    async fn unavailable_is_retried_twice_and_nothing_else_is() {
        use spillway_api::ErrorCode::{InvalidArgument, Unavailable};
        let (out, calls) = run(vec![api(503, Unavailable), api(503, Unavailable)]).await;
        assert_eq!((out.unwrap(), calls), (3, 3), "two 503s, then the answer");
        let (out, calls) = run((0..3).map(|_| api(503, Unavailable)).collect()).await;
        assert!(matches!(out, Err(ClientError::Api { status: 503, .. })));
        assert_eq!(calls, 3, "three attempts in all");
        let (out, calls) = run(vec![api(400, InvalidArgument)]).await;
        assert!(matches!(out, Err(ClientError::Api { status: 400, .. })));
        assert_eq!(calls, 1, "a caller's mistake is not retried");
    }
}
