//! Uploads against retention, as an operator runs them: several replicas on one database and
//! one blob store, retention every second with a grace of one second on the real clock, twelve
//! writers with short and long TTLs, re-uploads of shared content and unique bodies. Every
//! upload that was acknowledged with a long TTL must read back, whole, while its reference
//! lives; no upload may be refused because someone was deleting the same content.
//!
//! The run stops on a count of acknowledged uploads (`SPILLWAY_STRESS_UPLOADS`, default 3,000),
//! not on a time, so a slow machine still reaches the throughput at which losses showed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::{Rng, RngCore, SeedableRng};
use reqwest::{Method, StatusCode};
use spillway_api::Digest;
use spillway_client::StoreClient;

use crate::support::*;

/// Shared bodies: re-uploaded again and again, with every TTL.
const SHARED: usize = 20;
const SHARED_SIZE: usize = 64 << 10;
/// Unique bodies: 1 B to 256 KiB (both inline and stored as objects).
const UNIQUE_MAX: usize = 256 << 10;
const WRITERS: usize = 12;
const TTLS: [u64; 3] = [1, 2, 30];
/// The long TTL whose uploads are checked at the end.
const LONG: u64 = 30;
/// How long after the last upload the check starts, and how much life a reference must have
/// left for it to be checked.
const SETTLE: Duration = Duration::from_secs(3);

fn target() -> u64 {
    std::env::var("SPILLWAY_STRESS_UPLOADS").ok().and_then(|v| v.parse().ok()).unwrap_or(3_000)
}

/// A body the test can make again from its seed (so nothing large is kept in memory).
fn body(seed: u64) -> Bytes {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let size = if seed < SHARED as u64 { SHARED_SIZE } else { rng.random_range(1..=UNIQUE_MAX) };
    let mut data = vec![0u8; size];
    rng.fill_bytes(&mut data);
    // Half the unique bodies are text with lines, like tool output.
    if seed.is_multiple_of(2) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = if i % 61 == 60 { b'\n' } else { b'a' + (*b % 26) };
        }
    }
    Bytes::from(data)
}

/// One acknowledged upload with the long TTL: the body's seed, and when the request started
/// (its reference lives at least `LONG` seconds from then).
#[derive(Debug, Clone, Copy)]
struct Acked {
    seed: u64,
    started: Instant,
}

/// What the writers saw.
#[derive(Debug, Default)]
struct Tally {
    acked: AtomicU64,
    refused: AtomicU64,
    failed: Mutex<Vec<String>>,
    long: Mutex<Vec<Acked>>,
}

/// One upload, with no retry: a `503` is counted, not hidden.
async fn upload(client: &StoreClient, data: Bytes, ttl: u64) -> Result<(), (StatusCode, String)> {
    let path = format!("/v1/blobs/{}", Digest::of(&data));
    let resp = client
        .request(Method::PUT, &path)
        .query(&[("ttl", ttl.to_string())])
        .body(data)
        .send()
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, format!("transport: {e}")))?;
    match resp.status() {
        StatusCode::OK | StatusCode::CREATED => Ok(()),
        status => Err((status, resp.text().await.unwrap_or_default())),
    }
}

