//! Contract behaviours the other files do not reach: SHA-256 of large uploads against an
//! oracle, 503 when the blob store is down, label limits at their boundaries, listings, the
//! scope matrix, unpin then expiry, retention past one page and half-done deletions.

use std::time::Duration;

use bytes::Bytes;
use reqwest::{Method, StatusCode};
use spillway_client::{ReadRequest, StoreClient, UploadOptions};
use spillway_server::auth::Scope;

use crate::support::*;

fn ttl(secs: u64) -> UploadOptions {
    UploadOptions { ttl: Some(secs), ..Default::default() }
}

fn sha256sum(data: &[u8]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let data = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

#[tokio::test]
async fn sha256_of_large_uploads_matches_an_oracle() {
    let srv = TestServer::start().await;
    let c = srv.client();
    for size in [256 * 1024 + 1, 3 << 20, (5 << 20) + 7] {
        let data: Bytes =
            (0..size as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect::<Vec<_>>().into();
        let rec = c.put(data.clone(), &UploadOptions::default()).await.unwrap();
        assert_eq!(rec.sha256, format!("sha256:{}", sha256sum(&data)), "{size} bytes");
        // Streamed without a length, the same digest.
        let chunks: Vec<Result<Bytes, std::io::Error>> =
            data.chunks(70_001).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
        let streamed = c.put_stream(futures::stream::iter(chunks), &UploadOptions::default()).await.unwrap();
        assert_eq!(streamed.sha256, rec.sha256);
        assert_eq!(c.get(&sha256_of(&rec)).await.unwrap().bytes().await.unwrap(), data);
    }
    srv.stop().await;
}

#[tokio::test]
async fn blob_store_down_is_503_and_nothing_is_referenced() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let kept = Bytes::from("stored before the outage\n".repeat(2000));
    let d = c.put(kept, &UploadOptions::default()).await.unwrap().digest;
    srv.break_blob_store();
    let data = Bytes::from("written during the outage\n".repeat(2000));
    let err = c.put(data.clone(), &UploadOptions::default()).await.unwrap_err();
    assert_eq!(api_code(&err), (503, "unavailable".into()), "{err}");
    assert_eq!(c.head(&spillway_api::Digest::of(&data)).await.unwrap(), None, "no reference to it");
    let r = c.request(Method::GET, &format!("/v1/blobs/{d}")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unavailable");
    let err = c.read(&d, ReadRequest::Bytes { offset: 0, limit: None }).await.unwrap_err();
    assert_eq!(api_code(&err), (503, "unavailable".into()));
    srv.stop().await;
}

#[tokio::test]
async fn labels_at_their_limits_and_filters_that_and() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let put = |q: String| {
        let c = c.clone();
        async move { c.request(Method::POST, &format!("/v1/blobs?{q}")).body(q.clone()).send().await.unwrap().status() }
    };
    let k64 = "k".repeat(64);
    assert_eq!(put(format!("label.{k64}=v")).await, StatusCode::CREATED, "a 64-character key");
    assert_eq!(put(format!("label.{k64}x=v")).await, StatusCode::BAD_REQUEST, "a 65-character key");
    let sixteen: Vec<String> = (0..16).map(|i| format!("label.k{i}=v")).collect();
    assert_eq!(put(sixteen.join("&")).await, StatusCode::CREATED, "16 labels");
    assert_eq!(put(format!("{}&label.k16=v", sixteen.join("&"))).await, StatusCode::BAD_REQUEST, "17 labels");
    assert_eq!(put(format!("label.v={}", "v".repeat(256))).await, StatusCode::CREATED, "a 256-byte value");
    assert_eq!(put(format!("label.v={}", "v".repeat(257))).await, StatusCode::BAD_REQUEST, "a 257-byte value");
    // A filter on several labels is their AND.
    let both = UploadOptions::default().label("tool", "bash").label("session", "s1");
    let d_both = c.put(Bytes::from_static(b"a"), &both).await.unwrap().digest.to_string();
    c.put(Bytes::from_static(b"b"), &UploadOptions::default().label("tool", "bash").label("session", "s2"))
        .await
        .unwrap();
    c.put(Bytes::from_static(b"c"), &UploadOptions::default().label("tool", "grep").label("session", "s1"))
        .await
        .unwrap();
    let list = c.list_refs(&[("tool", "bash"), ("session", "s1")], None, None).await.unwrap();
    assert_eq!(list.refs.iter().map(|r| r.digest.as_str()).collect::<Vec<_>>(), [d_both.as_str()]);
    // Expired references are not listed, even before retention runs.
    c.put(Bytes::from_static(b"short-lived"), &ttl(5).label("tool", "short")).await.unwrap();
    assert_eq!(c.list_refs(&[("tool", "short")], None, None).await.unwrap().refs.len(), 1);
    srv.clock.advance_secs(6);
    assert!(c.list_refs(&[("tool", "short")], None, None).await.unwrap().refs.is_empty());
    srv.stop().await;
}

/// Which scope each route needs: read for reads, write for uploads and streams, admin for pin,
/// unpin and delete. Every other combination is `403 forbidden`.
#[tokio::test]
async fn the_scope_matrix() {
    let srv = TestServer::start().await;
    let admin = srv.client();
    let d = admin.put(Bytes::from_static(b"scoped\n"), &UploadOptions::default()).await.unwrap().digest;
    let sid = admin.create_stream(&UploadOptions::default()).await.unwrap().id;
    admin.append(&sid, 0, Bytes::from_static(b"x\n")).await.unwrap();
    let read = srv.client_for("ns-a", &[Scope::Read]).await;
    let write = srv.client_for("ns-a", &[Scope::Write]).await;
    let only_admin = srv.client_for("ns-a", &[Scope::Admin]).await;
    let status = |c: &StoreClient, m: Method, path: String, body: &'static str| {
        let req = c.request(m, &path).body(body);
        async move { req.send().await.unwrap().status().as_u16() }
    };
    let routes: Vec<(Method, String, &str, &str)> = vec![
        (Method::GET, format!("/v1/blobs/{d}"), "", "read"),
        (Method::GET, format!("/v1/blobs/{d}/read"), "", "read"),
        (Method::GET, format!("/v1/blobs/{d}/grep?pattern=x"), "", "read"),
        (Method::GET, "/v1/refs".into(), "", "read"),
        (Method::GET, format!("/v1/streams/{sid}"), "", "read"),
        (Method::GET, format!("/v1/streams/{sid}/read"), "", "read"),
        (Method::POST, "/v1/blobs".into(), "new", "write"),
        (Method::POST, "/v1/streams".into(), "", "write"),
        (Method::POST, format!("/v1/streams/{sid}/append?offset=2"), "", "write"),
        (Method::POST, format!("/v1/blobs/{d}/pin"), "{}", "admin"),
        (Method::DELETE, format!("/v1/blobs/{d}/pin"), "", "admin"),
    ];
    for (m, path, body, needs) in &routes {
        for (who, c) in [("read", &read), ("write", &write), ("admin", &only_admin)] {
            let got = status(c, m.clone(), path.clone(), body).await;
            if who == *needs {
                assert!(got < 300 || got == 404, "{who} on {m} {path}: {got}");
            } else {
                assert_eq!(got, 403, "{who} on {m} {path}");
            }
        }
    }
    // Seal and delete change state: checked last, refused first.
    for c in [&read, &only_admin] {
        assert_eq!(status(c, Method::POST, format!("/v1/streams/{sid}/seal"), "").await, 403);
    }
    assert_eq!(status(&write, Method::POST, format!("/v1/streams/{sid}/seal"), "").await, 201);
    for c in [&read, &write] {
        assert_eq!(status(c, Method::DELETE, format!("/v1/blobs/{d}"), "").await, 403);
    }
    assert_eq!(status(&only_admin, Method::DELETE, format!("/v1/blobs/{d}"), "").await, 204);
    srv.stop().await;
}

