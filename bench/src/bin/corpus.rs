//! `spillway-corpus DIR`: what each piece of storage v2 contributes on a corpus of outputs —
//! whole-blob dedup, content-defined chunks alone, chunks compressed at several zstd levels,
//! and with a dictionary trained from the corpus's own chunks — as stored/logical ratios and
//! single-thread compression throughput. One JSON line per measure.

use std::collections::HashSet;
use std::time::Instant;

use spillway_api::Digest;
use spillway_server::chunks::Chunker;

fn main() -> anyhow::Result<()> {
    let dir = std::env::args().nth(1).ok_or_else(|| anyhow::anyhow!("usage: spillway-corpus DIR"))?;
    let mut files: Vec<Vec<u8>> = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(&dir)?.flatten().map(|e| e.path()).collect();
    names.sort();
    for p in &names {
        files.push(std::fs::read(p)?);
    }
    let logical: u64 = files.iter().map(|f| f.len() as u64).sum();
    let report = |what: &str, stored: u64, extra: serde_json::Value| {
        let mut line = serde_json::json!({"measure": what, "stored_bytes": stored, "logical_bytes": logical,
            "ratio": (stored as f64 / logical as f64 * 10_000.0).round() / 10_000.0});
        if let (Some(l), Some(e)) = (line.as_object_mut(), extra.as_object()) {
            l.extend(e.clone());
        }
        println!("{line}");
    };
    // Whole blobs, each distinct one once.
    let mut seen = HashSet::new();
    let whole: u64 = files.iter().filter(|f| seen.insert(Digest::of(f))).map(|f| f.len() as u64).sum();
    report("whole_blob_dedup", whole, serde_json::json!({"outputs": files.len(), "distinct": seen.len()}));
    // Chunks: each distinct chunk once.
    let t = Instant::now();
    let mut chunks: Vec<bytes::Bytes> = Vec::new();
    let mut seen = HashSet::new();
    let mut all_chunks = 0usize;
    for f in &files {
        let mut c = Chunker::default();
        let mut pieces = c.push(f);
        pieces.extend(c.finish());
        all_chunks += pieces.len();
        for (_, b) in pieces {
            if seen.insert(Digest::of(&b)) {
                chunks.push(b);
            }
        }
    }
    let chunking_s = t.elapsed().as_secs_f64();
    let unique: u64 = chunks.iter().map(|c| c.len() as u64).sum();
    report(
        "chunks_dedup",
        unique,
        serde_json::json!({"chunks": all_chunks, "distinct_chunks": chunks.len(),
                           "chunk_and_hash_mb_s": (logical as f64 / chunking_s / 1e6).round()}),
    );
    for level in [1, 3, 6, 9, 12, 19] {
        let t = Instant::now();
        let stored: u64 = chunks.iter().map(|c| zstd::bulk::compress(c, level).unwrap().len() as u64).sum();
        let s = t.elapsed().as_secs_f64();
        report(
            &format!("chunks_zstd_{level}"),
            stored,
            serde_json::json!({"compress_mb_s_of_distinct": (unique as f64 / s / 1e6).round(),
                               "compress_mb_s_of_logical": (logical as f64 / s / 1e6).round()}),
        );
    }
    // A dictionary trained from a sample of the corpus's own chunks (every 16th, 4 KiB of each).
    let samples: Vec<&[u8]> = chunks.iter().step_by(16).map(|c| &c[..c.len().min(4096)]).collect();
    let dict = zstd::dict::from_samples(&samples, 112 << 10)?;
    for level in [3, 9] {
        let mut comp = zstd::bulk::Compressor::with_dictionary(level, &dict)?;
        let stored: u64 =
            chunks.iter().map(|c| comp.compress(c).unwrap().len() as u64).sum::<u64>() + dict.len() as u64;
        report(&format!("chunks_zstd_{level}_dictionary"), stored, serde_json::json!({"dictionary_bytes": dict.len()}));
    }
    Ok(())
}
