//! Retention: TTLs, pins, blobs shared between namespaces, grace, and the race between an
//! upload that deduplicates and the collection of the same blob.

use std::time::Duration;

use bytes::Bytes;
use spillway_api::Digest;
use spillway_client::UploadOptions;

use crate::support::*;

/// The blob's row is there (its bytes are, inline or as an object, whenever the row is).
async fn is_stored(srv: &TestServer, data: &[u8]) -> bool {
    let d = Digest::of(data);
    let row = srv.state.db.blob_row(&d).await.unwrap();
    match row {
        Some(r) if r.inline_data.is_none() => srv.state.blobs.store.exists(&d).await.unwrap(),
        Some(_) => true,
        None => false,
    }
}

fn ttl(secs: u64) -> UploadOptions {
    UploadOptions { ttl: Some(secs), ..Default::default() }
}

#[tokio::test]
async fn ttl_pins_and_shared_blobs() {
    let srv = TestServer::start_with(|c| c.retention_grace = Duration::from_secs(60)).await;
    let a = srv.client();
    let b = srv.client_for("ns-b", ALL).await;
    let shared = Bytes::from_static(b"shared between namespaces\n");
    let pinned = Bytes::from_static(b"incident evidence\n");
    let lone = Bytes::from_static(b"short lived\n");
    a.put(shared.clone(), &ttl(10)).await.unwrap();
    b.put(shared.clone(), &ttl(100)).await.unwrap();
    let p = a.put(pinned.clone(), &ttl(10)).await.unwrap();
    a.pin(&p.digest, Some("INC-1")).await.unwrap();
    a.put(lone.clone(), &ttl(10)).await.unwrap();
    let dry = spillway_server::run_retention_once(&srv.state.jobs, true).await.unwrap();
    assert_eq!(dry.references_expired, 0);

    srv.clock.advance_secs(11);
    // Expired references are invisible at once, before any pass.
    assert_eq!(a.head(&Digest::of(&lone)).await.unwrap(), None);
    let dry = spillway_server::run_retention_once(&srv.state.jobs, true).await.unwrap();
    assert_eq!(dry.references_expired, 3);
    let s = srv.retention().await;
    assert_eq!((s.references_expired, s.blobs_deleted), (3, 0), "grace keeps the bytes");
    assert_eq!(a.head(&Digest::of(&shared)).await.unwrap(), None);
    assert_eq!(b.head(&Digest::of(&shared)).await.unwrap(), Some(shared.len() as u64));
    assert!(a.head(&p.digest).await.unwrap().is_some(), "pinned");

    srv.clock.advance_secs(61);
    let s = srv.retention().await;
    assert_eq!(s.blobs_deleted, 1, "only the lone blob: shared is still B's, the pin never expires");
    assert_eq!(s.bytes_freed, lone.len() as u64);
    assert!(!is_stored(&srv, &lone).await);
    assert!(is_stored(&srv, &shared).await);
    assert_eq!(b.get(&Digest::of(&shared)).await.unwrap().bytes().await.unwrap(), shared);

    srv.clock.advance_secs(30); // t = 102 s: B's reference expired at 100 s; its grace runs to 160 s
    assert_eq!(srv.retention().await.blobs_deleted, 0);
    assert!(is_stored(&srv, &shared).await);
    srv.clock.advance_secs(59); // t = 161 s
    let s = srv.retention().await;
    assert_eq!(s.blobs_deleted, 1);
    assert!(!is_stored(&srv, &shared).await);
    assert!(a.head(&p.digest).await.unwrap().is_some(), "still pinned");
    // A second pass finds nothing more: deletion is idempotent.
    assert_eq!(srv.retention().await.blobs_deleted, 0);
    // Content that was collected can be uploaded again.
    a.put(lone.clone(), &ttl(10)).await.unwrap();
    assert_eq!(a.get(&Digest::of(&lone)).await.unwrap().bytes().await.unwrap(), lone);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_racing_collection_never_loses_bytes() {
    let srv = TestServer::start_with(|c| c.retention_grace = Duration::ZERO).await;
    let c = srv.client();
    for round in 0..40u32 {
        let data = Bytes::from(format!("round {round}\n").repeat(1000));
        c.put(data.clone(), &ttl(1)).await.unwrap();
        srv.clock.advance_secs(2);
        let st = srv.state.clone();
        let gc = tokio::spawn(async move { spillway_server::run_retention_once(&st.jobs, false).await.unwrap() });
        let up = c.put(data.clone(), &ttl(3600)).await;
        gc.await.unwrap();
        let rec = up.unwrap();
        // Whatever order they ran in, the live reference reads back byte for byte.
        let got = c.get(&rec.digest).await.unwrap().bytes().await.unwrap();
        assert_eq!(got, data, "round {round}");
        srv.retention().await;
        let got = c.get(&rec.digest).await.unwrap().bytes().await.unwrap();
        assert_eq!(got, data, "round {round}, after another pass");
    }
    srv.stop().await;
}

#[tokio::test]
async fn expired_streams_go() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let s = c.create_stream(&ttl(5)).await.unwrap();
    c.append(&s.id, 0, Bytes::from_static(b"abc")).await.unwrap();
    srv.clock.advance_secs(6);
    let sum = srv.retention().await;
    assert_eq!(sum.streams_expired, 1);
    assert!(c.stream_info(&s.id).await.unwrap_err().is_not_found());
    srv.stop().await;
}

