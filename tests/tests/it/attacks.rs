//! Attacks measured in time, each against the real server on loopback, with a probe from
//! another client. They measure the server, not the test runner: `scripts/test` runs them
//! alone, one at a time, in a step of their own (`cargo test --test it attacks -- --ignored
//! --test-threads=1`); the thresholds carry margins for a debug build on a busy machine.
//! They are also the scripts to rerun by hand after a change to the accept loop, the write
//! path or the heavy pool.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::Method;
use spillway_api::Digest;
use spillway_client::{ReadRequest, StoreClient, UploadOptions};

use crate::support::*;

/// The `q` quantile of `samples` (sorted in place).
fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * q).round() as usize]
}

/// Lets this process hold many sockets (the attacker's and the server's ends of each).
fn raise_descriptor_limit() {
    // SAFETY: getrlimit/setrlimit read and write the struct we pass; nothing else.
    unsafe {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Timed probes from a client of their own: `/healthz` and a capped read, one after the other.
async fn probe(srv: &TestServer, digest: Digest, rounds: usize) -> (Vec<Duration>, Vec<Duration>, usize) {
    let c = srv.client();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let (mut health, mut reads, mut failed) = (Vec::new(), Vec::new(), 0);
    for i in 0..rounds {
        let t = Instant::now();
        match http.get(format!("{}/healthz", srv.url)).send().await {
            Ok(r) if r.status().is_success() => health.push(t.elapsed()),
            Ok(r) => {
                eprintln!("probe: /healthz answered {} after {:?}", r.status(), t.elapsed());
                failed += 1;
            }
            Err(e) => {
                eprintln!("probe: /healthz failed after {:?}: {e:?}", t.elapsed());
                failed += 1;
            }
        }
        let t = Instant::now();
        let ask = ReadRequest::Bytes { offset: (i as u64 * 7919) % 1_000_000, limit: None };
        match c.read(digest, ask).await {
            Ok(_) => reads.push(t.elapsed()),
            Err(e) => {
                eprintln!("probe: capped read failed after {:?}: {e:?}", t.elapsed());
                failed += 1;
            }
        }
    }
    (health, reads, failed)
}

/// 5,000 connections from one attacker — idle, or with half a request head — reopened as the
/// server closes them: `/healthz` and an authenticated capped read from another client keep
/// their p99 under 100 ms, none failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "latency: run alone (scripts/test runs it in its own step)"]
async fn attacks_idle_connection_flood() {
    raise_descriptor_limit();
    let srv = TestServer::start().await;
    let text: String = (0..40_000).map(|i| format!("line {i} of a log an SRE pages through\n")).collect();
    let digest = srv.client().put(Bytes::from(text), &UploadOptions::default()).await.unwrap().digest;
    let addr = srv.url.trim_start_matches("http://").to_owned();
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // The attacker: a thread and a runtime of its own, as another process would be.
    let attacker = {
        let (stop, opened) = (stop.clone(), opened.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(flood(addr, stop, opened));
        })
    };
    eventually("the attacker holds its connections", || opened.load(Ordering::Relaxed) >= 5_000).await;
    let (mut health, mut reads, failed) = probe(&srv, digest, 400).await;
    stop.store(true, Ordering::Relaxed);
    tokio::task::spawn_blocking(move || attacker.join().unwrap()).await.unwrap();
    let (h99, r99) = (quantile(&mut health, 0.99), quantile(&mut reads, 0.99));
    eprintln!(
        "idle flood: {} connections opened by the attacker; healthz p50 {:?} p99 {h99:?}; capped read p50 {:?} p99 {r99:?}; {failed} failed",
        opened.load(Ordering::Relaxed),
        quantile(&mut health, 0.5),
        quantile(&mut reads, 0.5),
    );
    assert_eq!(failed, 0, "probes failed under the flood");
    assert!(h99 <= Duration::from_millis(100), "healthz p99 {h99:?}");
    assert!(r99 <= Duration::from_millis(100), "capped read p99 {r99:?}");
    srv.stop().await;
}

/// Holds 5,000 connections to `addr`, half of them idle and half with half a request head,
/// each reopened as soon as the server closes it, until `stop`.
async fn flood(addr: String, stop: Arc<AtomicBool>, opened: Arc<std::sync::atomic::AtomicUsize>) {
    let mut held = tokio::task::JoinSet::new();
    for k in 0..5_000usize {
        let (addr, stop, opened) = (addr.clone(), stop.clone(), opened.clone());
        held.spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut s) = tokio::net::TcpStream::connect(&addr).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                opened.fetch_add(1, Ordering::Relaxed);
                if k % 2 == 1 {
                    let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ").await; // and no more
                }
                let mut buf = [0u8; 64];
                // Held until the server closes it; then the attacker comes back.
                tokio::select! {
                    _ = s.read(&mut buf) => {}
                    () = async { while !stop.load(Ordering::Relaxed) { tokio::time::sleep(Duration::from_millis(100)).await } } => {}
                }
            }
        });
    }
    while held.join_next().await.is_some() {}
}

