//! `BlockCache`: blocks of blobs kept in memory, for blob stores without a page cache of their
//! own (S3). A digest names its content, so a block never goes stale: nothing is invalidated,
//! and when the cache is full the blocks least worth keeping go (quick_cache's CLOCK-Pro).
//! Agents page through a blob one capped read after another; after the first read of a block
//! the next ones cost no request to the store.

use std::future::Future;
use std::ops::Range;

use bytes::{Bytes, BytesMut};
use spillway_api::Digest;

/// Bytes per block: a capped read (100 KB, from a line checkpoint up to 64 KiB before it)
/// spans one or two.
pub(crate) const BLOCK: u64 = 256 << 10;

/// Weighs a block by its length, so the capacity is in bytes.
#[derive(Clone, Copy, Debug)]
struct ByLength;

impl quick_cache::Weighter<(Digest, u64), Bytes> for ByLength {
    fn weight(&self, _: &(Digest, u64), block: &Bytes) -> u64 {
        block.len() as u64
    }
}

/// Blocks of blobs by (digest, block number), at most the capacity in bytes.
pub(crate) struct BlockCache {
    blocks: quick_cache::sync::Cache<(Digest, u64), Bytes, ByLength>,
}

impl std::fmt::Debug for BlockCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlockCache({} of {} bytes)", self.blocks.weight(), self.blocks.capacity())
    }
}

impl BlockCache {
    /// A cache of `capacity` bytes; `None` when that is less than one block (no cache).
    pub(crate) fn new(capacity: u64) -> Option<Self> {
        (capacity >= BLOCK).then(|| Self {
            blocks: quick_cache::sync::Cache::with_weighter((capacity / BLOCK) as usize, capacity, ByLength),
        })
    }

    /// Bytes `range` (not empty, within `size`) of the blob `d` of `size` bytes, from its
    /// blocks; a missing block is fetched whole with `fetch`, once however many readers ask
    /// for it at the same time.
    pub(crate) async fn read<F, Fut, E>(&self, d: &Digest, size: u64, range: Range<u64>, fetch: F) -> Result<Bytes, E>
    where
        F: Fn(Range<u64>) -> Fut,
        Fut: Future<Output = Result<Bytes, E>>,
    {
        let (first, last) = (range.start / BLOCK, range.end.saturating_sub(1) / BLOCK);
        let blocks = futures::future::try_join_all((first..=last).map(|i| {
            let (key, load) = ((*d, i), fetch(i * BLOCK..((i + 1) * BLOCK).min(size)));
            async move { self.blocks.get_or_insert_async(&key, load).await }
        }))
        .await?;
        // One block: a slice of it, no copy.
        let within = |i: u64, block: &Bytes| {
            let base = i * BLOCK;
            let (from, to) = (range.start.max(base) - base, range.end.min(base + BLOCK) - base);
            block.get(from as usize..to as usize).map(|_| block.slice(from as usize..to as usize))
        };
        if let [block] = &blocks[..] {
            if let Some(part) = within(first, block) {
                return Ok(part);
            }
        } else {
            let mut out = BytesMut::with_capacity((range.end - range.start) as usize);
            for (i, block) in (first..=last).zip(&blocks) {
                match within(i, block) {
                    Some(part) => out.extend_from_slice(&part),
                    None => break,
                }
            }
            if out.len() as u64 == range.end - range.start {
                return Ok(out.freeze());
            }
        }
        // A block shorter than its span (the caller's size was wrong): the range as it is.
        fetch(range).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn blob(size: usize) -> Bytes {
        Bytes::from((0..size).map(|i| (i * 7 % 251) as u8).collect::<Vec<u8>>())
    }

    #[tokio::test]
    async fn ranges_across_blocks_read_the_blob_and_fetch_each_block_once() {
        let data = blob(3 * BLOCK as usize + 1234);
        let (d, size) = (Digest::of(&data), data.len() as u64);
        let cache = BlockCache::new(16 * BLOCK).unwrap();
        let fetches = AtomicUsize::new(0);
        let fetch = |r: Range<u64>| {
            let (part, fetches) = (data.slice(r.start as usize..r.end as usize), &fetches);
            async move {
                fetches.fetch_add(1, Ordering::Relaxed); // counted when the store is asked
                Ok::<_, std::convert::Infallible>(part)
            }
        };
        let b = BLOCK;
        for r in [0..1, 5..b, b - 3..b + 3, 10..3 * b + 7, 3 * b..size, size - 1..size, 0..size] {
            let got = cache.read(&d, size, r.clone(), fetch).await.unwrap();
            assert_eq!(got, data.slice(r.start as usize..r.end as usize), "{r:?}");
        }
        assert_eq!(fetches.load(Ordering::Relaxed), 4, "each of the 4 blocks fetched once");
        // Many readers of a block not cached yet: one fetch.
        let other = Digest::of(b"another blob");
        let reads = (0..20).map(|i| cache.read(&other, size, i..i + 100, fetch));
        futures::future::try_join_all(reads).await.unwrap();
        assert_eq!(fetches.load(Ordering::Relaxed), 5);
    }

    #[tokio::test]
    async fn the_capacity_bounds_what_is_kept() {
        let data = blob(64 * BLOCK as usize);
        let (d, size) = (Digest::of(&data), data.len() as u64);
        let cache = BlockCache::new(8 * BLOCK).unwrap();
        let fetch = |r: Range<u64>| {
            let part = data.slice(r.start as usize..r.end as usize);
            async move { Ok::<_, std::convert::Infallible>(part) }
        };
        for i in 0..64 {
            cache.read(&d, size, i * BLOCK..i * BLOCK + 10, fetch).await.unwrap();
        }
        assert!(cache.blocks.weight() <= 8 * BLOCK, "{cache:?}");
        assert!(BlockCache::new(BLOCK - 1).is_none());
    }

    #[tokio::test]
    async fn a_short_block_falls_back_to_the_range_itself() {
        let data = blob(1000);
        let d = Digest::of(&data);
        let cache = BlockCache::new(4 * BLOCK).unwrap();
        // Told the blob is larger than it is: the block fetched is short of the range.
        let fetch = |r: Range<u64>| {
            let part = data.slice(r.start as usize..(r.end as usize).min(data.len()));
            async move { Ok::<_, std::convert::Infallible>(part) }
        };
        let got = cache.read(&d, 5000, 900..1000, fetch).await.unwrap();
        assert_eq!(got, data.slice(900..1000));
        let got = cache.read(&d, 5000, 900..1200, fetch).await.unwrap();
        assert_eq!(got, data.slice(900..1000), "what the store has");
    }
}
