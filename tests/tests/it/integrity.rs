//! Integrity (api.md v1.3): stored bytes damaged under the server — a bit flipped, a file or
//! object cut short or deleted, in raw blobs and in packs of chunks (text and binary) — are
//! never served: reads, pages, greps, searches, `GET`s and Range walks answer `500 corrupt` (or
//! a cut body), the scrub lists every damaged output and nothing else, and an upload of the
//! same content repairs each. The damage is made through the blob store's own keys, so on
//! PostgreSQL + S3 it is made to the S3 server's objects.

use bytes::Bytes;
use futures::TryStreamExt;
use rand::{Rng, SeedableRng};
use reqwest::Method;
use spillway_api::{BlobRecord, Digest, ErrorCode};
use spillway_client::{ClientError, GrepRequest, ReadRequest, SearchRequest, StoreClient, UploadOptions};
use spillway_server::jobs::scrub::{run_scrub_once, ScrubOpts, ScrubSummary};

use crate::support::{Clients, TestServer};

fn ttl() -> UploadOptions {
    UploadOptions { ttl: Some(3600), ..Default::default() }
}

/// A text log of about `n` bytes with a line that names `tag`.
fn log(n: usize, tag: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(n + 100);
    let mut i = 0u64;
    while out.len() < n {
        i += 1;
        if i == 1000 {
            out.extend_from_slice(format!("marker {tag} here\n").as_bytes());
        }
        out.extend_from_slice(
            format!("2026-12-07T18:00:{:02}Z {tag} step {i} value {}\n", i % 60, i * 7919).as_bytes(),
        );
    }
    out
}

fn binary(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // Repetitive enough to compress, never valid text.
    (0..n).map(|i| if i % 3 == 0 { rng.random::<u8>() } else { 0xff }).collect()
}

/// Damages what the store holds under `key` (`blobs/…` or `packs/…`) as a failing disk or
/// bucket would: `edit` gets the bytes and gives what is stored from now on, `None` to delete.
/// On local disk the file is changed in place (the same inode, as bit rot is); on S3 the object
/// is written anew through the store.
async fn damage(srv: &TestServer, key: &str, edit: impl FnOnce(Vec<u8>) -> Option<Vec<u8>>) {
    let store = &srv.state.blobs.store;
    if crate::support::is_remote() {
        let (kind, name) = key.split_once('/').unwrap();
        let old = match kind {
            "blobs" => {
                let d: Digest = format!("blake3:{name}").parse().unwrap();
                let size = srv.state.db.blob_row(&d).await.unwrap().expect("a live blob").size;
                let mut s = store.get_stream(&d, 0..size).await.unwrap();
                let mut all = Vec::new();
                while let Some(p) = futures::StreamExt::next(&mut s).await {
                    all.extend_from_slice(&p.unwrap());
                }
                all
            }
            _ => {
                let packs: Vec<(String, u64, i64)> = store.list_packs().try_collect().await.unwrap();
                let size = packs.iter().find(|(id, ..)| id == name).unwrap().1;
                store.get_pack_range(name, 0..size).await.unwrap().to_vec()
            }
        };
        let new = edit(old);
        match (kind, new) {
            ("blobs", Some(b)) => store.plant(&format!("blake3:{name}").parse().unwrap(), b.into()).await.unwrap(),
            ("blobs", None) => store.delete(&format!("blake3:{name}").parse().unwrap()).await.unwrap(),
            (_, Some(b)) => store.put_pack(name, b.into()).await.unwrap(),
            (_, None) => store.delete_pack(name).await.unwrap(),
        }
        return;
    }
    let (kind, name) = key.split_once('/').unwrap();
    let path = srv.blob_dir().join(kind).join(&name[..2]).join(name);
    let old = std::fs::read(&path).unwrap();
    match edit(old) {
        Some(new) => {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.write_all_at(&new, 0).unwrap();
            f.set_len(new.len() as u64).unwrap();
            f.sync_all().unwrap();
        }
        None => std::fs::remove_file(&path).unwrap(),
    }
}

fn blob_key(d: &Digest) -> String {
    format!("blobs/{}", d.hex())
}

async fn scrub(srv: &TestServer) -> ScrubSummary {
    run_scrub_once(&srv.state.jobs, &ScrubOpts::default()).await.expect("scrub")
}

fn names(ds: &[&BlobRecord]) -> Vec<String> {
    let mut v: Vec<String> = ds.iter().map(|r| r.digest.to_string()).collect();
    v.sort();
    v
}

fn is_corrupt<T: std::fmt::Debug>(r: Result<T, ClientError>, d: &Digest) -> bool {
    match r {
        Err(ClientError::Api { status: 500, code: ErrorCode::Corrupt, message }) => {
            assert!(message.contains(&d.to_string()) && message.contains("upload"), "{message}");
            true
        }
        other => panic!("expected 500 corrupt for {d}, got {other:?}"),
    }
}