/// The area under the ROC curve of "slower means deduplicated": the chance that an upload of
/// content another namespace holds took longer than one of fresh content (ties count half).
/// 0.5 is no signal.
fn auc(dedup: &[Duration], fresh: &[Duration]) -> f64 {
    let mut wins = 0.0;
    for d in dedup {
        for f in fresh {
            wins += if d > f {
                1.0
            } else if d == f {
                0.5
            } else {
                0.0
            };
        }
    }
    wins / (dedup.len() * fresh.len()) as f64
}

/// One upload through a fresh connection's worth of work; its time.
async fn timed_put(c: &StoreClient, data: Bytes) -> Duration {
    let path = format!("/v1/blobs/{}", Digest::of(&data));
    let t = Instant::now();
    let resp = c.request(Method::PUT, &path).body(data).send().await.unwrap();
    assert!(resp.status().is_success());
    resp.bytes().await.unwrap();
    t.elapsed()
}

/// Namespace A uploads, interleaved, content nobody stores and content namespace B stores;
/// a classifier that tells them apart by time does no better than chance, whichever way it
/// leans, for small inline uploads and for uploads stored as files. The goal is AUC ≤ 0.55
/// for the better of a classifier and its inverse (0.45 ≤ AUC ≤ 0.55); it is asserted with a
/// margin of 0.02 for noise (chance alone varies by ±0.013 over 1,000 pairs, and the state of
/// the machine moves it: runs gave 0.455–0.515 at 2 KiB, the lowest the first run in a fresh
/// clone, and 0.497–0.514 at 64 KiB). Inline sizes from 256 B to 16 KiB: a re-upload writes
/// in place of its row a row of the same shape into a table of the same shape
/// (`db::blobs::echo_row`), so CPU and pages match each on its own; the padding it replaced
/// traded fewer pages for more CPU, a balance each machine moved (0.574 at 256 B in one CI run,
/// 0.592 at 16 KiB here the next day; now 0.517–0.536 over three runs, every size).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "latency: run alone (scripts/test runs it in its own step)"]
async fn attacks_dedup_timing_classifier() {
    let srv = TestServer::start().await;
    let (a, b) = (srv.client(), srv.client_for("ns-b", ALL).await);
    for size in [256, 2 << 10, 16 << 10, 64 << 10] {
        let body =
            |tag: &str, i: usize| Bytes::from(format!("{tag} {i} {}", "x".repeat(size)).into_bytes()[..size].to_vec());
        let rounds = 1000;
        for i in 0..rounds {
            b.put(body("held", i), &UploadOptions::default()).await.unwrap();
        }
        // Warm up the connection and the caches alike for both kinds.
        for i in 0..20 {
            timed_put(&a, body("warm", i)).await;
        }
        let (mut dedup, mut fresh) = (Vec::new(), Vec::new());
        for i in 0..rounds {
            if i % 2 == 0 {
                dedup.push(timed_put(&a, body("held", i)).await);
                fresh.push(timed_put(&a, body("fresh", i)).await);
            } else {
                fresh.push(timed_put(&a, body("fresh", i)).await);
                dedup.push(timed_put(&a, body("held", i)).await);
            }
        }
        let score = auc(&dedup, &fresh);
        eprintln!(
            "dedup timing, {size} B: AUC {score:.3}; p50 held {:?} fresh {:?}",
            quantile(&mut dedup, 0.5),
            quantile(&mut fresh, 0.5)
        );
        assert!(
            (0.43..=0.57).contains(&score),
            "uploads of content another namespace holds are told apart: AUC {score:.3}"
        );
    }
    srv.stop().await;
}