/// Runs the writers against `clients` (one per replica) until `target` uploads were
/// acknowledged, then checks every long-lived one. Returns (acknowledged, checked).
pub(crate) async fn upload_against_retention(clients: Vec<StoreClient>, target: u64) -> (u64, usize) {
    let tally = Arc::new(Tally::default());
    let next_unique = Arc::new(AtomicU64::new(SHARED as u64));
    let began = Instant::now();
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (clients, tally, next_unique) = (clients.clone(), tally.clone(), next_unique.clone());
            tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(1000 + w as u64);
                while tally.acked.load(Ordering::Relaxed) < target {
                    let seed = if rng.random_bool(0.6) {
                        rng.random_range(0..SHARED as u64)
                    } else {
                        next_unique.fetch_add(1, Ordering::Relaxed)
                    };
                    let ttl = TTLS[rng.random_range(0..TTLS.len())];
                    let via = &clients[rng.random_range(0..clients.len())];
                    let started = Instant::now();
                    match upload(via, body(seed), ttl).await {
                        Ok(()) => {
                            tally.acked.fetch_add(1, Ordering::Relaxed);
                            if ttl == LONG {
                                tally.long.lock().unwrap().push(Acked { seed, started });
                            }
                        }
                        Err((StatusCode::SERVICE_UNAVAILABLE, m)) => {
                            tally.refused.fetch_add(1, Ordering::Relaxed);
                            tally.failed.lock().unwrap().push(format!("503 for seed {seed}: {m}"));
                        }
                        Err((status, m)) => tally.failed.lock().unwrap().push(format!("{status} for seed {seed}: {m}")),
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let uploading = began.elapsed();
    tokio::time::sleep(SETTLE).await; // retention keeps running on the real clock meanwhile
    let checked_at = Instant::now();
    let mut check: Vec<Acked> = tally.long.lock().unwrap().clone();
    // The latest acknowledged upload of each body; only those with life left are checked.
    check.sort_by_key(|a| (a.seed, std::cmp::Reverse(a.started)));
    check.dedup_by_key(|a| a.seed);
    check.retain(|a| a.started + Duration::from_secs(LONG) >= checked_at + SETTLE);
    let mut lost = Vec::new();
    for (i, a) in check.iter().enumerate() {
        let data = body(a.seed);
        let via = &clients[i % clients.len()];
        match via.get(&Digest::of(&data)).await {
            Ok(resp) => {
                let got = resp.bytes().await.unwrap();
                if got != data {
                    lost.push(format!("seed {} read back {} bytes, not its {}", a.seed, got.len(), data.len()));
                }
            }
            Err(e) => lost.push(format!(
                "seed {} ({} bytes, acknowledged {:.2} s into the run): {e}",
                a.seed,
                data.len(),
                (a.started - began).as_secs_f64()
            )),
        }
    }
    let acked = tally.acked.load(Ordering::Relaxed);
    let refused = tally.refused.load(Ordering::Relaxed);
    let failed = tally.failed.lock().unwrap().clone();
    eprintln!(
        "stress: {acked} uploads acknowledged in {:.1} s, {refused} refused, {} failed otherwise; \
         {} long-lived blobs checked, {} lost",
        uploading.as_secs_f64(),
        failed.len() - refused as usize,
        check.len(),
        lost.len()
    );
    assert!(lost.is_empty(), "{} acknowledged blobs lost, e.g. {:#?}", lost.len(), &lost[..lost.len().min(10)]);
    assert!(failed.is_empty(), "{} uploads failed, e.g. {:#?}", failed.len(), &failed[..failed.len().min(10)]);
    assert!(!check.is_empty(), "some long-lived uploads were checked");
    (acked, check.len())
}

/// Three replicas (on the embedded backend, three servers on one SQLite file and one blob
/// directory), each running retention every second with a grace of one second.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uploads_survive_retention_on_every_replica() {
    let a = TestServer::start_with(|c| {
        c.retention_interval = Duration::from_secs(1);
        c.retention_grace = Duration::from_secs(1);
    })
    .await;
    let b = a.replica().await;
    let c = a.replica().await;
    let clients: Vec<StoreClient> = [&a, &b, &c].iter().map(|s| s.client()).collect();
    upload_against_retention(clients, target()).await;
    for s in [a, b, c] {
        s.stop().await;
    }
}

/// The same on chunks: every replica also compacts (every 200 ms, blobs of any age), so that
/// uploads, re-uploads of compacted content, deletions of compacted blobs and of packs, and
/// compactions all meet; one replica holds the compaction lease at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uploads_survive_retention_and_compaction_on_every_replica() {
    let a = TestServer::start_with(|c| {
        c.retention_interval = Duration::from_secs(1);
        c.retention_grace = Duration::from_secs(1);
        c.compact_after = Duration::ZERO;
        c.compact_interval = Duration::from_millis(200);
        c.compaction_lease = Duration::from_secs(2);
    })
    .await;
    let b = a.replica().await;
    let c = a.replica().await;
    let clients: Vec<StoreClient> = [&a, &b, &c].iter().map(|s| s.client()).collect();
    upload_against_retention(clients, target()).await;
    let stats = a.state.db.storage_stats().await.unwrap();
    eprintln!("stress with compaction: {stats:?}");
    for s in [a, b, c] {
        s.stop().await;
    }
}

