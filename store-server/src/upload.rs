//! The write path shared by uploads and stream seals: stage and verify the bytes, then either
//! reference the stored copy (dedup) or publish the staged one, never leaving a reference to
//! bytes that retention is deleting.

use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use spillway_api::{AnyDigest, BlobRecord, Digest, Labels, Namespace, Sha256Digest};
use tracing::instrument;

use crate::blobs::{BlobError, Staged, INLINE_MAX};
use crate::clock::rfc3339;
use crate::db::{AddRef, BlobRow, BlobState, NewRef};
use crate::error::{ApiError, ApiResult};
use crate::state::{AppState, UploadRaces};

/// How long an upload waits for retention to finish deleting the same content.
const DELETING_WAIT: Duration = Duration::from_secs(15);

/// The reference an upload makes.
#[derive(Debug, Clone)]
pub struct RefSpec {
    /// The namespace the reference belongs to.
    pub namespace: Namespace,
    /// Labels of the reference, already checked.
    pub labels: Labels,
    /// `None` pins.
    pub ttl_ms: Option<i64>,
}

/// A stored upload: the record and whether the namespace held the blob before.
#[derive(Debug)]
pub struct Stored {
    /// The blob record the upload answers with.
    pub record: BlobRecord,
}

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
            BlobError::Spent => {
                tracing::warn!("an upload's bytes were deleted by a racing deletion of the same content");
                ApiError::Unavailable("the same content was deleted while this upload was stored; retry".into())
            }
            BlobError::Storage(cause) => {
                tracing::error!(cause = %cause, "blob storage failed");
                ApiError::Unavailable("blob storage is unavailable; retry".into())
            }
        }
    }
}

/// Receives, verifies and stores a body, then references it in the caller's namespace.
#[instrument(skip_all, fields(namespace = %spec.namespace))]
pub async fn store<S, E>(
    state: &AppState,
    expected: Option<AnyDigest>,
    spec: &RefSpec,
    body: S,
    size_hint: Option<u64>,
) -> ApiResult<Stored>
where
    S: Stream<Item = Result<Bytes, E>> + Send,
    E: std::fmt::Display,
{
    let direct = direct_key(state, expected, size_hint).await?;
    let staged = state.blobs.stage(body, state.config.max_blob_bytes, size_hint, direct).await?;
    let result = commit(state, expected, spec, &staged).await;
    state.blobs.discard(staged).await;
    if let Ok(s) = &result {
        metrics::counter!("spillway_bytes_in_total").increment(s.record.size);
        if s.record.deduplicated {
            metrics::counter!("spillway_dedup_hits_total").increment(1);
        }
    }
    result
}

/// The content key a body may be written straight to (on an object store, see
/// [`BlobStore::stage`](crate::blobs::BlobStore::stage)): its announced BLAKE3 digest, when no
/// row of that content exists. Bytes written straight to the key cannot be published a second
/// time, and a deletion of the same content in progress could remove them; a stored blob is
/// deduplicated anyway. Bodies announced as small enough to be inline need no look.
async fn direct_key(
    state: &AppState,
    expected: Option<AnyDigest>,
    size_hint: Option<u64>,
) -> ApiResult<Option<Digest>> {
    let Some(AnyDigest::Blake3(d)) = expected else { return Ok(None) };
    if !state.blobs.writes_direct() || size_hint.is_some_and(|n| n <= INLINE_MAX as u64) {
        return Ok(None);
    }
    Ok(state.db.blob_state(&d).await?.is_none().then_some(d))
}

fn check(expected: Option<AnyDigest>, staged: &Staged) -> ApiResult<()> {
    let sha = Sha256Digest::from_bytes(staged.sha256);
    let mismatch = match expected {
        Some(AnyDigest::Blake3(d)) if d != staged.digest => Some((d.to_string(), staged.digest.to_string())),
        Some(AnyDigest::Sha256(s)) if s != sha => Some((s.to_string(), sha.to_string())),
        _ => None,
    };
    match mismatch {
        Some((expected, actual)) => Err(ApiError::DigestMismatch { expected, actual }),
        None => Ok(()),
    }
}

