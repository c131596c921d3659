//! Uploads, dedup, isolation, downloads with Range, bad input.

use bytes::Bytes;
use reqwest::{header, Method, StatusCode};
use spillway_api::{BlobRecord, Digest};
use spillway_client::UploadOptions;
use spillway_server::auth::Scope;

use crate::support::*;

fn sha256_hex(data: &[u8]) -> String {
    use sha2_shim::sha256;
    sha256(data)
}

mod sha2_shim {
    pub fn sha256(data: &[u8]) -> String {
        let out = std::process::Command::new("sha256sum")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().unwrap().write_all(data)?;
                c.wait_with_output()
            })
            .unwrap();
        String::from_utf8(out.stdout).unwrap()[..64].to_owned()
    }
}

#[tokio::test]
async fn put_then_dedup_and_record_fields() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let data = Bytes::from_static(b"hello\nworld");
    let rec = c.put(data.clone(), &UploadOptions::default()).await.unwrap();
    assert_eq!(rec.digest, Digest::of(&data));
    assert_eq!(rec.sha256, format!("sha256:{}", sha256_hex(&data)));
    assert_eq!((rec.size, rec.lines, rec.deduplicated), (11, 2, false));
    assert!(rec.expires_at.is_some());
    let again = c.put(data.clone(), &UploadOptions::default()).await.unwrap();
    assert!(again.deduplicated);
    // Status codes: 201 then 200, and POST answers with Location.
    let resp = c.request(Method::POST, "/v1/blobs").body("fresh bytes").send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let loc = resp.headers()[header::LOCATION].to_str().unwrap().to_owned();
    let rec: BlobRecord = resp.json().await.unwrap();
    assert_eq!(loc, format!("/v1/blobs/{}", rec.digest));
    let resp = c.request(Method::POST, "/v1/blobs").body("fresh bytes").send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    // Lookup by SHA-256 reaches the same blob.
    let head = c.head(&sha256_of(&rec)).await.unwrap();
    assert_eq!(head, Some(11));
    srv.stop().await;
}

#[tokio::test]
async fn digest_mismatch_stores_nothing() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let wrong = Digest::of(b"something else");
    let resp = c.request(Method::PUT, &format!("/v1/blobs/{wrong}")).body("actual").send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "digest_mismatch");
    assert_eq!(c.head(&wrong).await.unwrap(), None);
    assert_eq!(c.head(&Digest::of(b"actual")).await.unwrap(), None);
    eventually("no staged bytes remain", || srv.stored_under("tmp").is_empty()).await;
    assert!(srv.stored_under("blobs").is_empty(), "bytes published: {:?}", srv.stored_under("blobs"));
    srv.stop().await;
}

