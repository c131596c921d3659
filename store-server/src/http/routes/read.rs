//! `/v1/blobs/{digest}/read` and `/grep`: the capped read path over a stored blob.

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use spillway_api::{GrepResponse, ReadPage};

use super::extract::{parse_digest, Q};
use super::query::{count_page, page_of, GrepQuery, ReadQuery};
use crate::auth::{Caller, Scope};
use crate::blobs::source::{escaped_page, redacted_escaped_page, visible, BlobSource};
use crate::blobs::text::EscapedPage;
use crate::blobs::Probes;
use crate::error::{ApiError, ApiResult};
use crate::http::json::{EscapedJson, PageJson};
use crate::state::AppState;
use spillway_api::paging as page;

/// `GET /v1/blobs/{digest}/read`: a byte or line page, never over 100,000 bytes of content.
#[utoipa::path(get, path = "/v1/blobs/{digest}/read", params(("digest" = String, Path), ReadQuery),
    responses((status = 200, body = ReadPage), (status = 416, body = spillway_api::ErrorBody)))]
pub(super) async fn read_blob(
    State(state): State<AppState>,
    caller: Caller,
    Path(raw): Path<String>,
    Q(q): Q<ReadQuery>,
) -> ApiResult<Response> {
    caller.require(Scope::Read)?;
    let d = parse_digest(&raw)?;
    q.check()?;
    // wait_ms is accepted and has nothing to wait for: a blob is complete.
    let row = visible(&state.blobs, &caller.namespace, &d).await?;
    let redact = caller.redacts(q.redact()).then_some(&*state.blobs.redactor);
    if q.tail_lines().is_some() {
        // The last lines: found from the end of the blob (its last 100 KB), then a line page.
        let src = BlobSource::new(&state.blobs, &row)?;
        return Ok(PageJson(page_of(&src, &q, redact).await?).into_response());
    }
    if redact.is_some() {
        // A page no secret overlaps is the plain page, and a page with secrets that page
        // with marks: from the text cache, as fast.
        if let Some(page) = escaped_page(&state.blobs, &row, q.page()).await? {
            let whole_lines = matches!(q.page(), crate::blobs::source::PageAsk::Lines { .. });
            if let Some(page) = redacted_escaped_page(&state.blobs, &row, page, whole_lines).await? {
                count_page(&page.page);
                Probes::count(&state.blobs.probes.escaped_pages);
                return Ok(EscapedJson(page).into_response());
            }
        }
        let src = BlobSource::new(&state.blobs, &row)?;
        return Ok(PageJson(page_of(&src, &q, redact).await?).into_response());
    }
    if let Some(page) = escaped_page(&state.blobs, &row, q.page()).await? {
        return Ok(escaped_answer(&state, page));
    }
    let src = BlobSource::new(&state.blobs, &row)?;
    Ok(PageJson(page_of(&src, &q, None).await?).into_response())
}

/// A plain page cut from the escaped text, counted and answered.
fn escaped_answer(state: &AppState, page: EscapedPage) -> Response {
    count_page(&page.page);
    static ESCAPED: std::sync::LazyLock<metrics::Counter> =
        std::sync::LazyLock::new(|| metrics::counter!("spillway_read_escaped_pages_total"));
    ESCAPED.increment(1);
    Probes::count(&state.blobs.probes.escaped_pages);
    EscapedJson(page).into_response()
}

/// The capped read's common case answered before the router (`listen.rs`): a plain page from
/// the text cache, for a token and a blob this replica has in its caches. It is `read_blob`'s
/// own path, with the extractors' work done in place, and answers the same bytes; the router,
/// its layers and extractors cost about a fifth of such a read's CPU (`docs/benchmarks.md`).
/// `None`, having changed nothing, for anything else — a percent-escape, a missing or uncached
/// token, a malformed input, redaction, a blob not in the caches, a page not cut from the
/// escaped text, any error — which the router then answers as usual. (Requests over the
/// edge's limits never come here: `routes::answer_before_router`.) The caller logs and counts
/// the request as `routes::track` does (`routes::request_done`).
pub(crate) async fn read_before_router<B>(
    state: &AppState,
    req: &axum::http::Request<B>,
) -> Option<(Response, spillway_api::Namespace)> {
    // Only where visibility is cached (the embedded backend: one writer).
    if req.method() != axum::http::Method::GET || !state.blobs.visibility.enabled() {
        return None;
    }
    let raw = req.uri().path().strip_prefix("/v1/blobs/")?.strip_suffix("/read")?;
    // Without escapes the path's digest and the query are what the extractors would decode.
    if raw.contains(['/', '%']) || req.uri().query().is_some_and(|q| q.contains('%')) {
        return None;
    }
    let caller = state.tokens.cached_caller(req.headers())?;
    caller.require(Scope::Read).ok()?;
    let d = parse_digest(raw).ok()?;
    let axum::extract::Query(q) = axum::extract::Query::<ReadQuery>::try_from_uri(req.uri()).ok()?;
    q.check().ok()?;
    if caller.redacts(q.redact()) || q.tail_lines().is_some() {
        return None;
    }
    let row = crate::blobs::source::visible_cached(&state.blobs, &caller.namespace, &d)?;
    let page = escaped_page(&state.blobs, &row, q.page()).await.ok()??;
    Probes::count(&state.blobs.probes.reads_before_router);
    Some((escaped_answer(state, page), caller.namespace))
}

/// `GET /v1/blobs/{digest}/grep`: matching lines, capped and resumable. The scan runs on the
/// heavy pool for at most the search budget (`heavy.rs`).
#[utoipa::path(get, path = "/v1/blobs/{digest}/grep", params(("digest" = String, Path), GrepQuery),
    responses((status = 200, body = GrepResponse), (status = 400, body = spillway_api::ErrorBody)))]
pub(super) async fn grep_blob(
    State(state): State<AppState>,
    caller: Caller,
    Path(raw): Path<String>,
    Q(q): Q<GrepQuery>,
) -> ApiResult<Response> {
    caller.require(Scope::Read)?;
    let d = parse_digest(&raw)?;
    let regex = q.compile()?;
    let row = visible(&state.blobs, &caller.namespace, &d).await?;
    // Like a search, it gives way to other requests while they come (`Heavy::give_way`).
    let src = BlobSource::new(&state.blobs, &row)?.scanning().giving_way(state.heavy.pace());
    let budget = state.config.search_budget;
    let redact = caller.redacts(q.redact()).then(|| state.blobs.redactor.clone());
    // The answer is made into JSON on the heavy pool too: a page of matches can be 100 KB.
    let body = state
        .heavy
        .run(async move {
            let deadline = std::time::Instant::now() + budget;
            let found = page::grep(&src, q.request(&regex, Some(deadline), redact.as_deref())).await?;
            serde_json::to_vec(&found).map_err(ApiError::internal)
        })
        .await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}
