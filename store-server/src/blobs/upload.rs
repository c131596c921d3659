//! The write path shared by uploads and stream seals: stage and verify the bytes, publish
//! them, then reference the content in one transaction that inserts its row, keeps it, or
//! takes it back from retention (see `db::blobs` and `retention` for the invariant). An
//! upload never waits for a deletion of the same content and never fails because of one.

use bytes::Bytes;
use futures::Stream;
use spillway_api::{AnyDigest, BlobRecord, Digest, Labels, Namespace, Sha256Digest};
use tracing::instrument;

use crate::blobs::{Blobs, Probes};
use crate::clock::rfc3339;
use crate::db::{BlobRow, NewRef};
use crate::error::{ApiError, ApiResult};
use crate::storage::{Staged, INLINE_MAX};

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

/// Receives, verifies and stores a body, then references it in the caller's namespace.
#[instrument(skip_all, fields(namespace = %spec.namespace))]
pub async fn store<S, E>(
    blobs: &Blobs,
    expected: Option<AnyDigest>,
    spec: &RefSpec,
    body: S,
    size_hint: Option<u64>,
) -> ApiResult<Stored>
where
    S: Stream<Item = Result<Bytes, E>> + Send,
    E: std::fmt::Display,
{
    let direct = direct_key(blobs, expected, size_hint);
    let staged = blobs.store.stage(body, blobs.max_blob_bytes, size_hint, direct).await?;
    let result = commit(blobs, expected, spec, &staged).await;
    blobs.store.discard(staged).await;
    if let Ok(s) = &result {
        metrics::counter!("spillway_bytes_in_total").increment(s.record.size);
        if s.record.deduplicated {
            metrics::counter!("spillway_dedup_hits_total").increment(1);
        }
    }
    result
}

