//! Compaction: raw blobs older than `--compact-after` become chunk lists (`chunks.rs`), their
//! new chunks compressed into packs, their raw copies removed. Uploads are acknowledged raw as
//! before and never wait on this; a blob read right after its spill is still read raw. Two
//! faces: `run_compaction`, the loop inside the server, and `run_compaction_once`, which the
//! `compact` command and the tests call. One server compacts at a time (a lease in the
//! database); the work runs on the niced heavy pool, so requests go first.
//!
//! For one blob: its raw bytes are read as a stream and cut into chunks as they come; the
//! chunks no live pack holds are compressed into packs, written durably; then one transaction
//! records the packs, the chunks and the blob's list and marks it `chunked` (the invariant
//! that keeps packs from going while a list needs them is in `db/chunks.rs`); only then is
//! the raw copy removed. A crash anywhere leaves either the raw blob whole (and maybe a pack
//! with no row, which retention sweeps) or the compacted blob (and maybe its raw copy, which
//! retention sweeps too).

use std::collections::HashSet;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use spillway_api::{CompactionSummary, Digest};
use tokio_util::sync::CancellationToken;

use crate::chunks::{self, Chunker, Piece};
use crate::db::{ChunkLoc, Compacted, NewPack};
use crate::jobs::Jobs;
use crate::storage::BlobError;

const PAGE: i64 = 200;
const LEASE: &str = "compaction";

/// This process, as the lease's holder.
fn holder() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| uuid::Uuid::new_v4().simple().to_string())
}

/// One pass over every raw blob written more than `older_than` ago (all of them with zero).
pub async fn run_compaction_once(jobs: &Jobs, older_than: Duration) -> anyhow::Result<CompactionSummary> {
    let mut s = CompactionSummary::default();
    let now = jobs.now();
    let lease = jobs.config.compaction_lease.as_millis() as i64;
    if !jobs.blobs.db.take_lease(LEASE, holder(), now, now + lease).await? {
        tracing::debug!("another server is compacting");
        return Ok(s);
    }
    let before = now - older_than.as_millis() as i64;
    let mut after: Option<(i64, Digest)> = None;
    let result = async {
        loop {
            let page = jobs.blobs.db.compactable(before, after, PAGE).await?;
            for (digest, size, _) in &page {
                let now = jobs.now();
                anyhow::ensure!(
                    jobs.blobs.db.take_lease(LEASE, holder(), now, now + lease).await?,
                    "the compaction lease was lost"
                );
                match compact_one(jobs, digest, *size).await {
                    Ok(Some(after_bytes)) => {
                        s.blobs_compacted += 1;
                        s.bytes_before += size;
                        s.bytes_after += after_bytes;
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(%digest, cause = %e, "could not compact a blob; it stays raw"),
                }
            }
            match page.last() {
                Some((last, _, at)) if page.len() as i64 == PAGE => after = Some((*at, *last)),
                _ => return Ok::<_, anyhow::Error>(()),
            }
        }
    }
    .await;
    jobs.blobs.db.release_lease(LEASE, holder()).await?;
    result?;
    crate::jobs::retention::report_storage(jobs).await;
    Ok(s)
}

/// The packs a blob's new chunks go into, written as they fill.
#[derive(Default)]
struct Packs {
    current: BytesMut,
    id: String,
    chunks: Vec<ChunkLoc>,
    written: Vec<NewPack>,
}

impl Packs {
    fn add(&mut self, digest: Digest, frame: &[u8], raw_length: u64) {
        if self.id.is_empty() {
            self.id = chunks::new_pack_id();
        }
        let at = self.current.len() as u64;
        self.current.extend_from_slice(frame);
        self.chunks.push(ChunkLoc {
            digest,
            pack: self.id.clone(),
            pack_offset: at,
            length: frame.len() as u64,
            raw_length,
        });
    }

    async fn flush(&mut self, jobs: &Jobs) -> Result<(), BlobError> {
        if self.current.is_empty() {
            return Ok(());
        }
        let data: Bytes = std::mem::take(&mut self.current).freeze();
        let size = data.len() as u64;
        jobs.blobs.store.put_pack(&self.id, data).await?;
        self.written.push(NewPack { id: std::mem::take(&mut self.id), size });
        Ok(())
    }

    /// Removes what was written (the compaction gave up; no row names these packs).
    async fn discard(&self, jobs: &Jobs) {
        for p in &self.written {
            let _ = jobs.blobs.store.delete_pack(&p.id).await;
        }
    }
}

/// What one blob's compaction has seen so far.
struct Blob<'a> {
    jobs: &'a Jobs,
    packs: Packs,
    list: Vec<(Digest, u64)>,
    /// Chunks of this blob already packed (a blob can repeat itself).
    own: HashSet<Digest>,
    /// Chunks already stored that its list reuses.
    reused: Vec<ChunkLoc>,
    size: u64,
    /// When it last gave way to requests.
    pace: crate::jobs::heavy::Pace,
}

impl Blob<'_> {
    /// Lists a batch of chunks and packs those no live pack holds.
    async fn take(&mut self, pieces: Vec<Piece>) -> anyhow::Result<()> {
        if pieces.is_empty() {
            return Ok(());
        }
        let digests: Vec<Digest> = pieces.iter().map(|(_, b)| Digest::of(b)).collect();
        let fresh: Vec<Digest> = digests.iter().filter(|d| !self.own.contains(d)).copied().collect();
        let stored = self.jobs.blobs.db.stored_chunks(&fresh).await?;
        for ((offset, bytes), digest) in pieces.into_iter().zip(digests) {
            self.list.push((digest, offset));
            self.size += bytes.len() as u64;
            if let Some(loc) = stored.get(&digest) {
                if self.own.insert(digest) {
                    self.reused.push(loc.clone());
                }
                continue;
            }
            if !self.own.insert(digest) {
                continue;
            }
            let frame = chunks::compress(&bytes)?;
            self.packs.add(digest, &frame, bytes.len() as u64);
            if self.packs.current.len() >= chunks::PACK_TARGET {
                self.packs.flush(self.jobs).await?;
            }
            // A chunk's compression is a few milliseconds of a heavy thread: let others in,
            // and give way to requests while they come.
            self.jobs.blobs.heavy.give_way(&mut self.pace).await;
        }
        Ok(())
    }
}

