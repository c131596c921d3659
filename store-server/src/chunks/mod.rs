//! The chunk layer of storage v2, above the blob store: content-defined chunks (FastCDC,
//! 16/64/256 KiB), each keyed by its BLAKE3 and compressed on its own (a zstd frame), written
//! in packs — one object of many frames — and read back by ranged reads of those packs.
//!
//! A chunk's boundaries depend only on the bytes from the previous boundary on, so the same
//! output saved again, a log saved as it grows, or two runs that differ in a few lines share
//! all their chunks but those around the changes; each chunk is stored once, across blobs and
//! namespaces. Compressing each chunk apart costs some ratio against compressing a whole
//! file, and buys reads that decompress only the chunks a page touches.
//!
//! Decompressed chunks are kept in memory by weight (`--read-cache-bytes`), as a chunk never
//! changes; the chunk lists of compacted blobs too. Writing (chunking, hashing, compressing)
//! is the compaction's (`jobs/compaction.rs`), on the niced heavy pool.

use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use spillway_api::Digest;

use crate::db::{ChunkLoc, Db};
use crate::storage::{BlobError, BlobStore};

/// FastCDC's bounds: no chunk under 16 KiB (but a blob's last), none over 256 KiB, 64 KiB on
/// average.
pub const MIN_CHUNK: usize = 16 << 10;
/// See [`MIN_CHUNK`].
pub const AVG_CHUNK: usize = 64 << 10;
/// See [`MIN_CHUNK`].
pub const MAX_CHUNK: usize = 256 << 10;
/// A pack is written once its frames pass this many bytes (and at the end of a blob).
pub const PACK_TARGET: usize = 32 << 20;
/// zstd's level for chunks: the measured best ratio for the compaction's time budget
/// (docs/benchmarks.md, "Storage v2").
pub const LEVEL: i32 = 3;
/// Chunks read ahead of the one a full download sends.
const READ_AHEAD: usize = 4;

/// A pack's id: 32 random hex digits.
pub fn new_pack_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Cuts a stream of bytes into chunks as they come: the bytes handed in are cut with FastCDC
/// and every chunk but the last is given out; the last waits for more bytes (a boundary
/// depends on what follows), or for [`Chunker::finish`]. The cuts are those a run over the
/// whole at once would make: each starts where the previous ended.
#[derive(Debug, Default)]
pub struct Chunker {
    pending: BytesMut,
    /// Where `pending` starts in the whole.
    offset: u64,
}

/// One chunk of a blob: where it starts, and its bytes.
pub type Piece = (u64, Bytes);

impl Chunker {
    /// Takes bytes; gives out the chunks now known to be whole.
    pub fn push(&mut self, data: &[u8]) -> Vec<Piece> {
        self.pending.extend_from_slice(data);
        if self.pending.len() < 4 * MAX_CHUNK {
            return Vec::new();
        }
        self.cut(false)
    }

    /// The chunks left, the last one included.
    pub fn finish(mut self) -> Vec<Piece> {
        self.cut(true)
    }

    fn cut(&mut self, all: bool) -> Vec<Piece> {
        let cuts: Vec<(usize, usize)> = fastcdc::v2020::FastCDC::new(&self.pending, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK)
            .map(|c| (c.offset, c.length))
            .collect();
        let keep = if all { cuts.len() } else { cuts.len().saturating_sub(1) };
        let taken = cuts.get(..keep).and_then(|c| c.last()).map_or(0, |&(o, l)| o + l);
        let done = self.pending.split_to(taken).freeze();
        let out = cuts[..keep].iter().map(|&(o, l)| (self.offset + o as u64, done.slice(o..o + l))).collect();
        self.offset += taken as u64;
        out
    }
}

/// A compressed chunk: one zstd frame that carries the checksum of its content, so that a
/// damaged frame fails as it is decompressed.
pub fn compress(raw: &[u8]) -> Result<Vec<u8>, BlobError> {
    thread_local! {
        static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> = const { std::cell::RefCell::new(None) };
    }
    COMPRESSOR
        .with(|c| {
            let mut c = c.borrow_mut();
            if c.is_none() {
                let mut made = zstd::bulk::Compressor::new(LEVEL)?;
                made.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))?;
                *c = Some(made);
            }
            c.as_mut().expect("made above").compress(raw)
        })
        .map_err(|e| BlobError::Storage(e.into()))
}

