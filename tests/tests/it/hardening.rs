//! What a client without a token, or with a token of one namespace, cannot do: grow the
//! server's memory, learn through cursors what others wrote, keep more than the limits allow,
//! read the server's files as another local user; and the contract's words on every refusal.
//! (The attacks measured in time — idle-connection floods, the dedup timing classifier, heavy
//! greps — are in `attacks.rs`, run alone.)

use std::io::{Read, Write};
use std::time::Duration;

use bytes::Bytes;
use reqwest::{Method, StatusCode};
use spillway_api::Digest;
use spillway_client::UploadOptions;

use crate::support::*;

fn ttl(secs: u64) -> UploadOptions {
    UploadOptions { ttl: Some(secs), ..Default::default() }
}

/// Sends raw bytes and reads the answer until the server closes (on a thread of its own: the
/// server runs on the test's runtime).
async fn raw(url: &str, request: &[u8]) -> String {
    let (addr, request) = (url.trim_start_matches("http://").to_owned(), request.to_vec());
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&request).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    })
    .await
    .unwrap()
}

/// Requests with made-up methods, each as long as the server takes: the metrics keep one
/// `other` series, and their text stays small.
#[tokio::test]
async fn unknown_methods_add_no_metric_series() {
    let srv = TestServer::start().await;
    let scrape = || async { reqwest::get(format!("{}/metrics", srv.metrics_url)).await.unwrap().text().await.unwrap() };
    let before = scrape().await.len();
    for i in 0..300 {
        let method = format!("M{i}{}", "X".repeat(2000));
        let request = format!("{method} /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let answer = raw(&srv.url, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 4"), "{}", &answer[..answer.len().min(200)]);
    }
    let after = scrape().await;
    assert!(!after.contains("XXXX"), "a method became a label");
    assert!(after.contains("method=\"other\""), "unknown methods are counted as other");
    assert!(after.len() < before + 20_000, "the metrics grew by {} bytes", after.len() - before);
    srv.stop().await;
}

/// A cursor of `/v1/refs` tells nothing of other namespaces (it is opaque: two cursors for the
/// same place differ) and works only in the namespace that was given it; following cursors
/// lists each reference once while another namespace writes.
#[tokio::test]
async fn refs_cursors_are_opaque_and_bound_to_their_namespace() {
    let srv = TestServer::start().await;
    let (a, b) = (srv.client(), srv.client_for("ns-b", ALL).await);
    for i in 0..5 {
        a.put(Bytes::from(format!("a{i}")), &ttl(3600)).await.unwrap();
    }
    let first = a.list_refs(&[], Some(2), None).await.unwrap();
    let cursor = first.next_cursor.clone().unwrap();
    assert!(cursor.parse::<i64>().is_err() && cursor.len() >= 40, "opaque: {cursor}");
    assert_ne!(
        a.list_refs(&[], Some(2), None).await.unwrap().next_cursor.unwrap(),
        cursor,
        "the same place twice differs"
    );
    // Another namespace's cursor, a forged one, one cut short: 400, never data.
    for bad in [cursor.clone(), "3".to_owned(), cursor[..cursor.len() - 2].to_owned(), "!!".to_owned()] {
        let err = b.list_refs(&[], Some(2), Some(&bad)).await.unwrap_err();
        assert_eq!(api_code(&err), (400, "invalid_argument".to_owned()), "{bad}");
    }
    // B writes between A's pages; A's walk sees its own five references exactly once.
    let mut seen: Vec<String> = first.refs.iter().map(|r| r.digest.clone()).collect();
    let mut next = first.next_cursor;
    while let Some(c) = next {
        for i in 0..7 {
            b.put(Bytes::from(format!("b{i}{c}")), &ttl(3600)).await.unwrap();
        }
        let page = a.list_refs(&[], Some(2), Some(&c)).await.unwrap();
        seen.extend(page.refs.iter().map(|r| r.digest.clone()));
        next = page.next_cursor;
    }
    seen.sort();
    let mut want: Vec<String> = (0..5).map(|i| Digest::of(format!("a{i}").as_bytes()).to_string()).collect();
    want.sort();
    assert_eq!(seen, want);
    srv.stop().await;
}