/// Compacts one raw blob; the bytes its new chunks take, or `None` when it is no longer a live
/// raw blob (deleted, or compacted meanwhile).
async fn compact_one(jobs: &Jobs, digest: &Digest, size: u64) -> anyhow::Result<Option<u64>> {
    match prepare(jobs, digest, size).await? {
        Some(prepared) => finish(jobs, digest, prepared).await,
        None => Ok(None),
    }
}

/// A blob's compaction written but not yet recorded: its packs are stored, nothing names them.
#[derive(Debug)]
pub struct Prepared {
    record: Compacted,
}

impl Prepared {
    /// The packs the blob's list points into that this compaction did not write (chunks
    /// already stored).
    pub fn reused_packs(&self) -> HashSet<String> {
        let own: HashSet<&str> = self.record.packs.iter().map(|p| p.id.as_str()).collect();
        let mut named = HashSet::new();
        for c in &self.record.chunks {
            named.insert(c.pack.clone());
        }
        named.retain(|p| !own.contains(p.as_str()));
        named
    }

    async fn discard(&self, jobs: &Jobs) {
        for p in &self.record.packs {
            let _ = jobs.blobs.store.delete_pack(&p.id).await;
        }
    }
}

/// First half of a blob's compaction: its raw bytes read and cut, its new chunks compressed
/// into packs and written. `None` when the blob is gone, or its bytes fail their hash: chunks
/// named by the hashes of damaged bytes would pass every later check, so a damaged blob is
/// never compacted — it is marked, and stays raw until an upload repairs it.
pub async fn prepare(jobs: &Jobs, digest: &Digest, size: u64) -> anyhow::Result<Option<Prepared>> {
    if jobs.blobs.damage.contains(digest) {
        return Ok(None);
    }
    let mut raw = match jobs.blobs.store.get_stream(digest, 0..size).await {
        Ok(s) => s,
        Err(BlobError::NotFound) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut blob = Blob {
        jobs,
        packs: Packs::default(),
        list: Vec::new(),
        own: HashSet::new(),
        reused: Vec::new(),
        size: 0,
        pace: jobs.blobs.heavy.pace(),
    };
    let mut chunker = Chunker::default();
    let mut whole = blake3::Hasher::new();
    let read = async {
        while let Some(bytes) = raw.next().await {
            let bytes = bytes?;
            whole.update(&bytes);
            let pieces = chunker.push(&bytes);
            blob.take(pieces).await?;
        }
        blob.take(std::mem::take(&mut chunker).finish()).await?;
        blob.packs.flush(jobs).await?;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    if let Err(e) = read {
        blob.packs.discard(jobs).await;
        return Err(e);
    }
    if blob.size != size || Digest::from_bytes(*whole.finalize().as_bytes()) != *digest {
        blob.packs.discard(jobs).await;
        jobs.blobs.mark_damaged(digest, "corrupt").await;
        return Ok(None);
    }
    let mut chunks = blob.packs.chunks.clone();
    chunks.extend(blob.reused);
    Ok(Some(Prepared { record: Compacted { packs: blob.packs.written.clone(), chunks, list: blob.list } }))
}

/// Second half: the compaction recorded (the invariant of `db/chunks.rs`), then the raw copy
/// removed. `None` (its packs removed) when the blob is no longer a live raw blob, or a pack
/// it reuses is being deleted: the blob stays raw, for a later pass.
pub async fn finish(jobs: &Jobs, digest: &Digest, prepared: Prepared) -> anyhow::Result<Option<u64>> {
    let stored: u64 = prepared.record.packs.iter().map(|p| p.size).sum();
    let mut record = prepared.record.clone();
    // Only the chunks this compaction wrote are recorded as new; the reused ones have rows.
    let own: HashSet<String> = record.packs.iter().map(|p| p.id.clone()).collect();
    record.chunks.retain(|c| own.contains(&c.pack));
    if !jobs.blobs.db.commit_compaction(digest, record, jobs.now()).await? {
        prepared.discard(jobs).await;
        return Ok(None);
    }
    // The chunks are the blob now: its raw copy goes (a reader that has it open reads on).
    if let Some(row) = jobs.blobs.db.blob_row(digest).await? {
        jobs.blobs.rows.put(std::sync::Arc::new(row));
    }
    crate::jobs::retention::delete_raw_copy(jobs, digest).await?;
    Ok(Some(stored))
}

/// Runs a pass every `interval` until `cancel` fires, on the heavy pool.
pub async fn run_compaction(jobs: Jobs, interval: Duration, cancel: CancellationToken) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        let (st, older) = (jobs.clone(), jobs.config.compact_after);
        let pass = jobs.blobs.heavy.spawn_background(async move { run_compaction_once(&st, older).await });
        match pass.await {
            Ok(Ok(s)) if s.blobs_compacted > 0 => tracing::info!(
                blobs_compacted = s.blobs_compacted,
                bytes_before = s.bytes_before,
                bytes_after = s.bytes_after,
                "compaction pass"
            ),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::error!(cause = %e, "compaction pass failed"),
            Err(e) => tracing::error!(cause = %e, "compaction pass stopped"),
        }
    }
}