/// A full `GET`: its status and body, or `None` when the body did not complete.
async fn get(c: &StoreClient, d: &Digest, range: Option<String>) -> (u16, Option<Bytes>) {
    let mut req = c.request(Method::GET, &format!("/v1/blobs/{d}"));
    if let Some(r) = range {
        req = req.header("Range", r);
    }
    let resp = req.send().await.expect("an answer");
    let status = resp.status().as_u16();
    (status, resp.bytes().await.ok())
}

/// Every way of reading `rec` refuses it: pages by bytes and lines, grep, `GET`.
async fn refused(c: &StoreClient, rec: &BlobRecord) {
    let d = rec.digest;
    assert!(is_corrupt(c.read(d, ReadRequest::Bytes { offset: 0, limit: None }).await, &d));
    assert!(is_corrupt(c.read(d, ReadRequest::Lines { line: 1, lines: Some(10) }).await, &d));
    assert!(is_corrupt(c.read(d, ReadRequest::Bytes { offset: rec.size / 2, limit: Some(1000) }).await, &d));
    let g = GrepRequest { pattern: "step".into(), max_matches: Some(5), ..Default::default() };
    assert!(is_corrupt(c.grep(d, &g).await, &d));
    let (status, _) = get(c, &d, None).await;
    assert_eq!(status, 500, "GET of {d}");
}

/// Every way of reading `rec` gives `data` exactly.
async fn exact(c: &StoreClient, rec: &BlobRecord, data: &[u8]) {
    let d = rec.digest;
    let (status, body) = get(c, &d, None).await;
    assert_eq!(status, 200, "GET of {d}");
    assert!(body.as_deref() == Some(data), "GET of {d}: not the bytes");
    if std::str::from_utf8(data).is_err() {
        return; // pages show binary as U+FFFD; the GET above is the exact check
    }
    let mut offset = 0;
    while offset < data.len() as u64 {
        let p = c.read(d, ReadRequest::Bytes { offset, limit: None }).await.expect("page");
        assert!(p.content.as_bytes() == &data[offset as usize..(offset + p.length) as usize], "page at {offset}");
        offset += p.length.max(1);
    }
}

/// Raw blobs: a flipped bit, a file cut short and a deleted one. A full `GET` of the flipped
/// one ends before its body completes and marks it; the scrub finds the others (a page of a
/// raw blob has no hash of its own to check) and nothing else; from then on every read of them
/// is `500 corrupt`, a search leaves them out, `stats` counts them; an upload of the same
/// content repairs each (`201`), and a scrub afterwards finds nothing.
#[tokio::test]
async fn damaged_raw_blobs_are_never_served_and_an_upload_repairs_them() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let datas: Vec<Vec<u8>> = (0..5).map(|i| log(600_000 + i * 1000, &format!("needle{i}"))).collect();
    let mut recs = Vec::new();
    for d in &datas {
        recs.push(c.put(Bytes::from(d.clone()), &ttl()).await.unwrap());
    }
    let clean = scrub(&srv).await;
    assert!(clean.corrupt.is_empty() && clean.missing.is_empty(), "{clean:?}");
    assert_eq!(clean.checked_blobs, 5);
    assert!(clean.checked_bytes >= datas.iter().map(|d| d.len() as u64).sum::<u64>());

    let (flipped, cut, gone) = (&recs[0], &recs[1], &recs[2]);
    damage(&srv, &blob_key(&flipped.digest), |mut b| {
        b[300_000] ^= 0x04;
        Some(b)
    })
    .await;
    damage(&srv, &blob_key(&cut.digest), |b| Some(b[..400_000].to_vec())).await;
    damage(&srv, &blob_key(&gone.digest), |_| None).await;

    // The download of the flipped blob ends before its body completes, and marks it.
    let (status, body) = get(&c, &flipped.digest, None).await;
    assert_eq!(status, 200);
    assert!(body.is_none(), "the body of a blob that fails its hash never completes");
    refused(&c, flipped).await;
    // Bytes gone under a live row: 500 corrupt at once, never a 503 that asks to retry (a
    // server with nothing of them open; this one may still hold the deleted file open, whose
    // bytes are the blob's).
    let fresh = srv.replica().await;
    let gone_read = fresh.client().read(gone.digest, ReadRequest::Bytes { offset: 0, limit: None }).await;
    assert!(is_corrupt(gone_read, &gone.digest));
    fresh.stop().await;

    // A compaction never turns damage into chunks that would pass every check: the cut blob
    // fails its hash (or its read fails) and is left raw; the flipped (marked) and the
    // missing ones are skipped; the two whole ones are compacted. (By a replica that has
    // nothing open: this one may still read the deleted file's bytes, which are the blob's.)
    let fresh = srv.replica().await;
    assert_eq!(fresh.compact().await.blobs_compacted, 2);
    fresh.stop().await;
    for rec in [flipped, cut] {
        assert!(!srv.state.db.blob_row(&rec.digest).await.unwrap().unwrap().chunked, "{} left raw", rec.digest);
    }
    let found = scrub(&srv).await;
    assert_eq!(found.corrupt, names(&[flipped, cut]), "{found:?}");
    assert_eq!(found.missing, names(&[gone]), "{found:?}");
    for rec in [flipped, cut, gone] {
        refused(&c, rec).await;
    }
    let stats = srv.state.db.storage_stats().await.unwrap();
    assert_eq!(stats.corrupt, 3, "{stats:?}");
    // A search leaves the damaged outputs out; the whole ones are found.
    let s = c.search(&SearchRequest { pattern: "marker needle".into(), ..Default::default() }).await.unwrap();
    let mut hit: Vec<&str> = s.matches.iter().map(|m| m.digest.as_str()).collect();
    hit.sort();
    assert_eq!(hit, names(&[&recs[3], &recs[4]]), "{s:?}");
    // Another replica refuses them too, once it has read the marks.
    let other = srv.replica().await;
    other.state.blobs.refresh_damage().await.unwrap();
    refused(&other.client(), cut).await;
    other.stop().await;

    for (rec, data) in [(flipped, &datas[0]), (cut, &datas[1]), (gone, &datas[2])] {
        let again = c.put(Bytes::from(data.clone()), &ttl()).await.unwrap();
        assert!(!again.deduplicated, "a repair answers as a first upload (201): {again:?}");
        exact(&c, rec, data).await;
    }
    exact(&c, &recs[3], &datas[3]).await;
    let after = scrub(&srv).await;
    assert!(after.corrupt.is_empty() && after.missing.is_empty(), "{after:?}");
    assert_eq!(srv.state.db.storage_stats().await.unwrap().corrupt, 0);
    srv.stop().await;
}