/// A chunk's raw bytes from its frame, checked against the chunk's name: a frame that does
/// not decompress (its own checksum fails, or it is cut short), or whose bytes do not hash to
/// the chunk's digest, is [`BlobError::Corrupt`] — never bytes handed on.
pub fn decompress(frame: &[u8], loc: &ChunkLoc) -> Result<Bytes, BlobError> {
    let corrupt = || BlobError::Corrupt(loc.digest);
    if frame.len() as u64 != loc.length {
        return Err(corrupt());
    }
    let raw = zstd::bulk::decompress(frame, loc.raw_length as usize).map_err(|_| corrupt())?;
    if raw.len() as u64 != loc.raw_length || Digest::of(&raw) != loc.digest {
        return Err(corrupt());
    }
    Ok(raw.into())
}

/// The chunks of one compacted blob, in order, with where each starts.
#[derive(Debug)]
pub struct ChunkMap {
    starts: Vec<u64>,
    locs: Vec<ChunkLoc>,
}

impl ChunkMap {
    /// The chunks that hold bytes `range`, as (where the chunk starts, the chunk).
    fn covering(&self, range: Range<u64>) -> impl Iterator<Item = (u64, &ChunkLoc)> {
        let first = self.starts.partition_point(|&s| s <= range.start).saturating_sub(1);
        self.starts[first..]
            .iter()
            .zip(&self.locs[first..])
            .take_while(move |(s, _)| **s < range.end)
            .map(|(s, l)| (*s, l))
    }

    fn weight(&self) -> u64 {
        (self.locs.len() * (std::mem::size_of::<ChunkLoc>() + 48)) as u64
    }
}

#[derive(Clone, Copy, Debug)]
struct ByLength;

impl quick_cache::Weighter<Digest, Bytes> for ByLength {
    fn weight(&self, _: &Digest, chunk: &Bytes) -> u64 {
        chunk.len() as u64
    }
}

#[derive(Clone, Copy, Debug)]
struct ByEntries;

impl quick_cache::Weighter<Digest, Arc<ChunkMap>> for ByEntries {
    fn weight(&self, _: &Digest, map: &Arc<ChunkMap>) -> u64 {
        map.weight()
    }
}

/// Reads compacted blobs: chunk lists and decompressed chunks, cached.
pub struct ChunkReader {
    chunks: quick_cache::sync::Cache<Digest, Bytes, ByLength>,
    maps: quick_cache::sync::Cache<Digest, Arc<ChunkMap>, ByEntries>,
}

impl std::fmt::Debug for ChunkReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChunkReader({} of {} bytes)", self.chunks.weight(), self.chunks.capacity())
    }
}

impl ChunkReader {
    /// Keeps up to `bytes` of decompressed chunks in memory (at least a few).
    pub fn new(bytes: u64) -> Self {
        let bytes = bytes.max(4 * MAX_CHUNK as u64);
        Self {
            chunks: quick_cache::sync::Cache::with_weighter((bytes / AVG_CHUNK as u64) as usize, bytes, ByLength),
            maps: quick_cache::sync::Cache::with_weighter(1024, 64 << 20, ByEntries),
        }
    }

    /// The chunk list of a compacted blob (a list never changes while its blob lives).
    async fn map(&self, db: &Db, blob: &Digest) -> Result<Arc<ChunkMap>, BlobError> {
        self.maps
            .get_or_insert_async(blob, async {
                let list = db.blob_chunks(blob).await.map_err(|e| BlobError::Storage(e.into()))?;
                if list.is_empty() {
                    return Err(BlobError::NotFound); // deleted meanwhile
                }
                let (starts, locs) = list.into_iter().unzip();
                Ok(Arc::new(ChunkMap { starts, locs }))
            })
            .await
    }

    /// One chunk's raw bytes, decompressed and checked once however many readers ask at the
    /// same time.
    async fn chunk(&self, blobs: &BlobStore, loc: &ChunkLoc) -> Result<Bytes, BlobError> {
        self.chunks.get_or_insert_async(&loc.digest, fetch_chunk(blobs.clone(), loc.clone())).await
    }

    /// Bytes `range` (within the blob) of compacted blob `blob`. A chunk list kept from before
    /// the blob was deleted and compacted again (its packs gone) is read again once; a pack
    /// still missing then, or a chunk that fails its check, is [`BlobError::Corrupt`] of
    /// `blob`.
    pub async fn read(&self, db: &Db, blobs: &BlobStore, blob: &Digest, range: Range<u64>) -> Result<Bytes, BlobError> {
        let got = match self.read_with_map(db, blobs, blob, range.clone(), false).await {
            Err(BlobError::NotFound) => {
                self.maps.remove(blob);
                self.read_with_map(db, blobs, blob, range, true).await
            }
            other => other,
        };
        if let Err(BlobError::Corrupt(chunk)) = &got {
            record_damaged_chunk(db, chunk).await;
        }
        got.map_err(|e| of_blob(e, blob))
    }

