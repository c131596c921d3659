//! Each race between an upload and a deletion of the same content, taken on purpose: the
//! deleter stopped at a chosen point (a claim made by another process that then pauses), or
//! two database connections interleaved by hand. An upload never waits for a deleter and never
//! fails because of one; a reference, once made, keeps its bytes and its grace.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::{Method, StatusCode};
use spillway_api::Digest;
use spillway_client::UploadOptions;
use spillway_server::AppState;

use crate::support::*;

fn ttl(secs: u64) -> UploadOptions {
    UploadOptions { ttl: Some(secs), ..Default::default() }
}

/// Another process on the same database and blob store (its own pool, writer and caches), as
/// a separate `spillway-server retention` job is.
async fn other_process(srv: &TestServer) -> AppState {
    spillway_server::build_state(srv.config(), Arc::new(srv.clock.clone())).await.expect("a second process")
}

/// The first phase of a deletion, as a retention pass makes it: the reference expired, then
/// the blob claimed (`deleting`). The deleter then stops, before removing the bytes.
async fn claim(deleter: &AppState, d: &Digest) {
    let now = deleter.now();
    deleter.db.mark_unreferenced(now).await.unwrap();
    deleter.db.expire_refs(now, 500).await.unwrap();
    assert!(deleter.db.claim_for_deletion(d, now, now).await.unwrap(), "the deleter claims the blob");
}

/// The second phase, when the stopped deleter goes on.
async fn finish(deleter: &AppState, d: &Digest) {
    spillway_server::jobs::retention::delete_claimed(&deleter.jobs, d).await.unwrap();
}

/// A PUT with no retry, answered within `limit` or failed.
async fn put_once(c: &spillway_client::StoreClient, data: Bytes, ttl: u64) -> (StatusCode, String) {
    let path = format!("/v1/blobs/{}", Digest::of(&data));
    let send = c.request(Method::PUT, &path).query(&[("ttl", ttl.to_string())]).body(data).send();
    let resp = tokio::time::timeout(Duration::from_secs(5), send)
        .await
        .expect("the upload is answered at once, not after waiting for the deleter")
        .unwrap();
    (resp.status(), resp.text().await.unwrap())
}

/// A retention job in another process has claimed the blob and stopped there (slow, or
/// starved of SQLite's write lock by the server). An upload of the same content takes it back
/// at once; when the job goes on, it finds the blob referenced and leaves the bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_takes_back_what_another_process_is_deleting() {
    let srv = TestServer::start_with(|c| c.retention_grace = Duration::ZERO).await;
    let c = srv.client();
    let data = Bytes::from("claimed by a retention job\n".repeat(4000)); // a file or an object
    let d = c.put(data.clone(), &ttl(1)).await.unwrap().digest;
    srv.clock.advance_secs(2);
    let job = other_process(&srv).await;
    claim(&job, &d).await;
    let (status, body) = put_once(&c, data.clone(), 3600).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(
        srv.state.blobs.probes.took_back.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "the take-back branch ran"
    );
    finish(&job, &d).await;
    assert_eq!(c.get(&d).await.unwrap().bytes().await.unwrap(), data);
    assert!(srv.state.blobs.store.exists(&d).await.unwrap());
    // The content's next life ends as usual.
    srv.clock.advance_secs(3601);
    srv.retention().await;
    assert_eq!(c.head(&d).await.unwrap(), None);
    assert!(!srv.state.blobs.store.exists(&d).await.unwrap(), "collected once unreferenced");
    job.db.close().await;
    srv.stop().await;
}

/// A deletion that a crashed pass left claimed (its row `deleting`, its bytes maybe gone):
/// an upload of the same content takes it back and its bytes are there afterwards.
#[tokio::test]
async fn an_upload_takes_back_a_deletion_left_half_done() {
    let srv = TestServer::start_with(|c| c.retention_grace = Duration::ZERO).await;
    let c = srv.client();
    let data = Bytes::from("half deleted, then uploaded again\n".repeat(4000));
    let d = c.put(data.clone(), &ttl(1)).await.unwrap().digest;
    srv.clock.advance_secs(2);
    claim(&srv.state, &d).await;
    srv.state.blobs.store.delete(&d).await.unwrap(); // ... and the pass died after the bytes went
    let (status, body) = put_once(&c, data.clone(), 3600).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(c.get(&d).await.unwrap().bytes().await.unwrap(), data);
    // A later pass, past the lease, does not finish the old deletion: the blob is referenced.
    srv.clock.advance_secs(srv.config().deletion_lease.as_secs() as i64 + 1);
    let s = srv.retention().await;
    assert_eq!(s.blobs_deleted, 0, "{s:?}");
    assert_eq!(c.get(&d).await.unwrap().bytes().await.unwrap(), data);
    srv.stop().await;
}