/// The pack holding a chunk of `rec`, a frame in it (`which`: 0 first, 1 middle, 2 last), and
/// the pack's bytes.
async fn pack_of(srv: &TestServer, rec: &BlobRecord, which: usize) -> (String, spillway_server::db::ChunkLoc, Bytes) {
    let list = srv.state.db.blob_chunks(&rec.digest).await.unwrap();
    assert!(list.len() >= 3, "{} chunks", list.len());
    let loc = list[[0, list.len() / 2, list.len() - 1][which]].1.clone();
    let packs: Vec<(String, u64, i64)> = srv.state.blobs.store.list_packs().try_collect().await.unwrap();
    let size = packs.iter().find(|(id, ..)| *id == loc.pack).expect("the pack is stored").1;
    let bytes = srv.state.blobs.store.get_pack_range(&loc.pack, 0..size).await.unwrap();
    (loc.pack.clone(), loc, bytes)
}

/// Compacted blobs: a byte flipped in a pack (a text blob's chunk, a binary blob's chunk), a
/// pack cut short and a pack deleted. Each chunk is checked as it is decompressed: no page,
/// grep, `GET` or Range walk hands out a wrong byte — the parts that touch the damage answer
/// `500 corrupt` or end before their body completes — and the blob is marked. The scrub lists
/// exactly the damaged outputs; an upload repairs each, and a compaction after it stores the
/// damaged chunks afresh instead of reusing them.
#[tokio::test]
async fn damaged_packs_are_never_served_and_an_upload_repairs_them() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let datas = [log(1_500_000, "texta"), binary(1_500_000, 7), log(1_400_000, "textc"), log(1_300_000, "textd")];
    let mut recs = Vec::new();
    for d in &datas {
        recs.push(c.put(Bytes::from(d.clone()), &ttl()).await.unwrap());
    }
    let kept = c.put(Bytes::from(log(900_000, "kept")), &ttl()).await.unwrap();
    assert_eq!(srv.compact().await.blobs_compacted, 5);
    let clean = scrub(&srv).await;
    assert!(clean.corrupt.is_empty() && clean.missing.is_empty() && clean.checked_chunks > 10, "{clean:?}");

    // Text: one byte of a middle chunk's frame flipped.
    let (pack, loc, _) = pack_of(&srv, &recs[0], 1).await;
    damage(&srv, &format!("packs/{pack}"), |mut b| {
        b[(loc.pack_offset + loc.length / 2) as usize] ^= 0x01;
        Some(b)
    })
    .await;
    // A fresh server reads it: nothing of it cached.
    let fresh = srv.replica().await;
    let fc = fresh.client();
    let d = recs[0].digest;
    let mut refused_pages = 0;
    let mut offset = 0u64;
    while offset < recs[0].size {
        match fc.read(d, ReadRequest::Bytes { offset, limit: None }).await {
            Ok(p) => {
                assert!(
                    p.content.as_bytes() == &datas[0][offset as usize..(offset + p.length) as usize],
                    "at {offset}"
                );
                offset += p.length;
            }
            Err(e) => {
                assert!(is_corrupt(Err::<(), _>(e), &d));
                refused_pages += 1;
                break;
            }
        }
    }
    assert_eq!(refused_pages, 1, "the page over the damaged chunk is refused");
    refused(&fc, &recs[0]).await;

    // Binary: a Range walk over a flipped chunk never answers a wrong byte.
    let (pack, loc, _) = pack_of(&srv, &recs[1], 1).await;
    damage(&srv, &format!("packs/{pack}"), |mut b| {
        b[(loc.pack_offset + 3) as usize] ^= 0x80;
        Some(b)
    })
    .await;
    let step = 100_000u64;
    let (mut cut, mut exact_parts) = (0, 0);
    for start in (0..recs[1].size).step_by(step as usize) {
        let end = (start + step).min(recs[1].size) - 1;
        match get(&fc, &recs[1].digest, Some(format!("bytes={start}-{end}"))).await {
            (206, Some(body)) => {
                assert!(body[..] == datas[1][start as usize..=end as usize], "bytes {start}-{end} differ");
                exact_parts += 1;
            }
            (206, None) | (500, _) => cut += 1,
            other => panic!("bytes {start}-{end}: {other:?}"),
        }
    }
    assert!(cut >= 1 && exact_parts >= 5, "{cut} parts refused, {exact_parts} exact");

    // A pack cut short, and a pack deleted.
    let (pack, _, _) = pack_of(&srv, &recs[2], 2).await;
    damage(&srv, &format!("packs/{pack}"), |b| Some(b[..b.len() / 2].to_vec())).await;
    let (pack, _, _) = pack_of(&srv, &recs[3], 0).await;
    damage(&srv, &format!("packs/{pack}"), |_| None).await;
    fresh.stop().await;

    // Each compacted blob's new chunks went to packs of its own: the scrub lists the four
    // damaged outputs and not the fifth.
    let found = scrub(&srv).await;
    let mut listed = [found.corrupt.clone(), found.missing.clone()].concat();
    listed.sort();
    assert_eq!(listed, names(&recs.iter().collect::<Vec<_>>()), "{found:?}");
    assert_eq!(found.missing, names(&[&recs[3]]), "the deleted pack's blob is missing: {found:?}");
    for rec in &recs {
        refused(&c, rec).await;
    }
    exact(&c, &kept, &log(900_000, "kept")).await;

    // Repaired by uploads; compacted again, the damaged chunks are stored afresh.
    for (rec, data) in recs.iter().zip(&datas) {
        let again = c.put(Bytes::from(data.clone()), &ttl()).await.unwrap();
        assert!(!again.deduplicated, "{again:?}");
        exact(&c, rec, data).await;
    }
    assert!(srv.compact().await.blobs_compacted >= 4);
    let fresh = srv.replica().await;
    for (rec, data) in recs.iter().zip(&datas) {
        exact(&fresh.client(), rec, data).await;
    }
    fresh.stop().await;
    let after = scrub(&srv).await;
    assert!(after.corrupt.is_empty() && after.missing.is_empty(), "{after:?}");
    srv.stop().await;
}