    async fn read_with_map(
        &self,
        db: &Db,
        blobs: &BlobStore,
        blob: &Digest,
        range: Range<u64>,
        fresh: bool,
    ) -> Result<Bytes, BlobError> {
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let map = self.map(db, blob).await?;
        let pieces = futures::future::try_join_all(map.covering(range.clone()).map(|(start, loc)| async move {
            let chunk = self.chunk(blobs, loc).await;
            Ok::<_, BlobError>((start, if fresh { pack_gone(blobs, chunk, loc).await } else { chunk }?))
        }))
        .await?;
        let slice = |start: u64, chunk: &Bytes| {
            let from = range.start.saturating_sub(start) as usize;
            let to = ((range.end - start) as usize).min(chunk.len());
            chunk.slice(from.min(to)..to)
        };
        if let [(start, chunk)] = pieces.as_slice() {
            return Ok(slice(*start, chunk)); // one chunk: a slice of it, no copy
        }
        let mut out = BytesMut::with_capacity((range.end - range.start) as usize);
        for (start, chunk) in &pieces {
            out.extend_from_slice(&slice(*start, chunk));
        }
        if out.len() as u64 != range.end - range.start {
            return Err(BlobError::storage(format!(
                "a chunk list covers {} of {} bytes",
                out.len(),
                range.end - range.start
            )));
        }
        Ok(out.freeze())
    }

    /// Bytes `range` of compacted blob `blob` as a stream, a chunk at a time, the next few
    /// fetched and decompressed while one is sent.
    pub async fn stream(
        self: &Arc<Self>,
        db: &Db,
        blobs: &BlobStore,
        blob: &Digest,
        range: Range<u64>,
    ) -> Result<BoxStream<'static, Result<Bytes, BlobError>>, BlobError> {
        let map = self.map(db, blob).await?;
        let parts: Vec<(u64, ChunkLoc)> = map.covering(range.clone()).map(|(s, l)| (s, l.clone())).collect();
        let (this, blobs, db) = (self.clone(), blobs.clone(), db.clone());
        let stream = futures::stream::iter(parts)
            .map(move |(start, loc)| {
                let (this, blobs, range, db) = (this.clone(), blobs.clone(), range.clone(), db.clone());
                async move {
                    // A download streams past: what it reads need not stay in the cache.
                    let chunk = match this.chunks.get(&loc.digest) {
                        Some(c) => c,
                        None => {
                            let fetched = pack_gone(&blobs, fetch_chunk(blobs.clone(), loc.clone()).await, &loc).await;
                            if let Err(BlobError::Corrupt(chunk)) = &fetched {
                                record_damaged_chunk(&db, chunk).await;
                            }
                            fetched?
                        }
                    };
                    let from = range.start.saturating_sub(start) as usize;
                    let to = ((range.end - start) as usize).min(chunk.len());
                    Ok(chunk.slice(from.min(to)..to))
                }
            })
            .buffered(READ_AHEAD)
            .map_err({
                let blob = *blob;
                move |e| of_blob(e, &blob)
            })
            .try_filter(|b| futures::future::ready(!b.is_empty()));
        Ok(stream.boxed())
    }

    /// Forgets a blob's chunk list (it was deleted).
    pub fn forget(&self, blob: &Digest) {
        self.maps.remove(blob);
    }
}

/// A chunk's frame read from its pack, decompressed and checked.
async fn fetch_chunk(blobs: BlobStore, loc: ChunkLoc) -> Result<Bytes, BlobError> {
    let frame = blobs.get_pack_range(&loc.pack, loc.pack_offset..loc.pack_offset + loc.length).await?;
    tokio::task::spawn_blocking(move || decompress(&frame, &loc)).await?
}

/// A pack missing under a chunk list read afresh: the list is the database's word that the
/// pack holds the chunk (a pack goes only once no list names it), so its absence is damage —
/// when the store answers at all (a bucket gone answers every key with a 404 too).
async fn pack_gone(blobs: &BlobStore, got: Result<Bytes, BlobError>, loc: &ChunkLoc) -> Result<Bytes, BlobError> {
    match got {
        Err(BlobError::NotFound) if blobs.lists_blobs().await => Err(BlobError::Corrupt(loc.digest)),
        Err(BlobError::NotFound) => Err(BlobError::storage("the blob store does not answer a listing")),
        other => other,
    }
}