/// An upload whose body is still arriving when another upload of the same content is stored,
/// expires and is claimed by a deleter. On S3 the first upload writes straight to the content
/// key (its digest was announced and no row existed when it began). It completes, takes the
/// content back, and the deleter, going on, leaves the bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_in_flight_takes_back_content_claimed_meanwhile() {
    let srv = TestServer::start_with(|c| c.retention_grace = Duration::ZERO).await;
    let c = srv.client();
    let data = Bytes::from((0..300_000u32).map(|i| (i % 241) as u8).collect::<Vec<u8>>());
    let d = Digest::of(&data);
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(4);
    let body = reqwest::Body::wrap_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }));
    let first = {
        let c = c.clone();
        let path = format!("/v1/blobs/{d}");
        tokio::spawn(async move {
            let resp = c.request(Method::PUT, &path).query(&[("ttl", "3600")]).body(body).send().await.unwrap();
            (resp.status(), resp.text().await.unwrap())
        })
    };
    let multiparts = srv.s3_requests("create_multipart");
    tx.send(Ok(data.slice(..100_000))).await.unwrap();
    let staging = || !srv.stored_under("tmp").is_empty() || srv.s3_requests("create_multipart") > multiparts;
    eventually("the first upload is staging its body", staging).await;
    // Meanwhile: the same content stored by another upload, expired, and claimed.
    c.put(data.clone(), &ttl(1)).await.unwrap();
    srv.clock.advance_secs(2);
    let job = other_process(&srv).await;
    claim(&job, &d).await;
    tx.send(Ok(data.slice(100_000..))).await.unwrap();
    drop(tx);
    let (status, body) = tokio::time::timeout(Duration::from_secs(5), first)
        .await
        .expect("the first upload is answered at once, not after waiting for the deleter")
        .unwrap();
    assert!(status.is_success(), "{status}: {body}");
    finish(&job, &d).await;
    assert_eq!(c.get(&d).await.unwrap().bytes().await.unwrap(), data);
    job.db.close().await;
    srv.stop().await;
}

/// Waits until some statement on the server's PostgreSQL database waits for a row lock, or
/// `task` is done.
async fn someone_waits_for_a_lock<T>(admin: &mut sqlx::PgConnection, task: &tokio::task::JoinHandle<T>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut *admin)
        .await
        .unwrap();
        if n > 0 || task.is_finished() {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "nobody ever waited for the row");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// PostgreSQL's READ COMMITTED: a retention statement that finds a blob unreferenced in its
/// snapshot while an upload is referencing it (the upload holds the row) must not mark the blob
/// unreferenced once the upload commits (it would start the grace of a blob that has a live
/// reference, and collect it early once that reference expires). Two connections, by hand.
/// (On SQLite transactions are serialized; there is no such interleaving.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_made_while_retention_waits_keeps_its_grace() {
    use sqlx::Connection;
    if !is_remote() {
        eprintln!("PostgreSQL only: SQLite serializes transactions");
        return;
    }
    let srv = TestServer::start_with(|c| c.retention_grace = Duration::from_secs(600)).await;
    let c = srv.client();
    let data = Bytes::from("referenced while retention waits\n".repeat(100));
    let d = c.put(data.clone(), &ttl(1)).await.unwrap().digest;
    srv.clock.advance_secs(2); // its only reference has expired; no pass has run yet
    let url = srv.config().database_url.unwrap();
    let mut upload = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut watch = sqlx::PgConnection::connect(&url).await.unwrap();
    let now = srv.state.now();
    // An upload of the same content, inside its transaction: what `add_ref` writes.
    let mut tx = upload.begin().await.unwrap();
    sqlx::query("UPDATE blobs SET unreferenced_since = NULL WHERE digest = $1")
        .bind(d.hex())
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO refs (namespace, digest, labels, created_at, expires_at, pinned) VALUES ('ns-a', $1, '{}', $2, $3, 0)",
    )
    .bind(d.hex())
    .bind(now)
    .bind(now + 3_600_000)
    .execute(&mut *tx)
    .await
    .unwrap();
    // Retention's first step, which expires the reference and meets the upload's row lock.
    let pass = {
        let st = srv.state.clone();
        tokio::spawn(async move { st.db.expire_refs(now, 500).await.unwrap() })
    };
    // It either waits for the upload's row, or passes it by; the upload commits after that.
    someone_waits_for_a_lock(&mut watch, &pass).await;
    tx.commit().await.unwrap();
    pass.await.unwrap();
    let since: Option<i64> = sqlx::query_scalar("SELECT unreferenced_since FROM blobs WHERE digest = $1")
        .bind(d.hex())
        .fetch_one(&mut watch)
        .await
        .unwrap();
    assert_eq!(since, None, "a blob with a live reference was marked unreferenced");
    srv.stop().await;
}

/// A compacted blob deleted by the steps a retention pass takes, leaving its packs unneeded.
async fn delete_blob(srv: &TestServer, d: &Digest) {
    srv.client().delete(*d).await.unwrap();
    let now = srv.state.now();
    srv.state.db.mark_unreferenced(now).await.unwrap();
    assert!(srv.state.db.claim_for_deletion(d, now, now).await.unwrap());
    finish(&srv.state, d).await;
}