async fn commit(state: &AppState, expected: Option<AnyDigest>, spec: &RefSpec, staged: &Staged) -> ApiResult<Stored> {
    check(expected, staged)?;
    let now = state.now();
    let expires_at = spec.ttl_ms.map(|t| now.saturating_add(t));
    let new_ref = NewRef {
        namespace: spec.namespace.clone(),
        digest: staged.digest,
        labels: spec.labels.clone(),
        expires_at,
        pin_reason: None,
    };
    let deduplicated = reference(state, staged, &new_ref, now).await?;
    // A deletion that claimed an earlier life of this content before our row existed may have
    // removed the bytes between our publication and our row (its row was gone when ours went
    // in). Our reference now keeps every deleter away: one look, and publish again if needed.
    if staged.inline().is_none() && !state.blobs.exists(&staged.digest).await? {
        tracing::warn!(digest = %staged.digest, "bytes removed by a deletion that raced this upload; publishing again");
        UploadRaces::count(&state.races.published_again);
        state.blobs.publish(staged).await?;
    }
    Ok(Stored {
        record: BlobRecord {
            digest: staged.digest,
            sha256: Sha256Digest::from_bytes(staged.sha256).to_string(),
            size: staged.size,
            lines: staged.lines,
            deduplicated,
            expires_at: expires_at.map(rfc3339),
        },
    })
}

/// Makes the reference: to the stored blob when it is live (dedup), after publishing the staged
/// bytes when there is none, after waiting when retention is deleting the same content.
/// Returns whether the namespace already held the blob.
async fn reference(state: &AppState, staged: &Staged, new_ref: &NewRef, now: i64) -> ApiResult<bool> {
    let give_up = tokio::time::Instant::now() + DELETING_WAIT;
    // New content (the common case) goes straight to publication: one write, not two.
    // Inline blobs cost nothing to publish, so they skip the look first.
    let look = if staged.inline().is_some() { None } else { state.db.blob_state(&new_ref.digest).await? };
    let mut step = match look {
        None => AddRef::Absent,
        Some(BlobState::Deleting) => AddRef::Deleting,
        Some(BlobState::Live) => state.db.add_ref_if_live(new_ref, now).await?,
    };
    loop {
        step = match step {
            AddRef::Added { deduplicated } => return Ok(deduplicated),
            AddRef::Absent => match state.blobs.publish(staged).await {
                // Whatever raced the publication (retention collecting the same content under
                // it), the staged copy is still ours: publish it again.
                Err(BlobError::NotFound) if tokio::time::Instant::now() < give_up => {
                    UploadRaces::count(&state.races.published_again);
                    tracing::warn!(digest = %staged.digest, "publication raced a deletion; publishing again");
                    AddRef::Absent
                }
                Err(e) => return Err(e.into()),
                Ok(()) => match state.db.insert_blob_with_ref(&blob_row(staged), new_ref, now).await? {
                    Some(deduplicated) => return Ok(deduplicated),
                    None => AddRef::Deleting,
                },
            },
            AddRef::Deleting => {
                UploadRaces::count(&state.races.waited_for_deletion);
                if tokio::time::Instant::now() > give_up {
                    return Err(ApiError::Unavailable("the same content is being deleted; retry".into()));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                state.db.add_ref_if_live(new_ref, now).await?
            }
        };
    }
}

/// The metadata row of staged bytes.
fn blob_row(staged: &Staged) -> BlobRow {
    BlobRow {
        digest: staged.digest,
        sha256: Sha256Digest::from_bytes(staged.sha256),
        size: staged.size,
        lines: staged.lines,
        line_index: staged.index.encode(),
        inline_data: staged.inline().map(|b| b.to_vec()),
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
