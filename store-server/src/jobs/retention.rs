//! Retention: references expire by TTL, pins never do, and the bytes of a blob go only when
//! no namespace references it and its grace period has passed — removed by
//! [`delete_claimed`] under the row lock that keeps the invariant written in
//! `db/retention.rs` (no byte of referenced content is ever removed; an upload racing a
//! deletion takes the content back). Two faces: `run_retention`,
//! the interval loop inside the server, and `run_retention_once`, which the `retention`
//! command and the tests call.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use spillway_api::{Digest, RetentionSummary};
use tokio_util::sync::CancellationToken;

use crate::jobs::Jobs;

const PAGE: i64 = 500;
/// Key prefixes swept at once (each lists its blobs, then its packs).
const LISTINGS_AT_ONCE: usize = 8;
/// Blobs the walk for what no event marked looks at in one pass: each costs a lookup of its
/// references, on PostgreSQL ~60 µs cold (a page of 500: 29 ms of a pass at 1 M outputs). A
/// round of 1 M blobs takes 4,000 passes; it is the net under the events, which mark every
/// blob as its references go.
const WALK_PAGE: i64 = 250;

/// One pass. With `dry_run` nothing changes and the summary tells what would.
pub async fn run_retention_once(jobs: &Jobs, dry_run: bool) -> anyhow::Result<RetentionSummary> {
    let began = std::time::Instant::now();
    let now = jobs.now();
    let cutoff = now - jobs.config.retention_grace.as_millis() as i64;
    let mut s = RetentionSummary { dry_run, ..Default::default() };
    if dry_run {
        s.references_expired = jobs.blobs.db.count_expired_refs(now).await?;
        s.streams_expired = jobs.blobs.db.expire_streams(now, 0, true).await?;
        (s.blobs_deleted, s.bytes_freed) = jobs.blobs.db.count_collectable(now, cutoff).await?;
        return Ok(s);
    }
    // Expired references go, each page starting the grace of the blobs it leaves with none
    // (from the expiry times, read before they go); then one page of the walk that catches
    // what no event marked. Neither reads more than what expired and one page.
    s.references_expired = in_pages(|| jobs.blobs.db.expire_refs(now, PAGE)).await?;
    mark_a_page(jobs, now).await?;
    s.streams_expired = in_pages(|| jobs.blobs.db.expire_streams(now, PAGE, false)).await?;
    // Searches whose cursors are a day old: what they passed goes (never the outputs).
    jobs.blobs.db.delete_expired_searches(now).await?;
    // Claimed first (`live` → `deleting`, which an upload's reference prevents), then deleted.
    let collect = |page: Vec<(Digest, u64)>| async move {
        let claimed: Vec<Option<(Digest, u64)>> = futures::stream::iter(page)
            .map(|(digest, size)| async move {
                let won = jobs.blobs.db.claim_for_deletion(&digest, cutoff, now).await?;
                Ok::<_, anyhow::Error>(won.then_some((digest, size)))
            })
            .buffer_unordered(jobs.blobs.db.writes_at_once())
            .try_collect()
            .await?;
        Ok(claimed.into_iter().flatten().collect())
    };
    let candidates =
        |after: Option<Digest>| async move { jobs.blobs.db.collectable(cutoff, after.as_ref(), PAGE).await };
    delete_each(jobs, &mut s, candidates, collect).await?;
    // Deletions a crashed pass left half-done: bytes first (idempotent), then the row.
    let stale_before = now - jobs.config.deletion_lease.as_millis() as i64;
    let stale = |page: Vec<(Digest, u64)>| async move { Ok(page) };
    let half_done =
        |after: Option<Digest>| async move { jobs.blobs.db.stale_deletions(stale_before, after.as_ref(), PAGE).await };
    delete_each(jobs, &mut s, half_done, stale).await?;
    // Bytes with no row yet may be an upload between publication and its row: only bytes older
    // than the deletion lease too (an upload takes seconds there, the lease minutes) are
    // orphans, whatever the grace. The next `sweep_prefixes` of the 256 key prefixes.
    // Listed a few prefixes at a time: an object store answers each listing in a round trip.
    let prefixes = next_prefixes(jobs);
    let swept: Vec<RetentionSummary> = futures::stream::iter(prefixes.iter().copied())
        .map(|p| async move {
            let mut part = RetentionSummary::default();
            sweep_orphans(jobs, p, cutoff.min(stale_before), now, &mut part).await?;
            sweep_orphan_packs(jobs, p, stale_before, now, &mut part).await?;
            Ok::<_, anyhow::Error>(part)
        })
        .buffer_unordered(LISTINGS_AT_ONCE)
        .try_collect()
        .await?;
    for part in swept {
        s.orphans_deleted += part.orphans_deleted;
        s.raw_copies_deleted += part.raw_copies_deleted;
        s.bytes_freed += part.bytes_freed;
        s.packs_deleted += part.packs_deleted;
        s.pack_bytes_freed += part.pack_bytes_freed;
    }
    // Packs noted as maybe unneeded, then packs a crashed compaction left.
    collect_packs(jobs, &mut s, now, stale_before).await?;
    report_storage(jobs).await;
    metrics::counter!("spillway_retention_expired_refs_total").increment(s.references_expired);
    metrics::counter!("spillway_retention_deleted_blobs_total").increment(s.blobs_deleted);
    metrics::counter!("spillway_retention_freed_bytes_total").increment(s.bytes_freed);
    metrics::gauge!("spillway_retention_pass_seconds").set(began.elapsed().as_secs_f64());
    Ok(s)
}