/// 16 clients grep a 100 MB blob, again and again, half for a pattern on every line and half
/// for one on none: `/healthz` and
/// capped reads from another client stay within twice their p99 without them (plus 5 ms for a
/// debug build's noise); greps past the pool's concurrency are told to retry (429), not queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "latency: run alone (scripts/test runs it in its own step)"]
async fn attacks_heavy_greps() {
    let srv = TestServer::start().await;
    let line = "2026-12-01T10:00:00Z worker-7 request 1234 served in 12 ms, status 200\n";
    let big = Bytes::from(line.repeat(100_000_000 / line.len()));
    let c = srv.client();
    let big_digest = c.put(big, &UploadOptions::default()).await.unwrap().digest;
    let text: String = (0..40_000).map(|i| format!("line {i} of a log an SRE pages through\n")).collect();
    let digest = c.put(Bytes::from(text), &UploadOptions::default()).await.unwrap().digest;
    let (mut h0, mut r0, failed) = probe(&srv, digest, 300).await;
    assert_eq!(failed, 0);
    let stop = Arc::new(AtomicBool::new(false));
    let too_many = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let answers = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // The greppers: a thread and a runtime of their own, as other clients' processes would be.
    let greppers = {
        let (c, stop, too_many, answers) = (srv.client(), stop.clone(), too_many.clone(), answers.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let greps: Vec<_> = (0..16)
                    .map(|k| {
                        let (c, stop, too_many, answers) = (c.clone(), stop.clone(), too_many.clone(), answers.clone());
                        tokio::spawn(async move {
                            let mut done = 0;
                            while !stop.load(Ordering::Relaxed) {
                                // A pattern on every line, and one on none (a scan of all 100 MB).
                                let pattern = if k % 2 == 0 { "served" } else { "never logged" };
                                let g = spillway_client::GrepRequest { pattern: pattern.into(), ..Default::default() };
                                match c.grep(big_digest, &g).await {
                                    Ok(_) => {
                                        done += 1;
                                        answers.fetch_add(1, Ordering::Relaxed);
                                    }
                                    Err(e) if api_code(&e).0 == 429 => {
                                        too_many.fetch_add(1, Ordering::Relaxed);
                                        tokio::time::sleep(Duration::from_millis(20)).await;
                                    }
                                    Err(e) => panic!("grep failed: {e}"),
                                }
                            }
                            done
                        })
                    })
                    .collect();
                let mut answered = 0;
                for g in greps {
                    answered += g.await.unwrap();
                }
                answered
            })
        })
    };
    eventually("the greps are running", || answers.load(Ordering::Relaxed) >= 16 || greppers.is_finished()).await;
    let (mut h1, mut r1, failed) = probe(&srv, digest, 300).await;
    stop.store(true, Ordering::Relaxed);
    let answered = tokio::task::spawn_blocking(move || greppers.join().unwrap()).await.unwrap();
    let (base_h, base_r) = (quantile(&mut h0, 0.99), quantile(&mut r0, 0.99));
    let (loaded_h, loaded_r) = (quantile(&mut h1, 0.99), quantile(&mut r1, 0.99));
    eprintln!(
        "heavy greps: {answered} answered, {} told to retry; healthz p99 {base_h:?} -> {loaded_h:?}; capped read p99 {base_r:?} -> {loaded_r:?}",
        too_many.load(Ordering::Relaxed)
    );
    assert_eq!(failed, 0);
    assert!(answered > 0, "greps ran");
    let margin = Duration::from_millis(5);
    assert!(loaded_h <= base_h * 2 + margin, "healthz p99 {base_h:?} -> {loaded_h:?}");
    assert!(loaded_r <= base_r * 2 + margin, "capped read p99 {base_r:?} -> {loaded_r:?}");
    srv.stop().await;
}
