//! Retention: references expire by TTL, pins never do, and the bytes of a blob go only when
//! no namespace references it and its grace period has passed. Two faces: `run_retention`,
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
    let grace = state.config.retention_grace.as_millis() as i64;
    let cutoff = now - grace;
    let mut s = RetentionSummary { dry_run, ..Default::default() };
    if dry_run {
        s.references_expired = state.db.count_expired_refs(now).await?;
        s.streams_expired = state.db.expire_streams(now, 0, true).await?;
        (s.blobs_deleted, s.bytes_freed) = state.db.count_collectable(now, cutoff).await?;
        return Ok(s);
    }
    state.db.mark_expired(now).await?;
    loop {
        let n = state.db.expire_refs(now, PAGE).await?;
        s.references_expired += n;
        if n < PAGE as u64 {
            break;
        }
    }
    loop {
        let n = state.db.expire_streams(now, PAGE, false).await?;
        s.streams_expired += n;
        if n < PAGE as u64 {
            break;
        }
    }
    state.db.mark_unreferenced(now).await?;
    let mut after = String::new();
    loop {
        let page = state.db.collectable(cutoff, &after, PAGE).await?;
        for (digest, size) in &page {
            if state.db.claim_for_deletion(digest, cutoff, now).await? && delete(state, digest).await? {
                s.blobs_deleted += 1;
                s.bytes_freed += size;
            }
        }
        match page.last() {
            Some((last, _)) if page.len() as i64 == PAGE => after = last.clone(),
            _ => break,
        }
    }
    // Deletions a crashed pass left half-done: bytes first (idempotent), then the row.
    let stale_before = now - state.config.deletion_lease.as_millis() as i64;
    let mut after = String::new();
    loop {
        let page = state.db.stale_deletions(stale_before, &after, PAGE).await?;
        for (digest, size) in &page {
            if delete(state, digest).await? {
                s.blobs_deleted += 1;
                s.bytes_freed += size;
            }
        }
        match page.last() {
            Some((last, _)) if page.len() as i64 == PAGE => after = last.clone(),
            _ => break,
        }
    }
    // Bytes with no row yet may be an upload between publication and its row: only bytes older
    // than the deletion lease too (an upload takes seconds there, the lease minutes) are
    // orphans, whatever the grace.
    let orphan_cutoff = cutoff.min(stale_before);
    sweep_orphans(state, orphan_cutoff, now, &mut s).await?;
    metrics::counter!("spillway_retention_expired_refs_total").increment(s.references_expired);
    metrics::counter!("spillway_retention_deleted_blobs_total").increment(s.blobs_deleted);
    metrics::counter!("spillway_retention_freed_bytes_total").increment(s.bytes_freed);
    Ok(s)
}

/// Bytes with no row, written before `cutoff` (a crash between publication and the row):
/// each is claimed with a `deleting` row first, so an upload of the same content waits and
/// publishes again rather than racing the deletion.
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
        let hexes: Vec<String> = batch.iter().map(|(d, _, _)| d.hex()).collect();
        let known = state.db.known_blobs(&hexes).await?;
        for ((_, size, _), hex) in batch.drain(..).zip(hexes) {
            if !known.contains(&hex) && state.db.claim_orphan(&hex, now).await? && delete(state, &hex).await? {
                tracing::info!(digest = %hex, size, "deleted bytes that had no metadata row");
                s.orphans_deleted += 1;
                s.bytes_freed += size;
            }
        }
        if done {
            return Ok(());
        }
    }
}

/// Second phase for one claimed blob: the bytes, then the row. Missing bytes count as deleted.
async fn delete(state: &AppState, hex: &str) -> anyhow::Result<bool> {
    let digest: Digest = format!("blake3:{hex}").parse()?;
    state.blobs.delete(&digest).await?;
    Ok(state.db.forget_blob(hex).await?)
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
