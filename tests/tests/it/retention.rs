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
    let row = srv.state.db.blob_row(&d.hex()).await.unwrap();
    match row {
        Some(r) if r.inline_data.is_none() => srv.state.blobs.exists(&d).await.unwrap(),
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
    a.pin(&p.digest.to_string(), Some("INC-1")).await.unwrap();
    a.put(lone.clone(), &ttl(10)).await.unwrap();
    let dry = spillway_server::run_retention_once(&srv.state, true).await.unwrap();
    assert_eq!(dry.references_expired, 0);

    srv.clock.advance_secs(11);
    // Expired references are invisible at once, before any pass.
    assert_eq!(a.head(&Digest::of(&lone).to_string()).await.unwrap(), None);
    let dry = spillway_server::run_retention_once(&srv.state, true).await.unwrap();
    assert_eq!(dry.references_expired, 3);
    let s = srv.retention().await;
    assert_eq!((s.references_expired, s.blobs_deleted), (3, 0), "grace keeps the bytes");
    assert_eq!(a.head(&Digest::of(&shared).to_string()).await.unwrap(), None);
    assert_eq!(b.head(&Digest::of(&shared).to_string()).await.unwrap(), Some(shared.len() as u64));
    assert!(a.head(&p.digest.to_string()).await.unwrap().is_some(), "pinned");

    srv.clock.advance_secs(61);
    let s = srv.retention().await;
    assert_eq!(s.blobs_deleted, 1, "only the lone blob: shared is still B's, the pin never expires");
    assert_eq!(s.bytes_freed, lone.len() as u64);
    assert!(!is_stored(&srv, &lone).await);
    assert!(is_stored(&srv, &shared).await);
    assert_eq!(b.get(&Digest::of(&shared).to_string()).await.unwrap().bytes().await.unwrap(), shared);

    srv.clock.advance_secs(100);
    srv.retention().await; // B's reference expires; grace starts
    srv.clock.advance_secs(61);
    let s = srv.retention().await;
    assert_eq!(s.blobs_deleted, 1);
    assert!(!is_stored(&srv, &shared).await);
    assert!(a.head(&p.digest.to_string()).await.unwrap().is_some(), "still pinned");
    // A second pass finds nothing more: deletion is idempotent.
    assert_eq!(srv.retention().await.blobs_deleted, 0);
    // Content that was collected can be uploaded again.
    a.put(lone.clone(), &ttl(10)).await.unwrap();
    assert_eq!(a.get(&Digest::of(&lone).to_string()).await.unwrap().bytes().await.unwrap(), lone);
    srv.stop().await;
}

#[tokio::test]
async fn upload_racing_collection_never_loses_bytes() {
    let srv = TestServer::start_with(|c| c.retention_grace = Duration::ZERO).await;
    let c = srv.client();
    for round in 0..40u32 {
        let data = Bytes::from(format!("round {round}\n").repeat(1000));
        c.put(data.clone(), &ttl(1)).await.unwrap();
        srv.clock.advance_secs(2);
        let st = srv.state.clone();
        let gc = tokio::spawn(async move { spillway_server::run_retention_once(&st, false).await.unwrap() });
        let up = c.put(data.clone(), &ttl(3600)).await;
        gc.await.unwrap();
        let rec = up.unwrap();
        // Whatever order they ran in, the live reference reads back byte for byte.
        let got = c.get(&rec.digest.to_string()).await.unwrap().bytes().await.unwrap();
        assert_eq!(got, data, "round {round}");
        srv.retention().await;
        let got = c.get(&rec.digest.to_string()).await.unwrap().bytes().await.unwrap();
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