/// Grace counts from the moment a blob lost its last reference — its expiry, or its delete —
/// not from the retention pass that noticed: grace 1 s means collected 1 s later, not 2.
#[tokio::test(flavor = "multi_thread")]
async fn grace_counts_from_the_moment_the_last_reference_went() {
    let srv = TestServer::start_with(|c| c.retention_grace = Duration::from_secs(1)).await;
    let c = srv.client();
    let expiring = Bytes::from(vec![b'e'; 100_000]);
    let deleted = Bytes::from(vec![b'd'; 100_000]);
    c.put(expiring.clone(), &ttl(1)).await.unwrap();
    c.put(deleted.clone(), &ttl(3600)).await.unwrap();
    c.delete(&Digest::of(&deleted)).await.unwrap(); // its grace starts now
                                                    // The real clock moves too, by milliseconds: the margins below are 400 ms and more.
    srv.clock.advance_ms(1_500); // the expiry was at +1 s (grace ends +2 s); the delete's grace ended at +1 s
    let s = srv.retention().await;
    assert_eq!(s.blobs_deleted, 1, "{s:?}");
    assert!(!is_stored(&srv, &deleted).await, "deleted 1.5 s ago with grace 1 s: collected");
    assert!(is_stored(&srv, &expiring).await, "expired 0.5 s ago: still in its grace");
    srv.clock.advance_ms(600); // +2.1 s
    let s = srv.retention().await;
    assert_eq!(s.blobs_deleted, 1, "{s:?}");
    assert!(!is_stored(&srv, &expiring).await, "expired 1.1 s ago with grace 1 s: collected");
    srv.stop().await;
}

/// Bytes with no metadata row — what a crash between publication and the row leaves — are
/// deleted by retention once older than the grace period, and never race an upload of the
/// same content: the sweep claims the digest with a `deleting` row first, and an upload of the
/// same content takes the row back (the sweep then leaves the bytes).
#[tokio::test(flavor = "multi_thread")]
async fn bytes_without_a_row_are_swept_after_the_grace_and_the_lease() {
    let srv = TestServer::start_with(|c| c.retention_grace = Duration::from_secs(60)).await;
    let c = srv.client();
    let orphan = Bytes::from(vec![b'o'; 100_000]);
    let d = Digest::of(&orphan);
    srv.state.blobs.store.plant(&d, orphan.clone()).await.unwrap();
    let kept = Bytes::from(vec![b'k'; 100_000]);
    c.put(kept.clone(), &ttl(3600)).await.unwrap();
    let s = srv.retention().await;
    assert_eq!(s.orphans_deleted, 0, "younger than the grace: kept");
    assert!(srv.state.blobs.store.exists(&d).await.unwrap());
    srv.clock.advance_secs(61);
    let s = srv.retention().await;
    assert_eq!(s.orphans_deleted, 0, "past the grace but younger than the deletion lease: maybe an upload in flight");
    srv.clock.advance_secs(srv.config().deletion_lease.as_secs() as i64);
    let s = srv.retention().await;
    assert_eq!((s.orphans_deleted, s.blobs_deleted), (1, 0), "{s:?}");
    assert!(s.bytes_freed >= orphan.len() as u64);
    assert!(!srv.state.blobs.store.exists(&d).await.unwrap());
    assert!(is_stored(&srv, &kept).await, "bytes with a row are never swept");

    // The race: the sweep has claimed the digest when an upload of the same bytes arrives.
    srv.state.blobs.store.plant(&d, orphan.clone()).await.unwrap();
    assert!(srv.state.db.claim_orphan(&d, srv.state.now()).await.unwrap());
    let rec = c.put(orphan.clone(), &ttl(3600)).await.expect("the upload takes the claimed content back");
    // The sweep's second phase finds the row live and referenced, and leaves the bytes.
    assert!(!spillway_server::jobs::retention::delete_claimed(&srv.state.jobs, &d).await.unwrap());
    assert_eq!(c.get(&rec.digest).await.unwrap().bytes().await.unwrap(), orphan);
    assert_eq!(
        c.stat(&rec.digest).await.unwrap().size,
        orphan.len() as u64,
        "the claim's placeholder row was rewritten"
    );
    assert!(srv.state.blobs.store.exists(&d).await.unwrap());
    srv.stop().await;
}

