//! `GET /v1/refs`: this namespace's references, newest first, filtered by labels.

use axum::extract::State;
use axum::Json;
use std::collections::BTreeMap;

use spillway_api::{RefEntry, RefList};

use super::extract::Q;
use crate::auth::{Caller, Scope};
use crate::clock::rfc3339;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

const DEFAULT_LIMIT: u32 = 100;
const MAX_LIMIT: u32 = 1000;
/// The route a cursor of this listing is sealed for.
const CURSOR: &str = "refs";

/// `GET /v1/refs?label.<k>=<v>&digest=&limit=&cursor=`.
#[utoipa::path(get, path = "/v1/refs", responses((status = 200, body = RefList)))]
pub(super) async fn list_refs(
    State(state): State<AppState>,
    caller: Caller,
    Q(pairs): Q<Vec<(String, String)>>,
) -> ApiResult<Json<RefList>> {
    caller.require(Scope::Read)?;
    // A filter is not a label set: any number of pairs, any value length; keys are checked.
    let mut filter = BTreeMap::new();
    let mut limit = DEFAULT_LIMIT;
    let mut cursor = None;
    let mut digest = None;
    for (k, v) in pairs {
        if let Some(key) = k.strip_prefix("label.") {
            if !spillway_api::valid_label_key(key) {
                return Err(ApiError::InvalidArgument(format!("invalid label key {key:?}")));
            }
            if filter.insert(key.to_owned(), v).is_some() {
                return Err(ApiError::InvalidArgument(format!("label {key} is given twice")));
            }
        } else if k == "limit" {
            limit = v
                .parse()
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| ApiError::InvalidArgument(format!("limit must be 1 to {MAX_LIMIT}")))?;
        } else if k == "digest" {
            // The references to one output (the viewer's header: its labels, when it was made).
            digest = match super::extract::parse_digest(&v)? {
                spillway_api::AnyDigest::Blake3(d) => Some(d),
                spillway_api::AnyDigest::Sha256(_) => {
                    return Err(ApiError::InvalidArgument("digest: use the output's blake3: digest".into()))
                }
            };
        } else if k == "cursor" {
            // Opaque and bound to this namespace: a row id, sealed (see `cursor.rs`).
            let raw = state.cursors.open(CURSOR, &caller.namespace, b"", &v)?;
            let id = <[u8; 8]>::try_from(raw.as_slice()).map(i64::from_be_bytes);
            cursor = Some(id.map_err(|_| ApiError::InvalidArgument("invalid cursor".into()))?);
        } // other parameters are ignored, as S3 does
    }
    let rows = state.db.list_refs(&caller.namespace, &filter, digest.as_ref(), cursor, limit + 1, state.now()).await?;
    let more = rows.len() > limit as usize;
    let refs: Vec<RefEntry> = rows
        .iter()
        .take(limit as usize)
        .map(|r| RefEntry {
            digest: r.digest.to_string(),
            size: r.size,
            lines: r.lines,
            labels: r.labels.clone(),
            created_at: rfc3339(r.created_at),
            expires_at: r.expires_at.map(rfc3339),
            pinned: r.pinned,
        })
        .collect();
    let next_cursor = if more {
        let last = rows.get(limit as usize - 1);
        last.map(|r| state.cursors.seal(CURSOR, &caller.namespace, b"", &r.id.to_be_bytes()))
    } else {
        None
    };
    Ok(Json(RefList { refs, next_cursor }))
}
