//! `GET /v1/search`: matching lines across this namespace's outputs (`search.rs`).

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use spillway_api::SearchResponse;

use super::extract::Q;
use crate::auth::{Caller, Scope};
use crate::error::{ApiError, ApiResult};
use crate::search::{search, SearchAsk};
use crate::state::AppState;

/// `GET /v1/search?pattern=…&label.<k>=<v>&since=&until=&cursor=`: capped, resumable.
#[utoipa::path(get, path = "/v1/search", params(SearchParams),
    responses((status = 200, body = SearchResponse), (status = 400, body = spillway_api::ErrorBody),
        (status = 429, body = spillway_api::ErrorBody)))]
pub(super) async fn search_outputs(
    State(state): State<AppState>,
    caller: Caller,
    Q(pairs): Q<Vec<(String, String)>>,
) -> ApiResult<Response> {
    caller.require(Scope::Read)?;
    let found = search(&state.search, &caller, SearchAsk::from_pairs(pairs)?).await?;
    let body = serde_json::to_vec(&found).map_err(ApiError::internal)?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// The query of `/v1/search`, as the OpenAPI description shows it (the handler reads the
/// pairs itself: `label.<key>` parameters have open names).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
struct SearchParams {
    /// Rust `regex` syntax (a literal with `fixed=true`), as grep takes it.
    pattern: String,
    /// Case-insensitive.
    ignore_case: Option<bool>,
    /// Treat the pattern as a literal.
    fixed: Option<bool>,
    /// Context lines before each match (at most 100).
    before: Option<u32>,
    /// Context lines after each match (at most 100).
    after: Option<u32>,
    /// Only outputs referenced since then: Unix seconds, RFC 3339, or a duration back from now (`90m`, `24h`, `7d`).
    since: Option<String>,
    /// Only outputs referenced until then (the same forms as `since`).
    until: Option<String>,
    /// Most matches in this answer (default 100, at most 1000).
    max_matches: Option<u32>,
    /// Search and show the text with secrets replaced by marks (always, for a redacted token).
    redact: Option<bool>,
    /// The `next_cursor` of the previous answer.
    cursor: Option<String>,
}