/// Unpinning gives the reference back its expiry: it goes at the next pass after it.
#[tokio::test]
async fn unpin_then_expiry() {
    let srv = TestServer::start_with(|c| c.retention_grace = Duration::ZERO).await;
    let c = srv.client();
    let data = Bytes::from("pinned for an incident\n".repeat(3000));
    let d = c.put(data.clone(), &ttl(60)).await.unwrap().digest;
    c.pin(&d, Some("INC-7")).await.unwrap();
    srv.clock.advance_secs(120);
    srv.retention().await;
    assert_eq!(c.get(&d).await.unwrap().bytes().await.unwrap(), data, "pinned: kept past its TTL");
    c.unpin(&d).await.unwrap();
    let s = srv.retention().await;
    assert_eq!(s.blobs_deleted, 1, "unpinned past its TTL: collected at the next pass");
    assert!(c.get(&d).await.unwrap_err().is_not_found());
    assert!(srv.stored_under("blobs").is_empty());
    srv.stop().await;
}

/// More expired references and blobs than one retention page (500): all of them go in one pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_pages_past_500_rows() {
    let srv = TestServer::start_with(|c| c.retention_grace = Duration::ZERO).await;
    let c = srv.client();
    let n = 620; // past one page (500) of references and of blobs
    let uploads = (0..n).map(|i| {
        let c = c.clone();
        async move { c.put(Bytes::from(format!("blob {i}\n")), &ttl(1)).await.unwrap() }
    });
    futures::future::join_all(uploads).await;
    srv.clock.advance_secs(2);
    let s = srv.retention().await;
    assert_eq!((s.references_expired, s.blobs_deleted), (n, n), "{s:?}");
    assert!(c.list_refs(&[], None, None).await.unwrap().refs.is_empty());
    srv.stop().await;
}

