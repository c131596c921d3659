//! Retention: references expire by TTL, pins never do, and the bytes of a blob go only when
//! no namespace references it and its grace period has passed — removed by
//! [`delete_claimed`] under the row lock that keeps the invariant written in
//! `db/retention.rs` (no byte of referenced content is ever removed; an upload racing a
//! deletion takes the content back). Two faces: `run_retention`,
//! the interval loop inside the server, and `run_retention_once`, which the `retention`
//! command and the tests call.

use std::time::Duration;

use futures::StreamExt;
use spillway_api::{Digest, RetentionSummary};
use tokio_util::sync::CancellationToken;

use crate::state::AppState;

const PAGE: i64 = 500;

/// One pass. With `dry_run` nothing changes and the summary tells what would.
pub async fn run_retention_once(state: &AppState, dry_run: bool) -> anyhow::Result<RetentionSummary> {
    let now = state.now();
    let cutoff = now - state.config.retention_grace.as_millis() as i64;
    let mut s = RetentionSummary { dry_run, ..Default::default() };
    if dry_run {
        s.references_expired = state.db.count_expired_refs(now).await?;
        s.streams_expired = state.db.expire_streams(now, 0, true).await?;
        (s.blobs_deleted, s.bytes_freed) = state.db.count_collectable(now, cutoff).await?;
        return Ok(s);
    }
    // Grace first, from the expiry times, while the expired references are still there.
    state.db.mark_unreferenced(now).await?;
    s.references_expired = in_pages(|| state.db.expire_refs(now, PAGE)).await?;
    s.streams_expired = in_pages(|| state.db.expire_streams(now, PAGE, false)).await?;
    // Searches whose cursors are a day old: their lists of outputs go (never the outputs).
    state.db.delete_expired_searches(now).await?;
    // Claimed first (`live` → `deleting`, which an upload's reference prevents), then deleted.
    let collect = |page: Vec<(Digest, u64)>| async move {
        let mut claimed = Vec::new();
        for (digest, size) in page {
            if state.db.claim_for_deletion(&digest, cutoff, now).await? {
                claimed.push((digest, size));
            }
        }
        Ok(claimed)
    };
    let candidates = |after: Option<Digest>| async move { state.db.collectable(cutoff, after.as_ref(), PAGE).await };
    delete_each(state, &mut s, candidates, collect).await?;
    // Deletions a crashed pass left half-done: bytes first (idempotent), then the row.
    let stale_before = now - state.config.deletion_lease.as_millis() as i64;
    let stale = |page: Vec<(Digest, u64)>| async move { Ok(page) };
    let half_done =
        |after: Option<Digest>| async move { state.db.stale_deletions(stale_before, after.as_ref(), PAGE).await };
    delete_each(state, &mut s, half_done, stale).await?;
    // Bytes with no row yet may be an upload between publication and its row: only bytes older
    // than the deletion lease too (an upload takes seconds there, the lease minutes) are
    // orphans, whatever the grace.
    sweep_orphans(state, cutoff.min(stale_before), now, &mut s).await?;
    metrics::counter!("spillway_retention_expired_refs_total").increment(s.references_expired);
    metrics::counter!("spillway_retention_deleted_blobs_total").increment(s.blobs_deleted);
    metrics::counter!("spillway_retention_freed_bytes_total").increment(s.bytes_freed);
    Ok(s)
}

/// Runs a bounded batch until it does less than a page; the total it did.
async fn in_pages<F, Fut>(mut batch: F) -> anyhow::Result<u64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64, crate::db::DbError>>,
{
    let mut total = 0;
    loop {
        let n = batch().await?;
        total += n;
        if n < PAGE as u64 {
            return Ok(total);
        }
    }
}

/// Lists candidates a page at a time (by digest, after the last one seen), keeps those `keep`
/// claims, and deletes each: its bytes, then its row.
async fn delete_each<L, LFut, K, KFut>(
    state: &AppState,
    s: &mut RetentionSummary,
    mut list: L,
    mut keep: K,
) -> anyhow::Result<()>
where
    L: FnMut(Option<Digest>) -> LFut,
    LFut: std::future::Future<Output = Result<Vec<(Digest, u64)>, crate::db::DbError>>,
    K: FnMut(Vec<(Digest, u64)>) -> KFut,
    KFut: std::future::Future<Output = anyhow::Result<Vec<(Digest, u64)>>>,
{
    let mut after = None;
    loop {
        let page = list(after).await?;
        let full = page.len() as i64 == PAGE;
        let last = page.last().map(|(d, _)| *d);
        for (digest, size) in keep(page).await? {
            if delete_claimed(state, &digest).await? {
                s.blobs_deleted += 1;
                s.bytes_freed += size;
            }
        }
        match last {
            Some(last) if full => after = Some(last),
            _ => return Ok(()),
        }
    }
}

/// Bytes with no row, written before `cutoff` (a crash between publication and the row):
/// each is claimed with a `deleting` row first and deleted like any claimed blob, so an
/// upload of the same content takes the row back rather than racing the deletion.
async fn sweep_orphans(state: &AppState, cutoff: i64, now: i64, s: &mut RetentionSummary) -> anyhow::Result<()> {
    use futures::TryStreamExt;
    let mut listed = state.blobs.list().try_filter(|(_, _, written)| std::future::ready(*written <= cutoff)).boxed();
    let mut batch = Vec::with_capacity(PAGE as usize);
    loop {
        let next = listed.try_next().await?;
        let done = next.is_none();
        batch.extend(next);
        if batch.len() < PAGE as usize && !done {
            continue;
        }
        let digests: Vec<Digest> = batch.iter().map(|(d, _, _)| *d).collect();
        let known = state.db.known_blobs(&digests).await?;
        for (digest, size, _) in batch.drain(..) {
            if !known.contains(&digest)
                && state.db.claim_orphan(&digest, now).await?
                && delete_claimed(state, &digest).await?
            {
                tracing::info!(%digest, size, "deleted bytes that had no metadata row");
                s.orphans_deleted += 1;
                s.bytes_freed += size;
            }
        }
        if done {
            return Ok(());
        }
    }
}

/// Second phase for one claimed blob: its bytes, then its row, in one transaction that holds
/// the row ([`Db::delete_claimed`](crate::db::Db::delete_claimed)). False when an upload took
/// the content back (or another pass finished it) first. Missing bytes count as deleted.
pub async fn delete_claimed(state: &AppState, digest: &Digest) -> anyhow::Result<bool> {
    let (blobs, d) = (state.blobs.clone(), *digest);
    let remove = Box::new(move || -> futures::future::BoxFuture<'static, Result<(), crate::blobs::BlobError>> {
        Box::pin(async move { blobs.delete(&d).await })
    });
    Ok(state.db.delete_claimed(digest, remove).await??.is_some())
}

/// Runs a pass every `interval` until `cancel` fires. Failures are logged and retried next time.
pub async fn run_retention(state: AppState, interval: Duration, cancel: CancellationToken) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        match run_retention_once(&state, false).await {
            Ok(s) => tracing::info!(
                references_expired = s.references_expired,
                blobs_deleted = s.blobs_deleted,
                bytes_freed = s.bytes_freed,
                "retention pass"
            ),
            Err(e) => tracing::error!(cause = %e, "retention pass failed"),
        }
    }
}