/// Everything a client can make the server keep is bounded: a pin's reason, the streams a
/// namespace has open, and (when the operator sets one) the bytes a namespace holds.
#[tokio::test]
async fn limits_and_quotas() {
    let srv = TestServer::start_with(|c| {
        c.max_open_streams = 3;
        c.namespace_quota_bytes = Some(100_000);
    })
    .await;
    let (a, b) = (srv.client(), srv.client_for("ns-b", ALL).await);
    // Pin reasons: up to 1,024 bytes; a huge body is refused before it is read whole.
    let d = a.put(Bytes::from_static(b"evidence"), &ttl(60)).await.unwrap().digest;
    assert!(a.pin(&d, Some(&"r".repeat(1024))).await.is_ok());
    let err = a.pin(&d, Some(&"r".repeat(1025))).await.unwrap_err();
    assert_eq!(api_code(&err), (400, "invalid_argument".to_owned()));
    let huge = format!("{{\"reason\": \"{}\"}}", "r".repeat(5 << 20));
    let resp = a.request(Method::POST, &format!("/v1/blobs/{d}/pin")).body(huge).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(resp.json::<serde_json::Value>().await.unwrap()["error"]["code"], "too_large");
    // Open streams: three, then 429 with Retry-After; a sealed one frees its place.
    let ids: Vec<String> = futures_ids(&a, 3).await;
    let resp = a.request(Method::POST, "/v1/streams").send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(resp.headers().get("retry-after").is_some());
    assert_eq!(resp.json::<serde_json::Value>().await.unwrap()["error"]["code"], "too_many_requests");
    assert!(b.create_stream(&UploadOptions::default()).await.is_ok(), "another namespace has its own limit");
    a.seal(&ids[0]).await.unwrap();
    assert!(a.create_stream(&UploadOptions::default()).await.is_ok());
    // The quota: 100,000 bytes of distinct live blobs and open streams per namespace.
    let big = Bytes::from(vec![b'q'; 60_000]);
    a.put(big.clone(), &ttl(60)).await.unwrap();
    let err = a.put(Bytes::from(vec![b'z'; 60_000]), &ttl(60)).await.unwrap_err();
    assert_eq!(api_code(&err), (507, "quota_exceeded".to_owned()));
    assert!(a.put(big.clone(), &ttl(60)).await.unwrap().deduplicated, "content it holds costs nothing more");
    b.put(Bytes::from(vec![b'z'; 60_000]), &ttl(60)).await.expect("another namespace has its own quota");
    let err = a.append(&ids[1], 0, Bytes::from(vec![b's'; 50_000])).await.unwrap_err();
    assert_eq!(api_code(&err), (507, "quota_exceeded".to_owned()));
    // When the bytes expire, there is room again.
    srv.clock.advance_secs(61);
    a.put(Bytes::from(vec![b'z'; 60_000]), &ttl(60)).await.expect("room once the first expired");
    srv.stop().await;
}

async fn futures_ids(c: &spillway_client::StoreClient, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(c.create_stream(&UploadOptions::default()).await.unwrap().id);
    }
    ids
}