/// The content key a body may be written straight to (on an object store, see
/// [`BlobStore::stage`](crate::storage::BlobStore::stage)): its announced BLAKE3 digest, whether
/// or not the content is stored already — the same requests either way, so timing tells no
/// namespace what another holds. The multipart upload is completed inside the transaction
/// that references it, only if the row needs its bytes; else it is aborted (the stored copy
/// stays untouched). Bodies announced as small enough to be inline stay in memory.
fn direct_key(blobs: &Blobs, expected: Option<AnyDigest>, size_hint: Option<u64>) -> Option<Digest> {
    let Some(AnyDigest::Blake3(d)) = expected else { return None };
    if !blobs.store.writes_direct() || size_hint.is_some_and(|n| n <= INLINE_MAX as u64) {
        return None;
    }
    // Content whose stored copy is damaged is staged apart: its publication replaces that copy.
    (!blobs.damage.contains(&d)).then_some(d)
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

async fn commit(blobs: &Blobs, expected: Option<AnyDigest>, spec: &RefSpec, staged: &Staged) -> ApiResult<Stored> {
    check(expected, staged)?;
    check_quota(blobs, &spec.namespace, staged).await?;
    let inside = staged.is_direct();
    let publish = if inside { blobs.store.publisher(staged) } else { None };
    // What the database says of this content now, to try the likely statement first.
    // Inline blobs, nearly always new, skip the look, and so does a write with nothing to
    // complete inside it on SQLite: `Db::add_ref` makes it on the writer's own connection,
    // which reads the row in its transaction and has no use for the look.
    let hint = if staged.inline().is_some() || (publish.is_none() && blobs.db.writes_natively()) {
        None
    } else {
        blobs.db.blob_state(&staged.digest).await?
    };
    // Bytes first, then the row that points to them (a crash in between leaves bytes without a
    // row, which retention sweeps; never a row without bytes). Stored content is published
    // again all the same (a link that exists, the directory's fsync): the same work either
    // way, so an upload's timing never tells whether another namespace holds its content.
    // Bytes written straight to their key are completed inside the row's transaction
    // (`Db::add_ref`), and only if the row needs them.
    // Content whose stored copy failed its hash (or is gone) is stored again: the damaged copy
    // goes first, so that publication puts these verified bytes in its place.
    // (Not an upload written straight to its key: one of marked content never is, but for a
    // mark that came while it was received, which the next upload repairs.)
    // Bytes kept inline are in the row, which an upload of stored content leaves as it is: a
    // damaged inline row stays marked (and refused) rather than be unmarked unrepaired.
    let repairs = !inside && staged.inline().is_none() && blobs.damage.contains(&staged.digest);
    if repairs {
        make_room_for_repair(blobs, &staged.digest).await?;
    }
    if !inside {
        blobs.store.publish(staged).await?;
    }
    // The reference lives `ttl` from the moment it is written, not from when the body began.
    let now = blobs.now();
    let expires_at = spec.ttl_ms.map(|t| now.saturating_add(t));
    let new_ref = NewRef {
        namespace: spec.namespace.clone(),
        digest: staged.digest,
        labels: spec.labels.clone(),
        expires_at,
        pin_reason: None,
    };
    let done = blobs.db.add_ref(&blob_row(staged), &new_ref, now, hint, publish).await?;
    if done.took_back {
        Probes::count(&blobs.probes.took_back);
        tracing::info!(digest = %staged.digest, "took back content that retention was deleting");
    }
    // A deletion that held the content's row before ours (claimed, its bytes going) may have
    // removed the bytes we published before our row went in. Our reference now keeps every
    // deleter away: one look, and publish again from the staged copy if needed. (Bytes
    // published inside our transaction, or a live row kept, cannot have lost them so.)
    if !inside && staged.inline().is_none() && !blobs.store.exists(&staged.digest).await? {
        tracing::warn!(digest = %staged.digest, "bytes removed by a deletion that raced this upload; publishing again");
        blobs.store.publish(staged).await?;
    }
    if repairs {
        blobs.clear_damaged(&staged.digest).await?;
        tracing::info!(digest = %staged.digest, "damaged content stored again");
    }
    Ok(Stored {
        record: BlobRecord {
            digest: staged.digest,
            sha256: Sha256Digest::from_bytes(staged.sha256).to_string(),
            size: staged.size,
            lines: staged.lines,
            // A repair answers as a first upload does (api.md v1.3).
            deduplicated: done.deduplicated && !repairs,
            expires_at: expires_at.map(rfc3339),
        },
    })
}

/// Before verified bytes of damaged content are published whole (the mark keeps every read
/// away meanwhile): a compacted blob becomes raw again first — its chunk list goes; a later
/// compaction makes a new one, storing afresh any chunk marked damaged — so that retention's
/// sweep never takes the new raw copy for a leftover under a `chunked` row; a raw blob's
/// damaged copy goes, so that publication puts the new bytes in its place.
async fn make_room_for_repair(blobs: &Blobs, d: &Digest) -> ApiResult<()> {
    match blobs.db.blob_row(d).await? {
        Some(row) if row.chunked => blobs.db.restore_raw(d).await?,
        _ => blobs.store.delete(d).await?,
    }
    blobs.forget_bytes(d);
    Ok(())
}

/// With `--namespace-quota-bytes`: refuses content the namespace does not hold yet when it
/// would pass the quota. (Looks at this namespace alone: what others store never shows.)
async fn check_quota(blobs: &Blobs, ns: &spillway_api::Namespace, staged: &Staged) -> ApiResult<()> {
    let Some(quota) = blobs.namespace_quota_bytes else { return Ok(()) };
    let now = blobs.now();
    let used = blobs.db.namespace_usage(ns, now).await?;
    if used.saturating_add(staged.size) > quota && !blobs.db.holds_blob(ns, &staged.digest, now).await? {
        return Err(ApiError::QuotaExceeded { quota, used });
    }
    Ok(())
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
        chunked: false,
    }
}