/// Two outputs that share all but their ends; the first compacted into its packs, then
/// deleted: its packs hold chunks the second (still raw) will need. Returns the second's
/// digest and bytes, and the first's packs.
async fn shared_then_orphaned(srv: &TestServer) -> (Digest, Bytes, Vec<String>) {
    let c = srv.client();
    let first: Bytes = (0..60_000).map(|i| format!("shared line {i}\n")).collect::<String>().into();
    let mut second = first.to_vec();
    second.extend_from_slice(b"and one more\n");
    let d1 = c.put(first, &ttl(3600)).await.unwrap().digest;
    srv.compact().await;
    let packs: Vec<String> =
        srv.state.db.unreferenced_packs(None, 100).await.unwrap().into_iter().map(|p| p.0).collect();
    assert!(packs.is_empty(), "the first blob needs its packs");
    let second = Bytes::from(second);
    let d2 = c.put(second.clone(), &ttl(3600)).await.unwrap().digest;
    delete_blob(srv, &d1).await;
    let packs: Vec<String> =
        srv.state.db.unreferenced_packs(None, 100).await.unwrap().into_iter().map(|p| p.0).collect();
    assert!(!packs.is_empty(), "nothing needs the first blob's packs now");
    (d2, second, packs)
}

/// A compaction that found chunks in a pack, then a retention pass claims that pack before the
/// compaction commits: the commit sees the claim and gives up (the blob stays raw and whole,
/// the compaction's own packs go); the deletion goes on; the next compaction writes its own
/// copies.
#[tokio::test]
async fn a_pack_claimed_before_a_compaction_commits_is_not_reused() {
    let srv = TestServer::start_with(|c| c.retention_grace = Duration::ZERO).await;
    let (d2, second, packs) = shared_then_orphaned(&srv).await;
    let prepared =
        spillway_server::jobs::compaction::prepare(&srv.state.jobs, &d2, second.len() as u64).await.unwrap().unwrap();
    assert!(packs.iter().all(|p| prepared.reused_packs().contains(p)), "it reuses the orphaned packs' chunks");
    let now = srv.state.now();
    for p in &packs {
        assert!(srv.state.db.claim_pack(p, now).await.unwrap(), "retention claims the unneeded pack");
    }
    let done = spillway_server::jobs::compaction::finish(&srv.state.jobs, &d2, prepared).await.unwrap();
    assert_eq!(done, None, "the compaction gives up");
    assert_eq!(srv.state.db.blob_row(&d2).await.unwrap().map(|r| r.chunked), Some(false), "still raw");
    // The claiming pass stopped there; the next one past the deletion lease finishes it.
    srv.clock.advance_secs(400);
    let s = srv.retention().await;
    assert_eq!(s.packs_deleted as usize, packs.len(), "the claimed packs go: {s:?}");
    let got = srv.client().get(d2).await.unwrap().bytes().await.unwrap();
    assert_eq!(got, second);
    assert_eq!(srv.compact().await.blobs_compacted, 1, "the next pass compacts it, with copies of its own");
    assert_eq!(srv.client().get(d2).await.unwrap().bytes().await.unwrap(), second);
    srv.stop().await;
}

/// The other order: the compaction commits first; retention then finds the packs needed and
/// leaves them.
#[tokio::test]
async fn a_pack_a_compaction_committed_to_is_not_claimed() {
    let srv = TestServer::start_with(|c| c.retention_grace = Duration::ZERO).await;
    let (d2, second, packs) = shared_then_orphaned(&srv).await;
    let prepared =
        spillway_server::jobs::compaction::prepare(&srv.state.jobs, &d2, second.len() as u64).await.unwrap().unwrap();
    assert!(spillway_server::jobs::compaction::finish(&srv.state.jobs, &d2, prepared).await.unwrap().is_some());
    let now = srv.state.now();
    for p in &packs {
        assert!(!srv.state.db.claim_pack(p, now).await.unwrap(), "the pack is needed again");
    }
    let s = srv.retention().await;
    assert_eq!(s.packs_deleted, 0, "{s:?}");
    assert_eq!(srv.client().get(d2).await.unwrap().bytes().await.unwrap(), second);
    srv.stop().await;
}

/// A raw copy is removed only while its blob is compacted: once the compacted blob was deleted
/// and the same content uploaded again (raw), the removal finds the row raw and leaves it.
#[tokio::test]
async fn a_raw_copy_is_never_removed_under_a_raw_row() {
    let srv = TestServer::start_with(|c| c.retention_grace = Duration::ZERO).await;
    let c = srv.client();
    let data: Bytes = "compacted, deleted, uploaded again\n".repeat(20_000).into();
    let d = c.put(data.clone(), &ttl(3600)).await.unwrap().digest;
    srv.compact().await;
    delete_blob(&srv, &d).await;
    c.put(data.clone(), &ttl(3600)).await.unwrap();
    assert!(!spillway_server::jobs::retention::delete_raw_copy(&srv.state.jobs, &d).await.unwrap(), "the row is raw");
    assert_eq!(c.get(d).await.unwrap().bytes().await.unwrap(), data);
    srv.stop().await;
}