/// Everything the server writes is its user's alone: files 0600, directories 0700.
#[tokio::test]
async fn the_servers_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    if is_remote() {
        eprintln!("the embedded backend's files; PostgreSQL and S3 keep their own");
        return;
    }
    let srv = TestServer::start().await;
    let c = srv.client();
    c.put(Bytes::from_static(b"inline"), &ttl(60)).await.unwrap();
    c.put(Bytes::from(vec![b'f'; 200_000]), &ttl(60)).await.unwrap();
    let s = c.create_stream(&UploadOptions::default()).await.unwrap();
    c.append(&s.id, 0, Bytes::from_static(b"streamed\n")).await.unwrap();
    spillway_server::ensure_first_token(&srv.state).await.unwrap();
    let root = srv.config().data_dir;
    let mut stack = vec![root.clone()];
    let (mut files, mut dirs) = (0, 0);
    while let Some(d) = stack.pop() {
        let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "directory {} is {mode:o}", d.display());
        dirs += 1;
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
                assert_eq!(mode, 0o600, "file {} is {mode:o}", p.display());
                files += 1;
            }
        }
    }
    assert!(files >= 3 && dirs >= 3, "{files} files, {dirs} directories looked at");
    srv.stop().await;
}

/// The contract's JSON and words on every refusal, the HTTP parser's included; downloads are
/// never sniffed; a second seal says when the reference expires.
#[tokio::test]
async fn refusals_speak_the_contract() {
    let srv = TestServer::start().await;
    let c = srv.client();
    for request in [
        &b"GET /v1/blobs/a\0b HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        &b"POST /v1/blobs HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc"[..],
    ] {
        let answer = raw(&srv.url, request).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        let body = answer.split_once("\r\n\r\n").unwrap().1;
        let json: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {answer}"));
        assert_eq!(json["error"]["code"], "invalid_argument");
    }
    let d = c.put(Bytes::from_static(b"<html><script>x</script>"), &ttl(60)).await.unwrap().digest;
    let resp = c.request(Method::GET, "/v1/refs?limit=abc").send().await.unwrap();
    let json: serde_json::Value = resp.json().await.unwrap();
    let message = json["error"]["message"].as_str().unwrap();
    assert!(!message.contains("eserialize") && message.contains("limit"), "{message}");
    let resp = c.request(Method::GET, &format!("/v1/blobs/{d}/read?offset=x")).send().await.unwrap();
    let json: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(json["error"]["message"], "query parameter offset must be a non-negative integer");
    let got = c.get(&d).await.unwrap();
    assert_eq!(got.headers()["x-content-type-options"], "nosniff");
    let s = c.create_stream(&ttl(600)).await.unwrap();
    let first = c.seal(&s.id).await.unwrap();
    let again = c.seal(&s.id).await.unwrap();
    assert_eq!(again.digest, first.digest);
    assert!(again.expires_at.is_some(), "the reference keeps its expiry, and the answer says so");
    assert_eq!(again.expires_at, first.expires_at);
    srv.stop().await;
}

/// On SQLite, an upload of content another namespace holds writes as many pages to the
/// database's log as one of new content, on average, at every size: small content kept in its
/// row (256 B, 2 KiB, 16 KiB) and content stored as a file (64 KiB). Page counts, unlike time,
/// do not depend on the machine. (On PostgreSQL there is nothing to count: 0 both ways.)
#[tokio::test]
async fn uploads_write_as_many_database_pages_whether_or_not_another_namespace_holds_the_content() {
    let srv = TestServer::start().await;
    let (a, b) = (srv.client(), srv.client_for("ns-b", ALL).await);
    let rounds = 100;
    for size in [256usize, 2 << 10, 16 << 10, 64 << 10] {
        let body =
            |tag: &str, i: usize| Bytes::from(format!("{tag} {i} {}", "p".repeat(size)).into_bytes()[..size].to_vec());
        for i in 0..rounds {
            b.put(body("held", i), &ttl(60)).await.unwrap();
        }
        a.put(body("warm", size), &ttl(60)).await.unwrap();
        while srv.state.db.list_tokens().await.unwrap().iter().any(|t| t.last_used_at.is_none()) {
            tokio::task::yield_now().await;
        }
        let (mut fresh, mut held) = (0, 0);
        for i in 0..rounds {
            let before = srv.state.db.log_pages();
            a.put(body("fresh", i), &ttl(60)).await.unwrap();
            let between = srv.state.db.log_pages();
            assert!(!a.put(body("held", i), &ttl(60)).await.unwrap().deduplicated, "new to this namespace");
            fresh += between - before;
            held += srv.state.db.log_pages() - between;
        }
        let per = |n: u64| n as f64 / rounds as f64;
        eprintln!("{size} B: {:.2} pages per fresh upload, {:.2} per held", per(fresh), per(held));
        assert!(
            (per(fresh) - per(held)).abs() <= 0.75,
            "{size} B: {:.2} pages per fresh upload, {:.2} per upload of content held already",
            per(fresh),
            per(held)
        );
    }
    srv.stop().await;
}

