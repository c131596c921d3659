//! The rules of a namespace's own references that handlers apply: a pin (a reference that
//! never expires, or expires when the caller says), an unpin, a delete of every reference.
//! A delete or unpin frees space, so one that meets a full disk gives back the space reserve
//! and the SQLite log's and tries once more.

use std::future::Future;

use spillway_api::{AnyDigest, BlobRecord, Namespace, PinRequest, LAST_UNIX_SECOND};

use crate::blobs::source::visible;
use crate::blobs::Blobs;
use crate::clock::rfc3339;
use crate::db::{AddRef, DbError, NewRef};
use crate::error::{ApiError, ApiResult};

/// Longest pin `reason`: every pin keeps it for as long as the pin lives.
pub const MAX_PIN_REASON: usize = 1024;

/// Pins blob `d` in `ns` (it must be visible there) until `req.until`, or for good.
pub async fn pin(blobs: &Blobs, ns: &Namespace, d: &AnyDigest, req: &PinRequest) -> ApiResult<BlobRecord> {
    if let Some(reason) = req.reason.as_deref().filter(|r| r.len() > MAX_PIN_REASON) {
        let why = format!("a pin reason is at most {MAX_PIN_REASON} bytes; this one is {}", reason.len());
        return Err(ApiError::InvalidArgument(why));
    }
    let now = blobs.now();
    let expires_at = match req.until {
        None => None,
        Some(s) => match i64::try_from(s).ok().and_then(|s| s.checked_mul(1000)) {
            Some(ms) if ms > now && ms <= LAST_UNIX_SECOND * 1000 => Some(ms),
            _ => {
                let why = format!("until {s} is not a Unix time in the future, up to {LAST_UNIX_SECOND} (9999-12-31)");
                return Err(ApiError::InvalidArgument(why));
            }
        },
    };
    let row = visible(blobs, ns, d).await?;
    let new_ref = NewRef {
        namespace: ns.clone(),
        digest: row.digest,
        labels: Default::default(),
        expires_at,
        pin_reason: req.reason.clone(),
    };
    match blobs.db.add_ref_if_live(&new_ref, now).await? {
        AddRef::Added { .. } => Ok(row.record(true, expires_at.map(rfc3339))),
        _ => Err(ApiError::NotFound(format!("blob {d}"))),
    }
}

/// Removes `ns`'s pins of `d`; `404` when it had none.
pub async fn unpin(blobs: &Blobs, ns: &Namespace, d: &AnyDigest) -> ApiResult<()> {
    let row = visible(blobs, ns, d).await?;
    let removed = freeing_space(blobs, || blobs.db.unpin(ns, &row.digest, blobs.now())).await?;
    blobs.visibility.forget(ns, &row.digest);
    match removed {
        0 => Err(ApiError::NotFound(format!("pin of {d}"))),
        _ => Ok(()),
    }
}

/// Removes every reference `ns` holds to `d`.
pub async fn delete(blobs: &Blobs, ns: &Namespace, d: &AnyDigest) -> ApiResult<()> {
    let row = visible(blobs, ns, d).await?;
    freeing_space(blobs, || blobs.db.delete_refs(ns, &row.digest, blobs.now())).await?;
    blobs.visibility.forget(ns, &row.digest);
    Ok(())
}

/// Runs a write that frees space; when it meets a full disk, gives back the space reserve and
/// the SQLite log's, so that the write can itself be made, and runs it once more.
async fn freeing_space<T, F, Fut>(blobs: &Blobs, write: F) -> Result<T, DbError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, DbError>>,
{
    match write().await {
        Err(e) if e.is_full() => {
            blobs.reserve.release();
            blobs.db.reclaim_log().await;
            write().await
        }
        other => other,
    }
}
