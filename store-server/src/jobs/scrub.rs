//! The scrub: every stored blob, chunk and pack read back and checked against its hash, as
//! restic's `check --read-data` and ZFS's scrub do, because a raw blob's capped pages and greps
//! read spans that have no hash of their own (`blobs/damage.rs` says what reads check). What
//! fails is marked — every read of it then answers `500 corrupt` — and listed; an output
//! marked before that now reads back whole is unmarked.
//!
//! A run takes the live blobs and the chunks they use in digest order, a page at a time (the
//! primary keys' ranges; `--subset N/T` takes the N-th of T equal ranges of the digest space,
//! so T runs cover everything once). Raw blobs are hashed as they stream; inline ones from
//! their rows; a compacted blob is its chunks, each read from its pack, decompressed and
//! checked against its name — a chunk that fails marks every blob whose list names it. The
//! server runs one part every `--scrub-interval / 24`, under a lease (one replica at a
//! time), giving way to requests as compaction does.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;
use spillway_api::Digest;
use tokio_util::sync::CancellationToken;

use crate::db::ScrubBlob;
use crate::jobs::Jobs;
use crate::storage::BlobError;

/// Rows a page of the walk takes.
const PAGE: i64 = 200;
/// Parts of the digest space the background scrub takes one at a time.
const PARTS: u32 = 24;
/// The lease that keeps the background scrub to one server at a time.
const LEASE: &str = "scrub";

/// What a scrub is asked to do.
#[derive(Debug, Clone, Default)]
pub struct ScrubOpts {
    /// Only the N-th of T parts of the digest space (`(2, 7)`).
    pub subset: Option<(u32, u32)>,
    /// At most this many bytes read per second.
    pub max_rate: Option<u64>,
    /// Rest between steps while requests come (the background scrub).
    pub give_way: bool,
}

/// What a scrub found: its JSON line (api.md v1.3).
#[derive(Debug, Default, Serialize)]
pub struct ScrubSummary {
    /// Blobs checked (inline, raw and compacted).
    pub checked_blobs: u64,
    /// Chunks checked.
    pub checked_chunks: u64,
    /// Bytes read and checked.
    pub checked_bytes: u64,
    /// Outputs whose stored bytes fail their hash.
    pub corrupt: Vec<String>,
    /// Outputs whose stored bytes are gone.
    pub missing: Vec<String>,
    /// Time the run took.
    pub seconds: f64,
}

/// The digest range `[from, to)` of part `n` of `t`, as the hex keys compare.
fn range_of(subset: Option<(u32, u32)>) -> (String, String) {
    let Some((n, t)) = subset else { return (String::new(), "g".into()) };
    let edge = |k: u32| (u64::from(k) << 32) / u64::from(t);
    let to = if n == t { "g".to_owned() } else { format!("{:08x}", edge(n)) };
    (format!("{:08x}", edge(n - 1)), to)
}

/// Runs one scrub (of a part, with `opts.subset`).
pub async fn run_scrub_once(jobs: &Jobs, opts: &ScrubOpts) -> anyhow::Result<ScrubSummary> {
    let began = Instant::now();
    // Marked before this run (by any process): a blob found whole again is unmarked.
    let marked: HashSet<Digest> = jobs.blobs.db.damaged_blobs().await?.into_iter().collect();
    let mut run = Run { jobs, opts, began, pace: jobs.blobs.heavy.pace(), marked, s: ScrubSummary::default() };
    let (from, to) = range_of(opts.subset);
    let mut after: Option<Digest> = None;
    loop {
        let page = jobs.blobs.db.scrub_blobs(&from, &to, after.as_ref(), PAGE).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.digest);
        for blob in page {
            run.blob(&blob).await?;
        }
    }
    let mut after: Option<Digest> = None;
    loop {
        let page = jobs.blobs.db.scrub_chunks(&from, &to, after.as_ref(), PAGE).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.digest);
        for loc in page {
            run.chunk(&loc).await?;
        }
    }
    let mut s = run.s;
    for list in [&mut s.corrupt, &mut s.missing] {
        list.sort();
        list.dedup();
    }
    s.seconds = began.elapsed().as_secs_f64();
    metrics::counter!("spillway_scrub_checked_bytes_total").increment(s.checked_bytes);
    metrics::counter!("spillway_scrub_corrupt_total").increment((s.corrupt.len() + s.missing.len()) as u64);
    Ok(s)
}