/// A deletion that a crashed pass left half-done (claimed, bytes maybe gone, row still there)
/// is finished by a later pass once its lease is over, and not before.
#[tokio::test]
async fn half_done_deletions_are_finished_after_the_lease() {
    let srv = TestServer::start_with(|c| c.retention_grace = Duration::ZERO).await;
    let c = srv.client();
    let data = Bytes::from("half deleted\n".repeat(3000));
    let d = c.put(data, &ttl(1)).await.unwrap().digest;
    srv.clock.advance_secs(2);
    let (db, now) = (&srv.state.db, srv.state.now());
    db.mark_unreferenced(now).await.unwrap();
    db.expire_refs(now, 500).await.unwrap();
    assert!(db.claim_for_deletion(&d, now, now).await.unwrap());
    // ... and the pass died here.
    let s = srv.retention().await;
    assert_eq!(s.blobs_deleted, 0, "inside the lease: maybe still running elsewhere");
    assert_eq!(srv.stored_under("blobs").len(), 1);
    srv.clock.advance_secs(srv.config().deletion_lease.as_secs() as i64 + 1);
    let s = srv.retention().await;
    assert_eq!(s.blobs_deleted, 1, "{s:?}");
    assert!(srv.stored_under("blobs").is_empty());
    assert_eq!(db.blob_state(&d).await.unwrap(), None);
    srv.stop().await;
}

/// The server's own retention loop runs every `retention_interval`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retention_loop_runs_on_its_interval() {
    let srv = TestServer::start_with(|c| {
        c.retention_grace = Duration::ZERO;
        c.retention_interval = Duration::from_millis(50);
    })
    .await;
    let c = srv.client();
    let d = c.put(Bytes::from_static(b"collected by the loop"), &ttl(1)).await.unwrap().digest;
    srv.clock.advance_secs(2);
    let db = srv.state.db.clone();
    let gone = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = gone.clone();
    let watcher = tokio::spawn(async move {
        while db.blob_state(&d).await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    eventually("the loop collects the blob", || gone.load(std::sync::atomic::Ordering::SeqCst)).await;
    watcher.await.unwrap();
    srv.stop().await;
}