/// A PUT that names its BLAKE3 digest is written straight to its content key: on S3 a
/// multipart upload completed only after verification, with no temporary object and no copy.
/// A mismatch completes nothing, a duplicate is not written to the key again; a POST (digest
/// unknown until the end) is staged and copied. On local disk the same answers and bytes.
#[tokio::test]
async fn announced_digests_are_written_straight_to_their_key() {
    let srv = TestServer::start().await;
    let c = srv.client();
    // 18 MiB: three parts of a multipart upload (8, 8 and 2 MiB), in order.
    let body = |seed: u32| {
        Bytes::from(
            (0..18u32 << 20)
                .map(|i| (i.wrapping_add(seed.wrapping_mul(0x9E37_79B9)).wrapping_mul(2_654_435_761)).to_le_bytes()[3])
                .collect::<Vec<u8>>(),
        )
    };
    let data = body(1);
    let rec = c.put(data.clone(), &UploadOptions::default()).await.unwrap();
    assert!(!rec.deduplicated);
    assert_eq!(c.get(&rec.digest).await.unwrap().bytes().await.unwrap(), data);
    assert_eq!(srv.s3_requests("copy"), 0, "no server-side copy");
    assert_eq!(srv.s3_requests("put"), 0, "no temporary object");
    assert_eq!(srv.s3_requests("complete_multipart"), u64::from(is_remote()));
    assert_eq!(srv.s3_requests("upload_part"), 3 * u64::from(is_remote()));

    // Named with another digest: 400, and the upload is aborted, never completed.
    let (other, wrong) = (body(2), Digest::of(b"not these bytes"));
    let resp = c.request(Method::PUT, &format!("/v1/blobs/{wrong}")).body(other.clone()).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let err: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "digest_mismatch");
    assert_eq!((c.head(&wrong).await.unwrap(), c.head(&Digest::of(&other)).await.unwrap()), (None, None));
    assert_eq!(srv.s3_requests("complete_multipart"), u64::from(is_remote()));
    assert_eq!(srv.s3_requests("abort_multipart"), u64::from(is_remote()));

    // The same bytes again: deduplicated (a stored blob's key is never written to again).
    assert!(c.put(data.clone(), &UploadOptions::default()).await.unwrap().deduplicated);
    assert_eq!(srv.s3_requests("copy"), 0);
    eventually("no staged bytes remain", || srv.stored_under("tmp").is_empty()).await;
    assert_eq!(srv.stored_under("blobs").len(), 1, "{:?}", srv.stored_under("blobs"));

    // Digest unknown until the end: a temporary object, copied to its key, then removed.
    let third = body(3);
    let posted = c.put_stream(futures::stream::iter([Ok(third.clone())]), &UploadOptions::default()).await.unwrap();
    assert_eq!(posted.digest, Digest::of(&third));
    assert_eq!(srv.s3_requests("copy"), u64::from(is_remote()));
    assert_eq!(srv.stored_under("blobs").len(), 2, "{:?}", srv.stored_under("blobs"));
    eventually("no staged bytes remain", || srv.stored_under("tmp").is_empty()).await;
    srv.stop().await;
}

#[tokio::test]
async fn malformed_digests_are_400() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let hex = "ab".repeat(32);
    for bad in [
        format!("blake3:{}", hex.to_uppercase()),
        format!("blake3:{}", &hex[..62]),
        format!("sha1:{hex}"),
        format!("blake3:..%2F{}", &hex[..60]),
        "blake3:%2e%2e".to_owned(),
        hex.clone(),
    ] {
        for (m, p) in [(Method::GET, ""), (Method::HEAD, ""), (Method::GET, "/read"), (Method::PUT, "")] {
            let resp = c.request(m.clone(), &format!("/v1/blobs/{bad}{p}")).send().await.unwrap();
            assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{m} {bad}{p}");
            if m != Method::HEAD {
                let body: serde_json::Value = resp.json().await.unwrap();
                assert_eq!(body["error"]["code"], "invalid_digest", "{bad}");
            }
        }
    }
    srv.stop().await;
}

#[tokio::test]
async fn too_large_leaves_nothing() {
    let srv = TestServer::start_with(|c| c.max_blob_bytes = 1000).await;
    let c = srv.client();
    let err = c.put(Bytes::from(vec![b'x'; 1001]), &UploadOptions::default()).await.unwrap_err();
    assert_eq!(api_code(&err), (413, "too_large".into()));
    // Streamed without a length: cut off while it arrives.
    let body = futures::stream::iter((0..10).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b'y'; 300]))));
    let err = c.put_stream(body, &UploadOptions::default()).await.unwrap_err();
    assert_eq!(api_code(&err), (413, "too_large".into()));
    eventually("no staged bytes remain", || srv.stored_under("tmp").is_empty()).await;
    assert!(srv.stored_under("blobs").is_empty(), "bytes published: {:?}", srv.stored_under("blobs"));
    assert!(c.put(Bytes::from(vec![b'x'; 1000]), &UploadOptions::default()).await.is_ok());
    srv.stop().await;
}