/// One run's progress.
struct Run<'a> {
    jobs: &'a Jobs,
    opts: &'a ScrubOpts,
    began: Instant,
    pace: crate::jobs::heavy::Pace,
    marked: HashSet<Digest>,
    s: ScrubSummary,
}

impl Run<'_> {
    /// Checks one blob's bytes (a compacted one's are its chunks, checked apart).
    async fn blob(&mut self, b: &ScrubBlob) -> anyhow::Result<()> {
        self.s.checked_blobs += 1;
        if b.chunked {
            return Ok(());
        }
        let verdict = match &b.inline_data {
            Some(data) => {
                self.s.checked_bytes += data.len() as u64;
                (Digest::of(data) != b.digest).then_some("corrupt")
            }
            None => self.raw(b).await?,
        };
        match verdict {
            Some(kind) => self.found(b.digest, kind).await,
            None if self.marked.contains(&b.digest) || self.jobs.blobs.damage.contains(&b.digest) => {
                // Good again (an operator put the bytes back): no longer refused.
                self.jobs.blobs.clear_damaged(&b.digest).await?;
            }
            None => {}
        }
        Ok(())
    }

    /// A raw blob streamed and hashed: `None` when whole, else what is wrong.
    async fn raw(&mut self, b: &ScrubBlob) -> anyhow::Result<Option<&'static str>> {
        self.jobs.blobs.store.reopen(&b.digest);
        let mut stream = match self.jobs.blobs.store.get_stream(&b.digest, 0..b.size).await {
            Ok(s) => s,
            Err(BlobError::NotFound) => return self.missing(b).await,
            Err(e) => return Err(e.into()),
        };
        let mut hasher = blake3::Hasher::new();
        let mut read = 0u64;
        while let Some(part) = stream.next().await {
            let part = match part {
                Ok(p) => p,
                Err(BlobError::NotFound) => return self.missing(b).await,
                // A copy cut short fails to read to its row's size: damage. Any other failure
                // is the store's, and marks nothing (the run stops with it).
                Err(e) => {
                    return match self.jobs.blobs.store.blob_size(&b.digest).await? {
                        Some(n) if n != b.size => Ok(Some("corrupt")),
                        None => self.missing(b).await,
                        Some(_) => Err(e.into()),
                    }
                }
            };
            read += part.len() as u64;
            hasher.update(&part);
            self.s.checked_bytes += part.len() as u64;
            self.rest().await;
        }
        Ok((read != b.size || Digest::from_bytes(*hasher.finalize().as_bytes()) != b.digest).then_some("corrupt"))
    }

    /// Bytes not found: missing, unless the row changed meanwhile (deleted, compacted).
    async fn missing(&self, b: &ScrubBlob) -> anyhow::Result<Option<&'static str>> {
        let now = self.jobs.blobs.db.blob_row(&b.digest).await?;
        let still_raw = now.is_some_and(|r| !r.chunked && r.inline_data.is_none());
        anyhow::ensure!(self.jobs.blobs.store.lists_blobs().await, "the blob store does not answer a listing");
        Ok((still_raw && !self.jobs.blobs.store.exists(&b.digest).await?).then_some("missing"))
    }

    /// Checks one chunk: its frame read from its pack, decompressed, hashed.
    async fn chunk(&mut self, loc: &crate::db::ChunkLoc) -> anyhow::Result<()> {
        self.s.checked_chunks += 1;
        let range = loc.pack_offset..loc.pack_offset + loc.length;
        self.jobs.blobs.store.reopen_pack(&loc.pack);
        let kind = match self.jobs.blobs.store.get_pack_range(&loc.pack, range.clone()).await {
            Ok(frame) => {
                self.s.checked_bytes += frame.len() as u64;
                let loc = loc.clone();
                match tokio::task::spawn_blocking(move || crate::chunks::decompress(&frame, &loc)).await? {
                    Ok(_) => None,
                    Err(BlobError::Corrupt(_)) => Some("corrupt"),
                    Err(e) => return Err(e.into()),
                }
            }
            Err(BlobError::NotFound) => {
                anyhow::ensure!(self.jobs.blobs.store.lists_blobs().await, "the blob store does not answer a listing");
                Some("missing")
            }
            // A pack cut short fails a range past its end: damage. Any other failure is the
            // store's, and marks nothing.
            Err(e) => match self.jobs.blobs.store.pack_size(&loc.pack).await? {
                Some(n) if n < range.end => Some("corrupt"),
                None => Some("missing"),
                Some(_) => return Err(e.into()),
            },
        };
        self.rest().await;
        let Some(kind) = kind else { return Ok(()) };
        let blobs = self.jobs.blobs.db.mark_chunks_damaged(&[loc.digest], self.jobs.now()).await?;
        tracing::error!(chunk = %loc.digest, pack = %loc.pack, kind, blobs = blobs.len(), "scrub: a chunk fails its check");
        for d in blobs {
            self.found(d, kind).await;
        }
        Ok(())
    }

    /// Marks and lists a damaged output.
    async fn found(&mut self, d: Digest, kind: &'static str) {
        self.jobs.blobs.mark_damaged(&d, kind).await;
        let list = if kind == "missing" { &mut self.s.missing } else { &mut self.s.corrupt };
        list.push(d.to_string());
    }

    /// Keeps to `--max-rate`, and gives way to requests in the background.
    async fn rest(&mut self) {
        if let Some(rate) = self.opts.max_rate.filter(|&r| r > 0) {
            let due = Duration::from_secs_f64(self.s.checked_bytes as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(self.began.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
        if self.opts.give_way {
            self.jobs.blobs.heavy.give_way(&mut self.pace).await;
        }
    }
}

/// The background scrub: one part every `interval / 24`, under a lease, on the heavy pool,
/// until `cancel`. `interval` zero: none.
pub async fn run_scrub(jobs: Jobs, interval: Duration, cancel: CancellationToken) {
    if interval.is_zero() {
        return;
    }
    let holder = format!("scrub-{}", uuid::Uuid::new_v4().simple());
    let mut part = 0u32;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(interval / PARTS) => {}
        }
        let now = jobs.now();
        let lease = (interval / PARTS).as_millis() as i64;
        match jobs.blobs.db.take_lease(LEASE, &holder, now, now + lease).await {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::warn!(cause = %e, "scrub: could not take the lease");
                continue;
            }
        }
        part = part % PARTS + 1;
        let opts = ScrubOpts { subset: Some((part, PARTS)), max_rate: None, give_way: true };
        let st = jobs.clone();
        let pass = jobs.blobs.heavy.spawn_background(async move { run_scrub_once(&st, &opts).await });
        match pass.await {
            Ok(Ok(s)) => {
                if part == PARTS {
                    metrics::gauge!("spillway_scrub_last_complete_timestamp_seconds").set(jobs.now() as f64 / 1000.0);
                }
                if !s.corrupt.is_empty() || !s.missing.is_empty() {
                    tracing::error!(corrupt = ?s.corrupt, missing = ?s.missing, "scrub found damaged outputs");
                }
            }
            Ok(Err(e)) => tracing::error!(cause = %e, "scrub failed"),
            Err(e) => tracing::error!(cause = %e, "scrub stopped"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parts_cover_the_digest_space_once() {
        assert_eq!(range_of(None), (String::new(), "g".into()));
        let parts: Vec<_> = (1..=7).map(|n| range_of(Some((n, 7)))).collect();
        assert_eq!(parts[0].0, "00000000");
        assert_eq!(parts[6].1, "g");
        for w in parts.windows(2) {
            assert_eq!(w[0].1, w[1].0, "adjacent");
            assert!(w[0].0 < w[0].1);
        }
        let d = "ffffffff".to_owned() + &"f".repeat(56);
        assert!(d.as_str() >= parts[6].0.as_str() && d.as_str() < "g");
    }
}