/// A clean store scrubs with no finding, by parts too: `--subset` parts cover every blob once.
#[tokio::test]
async fn a_clean_store_scrubs_clean_and_its_parts_cover_it_once() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut n = 0;
    for i in 0..40 {
        let size = [100, 20_000, 300_000][i % 3] + rng.random_range(0..1000);
        c.put(Bytes::from(log(size, &format!("o{i}"))), &ttl()).await.unwrap();
        n += 1;
    }
    srv.compact().await;
    for i in 0..10 {
        c.put(Bytes::from(log(200_000, &format!("raw{i}"))), &ttl()).await.unwrap();
        n += 1;
    }
    let whole = scrub(&srv).await;
    assert!(whole.corrupt.is_empty() && whole.missing.is_empty(), "{whole:?}");
    assert_eq!(whole.checked_blobs, n);
    let (mut blobs, mut chunks) = (0, 0);
    for k in 1..=5 {
        let opts = ScrubOpts { subset: Some((k, 5)), ..Default::default() };
        let part = run_scrub_once(&srv.state.jobs, &opts).await.unwrap();
        assert!(part.corrupt.is_empty() && part.missing.is_empty());
        blobs += part.checked_blobs;
        chunks += part.checked_chunks;
    }
    assert_eq!((blobs, chunks), (whole.checked_blobs, whole.checked_chunks));
    srv.stop().await;
}