#[tokio::test]
async fn bad_upload_options_are_400() {
    let srv = TestServer::start_with(|c| c.max_ttl = std::time::Duration::from_secs(100)).await;
    let c = srv.client();
    for q in ["ttl=abc", "ttl=0", "ttl=101", "label.BAD=x", "label.=x"] {
        let resp = c.request(Method::POST, &format!("/v1/blobs?{q}")).body("x").send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{q}");
        // A refused write may leave its body unread: its connection is not reused.
        assert_eq!(resp.headers()["connection"], "close", "{q}");
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_argument", "{q}");
    }
    let ok = c.request(Method::POST, "/v1/blobs?ttl=50").body("x").send().await.unwrap();
    assert!(ok.status().is_success(), "{}", ok.status());
    assert_ne!(ok.headers().get("connection").map(|v| v.as_bytes()), Some(&b"close"[..]));
    let long = "v".repeat(257);
    let resp = c.request(Method::POST, &format!("/v1/blobs?label.k={long}")).body("x").send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let many: String = (0..17).map(|i| format!("label.k{i}=v&")).collect();
    let resp = c.request(Method::POST, &format!("/v1/blobs?{many}")).body("x").send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    srv.stop().await;
}

#[tokio::test]
async fn namespaces_are_isolated_but_storage_is_shared() {
    let srv = TestServer::start().await;
    let a = srv.client();
    let b = srv.client_for("ns-b", ALL).await;
    // Over the inline limit, so the one stored copy is a file.
    let data = Bytes::from("secret incident log\n".repeat(1000));
    let rec = a.put(data.clone(), &UploadOptions::default()).await.unwrap();
    let d = rec.digest;
    // B sees nothing: HEAD, GET, read, grep, pin, delete are all 404.
    assert_eq!(b.head(&d).await.unwrap(), None);
    assert!(b.get(&d).await.unwrap_err().is_not_found());
    assert!(b
        .read(&d, spillway_client::ReadRequest::Bytes { offset: 0, limit: None })
        .await
        .unwrap_err()
        .is_not_found());
    let grep = spillway_client::GrepRequest { pattern: "incident".into(), ..Default::default() };
    assert!(b.grep(&d, &grep).await.unwrap_err().is_not_found());
    assert!(b.pin(&d, None).await.unwrap_err().is_not_found());
    a.pin(&d, None).await.unwrap();
    assert!(b.unpin(&d).await.unwrap_err().is_not_found(), "B cannot unpin A's pin");
    assert!(b.delete(&d).await.unwrap_err().is_not_found());
    assert!(b.head(&sha256_of(&rec)).await.unwrap().is_none());
    assert!(b.list_refs(&[], None, None).await.unwrap().refs.is_empty());
    // A's blob is untouched by all of that.
    assert_eq!(a.grep(&d, &grep).await.unwrap().matches.len(), 1000);
    assert!(a.list_refs(&[], None, None).await.unwrap().refs[0].pinned);
    // Streams too: B can neither see, append to, read nor seal A's stream.
    let s = a.create_stream(&UploadOptions::default()).await.unwrap();
    a.append(&s.id, 0, Bytes::from_static(b"a's line\n")).await.unwrap();
    assert!(b.stream_info(&s.id).await.unwrap_err().is_not_found());
    assert!(b.append(&s.id, 9, Bytes::from_static(b"b's line\n")).await.unwrap_err().is_not_found());
    let whole = spillway_client::ReadRequest::Bytes { offset: 0, limit: None };
    assert!(b.read_stream(&s.id, whole, None).await.unwrap_err().is_not_found());
    assert!(b.read_stream(&s.id, whole, Some(100)).await.unwrap_err().is_not_found());
    assert!(b.seal(&s.id).await.unwrap_err().is_not_found());
    let info = a.stream_info(&s.id).await.unwrap();
    assert_eq!((info.size, info.state), (9, spillway_api::StreamState::Open), "B changed nothing");
    assert_eq!(a.read_stream(&s.id, whole, None).await.unwrap().content, "a's line\n");
    // B uploading the same bytes is new *to B*: 201, deduplicated false.
    let resp = b.request(Method::PUT, &format!("/v1/blobs/{d}")).body(data.clone()).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let rb: BlobRecord = resp.json().await.unwrap();
    assert!(!rb.deduplicated);
    assert_eq!(srv.stored_under("blobs").len(), 1, "one stored copy");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_concurrent_identical_uploads() {
    let srv = TestServer::start().await;
    let data = Bytes::from((0..3_000_000u32).flat_map(|i| (i % 251).to_le_bytes()).collect::<Vec<u8>>());
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let c = srv.client();
        let d = data.clone();
        tasks.push(tokio::spawn(async move {
            let resp = c.request(Method::PUT, &format!("/v1/blobs/{}", Digest::of(&d))).body(d).send().await.unwrap();
            resp.status()
        }));
    }
    let mut created = 0;
    for t in tasks {
        let st = t.await.unwrap();
        assert!(st == StatusCode::CREATED || st == StatusCode::OK, "{st}");
        created += usize::from(st == StatusCode::CREATED);
    }
    assert_eq!(created, 1, "one upload made the reference, the fifteen others found it");
    assert_eq!(srv.stored_under("blobs").len(), 1);
    eventually("no staged bytes remain", || srv.stored_under("tmp").is_empty()).await;
    let got = srv.client().get(&Digest::of(&data)).await.unwrap().bytes().await.unwrap();
    assert_eq!(got, data);
    srv.stop().await;
}