/// Marks a chunk that failed its check, and every blob whose list names it, so that no read
/// of them is served and no compaction reuses the chunk (`db/damage.rs`).
async fn record_damaged_chunk(db: &Db, chunk: &Digest) {
    use crate::clock::Clock as _;
    match db.mark_chunks_damaged(&[*chunk], crate::clock::SystemClock.now_ms()).await {
        Ok(blobs) => tracing::error!(%chunk, blobs = blobs.len(), "a chunk fails its hash; its blobs are marked"),
        Err(e) => tracing::error!(%chunk, cause = %e, "could not record a damaged chunk"),
    }
}

/// A chunk's failure as the failure of the blob being read.
fn of_blob(e: BlobError, blob: &Digest) -> BlobError {
    match e {
        BlobError::Corrupt(_) => BlobError::Corrupt(*blob),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bytes_like_logs(n: usize, seed: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(n);
        let mut x = seed;
        while out.len() < n {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            out.extend_from_slice(format!("2026-12-02 step {} value {:x}\n", x >> 40, x >> 20).as_bytes());
        }
        out.truncate(n);
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// However the bytes arrive, the chunks are the same, cover the whole, and stay in
        /// bounds.
        #[test]
        fn chunks_do_not_depend_on_how_the_bytes_arrive(
            n in 0usize..3_000_000,
            seed in any::<u64>(),
            splits in proptest::collection::vec(1usize..400_000, 1..20),
        ) {
            let data = bytes_like_logs(n, seed);
            let mut whole = Chunker::default();
            let mut at_once = whole.push(&data);
            at_once.extend(whole.finish());
            let mut c = Chunker::default();
            let (mut got, mut at, mut i) = (Vec::new(), 0, 0);
            while at < data.len() {
                let step = splits[i % splits.len()].min(data.len() - at);
                got.extend(c.push(&data[at..at + step]));
                at += step;
                i += 1;
            }
            got.extend(c.finish());
            prop_assert_eq!(&got, &at_once);
            let mut next = 0u64;
            for (k, (offset, chunk)) in got.iter().enumerate() {
                prop_assert_eq!(*offset, next);
                prop_assert!(chunk.len() <= MAX_CHUNK);
                prop_assert!(chunk.len() >= MIN_CHUNK || k == got.len() - 1);
                prop_assert_eq!(&chunk[..], &data[*offset as usize..*offset as usize + chunk.len()]);
                next += chunk.len() as u64;
            }
            prop_assert_eq!(next, data.len() as u64);
        }
    }

    #[test]
    fn a_change_in_the_middle_leaves_the_other_chunks_alone() {
        let data = bytes_like_logs(4 << 20, 7);
        let mut edited = data.clone();
        edited.splice(2_000_000..2_000_010, b"one edited line!\n".iter().copied());
        let digests = |d: &[u8]| {
            let mut c = Chunker::default();
            let mut all = c.push(d);
            all.extend(c.finish());
            all.into_iter().map(|(_, b)| Digest::of(&b)).collect::<std::collections::HashSet<_>>()
        };
        let (a, b) = (digests(&data), digests(&edited));
        let shared = a.intersection(&b).count();
        assert!(shared >= a.len() - 3, "{shared} of {} chunks shared", a.len());
    }

    #[test]
    fn frames_read_back_exact() {
        let raw = bytes_like_logs(200_000, 3);
        let frame = compress(&raw).unwrap();
        assert!(frame.len() < raw.len() / 3, "logs compress");
        let loc = ChunkLoc {
            digest: Digest::of(&raw),
            pack: "p".into(),
            pack_offset: 0,
            length: frame.len() as u64,
            raw_length: raw.len() as u64,
        };
        assert_eq!(decompress(&frame, &loc).unwrap(), raw);
        let short = ChunkLoc { raw_length: raw.len() as u64 - 1, ..loc.clone() };
        assert!(matches!(decompress(&frame, &short), Err(BlobError::Corrupt(_))), "a wrong length is damage");
        for at in [0, frame.len() / 2, frame.len() - 1] {
            let mut bad = frame.clone();
            bad[at] ^= 0x10;
            assert!(matches!(decompress(&bad, &loc), Err(BlobError::Corrupt(d)) if d == loc.digest), "flip at {at}");
        }
        assert!(matches!(decompress(&frame[..frame.len() - 3], &loc), Err(BlobError::Corrupt(_))), "cut short");
        let named_wrong = ChunkLoc { digest: Digest::of(b"other"), ..loc };
        assert!(matches!(decompress(&frame, &named_wrong), Err(BlobError::Corrupt(_))), "not the chunk named");
    }
}