/// One page of [`Db::mark_unreferenced_page`](crate::db::Db::mark_unreferenced_page), from
/// where the last pass of this process left it.
async fn mark_a_page(jobs: &Jobs, now: i64) -> anyhow::Result<()> {
    let after = std::mem::take(&mut jobs.rolling.lock().expect("rolling").unreferenced_after);
    let (_, next) = jobs.blobs.db.mark_unreferenced_page(now, &after, WALK_PAGE).await?;
    jobs.rolling.lock().expect("rolling").unreferenced_after = next.unwrap_or_default();
    Ok(())
}

/// The key prefixes this pass sweeps: the next `sweep_prefixes` (1–256) after the last pass's.
fn next_prefixes(jobs: &Jobs) -> Vec<u8> {
    let n = jobs.config.sweep_prefixes.clamp(1, 256);
    let mut rolling = jobs.rolling.lock().expect("rolling");
    let first = rolling.next_prefix;
    rolling.next_prefix = (first + n) % 256;
    (first..first + n).map(|p| (p % 256) as u8).collect()
}

/// Sets the gauges of what the store holds (`spillway_stored_bytes`, `spillway_logical_bytes`)
/// from the database's kept sums (`db/totals.rs`: a constant read), after a pass changed it.
pub async fn report_storage(jobs: &Jobs) {
    match jobs.blobs.db.storage_stats().await {
        Ok(s) => {
            metrics::gauge!("spillway_stored_bytes").set(s.stored_bytes as f64);
            metrics::gauge!("spillway_logical_bytes").set(s.logical_bytes as f64);
        }
        Err(e) => tracing::warn!(cause = %e, "could not count the stored bytes"),
    }
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
    jobs: &Jobs,
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
        let deleted: Vec<Option<u64>> = futures::stream::iter(keep(page).await?)
            .map(|(digest, size)| async move {
                Ok::<_, anyhow::Error>(delete_claimed(jobs, &digest).await?.then_some(size))
            })
            .buffer_unordered(jobs.blobs.db.writes_at_once())
            .try_collect()
            .await?;
        for size in deleted.into_iter().flatten() {
            s.blobs_deleted += 1;
            s.bytes_freed += size;
        }
        match last {
            Some(last) if full => after = Some(last),
            _ => return Ok(()),
        }
    }
}

