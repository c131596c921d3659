//! Storage v2 through the real server: compacted blobs read exactly as raw ones (GET, Range,
//! pages, grep, both digests), chunks shared across blobs and namespaces with nothing visible,
//! retention of one of two blobs that share chunks, packs going once nothing needs them, and a
//! data directory written before storage v2 opened and compacted.

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use reqwest::Method;
use spillway_client::{GrepRequest, ReadRequest, StoreClient, UploadOptions};

use crate::support::{Clients, TestServer, ALL};

fn ttl(secs: u64) -> UploadOptions {
    UploadOptions { ttl: Some(secs), ..Default::default() }
}

/// A log of `n` bytes: lines of text with some non-ASCII (characters across chunk and page
/// edges), now and then a long line and bytes that are not UTF-8.
fn log(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n + 200);
    let mut line = 0u64;
    while out.len() < n {
        line += 1;
        match rng.random_range(0..100) {
            0 => out.extend(std::iter::repeat_n(b'x', rng.random_range(1000..300_000))),
            1 => out.extend((0..rng.random_range(1..64)).map(|_| rng.random::<u8>())),
            2..=10 => out.extend_from_slice(format!("line {line}: données €{} 😀\n", rng.random::<u32>()).as_bytes()),
            _ => out.extend_from_slice(format!("2026-12-02T06:{:02}:00Z INFO step {line} ok\n", line % 60).as_bytes()),
        }
        if out.last() != Some(&b'\n') && rng.random_bool(0.5) {
            out.push(b'\n');
        }
    }
    out.truncate(n);
    out
}

async fn get(c: &StoreClient, path: &str, range: Option<&str>) -> (u16, Bytes) {
    let mut req = c.request(Method::GET, path);
    if let Some(r) = range {
        req = req.header("Range", r);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.bytes().await.unwrap())
}

/// Every way of reading a blob, by its answers, for comparing before and after compaction.
async fn answers(c: &StoreClient, rec: &spillway_api::BlobRecord, seed: u64) -> Vec<String> {
    let d = rec.digest;
    let mut out = Vec::new();
    for path in [format!("/v1/blobs/{d}"), format!("/v1/blobs/{}", rec.sha256)] {
        let (status, body) = get(c, &path, None).await;
        out.push(format!("GET {status} {}", blake3::hash(&body)));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let size = rec.size;
    for _ in 0..12 {
        let a = rng.random_range(0..size.max(1));
        let b = rng.random_range(a..size.max(1));
        for r in [format!("bytes={a}-{b}"), format!("bytes={a}-"), format!("bytes=-{}", b - a + 1)] {
            let (status, body) = get(c, &format!("/v1/blobs/{d}"), Some(&r)).await;
            out.push(format!("{r} {status} {}", blake3::hash(&body)));
        }
    }
    for _ in 0..10 {
        let offset = rng.random_range(0..=size);
        let limit = [1, 2, 3, 7, 4096, 100_000][rng.random_range(0..6)];
        let p = c.read(d, ReadRequest::Bytes { offset, limit: Some(limit) }).await.unwrap();
        out.push(serde_json::to_string(&p).unwrap());
        let line = rng.random_range(1..=rec.lines.max(1));
        let p = c.read(d, ReadRequest::Lines { line, lines: Some(rng.random_range(1..3000)) }).await.unwrap();
        out.push(serde_json::to_string(&p).unwrap());
    }
    // The same page twice: the text cache answers the second.
    for _ in 0..2 {
        let p = c.read(d, ReadRequest::Bytes { offset: size / 2, limit: None }).await.unwrap();
        out.push(serde_json::to_string(&p).unwrap());
    }
    for pattern in ["step 1[0-9]{2} ok", "€", "x{100}"] {
        let g = GrepRequest { pattern: pattern.into(), max_matches: Some(50), ..Default::default() };
        out.push(serde_json::to_string(&c.grep(d, &g).await.unwrap()).unwrap());
    }
    out
}

#[tokio::test]
async fn compacted_blobs_read_exactly_as_they_did_raw() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let mut recs = Vec::new();
    for (i, n) in [70_000usize, 300_000, 2_500_000, 5_000_000].into_iter().enumerate() {
        let data = log(n, i as u64);
        recs.push((c.put(Bytes::from(data), &ttl(3600)).await.unwrap(), i as u64));
    }
    let mut before = Vec::new();
    for (rec, seed) in &recs {
        before.push(answers(&c, rec, *seed).await);
    }
    let s = srv.compact().await;
    assert_eq!(s.blobs_compacted, 4, "{s:?}");
    assert!(srv.stored_under("blobs").is_empty(), "the raw copies are gone: {:?}", srv.stored_under("blobs"));
    for ((rec, seed), want) in recs.iter().zip(&before) {
        assert_eq!(&answers(&c, rec, *seed).await, want, "{}", rec.digest);
    }
    // A second server (a replica, or a restart) reads them too, with empty caches.
    let other = srv.replica().await;
    let oc = other.client();
    for ((rec, seed), want) in recs.iter().zip(&before) {
        assert_eq!(&answers(&oc, rec, *seed).await, want);
    }
    assert_eq!(srv.compact().await.blobs_compacted, 0, "nothing left to compact");
    let metrics = reqwest::get(format!("{}/metrics", srv.metrics_url)).await.unwrap().text().await.unwrap();
    for gauge in ["spillway_stored_bytes", "spillway_logical_bytes"] {
        assert!(metrics.lines().any(|l| l.starts_with(&format!("{gauge} "))), "{gauge} on the metrics listener");
    }
    other.stop().await;
    srv.stop().await;
}