#[tokio::test]
async fn get_honours_range_and_etag() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let data: Bytes = (0..1000u32).map(|i| (i % 256) as u8).collect::<Vec<u8>>().into();
    let d = c.put(data.clone(), &UploadOptions::default()).await.unwrap().digest;
    let path = format!("/v1/blobs/{d}");
    let full = c.request(Method::GET, &path).send().await.unwrap();
    assert_eq!(full.status(), StatusCode::OK);
    assert_eq!(full.headers()[header::ACCEPT_RANGES], "bytes");
    let etag = full.headers()[header::ETAG].to_str().unwrap().to_owned();
    assert_eq!(etag, format!("\"{d}\""));
    assert_eq!(full.bytes().await.unwrap(), data);
    for (range, start, end) in
        [("bytes=10-19", 10, 20), ("bytes=990-", 990, 1000), ("bytes=-5", 995, 1000), ("bytes=900-5000", 900, 1000)]
    {
        let r = c.request(Method::GET, &path).header(header::RANGE, range).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::PARTIAL_CONTENT, "{range}");
        assert_eq!(r.headers()[header::CONTENT_RANGE], format!("bytes {start}-{}/1000", end - 1).as_str());
        assert_eq!(r.bytes().await.unwrap(), data.slice(start..end), "{range}");
    }
    let r = c.request(Method::GET, &path).header(header::RANGE, "bytes=1000-").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(r.headers()[header::CONTENT_RANGE], "bytes */1000");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "range_not_satisfiable");
    let r = c.request(Method::GET, &path).header(header::RANGE, "bytes=abc").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "a Range not understood is ignored (RFC 9110 §14.2)");
    assert_eq!(r.bytes().await.unwrap(), data);
    let r = c.request(Method::GET, &path).header(header::IF_NONE_MATCH, &etag).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
    let r = c.request(Method::HEAD, &path).send().await.unwrap();
    assert_eq!(r.headers()[header::CONTENT_LENGTH], "1000");
    assert_eq!(r.headers()[header::ETAG], etag.as_str());
    srv.stop().await;
}