/// Bytes with no row under these key prefixes, written before `cutoff` (a crash between
/// publication and the row): each is claimed with a `deleting` row first and deleted like any
/// claimed blob, so an upload of the same content takes the row back rather than racing the
/// deletion. And raw copies of compacted blobs, whatever their age.
async fn sweep_orphans(jobs: &Jobs, prefix: u8, cutoff: i64, now: i64, s: &mut RetentionSummary) -> anyhow::Result<()> {
    let mut listed = jobs.blobs.store.list_prefix(prefix);
    let mut batch = Vec::with_capacity(PAGE as usize);
    loop {
        let next = listed.try_next().await?;
        let done = next.is_none();
        batch.extend(next);
        if batch.len() < PAGE as usize && !done {
            continue;
        }
        let digests: Vec<Digest> = batch.iter().map(|(d, _, _)| *d).collect();
        let known = jobs.blobs.db.known_blobs(&digests).await?;
        // Raw copies of compacted blobs (a compaction that stopped between its commit and the
        // removal, or a re-upload of compacted content): their chunks are the blob.
        for digest in jobs.blobs.db.chunked_blobs(&digests).await? {
            if delete_raw_copy(jobs, &digest).await? {
                s.raw_copies_deleted += 1;
            }
        }
        for (digest, size, written) in batch.drain(..) {
            if written <= cutoff
                && !known.contains(&digest)
                && jobs.blobs.db.claim_orphan(&digest, now).await?
                && delete_claimed(jobs, &digest).await?
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
pub async fn delete_claimed(jobs: &Jobs, digest: &Digest) -> anyhow::Result<bool> {
    let (blobs, d) = (jobs.blobs.store.clone(), *digest);
    let remove = Box::new(move || -> futures::future::BoxFuture<'static, Result<(), crate::storage::BlobError>> {
        Box::pin(async move { blobs.delete(&d).await })
    });
    let deleted = jobs.blobs.db.delete_claimed(digest, remove).await??.is_some();
    if deleted {
        jobs.blobs.rows.forget(digest);
        jobs.blobs.chunks.forget(digest);
    }
    Ok(deleted)
}

/// Removes the raw copy of a compacted blob, under its row lock (`Db::delete_raw_copy`).
pub async fn delete_raw_copy(jobs: &Jobs, digest: &Digest) -> anyhow::Result<bool> {
    let (blobs, d) = (jobs.blobs.store.clone(), *digest);
    let remove = Box::new(move || -> futures::future::BoxFuture<'static, Result<(), crate::storage::BlobError>> {
        Box::pin(async move { blobs.delete(&d).await })
    });
    Ok(jobs.blobs.db.delete_raw_copy(digest, remove).await??)
}

/// Checks the packs noted as maybe unneeded, claiming and deleting those no blob's chunk list
/// needs, then finishes the deletions of packs a crashed pass left half-done (`db/chunks.rs`
/// for the invariant). Reads the notes and the claimed packs, never every pack.
async fn collect_packs(jobs: &Jobs, s: &mut RetentionSummary, now: i64, stale_before: i64) -> anyhow::Result<()> {
    let mut after: Option<String> = None;
    loop {
        let page = jobs.blobs.db.pack_checks(after.as_deref(), PAGE).await?;
        for id in &page {
            if jobs.blobs.db.claim_pack(id, now).await? {
                if let Some(size) = delete_claimed_pack(jobs, id).await? {
                    s.packs_deleted += 1;
                    s.pack_bytes_freed += size;
                }
            }
        }
        match page.last() {
            Some(last) if page.len() as i64 == PAGE => after = Some(last.clone()),
            _ => break,
        }
    }
    for (id, size) in jobs.blobs.db.stale_pack_deletions(stale_before, PAGE).await? {
        if delete_claimed_pack(jobs, &id).await?.is_some() {
            s.packs_deleted += 1;
            s.pack_bytes_freed += size;
        }
    }
    Ok(())
}

/// Packs with no row under these key prefixes, written before `cutoff` (a compaction that
/// crashed before its commit): claimed with a `deleting` row, then deleted like any claimed
/// pack.
async fn sweep_orphan_packs(
    jobs: &Jobs,
    prefix: u8,
    cutoff: i64,
    now: i64,
    s: &mut RetentionSummary,
) -> anyhow::Result<()> {
    let listed: Vec<(String, u64, i64)> = jobs.blobs.store.list_packs_prefix(prefix).try_collect().await?;
    let old: Vec<(String, u64)> =
        listed.into_iter().filter(|(_, _, written)| *written <= cutoff).map(|(id, size, _)| (id, size)).collect();
    let ids: Vec<String> = old.iter().map(|(id, _)| id.clone()).collect();
    let known = jobs.blobs.db.known_packs(&ids).await?;
    for (id, size) in old {
        if !known.contains(&id)
            && jobs.blobs.db.claim_orphan_pack(&id, size, now).await?
            && delete_claimed_pack(jobs, &id).await?.is_some()
        {
            tracing::info!(pack = %id, size, "deleted a pack that had no metadata row");
            s.packs_deleted += 1;
            s.pack_bytes_freed += size;
        }
    }
    Ok(())
}

/// Second phase for one claimed pack: its object, then its chunk rows and its row, holding it.
/// The pack's size when it went.
async fn delete_claimed_pack(jobs: &Jobs, id: &str) -> anyhow::Result<Option<u64>> {
    let (blobs, pack) = (jobs.blobs.store.clone(), id.to_owned());
    let remove = Box::new(move || -> futures::future::BoxFuture<'static, Result<(), crate::storage::BlobError>> {
        Box::pin(async move { blobs.delete_pack(&pack).await })
    });
    Ok(jobs.blobs.db.delete_claimed_pack(id, remove).await??)
}

/// Runs a pass every `interval` until `cancel` fires. Failures are logged and retried next time.
pub async fn run_retention(jobs: Jobs, interval: Duration, cancel: CancellationToken) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        let began = std::time::Instant::now();
        match run_retention_once(&jobs, false).await {
            Ok(s) => tracing::info!(
                took_ms = began.elapsed().as_millis() as u64,
                references_expired = s.references_expired,
                blobs_deleted = s.blobs_deleted,
                bytes_freed = s.bytes_freed,
                "retention pass"
            ),
            Err(e) => tracing::error!(cause = %e, "retention pass failed"),
        }
    }
}