/// Outputs that share most of their bytes (a re-run, a log saved as it grows) share chunks,
/// across namespaces too, and nothing in the answers differs from a blob that shares nothing.
#[tokio::test]
async fn shared_chunks_are_stored_once_and_show_nowhere() {
    let srv = TestServer::start().await;
    let (a, b) = (srv.client(), srv.client_for("ns-b", ALL).await);
    let base = log(3_000_000, 9);
    let mut grown = base.clone();
    grown.extend_from_slice(&log(500_000, 10));
    let mut rerun = base.clone();
    rerun.splice(1_000_000..1_000_020, b"a different line here\n".iter().copied());
    let ra = a.put(Bytes::from(base.clone()), &ttl(3600)).await.unwrap();
    let rb = b.put(Bytes::from(grown.clone()), &ttl(3600)).await.unwrap();
    let rc = b.put(Bytes::from(rerun.clone()), &ttl(3600)).await.unwrap();
    let stats = |srv: &TestServer| {
        let db = srv.state.db.clone();
        async move { db.storage_stats().await.unwrap() }
    };
    let raw = stats(&srv).await;
    assert_eq!(raw.stored_bytes, raw.logical_bytes, "raw, every byte is stored: {raw:?}");
    let s = srv.compact().await;
    let after = stats(&srv).await;
    assert_eq!(after.logical_bytes, raw.logical_bytes);
    // The two later outputs add only their new chunks: far less than their size.
    assert!(after.stored_bytes * 5 < after.logical_bytes, "{after:?} {s:?}");
    for (c, rec, data) in [(&a, &ra, &base), (&b, &rb, &grown), (&b, &rc, &rerun)] {
        let (status, body) = get(c, &format!("/v1/blobs/{}", rec.digest), None).await;
        assert_eq!((status, &body[..]), (200, &data[..]));
    }
    // The same upload again, into a namespace with no copy: the same answer as before compaction.
    let again = a.put(Bytes::from(grown.clone()), &ttl(3600)).await.unwrap();
    assert_eq!((again.deduplicated, again.size, again.lines), (false, rb.size, rb.lines));
    srv.stop().await;
}

/// Retention deletes one of two blobs that share chunks: the other stays whole; once neither
/// needs a pack, it goes.
#[tokio::test]
async fn deleting_one_of_two_blobs_that_share_chunks_keeps_the_other_whole() {
    let srv = TestServer::start_with(|c| c.retention_grace = std::time::Duration::ZERO).await;
    let c = srv.client();
    let first = log(2_000_000, 1);
    let mut second = first.clone();
    second.extend_from_slice(b"one more line\n");
    let r1 = c.put(Bytes::from(first.clone()), &ttl(10)).await.unwrap();
    let r2 = c.put(Bytes::from(second.clone()), &ttl(1000)).await.unwrap();
    srv.compact().await;
    let packs = srv.stored_under("packs").len();
    assert!(packs >= 1);
    srv.clock.advance_secs(20);
    let s = srv.retention().await;
    assert_eq!(s.blobs_deleted, 1, "{s:?}");
    // At most the pack of the first blob's own last chunk goes: the shared ones stay.
    assert!(s.packs_deleted < packs as u64 && s.pack_bytes_freed < 100_000, "{s:?}");
    let (status, body) = get(&c, &format!("/v1/blobs/{}", r2.digest), None).await;
    assert_eq!((status, &body[..]), (200, &second[..]));
    assert_eq!(get(&c, &format!("/v1/blobs/{}", r1.digest), None).await.0, 404);
    srv.clock.advance_secs(2000);
    let t = srv.retention().await;
    assert_eq!((t.blobs_deleted, s.packs_deleted + t.packs_deleted), (1, packs as u64), "{t:?}");
    assert!(srv.stored_under("packs").is_empty());
    let st = srv.state.db.storage_stats().await.unwrap();
    assert_eq!((st.stored_bytes, st.logical_bytes, st.blobs), (0, 0, 0));
    srv.stop().await;
}