#[tokio::test]
async fn auth_and_scopes() {
    let srv = TestServer::start().await;
    let anon = reqwest::Client::new();
    let r = anon.get(format!("{}/v1/refs", srv.url)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthorized");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("no token was sent") && message.contains("Authorization: Bearer"), "{message}");
    let r = anon.get(format!("{}/v1/refs", srv.url)).bearer_auth("spw_nope").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(r.json::<serde_json::Value>().await.unwrap()["error"]["message"], "unknown token");
    let reader = srv.client_for("ns-a", &[Scope::Read]).await;
    // A capped read, which a cached token may have answered before the router, with a header
    // that is not a bearer token: the same 401 as any route.
    let digest = format!("blake3:{}", "0".repeat(64));
    for header in ["Basic c3B3OnNwdw==", "Bearer", "Bearer ", "spw_x"] {
        let r = anon
            .get(format!("{}/v1/blobs/{digest}/read?offset=0&limit=10", srv.url))
            .header(header::AUTHORIZATION, header)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{header}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unauthorized", "{header}");
        assert_eq!(body["error"]["message"], "malformed Authorization header: expected Bearer <token>", "{header}");
    }
    let err = reader.put(Bytes::from_static(b"x"), &UploadOptions::default()).await.unwrap_err();
    assert_eq!(api_code(&err), (403, "forbidden".into()));
    let writer = srv.client_for("ns-a", &[Scope::Write]).await;
    let rec = writer.put(Bytes::from_static(b"x"), &UploadOptions::default()).await.unwrap();
    let err =
        writer.read(&rec.digest, spillway_client::ReadRequest::Bytes { offset: 0, limit: None }).await.unwrap_err();
    assert_eq!(api_code(&err), (403, "forbidden".into()));
    let err = writer.pin(&rec.digest, None).await.unwrap_err();
    assert_eq!(api_code(&err), (403, "forbidden".into()));
    assert!(reader.read(&rec.digest, spillway_client::ReadRequest::Bytes { offset: 0, limit: None }).await.is_ok());
    // Tokens are stored hashed: the plain token appears in no file of the data directory
    // (the database, its write-ahead log, anything else), while its hash does — so the scan
    // reads where the rows are.
    if !is_remote() {
        let found = |needle: &[u8]| {
            files_under(&srv.config().data_dir)
                .iter()
                .any(|f| std::fs::read(f).unwrap().windows(needle.len()).any(|w| w == needle))
        };
        assert!(found(spillway_server::auth::hash_token(&srv.token).as_bytes()), "the token's row is scanned");
        assert!(!found(srv.token.as_bytes()), "the plain token is stored somewhere");
    }
    srv.stop().await;
}

#[tokio::test]
async fn pins_deletes_and_refs_listing() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let opts = |s: &str| UploadOptions::default().label("tool", "bash").label("stream", s);
    let out = c.put(Bytes::from_static(b"stdout text\n"), &opts("stdout")).await.unwrap();
    let err = c.put(Bytes::from_static(b"stderr text\n"), &opts("stderr")).await.unwrap();
    let list = c.list_refs(&[("stream", "stderr")], None, None).await.unwrap();
    assert_eq!(list.refs.len(), 1);
    assert_eq!(list.refs[0].digest, err.digest.to_string());
    assert_eq!(list.refs[0].labels["tool"], "bash");
    assert_eq!((list.refs[0].size, list.refs[0].lines), (12, 1));
    let all = c.list_refs(&[("tool", "bash")], Some(1), None).await.unwrap();
    assert_eq!(all.refs[0].digest, err.digest.to_string(), "newest first");
    let next = c.list_refs(&[("tool", "bash")], Some(1), all.next_cursor.as_deref()).await.unwrap();
    assert_eq!(next.refs[0].digest, out.digest.to_string());
    assert!(next.next_cursor.is_none());
    let r = c.request(Method::GET, "/v1/refs?cursor=zzz").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    // Pin, unpin, delete.
    let d = out.digest;
    let pinned = c.pin(&d, Some("INC-42")).await.unwrap();
    assert!(pinned.expires_at.is_none());
    assert!(c.list_refs(&[], None, None).await.unwrap().refs.iter().any(|r| r.pinned && r.digest == d.to_string()));
    c.unpin(&d).await.unwrap();
    assert!(c.unpin(&d).await.unwrap_err().is_not_found());
    let r = c.request(Method::POST, &format!("/v1/blobs/{d}/pin")).body("{not json").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    c.delete(&d).await.unwrap();
    assert_eq!(c.head(&d).await.unwrap(), None);
    srv.stop().await;
}

