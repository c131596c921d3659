//! Three replicas on one PostgreSQL database and one S3 bucket, a mixed workload through all
//! three while retention runs on all three in a loop with short TTLs and no grace; at the end
//! every reference the workload was told is live reads back byte for byte.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use spillway_api::Digest;
use spillway_client::{ReadRequest, StoreClient, UploadOptions};

use crate::support::*;

fn content(i: usize) -> Bytes {
    let line = format!("content {i}: {}\n", "x".repeat(i * 7 % 100));
    Bytes::from(line.repeat(1 + (i * 5_000) % 40_000))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_mixed_workload_with_retention() {
    // On PostgreSQL + S3 as deployed; on the embedded backend, three servers share one SQLite
    // file and one blob directory, which the same invariants must survive.
    let a = TestServer::start_with(|c| c.retention_grace = Duration::ZERO).await;
    let b = a.replica().await;
    let c = a.replica().await;
    let clients: Vec<StoreClient> = [&a, &b, &c].iter().map(|s| s.client()).collect();
    let states = vec![a.state.clone(), b.state.clone(), c.state.clone()];
    let stop = Arc::new(AtomicBool::new(false));

    // Retention on all three replicas at once; time moves a second with every upload (not with
    // the wall clock), so short TTLs expire while the workload runs however slow the machine.
    let mut background = Vec::new();
    for st in states.clone() {
        let stop = stop.clone();
        background.push(tokio::spawn(async move {
            let mut deleted = 0;
            while !stop.load(Ordering::Relaxed) {
                deleted +=
                    spillway_server::run_retention_once(&st.jobs, false).await.expect("retention pass").blobs_deleted;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            deleted
        }));
    }

    // Uploads of the same and different content through all three, short and long TTLs.
    let mut workers = Vec::new();
    for w in 0..6usize {
        let clients = clients.clone();
        let clock = a.clock.clone();
        workers.push(tokio::spawn(async move {
            let mut live = Vec::new();
            for op in 0..40usize {
                let i = (w * 7 + op * 3) % 9;
                let data = content(i);
                let via = &clients[(w + op) % 3];
                let long = (w + op) % 3 == 0;
                let opts = UploadOptions { ttl: Some(if long { 3600 } else { 1 }), ..Default::default() };
                let rec = via.put(data.clone(), &opts).await.expect("upload");
                clock.advance_secs(1);
                assert_eq!(rec.digest, Digest::of(&data));
                if long {
                    // Read back at once through another replica.
                    let other = &clients[(w + op + 1) % 3];
                    let got = other.get(&rec.digest).await.expect("visible on another replica");
                    assert_eq!(got.bytes().await.unwrap(), data);
                    live.push((rec.digest, data));
                }
            }
            live
        }));
    }

    // A stream appended through two replicas and long-polled through the third.
    let sid = clients[0].create_stream(&UploadOptions::default()).await.unwrap().id;
    let reader = clients[2].clone();
    let rid = sid.clone();
    let tail = tokio::spawn(async move {
        let mut got = String::new();
        while got.len() < 40 * 6 {
            let p = reader
                .read_stream(&rid, ReadRequest::Bytes { offset: got.len() as u64, limit: None }, Some(5_000))
                .await
                .unwrap();
            got.push_str(&p.content);
        }
        got
    });
    let mut expected = String::new();
    for k in 0..40 {
        let piece = format!("{k:05}\n");
        let via = &clients[k % 2];
        via.append(&sid, expected.len() as u64, Bytes::from(piece.clone())).await.unwrap();
        // A retried append through the other replica is a no-op.
        clients[(k + 1) % 2].append(&sid, expected.len() as u64, Bytes::from(piece.clone())).await.unwrap();
        expected.push_str(&piece);
    }
    assert_eq!(tokio::time::timeout(Duration::from_secs(30), tail).await.unwrap().unwrap(), expected);

    let mut live = Vec::new();
    for w in workers {
        live.extend(w.await.unwrap());
    }
    let sealed = clients[1].seal(&sid).await.unwrap();
    stop.store(true, Ordering::Relaxed);
    let mut deleted = 0;
    for t in background {
        deleted += t.await.unwrap();
    }
    assert!(deleted > 0, "retention collected blobs while the workload ran");
    // One more pass on every replica; then everything told live reads back through each.
    for st in &states {
        spillway_server::run_retention_once(&st.jobs, false).await.unwrap();
    }
    assert!(!live.is_empty());
    for (digest, data) in &live {
        for cl in &clients {
            let got = cl.get(digest).await.unwrap_or_else(|e| panic!("{digest} lost: {e}"));
            assert_eq!(&got.bytes().await.unwrap(), data);
        }
    }
    let got = clients[0].get(&sealed.digest).await.unwrap().bytes().await.unwrap();
    assert_eq!(got, expected);
    for s in [a, b, c] {
        s.stop().await;
    }
}
