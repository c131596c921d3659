//! `/v1/blobs/{digest}/read` and `/grep`: the capped read path over a stored blob, and the
//! query parameters shared with stream reads.

use async_trait::async_trait;
use axum::extract::{Path, State};
use axum::Json;
use bytes::Bytes;
use serde::Deserialize;
use spillway_api::{Digest, GrepResponse, ReadPage, DEFAULT_PAGE_LINES, READ_CAP};

use super::blobs::{blob_digest, visible};
use super::{parse_digest, Q};
use crate::auth::{Caller, Scope};
use crate::blobs::BlobStore;
use crate::error::{src_err, ApiError, ApiResult};
use crate::json::PageJson;
use crate::state::AppState;
use spillway_api::paging::lines::{Checkpoint, LineIndex};
use spillway_api::paging::{self as page, GrepRequest, PageResult, Source};

/// Query of the capped read API.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct ReadQuery {
    /// Byte page start.
    offset: Option<u64>,
    /// Byte page length (capped at 100,000).
    limit: Option<u64>,
    /// Line page start, 1-based.
    line: Option<u64>,
    /// Lines in a line page (default 2000).
    lines: Option<u64>,
    /// Streams only: long-poll this many milliseconds (≤ 30000) for data.
    wait_ms: Option<u64>,
}

impl ReadQuery {
    /// The byte position a long-poll waits to be passed.
    /// The position a long-poll waits for data at: a byte offset, or a 1-based line.
    pub(super) fn wants_after(&self) -> Position {
        match self.line.or(self.lines.map(|_| 1)) {
            Some(line) => Position::Line(line),
            None => Position::Byte(self.offset.unwrap_or(0)),
        }
    }

    pub(super) fn wait_ms(&self) -> Option<u64> {
        self.wait_ms
    }

    /// Checks what does not depend on the source, before any waiting.
    pub(super) fn check(&self) -> ApiResult<()> {
        if self.offset.or(self.limit).is_some() && self.line.or(self.lines).is_some() {
            return Err(ApiError::InvalidArgument("use offset/limit or line/lines, not both".into()));
        }
        if self.line == Some(0) || self.lines == Some(0) {
            return Err(ApiError::InvalidArgument("line and lines start at 1".into()));
        }
        Ok(())
    }
}

/// Where a read starts.
#[derive(Debug, Clone, Copy)]
pub(super) enum Position {
    /// A byte offset.
    Byte(u64),
    /// A 1-based line.
    Line(u64),
}

/// Runs a read over any source.
pub(super) async fn page_of(src: &dyn Source, q: &ReadQuery) -> ApiResult<ReadPage> {
    let page = match (q.offset.or(q.limit.map(|_| 0)), q.line.or(q.lines.map(|_| 1))) {
        (Some(_), Some(_)) => return Err(ApiError::InvalidArgument("use offset/limit or line/lines, not both".into())),
        (_, Some(line)) => page::line_page(src, line, q.lines.unwrap_or(DEFAULT_PAGE_LINES)).await?,
        (offset, None) => page::byte_page(src, offset.unwrap_or(0), q.limit.unwrap_or(READ_CAP as u64)).await?,
    };
    if page.capped {
        metrics::counter!("spillway_read_capped_total").increment(1);
    }
    metrics::counter!("spillway_bytes_out_total").increment(page.length);
    Ok(page)
}

/// A stored blob as a read source.
pub(super) struct BlobSource {
    pub(super) blobs: BlobStore,
    pub(super) digest: Digest,
    pub(super) size: u64,
    pub(super) lines: u64,
    pub(super) index: LineIndex,
    pub(super) inline: Option<Bytes>,
}

impl BlobSource {
    pub(super) fn new(state: &AppState, row: &crate::db::BlobRow) -> ApiResult<Self> {
        Ok(Self {
            blobs: state.blobs.clone(),
            digest: blob_digest(row)?,
            size: row.size,
            lines: row.lines,
            index: LineIndex::decode(&row.line_index),
            inline: row.inline_data.clone().map(Bytes::from),
        })
    }
}

#[async_trait]
impl Source for BlobSource {
    fn size(&self) -> u64 {
        self.size
    }
    fn total_lines(&self) -> u64 {
        self.lines
    }
    fn digest(&self) -> Option<String> {
        Some(self.digest.to_string())
    }
    async fn checkpoint_for_offset(&self, offset: u64) -> PageResult<Checkpoint> {
        Ok(self.index.for_offset(offset))
    }
    async fn checkpoint_for_line(&self, line: u64) -> PageResult<Checkpoint> {
        Ok(self.index.for_line(line))
    }
    async fn read(&self, start: u64, end: u64) -> PageResult<Bytes> {
        if let Some(data) = &self.inline {
            return Ok(data.slice(start as usize..end as usize));
        }
        src_err(self.blobs.get_range(&self.digest, start..end).await)
    }
}

/// `GET /v1/blobs/{digest}/read`: a byte or line page, never over 100,000 bytes of content.
#[utoipa::path(get, path = "/v1/blobs/{digest}/read", params(("digest" = String, Path), ReadQuery),
    responses((status = 200, body = ReadPage), (status = 416, body = spillway_api::ErrorBody)))]
pub(super) async fn read_blob(
    State(state): State<AppState>,
    caller: Caller,
    Path(raw): Path<String>,
    Q(q): Q<ReadQuery>,
) -> ApiResult<PageJson> {
    caller.require(Scope::Read)?;
    let d = parse_digest(&raw)?;
    q.check()?;
    // wait_ms is accepted and has nothing to wait for: a blob is complete.
    let row = visible(&state, &caller.namespace, &d).await?;
    let src = BlobSource::new(&state, &row)?;
    Ok(PageJson(page_of(&src, &q).await?))
}

/// Query of grep.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct GrepQuery {
    /// Rust `regex` syntax.
    pattern: String,
    /// Case-insensitive.
    #[serde(default)]
    ignore_case: bool,
    /// Treat the pattern as a literal.
    #[serde(default)]
    fixed: bool,
    /// 1-based line to start at.
    from_line: Option<u64>,
    /// Most matches to return.
    max_matches: Option<usize>,
    /// Context lines before each match (at most 100).
    before: Option<usize>,
    /// Context lines after each match (at most 100).
    after: Option<usize>,
}

/// `GET /v1/blobs/{digest}/grep`: matching lines, capped and resumable.
#[utoipa::path(get, path = "/v1/blobs/{digest}/grep", params(("digest" = String, Path), GrepQuery),
    responses((status = 200, body = GrepResponse), (status = 400, body = spillway_api::ErrorBody)))]
pub(super) async fn grep_blob(
    State(state): State<AppState>,
    caller: Caller,
    Path(raw): Path<String>,
    Q(q): Q<GrepQuery>,
) -> ApiResult<Json<GrepResponse>> {
    caller.require(Scope::Read)?;
    let d = parse_digest(&raw)?;
    let regex = page::compile_pattern(&q.pattern, q.fixed, q.ignore_case)?;
    let row = visible(&state, &caller.namespace, &d).await?;
    let src = BlobSource::new(&state, &row)?;
    let req = GrepRequest {
        regex: &regex,
        from_line: q.from_line.unwrap_or(1),
        max_matches: q.max_matches.unwrap_or(usize::MAX),
        before: q.before.unwrap_or(0),
        after: q.after.unwrap_or(0),
    };
    Ok(Json(page::grep(&src, req).await?))
}