/// Sizes either side of the server's inline limit (small blobs live in the database, larger
/// ones in the blob store): both read back whole and by range. Where each is kept is the
/// server's business; this only picks the sizes where a bug would hide.
#[tokio::test]
async fn blobs_either_side_of_the_inline_limit_read_back() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let limit = spillway_server::storage::INLINE_MAX;
    for size in [1, limit - 1, limit, limit + 1, 3 * limit] {
        let data = Bytes::from((0..size).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
        let rec = c.put(data.clone(), &UploadOptions::default()).await.unwrap();
        let got = c.get(&rec.digest).await.unwrap().bytes().await.unwrap();
        assert_eq!(got, data, "{size} bytes");
        let r = c
            .request(Method::GET, &format!("/v1/blobs/{}", rec.digest))
            .header(header::RANGE, "bytes=-3")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::PARTIAL_CONTENT);
        assert_eq!(r.bytes().await.unwrap(), data.slice(size.saturating_sub(3)..), "{size} bytes");
    }
    srv.stop().await;
}

/// Staged bytes go whatever ends an upload: 20 bodies broken off mid-way (past the inline limit,
/// so they were being written to a temporary file or object) and 20 that do not match their
/// digest leave no temporary bytes, on disk or in the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_uploads_leave_no_staged_bytes() {
    let srv = TestServer::start().await;
    let chunk = Bytes::from(vec![b'q'; 256 << 10]);
    let mut tasks = Vec::new();
    for i in 0..20u8 {
        let (c, chunk) = (srv.client(), chunk.clone());
        tasks.push(tokio::spawn(async move {
            let body = futures::stream::iter((0..4).map(move |k| {
                if k < 3 {
                    Ok(chunk.clone())
                } else {
                    Err(std::io::Error::other(format!("upload {i} broken off")))
                }
            }));
            let sent = c.request(Method::POST, "/v1/blobs").body(reqwest::Body::wrap_stream(body)).send().await;
            assert!(sent.is_err() || !sent.unwrap().status().is_success(), "a broken body is never stored");
        }));
        let c = srv.client();
        tasks.push(tokio::spawn(async move {
            let wrong = Digest::of(&[i]);
            let r = c.request(Method::PUT, &format!("/v1/blobs/{wrong}")).body(vec![b'm'; 300 << 10]).send().await;
            assert_eq!(r.unwrap().status(), StatusCode::BAD_REQUEST);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    eventually("no staged bytes remain", || srv.stored_under("tmp").is_empty()).await;
    assert!(srv.stored_under("blobs").is_empty(), "nothing was published");
    srv.stop().await;
}

/// `GET /v1/refs?digest=`: one output's references, newest first (the viewer's header), within
/// the namespace; a malformed or SHA-256 digest is a clear 400.
#[tokio::test]
async fn refs_of_one_output() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let one = c.put(Bytes::from_static(b"one\n"), &UploadOptions::default().label("cmd", "make")).await.unwrap();
    c.put(Bytes::from_static(b"other\n"), &UploadOptions::default().label("cmd", "ls")).await.unwrap();
    c.put(Bytes::from_static(b"one\n"), &UploadOptions::default().label("cmd", "make again")).await.unwrap();
    let list = |client: spillway_client::StoreClient, q: String| async move {
        client.request(Method::GET, &format!("/v1/refs?{q}")).send().await.unwrap()
    };
    let resp = list(c.clone(), format!("digest={}", one.digest)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body: serde_json::Value = resp.json().await.unwrap();
    let cmds: Vec<&str> =
        body["refs"].as_array().unwrap().iter().map(|r| r["labels"]["cmd"].as_str().unwrap()).collect();
    assert_eq!(cmds, ["make again", "make"], "its references only, newest first");
    let body: serde_json::Value = list(c.clone(), format!("digest={}&limit=1", one.digest)).await.json().await.unwrap();
    assert_eq!((body["refs"].as_array().unwrap().len(), body["next_cursor"].is_string()), (1, true));
    let other = srv.client_for("other", ALL).await;
    let body: serde_json::Value = list(other, format!("digest={}", one.digest)).await.json().await.unwrap();
    assert!(body["refs"].as_array().unwrap().is_empty(), "another namespace sees none");
    for bad in [format!("digest={}", one.sha256), "digest=blake3:xyz".to_owned()] {
        let resp = list(c.clone(), bad.clone()).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{bad}");
    }
    srv.stop().await;
}