/// Many re-uploads of the same content while retention collects it, on a multi-threaded
/// runtime so that they truly overlap: each upload stores the bytes again or takes them back,
/// never refused (no 503, no retry needed), and the content reads back whole at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reuploads_during_collection_never_fail() {
    let srv = TestServer::start_with(|c| c.retention_grace = Duration::ZERO).await;
    let data = Bytes::from("collected and stored again\n".repeat(4000)); // not inline: a file or object
    let collector = {
        let (st, clock) = (srv.state.clone(), srv.clock.clone());
        tokio::spawn(async move {
            for _ in 0..60 {
                clock.advance_secs(2);
                spillway_server::run_retention_once(&st.jobs, false).await.unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    let uploaders: Vec<_> = (0..4)
        .map(|_| {
            let (c, data) = (srv.client(), data.clone());
            tokio::spawn(async move {
                for _ in 0..30 {
                    let path = format!("/v1/blobs/{}", Digest::of(&data));
                    let resp = c.request(reqwest::Method::PUT, &path).query(&[("ttl", "1")]).body(data.clone());
                    let resp = resp.send().await.unwrap();
                    assert!(
                        resp.status().is_success(),
                        "an upload racing collection failed: {}",
                        resp.text().await.unwrap()
                    );
                }
            })
        })
        .collect();
    for u in uploaders {
        u.await.unwrap();
    }
    collector.await.unwrap();
    // How often the rare branches ran here (the test below runs them on purpose).
    eprintln!("took back: {:?}", srv.state.blobs.probes.took_back);
    let c = srv.client();
    let rec = c.put(data.clone(), &ttl(3600)).await.unwrap();
    assert_eq!(c.get(&rec.digest).await.unwrap().bytes().await.unwrap(), data);
    srv.stop().await;
}

/// A re-upload links and unlinks a twin of the stored file before its directory fsync (so
/// that the fsync costs what a new blob's does); a crash between the two leaves the twin.
/// The next retention pass removes it and leaves the blob. (Local disk only: S3 has no twin.)
#[tokio::test(flavor = "multi_thread")]
async fn a_twin_name_a_crash_left_is_swept() {
    if is_remote() {
        return;
    }
    let srv = TestServer::start().await;
    let c = srv.client();
    let data = Bytes::from(vec![b't'; 100_000]);
    let rec = c.put(data.clone(), &ttl(3600)).await.unwrap();
    let hex = rec.digest.hex();
    let file = srv.blob_dir().join("blobs").join(&hex[..2]).join(&hex);
    let twin = file.with_extension("dedup");
    std::fs::hard_link(&file, &twin).unwrap();
    // A re-upload meanwhile finds the twin there and still answers.
    assert!(c.put(data.clone(), &ttl(3600)).await.unwrap().deduplicated);
    srv.retention().await;
    assert!(!twin.exists(), "the twin is gone");
    assert_eq!(c.get(&rec.digest).await.unwrap().bytes().await.unwrap(), data);
    srv.stop().await;
}

/// At the default, a pass lists 16 of the 256 key prefixes for bytes that have no row, the next
/// 16 each time: bytes left under prefix `p` go on pass `p / 16 + 1` of a round, not before.
#[tokio::test(flavor = "multi_thread")]
async fn the_sweep_for_leftovers_lists_a_sixteenth_of_the_store_a_pass() {
    let srv = TestServer::start_with(|c| {
        c.retention_grace = Duration::ZERO;
        c.sweep_prefixes = 16;
    })
    .await;
    let orphan = Bytes::from(vec![b'r'; 100_000]);
    let d = Digest::of(&orphan);
    srv.state.blobs.store.plant(&d, orphan).await.unwrap();
    srv.clock.advance_secs(srv.config().deletion_lease.as_secs() as i64 + 1);
    let due = usize::from(u8::from_str_radix(&d.hex()[..2], 16).unwrap()) / 16 + 1;
    for pass in 1..=16 {
        let s = srv.retention().await;
        let swept = !srv.state.blobs.store.exists(&d).await.unwrap();
        assert_eq!(swept, pass >= due, "pass {pass}: the leftover's prefix comes on pass {due}");
        if pass == due {
            assert_eq!(s.orphans_deleted, 1, "{s:?}");
        }
    }
    srv.stop().await;
}