/// Content uploaded again after its compaction, and content deleted then uploaded again and
/// compacted again, read back whole.
#[tokio::test]
async fn compaction_meets_uploads_and_deletions_of_the_same_content() {
    let srv = TestServer::start_with(|c| c.retention_grace = std::time::Duration::ZERO).await;
    let c = srv.client();
    let data = log(1_500_000, 4);
    let rec = c.put(Bytes::from(data.clone()), &ttl(5)).await.unwrap();
    srv.compact().await;
    // Again, while compacted: on disk its raw copy comes back (the same work as any upload;
    // on S3 the direct upload is not completed), and goes at the next pass.
    assert!(c.put(Bytes::from(data.clone()), &ttl(5)).await.unwrap().deduplicated);
    let s = srv.retention().await;
    assert_eq!(s.raw_copies_deleted, u64::from(!crate::support::is_remote()), "{s:?}");
    assert!(srv.stored_under("blobs").is_empty());
    assert_eq!(&get(&c, &format!("/v1/blobs/{}", rec.digest), None).await.1[..], &data[..]);
    // Expired and deleted, its packs gone; uploaded again, raw; compacted again.
    srv.clock.advance_secs(10);
    let s = srv.retention().await;
    assert!(s.blobs_deleted == 1 && s.packs_deleted >= 1, "{s:?}");
    c.put(Bytes::from(data.clone()), &ttl(3600)).await.unwrap();
    assert_eq!(&get(&c, &format!("/v1/blobs/{}", rec.digest), None).await.1[..], &data[..]);
    assert_eq!(srv.compact().await.blobs_compacted, 1);
    let p = c.read(rec.digest, ReadRequest::Bytes { offset: 700_000, limit: Some(5000) }).await.unwrap();
    assert_eq!(
        p.content.as_bytes(),
        &data[700_000..700_000 + p.length as usize][..p.content.len().min(p.length as usize)]
    );
    assert_eq!(&get(&c, &format!("/v1/blobs/{}", rec.digest), None).await.1[..], &data[..]);
    srv.stop().await;
}

/// A data directory written by the server before storage v2 opens with today's binary: its
/// blobs read back exact, raw, then compacted.
#[tokio::test]
async fn a_v1_data_directory_opens_and_compacts() {
    if crate::support::is_remote() {
        return; // the fixture is a SQLite + disk directory
    }
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/v1-data");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    copy_dir(&fixture, &data);
    let manifest: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(fixture.with_extension("json")).unwrap()).unwrap();
    let config = spillway_server::Config::new(&data);
    let state = spillway_server::build_state(config, std::sync::Arc::new(spillway_server::clock::SystemClock))
        .await
        .expect("today's binary opens the old directory");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let s = state.clone();
    let server = tokio::spawn(async move { spillway_server::serve(listener, s, std::future::pending()).await });
    let token = std::fs::read_to_string(data.join("token")).unwrap();
    let c = StoreClient::new(&url, token.trim());
    let check = |c: StoreClient, manifest: Vec<serde_json::Value>| async move {
        for m in &manifest {
            let d = m["digest"].as_str().unwrap();
            let (status, body) = get(&c, &format!("/v1/blobs/{d}"), None).await;
            assert_eq!(status, 200, "{d}");
            assert_eq!(format!("blake3:{}", blake3::hash(&body)), d);
            assert_eq!(body.len() as u64, m["size"].as_u64().unwrap());
            let rec = c.stat(d.parse::<spillway_api::AnyDigest>().unwrap()).await.unwrap();
            assert_eq!(rec.lines, m["lines"].as_u64().unwrap());
            let (_, by_sha) = get(&c, &format!("/v1/blobs/{}", m["sha256"].as_str().unwrap()), None).await;
            assert_eq!(by_sha, body);
        }
    };
    check(c.clone(), manifest.clone()).await;
    let s =
        spillway_server::jobs::compaction::run_compaction_once(&state.jobs, std::time::Duration::ZERO).await.unwrap();
    assert_eq!(s.blobs_compacted, 3, "the three blobs stored as files; the small one stays inline: {s:?}");
    check(c, manifest).await;
    server.abort();
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let dest = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), &dest).unwrap();
        }
    }
}
