//! CPU-side costs that no I/O hides: page cutting, line lookup, truncation, the per-turn
//! gate over 15 results of 100 KB (target: ≤ 10 ms beside its I/O), and a compacted chunk's
//! read with and without its integrity check (api.md v1.3: at most 1.1× without).

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use spillway_api::paging::{self, MemorySource};
use spillway_client::gate::{Gate, TurnResult};
use spillway_client::spill::{Deadline, Location, SpillTarget, SpillWriter};
use spillway_client::truncate::{self, Sample, Strategy};

/// A spill target that stores nothing: the gate's own work, without its I/O.
#[derive(Debug)]
struct Null;

#[async_trait]
impl SpillTarget for Null {
    async fn begin(&self, _: &[(String, String)]) -> spillway_client::Result<Box<dyn SpillWriter>> {
        unreachable!("the gate saves whole results")
    }
    async fn save(&self, data: Bytes, _: &[(String, String)], _: &mut Deadline) -> spillway_client::Result<Location> {
        Ok(Location::Store { digest: spillway_api::Digest::of(&data).to_string() })
    }
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let text: String = (1..=1_000_000).map(|i| format!("log line {i:>9} status=ok\n")).collect();
    let src = MemorySource::new(Bytes::from(text.clone()));
    c.bench_function("line_page_at_1", |bn| bn.iter(|| rt.block_on(paging::line_page(&src, 1, 100)).unwrap()));
    c.bench_function("line_page_at_999000", |bn| {
        bn.iter(|| rt.block_on(paging::line_page(&src, 999_000, 100)).unwrap())
    });
    c.bench_function("byte_page_100k", |bn| {
        bn.iter(|| rt.block_on(paging::byte_page(&src, 12_345_678, 100_000)).unwrap())
    });
    let mb = &text.as_bytes()[..4 << 20];
    c.bench_function("head_tail_preview_4mib", |bn| {
        bn.iter(|| truncate::preview(&Sample::whole(mb), 100_000, Strategy::default()).unwrap())
    });
    let gate = Gate::new(Arc::new(Null));
    let turn: Vec<TurnResult> =
        (0..15).map(|i| TurnResult::Text(text[i * 100_000..(i + 1) * 100_000].to_owned())).collect();
    c.bench_function("gate_15_x_100kb", |bn| bn.iter(|| rt.block_on(gate.apply(turn.clone()))));
    // A chunk of the average size, as a capped read that misses the chunk cache reads it: its
    // zstd frame decompressed alone (no check), and as the server does it (the frame's own
    // checksum, then BLAKE3 of the chunk against its name).
    let raw = &text.as_bytes()[1 << 20..(1 << 20) + spillway_server::chunks::AVG_CHUNK];
    let unchecked = zstd::bulk::compress(raw, spillway_server::chunks::LEVEL).unwrap();
    let frame = spillway_server::chunks::compress(raw).unwrap();
    let loc = spillway_server::db::ChunkLoc {
        digest: spillway_api::Digest::of(raw),
        pack: "bench".into(),
        pack_offset: 0,
        length: frame.len() as u64,
        raw_length: raw.len() as u64,
    };
    c.bench_function("chunk_64k_decompress_unchecked", |bn| {
        bn.iter(|| zstd::bulk::decompress(&unchecked, raw.len()).unwrap())
    });
    c.bench_function("chunk_64k_decompress_checked", |bn| {
        bn.iter(|| spillway_server::chunks::decompress(&frame, &loc).unwrap())
    });
}

criterion_group!(cpu, benches);
criterion_main!(cpu);