/// The echoes re-uploads write on SQLite (`db::blobs::echo_row`) do not pile up: the writer
/// empties their table every 10 s, on the first commit past that.
#[tokio::test]
async fn the_echoes_of_re_uploads_are_emptied_by_the_writer() {
    let srv = TestServer::start().await;
    if srv.state.db.backend() != spillway_server::db::Backend::Sqlite {
        return srv.stop().await; // written on SQLite only
    }
    let (a, b) = (srv.client(), srv.client_for("ns-b", ALL).await);
    let body = Bytes::from_static(b"content both namespaces upload\n");
    b.put(body.clone(), &ttl(60)).await.unwrap();
    a.put(body, &ttl(60)).await.unwrap();
    assert_eq!(srv.state.db.echo_rows().await.unwrap(), 1, "the re-upload's echo");
    tokio::time::sleep(Duration::from_millis(10_200)).await;
    a.put(Bytes::from_static(b"something new\n"), &ttl(60)).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while srv.state.db.echo_rows().await.unwrap() != 0 {
        assert!(std::time::Instant::now() < deadline, "blob_echoes not emptied 10 s on");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    srv.stop().await;
}

/// What an upload costs — database commits, file and directory syncs, requests to S3 — is the
/// same whether or not another namespace already stores its content: nothing to time. (The
/// timing itself is measured in `attacks.rs`.)
#[tokio::test]
async fn uploads_cost_the_same_whether_or_not_another_namespace_holds_the_content() {
    let srv = TestServer::start().await;
    let (a, b) = (srv.client(), srv.client_for("ns-b", ALL).await);
    let s3 = |srv: &TestServer| -> u64 {
        [
            "get",
            "list",
            "copy",
            "put",
            "upload_part",
            "create_multipart",
            "complete_multipart",
            "abort_multipart",
            "delete",
            "other",
        ]
        .iter()
        .map(|k| srv.s3_requests(k))
        .sum()
    };
    let work = |srv: &TestServer| (srv.state.db.commits(), srv.state.blobs.store.syncs(), s3(srv));
    for size in [2usize << 10, 64 << 10] {
        let body =
            |tag: &str, i: usize| Bytes::from(format!("{tag} {i} {}", "w".repeat(size)).into_bytes()[..size].to_vec());
        for i in 0..5 {
            b.put(body("held", i), &ttl(60)).await.unwrap();
        }
        a.put(body("warm", size), &ttl(60)).await.unwrap();
        // Each token's first use is noted by a write of its own, made in the background: wait
        // for both, so that they fall outside what is measured.
        while srv.state.db.list_tokens().await.unwrap().iter().any(|t| t.last_used_at.is_none()) {
            tokio::task::yield_now().await;
        }
        let start = work(&srv);
        for i in 0..5 {
            a.put(body("fresh", i), &ttl(60)).await.unwrap();
        }
        let fresh = work(&srv);
        for i in 0..5 {
            assert!(!a.put(body("held", i), &ttl(60)).await.unwrap().deduplicated, "new to this namespace");
        }
        let held = work(&srv);
        let cost = |from: (u64, u64, u64), to: (u64, u64, u64)| (to.0 - from.0, to.1 - from.1, to.2 - from.2);
        assert_eq!(
            cost(start, fresh),
            cost(fresh, held),
            "{size} B: (commits, syncs, S3 requests) of fresh vs held content"
        );
    }
    srv.stop().await;
}