/// `spillway-server retention --retention-grace 0` on the test server's database and blob
/// store, as an operator's retention job runs it: a process of its own.
fn retention_job(srv: &TestServer) -> std::process::Command {
    let config = srv.config();
    let mut cmd = std::process::Command::new(crate::support::server_binary());
    cmd.arg("retention").arg("--retention-grace").arg("0").arg("--data-dir").arg(&config.data_dir);
    cmd.env_remove("SPILLWAY_DATABASE_URL").env_remove("SPILLWAY_BLOB_STORE").env("RUST_LOG", "warn");
    if let Some(url) = &config.database_url {
        cmd.arg("--database-url").arg(url);
    }
    if let Some(store) = &config.blob_store {
        cmd.arg("--blob-store").arg(store);
    }
    for (k, v) in &config.s3_options {
        cmd.env(k.to_uppercase(), v); // aws_endpoint → AWS_ENDPOINT, …
    }
    cmd
}

/// Re-uploads of a few bodies with a one-second TTL while a separate retention process runs
/// pass after pass with no grace, so that uploads keep meeting deletions of their own content
/// (claimed, bytes going, row going); long-lived uploads mixed in. No upload is refused or
/// waits for the job; every long-lived one reads back; the job never fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uploads_survive_a_separate_retention_process() {
    let srv = TestServer::start().await;
    let rounds: usize = std::env::var("SPILLWAY_STRESS_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(150);
    // Each body comes back about every 1.5 s (150 bodies, 4 writers, one upload each 40 ms):
    // just after its one-second reference expired, when the job is collecting it.
    let bodies: Vec<Bytes> = (0..150usize).map(|i| Bytes::from(format!("body {i}\n").repeat(5_000))).collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let job = {
        let (stop, mut cmd) = (stop.clone(), retention_job(&srv));
        tokio::task::spawn_blocking(move || {
            let (mut passes, mut deleted) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                let out = cmd.output().expect("run the retention job");
                let said = String::from_utf8_lossy(&out.stdout).into_owned();
                assert!(
                    out.status.success(),
                    "the retention job failed: {said} {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let summary: serde_json::Value = serde_json::from_str(said.trim()).expect("one JSON line");
                deleted += summary["blobs_deleted"].as_u64().unwrap_or(0);
                passes += 1;
            }
            (passes, deleted)
        })
    };
    let writers: Vec<_> = (0..4usize)
        .map(|w| {
            let (c, bodies) = (srv.client(), bodies.clone());
            tokio::spawn(async move {
                let (mut kept, mut failed) = (Vec::new(), Vec::new());
                for round in 0..rounds {
                    let long = round % 10 == 9;
                    let data = if long {
                        Bytes::from(format!("kept {w} {round}\n").repeat(5_000))
                    } else {
                        bodies[(round * 4 + w) % bodies.len()].clone()
                    };
                    tokio::time::sleep(Duration::from_millis(40)).await; // the workload's pace
                    match upload(&c, data.clone(), if long { 3600 } else { 1 }).await {
                        Ok(()) if long => kept.push(data),
                        Ok(()) => {}
                        Err((status, m)) => failed.push(format!("{status}: {m}")),
                    }
                }
                (kept, failed)
            })
        })
        .collect();
    let (mut kept, mut failed) = (Vec::new(), Vec::new());
    for w in writers {
        let (k, f) = w.await.unwrap();
        kept.extend(k);
        failed.extend(f);
    }
    stop.store(true, Ordering::Relaxed);
    let (passes, deleted) = job.await.unwrap();
    eprintln!(
        "separate retention: {} uploads, {passes} passes of the job deleting {deleted} blobs, {} refused; took back {:?}",
        rounds * 4,
        failed.len(),
        srv.state.blobs.probes.took_back,
    );
    assert!(failed.is_empty(), "{} uploads refused, e.g. {:?}", failed.len(), &failed[..failed.len().min(5)]);
    assert!(deleted > 0, "the job deleted content while the uploads ran");
    let c = srv.client();
    for data in &kept {
        let got = c.get(&Digest::of(data)).await.unwrap_or_else(|e| panic!("a long-lived upload was lost: {e}"));
        assert_eq!(&got.bytes().await.unwrap(), data);
    }
    srv.stop().await;
}
