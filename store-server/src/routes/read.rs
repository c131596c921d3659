//! `/v1/blobs/{digest}/read` and `/grep`: the capped read path over a stored blob.

use axum::extract::{Path, State};
use axum::Json;
use serde::Deserialize;
use spillway_api::{GrepResponse, ReadPage};

use super::extract::{parse_digest, Q};
use super::query::{page_of, ReadQuery};
use crate::auth::{Caller, Scope};
use crate::error::ApiResult;
use crate::json::PageJson;
use crate::state::AppState;
use crate::store::{visible, BlobSource};
use spillway_api::paging::{self as page, GrepRequest};

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
